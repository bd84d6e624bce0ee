"""ST8: a warm-pool volume (encrypted, in the AZ of its cluster's group, or in a zone its capacity watcher moves the
group to: the ``zone`` names of the watcher's ``ZONES``, training_constructs/capacity_watcher.py)."""

from __future__ import annotations

import json
import re
from typing import Any, Optional

from compliance.spot_training.auto_scaling import group_azs
from compliance.spot_training.template import Resource, Template, props, resources_of, tags, truthy
from team_config.naming import CLUSTER_TAG, POOL_TAG


def check_warm_volume(_: str, resource: Resource, template: Template) -> Optional[list[str]]:
    volume_tags = tags(resource)
    if POOL_TAG not in volume_tags:
        return None
    p = props(resource)
    problems = [] if truthy(p.get("Encrypted")) else ["not encrypted"]
    cluster = volume_tags.get(CLUSTER_TAG)
    for group_id, group in resources_of(template, "AWS::AutoScaling::AutoScalingGroup").items():
        group_tags = {t.get("Key"): t.get("Value") for t in props(group).get("Tags", [])}
        if cluster is not None and group_tags.get(CLUSTER_TAG) == cluster:
            azs = [*group_azs(group, template), *watcher_zones(group_id, template)]
            if None not in azs and p.get("AvailabilityZone") not in azs:
                problems.append("not in the AZ of its cluster's group")
    return problems


ZONE_NAME = re.compile(r'"zone":"([a-z0-9-]+)"')


def watcher_zones(group_id: str, template: Template) -> list[str]:
    """The zones a capacity watcher of the group (its function's ``GROUP_NAME`` the group) moves it between: the
    literal ``zone`` names in its ``ZONES`` (a JSON string CloudFormation joins with the subnets and groups)."""
    found: list[str] = []
    for function in resources_of(template, "AWS::Lambda::Function").values():
        env = props(function).get("Environment", {}).get("Variables", {})
        if env.get("GROUP_NAME") == {"Ref": group_id} and "ZONES" in env:
            found += ZONE_NAME.findall("".join(_literals(env["ZONES"])))
    return found


def _literals(value: Any) -> list[str]:
    """The literal strings of a CloudFormation value (a ``Fn::Join``'s parts, nested), in order."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        return [s for v in value for s in _literals(v)]
    if isinstance(value, dict) and "Fn::Join" in value:
        return _literals(value["Fn::Join"][1])
    return [json.dumps(value)]
