"""ST8: a warm-pool volume (encrypted, in the AZ of its cluster's group)."""

from __future__ import annotations

from typing import Optional

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
    for group in resources_of(template, "AWS::AutoScaling::AutoScalingGroup").values():
        group_tags = {t.get("Key"): t.get("Value") for t in props(group).get("Tags", [])}
        if cluster is not None and group_tags.get(CLUSTER_TAG) == cluster:
            azs = group_azs(group, template)
            if None not in azs and p.get("AvailabilityZone") not in azs:
                problems.append("not in the AZ of its cluster's group")
    return problems
