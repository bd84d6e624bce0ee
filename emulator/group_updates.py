"""UpdateAutoScalingGroup as EC2 Auto Scaling answers it, for a group's MixedInstancesPolicy; installed in the moto
server process.

moto's update replaces the group's MixedInstancesPolicy with the request's: none (an update of the desired capacity
alone) leaves the group without one, and a policy with only ``InstancesDistribution`` (what the capacity watcher
sends) without its launch template. EC2 Auto Scaling keeps the group's policy when the request has none, and changes
only the parts a request's policy names (the API's ``LaunchTemplate`` is optional). So does the emulator: the
request's ``InstancesDistribution`` keys over the group's, its ``LaunchTemplate`` (if any) over the group's.
"""

from __future__ import annotations

import copy
from typing import Any, Optional

from moto.autoscaling.models import FakeAutoScalingGroup

from emulator.moto_patch import original, patch


def merged_policy(current: Optional[dict[str, Any]], update: Optional[dict[str, Any]]) -> Optional[dict[str, Any]]:
    """The group's policy after an update that names ``update`` (None: no MixedInstancesPolicy in the request)."""
    if update is None or not current:
        return current if update is None else update
    distribution = {**current.get("InstancesDistribution", {}), **update.get("InstancesDistribution", {})}
    return {**current, **update, "InstancesDistribution": distribution}


def _update(self: FakeAutoScalingGroup, *args: Any, mixed_instances_policy: Any = None, **kwargs: Any) -> None:
    policy = copy.deepcopy(merged_policy(self.mixed_instances_policy, mixed_instances_policy))
    spec = (policy or {}).get("LaunchTemplate", {}).get("LaunchTemplateSpecification", {})
    if "LaunchTemplateId" in spec:  # moto stores the group's template by id and name, and takes only one of them
        spec.pop("LaunchTemplateName", None)
    original(FakeAutoScalingGroup, "update")(self, *args, mixed_instances_policy=policy, **kwargs)


def install() -> None:
    """Idempotent."""
    patch(FakeAutoScalingGroup, "update", _update)
