"""How a node's part in the job ends: the done barrier and ``DONE``, ``FAILED``, ``STOPPED``, a job every node would
refuse, an error this node cannot go on after, and a leave before this node's trainer started. Each ending moves the
node's lifecycle (``lifecycle``) to its final state first; the supervisor makes the other moves. Where a job ends
(its end marker written), ``Handover`` takes the cluster's next queued job, or scales the group to 0."""

from __future__ import annotations

import json
import time
from typing import List, Optional

from spot_training.agent import lifecycle as state
from spot_training.agent.checkpoint_store import CheckpointStore
from spot_training.agent.errors import AWS_ERRORS, EXIT_FAILED, AgentError, JobFailed, JobRefused
from spot_training.agent.final_syncs import FinalSyncs
from spot_training.agent.group_exit import GroupExit
from spot_training.agent.handover import Handover
from spot_training.agent.job import Job
from spot_training.agent.lifecycle import Lifecycle
from spot_training.agent.markers import Markers
from spot_training.agent.node import Node
from spot_training.agent.rendezvous import Rendezvous
from spot_training.protocol import DONE, FAILED, LEAVING_MARKER, NODE_DONE_MARKER, STOPPED


class Endings:
    """The ends of this node's part in the job (``not_done``: why the last ``finish`` did not make the job DONE)."""

    def __init__(
        self,
        node: Node,
        markers: Markers,
        rendezvous: Rendezvous,
        syncs: FinalSyncs,
        group_exit: GroupExit,
        lifecycle: Lifecycle,
        handover: Handover,
    ) -> None:
        self.node, self.markers, self.rendezvous, self.syncs = node, markers, rendezvous, syncs
        self.group_exit, self.lifecycle, self.handover = group_exit, lifecycle, handover
        self.not_done = ""

    def finish(self, job: Job, group: str) -> bool:
        """Barrier over S3: wait (bounded) for every peer's done marker, then write DONE and hand over (the next queued
        job, or the group to 0).

        False (not DONE) when a peer left the group before it reported its final sync complete (``synced`` without
        pending files): it may have held rank 0's final checkpoint, which DONE would then leave out of S3. The
        caller trains again from the newest durable checkpoint, and that attempt makes the final one again. Also
        False when this node's own final checkpoint is still not in S3 when the barrier's time is up, and when a
        peer trains again (``restarting``): it waits for this node at its rendezvous. ``not_done`` says why."""
        barrier_s = self.node.settings.barrier_s
        deadline = time.monotonic() + barrier_s
        own = self.syncs.own_pending_until(deadline)  # its final sync failed: try again, within the barrier's time
        if own is not None:
            self.not_done = f"{own} of this node not durable in S3 within {barrier_s:.0f} s"
            self.node.log(f"{own} not durable in S3 within {barrier_s:.0f} s: not reporting done; training again")
            return False
        self.markers.put_own(job, NODE_DONE_MARKER, {})
        waiting = [i for i, _ in self.rendezvous.peers if i != self.node.instance_id]
        while waiting:
            if self.markers.marker(job, DONE) is not None:  # handed over by that peer; again here (idempotent)
                self.lifecycle.move(state.DONE, "a peer wrote DONE")
                self.node.log(f"job {job.job_id} is DONE (a peer finished it)")
                self.handover.after_end(job, group, DONE)
                return True
            # the peers are looked at before the deadline: one that trains again is seen however short the barrier
            still = self.still_finishing(job, waiting)
            if still is None:
                return False
            waiting = still
            if not waiting:
                break
            if time.monotonic() >= deadline:  # one may still upload the final checkpoint: the last one writes DONE
                self.lifecycle.move(state.DONE, f"this node finished; peers {', '.join(waiting)} write DONE")
                self.node.log(
                    f"peers {', '.join(waiting)} did not report done within {barrier_s:.0f} s; leaving the job "
                    "to them (the last node to finish writes DONE and scales the group to 0)"
                )
                self.group_exit.warm.release()
                self.group_exit.leave_group(group, for_good=True)
                return True
            time.sleep(min(self.node.poll_s, 1.0))
        self.lifecycle.move(state.DONE, "every peer finished: this node writes DONE")
        self.markers.put_marker(job, DONE, {"peers": [i for i, _ in self.rendezvous.peers]})
        self.node.log(f"job {job.job_id} DONE: s3://{job.bucket}/{job.job_prefix}DONE")
        self.handover.after_end(job, group, DONE)
        return True

    def still_finishing(self, job: Job, waiting: List[str]) -> Optional[List[str]]:
        """The peers of ``waiting`` still to report done, in the group; None when the job cannot be DONE now: a
        peer left before it finished with a durable checkpoint, or one trains again (``not_done`` says which)."""
        waiting = [i for i in waiting if self.syncs.reported(job, i, NODE_DONE_MARKER) is None]
        if not waiting:
            return waiting
        in_group = self.rendezvous.group_members()  # a peer that left the group (interrupted) will never report
        gone = [i for i in waiting if i not in in_group]
        lost = [i for i in gone if not self.syncs.synced_durably(job, i, finished=True)]
        if lost:
            self.not_done = f"peer(s) {', '.join(lost)} left before they finished with a durable checkpoint"
            self.node.log(
                f"peer(s) {', '.join(lost)} left the group before they finished training with their final "
                "checkpoint durable: the job is not DONE; training again from the newest durable checkpoint "
                "to make the final one again"
            )
            return None
        if gone:
            self.node.log(f"peers {', '.join(gone)} left the group after their final sync; not waiting for them")
            waiting = [i for i in waiting if i in in_group]
        again = [i for i in waiting if self.syncs.restarting(job, i)]
        if again:  # it waits for this node at its rendezvous: leaving would leave it short of min_nodes
            self.not_done = f"peer(s) {', '.join(again)} trained again instead of finishing"
            self.node.log(
                f"peer(s) {', '.join(again)} train again (their trainer failed where this one finished): "
                "training again with them from the final checkpoint"
            )
            return None
        return waiting

    def finish_failed(self, job: Job, group: str, exc: Exception) -> None:
        """S3 or Auto Scaling failed in the done barrier after a good training. Once ``DONE`` is written, hand over
        again (peers that saw it have exited and leave the scaling to this node); until then, leave the group
        (one fewer): a peer still in its barrier writes ``DONE``."""
        self.lifecycle.move(state.DONE, f"this node finished; the done barrier failed ({exc})")
        try:
            done = self.markers.marker(job, DONE) is not None
        except AWS_ERRORS as again:  # in doubt, never cut off a peer's final upload
            self.node.log(f"reading DONE failed too ({again})")
            done = False
        if done:
            self.node.log(f"done barrier failed after DONE ({exc}); handing {group} over again")
            self.handover.after_end(job, group, DONE)
            return
        self.node.log(f"done barrier failed ({exc}); leaving the job to the peers (the last one writes DONE)")
        self.group_exit.warm.release()
        self.group_exit.leave_group(group, for_good=True)

    def stopped(self, job: Job, group: str, store: CheckpointStore) -> int:
        """``trainctl stop``: the final checkpoint is durable (or the last one stays); mark STOPPED, hand over. A stop
        is no failure: when S3 or Auto Scaling fails here, this node leaves the group (one fewer), and a peer that
        reaches this point writes STOPPED and scales to 0."""
        self.lifecycle.move(state.STOPPED, "stop requested (STOP marker)")
        try:
            if self.markers.marker(job, STOPPED) is None:
                self.markers.put_marker(job, STOPPED, {"last_checkpoint": store.newest_complete()})
            self.node.log(f"job {job.job_id} STOPPED on request")
            self.handover.after_end(job, group, STOPPED)
        except AWS_ERRORS as exc:
            self.node.log(f"the stop failed to finish ({exc}); leaving {group}")
            self.group_exit.warm.release()
            self.group_exit.leave_group(group, for_good=True)
        return 0

    def fail(self, job: Job, group: str, reason: str) -> int:
        """FAILED with ``reason`` (the node's state first), then the hand-over (the next queued job, or the group to
        0)."""
        self.lifecycle.move(state.FAILED, reason)
        self.markers.put_marker(job, FAILED, {"reason": reason})
        self.node.log(f"job {job.job_id} FAILED: {reason}")
        self.handover.after_end(job, group, FAILED)
        return EXIT_FAILED

    def failed_before_the_end(self, job: Job, group: str, exc: Exception) -> int:
        """No code, no readable checkpoint, peers that never came, an agent bug: this node cannot go on, and exiting
        would leave it idle in the group (billed). FAILED with the reason, and the group to 0; or, when its peers
        train on without it, it leaves. Raises: a one-line ``AgentError`` or ``JobFailed``, or an agent bug as is
        (its traceback goes to the node's console too)."""
        agents_own = isinstance(exc, (AgentError, *AWS_ERRORS))
        if isinstance(exc, AgentError):
            reason = str(exc)
        elif isinstance(exc, AWS_ERRORS):
            reason = f"AWS did not answer after the retries: {exc}"
        else:
            reason = f"node agent error: {type(exc).__name__}: {exc}"
        training = self.training_without_this_node(job, group, reason)
        if training:  # a replacement that could not join: the job goes on without it
            self.lifecycle.move(state.LEAVING, f"{reason}; peers train on without this node")
            self.group_exit.give_up(f"{reason} (peers {', '.join(training)} train on without this node)")
            if agents_own:
                raise AgentError(f"before training: {reason}") from None
            raise exc
        try:
            self.fail(job, group, reason)
        except AWS_ERRORS as failed:
            self.node.log(f"could not mark the job FAILED ({failed})")
            self.group_exit.scale_to_zero(group)
        if agents_own:  # one line: S3 or Auto Scaling did not answer
            raise JobFailed(reason) from None
        raise exc

    def training_without_this_node(self, job: Job, group: str, reason: str) -> List[str]:
        """On an error before this node's trainer ever started (a replacement's boot: code download, restore,
        peers): the peers that train now, who can go on without it (at least ``min_nodes`` of them). Empty if its
        trainer ran, if no peer trains (the error is then the job's: every node would meet it), if fewer than
        ``min_nodes`` do (they wait for this node at their rendezvous), or if that cannot be told."""
        if self.syncs.trainer_started:
            return []
        try:
            training = self.rendezvous.peers_training(job, group)
        except AWS_ERRORS as exc:
            self.node.log(f"could not tell whether peers train on ({exc}); failing the job for: {reason}")
            return []
        return training if len(training) >= job.min_nodes else []

    def leave_before_training(self, job: Job, group: str, why: str, stop: bool = False) -> int:
        """Announce the leave (``trainer: false``: peers that count on this node restart without it), make what an
        earlier attempt of this node saved durable (at most the grace), hand the instance back. Not the peers'
        final syncs: no trainer ran here since, so nothing of theirs waits on this node. ``stop``: the job is
        stopping: no announcement (the peers stop anyway), and the group gets no replacement."""
        self.lifecycle.move(state.STOPPED if stop else state.LEAVING, why)
        self.node.log(f"{why}: leaving before the trainer starts")
        deadline = time.monotonic() + job.grace_s
        try:
            if not stop:
                self.markers.put_own(job, LEAVING_MARKER, {"notice": why, "trainer": False})
        except AWS_ERRORS as exc:
            self.node.log(f"could not announce leaving: {exc}")
        try:
            own = self.syncs.own_pending_until(deadline)
            if own is not None:
                self.node.log(f"{own} not durable in S3 within the grace; the last durable one stays")
        except (OSError, *AWS_ERRORS) as exc:
            self.node.log(f"could not make this node's last checkpoint durable: {exc}")
        self.group_exit.hand_back(group, for_good=stop)
        return 0

    def refuse_job(self, refused: JobRefused) -> None:
        """Every node of the group would refuse this job: mark it FAILED (when its spec says where) and scale the
        group to 0, instead of leaving the nodes idle and billed. ``trainctl status`` then shows the reason."""
        self.node.log(f"error: {refused}")
        self.lifecycle.move(state.REFUSED, str(refused))
        if refused.failed_at is not None:
            bucket, key = refused.failed_at
            body = {"reason": f"the node agent refused the job: {refused}", "instance_id": self.node.instance_id}
            try:
                self.node.s3.put_object(Bucket=bucket, Key=key, Body=json.dumps(dict(body, time=time.time())))
                self.node.log(f"job FAILED: s3://{bucket}/{key}")
            except AWS_ERRORS as exc:
                self.node.log(f"could not mark the job FAILED ({exc})")
        try:
            self.group_exit.scale_to_zero(self.group_exit.group_name())
        except (AgentError, *AWS_ERRORS) as exc:
            self.node.log(f"could not find this instance's group to scale it to 0 ({exc}); scale it to 0 by hand")
            self.group_exit.leave_group("its group", for_good=True)
