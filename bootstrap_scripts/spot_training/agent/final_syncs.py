"""The final checkpoint syncs of a training attempt: this node's own (made durable again when it failed, reported in
``nodes/<id>/synced``), and the peers' (waited for before a restart, a leave or a stop, and read by the done barrier).
"""

from __future__ import annotations

import time
from typing import Any, Dict, List, Optional, Tuple

from spot_training.agent.checkpoint_store import CheckpointStore
from spot_training.agent.checkpoint_sync import Syncer
from spot_training.agent.errors import AWS_ERRORS
from spot_training.agent.job import Job
from spot_training.agent.markers import Markers, stamp
from spot_training.agent.node import Node
from spot_training.agent.notices import Notices
from spot_training.agent.rendezvous import Rendezvous
from spot_training.protocol import SYNCED_MARKER, TRAINING_MARKER, node_marker

Marker = Optional[Dict[str, Any]]


class FinalSyncs:
    """The last attempt's trainer times, its checkpoint sync and its ``synced`` report, and the peers' reports."""

    def __init__(self, node: Node, markers: Markers, rendezvous: Rendezvous, notices: Notices) -> None:
        self.node, self.markers, self.rendezvous, self.notices = node, markers, rendezvous, notices
        self.trainer_started = 0.0  # time.time() the last attempt's trainer started
        self.trainer_ended = 0.0  # and ended
        self.syncer: Optional[Syncer] = None  # of the last attempt
        # The last attempt's ``nodes/<id>/synced`` report (job, body): written again once what it said was pending
        # is durable, so peers waiting for it go on.
        self.synced_report: Optional[Tuple[Job, Dict[str, Any]]] = None

    def report(self, job: Job, syncer: Syncer, attempt: int, rc: int, interrupted: bool) -> None:
        """After the attempt's final sync: ``nodes/<id>/synced``, which peers leaving on a notice (or a stop) wait
        for: what this node held is in S3 (or failed to get there)."""
        self.syncer = syncer
        self.synced_report = None  # an earlier attempt's report is not to be written again for this one
        try:
            pending = syncer.pending()
            synced = {"attempt": attempt, "pending": pending, "rc": rc, "interrupted": interrupted}
            self.synced_report = job, synced
            self.markers.put_own(job, SYNCED_MARKER, synced)
        except (OSError, *AWS_ERRORS) as exc:  # the notice, stop or restart that follows must still happen
            self.node.log(f"could not report this node's final sync ({exc}); peers wait for it at most the grace")

    def own_pending(self) -> Optional[str]:
        """What this node's checkpoint directory holds that is not durable in S3 after one more sync (the final sync
        of the last attempt may have failed), described, or None."""
        own = self.syncer.pending() if self.syncer is not None else None
        if own is not None and self.syncer is not None:
            self.syncer.sync(final=True)
            own = self.syncer.pending()
        if own is None and self.synced_report is not None and self.synced_report[1].get("pending") is not None:
            job, body = self.synced_report
            try:
                self.markers.put_own(job, SYNCED_MARKER, dict(body, pending=None))
                self.synced_report = job, dict(body, pending=None)  # once written: a failed PUT is tried again
                self.node.log(f"{body['pending']} is durable in S3 now: reported to the peers")
            except (OSError, *AWS_ERRORS) as exc:
                self.node.log(
                    f"could not report this node's final sync again ({exc}); peers wait for it at most the grace"
                )
        return own

    def own_pending_until(self, deadline: float, during: Optional[str] = None) -> Optional[str]:
        """``own_pending`` about every second until nothing is pending or ``deadline`` (``time.monotonic()``)
        passes; what is still pending then, or None. ``during``: before each try, a spot notice raises
        ``LeavingBeforeTraining`` (see ``Notices.check_notice``)."""
        while True:
            if during is not None:
                self.notices.check_notice(during)
            own = self.own_pending()
            if own is None or time.monotonic() >= deadline:
                return own
            time.sleep(min(self.node.poll_s, 1.0))

    def wait_durable(self, job: Job, store: CheckpointStore, before: Optional[int], deadline: float) -> None:
        """After a notice or a stop (the trainer has exited): wait, until the grace ends, for what the job saved to be
        durable in S3: this node's own newest checkpoint (if it holds one: the node of rank 0), and each peer's
        final sync of the attempt that just ended (its ``nodes/<id>/synced`` marker; a peer that left the group has
        nothing more to give).

        Not "a checkpoint newer than ``before``" (the newest durable one at the notice): when a peer's notice
        stopped the training first, the emergency checkpoint may already be durable by then, and nothing newer
        ever comes."""
        try:
            self._wait_durable(job, store, before, deadline)
        except (OSError, *AWS_ERRORS) as exc:  # what comes next (hand back, STOPPED) must still run
            self.node.log(f"could not check that the last checkpoint is durable: {exc}")

    def _wait_durable(self, job: Job, store: CheckpointStore, before: Optional[int], deadline: float) -> None:
        while True:
            own = self.own_pending()
            waiting = [] if own is not None else self.unsynced_peers(job)
            if own is None and not waiting:
                newest = store.newest_complete()
                if newest is not None and (before is None or newest > before):
                    self.node.log(f"emergency checkpoint {newest} is durable in S3")
                else:
                    self.node.log(f"nothing newer than checkpoint {before} to save; it stays the newest durable one")
                return
            if time.monotonic() >= deadline:
                what = own if own is not None else f"the final sync of {', '.join(waiting)}"
                self.node.log(f"{what} not durable in S3 within the grace; the last durable one stays")
                return
            time.sleep(min(self.node.poll_s, 1.0))

    def wait_for_final_syncs(self, job: Job) -> None:
        """Before a restart: wait, at most the grace, for the final sync (``nodes/<id>/synced``) of each peer of the
        attempt that just ended that is still in the group. The node of rank 0 may still be uploading the attempt's
        newest checkpoint (the emergency one, when it leaves on a notice). Restoring before its final sync would
        resume from the checkpoint before (with fewer nodes than the maximum, nobody would bring the newer one back),
        and judging progress before it would count a restart without progress that made some."""
        deadline = time.monotonic() + job.grace_s
        waited: List[str] = []
        log = self.node.log
        while True:
            self.notices.check_notice("a restart")
            waiting: Optional[List[str]] = None
            try:
                waiting = self.unsynced_peers(job)
            except AWS_ERRORS as exc:  # an API hiccup: poll again, within the deadline
                log(f"peers' final sync poll failed: {exc}")
            if waiting == []:
                if waited:
                    log(f"peer(s) {', '.join(waited)} synced their final checkpoints")
                return
            if waiting and not waited:
                log(f"waiting for the final checkpoint sync of peer(s) {', '.join(waiting)}")
                waited = waiting
            if time.monotonic() >= deadline:
                who = ", ".join(waiting or waited)
                what = f"no final sync from peer(s) {who}" if who else "no answer from S3 about the peers' final syncs"
                log(f"{what} within {job.grace_s:.0f} s; restarting from what S3 holds")
                return
            time.sleep(min(self.node.poll_s, 1.0))

    def unsynced_peers(self, job: Job) -> List[str]:
        """Peers of the last attempt still in the group that owe the final sync of a trainer (``owes_final_sync``)."""
        others = [i for i, _ in self.rendezvous.peers if i != self.node.instance_id]
        if not others:
            return []
        in_group = self.rendezvous.group_members()
        return [peer for peer in others if peer in in_group and self.owes_final_sync(job, peer)]

    def trainer_markers(self, job: Job, peer: str) -> Tuple[Marker, Marker]:
        """``peer``'s newest ``nodes/<id>/training`` (written just before its torchrun) and ``nodes/<id>/synced``
        (its report of a trainer's final sync) markers, each None if absent."""
        training = self.markers.marker(job, node_marker(peer, TRAINING_MARKER))
        return training, self.markers.marker(job, node_marker(peer, SYNCED_MARKER))

    def owes_final_sync(self, job: Job, peer: str) -> bool:
        """Whether ``peer``'s newest trainer started before ours ended and has no final sync reported (a ``synced``
        written after it); see ``owes``."""
        return self.owes(*self.trainer_markers(job, peer))

    def owes(self, training: Marker, synced: Marker) -> bool:
        """``owes_final_sync`` of a peer's two markers.

        A peer that started no trainer after its last report (still restoring a checkpoint, or looking for peers,
        when our trainer ended) has nothing of the attempt to give: waiting for it would hold a restart for the
        whole grace. One whose newest trainer started after ours ended synced the one before it first. A peer's
        two markers are compared on its own clock, not against our trainer's start: a ``synced`` of its previous
        trainer written after ours started is not the sync of the trainer it ran with ours."""
        if training is None or stamp(training) > self.trainer_ended:
            return False
        # A report with a pending checkpoint: its final sync failed, and its agent retries it (``own_pending``)
        # and reports again once it is durable.
        return synced is None or stamp(synced) < stamp(training) or synced.get("pending") is not None

    def restarting(self, job: Job, peer: str) -> bool:
        """Whether ``peer`` trains again after this attempt instead of finishing: its trainer failed where ours
        finished (its final sync reports an exit code other than 0, without a notice), and it restores, looks for
        its peers or already runs a trainer started after ours ended. A trainer it started before ours ended (it
        failed mid-run and rejoined our training) finishes with ours: not a restart."""
        training, synced = self.trainer_markers(job, peer)
        synced = self.fresh(synced)
        if synced is None:
            return False
        started = stamp(training) if training is not None else 0.0
        if started > stamp(synced):
            return started > self.trainer_ended
        return synced.get("rc", 0) != 0 and not synced.get("interrupted", False)

    def synced_durably(self, job: Job, peer: str, *, finished: bool = False) -> bool:
        """Whether ``peer`` reported the final sync of the last attempt with nothing left pending; with ``finished``,
        also that its trainer exited 0. A peer that left on a spot notice or a failure did not finish, even where
        this node's trainer did (a script that ends its loop when the helper says stop, and exits 0)."""
        training, synced = self.trainer_markers(job, peer)
        synced = self.fresh(synced)
        if synced is None or synced.get("pending") is not None or self.owes(training, synced):
            return False
        return not finished or synced.get("rc", 0) == 0

    def reported(self, job: Job, peer: str, name: str) -> Marker:
        """``peer``'s marker ``nodes/<peer>/<name>`` (``synced``, ``done``) if ``fresh``, else None."""
        return self.fresh(self.markers.marker(job, node_marker(peer, name)))

    def fresh(self, body: Marker) -> Marker:
        """A marker ``body`` if written since the last attempt's trainer started (one written for an earlier attempt
        does not count), else None."""
        return body if body is not None and stamp(body) >= self.trainer_started else None
