"""The drain hook's hold: records the group's drain-hook heartbeat while a final checkpoint upload is under way."""

from __future__ import annotations

import math
import threading
import time
from typing import Any, Callable, Optional

from spot_training.agent.errors import AWS_ERRORS, one_line
from spot_training.agent.instance_signals import lifecycle_of
from spot_training.job_spec import DRAIN_HEARTBEAT_S, DRAIN_HOOK

# The drain hold (DrainHold) looks every DRAIN_LOOK_S whether checkpoint bytes went to S3 and records the drain hook's
# heartbeat at most every DRAIN_BEAT_S: a fifth of the heartbeat, so that a failed one is tried again at the next look
# with bytes sent, several times before the hook's heartbeat runs out.
DRAIN_LOOK_S, DRAIN_BEAT_S = 10.0, DRAIN_HEARTBEAT_S / 5


class DrainHold:
    """Keeps the group's drain hook from ending the instance under a checkpoint upload. The hook holds an instance
    its group ends for ``DRAIN_HEARTBEAT_S``: enough for the trainer's save (the grace, under 120 s) and a usual final
    upload, not for a very large checkpoint or a slow S3. For the whole job the hold looks every ``look_s``. When
    checkpoint bytes went to S3 (``sent``) since its last look, at most every ``beat_s``, and only while ``ending``
    (no trainer runs and the group ends the instance: ``target-lifecycle-state`` ``Terminated`` in the metadata) and
    the group holds it in ``Terminating:Wait``, it records the hook's heartbeat (``RecordLifecycleActionHeartbeat``:
    the hook's ``DRAIN_HEARTBEAT_S`` start again). That covers the final upload after the group's own notice, and one
    the group interrupts (after a stop, a peer's agent sets the group to 0 while rank 0's node may still upload). No
    bytes, no heartbeat: a finished, failed or hung upload keeps the instance at most ``DRAIN_HEARTBEAT_S`` after the
    last one. Nor while a trainer runs: an agent that missed the group's notice would otherwise renew the hook with
    every periodic checkpoint. AWS ends a wait after 100 heartbeat timeouts (or 48 h) whatever the agent does."""

    def __init__(
        self,
        asg: Any,
        instance_id: str,
        log: Callable[[str], None],
        sent: Callable[[], int],
        ending: Callable[[], bool],
        look_s: float = DRAIN_LOOK_S,
        beat_s: float = DRAIN_BEAT_S,
    ) -> None:
        self.asg, self.instance_id, self.log, self.sent, self.ending = asg, instance_id, log, sent, ending
        self.look_s, self.beat_s = look_s, beat_s
        self.done = threading.Event()
        self.thread: Optional[threading.Thread] = None
        self.lock = threading.Lock()  # start() and stop() may come from different threads
        self.beat_at = -math.inf  # time.monotonic() of the last heartbeat
        self.seen = 0  # ``sent()`` at the last look

    def start(self) -> None:
        """Idempotent: the first call starts the hold's thread (bytes sent before it are not counted)."""
        with self.lock:
            if self.thread is None and not self.done.is_set():
                self.seen = self.sent()
                self.thread = threading.Thread(target=self._run, name="drain-hold", daemon=True)
                self.thread.start()

    def stop(self) -> None:
        """Before the hook is completed: no heartbeat after it (a short wait for one in flight)."""
        self.done.set()
        with self.lock:
            thread = self.thread
        if thread is not None:
            thread.join(timeout=1)  # a heartbeat after the completion is refused by AWS; no need to wait long

    def _run(self) -> None:
        while not self.done.wait(self.look_s):
            try:
                self.look()
            except Exception as exc:  # an odd answer must not end the hold for the rest of the job
                if not self.done.is_set():
                    self.log(f"drain hold: {type(exc).__name__}: {one_line(exc)}; it looks again in {self.look_s:g} s")

    def look(self) -> None:
        sent = self.sent()
        moved, self.seen = sent - self.seen, sent
        if not moved or time.monotonic() - self.beat_at < self.beat_s or not self.ending():
            return  # nothing under way, a heartbeat not yet due, or the group keeps the instance
        state, group = lifecycle_of(self.asg, self.instance_id)
        if state != "Terminating:Wait" or self.done.is_set():
            return
        try:
            self.asg.record_lifecycle_action_heartbeat(
                AutoScalingGroupName=group, LifecycleHookName=DRAIN_HOOK, InstanceId=self.instance_id
            )
        except AWS_ERRORS as exc:
            if not self.done.is_set():
                self.log(
                    f"could not record {DRAIN_HOOK}'s heartbeat ({one_line(exc)}); the next look with bytes sent "
                    "tries again"
                )
            return
        self.beat_at = time.monotonic()
        self.log(
            f"checkpoint upload under way ({moved / 2**20:.1f} MiB in the last {self.look_s:g} s): recorded "
            f"{DRAIN_HOOK}'s heartbeat, {group} holds this instance up to {DRAIN_HEARTBEAT_S} s more"
        )
