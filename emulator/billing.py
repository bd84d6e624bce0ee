"""The EC2 answers ``trainctl cost`` reads that moto leaves as placeholders; installed in the moto server process.

- **Spot launches.** moto launches every instance of a mixed instances group on demand and without an instance
  type. EC2 launches the instances above the policy's on-demand base (and its on-demand percentage) as spot, each
  as one of the policy's instance types; so do we (``InstanceLifecycle: spot``; the first listed type, for spot the
  first with spot capacity in the instance's zone, :mod:`emulator.spot_capacity`).
- **Scaling activities.** moto answers DescribeScalingActivities with an empty list. EC2 Auto Scaling records a
  ``Launching a new EC2 instance: i-...`` and a ``Terminating EC2 instance: i-...`` activity per instance; we
  answer them from EC2's own records of the group's instances (launch time; the time in the
  ``User initiated (...)`` state-transition reason of a terminated instance), and the failed spot launches of
  :mod:`emulator.spot_capacity` (a zone without spot capacity: no instance, a ``Failed`` activity).
- **Spot prices.** moto answers DescribeSpotPriceHistory with 0.00001 USD/h dated 2006. For the types in
  :data:`trainctl.prices.ON_DEMAND` we answer one price, the on-demand price x :data:`SPOT_PRICE_FRACTION`, dated a
  day before the server started. That fraction is this emulator's assumption, not a measurement.
"""

from __future__ import annotations

import hashlib
import math
import re
from datetime import UTC, datetime, timedelta
from typing import Any

from moto.autoscaling.models import FakeAutoScalingGroup
from moto.autoscaling.responses import AutoScalingResponse
from moto.core.responses import ActionResult
from moto.ec2.responses.spot_instances import SpotInstances

from emulator import spot_capacity
from emulator.moto_patch import original, patch
from trainctl.prices import ON_DEMAND

SPOT_PRICE_FRACTION = 0.35
_PRICES_FROM = datetime.now(UTC) - timedelta(days=1)
_TERMINATED_AT = re.compile(r"User initiated \((\d{4}-\d\d-\d\d \d\d:\d\d:\d\d) (?:UTC|GMT)\)")


def _replace_instances(self: FakeAutoScalingGroup, count_needed: int, propagated_tags: dict[str, str]) -> None:
    before = {s.instance.id for s in self.instance_states}
    original(FakeAutoScalingGroup, "replace_autoscaling_group_instances")(self, count_needed, propagated_tags)
    policy = self.mixed_instances_policy or {}
    overrides = [
        o["InstanceType"] for o in policy.get("LaunchTemplate", {}).get("Overrides", []) if "InstanceType" in o
    ]
    distribution = policy.get("InstancesDistribution") or {}
    base = int(distribution.get("OnDemandBaseCapacity") or 0)
    percentage = int(distribution.get("OnDemandPercentageAboveBaseCapacity") or 0)
    withdrawn = []
    for position, state in enumerate(self.instance_states):
        if state.instance.id in before or self.mixed_instances_policy is None:
            continue
        # The first `base` instances are on demand; of those above it, `percentage` % (rounded up) are.
        above = position - base
        on_demand = above < 0 or math.ceil((above + 1) * percentage / 100) > math.ceil(above * percentage / 100)
        state.instance.lifecycle = None if on_demand else "spot"
        if not on_demand and overrides:  # the first type with spot capacity in the instance's zone, if any
            chosen = spot_capacity.spot_type(str(state.instance.placement.zone), overrides)
            if chosen is None:  # none: EC2 launches nothing
                withdrawn.append(state)
            else:
                state.instance.instance_type = chosen
        elif not state.instance.instance_type and overrides:
            state.instance.instance_type = overrides[0]  # EC2 picks one of the overrides; moto leaves it empty
    if withdrawn:
        _withdraw(self, withdrawn)


def _withdraw(group: FakeAutoScalingGroup, states: list[Any]) -> None:
    """Spot launches that found no capacity: moto's instances go (terminated, then out of EC2's records: EC2 never
    launched them) and the group records one failed launch."""
    launched = len(group.instance_states) - len(states)
    group.instance_states = [s for s in group.instance_states if s not in states]
    ec2 = group.autoscaling_backend.ec2_backend
    ids = {s.instance.id for s in states}
    ec2.terminate_instances(sorted(ids))
    for reservation in ec2.reservations.values():
        reservation.instances = [i for i in reservation.instances if i.id not in ids]
    zone = states[0].instance.placement.zone
    spot_capacity.record_failure(group.name, launched, launched + len(states), zone)


def _activities(self: AutoScalingResponse) -> ActionResult:
    names = set(self._get_param("AutoScalingGroupNames", []) or [])
    name = self._get_param("AutoScalingGroupName")
    if name:
        names.add(name)
    ec2 = self.autoscaling_backend.ec2_backend
    activities: list[dict[str, Any]] = []
    for instance in ec2.all_instances():
        group = getattr(instance, "autoscaling_group", None)
        if group is None or (names and group.name not in names):
            continue
        launched = _utc(instance.launch_time)
        activities.append(_activity(group.name, instance.id, "Launching a new EC2 instance", launched))
        ended = _TERMINATED_AT.search(instance._reason or "")
        if instance.state == "terminated" and ended:
            at = datetime.strptime(ended.group(1), "%Y-%m-%d %H:%M:%S").replace(tzinfo=UTC)
            activities.append(_activity(group.name, instance.id, "Terminating EC2 instance", at))
    for group_name in names or {g.name for g in ec2_groups(self)}:
        activities += spot_capacity.failed_activities(group_name)
    activities.sort(key=lambda a: a["StartTime"], reverse=True)  # newest first, as EC2 Auto Scaling answers
    return ActionResult({"Activities": activities})


def ec2_groups(response: AutoScalingResponse) -> list[FakeAutoScalingGroup]:
    return list(response.autoscaling_backend.autoscaling_groups.values())


def _utc(value: Any) -> datetime:
    at = value if isinstance(value, datetime) else datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    return at if at.tzinfo else at.replace(tzinfo=UTC)


def _activity(group: str, instance_id: str, what: str, at: datetime) -> dict[str, Any]:
    return {
        "ActivityId": hashlib.sha256(f"{group}/{instance_id}/{what}".encode()).hexdigest()[:36],
        "AutoScalingGroupName": group,
        "Description": f"{what}: {instance_id}",
        "Cause": "emulator: derived from the instance's EC2 record",
        "StartTime": at,
        "EndTime": at,
        "StatusCode": "Successful",
        "Progress": 100,
    }


def _spot_price_history(self: SpotInstances) -> ActionResult:
    result: ActionResult = original(SpotInstances, "describe_spot_price_history")(self)
    history = result.result["SpotPriceHistory"]  # type: ignore[index]
    for entry in history:
        if entry["InstanceType"] in ON_DEMAND:
            entry["SpotPrice"] = f"{ON_DEMAND[entry['InstanceType']][0] * SPOT_PRICE_FRACTION:.6f}"
            entry["ProductDescription"] = "Linux/UNIX"
            entry["Timestamp"] = _PRICES_FROM
    return result


def install() -> None:
    """Idempotent: spot lifecycle, scaling activities and spot prices in every backend of this process."""
    patch(FakeAutoScalingGroup, "replace_autoscaling_group_instances", _replace_instances)
    patch(AutoScalingResponse, "describe_scaling_activities", _activities)
    patch(SpotInstances, "describe_spot_price_history", _spot_price_history)
