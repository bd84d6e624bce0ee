"""What the capacity watcher does with a group, as a pure function of what it read: the group's desired and launched
nodes, its failed spot launches (DescribeScalingActivities), its last record and the time.

- The group at 0 (its job ended or was stopped): a group on on-demand goes back to spot, so the next job, or a job
  started again from its checkpoint, asks for spot first.
- The group filled (launched >= desired): nothing to do; the time is kept (``settled_at``): only spot failures after
  it count for the next wait.
- The group short of nodes, with failed spot launches since it was last settled: it waits for capacity since the
  first of them; once that is ``after_s`` ago, a group on spot goes to on-demand; but a group with ``zones`` (one
  zone at a time, a placement group each) and no node launched moves to the next listed zone not tried since it was
  last at 0 or filled (``zones_tried``), and goes to on-demand only once every listed zone failed. A group with a
  node never moves: its nodes would be left in another zone than their peers.
Standard library only: the function's package holds this file at the same path.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Optional

SPOT, ON_DEMAND, MOVE = "spot", "on-demand", "move"
# EC2 Auto Scaling's status message of a spot launch that found no capacity
CAPACITY_ERRORS = ("InsufficientInstanceCapacity", "no Spot capacity available")


@dataclass(frozen=True)
class Failure:
    """A launch EC2 Auto Scaling could not make for want of spot capacity: when, and its status message."""

    at: float
    message: str


@dataclass
class Decision:
    """``action``: ``on-demand``, ``spot``, ``move`` (to ``zone``) or None (leave the group); ``record``: what the
    watcher writes back."""

    action: Optional[str]
    record: dict[str, Any] = field(default_factory=dict)
    reason: str = ""
    zone: Optional[str] = None


def capacity_failures(activities: list[dict[str, Any]]) -> list[Failure]:
    """The failed launches for want of spot capacity among a group's scaling activities (StatusCode ``Failed``)."""
    found = []
    for activity in activities:
        message = str(activity.get("StatusMessage") or activity.get("Description") or "")
        if activity.get("StatusCode") == "Failed" and any(e in message for e in CAPACITY_ERRORS):
            start = activity["StartTime"]
            at = start.timestamp() if isinstance(start, datetime) else float(start)
            found.append(Failure(at, message))
    return sorted(found, key=lambda f: f.at)


def next_zone(zones: Sequence[str], zone: Optional[str], tried: Sequence[str]) -> Optional[str]:
    """The first listed zone after ``zone`` (in the list's order, round) not in ``tried``; None: every zone tried."""
    start = zones.index(zone) + 1 if zone in zones else 0
    return next((z for z in [*zones[start:], *zones[:start]] if z not in tried), None)


def decide(
    *,
    desired: int,
    launched: int,
    failures: list[Failure],
    record: dict[str, Any],
    now: float,
    after_s: float,
    zones: Sequence[str] = (),
    zone: Optional[str] = None,
) -> Decision:
    """See the module doc. ``launched``: the group's instances that are pending or in service; ``zones``: the zones
    the group moves between (empty: it does not move), ``zone`` the one it is in."""
    market = record.get("market", SPOT)
    # a new attempt (the group at 0 or filled) starts with only its zone tried
    fresh = {"zone": zone, "zones_tried": [zone]} if zones else {}
    if desired == 0:
        if market == ON_DEMAND:
            reason = "the group is at 0 (its job ended or was stopped): back to spot for the next start"
            back = {"market": SPOT, "settled_at": now, "switched_at": now, "reason": reason, **fresh}
            return Decision(SPOT, {**record, **back} if zones else back, reason)
        return Decision(None, {**record, "market": SPOT, "settled_at": now, "waiting_since": None, **fresh})
    if launched >= desired:
        return Decision(None, {**record, "market": market, "settled_at": now, "waiting_since": None, **fresh})
    recent = [f for f in failures if f.at >= float(record.get("settled_at") or 0.0)]
    if not recent:
        return Decision(None, {**record, "market": market, "waiting_since": None})
    since, latest = recent[0].at, recent[-1].message
    waiting = {**record, "market": market, "waiting_since": since, "waiting_reason": latest}
    if market == SPOT and now - since >= after_s:
        minutes = f"{round((now - since) / 60, 1)} min"
        tried = list(record.get("zones_tried") or [zone])
        target = next_zone(zones, zone, tried) if launched == 0 else None
        if target is not None:
            reason = f"no spot in {zone} for {minutes}: moved to {target}: {latest}"
            moved = {"zone": target, "zones_tried": [*tried, target], "moved_at": now, "move_reason": reason}
            # the new zone's wait counts from now: the old zone's failures are not its own
            return Decision(MOVE, {**waiting, **moved, "settled_at": now, "waiting_since": None}, reason, target)
        in_zones = f", every listed zone tried ({', '.join(tried)})" if zones and launched == 0 else ""
        reason = (
            f"spot launched {launched} of {desired} node(s) in {minutes}{in_zones} "
            f"(on_demand_after {round(after_s / 60, 1)} min): {latest}"
        )
        return Decision(ON_DEMAND, {**waiting, "market": ON_DEMAND, "switched_at": now, "reason": reason}, reason)
    return Decision(None, waiting)
