"""InterruptionDrill: an AWS Fault Injection Service experiment template that sends real spot interruption notices
to a cluster's running spot instances, for a drill on a real account (docs/how-to/drills.md)."""

from __future__ import annotations

from aws_cdk import Duration, Stack
from aws_cdk import aws_autoscaling as autoscaling
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_fis as fis
from aws_cdk import aws_iam as iam
from constructs import Construct

from compliance.nag import acknowledge_all

ACTION = "aws:ec2:send-spot-instance-interruptions"


class InterruptionDrill(Construct):
    """``percent`` % of the cluster's running spot instances (selected by the team and cluster tags) get a notice
    ``notice_minutes`` before EC2 interrupts them. Stops by itself when the group has had no InService instance
    for 5 minutes (the cluster did not recover). Exposes ``template`` and ``stop_alarm``."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        team_tag: tuple[str, str],
        cluster_tag: tuple[str, str],
        group: autoscaling.AutoScalingGroup,
        percent: int,
        notice_minutes: int,
    ) -> None:
        super().__init__(scope, construct_id)
        role = self._role(team_tag, cluster_tag)
        self.stop_alarm = self._stop_alarm(group, cluster_tag[1])
        self.template = fis.CfnExperimentTemplate(
            self,
            "Template",
            description=f"Spot interruption drill: {percent}% of cluster {cluster_tag[1]}, {notice_minutes} min notice",
            role_arn=role.role_arn,
            stop_conditions=[
                fis.CfnExperimentTemplate.ExperimentTemplateStopConditionProperty(
                    source="aws:cloudwatch:alarm", value=self.stop_alarm.alarm_arn
                )
            ],
            targets={
                "ClusterSpotInstances": fis.CfnExperimentTemplate.ExperimentTemplateTargetProperty(
                    resource_type="aws:ec2:spot-instance",
                    selection_mode=f"PERCENT({percent})",
                    resource_tags=dict([team_tag, cluster_tag]),
                    filters=[
                        fis.CfnExperimentTemplate.ExperimentTemplateTargetFilterProperty(
                            path="State.Name", values=["running"]
                        )
                    ],
                )
            },
            actions={
                "SendInterruptionNotices": fis.CfnExperimentTemplate.ExperimentTemplateActionProperty(
                    action_id=ACTION,
                    parameters={"durationBeforeInterruption": f"PT{notice_minutes}M"},
                    targets={"SpotInstances": "ClusterSpotInstances"},
                )
            },
            tags={"Name": f"{team_tag[1]}-{cluster_tag[1]}-interruption-drill"},
        )

    def _role(self, team_tag: tuple[str, str], cluster_tag: tuple[str, str]) -> iam.Role:
        """FIS's role: send interruption notices to this team's and cluster's instances only."""
        role = iam.Role(
            self,
            "Role",
            assumed_by=iam.ServicePrincipal("fis.amazonaws.com"),
            description=f"FIS interruption drill of cluster {cluster_tag[1]}",
        )
        instances = Stack.of(self).format_arn(service="ec2", resource="instance", resource_name="*")
        policy = iam.Policy(
            self,
            "Policy",
            roles=[role],
            statements=[
                iam.PolicyStatement(
                    sid="InterruptThisClusterOnly",
                    actions=["ec2:SendSpotInstanceInterruptions"],
                    resources=[instances],
                    conditions={"StringEquals": {f"aws:ResourceTag/{k}": v for k, v in (team_tag, cluster_tag)}},
                ),
                iam.PolicyStatement(sid="FindTargets", actions=["ec2:DescribeInstances"], resources=["*"]),
            ],
        )
        acknowledge_all(
            policy,
            {
                "AwsSolutions-IAM5[Resource::arn:<AWS::Partition>:ec2:<AWS::Region>:<AWS::AccountId>:instance/*]": (
                    "Spot instance ids are only known at launch; the statement is limited to instances tagged with "
                    "this team and cluster."
                ),
                "AwsSolutions-IAM5[Resource::*]": (
                    "FIS resolves its targets with ec2:DescribeInstances, which has no resource-level permissions."
                ),
            },
        )
        return role

    def _stop_alarm(self, group: autoscaling.AutoScalingGroup, cluster: str) -> cloudwatch.Alarm:
        """In alarm once the group has had no InService instance for 5 minutes: the drill's stop condition."""
        return cloudwatch.Alarm(
            self,
            "StopAlarm",
            alarm_description=f"Stops the interruption drill of cluster {cluster}: no InService instance for 5 minutes",
            metric=cloudwatch.Metric(
                namespace="AWS/AutoScaling",
                metric_name="GroupInServiceInstances",
                dimensions_map={"AutoScalingGroupName": group.auto_scaling_group_name},
                statistic="Minimum",
                period=Duration.minutes(1),
            ),
            comparison_operator=cloudwatch.ComparisonOperator.LESS_THAN_THRESHOLD,
            threshold=1,
            evaluation_periods=5,
            treat_missing_data=cloudwatch.TreatMissingData.NOT_BREACHING,
        )
