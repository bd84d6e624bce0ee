"""Notices that this instance goes: the agent's own SIGTERM, the spot notice in IMDS, or the group ending the instance
(its target lifecycle state ``Terminated``)."""

from __future__ import annotations

from typing import Optional, Tuple

from spot_training.agent.errors import IMDS_ERRORS, LeavingBeforeTraining
from spot_training.agent.instance_signals import lifecycle_of
from spot_training.agent.node import Node
from spot_training.job_spec import DRAIN_HOOK
from spot_training.protocol import SPOT_NOTICE


class Notices:
    """What this node knows of its own end (``terminating``: its group is ending it, only ever set)."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self.terminating = False

    def notice(self) -> Optional[str]:
        """The agent's own SIGTERM, the spot notice in IMDS or the group ending this instance (capacity rebalancing
        once the replacement runs, a scale-in: no spot notice, the drain hook holds the instance), described, or
        None (also when IMDS does not answer)."""
        if self.node.stop_signal.is_set():
            return "agent received SIGTERM"
        try:
            action = self.node.imds.get("spot/instance-action")
            if action:
                return f"{SPOT_NOTICE} {action.strip()}"
            if self.group_ending_it():
                return f"its Auto Scaling group is ending this instance (lifecycle hook {DRAIN_HOOK})"
        except IMDS_ERRORS as exc:
            self.node.log(f"IMDS poll failed: {exc}")
        return None

    def group_ending_it(self) -> bool:
        """True once ``autoscaling/target-lifecycle-state`` is ``Terminated`` (remembered in ``terminating``)."""
        if not self.terminating:
            state = self.node.imds.get("autoscaling/target-lifecycle-state")
            if state is not None and state.strip() == "Terminated":
                self.terminating = True  # only ever set: two threads read it (the notice watcher, the drain hold)
        return self.terminating

    def check_notice(self, during: str) -> None:
        """Before the trainer runs: a spot notice (or the agent's SIGTERM) raises ``LeavingBeforeTraining``. A node
        that restores or looks for peers while it is being reclaimed must not join a rendezvous it cannot finish."""
        why = self.notice()
        if why:
            raise LeavingBeforeTraining(f"{why} during {during}")

    def own_lifecycle(self) -> Tuple[Optional[str], str]:
        """(this instance's lifecycle state in its group, the group's name); (None, "") once it is in no group."""
        return lifecycle_of(self.node.asg, self.node.instance_id)
