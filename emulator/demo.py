"""``make demo``: deploy TrainingStack into the emulated cloud and run a real spot training job through an interruption.

    python -m emulator demo [--run-dir DIR] [--epochs N] [--step-sleep-s S] [--checkpoint-interval-s S]

1. start the emulator (moto on loopback) and ``cdk bootstrap`` + ``cdk deploy TrainingStack`` with the real CLI;
2. submit the example job (``examples/digits``) to the default team's cluster on 2 nodes;
3. each instance the group launches boots as a local node running its real user data;
4. once a checkpoint is durable, deliver a spot interruption notice to one node through its metadata mock;
   the node checkpoints, makes it durable in S3, hands the instance back; the replacement boots, restores
   and training continues on 2 nodes;
5. wait for ``DONE`` and the group back at 0, print ``trainctl status`` and ``trainctl cost`` of the job, then a
   summary read from S3, CloudWatch Logs and the Auto Scaling API (not from the processes' own output).
Full logs (emulator, CDK, every node's console) stay in the run directory, whose path is printed.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Optional

from bootstrap_scripts.spot_training.protocol import DONE, FAILED
from emulator.cloud import REPO_ROOT, EmulatedCloud, EmulatorError
from emulator.demo_logs import DURABLE as _DURABLE
from emulator.demo_logs import INTERRUPTED as _INTERRUPTED
from emulator.demo_logs import Restart, restarts
from emulator.demo_run import JobEvent, JobRun, Scenario, interrupt_once
from emulator.demo_summary import Summary, summarize
from emulator.deploy import bootstrap, deploy
from emulator.nodes import NodeLauncher
from trainctl import jobs
from trainctl.cost import job_cost
from trainctl.prices import load_prices
from trainctl.status import status
from trainctl.views import format_cost, format_status

# What the tests and benchmarks import from here: the scenario's pieces live in demo_logs, demo_run, demo_summary.
__all__ = [
    "CLUSTER",
    "EXAMPLE_DIR",
    "NODE_ENV",
    "STACK",
    "TEAM",
    "_DURABLE",
    "_INTERRUPTED",
    "JobEvent",
    "JobRun",
    "Restart",
    "Scenario",
    "Summary",
    "interrupt_once",
    "restarts",
    "run",
    "run_job",
    "summarize",
]

EXAMPLE_DIR = REPO_ROOT / "examples" / "digits"
STACK, TEAM, CLUSTER = "TrainingStack", "default", "main"
NODES = 2
# Emulated nodes poll metadata every second (5 s on a real node) so the demo moves along.
NODE_ENV = {
    "SPOT_TRAINING_POLL_INTERVAL_S": "1",
    "SPOT_TRAINING_RDZV_JOIN_TIMEOUT_S": "180",
    "SPOT_TRAINING_DONE_BARRIER_S": "60",
}


class Progress:
    """Live progress on one line per event, with elapsed time; nothing from the nodes' own output."""

    def __init__(self, write: Callable[[str], None]) -> None:
        self.write = write
        self.started = time.monotonic()

    def __call__(self, message: str) -> None:
        self.write(f"[{time.monotonic() - self.started:6.1f}s] {message}")


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
        write(f"$ trainctl cost --cluster {CLUSTER} {summary.job_id}")
        write(format_cost(job_cost(cloud.client, ref, summary.job_id, load_prices())))
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
    scenario: Optional[Scenario] = None,
    train_args: str = "",
    node_env: Optional[dict[str, str]] = None,
    timeout_s: float = 480.0,
    progress: Callable[[str], None] = print,
    **job_options: Any,
) -> tuple[Summary, jobs.ClusterRef]:
    """On a deployed TrainingStack: submit the example, run ``scenario``, wait for DONE and the group at 0.

    ``scenario`` (default :func:`interrupt_once` of ``interrupt_after_step`` / ``interrupt_host``) acts on the
    running job through a :class:`JobRun` and returns once its interruptions are delivered. ``train_args``: extra
    arguments of ``train.py``; ``node_env``: extra environment of every node (on top of ``NODE_ENV``);
    ``job_options``: more keys of the submitted job (``checkpoint_wait_for_upload=True``, ...).
    """
    client = cloud.client
    ref = jobs.find_cluster(client, TEAM, CLUSTER)
    scenario = scenario or interrupt_once(interrupt_after_step, host=interrupt_host)
    env = {**NODE_ENV, **(node_env or {})}
    command = f"python train.py --epochs {epochs} --seed 0 --step-sleep-s {step_sleep_s} {train_args}".strip()
    with NodeLauncher(cloud, nodes_dir, groups=[ref.group], node_env=env, on_event=progress) as launcher:
        job_id = jobs.submit(
            client,
            ref,
            EXAMPLE_DIR,
            command=command,
            nodes=NODES,
            python=sys.executable,  # the environment with torch (on an AMI: the job spec's /opt/pytorch/...)
            min_nodes=NODES,
            max_nodes=NODES,
            checkpoint_interval_s=checkpoint_interval_s,
            **job_options,
        )
        progress(f"submitted job {job_id} to {TEAM}/{CLUSTER} ({NODES} nodes, group {ref.group})")
        run = JobRun(client, ref, job_id, launcher, time.monotonic() + timeout_s, progress)
        try:
            scenario(run)
            _wait_done(run, nodes_dir)
        except BaseException:
            # Leave no instance behind for the next job on this cluster (the nodes themselves stop with the launcher).
            client("autoscaling").set_desired_capacity(AutoScalingGroupName=ref.group, DesiredCapacity=0)
            raise
        progress("group at 0, every node shut down")
        return summarize(run), ref


def _wait_done(run: JobRun, nodes_dir: Path) -> None:
    """Wait for the job's DONE (an EmulatorError on FAILED), then for its group at 0 with every node shut down."""
    client, ref, job_id = run.client, run.ref, run.job_id

    def finished() -> bool:
        run.durable_step()
        return any(jobs.marker(client, ref, job_id, name) for name in (DONE, FAILED))

    run.wait_for(finished, f"job {job_id} to finish")
    failed = jobs.marker(client, ref, job_id, FAILED)
    if failed is not None:
        raise EmulatorError(f"job {job_id} FAILED: {failed.get('reason')}; see {nodes_dir}")
    run.progress(f"job {job_id} DONE")
    run.wait_for(lambda: jobs.desired_capacity(client, ref) == 0 and not run.launcher.running(), "the group at 0")
