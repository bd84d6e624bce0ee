"""SpotFleet: launch template + spot Auto Scaling group (+ cluster placement group, instance role)."""

from __future__ import annotations

import typing
from collections.abc import Mapping, Sequence
from typing import Optional

from aws_cdk import ArnFormat, CfnElement, Duration, Stack
from aws_cdk import aws_autoscaling as autoscaling
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_iam as iam
from constructs import Construct

from bootstrap_scripts.spot_training.job_spec import DRAIN_HEARTBEAT_S, DRAIN_HOOK
from compliance.checkov import skip_checkov
from compliance.nag import acknowledge, acknowledge_all
from training_constructs.efa import add_efa_interfaces

ALLOCATION_STRATEGIES = {
    "price-capacity-optimized": autoscaling.SpotAllocationStrategy.PRICE_CAPACITY_OPTIMIZED,
    "capacity-optimized": autoscaling.SpotAllocationStrategy.CAPACITY_OPTIMIZED,
}


# What the SSM agent on a node needs for Session Manager: AWS's minimal instance policy for it
# (AWSCloud9SSMInstanceProfile, https://docs.aws.amazon.com/aws-managed-policy/latest/reference/AWSCloud9SSMInstanceProfile.html).
SESSION_MANAGER_ACTIONS = [
    "ssm:UpdateInstanceInformation",
    "ssmmessages:CreateControlChannel",
    "ssmmessages:CreateDataChannel",
    "ssmmessages:OpenControlChannel",
    "ssmmessages:OpenDataChannel",
]


class NodeRole(iam.Role):
    """The nodes' instance role, with what Session Manager's agent needs in its default policy.

    Session Manager (the only way into a node: no SSH) needs only the agent's channels. Not the managed
    AmazonSSMManagedInstanceCore: it also grants ssm:GetParameter(s) on "*", which would let a node (running a
    team's code) read every parameter in the account, other teams' included.
    """

    def __init__(self, scope: Construct, construct_id: str, *, description: str) -> None:
        super().__init__(
            scope, construct_id, assumed_by=iam.ServicePrincipal("ec2.amazonaws.com"), description=description
        )
        # In the role's default policy (not inline on the role: moto's IAM enforcement cannot read those).
        self.add_to_principal_policy(
            iam.PolicyStatement(sid="SessionManagerChannels", actions=SESSION_MANAGER_ACTIONS, resources=["*"])
        )
        acknowledge(
            self,
            "AwsSolutions-IAM5[Resource::*]",
            "Session Manager's agent registers the node and opens its session channels; AWS's own minimal "
            "policy for that (AWSCloud9SSMInstanceProfile) grants these actions on '*'. They read no data.",
        )
        skip_checkov(
            self.node.find_child("DefaultPolicy"),
            "CKV_AWS_111",
            "Session Manager's channel actions (SESSION_MANAGER_ACTIONS) are authorized on '*' only; they open "
            "the node's session channels to SSM and read or change no data.",
        )


class NodeSecurityGroup(ec2.SecurityGroup):
    """Nodes talk to each other on any port (NCCL/gloo, c10d rendezvous); nothing else gets in."""

    def __init__(self, scope: Construct, construct_id: str, *, vpc: ec2.IVpc) -> None:
        super().__init__(
            scope,
            construct_id,
            vpc=vpc,
            allow_all_outbound=True,
            description="Training nodes: all traffic between nodes of this cluster, no other ingress",
        )
        self.add_ingress_rule(self, ec2.Port.all_traffic(), "Node-to-node traffic within the cluster")
        # EFA needs all traffic to the group itself allowed out as well as in: the allow-all egress holds the
        # outbound half (tests/test_efa.py fails if egress is narrowed without a rule to the group itself).


