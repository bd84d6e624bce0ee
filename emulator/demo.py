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

import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from bootstrap_scripts.spot_training.peers import launch_order
from emulator.cloud import REPO_ROOT, EmulatedCloud, EmulatorError
from emulator.deploy import bootstrap, deploy
from emulator.nodes import Node, NodeLauncher
from trainctl import jobs
from trainctl.cli import format_cost, format_status, status
from trainctl.cost import job_cost
from trainctl.prices import load_prices

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
_FRESH = re.compile(r"\bstarting fresh\b")
_LAUNCHED = re.compile(r"node-agent \S+ running: ")
_DURABLE = re.compile(r"checkpoint (\d+) durable in s3://")
_ACCURACY = re.compile(r"epoch (\d+) done: step (\d+) test accuracy ([0-9.]+) world size (\d+)")


INTERRUPTIONS = ("notice", "ended", "power-off")  # event kinds that take the node away
WARNED = ("notice", "ended")  # and those that leave its agent time to save


@dataclass
class JobEvent:
    """Something a scenario did to the job's nodes: ``notice`` (spot interruption notice), ``rebalance``
    (rebalance recommendation), ``ended`` (its group ends it with no spot notice, as capacity rebalancing does once
    the replacement runs: the drain hook holds it until its agent has saved) or ``power-off`` (hard termination, no
    notice)."""

    kind: str
    instance_id: str
    at: float  # time.time() when it was delivered


