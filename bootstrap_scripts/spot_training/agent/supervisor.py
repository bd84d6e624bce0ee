"""The supervisor: boots the node into the job, runs training attempts until the job is done, stopped or failed, or
this node is interrupted, and ends however it ends by handing the instance back. It wires the duties together; the
duties do not import it."""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import signal
import time
from typing import Dict, Optional, Tuple

from spot_training.agent import lifecycle as state
from spot_training.agent.checkpoint_store import CheckpointStore
from spot_training.agent.checkpoint_sync import Syncer
from spot_training.agent.code_fetch import download_code
from spot_training.agent.drain import DrainHold
from spot_training.agent.efa import EfaEnvironment
from spot_training.agent.errors import (
    AWS_ERRORS,
    EXIT_FAILED,
    AgentError,
    JobRefused,
    LeavingBeforeTraining,
    StopBeforeTraining,
)
from spot_training.agent.final_syncs import FinalSyncs
from spot_training.agent.group_exit import GroupExit
from spot_training.agent.handover import Handover
from spot_training.agent.job import Job, load_job, trainer_env
from spot_training.agent.job_prepare import prepare_job
from spot_training.agent.job_secrets import job_environment
from spot_training.agent.leaving import Endings
from spot_training.agent.leftovers import end_leftover_trainer
from spot_training.agent.lifecycle import Lifecycle
from spot_training.agent.local_checkpoints import local_steps, remove_partial_writes
from spot_training.agent.log_shipping import LogShipper, Timed
from spot_training.agent.markers import Markers
from spot_training.agent.node import Node
from spot_training.agent.notices import Notices
from spot_training.agent.peers import load_address_map
from spot_training.agent.rendezvous import Rendezvous
from spot_training.agent.settings import AgentSettings
from spot_training.agent.trainer import Trainer
from spot_training.agent.warm_claim import WarmClaim
from spot_training.protocol import (
    END_MARKERS,
    FAILED,
    NODE_STATE,
    STOP,
    checkpoints_prefix,
    cluster_prefix,
    job_prefix,
)


