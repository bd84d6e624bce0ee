"""Auto Scaling (items 8 and 12 of :mod:`emulator.cfn_compat`): groups with everything the template says,
and lifecycle hooks.

8. ``AWS::AutoScaling::AutoScalingGroup``: moto's model drops ``CapacityRebalance``,
   ``MetricsCollection`` and ``PlacementGroup`` (its API keeps them). -> A model that passes them
   to moto's ``create_auto_scaling_group`` /
   ``enable_metrics_collection`` (no ``Metrics`` list = all group metrics, as on AWS) and returns
   moto's group, so scaling, instances and the Auto Scaling API are moto's own.
12. ``AWS::AutoScaling::LifecycleHook``: no CloudFormation type (moto's Auto Scaling API stores hooks; what they do
    to the group is :mod:`emulator.lifecycle`). -> A model that creates the hook through moto's
    ``create_lifecycle_hook`` (``AutoScalingGroupName``, ``LifecycleTransition``, ``HeartbeatTimeout``,
    ``DefaultResult``, ``LifecycleHookName``, generated when absent as for SSM parameters, ``NotificationMetadata``),
    checks the group exists and the values are in AWS's ranges, and deletes it with the stack; ``Ref`` = the hook's
    name. moto gives every hook an example role and SQS queue ARN (ours have neither: ``DescribeLifecycleHooks`` shows
    none) and a 48 h ``GlobalTimeout`` (ours: AWS's 100 x ``HeartbeatTimeout``, at most 48 h).
    ``NotificationTargetARN`` and ``RoleARN`` are not emulated (nothing is ever notified): reported.
"""

from __future__ import annotations

from typing import Any

from moto.autoscaling.models import FakeAutoScalingGroup, autoscaling_backends
from moto.core.common_models import CloudFormationModel

from emulator.cfn_compat.base import CompatModel, as_bool

# --- 8. Auto Scaling groups with everything the template says ---------------------------------------

ALL_GROUP_METRICS = (
    "GroupMinSize", "GroupMaxSize", "GroupDesiredCapacity", "GroupInServiceInstances", "GroupPendingInstances",
    "GroupStandbyInstances", "GroupTerminatingInstances", "GroupTotalInstances", "GroupInServiceCapacity",
    "GroupPendingCapacity", "GroupStandbyCapacity", "GroupTerminatingCapacity", "GroupTotalCapacity",
    "WarmPoolDesiredCapacity", "WarmPoolWarmedCapacity", "WarmPoolPendingCapacity", "WarmPoolTerminatingCapacity",
    "WarmPoolTotalCapacity", "GroupAndWarmPoolDesiredCapacity", "GroupAndWarmPoolTotalCapacity",
)  # fmt: skip
_ASG_PROPS = frozenset({
    "AutoScalingGroupName", "AvailabilityZones", "CapacityRebalance", "Cooldown", "DesiredCapacity",
    "HealthCheckGracePeriod", "HealthCheckType", "LaunchConfigurationName", "LaunchTemplate", "LoadBalancerNames",
    "MaxSize", "MetricsCollection", "MinSize", "MixedInstancesPolicy", "NewInstancesProtectedFromScaleIn",
    "PlacementGroup", "Tags", "TargetGroupARNs", "TerminationPolicies", "VPCZoneIdentifier",
})  # fmt: skip


class AutoScalingGroup(CompatModel, CloudFormationModel):
    """``AWS::AutoScaling::AutoScalingGroup`` keeping capacity rebalance, metrics, placement (returns moto's group)."""

    CFN_TYPE = "AWS::AutoScaling::AutoScalingGroup"
    NAME_PROPERTY = "AutoScalingGroupName"
    MOTO_MODEL = FakeAutoScalingGroup
    PROPERTIES = _ASG_PROPS

    @classmethod
    def create(cls, name: str, props: Any, account_id: str, region_name: str) -> Any:
        backend = autoscaling_backends[account_id][region_name]
        group = backend.create_auto_scaling_group(
            name=name,
            availability_zones=props.get("AvailabilityZones", []),
            desired_capacity=props.get("DesiredCapacity"),
            max_size=props.get("MaxSize"),
            min_size=props.get("MinSize"),
            launch_config_name=props.get("LaunchConfigurationName"),
            launch_template=props.get("LaunchTemplate", {}),
            vpc_zone_identifier=",".join(props.get("VPCZoneIdentifier", [])) or None,
            default_cooldown=props.get("Cooldown"),
            health_check_period=props.get("HealthCheckGracePeriod"),
            health_check_type=props.get("HealthCheckType"),
            load_balancers=props.get("LoadBalancerNames", []),
            target_group_arns=props.get("TargetGroupARNs", []),
            placement_group=props.get("PlacementGroup"),
            termination_policies=props.get("TerminationPolicies", []),
            tags=props.get("Tags", []),
            capacity_rebalance=as_bool(props.get("CapacityRebalance", False)),
            new_instances_protected_from_scale_in=as_bool(props.get("NewInstancesProtectedFromScaleIn", False)),
            mixed_instances_policy=props.get("MixedInstancesPolicy", {}),
        )
        metrics: list[str] = []
        for collection in props.get("MetricsCollection", []):
            metrics += collection.get("Metrics") or list(ALL_GROUP_METRICS)
        if metrics:
            backend.enable_metrics_collection(group.name, list(dict.fromkeys(metrics)))
        return group


