"""``make demo``: deploy TrainingStack into the emulated cloud and run a real spot training job through an interruption.

    python -m emulator demo [--run-dir DIR] [--epochs N] [--step-sleep-s S] [--checkpoint-interval-s S]

1. start the emulator (moto on loopback) and ``cdk bootstrap`` + ``cdk deploy TrainingStack`` with the real CLI;
2. submit the example job (``examples/digits``) to the default team's cluster on 2 nodes;
3. each instance the group launches boots as a local node running its real user data;
4. once a checkpoint is durable, deliver a spot interruption notice to one node through its metadata mock;
   the node checkpoints, makes it durable in S3, hands the instance back; the replacement boots, restores
   and training continues on 2 nodes;
5. wait for ``DONE`` and the group back at 0, then print a summary read from S3, CloudWatch Logs and the
   Auto Scaling API (not from the processes' own output).
Full logs (emulator, CDK, every node's console) stay in the run directory, whose path is printed.
"""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from emulator.cloud import REPO_ROOT, EmulatedCloud, EmulatorError
from emulator.deploy import bootstrap, deploy
from emulator.nodes import Node, NodeLauncher
from trainctl import jobs
from trainctl.cli import format_status, status

EXAMPLE_DIR = REPO_ROOT / "examples" / "digits"
STACK, TEAM, CLUSTER = "TrainingStack", "default", "main"
NODES = 2
# Emulated nodes poll metadata every second (5 s on a real node) so the demo moves along.
NODE_ENV = {
    "SPOT_TRAINING_POLL_INTERVAL_S": "1",
    "SPOT_TRAINING_RDZV_JOIN_TIMEOUT_S": "180",
    "SPOT_TRAINING_DONE_BARRIER_S": "60",
}
_INTERRUPTED = re.compile(r"interrupted: checkpoint (\d+) saved")
_RESUMED = re.compile(r"resumed from step (\d+)")
_STEP = re.compile(r"\bstep (\d+) epoch \d+ loss")
_DURABLE = re.compile(r"checkpoint (\d+) durable in s3://")
_ACCURACY = re.compile(r"epoch (\d+) done: step (\d+) test accuracy ([0-9.]+) world size (\d+)")


@dataclass
class Summary:
    job_id: str
    done: bool
    desired_capacity: int
    nodes_booted: int
    nodes_running_after: int
    steps_trained: int
    interrupted_at_step: int
    resumed_from_step: int
    notice_to_durable_s: float
    replacement_boot_to_first_step_s: float
    checkpoints: list[jobs.Checkpoint]
    final_accuracy: float
    final_world_size: int
    victim: str
    replacement: str
    log_dir: Path
    nodes: list[Node]

    @property
    def steps_redone(self) -> int:
        return self.interrupted_at_step - self.resumed_from_step

    def lines(self) -> list[str]:
        sizes = sorted(c.size_bytes for c in self.checkpoints)
        return [
            f"job {self.job_id}: {'DONE' if self.done else 'NOT DONE'}; "
            f"group desired capacity {self.desired_capacity}; {self.nodes_running_after} node(s) still running",
            f"nodes booted: {self.nodes_booted} (interrupted {self.victim}, replacement {self.replacement})",
            f"steps trained: {self.steps_trained}",
            f"interrupted at step {self.interrupted_at_step}, resumed from step {self.resumed_from_step}: "
            f"{self.steps_redone} step(s) redone",
            f"notice -> emergency checkpoint durable in S3: {self.notice_to_durable_s:.1f} s (of the 120 s notice)",
            f"replacement boot -> first training step: {self.replacement_boot_to_first_step_s:.1f} s",
            f"checkpoints in S3: {len(self.checkpoints)} kept, {sizes[0] / 1024:.1f}-{sizes[-1] / 1024:.1f} KiB each"
            if sizes
            else "checkpoints in S3: none",
            f"final test accuracy: {self.final_accuracy:.3f} (world size {self.final_world_size})",
            f"node consoles: {self.log_dir}/<instance-id>/console.log",
        ]


class Progress:
    """Live progress on one line per event, with elapsed time; nothing from the nodes' own output."""

    def __init__(self, write: Callable[[str], None]) -> None:
        self.write = write
        self.started = time.monotonic()

    def __call__(self, message: str) -> None:
        self.write(f"[{time.monotonic() - self.started:6.1f}s] {message}")


def _first_after(
    events: list[tuple[float, str, str]], pattern: re.Pattern[str], after: float, stream: Optional[str] = None
) -> tuple[float, re.Match[str]]:
    for ts, name, message in events:
        if ts >= after and (stream is None or name == stream):
            m = pattern.search(message)
            if m:
                return ts, m
    raise EmulatorError(f"no log line matching {pattern.pattern!r} after {after:.3f} in the job's logs")