class SpotFleet(Construct):
    """Spot capacity for one training cluster.

    Launch template: IMDSv2 required, instance metadata tags on (the boot script reads team and
    cluster from them), encrypted gp3 root volume, detailed monitoring, the given user data and
    instance profile. Group: MixedInstancesPolicy over ``instance_types`` with on-demand base
    and percentage (0 by default, all spot) and a capacity-aware spot strategy, capacity
    rebalance on, min 0 so it can scale to zero, desired capacity left to the jobs. A terminating lifecycle hook
    (``DRAIN_HOOK``): an instance the group ends itself (capacity rebalancing replacing it, a scale-in) gets no
    spot notice, so it waits in ``Terminating:Wait`` until its node agent has saved a checkpoint and completes the
    hook (at most ``DRAIN_HEARTBEAT_S``, then the termination goes on). ``efa_interfaces`` (instance type -> count):
    EFA interfaces in the launch template (:mod:`training_constructs.efa`), one template per count.
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        vpc: ec2.IVpc,
        vpc_subnets: ec2.SubnetSelection,
        instance_types: Sequence[str],
        machine_image: ec2.IMachineImage,
        user_data: ec2.UserData,
        max_nodes: int,
        on_demand_base_capacity: int = 0,
        on_demand_percentage_above_base: int = 0,
        spot_allocation_strategy: str = "price-capacity-optimized",
        placement_group: bool = True,
        root_volume_size_gib: int = 200,
        root_device_name: str = "/dev/xvda",
        role: Optional[iam.IRole] = None,
        efa_interfaces: Optional[Mapping[str, int]] = None,
    ) -> None:
        super().__init__(scope, construct_id)
        if not instance_types:
            raise ValueError("SpotFleet: instance_types needs at least one instance type")
        if spot_allocation_strategy not in ALLOCATION_STRATEGIES:
            raise ValueError(f"SpotFleet: spot_allocation_strategy must be one of {sorted(ALLOCATION_STRATEGIES)}")
        self.role: iam.IRole = role or NodeRole(
            self,
            "InstanceRole",
            description=f"Spot training node role for {Stack.of(self).stack_name}/{construct_id}",
        )
        self.instance_profile = iam.InstanceProfile(self, "InstanceProfile", role=self.role)
        self.security_group = NodeSecurityGroup(self, "NodeSecurityGroup", vpc=vpc)
        self.placement_group: Optional[ec2.PlacementGroup] = (
            ec2.PlacementGroup(self, "PlacementGroup", strategy=ec2.PlacementGroupStrategy.CLUSTER)
            if placement_group
            else None
        )
        overrides = self._launch_templates(
            instance_types,
            dict(efa_interfaces or {}),
            machine_image,
            user_data,
            root_device_name=root_device_name,
            root_volume_size_gib=root_volume_size_gib,
        )
        self.asg = self._group(
            vpc,
            vpc_subnets,
            overrides,
            max_nodes,
            autoscaling.InstancesDistribution(
                on_demand_base_capacity=on_demand_base_capacity,
                on_demand_percentage_above_base_capacity=on_demand_percentage_above_base,
                spot_allocation_strategy=ALLOCATION_STRATEGIES[spot_allocation_strategy],
            ),
        )

    def _launch_templates(
        self,
        instance_types: Sequence[str],
        efa_interfaces: Mapping[str, int],
        machine_image: ec2.IMachineImage,
        user_data: ec2.UserData,
        *,
        root_device_name: str,
        root_volume_size_gib: int,
    ) -> list[autoscaling.LaunchTemplateOverrides]:
        """A launch template per EFA interface count of the types (``self.launch_template`` the first type's) and
        the group's override for each type, naming its template where it is not the first."""
        templates: dict[int, ec2.LaunchTemplate] = {}
        for count in dict.fromkeys(efa_interfaces.get(t, 0) for t in instance_types):  # the first type's first
            templates[count] = self._launch_template(
                f"LaunchTemplateEfa{count}" if templates else "LaunchTemplate",
                machine_image,
                user_data,
                root_device_name=root_device_name,
                root_volume_size_gib=root_volume_size_gib,
            )
            if count:
                add_efa_interfaces(templates[count], count, self.security_group)
        self.launch_template = next(iter(templates.values()))
        self.launch_templates = list(templates.values())
        overrides = []
        for name in instance_types:
            template = templates[efa_interfaces.get(name, 0)]
            overrides.append(
                autoscaling.LaunchTemplateOverrides(
                    instance_type=ec2.InstanceType(name),
                    launch_template=None if template is self.launch_template else template,
                )
            )
        return overrides

    def _launch_template(
        self,
        construct_id: str,
        machine_image: ec2.IMachineImage,
        user_data: ec2.UserData,
        *,
        root_device_name: str,
        root_volume_size_gib: int,
    ) -> ec2.LaunchTemplate:
        """IMDSv2 only, instance metadata tags on, an encrypted gp3 root volume, detailed monitoring."""
        return ec2.LaunchTemplate(
            self,
            construct_id,
            machine_image=machine_image,
            user_data=user_data,
            instance_profile=self.instance_profile,
            security_group=self.security_group,
            require_imdsv2=True,
            http_tokens=ec2.LaunchTemplateHttpTokens.REQUIRED,
            http_put_response_hop_limit=2,
            instance_metadata_tags=True,
            detailed_monitoring=True,
            placement_group=self.placement_group,
            block_devices=[
                ec2.BlockDevice(
                    device_name=root_device_name,
                    volume=ec2.BlockDeviceVolume.ebs(
                        root_volume_size_gib,
                        encrypted=True,
                        volume_type=ec2.EbsDeviceVolumeType.GP3,
                        delete_on_termination=True,
                    ),
                )
            ],
        )

    def _group(
        self,
        vpc: ec2.IVpc,
        vpc_subnets: ec2.SubnetSelection,
        overrides: list[autoscaling.LaunchTemplateOverrides],
        max_nodes: int,
        distribution: autoscaling.InstancesDistribution,
    ) -> autoscaling.AutoScalingGroup:
        """The mixed-instances group over the instance types of ``overrides`` (each with the launch template of its
        EFA interface count where that differs from the first type's), from 0 to ``max_nodes``, with its drain
        hook."""
        group = autoscaling.AutoScalingGroup(
            self,
            "Group",
            vpc=vpc,
            vpc_subnets=vpc_subnets,
            min_capacity=0,
            max_capacity=max_nodes,
            capacity_rebalance=True,
            group_metrics=[autoscaling.GroupMetrics.all()],
            mixed_instances_policy=autoscaling.MixedInstancesPolicy(
                launch_template=self.launch_template,
                launch_template_overrides=overrides,
                instances_distribution=distribution,
            ),
        )
        # No notification target: the agent reads autoscaling/target-lifecycle-state from the instance metadata.
        group.add_lifecycle_hook(
            "Drain",
            lifecycle_hook_name=DRAIN_HOOK,
            lifecycle_transition=autoscaling.LifecycleTransition.INSTANCE_TERMINATING,
            heartbeat_timeout=Duration.seconds(DRAIN_HEARTBEAT_S),
            default_result=autoscaling.DefaultResult.CONTINUE,
        )
        acknowledge_all(
            group,
            {
                "AwsSolutions-EC26": (
                    "The rule cannot read a mixed-instances launch template and errors out; the launch template "
                    "sets Encrypted: true on the root volume (asserted in tests/test_constructs.py)."
                ),
                "AwsSolutions-AS3": (
                    "Spot churn is expected; scaling activity is in the group's activity history and EventBridge, "
                    "and job state (DONE/FAILED) in the bucket and log group."
                ),
            },
        )
        return group

    def scale_policy(self, construct_id: str, role: iam.IRole) -> iam.Policy:
        """Let ``role`` change this group's desired capacity (scale to zero when a job ends), hand an instance back
        and complete (or extend, under an upload) the drain hook for it, nothing else.

        A separate policy, not the role's default one: the launch template waits for the default
        policy, and this policy names the group, which needs the launch template first.
        """
        policy = iam.Policy(
            self,
            construct_id,
            roles=[role],
            statements=[
                iam.PolicyStatement(
                    sid="ScaleOwnGroup",
                    actions=[
                        "autoscaling:SetDesiredCapacity",
                        "autoscaling:TerminateInstanceInAutoScalingGroup",
                        "autoscaling:CompleteLifecycleAction",
                        "autoscaling:RecordLifecycleActionHeartbeat",
                    ],
                    resources=[self.group_arn],
                )
            ],
        )
        acknowledge_all(policy, self.group_arn_finding())
        return policy

    @property
    def group_arn(self) -> str:
        """The group's ARN with a wildcard for its UUID (unknown until the group exists)."""
        return Stack.of(self).format_arn(
            service="autoscaling",
            resource="autoScalingGroup",
            resource_name=f"*:autoScalingGroupName/{self.asg.auto_scaling_group_name}",
            arn_format=ArnFormat.COLON_RESOURCE_NAME,
        )

    def group_arn_finding(self) -> dict[str, str]:
        """cdk-nag's IAM5 on :attr:`group_arn` in a policy, and why: the wildcard is the UUID, the ARN names one
        group (for :func:`compliance.nag.acknowledge_all`)."""
        asg_id = Stack.of(self).get_logical_id(typing.cast(CfnElement, self.asg.node.default_child))
        return {
            "AwsSolutions-IAM5[Resource::arn:<AWS::Partition>:autoscaling:<AWS::Region>:<AWS::AccountId>:"
            f"autoScalingGroup:*:autoScalingGroupName/<{asg_id}>]": (
                "The wildcard is the group's UUID, unknown until it exists; the ARN names this one group."
            )
        }
