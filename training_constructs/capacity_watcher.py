"""CapacityWatcher: a scheduled function that moves one cluster's group to on-demand when spot capacity does not come,
and back to spot once the group stands at 0 (``capacity_watcher/handler.py``, docs/concepts/capacity.md).

No node runs while spot capacity is missing, so no node agent can act: the watcher is an AWS-native function, like
the budget guard. EventBridge runs it every ``check_every_minutes`` and when the group reports a failed launch. Its
role may read the group and its scaling activities, update this group only (its InstancesDistribution: an update that
names no launch template needs no ec2:RunInstances or iam:PassRole), and read and write the one record object
``<cluster>/capacity.json``.
"""

from __future__ import annotations

from aws_cdk import Duration, RemovalPolicy
from aws_cdk import aws_events as events
from aws_cdk import aws_events_targets as targets
from aws_cdk import aws_iam as iam
from aws_cdk import aws_logs as logs
from aws_cdk import aws_s3 as s3
from constructs import Construct

from bootstrap_scripts.spot_training import protocol
from compliance.checkov import skip_checkov
from compliance.nag import acknowledge_all
from team_config.model import CapacityConfig
from training_constructs.guard_code import GUARD_RUNTIME, scheduled_function, watcher_code
from training_constructs.spot_fleet import SpotFleet
from training_constructs.training_logs import LOG_GROUP_KMS_SKIP


class CapacityWatcher(Construct):
    """Exposes ``function``, ``schedule`` (its rule), ``on_failed_launch`` (the rule on the group's "EC2 Instance
    Launch Unsuccessful" events), ``policy`` and ``record_key``."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        cluster: str,
        config: CapacityConfig,
        fleet: SpotFleet,
        spot_percentage: int,
        bucket: s3.IBucket,
        log_retention: logs.RetentionDays,
    ) -> None:
        super().__init__(scope, construct_id)
        self.record_key = protocol.capacity_key(protocol.cluster_prefix(cluster))
        log_group = logs.LogGroup(self, "Logs", retention=log_retention, removal_policy=RemovalPolicy.DESTROY)
        skip_checkov(log_group, *LOG_GROUP_KMS_SKIP)
        role = iam.Role(self, "Role", assumed_by=iam.ServicePrincipal("lambda.amazonaws.com"))
        self.function = scheduled_function(
            self,
            "Function",
            code=watcher_code(GUARD_RUNTIME),
            role=role,
            log_group=log_group,
            timeout=Duration.minutes(1),
            environment={
                "GROUP_NAME": fleet.asg.auto_scaling_group_name,
                "BUCKET": bucket.bucket_name,
                "RECORD_KEY": self.record_key,
                "ON_DEMAND_AFTER_S": str(round(config.on_demand_after_minutes * 60, 3)),
                "SPOT_PERCENTAGE": str(spot_percentage),
            },
            description=f"Moves cluster {cluster}'s group to on-demand when spot capacity does not come, and back",
        )
        self.schedule = events.Rule(
            self,
            "Schedule",
            schedule=events.Schedule.rate(Duration.minutes(config.check_every_minutes)),
            targets=[targets.LambdaFunction(self.function, retry_attempts=2)],
        )
        # and at once when the group reports a failed launch (EC2 Auto Scaling's event), not only at the next period
        self.on_failed_launch = events.Rule(
            self,
            "LaunchUnsuccessful",
            event_pattern=events.EventPattern(
                source=["aws.autoscaling"],
                detail_type=["EC2 Instance Launch Unsuccessful"],
                detail={"AutoScalingGroupName": [fleet.asg.auto_scaling_group_name]},
            ),
            targets=[targets.LambdaFunction(self.function, retry_attempts=2)],
        )
        self.policy = self._policy(role, fleet, bucket)
        log_group.grant_write(role)
        self.function.node.add_dependency(self.policy, role.node.find_child("DefaultPolicy"))

    def _policy(self, role: iam.IRole, fleet: SpotFleet, bucket: s3.IBucket) -> iam.Policy:
        policy = iam.Policy(
            self,
            "Policy",
            roles=[role],
            statements=[
                iam.PolicyStatement(
                    sid="ReadGroups",
                    actions=["autoscaling:DescribeAutoScalingGroups", "autoscaling:DescribeScalingActivities"],
                    resources=["*"],
                ),
                iam.PolicyStatement(
                    sid="UpdateOwnGroup", actions=["autoscaling:UpdateAutoScalingGroup"], resources=[fleet.group_arn]
                ),
                iam.PolicyStatement(
                    sid="ListRecord",
                    actions=["s3:ListBucket"],
                    resources=[bucket.bucket_arn],
                    conditions={"StringEquals": {"s3:prefix": [self.record_key]}},
                ),
                iam.PolicyStatement(
                    sid="ReadWriteRecord",
                    actions=["s3:GetObject", "s3:PutObject"],
                    resources=[bucket.arn_for_objects(self.record_key)],
                ),
            ],
        )
        findings = dict(fleet.group_arn_finding())
        findings["AwsSolutions-IAM5[Resource::*]"] = (
            "autoscaling:DescribeAutoScalingGroups and DescribeScalingActivities support no resource-level "
            "permissions; IAM requires '*'."
        )
        acknowledge_all(policy, findings)
        return policy