def summarize(
    client: jobs.ClientFactory, ref: jobs.ClusterRef, job_id: str, launcher: NodeLauncher, victim: str, notice_at: float
) -> Summary:
    """The run's facts, read back from S3, CloudWatch Logs and the Auto Scaling API."""
    events = jobs.log_events(client, ref, job_id)
    _, stopped = _first_after(events, _INTERRUPTED, notice_at)
    durable_at, _ = _first_after(events, _DURABLE, notice_at)
    replacement = next(n for n in launcher.nodes.values() if n.booted_at > notice_at)
    resumed_at, resumed = _first_after(events, _RESUMED, replacement.booted_at)
    first_step_at, _ = _first_after(events, _STEP, resumed_at)
    accuracies = [m for _, _, msg in events if (m := _ACCURACY.search(msg))]
    if not accuracies:
        raise EmulatorError("no 'epoch N done: ... test accuracy' line in the job's logs")
    checkpoints = jobs.checkpoints(client, ref, job_id)
    return Summary(
        job_id=job_id,
        done=jobs.marker(client, ref, job_id, "DONE") is not None,
        desired_capacity=jobs.desired_capacity(client, ref),
        nodes_booted=len(launcher.nodes),
        nodes_running_after=len(launcher.running()),
        steps_trained=checkpoints[-1].step if checkpoints else 0,
        interrupted_at_step=int(stopped.group(1)),
        resumed_from_step=int(resumed.group(1)),
        notice_to_durable_s=durable_at - notice_at,
        replacement_boot_to_first_step_s=first_step_at - replacement.booted_at,
        checkpoints=checkpoints,
        final_accuracy=float(accuracies[-1].group(3)),
        final_world_size=int(accuracies[-1].group(4)),
        victim=victim,
        replacement=replacement.instance_id,
        log_dir=launcher.work_dir,
        nodes=list(launcher.nodes.values()),
    )


def run(
    run_dir: Path,
    *,
    write: Callable[[str], None] = print,
    **job_options: Any,
) -> Summary:
    """The whole demo: emulator, bootstrap, deploy, :func:`run_job`; prints and returns the summary."""
    progress = Progress(write)
    write(f"Full logs: {run_dir}")
    with EmulatedCloud(run_dir=run_dir) as cloud:
        progress(f"emulated AWS on {cloud.endpoint_url} (moto; account {cloud.account_id}, {cloud.region})")
        progress(f"cdk bootstrap: {bootstrap(cloud):.1f} s")
        started = time.monotonic()
        deploy(cloud, STACK)
        progress(f"cdk deploy {STACK}: {time.monotonic() - started:.1f} s")
        summary, ref = run_job(cloud, run_dir / "nodes", progress=progress, **job_options)
        write("")
        write(f"$ trainctl status --cluster {CLUSTER} {summary.job_id}")
        write(format_status(status(cloud.client, ref, summary.job_id)))
    write("")
    write("Summary (read from S3, CloudWatch Logs and the Auto Scaling API):")
    for line in summary.lines():
        write(f"  {line}")
    return summary


def run_job(
    cloud: EmulatedCloud,
    nodes_dir: Path,
    *,
    epochs: int = 8,
    step_sleep_s: float = 0.15,
    checkpoint_interval_s: float = 5.0,
    interrupt_after_step: int = 40,
    interrupt_host: bool = False,
    timeout_s: float = 480.0,
    progress: Callable[[str], None] = print,
) -> tuple[Summary, jobs.ClusterRef]:
    """On a deployed TrainingStack: submit the example, interrupt one node, wait for DONE and the group at 0.

    ``interrupt_host``: interrupt the rendezvous host (lowest instance id) instead of another node.
    """
    client = cloud.client
    ref = jobs.find_cluster(client, TEAM, CLUSTER)
    with NodeLauncher(cloud, nodes_dir, groups=[ref.group], node_env=NODE_ENV, on_event=progress) as launcher:
        job_id = jobs.submit(
            client,
            ref,
            EXAMPLE_DIR,
            command=f"python train.py --epochs {epochs} --seed 0 --step-sleep-s {step_sleep_s}",
            nodes=NODES,
            python=sys.executable,  # the environment with torch (on an AMI: the job spec's /opt/conda/...)
            min_nodes=NODES,
            max_nodes=NODES,
            checkpoint_interval_s=checkpoint_interval_s,
        )
        progress(f"submitted job {job_id} to {TEAM}/{CLUSTER} ({NODES} nodes, group {ref.group})")
        deadline = time.monotonic() + timeout_s
        newest = [-1]

        def durable_step() -> int:
            found = jobs.checkpoints(client, ref, job_id)
            step = found[-1].step if found else -1
            if step != newest[0]:
                newest[0] = step
                progress(f"newest durable checkpoint in S3: step {step}")
            return step

        launcher.wait_for(
            lambda: durable_step() >= interrupt_after_step, deadline - time.monotonic(), "a first checkpoint"
        )
        # The rendezvous host is the lowest instance id; by default interrupt a node that is not the host.
        running = sorted(n.instance_id for n in launcher.running())
        victim = running[0] if interrupt_host else running[-1]
        notice_at = time.time()
        launcher.interrupt(victim)
        launcher.wait_for(
            lambda: any(n.booted_at > notice_at for n in launcher.nodes.values()),
            deadline - time.monotonic(),
            "the replacement node",
        )

        def finished() -> bool:
            durable_step()
            return any(jobs.marker(client, ref, job_id, name) for name in ("DONE", "FAILED"))

        launcher.wait_for(finished, deadline - time.monotonic(), f"job {job_id} to finish")
        failed = jobs.marker(client, ref, job_id, "FAILED")
        if failed is not None:
            raise EmulatorError(f"job {job_id} FAILED: {failed.get('reason')}; see {nodes_dir}")
        progress(f"job {job_id} DONE")
        launcher.wait_for(
            lambda: jobs.desired_capacity(client, ref) == 0 and not launcher.running(),
            deadline - time.monotonic(),
            "the group to scale to 0",
        )
        progress("group at 0, every node shut down")
        return summarize(client, ref, job_id, launcher, victim, notice_at), ref
