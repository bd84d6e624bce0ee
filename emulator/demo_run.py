"""A submitted job as a demo scenario sees and acts on it: :class:`JobRun` waits on facts from S3, CloudWatch Logs and
the Auto Scaling API and interrupts nodes the way EC2 does; a :data:`Scenario` is what a run does to the job."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Optional

from bootstrap_scripts.spot_training.peers import launch_order
from emulator.cloud import EmulatorError
from emulator.demo_logs import DURABLE, STEP
from emulator.nodes import Node, NodeLauncher
from trainctl import jobs

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
        steps = [int(m.group(1)) for ts, _, msg in self.log_events() if ts >= after and (m := STEP.search(msg))]
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
        return self.stream_of(DURABLE)

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
