"""A cluster's capacity as ``trainctl status`` shows it: whether its group waits for spot capacity (since when, and
EC2 Auto Scaling's reason, from the group's failed launches) and the capacity watcher's record (the market the group
is on, since when and why; ``capacity_watcher/``, docs/concepts/capacity.md)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, Optional

from bootstrap_scripts.spot_training.protocol import capacity_key, read_marker
from capacity_watcher.decision import SPOT, capacity_failures
from trainctl.cluster import ClientFactory, ClusterRef

LAUNCHED_STATES = ("Pending", "Pending:Wait", "Pending:Proceed", "InService")


def capacity(client: ClientFactory, ref: ClusterRef, group: dict[str, Any]) -> Optional[dict[str, Any]]:
    """What there is to say about the group's capacity (``group``: DescribeAutoScalingGroups' entry), or None: it has
    the nodes it asks for, and the watcher (if the cluster has one) never moved it off spot."""
    record = read_marker(client("s3"), ref.bucket, capacity_key(ref.prefix)) or {}
    desired = int(group.get("DesiredCapacity") or 0)
    launched = sum(1 for i in group.get("Instances", []) if i["LifecycleState"] in LAUNCHED_STATES)
    waiting = None
    if launched < desired:
        activities = client("autoscaling").describe_scaling_activities(AutoScalingGroupName=ref.group, MaxRecords=100)[
            "Activities"
        ]
        since = float(record.get("settled_at") or 0.0)
        failures = [f for f in capacity_failures(activities) if f.at >= since]
        if failures:
            waiting = {"since": failures[0].at, "reason": failures[-1].message, "launched": launched}
    market = str(record.get("market") or SPOT)
    if waiting is None and market == SPOT and not record.get("switched_at"):
        return None
    return {
        "market": market,
        "switched_at": record.get("switched_at"),
        "switch_reason": record.get("reason"),
        "waiting": waiting,
        "desired": desired,
    }


def capacity_lines(info: Optional[dict[str, Any]], now: float) -> list[str]:
    """:func:`capacity`'s answer as status lines."""
    if info is None:
        return []
    lines = []
    waiting = info["waiting"]
    if waiting is not None:
        lines.append(
            f"waiting for capacity: {waiting['launched']} of {info['desired']} node(s) since {_utc(waiting['since'])} "
            f"({now - waiting['since']:.0f} s): {waiting['reason']}"
        )
    if info["switched_at"] is not None:
        lines.append(f"capacity: {info['market']} since {_utc(info['switched_at'])}: {info['switch_reason']}")
    return lines


def _utc(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
