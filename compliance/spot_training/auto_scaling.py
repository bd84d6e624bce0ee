"""ST2-ST5: the Auto Scaling group (instance types, placement group, interruptions, size)."""

from __future__ import annotations

from typing import Any, Optional

from compliance.spot_training.template import (
    Resource,
    Template,
    as_list,
    mentions,
    props,
    ref_target,
    resources_of,
    truthy,
)

CAPACITY_AWARE = {"price-capacity-optimized", "capacity-optimized", "capacity-optimized-prioritized"}
MAX_FINITE_NODES = 1000


def _launch_template_data(group: Resource, template: Template) -> dict[str, Any]:
    """LaunchTemplateData of the launch template the group launches from (plain or mixed-instances)."""
    p = props(group)
    spec = p.get("LaunchTemplate") or p.get("MixedInstancesPolicy", {}).get("LaunchTemplate", {}).get(
        "LaunchTemplateSpecification"
    )
    lt = template.get("Resources", {}).get(ref_target((spec or {}).get("LaunchTemplateId")) or "", {})
    return dict(props(lt).get("LaunchTemplateData") or {})


def check_mixed_instances(_: str, resource: Resource, template: Template) -> Optional[list[str]]:
    p = props(resource)
    policy = p.get("MixedInstancesPolicy")
    if policy is None:
        market = _launch_template_data(resource, template).get("InstanceMarketOptions", {})
        return ["spot launch template without a MixedInstancesPolicy"] if market.get("MarketType") == "spot" else None
    distribution = policy.get("InstancesDistribution", {})
    if str(distribution.get("OnDemandPercentageAboveBaseCapacity", 100)) == "100":
        return None  # all on-demand: no spot capacity to diversify
    problems = []
    overrides = policy.get("LaunchTemplate", {}).get("Overrides", [])
    types = {o.get("InstanceType") for o in overrides} - {None}
    # attribute-based selection (InstanceRequirements): EC2 picks every type that matches, not one
    if len(types) < 2 and not any("InstanceRequirements" in o for o in overrides):
        problems.append(f"{len(types)} instance type(s)")
    strategy = distribution.get("SpotAllocationStrategy", "lowest-price")
    if strategy not in CAPACITY_AWARE:
        problems.append(f"SpotAllocationStrategy {strategy!r}")
    return problems


def group_azs(resource: Resource, template: Template) -> list[Any]:
    """The AZ (as written in the template) of each subnet or AZ the group spans; None where not in the template."""
    p = props(resource)
    if p.get("VPCZoneIdentifier"):
        out = []
        for subnet in as_list(p["VPCZoneIdentifier"]):
            res = template.get("Resources", {}).get(ref_target(subnet) or "")
            out.append(props(res).get("AvailabilityZone") if res else None)  # imported subnet: AZ unknown here
        return out
    return as_list(p.get("AvailabilityZones", []))


def check_placement_group_single_az(_: str, resource: Resource, template: Template) -> Optional[list[str]]:
    p = props(resource)
    placement = _launch_template_data(resource, template).get("Placement", {})
    named = p.get("PlacementGroup") or placement.get("GroupName") or placement.get("GroupId")
    if not named:
        return None
    placement_group = template.get("Resources", {}).get(ref_target(named) or "")
    if placement_group is not None and props(placement_group).get("Strategy", "cluster") != "cluster":
        return None  # spread and partition groups may span AZs; one made elsewhere counts as a cluster one
    spans = p.get("VPCZoneIdentifier") or p.get("AvailabilityZones") or []
    count = len(as_list(spans)) if not isinstance(spans, dict) else 2  # an unresolved list: not provably one
    return [] if count == 1 else [f"spans {count} subnets/AZs"]


def check_rebalance_or_hook(logical_id: str, resource: Resource, template: Template) -> Optional[list[str]]:
    p = props(resource)
    if str(p.get("MaxSize")) in ("0", "1"):
        return None  # single-node groups: nothing to rendezvous with
    if truthy(p.get("CapacityRebalance")):
        return []
    hooks = [
        h for h in p.get("LifecycleHookSpecificationList", []) if "TERMINATING" in str(h.get("LifecycleTransition"))
    ]
    hooks += [
        h
        for h in resources_of(template, "AWS::AutoScaling::LifecycleHook").values()
        if mentions(props(h).get("AutoScalingGroupName"), logical_id)
        and "TERMINATING" in str(props(h).get("LifecycleTransition"))
    ]
    return [] if hooks else ["no capacity rebalance and no termination lifecycle hook"]


def check_scale_to_zero(_: str, resource: Resource, __: Template) -> list[str]:
    p = props(resource)
    problems = []
    if str(p.get("MinSize")) != "0":
        problems.append(f"MinSize {p.get('MinSize')!r}")
    desired = p.get("DesiredCapacity", 0)  # nodes launched at create, and again by a deploy that changes it
    try:
        launches = isinstance(desired, dict) or int(desired) > 0  # an intrinsic: whatever the deploy gives it
    except (TypeError, ValueError):
        launches = True
    if launches:
        problems.append(f"DesiredCapacity {desired!r}")
    try:
        finite = 0 < int(p.get("MaxSize")) <= MAX_FINITE_NODES  # type: ignore[arg-type]
    except (TypeError, ValueError):
        finite = False
    if not finite:
        problems.append(f"MaxSize {p.get('MaxSize')!r}")
    return problems