# --- 12. Lifecycle hooks ----------------------------------------------------------------------------

_LIFECYCLE_HOOK_PROPS = frozenset({
    "AutoScalingGroupName", "LifecycleTransition", "HeartbeatTimeout", "DefaultResult", "LifecycleHookName",
    "NotificationMetadata",
})  # fmt: skip
LIFECYCLE_TRANSITIONS = ("autoscaling:EC2_INSTANCE_LAUNCHING", "autoscaling:EC2_INSTANCE_TERMINATING")


class LifecycleHook(CompatModel, CloudFormationModel):
    """``AWS::AutoScaling::LifecycleHook`` through moto's Auto Scaling backend; ``Ref`` = the hook's name."""

    CFN_TYPE = "AWS::AutoScaling::LifecycleHook"
    NAME_PROPERTY = "LifecycleHookName"
    PROPERTIES = _LIFECYCLE_HOOK_PROPS

    def __init__(self, account_id: str, region_name: str, group_name: str, name: str) -> None:
        self.account_id, self.region_name, self.group_name, self.name = account_id, region_name, group_name, name

    @classmethod
    def create(cls, name: str, props: dict[str, Any], account_id: str, region_name: str) -> LifecycleHook:
        backend = autoscaling_backends[account_id][region_name]
        group_name = props["AutoScalingGroupName"]
        if group_name not in backend.autoscaling_groups:
            raise ValueError(f"AutoScalingGroup name not found - {group_name}")
        transition, result = props["LifecycleTransition"], props.get("DefaultResult", "ABANDON")
        timeout = int(props.get("HeartbeatTimeout", 3600))
        valid = transition in LIFECYCLE_TRANSITIONS and result in ("CONTINUE", "ABANDON") and 30 <= timeout <= 7200
        if not valid:
            raise ValueError(
                f"AWS::AutoScaling::LifecycleHook: LifecycleTransition {transition!r}, DefaultResult {result!r}, "
                f"HeartbeatTimeout {timeout} (30 to 7200)"
            )
        hook_name = props.get("LifecycleHookName") or name
        hook = backend.create_lifecycle_hook(hook_name, group_name, transition, timeout, result)
        hook.role_arn = hook.notification_target_arn = None  # type: ignore[assignment]
        hook.global_timeout = min(100 * timeout, 172800)  # AWS's; moto says 48 h for every hook
        hook.notification_metadata = props.get("NotificationMetadata")  # type: ignore[attr-defined]
        return cls(account_id, region_name, group_name, hook_name)

    @classmethod
    def update(
        cls, original: LifecycleHook, new_name: str, props: dict[str, Any], account_id: str, region_name: str
    ) -> LifecycleHook:
        hook_name = props.get("LifecycleHookName") or new_name
        if (props["AutoScalingGroupName"], hook_name) != (original.group_name, original.name):
            original.delete(account_id, region_name)  # a new name or group: a new hook
        return cls.create(new_name, props, account_id, region_name)

    @classmethod
    def remove(cls, name: str, props: dict[str, Any], account_id: str, region_name: str) -> None:
        group_name = props.get("AutoScalingGroupName")
        if not isinstance(group_name, str):  # an unresolved Ref: moto deletes through delete() below
            raise ValueError(f"lifecycle hook {name}: AutoScalingGroupName {group_name!r} is not a name")
        autoscaling_backends[account_id][region_name].delete_lifecycle_hook(group_name, name)

    def delete(self, account_id: str, region_name: str) -> None:
        self.remove(self.name, {"AutoScalingGroupName": self.group_name}, self.account_id, self.region_name)
