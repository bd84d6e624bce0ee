"""TeamBudget: an AWS Budgets budget over the team's tagged resources, and a guard that stops spending at 100 %.

The budget (``spot-training-<team>``, monthly, USD) counts the cost of resources tagged with the team tag (a
cost allocation tag an account admin activates once in the Billing console); it emails the notify list when
actual spend passes the warning share and again at 100 %. AWS Budgets' own actions can only stop EC2 instances
or attach policies, which does not fit an Auto Scaling group (it would replace the instances), so a small
scheduled Lambda function (``budget_guard/handler.py``) reads the budget and, once it is spent, asks each
cluster's job to stop (final checkpoint, nothing lost) and sets the groups to 0.
"""

from __future__ import annotations

from collections.abc import Sequence

from aws_cdk import Duration, RemovalPolicy, Stack
from aws_cdk import aws_budgets as budgets
from aws_cdk import aws_events as events
from aws_cdk import aws_events_targets as targets
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from constructs import Construct

from compliance.checkov import skip_checkov
from compliance.nag import acknowledge_all
from team_config.model import BudgetConfig
from team_config.naming import TEAM_TAG, budget_name
from training_constructs.checkpoint_store import CheckpointStore
from training_constructs.guard_code import GUARD_RUNTIME, guard_code, scheduled_function
from training_constructs.job_spec_parameter import job_parameter_name
from training_constructs.training_cluster import TrainingCluster
from training_constructs.training_logs import LOG_GROUP_KMS_SKIP


