"""What the capacity watcher does with a group, as a pure function of what it read: the group's desired and launched
nodes, its failed spot launches (DescribeScalingActivities), its last record and the time.

- The group at 0 (its job ended or was stopped): a group on on-demand goes back to spot, so the next job, or a job
  started again from its checkpoint, asks for spot first.
- The group filled (launched >= desired): nothing to do; the time is kept (``settled_at``): only spot failures after
  it count for the next wait.
- The group short of nodes, with failed spot launches since it was last settled: it waits for capacity since the
  first of them; once that is ``after_s`` ago, a group on spot goes to on-demand.
Standard library only: the function's package holds this file at the same path.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Optional

SPOT, ON_DEMAND = "spot", "on-demand"
# EC2 Auto Scaling's status message of a spot launch that found no capacity
CAPACITY_ERRORS = ("InsufficientInstanceCapacity", "no Spot capacity available")


@dataclass(frozen=True)
class Failure:
    """A launch EC2 Auto Scaling could not make for want of spot capacity: when, and its status message."""

    at: float
    message: str


@dataclass
class Decision:
    """``action``: ``on-demand``, ``spot`` or None (leave the group); ``record``: what the watcher writes back."""

    action: Optional[str]
    record: dict[str, Any] = field(default_factory=dict)
    reason: str = ""


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


def decide(
    *, desired: int, launched: int, failures: list[Failure], record: dict[str, Any], now: float, after_s: float
) -> Decision:
    """See the module doc. ``launched``: the group's instances that are pending or in service."""
    market = record.get("market", SPOT)
    if desired == 0:
        if market == ON_DEMAND:
            reason = "the group is at 0 (its job ended or was stopped): back to spot for the next start"
            return Decision(SPOT, {"market": SPOT, "settled_at": now, "switched_at": now, "reason": reason}, reason)
        return Decision(None, {**record, "market": SPOT, "settled_at": now, "waiting_since": None})
    if launched >= desired:
        return Decision(None, {**record, "market": market, "settled_at": now, "waiting_since": None})
    recent = [f for f in failures if f.at >= float(record.get("settled_at") or 0.0)]
    if not recent:
        return Decision(None, {**record, "market": market, "waiting_since": None})
    since, latest = recent[0].at, recent[-1].message
    waiting = {**record, "market": market, "waiting_since": since, "waiting_reason": latest}
    if market == SPOT and now - since >= after_s:
        reason = (
            f"spot launched {launched} of {desired} node(s) in {round((now - since) / 60, 1)} min "
            f"(on_demand_after {round(after_s / 60, 1)} min): {latest}"
        )
        return Decision(ON_DEMAND, {**waiting, "market": ON_DEMAND, "switched_at": now, "reason": reason}, reason)
    return Decision(None, waiting)