@dataclass
class Restart:
    """One restart of the trainer, read from the job's logs: the furthest step any rank had logged before it
    (including the step an interrupted trainer saved), and the step it resumed from (0: started over)."""

    at: float
    furthest_before: int
    resumed_from: int

    @property
    def steps_redone(self) -> int:
        return self.furthest_before - self.resumed_from


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
    notice_to_durable_s: Optional[float]  # None when the first interruption came without a notice
    replacement_boot_to_first_step_s: float
    checkpoints: list[jobs.Checkpoint]
    final_accuracy: float
    final_world_size: int
    victim: str
    replacement: str
    log_dir: Path
    nodes: list[Node]
    events: list[JobEvent] = field(default_factory=list)
    restarts: list[Restart] = field(default_factory=list)

    @property
    def steps_redone(self) -> int:
        return self.interrupted_at_step - self.resumed_from_step

    def lines(self) -> list[str]:
        sizes = sorted(c.size_bytes for c in self.checkpoints)
        durable = (
            f"notice -> emergency checkpoint durable in S3: {self.notice_to_durable_s:.1f} s (of the 120 s notice)"
            if self.notice_to_durable_s is not None
            else "no notice: the node was powered off"
        )
        return [
            f"job {self.job_id}: {'DONE' if self.done else 'NOT DONE'}; "
            f"group desired capacity {self.desired_capacity}; {self.nodes_running_after} node(s) still running",
            f"nodes booted: {self.nodes_booted} (interrupted {self.victim}, replacement {self.replacement})",
            f"steps trained: {self.steps_trained}",
            f"interrupted at step {self.interrupted_at_step}, resumed from step {self.resumed_from_step}: "
            f"{self.steps_redone} step(s) redone",
            durable,
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


def restarts(events: list[tuple[float, str, str]]) -> list[Restart]:
    """Every restart of the trainer in the job's log lines: each ``resumed from step N`` (or a ``starting fresh``
    after steps were trained) against the furthest step any rank logged before it.

    "Before" is before the agent launched that trainer (its ``running:`` line in the same stream): lines of
    different nodes are stamped by different agents, so a step of the new run on another node can carry an
    earlier time than the ``resumed from`` line; none can precede the launch of the rank 0 it trains with."""
    steps: list[tuple[float, int]] = []
    launched: dict[str, float] = {}
    resumes: list[tuple[float, float, int]] = []  # (time of the line, launch of its trainer, step resumed from)
    for ts, stream, message in events:
        if (m := _STEP.search(message)) or (m := _INTERRUPTED.search(message)):
            steps.append((ts, int(m.group(1))))
        elif _LAUNCHED.search(message):
            launched[stream] = ts
        elif m := _RESUMED.search(message):
            resumes.append((ts, launched.get(stream, ts), int(m.group(1))))
        elif _FRESH.search(message):
            resumes.append((ts, launched.get(stream, ts), -1))
    found = []
    for at, cutoff, resumed in resumes:
        furthest = max((step for ts, step in steps if ts < cutoff), default=0)
        if resumed >= 0 or furthest > 0:
            found.append(Restart(at, furthest, max(resumed, 0)))
    return found


def summarize(run: JobRun) -> Summary:
    """The run's facts, read back from S3, CloudWatch Logs and the Auto Scaling API.

    The single-interruption fields (victim, replacement, interrupted/resumed step) describe the first notice or
    power-off; ``events`` and ``restarts`` cover every one."""
    client, ref, job_id, launcher = run.client, run.ref, run.job_id, run.launcher
    first = next((e for e in run.events if e.kind in INTERRUPTIONS), None)
    if first is None:
        raise EmulatorError("the scenario interrupted no node")
    events = run.log_events()
    durable_at = _first_after(events, _DURABLE, first.at)[0] if first.kind in WARNED else None
    nodes = launcher.all_nodes()
    replacement = next((n for n in nodes if n.booted_at > first.at), None)
    if replacement is None:
        raise EmulatorError(f"no node booted after the {first.kind} to {first.instance_id}")
    resumed_at, resumed = _first_after(events, _RESUMED, replacement.booted_at)
    first_step_at, _ = _first_after(events, _STEP, resumed_at)
    restart = next((r for r in restarts(events) if r.at == resumed_at), None)
    if restart is None:
        raise EmulatorError(f"no restart of the trainer at the 'resumed from step' line of {resumed_at:.3f}")
    accuracies = [m for _, _, msg in events if (m := _ACCURACY.search(msg))]
    if not accuracies:
        raise EmulatorError("no 'epoch N done: ... test accuracy' line in the job's logs")
    checkpoints = jobs.checkpoints(client, ref, job_id)
    return Summary(
        job_id=job_id,
        done=jobs.marker(client, ref, job_id, "DONE") is not None,
        desired_capacity=jobs.desired_capacity(client, ref),
        nodes_booted=len(nodes),
        nodes_running_after=len(launcher.running()),
        steps_trained=checkpoints[-1].step if checkpoints else 0,
        interrupted_at_step=restart.furthest_before,
        resumed_from_step=int(resumed.group(1)),
        notice_to_durable_s=None if durable_at is None else durable_at - first.at,
        replacement_boot_to_first_step_s=first_step_at - replacement.booted_at,
        checkpoints=checkpoints,
        final_accuracy=float(accuracies[-1].group(3)),
        final_world_size=int(accuracies[-1].group(4)),
        victim=first.instance_id,
        replacement=replacement.instance_id,
        log_dir=launcher.work_dir,
        nodes=nodes,
        events=list(run.events),
        restarts=restarts(events),
    )


class JobRun:
    """A submitted job as a scenario sees it: waits on facts from S3, CloudWatch Logs and the Auto Scaling API,
    and interrupts nodes the way EC2 does (every action is recorded in ``events``)."""

    def __init__(
        self,
        client: jobs.ClientFactory,
        ref: jobs.ClusterRef,
        job_id: str,
        launcher: NodeLauncher,
        deadline: float,
        progress: Callable[[str], None],
    ) -> None:
        self.client, self.ref, self.job_id, self.launcher = client, ref, job_id, launcher
        self.deadline, self.progress = deadline, progress
        self.events: list[JobEvent] = []
        self._newest = -1

    def wait_for(self, predicate: Callable[[], bool], what: str) -> None:
        self.launcher.wait_for(predicate, self.deadline - time.monotonic(), what)

    def durable_step(self) -> int:
        """The newest complete checkpoint in S3 (-1: none yet)."""
        found = jobs.checkpoints(self.client, self.ref, self.job_id)
        step = found[-1].step if found else -1
        if step != self._newest:
            self._newest = step
            self.progress(f"newest durable checkpoint in S3: step {step}")
        return step

    def wait_durable(self, at_least: int) -> int:
        """Wait for a complete checkpoint of step ``at_least`` or later in S3; returns its step."""
        what = f"a checkpoint of step {at_least} or later in S3"
        self.wait_while_running(lambda: self.durable_step() >= at_least, what, what)
        return self._newest

    def wait_while_running(self, predicate: Callable[[], bool], what: str, before: str) -> None:
        """:meth:`wait_for`, ended by :meth:`check_running` (``before``) as soon as the job ends."""

        def done() -> bool:
            if predicate():
                return True
            self.check_running(before)
            return False

        self.wait_for(done, what)

    def check_running(self, before: str) -> None:
        """An EmulatorError once the job ended (none of what a scenario waits for comes then), with what to change:
        at once rather than at the deadline."""
        ended = jobs.end_marker(self.client, self.ref, self.job_id)
        if ended is not None:
            raise EmulatorError(
                f"the job ended ({ended}) before {before}: give the job more epochs (--epochs) or a slower step "
                "(--step-sleep-s)"
            )

    def planned_steps(self) -> int:
        """The job's planned step count from the trainer's ``plan:`` line; waits for that line to be shipped (a
        node's logs reach CloudWatch after its first checkpoint may already be durable)."""
        found: list[Optional[int]] = [None]

        def shipped() -> bool:
            found[0] = jobs.planned_steps(self.client, self.ref, self.job_id)
            return found[0] is not None

        self.wait_for(shipped, "the trainer's 'plan: N steps' line in the job's logs")
        assert found[0] is not None
        return found[0]

    def log_events(self) -> list[tuple[float, str, str]]:
        return jobs.log_events(self.client, self.ref, self.job_id)

    def furthest_step(self, after: float = 0.0) -> int:
        """The furthest training step the job's logs show (logged at or after ``after``; -1: none)."""
        steps = [int(m.group(1)) for ts, _, msg in self.log_events() if ts >= after and (m := _STEP.search(msg))]
        return max(steps, default=-1)

    def wait_step(self, at_least: int, after: float = 0.0) -> int:
        """Wait until the logs show training step ``at_least`` or later (logged at or after ``after``)."""
        found = [-1]

        def reached() -> bool:
            found[0] = self.furthest_step(after)
            return found[0] >= at_least

        self.wait_for(reached, f"training step {at_least} in the job's logs")
        return found[0]

    def running(self) -> list[str]:
        """Instance ids of the nodes running the job now (not those told to go), in the agents' launch order: the
        first one hosts the rendezvous."""
        gone = {e.instance_id for e in self.events if e.kind in INTERRUPTIONS}
        ids = [n.instance_id for n in self.launcher.running() if n.instance_id not in gone]
        if not ids:
            return []
        found = self.client("ec2").describe_instances(InstanceIds=ids)["Reservations"]
        return launch_order(i for r in found for i in r["Instances"])

    def stream_of(self, pattern: re.Pattern[str], after: float = 0.0) -> str:
        """The instance whose log stream has the newest line matching ``pattern`` (at or after ``after``); waits
        for one to be shipped."""
        hits: list[str] = []

        def shipped() -> bool:
            hits[:] = [name for ts, name, msg in self.log_events() if ts >= after and pattern.search(msg)]
            return bool(hits)

        self.wait_for(shipped, f"a log line matching {pattern.pattern!r}")
        return hits[-1].rsplit("/", 1)[1]

    def checkpoint_writer(self) -> str:
        """The node whose agent uploaded the newest checkpoint shipped to the logs (the node of rank 0)."""
        return self.stream_of(_DURABLE)

    def _record(self, kind: str, instance_id: str) -> JobEvent:
        event = JobEvent(kind, instance_id, time.time())
        self.events.append(event)
        return event

    def interrupt(self, instance_id: str) -> JobEvent:
        """A spot interruption notice (2 minutes) through the node's metadata."""
        event = self._record("notice", instance_id)
        self.launcher.interrupt(instance_id)
        return event

    def recommend_rebalance(self, instance_id: str) -> JobEvent:
        event = self._record("rebalance", instance_id)
        self.launcher.recommend_rebalance(instance_id)
        return event

    def end_by_group(self, instance_id: str) -> JobEvent:
        """Its group ends the instance with no spot notice (``TerminateInstanceInAutoScalingGroup`` without
        decrementing, as capacity rebalancing does); the group launches a replacement."""
        event = self._record("ended", instance_id)
        self.launcher.terminate(instance_id)
        return event

    def power_off(self, instance_id: str) -> JobEvent:
        """Hard termination with no notice: the node's processes are killed at once; the group replaces it."""
        event = self._record("power-off", instance_id)
        self.launcher.terminate(instance_id, hard=True)
        return event

    def wait_for_replacement(self, event: JobEvent) -> Node:
        """Wait for a node that booted after ``event``; returns the first such node."""

        def booted() -> list[Node]:
            return sorted((n for n in self.launcher.all_nodes() if n.booted_at > event.at), key=lambda n: n.booted_at)

        what = f"a replacement for {event.instance_id}"
        self.wait_while_running(lambda: bool(booted()), what, f"{what} booted")
        return booted()[0]


Scenario = Callable[[JobRun], None]


def interrupt_once(after_step: int, *, host: bool = False) -> Scenario:
    """Once a checkpoint of ``after_step`` or later is durable, give one node a notice; wait for its replacement.

    ``host``: interrupt the rendezvous host (the oldest launch) instead of another node."""

    def scenario(run: JobRun) -> None:
        run.wait_durable(after_step)
        running = run.running()
        if not running:  # the job ended right after that checkpoint
            run.check_running("a node to interrupt")
            raise EmulatorError(f"no node runs the job to interrupt after its checkpoint of step {after_step}")
        run.wait_for_replacement(run.interrupt(running[0] if host else running[-1]))

    return scenario


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

            def finished() -> bool:
                run.durable_step()
                return any(jobs.marker(client, ref, job_id, name) for name in ("DONE", "FAILED"))

            run.wait_for(finished, f"job {job_id} to finish")
            failed = jobs.marker(client, ref, job_id, "FAILED")
            if failed is not None:
                raise EmulatorError(f"job {job_id} FAILED: {failed.get('reason')}; see {nodes_dir}")
            progress(f"job {job_id} DONE")
            run.wait_for(lambda: jobs.desired_capacity(client, ref) == 0 and not launcher.running(), "the group at 0")
        except BaseException:
            # Leave no instance behind for the next job on this cluster (the nodes themselves stop with the launcher).
            client("autoscaling").set_desired_capacity(AutoScalingGroupName=ref.group, DesiredCapacity=0)
            raise
        progress("group at 0, every node shut down")
        return summarize(run), ref
