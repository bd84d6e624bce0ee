"""The trainer: one torchrun per training attempt, its output pumped to the log, the checkpoint directory synced
while it runs, and SIGTERM with the grace on a notice, a stop request, a lost peer or a stall."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import threading
import time
from typing import Dict, List, Optional, Tuple

from spot_training.agent.checkpoint_sync import Syncer
from spot_training.agent.errors import AWS_ERRORS, EXIT_FAILED, IMDS_ERRORS, one_line
from spot_training.agent.final_syncs import FinalSyncs
from spot_training.agent.job import Job
from spot_training.agent.leftovers import tag_trainer, trainer_ended
from spot_training.agent.log_shipping import Timed, output_lines
from spot_training.agent.markers import Markers
from spot_training.agent.node import Node
from spot_training.agent.notices import Notices
from spot_training.agent.rendezvous import Rendezvous
from spot_training.agent.stall import StallWatch
from spot_training.proctree import kill_all, process_tree
from spot_training.sync_state import STATE_DIR

PEER_LOST_WAIT_S = 10.0  # a trainer whose peer vanished gets this long to exit on SIGTERM before it is killed


class Trainer:
    """This node's trainer across attempts: the running torchrun (``proc``) and what its last run said."""

    def __init__(
        self, node: Node, markers: Markers, notices: Notices, rendezvous: Rendezvous, syncs: FinalSyncs
    ) -> None:
        self.node, self.markers, self.notices, self.rendezvous, self.syncs = node, markers, notices, rendezvous, syncs
        self.proc: Optional["subprocess.Popen[bytes]"] = None  # the last attempt's torchrun
        self.stalled: Optional[str] = None  # why the stall watchdog ended the last attempt's trainer, if it did
        self.newest_before: Optional[int] = None  # the newest durable checkpoint as the last attempt's trainer started
        self.notice_newest: Optional[int] = None  # the newest durable checkpoint at the last notice
        self.notice_at = 0.0  # time.monotonic() of the trainer's SIGTERM
        self.stop_requested = False  # trainctl stop: checkpoint, then STOPPED and scale to 0
        self.save_requests_seen: Optional[Dict[str, str]] = None  # peers' save-request markers (ETags) seen

    def run(self, job: Job, code_dir: str, cmd: List[str], env: Dict[str, str], syncer: Syncer) -> Tuple[int, bool]:
        """Run torchrun until it exits, or a notice, a stop, a lost peer or the stall watchdog stops it; returns
        (exit code, interrupted)."""
        test_stall_s = self.node.settings.test_stall_timeout_s
        stall_s = test_stall_s or job.stall_timeout_s
        if test_stall_s:
            self.node.log(f"stall timeout {stall_s:g} s (SPOT_TRAINING_TEST_STALL_TIMEOUT_S)")
        self.stalled = None
        self.node.log(f"running: {shlex.join(cmd)}")
        self.syncs.trainer_started = time.time()
        watch = StallWatch(self.markers, job, syncer, stall_s, self.newest_before) if stall_s else None
        work_dir = self.node.settings.work_dir
        env = dict(env)
        tag_trainer(work_dir, env)  # a later agent on this node ends it if this one dies first (leftovers.py)
        proc = subprocess.Popen(  # noqa: S603 - argv list built from the validated job, no shell
            cmd, cwd=code_dir, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True
        )
        self.proc = proc
        rc, notice = TrainerRun(self, job, proc, syncer, watch).supervise()
        trainer_ended(work_dir)
        if self.stalled and rc == 0:  # it handled the SIGTERM: still no finished training
            return EXIT_FAILED, False
        return rc, notice is not None

    def runs(self) -> bool:
        """Whether the last attempt's torchrun is still running (``Popen.poll`` may be called from any thread)."""
        return self.proc is not None and self.proc.poll() is None

    def announce_leaving(self, job: Job, notice: str, syncer: Syncer) -> None:
        """After the SIGTERM: tell the peers this node leaves (``nodes/<id>/leaving``, not for a stop: the whole job
        ends), and note the newest durable checkpoint, to tell the emergency one from it. Best effort: S3 failing
        here must not cost the emergency checkpoint, which is already being written."""
        try:
            if not self.stop_requested:
                self.markers.put_own(job, "leaving", {"notice": notice, "trainer": True})
            self.notice_newest = syncer.store.newest_complete()
        except AWS_ERRORS as exc:
            self.node.log(f"could not announce leaving or list checkpoints: {exc}; the trainer stops anyway")

    def request_checkpoint(self, job: Job) -> None:
        """Ask the trainer for a checkpoint now (``.spot-training/save-request``, read by rank 0's helper)."""
        os.makedirs(os.path.join(job.checkpoint_dir, STATE_DIR), exist_ok=True)
        open(os.path.join(job.checkpoint_dir, STATE_DIR, "save-request"), "w").close()

    def relay_save_requests(self, job: Job, markers: Dict[str, Dict[str, str]]) -> None:
        """A peer's rebalance recommendation (``nodes/<id>/save-request``) becomes a save request here too.

        Requests that existed when this agent first looked are history, not news."""
        found = {i: names["save-request"] for i, names in markers.items() if "save-request" in names}
        found.pop(self.node.instance_id, None)
        if self.save_requests_seen is None:
            self.save_requests_seen = found
            return
        for instance_id, etag in sorted(found.items()):
            if self.save_requests_seen.get(instance_id) != etag:
                self.node.log(f"peer {instance_id} got a rebalance recommendation: asking the trainer for a checkpoint")
                self.request_checkpoint(job)
        self.save_requests_seen = found


