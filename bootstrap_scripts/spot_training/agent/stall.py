"""The stall watchdog: ends a trainer that showed no progress anywhere in the job for the job's stall timeout."""

from __future__ import annotations

import math
import time
from typing import Any, Dict, List, Optional, Protocol

from spot_training.agent.errors import AWS_ERRORS
from spot_training.agent.job import Job
from spot_training.agent.markers import Markers
from spot_training.protocol import PROGRESS_MARKER, node_marker

STALL_LOG_EVERY_S = 60.0  # a stall watchdog listing or marker write that keeps failing is logged at most this often


class WatchedSync(Protocol):
    """What the watchdog reads of the checkpoint-directory sync (``checkpoint_sync.Syncer``)."""

    changed_at: float
    store: Any  # the job's checkpoints in S3 (``newest_complete()``)

    def last_write(self) -> float: ...


class StallWatch:
    """The stall watchdog of one trainer run (``job.stall_timeout_s``). Progress is job-wide: an output line or a
    checkpoint write of this node's trainer, a peer's ``nodes/<id>/progress`` marker (which a peer writes when its
    trainer shows either), or a checkpoint of the job newly durable in S3. None for ``stall_s`` ends the trainer.

    The clock starts with the trainer (not with the restore or the wait for peers before it). S3 is listed only
    when the watchdog would otherwise fire (the agent's polls list ``nodes/`` anyway, and feed :meth:`peers_seen`).
    """

    def __init__(
        self, markers: Markers, job: Job, syncer: WatchedSync, stall_s: float, newest_before: Optional[int]
    ) -> None:
        self.markers, self.job, self.syncer, self.stall_s = markers, job, syncer, stall_s
        self.instance_id = markers.node.instance_id
        now = time.monotonic()
        self.last_output = now  # when (monotonic) the trainer last printed a line (the pump thread sets it)
        # The job's newest durable checkpoint as the trainer started, and when the watchdog last found a newer one.
        self.durable_seen, self.durable_at = newest_before, 0.0
        self.peer_at = 0.0  # when (monotonic, from S3's times) a peer last wrote its progress marker, as listed
        self.marked = now  # the local progress this node's last progress marker stands for (none yet)
        self.marked_at = -math.inf  # when this node last wrote it
        self.failing_since: Optional[float] = None  # when the watchdog's listing began to fail (None: it answers)
        self.logged_at: Dict[str, float] = {}  # what -> when a repeated failure was last logged

    def output(self) -> None:
        self.last_output = time.monotonic()

    def shown(self) -> float:
        """When (monotonic) this node's trainer last showed progress: an output line or a checkpoint write a sync
        round saw."""
        return max(self.last_output, self.syncer.changed_at)

    def local(self) -> float:
        """``shown``, or now while a sync round runs (an upload can take minutes, and nothing scans meanwhile)."""
        return max(self.shown(), self.syncer.last_write())

    def progress_at(self) -> float:
        return max(self.local(), self.durable_at, self.peer_at)

    def log_sometimes(self, what: str, message: str) -> None:
        """Log ``message`` unless a line about ``what`` was logged in the last minute: a failure that lasts is not
        a line every poll."""
        now = time.monotonic()
        if now - self.logged_at.get(what, -math.inf) >= STALL_LOG_EVERY_S:
            self.logged_at[what] = now
            self.markers.node.log(message)

    def mark(self) -> None:
        """Tell the other nodes this one makes progress (``nodes/<id>/progress``; their trainers may show none: a
        script that prints and saves on rank 0 only), when its trainer showed some since the last marker, at most
        every ``stall_s`` / 4. Only progress the trainer showed: neither a peer's passed on nor a sync round that
        merely runs, either of which would keep a hung job alive."""
        local, now = self.shown(), time.monotonic()
        if local <= self.marked or now - self.marked_at < self.stall_s / 4:
            return
        try:
            self.markers.put_marker(self.job, node_marker(self.instance_id, PROGRESS_MARKER), {})
        except AWS_ERRORS as exc:  # tried again next poll
            self.log_sometimes("mark", f"stall watchdog: could not write this node's progress marker ({exc})")
            return
        self.marked, self.marked_at = local, now

    def peers_seen(self, ages: Dict[str, float], listed_at: float) -> None:
        """A listing of ``nodes/`` answered at ``listed_at`` (monotonic): {instance id: seconds since its progress
        marker was written}. This node's own marker is left out (its own progress is known here exactly)."""
        for instance_id, age in ages.items():
            if instance_id != self.instance_id:
                self.peer_at = max(self.peer_at, listed_at - age)

    def stalled(self) -> Optional[str]:
        """Why to end the trainer (no progress anywhere in the job for ``stall_s``), or None. Before it says so, one
        listing of the peers' progress markers and, if they show none, one of the job's checkpoints. A listing that
        keeps failing counts as no progress once it has failed for a further ``stall_s``: an S3 outage must not
        keep the watchdog from ever firing."""
        if time.monotonic() - self.progress_at() < self.stall_s:
            return None
        failed: List[str] = []
        try:
            ages: Dict[str, float] = {}
            self.markers.node_markers(self.job, ages)
            self.peers_seen(ages, time.monotonic())
        except AWS_ERRORS as exc:
            failed.append(f"the nodes' progress markers ({exc})")
        if time.monotonic() - self.progress_at() >= self.stall_s:
            try:
                newest = self.syncer.store.newest_complete()
            except AWS_ERRORS as exc:
                failed.append(f"the job's checkpoints ({exc})")
            else:
                if newest is not None and (self.durable_seen is None or newest > self.durable_seen):
                    self.durable_seen, self.durable_at = newest, time.monotonic()
        now = time.monotonic()
        if now - self.progress_at() < self.stall_s:
            self.failing_since = None
            return None
        if failed:
            if self.failing_since is None:
                self.failing_since = now
            if now - self.failing_since < self.stall_s:
                self.log_sometimes(
                    "list",
                    f"stall watchdog: could not list {' or '.join(failed)}; asking again (after {self.stall_s:g} s "
                    "more of failures: counted as no progress)",
                )
                return None
            self.markers.node.log(
                f"stall watchdog: no answer listing the job's progress for {self.stall_s:g} s: counted as no progress"
            )
        return f"trainer made no progress (no output, no checkpoint write) for {self.stall_s:g} s"