class Agent:
    """One node's agent: its shared context (``node``) and its duties, one object each."""

    def __init__(self, args: argparse.Namespace, settings: Optional[AgentSettings] = None) -> None:
        self.args = args
        node = self.node = Node(
            args.instance_id,
            args.region,
            settings if settings is not None else AgentSettings.from_env(),
            endpoint=os.environ.get("AWS_ENDPOINT_URL") or None,
            asg_name=args.asg_name,
            availability_zone=args.availability_zone,
        )
        load_address_map()  # a broken map is a bad input: say so before anything runs
        self.markers = Markers(node)
        self.notices = Notices(node)
        self.warm = WarmClaim(node)
        self.group_exit = GroupExit(node, self.notices, self.warm)
        self.handover = Handover(node, self.group_exit)
        self.efa = EfaEnvironment(node)
        self.new_job_duties()
        # Started with the first job's store; ``node.log`` and ``group_ending_it`` looked up at each use (tests swap
        # them).
        self.drain_hold = DrainHold(
            node.asg,
            node.instance_id,
            lambda line: self.node.log(line),
            lambda: self.store.sent_bytes if self.store is not None else 0,
            lambda: not self.trainer.runs() and self.notices.group_ending_it(),
        )

    def new_job_duties(self) -> None:
        """The duties that hold one job's state (its peers, final syncs, trainer, lifecycle); the others are the
        boot's (the warm volume, notices, the way out of the group)."""
        node = self.node
        self.rendezvous = Rendezvous(node, self.markers, self.notices)
        self.syncs = FinalSyncs(node, self.markers, self.rendezvous, self.notices)
        self.trainer = Trainer(node, self.markers, self.notices, self.rendezvous, self.syncs)
        # ``node.log`` looked up at each line (tests swap it)
        self.lifecycle = Lifecycle(lambda line: self.node.log(line), state.BOOT)
        self.endings = Endings(
            node, self.markers, self.rendezvous, self.syncs, self.group_exit, self.lifecycle, self.handover
        )
        self.store: Optional[CheckpointStore] = None  # the job's, once the agent runs one
        self.prepared: Dict[str, str] = {}  # the trainer's environment from the job's setup (``prepare_job``)

    def run(self) -> int:
        signal.signal(signal.SIGTERM, lambda *_: self.node.stop_signal.set())
        # A trainer an earlier agent on this node left running (it was killed): ended before anything else
        end_leftover_trainer(self.node.settings.work_dir, self.node.log)
        try:
            return self.load_and_run()
        finally:
            self.node.flush_log()  # before the instance may go
            self.complete_drain()  # however the agent ends: the drain hook must not hold the instance billed
            if self.node.log.shipper is not None:
                self.node.log.shipper.close()

    def complete_drain(self) -> None:
        """Stop the drain hold, then complete the drain hook if the group holds this instance (``GroupExit``)."""
        self.drain_hold.stop()
        self.group_exit.complete_drain()

    def load_and_run(self) -> int:
        """The jobs of this boot: the current job, then each one the queue hands this node (``Handover``)."""
        job = self.load_job()
        handler = logging.Handler()
        handler.emit = lambda record: self.node.log(record.getMessage())  # type: ignore[method-assign]
        logging.getLogger("spot_training").addHandler(handler)
        logging.getLogger("spot_training").setLevel(logging.INFO)
        try:
            while True:
                try:
                    rc = self.run_job(job)
                except AgentError as exc:  # the job FAILED here: the node goes on to a next job it was handed
                    if self.handover.next is None:
                        raise
                    self.node.log(f"error: {exc}")
                    rc = EXIT_FAILED
                found = self.handover.take(job, self.node.group, self.rendezvous.peers)
                if found is None:
                    return rc
                job = self.next_job(found["job_id"])
        except AgentError as exc:
            self.node.log(f"error: {exc}")
            raise
        finally:
            self.warm.release()

    def run_job(self, job: Job) -> int:
        """One job on this node, its log in its own stream (``<job>/<instance>``)."""
        job.checkpoint_dir = self.node.settings.node_root + job.checkpoint_dir
        log = self.node.log
        if log.shipper is not None:
            log.shipper.close()
        log.shipper = LogShipper(self.node.logs, job.log_group, f"{job.job_id}/{self.node.instance_id}")
        return self._run(job)

    def next_job(self, job_id: str) -> Job:
        """The queue's next job on this node: read as at boot (the hand-over made it the current job), with fresh
        per-job duties and an empty local checkpoint directory (the last job's checkpoints are not its own)."""
        self.new_job_duties()
        job = self.load_job()
        if job.job_id != job_id:  # a later hand-over or submit won: the group's nodes boot into that one
            raise AgentError(f"the current job is {job.job_id}, not {job_id} from the queue")
        shutil.rmtree(self.node.settings.node_root + job.checkpoint_dir, ignore_errors=True)
        return job

    def load_job(self) -> Job:
        """The job of this node's cluster and team; a job every node would refuse is marked FAILED (``refuse_job``),
        an unreadable one makes this node leave its group."""
        try:
            job = load_job(self.node.ssm, self.args.job_spec_parameter)
            for key, expected in (("team", self.args.team), ("cluster", self.args.cluster)):
                if job.spec.get(key) != expected:
                    raise JobRefused(
                        f"job spec {key} {job.spec.get(key)!r} does not match --{key} {expected!r}",
                        (job.bucket, job_prefix(cluster_prefix(job.spec["cluster"]), job.job_id) + FAILED),
                    )
        except JobRefused as exc:
            self.endings.refuse_job(exc)
            raise
        except (AgentError, *AWS_ERRORS) as exc:  # SSM unreadable: no job to run on this node
            self.lifecycle.move(state.LEAVING, f"no job to run: {exc}")
            self.group_exit.give_up(str(exc))
            raise AgentError(str(exc)) from None
        return job

    def _run(self, job: Job) -> int:
        self.node.log(
            f"job {job.job_id}: code s3://{job.bucket}/{job.code_key}, command {job.spec['command']!r}, "
            f"nodes {job.min_nodes}:{job.max_nodes} x {job.nproc_per_node}"
        )
        group, ended = self.boot(job)
        if ended:
            self.lifecycle.move(ended, f"the job is {ended} already")  # the end markers are states of the same name
            self.node.log(f"job {job.job_id} is already {ended}; nothing to run")
            self.handover.after_end(job, group, ended)
            return EXIT_FAILED if ended == FAILED else 0
        store = self.store = CheckpointStore(
            self.node.s3, job.bucket, checkpoints_prefix(job.job_prefix), job.job_id, self.node.log
        )
        self.drain_hold.start()  # a final upload may outlast the drain hook's heartbeat
        try:
            self.notices.check_notice("boot")
            self.warm.claim(job)
            work_dir = self.node.settings.work_dir
            os.makedirs(work_dir, exist_ok=True)
            with Timed(self.node.log, "download code"):
                code_dir = download_code(self.node.s3, job, work_dir)
            self.prepared = prepare_job(self.node, self.notices, self.warm, job, code_dir)
            return self.attempts(job, group, code_dir, store)
        except LeavingBeforeTraining as exc:
            stop = isinstance(exc, StopBeforeTraining)
            return self.endings.leave_before_training(job, group, str(exc), stop=stop)
        except Exception as exc:
            return self.endings.failed_before_the_end(job, group, exc)

    def boot(self, job: Job) -> Tuple[str, str]:
        """(this node's group, the job's end marker if it has one already, else ""), with the boot marker written.
        No answer from S3 or Auto Scaling: this node leaves its group (``AgentError``)."""
        try:
            group = self.node.group = self.group_exit.group_name()
            self.markers.put_boot_marker(job)
            self.lifecycle.publish_to(lambda record: self.publish_state(job, record))
            ended = [name for name in END_MARKERS if self.markers.marker(job, name) is not None]
        except (AgentError, *AWS_ERRORS) as exc:
            self.lifecycle.move(state.LEAVING, f"no answer at boot: {exc}")
            self.group_exit.give_up(f"before training: {exc}")
            raise AgentError(f"before training: {exc}") from None
        return group, (ended[0] if ended else "")

    def publish_state(self, job: Job, record: Dict[str, object]) -> None:
        """``nodes/<id>/state``, for ``trainctl status``; best effort: S3 failing here costs the node nothing."""
        try:
            self.markers.put_own(job, NODE_STATE, record)
        except AWS_ERRORS as exc:
            self.node.log(f"could not write this node's state {record['state']} ({exc})")

    def attempts(self, job: Job, group: str, code_dir: str, store: CheckpointStore) -> int:
        """Training attempts until the job is done, stopped or failed, or this node is interrupted."""
        failures, attempt, unfinished = 0, 0, 0
        while True:
            rc, interrupted = self.attempt(job, group, code_dir, store, attempt)
            before = self.trainer.newest_before
            if rc == 0:
                finished = self.finished(job, group, store, interrupted)
                if finished is not None:
                    return finished
                unfinished += 1  # bounded: an S3 that keeps refusing the final checkpoint would loop forever
                if not interrupted and unfinished > job.max_restarts + 1:
                    why = f"the training finished {unfinished} times without the job becoming DONE"
                    return self.endings.fail(job, group, f"{why}: {self.endings.not_done}")
            stopped = self.stopped(job, group, store, rc, interrupted, before)
            if stopped is not None:
                return stopped
            progressed = self.before_restart(job, store, before)
            # Trained to the end, but the final checkpoint was lost (finish() said so): the next attempt makes it
            # again. Not a restart without progress, or max_restarts 0 would fail a finished job.
            failures = 0 if progressed or rc == 0 else failures + 1
            # A trainer the stall watchdog ended counts as a failed one.
            stalled = self.trainer.stalled
            ended = f"{stalled} (job.stall_timeout_s)" if stalled else f"trainer exited with code {rc}"
            self.node.log(
                f"{ended}; {'progress was made' if progressed else 'no new checkpoint'}; "
                f"restarts without progress: {failures}/{job.max_restarts}"
            )
            if failures > job.max_restarts:
                why = f"{ended} after {failures - 1} restart(s) without a new checkpoint"
                return self.endings.fail(job, group, why)
            attempt += 1
            time.sleep(min(self.node.poll_s, 5.0))

    def finished(self, job: Job, group: str, store: CheckpointStore, interrupted: bool) -> Optional[int]:
        """The trainer exited 0: the done barrier. The exit code once this node's part ends, or None to go on (the
        job is not DONE: train again, or stop)."""
        if interrupted:
            self.node.log("the trainer finished before the notice took effect: finishing the job")
        try:
            if self.endings.finish(job, group):
                return 0
        except AWS_ERRORS as exc:  # the training ended well: not a FAILED job
            self.endings.finish_failed(job, group, exc)
            return 0
        if interrupted and not self.trainer.stop_requested:  # being reclaimed: its peers train again without it
            self.lifecycle.move(state.LEAVING, "interrupted; not DONE: its peers train again without this node")
            self.wait_durable_since_notice(job, store)
            self.group_exit.hand_back(group)
            return 0
        return None

    def stopped(
        self, job: Job, group: str, store: CheckpointStore, rc: int, interrupted: bool, before: Optional[int]
    ) -> Optional[int]:
        """A stop request or a notice ended the attempt: the exit code once the job saved what it could; None to
        restart."""
        if interrupted and self.trainer.stop_requested:
            self.wait_durable_since_notice(job, store)
            return self.endings.stopped(job, group, store)
        if rc != 0 and self.markers.marked(job, STOP):  # a peer's trainer stopped ours collectively
            # Rank 0's node may still be uploading the final checkpoint: scaling to 0 now would cut it off.
            self.syncs.wait_durable(job, store, before, time.monotonic() + job.grace_s)
            return self.endings.stopped(job, group, store)
        if interrupted:
            self.lifecycle.move(state.LEAVING, "interrupted: the group replaces this instance")
            self.wait_durable_since_notice(job, store)
            self.node.log("interrupted: exiting cleanly; the group replaces this instance")
            self.group_exit.hand_back(group)
            return 0
        return None

    def wait_durable_since_notice(self, job: Job, store: CheckpointStore) -> None:
        """``FinalSyncs.wait_durable`` from the trainer's SIGTERM, until the grace ends."""
        trainer = self.trainer
        self.syncs.wait_durable(job, store, trainer.notice_newest, trainer.notice_at + job.grace_s)

    def before_restart(self, job: Job, store: CheckpointStore, before: Optional[int]) -> bool:
        """Make this node's last checkpoint durable and wait for the peers' final syncs (each bounded by the grace);
        whether the attempt made progress (a durable checkpoint newer than ``before``)."""
        # This node's own final sync may have failed: the restore of a flat checkpoint would write S3's older
        # copy over the newer files, and peers wait for this node's report.
        try:
            own = self.syncs.own_pending_until(time.monotonic() + job.grace_s, during="a restart")
            if own is not None:
                self.node.log(f"{own} not durable in S3 within {job.grace_s:.0f} s; restarting from what S3 holds")
        except (OSError, *AWS_ERRORS) as exc:  # S3 does not say: restart from what it holds
            self.node.log(f"could not make this node's last checkpoint durable ({exc}); restarting from what S3 holds")
        self.syncs.wait_for_final_syncs(job)
        try:
            after = store.newest_complete()
        except AWS_ERRORS as exc:  # S3 does not say: no progress seen (bounded by max_restarts)
            self.node.log(f"could not list the checkpoints after the attempt ({exc})")
            after = None
        return after is not None and (before is None or after > before)

    def attempt(self, job: Job, group: str, code_dir: str, store: CheckpointStore, attempt: int) -> Tuple[int, bool]:
        """One training attempt: restore, find the peers, run the trainer, sync its checkpoints a last time and
        report that sync; (exit code, interrupted)."""
        self.lifecycle.move(state.RESTORE, f"attempt {attempt}" + (" (a restart)" if attempt else ""))
        self.notices.check_notice("code download" if attempt == 0 else "a restart")
        resume_step, flat = self.restore(job, store)
        syncer = Syncer(store, job, self.node.log, self.node.settings.keep)
        if flat is not None:
            syncer.restored_flat()
            self.node.log(f"resume step: unknown (flat checkpoint {flat})")
            restored = f"flat checkpoint {flat} restored"
        else:
            self.node.log(f"resume step: {resume_step if resume_step is not None else 'none (fresh start)'}")
            restored = "a fresh start" if resume_step is None else f"it resumes at step {resume_step}"
        self.lifecycle.move(state.WAIT_FOR_PEERS, restored)
        with Timed(self.node.log, "peer discovery"):
            peers = self.rendezvous.peers = self.rendezvous.wait_for_peers(group, job)
            if attempt == 0 and job.min_nodes < job.max_nodes:
                peers = self.rendezvous.peers = self.rendezvous.wait_for_ready_peers(job, group)
        ids = [i for i, _ in peers]
        self.node.log(f"peers: {', '.join(ids)}; rendezvous host {ids[0]}")
        cmd, env = self.rendezvous.torchrun_command(job, peers)
        env.update(self.prepared)  # the setup's cache directory
        env.update(job_environment(self.node.ssm, self.node.secretsmanager, job.spec))  # env and secrets, read now
        env.update(trainer_env(job, self.node.instance_id, attempt, resume_step, flat, ids))
        self.efa.apply(job.efa, env)
        self.notices.check_notice("peer discovery")
        self.rendezvous.report_training(job, attempt, env["SPOT_TRAINING_STORE_BIND_ADDRESS"], peers)
        self.lifecycle.move(state.TRAIN, f"attempt {attempt} with {len(ids)} node(s); rendezvous host {ids[0]}")
        with Timed(self.node.log, f"training attempt {attempt}"):
            rc, interrupted = self.trainer.run(job, code_dir, cmd, env, syncer)
        why = self.trainer.stalled or ("a notice or a stop" if interrupted else "")
        self.lifecycle.move(state.DRAIN, f"the trainer exited with code {rc}{f' ({why})' if why else ''}")
        with Timed(self.node.log, "final checkpoint sync"):
            syncer.sync(final=True)
        self.syncs.report(job, syncer, attempt, rc, interrupted)
        return rc, interrupted

    def restore(self, job: Job, store: CheckpointStore) -> Tuple[Optional[int], Optional[int]]:
        """Restore the newest complete checkpoint into the checkpoint directory: (the step to resume from, or None
        for a fresh start; the restored flat checkpoint's number, or None). Notes the newest durable checkpoint
        (``Trainer.newest_before``) that the attempt's progress is measured against."""
        store.interrupt = lambda: self.notices.check_notice("checkpoint restore")  # between parts: GBs outlast a notice
        with Timed(self.node.log, "restore checkpoint"):
            os.makedirs(job.checkpoint_dir, exist_ok=True)
            remove_partial_writes(job.checkpoint_dir)
            restored = store.restore_newest(job.checkpoint_dir)
        flat = restored[0] if restored is not None and restored[1] == "flat" else None
        if flat is not None and self.syncs.syncer is not None:
            # The last attempt's syncer, which a leave before training asks: the files the restore just rewrote
            # (new inodes and times) are no new checkpoint to it either.
            self.syncs.syncer.restored_flat()
        local = local_steps(job.checkpoint_dir)
        resume_step = max([s for s in ([restored[0]] if restored else []) + local[-1:]], default=None)
        self.notices.check_notice("checkpoint restore")
        # Listed after the restore, which leaves out a newest checkpoint that failed its check (the next save may
        # take its number).
        self.trainer.newest_before = store.newest_complete()
        # a flat checkpoint's files hold the step: the agent cannot tell it (its number counts the snapshots)
        return resume_step, flat
