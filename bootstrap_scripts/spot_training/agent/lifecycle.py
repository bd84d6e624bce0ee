"""The node's lifecycle: its named states, the one table of the transitions between them, and ``Lifecycle``, which
makes each one: logged once as ``state A -> B: reason`` and published (the supervisor writes it to
``nodes/<instance-id>/state`` for ``trainctl status``). The supervisor moves the node through an attempt; the endings
(``leaving``) and the supervisor's hand-backs move it to its final state, before they let the instance go. A
transition the table does not have is an agent bug: logged and refused, never raised (an agent that dies leaves a
billed node).

Standard library only, no import of the agent's other modules: the docs generator (``docs_gen/node_lifecycle.py``)
draws the table as a diagram from this module."""

from __future__ import annotations

import time
from typing import Callable, Dict, Optional, Tuple

BOOT = "BOOT"
RESTORE = "RESTORE"
WAIT_FOR_PEERS = "WAIT_FOR_PEERS"
TRAIN = "TRAIN"
DRAIN = "DRAIN"
DONE = "DONE"
FAILED = "FAILED"
STOPPED = "STOPPED"
LEAVING = "LEAVING"
REFUSED = "REFUSED"

# Every state, in the order a node usually goes through them, with what the node does in it.
STATES: Dict[str, str] = {
    BOOT: "reads the job, writes its boot marker, claims a warm volume, downloads the code",
    RESTORE: "restores the newest complete checkpoint into the checkpoint directory (at each attempt)",
    WAIT_FOR_PEERS: "finds its peers and the rendezvous host, reports that it starts training",
    TRAIN: "runs torchrun and syncs the checkpoint directory to S3; watches for notices, a stop, lost peers, stalls",
    DRAIN: "the trainer has exited: the final checkpoint sync, the peers' final syncs, the done barrier",
    DONE: "the job is DONE (this node or a peer wrote it), or this node left the last steps to its peers",
    FAILED: "the job is FAILED with the reason and its group goes to 0",
    STOPPED: "the job stops (trainctl stop, the budget guard): STOPPED and the group to 0, or this node leaves it",
    LEAVING: "this node hands its instance back (a notice, its group ending it, it cannot take part); the job goes on",
    REFUSED: "the job is one no node of the group can run: FAILED with the reason, the group to 0",
}
# States with no way out: the node's part in the job is over, the agent exits.
TERMINAL = frozenset({DONE, FAILED, STOPPED, LEAVING, REFUSED})

# (from, to): when the supervisor makes that transition.
TRANSITIONS: Dict[Tuple[str, str], str] = {
    (BOOT, RESTORE): "the code is unpacked: the first attempt starts",
    (BOOT, DONE): "the job is DONE already",
    (BOOT, FAILED): "the job is FAILED already, or the code download, the warm volume or AWS fails",
    (BOOT, STOPPED): "the job is STOPPED already",
    (BOOT, LEAVING): "a notice at boot, no answer from SSM, S3 or Auto Scaling, or an error while peers train on",
    (BOOT, REFUSED): "no job was submitted, or its spec is invalid or names another team or cluster",
    (RESTORE, WAIT_FOR_PEERS): "the newest complete checkpoint is restored (or there is none)",
    (RESTORE, FAILED): "no readable checkpoint, AWS failing after the retries, an agent bug",
    (RESTORE, LEAVING): "a notice during the restore, or an error while peers train on without this node",
    (WAIT_FOR_PEERS, TRAIN): "min_nodes peers are there: torchrun starts",
    (WAIT_FOR_PEERS, FAILED): "fewer than min_nodes peers within the join timeout",
    (WAIT_FOR_PEERS, STOPPED): "a stop before this node's trainer started",
    (WAIT_FOR_PEERS, LEAVING): "a notice, or no place past max_nodes, while waiting for peers",
    (TRAIN, DRAIN): "the trainer exited: by itself, or on a notice, a stop, a lost peer or a stall",
    (TRAIN, FAILED): "an agent error while the trainer runs",
    (DRAIN, RESTORE): "the job goes on: train again from the newest durable checkpoint",
    (DRAIN, DONE): "the trainer finished and the done barrier passed",
    (DRAIN, FAILED): "max_restarts restarts without a new checkpoint, or an error",
    (DRAIN, STOPPED): "a stop: the final checkpoint is durable, or the grace is over",
    (DRAIN, LEAVING): "a notice: it waits for the emergency checkpoint (at most the grace), then leaves",
}


def line(source: str, target: str, reason: str) -> str:
    """The one format of a transition in the log."""
    return f"state {source} -> {target}: {reason}"


class Lifecycle:
    """One node's state (``state``, ``since``: ``time.time()`` it was entered, ``reason``). ``log`` gets each
    transition's line; ``publish``, once set (the job is known), each state's record."""

    def __init__(self, log: Callable[[str], None], state: str = BOOT) -> None:
        self.log = log
        self.state, self.since, self.reason = state, time.time(), "the agent starts"
        self.publish: Optional[Callable[[Dict[str, object]], None]] = None

    def record(self, previous: Optional[str] = None) -> Dict[str, object]:
        """The state as ``nodes/<instance-id>/state`` holds it."""
        return {"state": self.state, "previous": previous, "since": self.since, "reason": self.reason}

    def publish_to(self, publish: Callable[[Dict[str, object]], None]) -> None:
        """Publish the current state now and each one after it (the caller keeps its failures to itself)."""
        self.publish = publish
        publish(self.record())

    def move(self, target: str, reason: str) -> bool:
        """Go to ``target`` for ``reason``; whether the node moved. Staying in the same state is no transition. A
        transition the table does not have is refused with a log line (an agent bug: the state stays)."""
        source = self.state
        if target == source:
            return False
        if (source, target) not in TRANSITIONS:
            self.log(f"refused {line(source, target, reason)} (not in the node's transition table: an agent bug)")
            return False
        self.state, self.since, self.reason = target, time.time(), reason
        self.log(line(source, target, reason))
        if self.publish is not None:
            self.publish(self.record(source))
        return True
