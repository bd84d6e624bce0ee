"""TrainingStack: one team's network, checkpoint bucket and training clusters."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from aws_cdk import CfnOutput, RemovalPolicy, Stack, Tags
from aws_cdk import aws_logs as logs
from constructs import Construct

from team_config import TeamConfig
from team_config.model import LOG_RETENTION_DAYS, BudgetConfig, ClusterConfig, NetworkConfig, NewVpcConfig
from team_config.naming import TEAM_TAG
from training_constructs import CheckpointStore, ClusterNetwork, TrainingCluster

if TYPE_CHECKING:
    from training_constructs.team_budget import TeamBudget

# CloudWatch's allowed retention values, in the order aws_logs.RetentionDays lists them (INFINITE last).
RETENTION = dict(zip(LOG_RETENTION_DAYS, list(logs.RetentionDays)[: len(LOG_RETENTION_DAYS)], strict=True))


class TrainingStack(Stack):
    """Everything one team needs; clusters come from the team file, one ``TrainingCluster`` each."""

    def __init__(self, scope: Construct, construct_id: str, *, team: str, config: TeamConfig, **kwargs: Any) -> None:
        super().__init__(scope, construct_id, description=f"Spot training clusters of team {team}", **kwargs)
        Tags.of(self).add(TEAM_TAG, team)
        retention = RETENTION[config.log_retention_days]
        self.data_buckets = config.data_buckets
        self.network = self._network(config.network, retention)
        bucket_cfg = config.checkpoint_bucket
        self.checkpoints = CheckpointStore(
            self,
            "Checkpoints",
            noncurrent_version_expiration_days=bucket_cfg.noncurrent_version_expiration_days,
            access_log_expiration_days=bucket_cfg.access_log_expiration_days,
            removal_policy=RemovalPolicy.RETAIN if bucket_cfg.removal_policy == "retain" else RemovalPolicy.DESTROY,
        )
        CfnOutput(
            self,
            "CheckpointBucketName",
            value=self.checkpoints.bucket.bucket_name,
            description="S3 bucket holding code and checkpoints (one prefix per cluster)",
        )
        self.clusters: dict[str, TrainingCluster] = {
            spec.name: self._cluster(team, spec, retention) for spec in config.clusters
        }
        self.budget = self._budget(team, config.budget, retention) if config.budget is not None else None

    def _network(self, net: NetworkConfig, retention: logs.RetentionDays) -> ClusterNetwork:
        """The team's VPC: the existing one the team file names, else a new one."""
        existing = net.existing_vpc
        if existing is not None:
            return ClusterNetwork(
                self,
                "Network",
                existing_vpc_id=existing.vpc_id,
                existing_subnet_ids=[s.subnet_id for s in existing.subnets],
                existing_availability_zones=[s.availability_zone for s in existing.subnets],
                existing_route_table_ids=[s.route_table_id for s in existing.subnets if s.route_table_id],
                create_s3_endpoint=existing.create_s3_endpoint,
            )
        new = net.new_vpc or NewVpcConfig()
        return ClusterNetwork(
            self,
            "Network",
            cidr=new.cidr,
            az_count=new.az_count,
            availability_zones=new.availability_zones or (),
            nat_gateways=new.nat_gateways,
            flow_log_retention=retention,
        )

    def _cluster(self, team: str, spec: ClusterConfig, retention: logs.RetentionDays) -> TrainingCluster:
        """One cluster, and the outputs naming its group, log group, drill and job-spec parameter."""
        cluster = TrainingCluster(
            self,
            f"Cluster-{spec.name}",
            team=team,
            spec=spec,
            vpc=self.network.vpc,
            vpc_subnets=self.network.training_subnets,
            checkpoint_store=self.checkpoints,
            log_retention=retention,
            data_buckets=self.data_buckets,
        )
        outputs = {
            "GroupName": (cluster.asg.auto_scaling_group_name, f"Auto Scaling group of cluster {spec.name}"),
            "LogGroupName": (cluster.log_group.log_group_name, f"Log group of cluster {spec.name}"),
        }
        if cluster.drill is not None:
            outputs["InterruptionDrill"] = (
                cluster.drill.template.attr_id,
                f"FIS experiment template id of cluster {spec.name}'s interruption drill",
            )
        outputs["JobSpecParameter"] = (
            cluster.job_spec.parameter_name,
            f"SSM parameter with the job-spec defaults of cluster {spec.name}",
        )
        for name, (value, description) in outputs.items():
            CfnOutput(self, f"{name}-{spec.name}", value=value, description=description)
        return cluster

    def _budget(self, team: str, config: BudgetConfig, retention: logs.RetentionDays) -> TeamBudget:
        """The team's budget and its guard, over every cluster, and the output naming the budget."""
        # Imported here: aws_budgets and aws_lambda cost every synth an import only teams with a budget need
        # (aws_events comes with aws_s3 anyway).
        from training_constructs.team_budget import TeamBudget

        budget = TeamBudget(
            self,
            "Budget",
            team=team,
            config=config,
            clusters=list(self.clusters.values()),
            checkpoint_store=self.checkpoints,
            log_retention=retention,
        )
        CfnOutput(self, "BudgetName", value=budget.name, description="AWS Budgets budget of the team")
        return budget