class TrainerRun:
    """One torchrun under the agent: the threads that pump its output, sync its checkpoints and watch for notices,
    and the poll loop that stops it on a stop request, a lost peer or a stall."""

    def __init__(
        self,
        trainer: Trainer,
        job: Job,
        proc: "subprocess.Popen[bytes]",
        syncer: Syncer,
        watch: Optional[StallWatch],
    ) -> None:
        self.trainer, self.node, self.job, self.proc, self.syncer, self.watch = (
            trainer,
            trainer.node,
            job,
            proc,
            syncer,
            watch,
        )
        self.lock = threading.RLock()  # sigterm() takes it again under the stall watchdog's
        self.woken = threading.Event()
        self.stop_sync = threading.Event()
        self.stopped_by: List[Tuple[str, float, bool]] = []  # (why, grace, a notice?): the first SIGTERM's reason
        self.rebalance_seen: Optional[str] = None
        self.threads = [
            threading.Thread(target=target, name=name, daemon=True)
            for target, name in (
                (self.pump, "trainer-output"),
                (self.sync_loop, "checkpoint-sync"),
                (self.watch_notices, "notice-watch"),
            )
        ]

    def supervise(self) -> Tuple[int, Optional[str]]:
        """(torchrun's exit code, the notice that stopped it or None), once it exited."""
        for thread in self.threads:
            thread.start()
        notice: Optional[str] = None
        try:
            while self.proc.poll() is None and not self.stopped_by:
                if self.poll():
                    break
                self.woken.wait(self.node.poll_s)
            if self.stopped_by:
                notice = self.wait_for_exit()
        finally:
            self.end()
        return self.proc.returncode, notice

    def pump(self) -> None:
        assert self.proc.stdout is not None
        for line in output_lines(self.proc.stdout):  # each CR-ended update of a tqdm bar makes a line
            if self.watch is not None:
                self.watch.output()
            self.node.log.raw(f"[trainer {self.node.instance_id}] {line}")

    def sync_loop(self) -> None:
        while not self.stop_sync.wait(self.node.poll_s):
            self.syncer.sync()

    def sigterm(self, why: str, grace: float, is_notice: bool = True) -> bool:
        """SIGTERM the trainer once, whoever comes first (a notice, a stop request, a lost peer); True if this call
        sent it."""
        with self.lock:
            if self.stopped_by:
                return False
            self.stopped_by.append((why, grace, is_notice))
            self.trainer.notice_at = time.monotonic()
            self.node.log(f"{why}: sending SIGTERM to the trainer, grace {grace:.0f} s")
            self.proc.send_signal(signal.SIGTERM)
            self.woken.set()
            return True

    def watch_notices(self) -> None:
        """The spot notice and the agent's own SIGTERM, on their own thread: a slow S3 or Auto Scaling call in the
        poll loop must not hold up the trainer's SIGTERM (the notice gives two minutes in all)."""
        while not self.stopped_by and self.proc.poll() is None:
            try:
                why = self.trainer.notices.notice()
            except Exception as exc:  # an agent bug must not end the watch: the trainer would miss the notice
                self.node.log(f"notice poll failed: {type(exc).__name__}: {one_line(exc)}")
                why = None
            if why:
                self.sigterm(why, self.job.grace_s)
                return
            self.node.stop_signal.wait(self.node.poll_s)

    def poll(self) -> bool:
        """One look at the job while the trainer runs; True once the trainer is being stopped."""
        job, trainer = self.job, self.trainer
        rebalance = self.rebalance()
        peer_lost: Optional[Tuple[str, str]] = None
        try:
            if trainer.markers.marker(job, "STOP") is not None:
                if self.sigterm("stop requested (trainctl stop)", job.grace_s):
                    trainer.stop_requested = True
                return True
            peer_lost = self.poll_peers(rebalance)
        except AWS_ERRORS as exc:  # an API hiccup: next poll
            self.node.log(f"job poll failed: {exc}")
        if peer_lost:
            peer, how = peer_lost
            self.node.log(f"peer {peer} {how}: restarting with the current peers")
            self.sigterm(f"peer {peer} lost", min(job.grace_s, PEER_LOST_WAIT_S), is_notice=False)
            return True
        return self.stall()

    def rebalance(self) -> Optional[str]:
        """The rebalance recommendation in IMDS, or None (also when IMDS does not answer)."""
        try:
            return self.node.imds.get("events/recommendations/rebalance")
        except IMDS_ERRORS as exc:
            self.node.log(f"IMDS poll failed: {exc}")
            return None

    def poll_peers(self, rebalance: Optional[str]) -> Optional[Tuple[str, str]]:
        """A new rebalance recommendation asks every node's trainer for a checkpoint; otherwise the nodes' markers
        feed the stall watchdog, relay peers' save requests and add joined peers. A lost peer, or None."""
        job, trainer = self.job, self.trainer
        if rebalance and rebalance != self.rebalance_seen:
            self.rebalance_seen = rebalance
            self.node.log(f"rebalance recommendation {rebalance.strip()}: asking the trainer for a checkpoint")
            trainer.request_checkpoint(job)
            # Rank 0 (which decides on saving) may run on another node: tell every node's agent.
            trainer.markers.put_own(job, "save-request", {"rebalance": rebalance.strip()})
            return None
        ages: Dict[str, float] = {}
        published: Dict[str, float] = {}
        markers = trainer.markers.node_markers(job, ages, published)
        if self.watch is not None:
            self.watch.peers_seen(ages, time.monotonic())
        trainer.relay_save_requests(job, markers)
        trainer.rendezvous.add_joined_peers(job, markers)
        return trainer.rendezvous.lost_peer(job, markers, published)

    def stall(self) -> bool:
        """A hung trainer (a DataLoader deadlock, a collective that never returns) would keep every node billed: no
        progress anywhere in the job for the stall timeout ends it like a failed trainer. True if it did."""
        if self.watch is None:
            return False
        self.watch.mark()
        stalled = self.watch.stalled()
        if not stalled:
            return False
        with self.lock:  # unless a notice, a stop or a lost peer stopped it first
            if not self.stopped_by:
                self.trainer.stalled = stalled
                self.node.log(f"{stalled}: ending it (job.stall_timeout_s)")
                self.sigterm("stall watchdog", self.job.grace_s, is_notice=False)
        return True

    def wait_for_exit(self) -> Optional[str]:
        """After the SIGTERM: announce a notice, and wait the grace for the trainer's exit (then kill its process
        tree). The notice, or None."""
        why, grace, is_notice = self.stopped_by[0]
        with Timed(self.node.log, "trainer emergency checkpoint and exit"):
            if is_notice:
                self.trainer.announce_leaving(self.job, why, self.syncer)
            try:
                self.proc.wait(timeout=max(0.0, self.trainer.notice_at + grace - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.node.log(f"trainer still running after {grace:.0f} s grace: killing it")
                self.syncer.trainer_cut_off = True
                kill_all(process_tree(self.proc.pid))
        return why if is_notice else None

    def end(self) -> None:
        """However the run ends: stop the sync, kill what is left of the trainer, note when it ended."""
        self.stop_sync.set()
        self.threads[1].join()
        if self.proc.poll() is None:
            self.syncer.trainer_cut_off = True
            kill_all(process_tree(self.proc.pid))
        if self.proc.wait() != 0 and not self.stopped_by:  # failed on its own: maybe in the middle of a save
            self.syncer.trainer_cut_off = True
        self.trainer.syncs.trainer_ended = time.time()
        self.threads[2].join(timeout=self.node.poll_s + 10)
        self.threads[0].join(timeout=10)