class TeamBudget(Construct):
    """Exposes ``budget`` (the CfnBudget), ``guard`` (the function) and ``schedule`` (its rule)."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        team: str,
        config: BudgetConfig,
        clusters: Sequence[TrainingCluster],
        checkpoint_store: CheckpointStore,
        log_retention: logs.RetentionDays,
    ) -> None:
        super().__init__(scope, construct_id)
        self.name = budget_name(team, config.notify, config.warn_at_percent)
        self.budget = self._budget(team, config)
        log_group = logs.LogGroup(self, "GuardLogs", retention=log_retention, removal_policy=RemovalPolicy.DESTROY)
        role = iam.Role(self, "GuardRole", assumed_by=iam.ServicePrincipal("lambda.amazonaws.com"))
        self.guard = self._guard(team, config, clusters, role, log_group)
        skip_checkov(log_group, *LOG_GROUP_KMS_SKIP)
        self.schedule = events.Rule(
            self,
            "Schedule",
            # a stop found overdue only at the next run: run at least every force_stop_after_minutes
            schedule=events.Schedule.rate(
                Duration.minutes(min(config.check_every_minutes, config.force_stop_after_minutes))
            ),
            targets=[targets.LambdaFunction(self.guard, retry_attempts=2)],
        )
        policy = self._guard_policy(role, clusters, checkpoint_store)
        log_group.grant_write(role)
        self.guard.node.add_dependency(policy, role.node.find_child("DefaultPolicy"))

    def _budget(self, team: str, config: BudgetConfig) -> budgets.CfnBudget:
        """The monthly cost budget over the team's tagged resources; with a notify list, emails at the warning share
        and at 100 %. (aws-cdk-lib has no L2 construct for AWS Budgets.)"""
        subscribers = [
            budgets.CfnBudget.SubscriberProperty(subscription_type="EMAIL", address=a) for a in config.notify
        ]
        return budgets.CfnBudget(
            self,
            "Budget",
            budget=budgets.CfnBudget.BudgetDataProperty(
                budget_name=self.name,
                budget_type="COST",
                time_unit="MONTHLY",
                budget_limit=budgets.CfnBudget.SpendProperty(amount=config.usd_per_month, unit="USD"),
                cost_filters={"TagKeyValue": [f"user:{TEAM_TAG}${team}"]},
            ),
            notifications_with_subscribers=[
                budgets.CfnBudget.NotificationWithSubscribersProperty(
                    notification=budgets.CfnBudget.NotificationProperty(
                        notification_type="ACTUAL",
                        comparison_operator="GREATER_THAN",
                        threshold=percent,
                        threshold_type="PERCENTAGE",
                    ),
                    subscribers=subscribers,
                )
                for percent in (config.warn_at_percent, 100)
            ]
            if subscribers
            else None,
        )

    def _guard(
        self,
        team: str,
        config: BudgetConfig,
        clusters: Sequence[TrainingCluster],
        role: iam.Role,
        log_group: logs.ILogGroup,
    ) -> lambda_.Function:
        """The guard function (budget_guard/handler.py), told the budget, the team and its clusters' job specs."""
        return scheduled_function(
            self,
            "Guard",
            code=guard_code(GUARD_RUNTIME),
            role=role,
            log_group=log_group,
            timeout=Duration.minutes(2),
            environment={
                "BUDGET_NAME": self.name,
                "TEAM": team,
                "TEAM_TAG": TEAM_TAG,
                "JOB_SPEC_PARAMETERS": ",".join(job_parameter_name(team, c.name) for c in clusters),
                "FORCE_AFTER_S": str(config.force_stop_after_minutes * 60),
            },
            description=f"Stops team {team}'s training jobs once budget {self.name} is spent",
        )

    def _guard_policy(
        self, role: iam.IRole, clusters: Sequence[TrainingCluster], checkpoint_store: CheckpointStore
    ) -> iam.Policy:
        """Read the budget and the clusters' job parameters, ask their jobs to stop, clear their queues, set their
        groups to 0."""
        bucket = checkpoint_store.bucket
        prefixes = [CheckpointStore.cluster_prefix(c.name) for c in clusters]
        budget_arn = Stack.of(self).format_arn(service="budgets", region="", resource="budget", resource_name=self.name)
        policy = iam.Policy(
            self,
            "GuardPolicy",
            roles=[role],
            statements=[
                iam.PolicyStatement(sid="ReadOwnBudget", actions=["budgets:ViewBudget"], resources=[budget_arn]),
                iam.PolicyStatement(
                    sid="ReadClusterJobParameters",
                    actions=["ssm:GetParameter"],
                    resources=[arn for c in clusters for arn in c.parameter_arns],
                ),
                iam.PolicyStatement(
                    sid="ListJobMarkers",
                    actions=["s3:ListBucket"],
                    resources=[bucket.bucket_arn],
                    conditions={"StringLike": {"s3:prefix": [f"{prefix}*" for prefix in prefixes]}},
                ),
                iam.PolicyStatement(
                    sid="WriteStopRequests",
                    actions=["s3:PutObject"],
                    resources=[bucket.arn_for_objects(CheckpointStore.stop_keys(c.name)) for c in clusters],
                ),
                iam.PolicyStatement(
                    sid="ClearQueues",
                    actions=["s3:DeleteObject"],
                    resources=[bucket.arn_for_objects(CheckpointStore.queue_keys(c.name)) for c in clusters],
                ),
                iam.PolicyStatement(
                    sid="ScaleClusterGroups",
                    actions=["autoscaling:SetDesiredCapacity"],
                    resources=[c.fleet.group_arn for c in clusters],
                ),
                iam.PolicyStatement(
                    sid="FindClusterGroups", actions=["autoscaling:DescribeAutoScalingGroups"], resources=["*"]
                ),
            ],
        )
        acknowledge_all(policy, self._guard_policy_findings(clusters, checkpoint_store))
        return policy

    def _guard_policy_findings(
        self, clusters: Sequence[TrainingCluster], checkpoint_store: CheckpointStore
    ) -> dict[str, str]:
        """cdk-nag's IAM5 findings on the guard's policy, and why each wildcard is there."""
        findings: dict[str, str] = {}
        for cluster in clusters:
            findings.update(cluster.fleet.group_arn_finding())
        findings["AwsSolutions-IAM5[Resource::*]"] = (
            "autoscaling:DescribeAutoScalingGroups supports no resource-level permissions; IAM requires '*'."
        )
        bucket_id = Stack.of(self).get_logical_id(checkpoint_store.bucket.node.default_child)  # type: ignore[arg-type]
        for cluster in clusters:
            stop = CheckpointStore.stop_keys(cluster.name)
            findings[f"AwsSolutions-IAM5[Resource::<{bucket_id}.Arn>/{stop}]"] = (
                "The * is the job id: the guard writes the STOP request of the cluster's current job."
            )
            findings[f"AwsSolutions-IAM5[Resource::<{bucket_id}.Arn>/{CheckpointStore.queue_keys(cluster.name)}]"] = (
                "The * is a queued job's id: over its budget, the guard clears the cluster's queue."
            )
        return findings
