"""Handing the instance back: leave the Auto Scaling group (a replacement, or one node fewer), scale it to 0, and
complete the drain hook so that the instance goes now."""

from __future__ import annotations

import time
from typing import Optional

from spot_training.agent.errors import AWS_ERRORS, AgentError, one_line
from spot_training.agent.node import Node
from spot_training.agent.notices import Notices
from spot_training.agent.warm_claim import WarmClaim
from spot_training.job_spec import DRAIN_HEARTBEAT_S, DRAIN_HOOK

# After the agent let the instance go (left its group, scaled it to 0), how long it waits for the group to start
# ending it before it exits without completing the drain hook (the hook's heartbeat then bounds the wait).
DRAIN_WAIT_S = 60.0
# An instance the agent cannot hand back to its group (Auto Scaling refuses, after botocore's retries) idles billed:
# it tries again, the pause doubling from the first value to the second, for at most HAND_BACK_RETRY_S.
HAND_BACK_PAUSE_S, HAND_BACK_RETRY_S = (30.0, 600.0), 6 * 3600.0


class GroupExit:
    """This node's way out of its group (``released``: the agent let the instance go)."""

    def __init__(self, node: Node, notices: Notices, warm: WarmClaim) -> None:
        self.node, self.notices, self.warm = node, notices, warm
        self.released = False
        self.pause_s, self.retry_s = HAND_BACK_PAUSE_S, HAND_BACK_RETRY_S

    def leave_group(self, group: str, for_good: bool = False) -> None:
        """Hand the instance back now instead of idling until the reclaim: the group launches a replacement, or
        (``for_good``) its desired capacity goes down by one. Nothing to do when the group is ending it already.
        An Auto Scaling outage is waited out (``pause_s`` doubling, at most ``retry_s``): idle, the instance is
        billed until it goes."""
        log = self.node.log
        if self.notices.terminating:
            self.released = True
            log(f"leaving {group}: it is ending this instance already")
            return
        deadline, pause = time.monotonic() + self.retry_s, self.pause_s[0]
        while True:
            try:
                self.node.asg.terminate_instance_in_auto_scaling_group(
                    InstanceId=self.node.instance_id, ShouldDecrementDesiredCapacity=for_good
                )
                self.released = True
                log(f"left {group}: " + ("one node fewer" if for_good else "the group launches a replacement"))
                return
            except AWS_ERRORS as exc:
                state = self.lifecycle_state()
                if state is not None and state.startswith("Terminat"):
                    self.released = True
                    log(f"leaving {group}: it is ending this instance already ({state})")
                    return
                denied = str(getattr(exc, "response", {}).get("Error", {}).get("Code", "")).startswith("AccessDenied")
                if state is None or denied or time.monotonic() + pause > deadline:  # None: in no group
                    log(f"could not leave {group} ({exc}): if {self.node.instance_id} still runs, terminate it by hand")
                    return
                log(f"could not leave {group} ({one_line(exc)}); trying again in {pause:g} s")
                if self.node.stop_signal.wait(pause):  # SIGTERM: the instance is shutting down already
                    log(f"not leaving {group}: this instance is shutting down")
                    return
                pause = min(pause * 2, self.pause_s[1])

    def lifecycle_state(self) -> Optional[str]:
        """This instance's lifecycle state (None: in no group; "" when Auto Scaling does not say). The group may be
        ending it already: a spot notice under capacity rebalancing does that on AWS."""
        try:
            state, _ = self.notices.own_lifecycle()
        except AWS_ERRORS:
            return ""
        return state

    def group_name(self) -> str:
        """This instance's Auto Scaling group: ``--asg-name``, or looked up."""
        if self.node.asg_name:
            return self.node.asg_name
        _, group = self.notices.own_lifecycle()
        if not group:
            raise AgentError(f"instance {self.node.instance_id} is not in an Auto Scaling group")
        return str(group)

    def hand_back(self, group: str, for_good: bool = False) -> None:
        """Flush the logs, free the warm volume and leave the group: the group launches a replacement now (unless
        ``for_good``: one node fewer). The logs first: the volume's detach may take up to a minute of what is left
        of a spot notice's two."""
        self.node.flush_log()
        self.warm.release()
        self.leave_group(group, for_good=for_good)

    def give_up(self, why: str) -> None:
        """This node cannot take part (no job spec, no answer from S3 or Auto Scaling at boot): leave the group, one
        node fewer, instead of idling billed. The job is not marked FAILED: its other nodes may be fine."""
        self.node.log(f"error: {why}; leaving the group (one node fewer)")
        self.warm.release()
        self.leave_group(self.node.group or self.node.asg_name or "the group", for_good=True)

    def scale_to_zero(self, group: str) -> None:
        self.warm.release()  # before the group terminates this instance
        try:
            self.node.asg.set_desired_capacity(AutoScalingGroupName=group, DesiredCapacity=0, HonorCooldown=False)
            self.released = True
            self.node.log(f"set desired capacity of {group} to 0")
        except AWS_ERRORS as exc:  # at least this node goes; its peers that see DONE scale to 0 (or leave) too
            self.node.log(f"could not scale {group} to 0 ({exc}); leaving it instead")
            self.leave_group(group, for_good=True)

    def complete_drain(self) -> None:
        """The group's drain hook holds an instance it ends in Terminating:Wait (billed) until told. However the
        agent ends: if the group holds this instance (its group ended it, or it was ended on a notice), or once it
        does after the agent let it go (left the group, scaled it to 0; at most ``DRAIN_WAIT_S``), complete the
        hook: the instance goes now, not after the hook's heartbeat. Nothing to do once it is out of its group."""
        group = self.wait_for_drain_hook()
        if group is None:
            return
        try:
            self.node.asg.complete_lifecycle_action(
                AutoScalingGroupName=group,
                LifecycleHookName=DRAIN_HOOK,
                InstanceId=self.node.instance_id,
                LifecycleActionResult="CONTINUE",
            )
            self.node.log(f"completed {DRAIN_HOOK}: {group} terminates this instance now")
        except AWS_ERRORS as exc:  # a hook of another name, or it timed out meanwhile
            self.node.log(
                f"could not complete {DRAIN_HOOK} ({one_line(exc)}); {group} terminates this instance after the "
                f"hook's heartbeat ({DRAIN_HEARTBEAT_S} s)"
            )

    def wait_for_drain_hook(self) -> Optional[str]:
        """The group's name once it holds this instance in Terminating:Wait; None when there is no hook to complete."""
        deadline = time.monotonic() + DRAIN_WAIT_S
        while True:
            try:
                state, group = self.notices.own_lifecycle()
            except AWS_ERRORS as exc:
                state, group = "unknown", ""
                self.node.log(f"could not read this instance's lifecycle state: {one_line(exc)}")
            if state == "Terminating:Wait":
                return group
            if state in (None, "Terminating:Proceed", "Terminated"):
                return None  # out of its group, or past the hook
            if state != "Terminating" and not (self.released or self.notices.terminating):
                return None  # not let go: it stays (and the agent said so where it failed)
            if time.monotonic() >= deadline:
                self.node.log(
                    f"the group did not start ending this instance within {DRAIN_WAIT_S:.0f} s (state {state})"
                )
                return None
            time.sleep(1.0)  # not stop_signal.wait: after a SIGTERM it would return at once, every time
