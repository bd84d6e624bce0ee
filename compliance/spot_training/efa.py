"""ST11: a multi-node group of EFA types in a cluster placement group that launches without EFA interfaces."""

from __future__ import annotations

from typing import Any, Optional

from compliance.spot_training.template import Resource, Template, props, ref_target
from team_config.instance_types import instance_facts


def _launch_templates(group: Resource, template: Template) -> list[dict[str, Any]]:
    """LaunchTemplateData of every launch template the group's MixedInstancesPolicy names (its own and overrides')."""
    spec = props(group).get("MixedInstancesPolicy", {}).get("LaunchTemplate", {})
    named = [spec.get("LaunchTemplateSpecification", {})]
    named += [o.get("LaunchTemplateSpecification", {}) for o in spec.get("Overrides", [])]
    found = [template.get("Resources", {}).get(ref_target(n.get("LaunchTemplateId")) or "") for n in named if n]
    return [dict(props(lt).get("LaunchTemplateData") or {}) for lt in found if lt]


def check_efa_on_multi_node_efa_types(_: str, resource: Resource, template: Template) -> Optional[list[str]]:
    p = props(resource)
    try:
        multi_node = int(p.get("MaxSize", 0)) > 1
    except (TypeError, ValueError):
        multi_node = True  # an intrinsic: whatever the deploy gives it
    overrides = p.get("MixedInstancesPolicy", {}).get("LaunchTemplate", {}).get("Overrides", [])
    types = [str(o.get("InstanceType")) for o in overrides]
    facts = [instance_facts().get(t) for t in types]
    efa_types = bool(types) and all(f is not None and f.efa_interfaces for f in facts)
    data = _launch_templates(resource, template)
    placed = any(d.get("Placement", {}).get("GroupName") or d.get("Placement", {}).get("GroupId") for d in data)
    if not (multi_node and efa_types and placed):
        return None
    with_efa = [d for d in data if any(i.get("InterfaceType") == "efa" for i in d.get("NetworkInterfaces", []))]
    return [] if with_efa else [f"{', '.join(types)} in a placement group with no EFA interface"]
