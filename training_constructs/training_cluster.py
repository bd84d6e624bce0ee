"""TrainingCluster: one spot training cluster, composed from the smaller constructs."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Optional

from aws_cdk import RemovalPolicy, Tags
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_logs as logs
from constructs import Construct

from team_config.model import ClusterConfig
from team_config.naming import CLUSTER_TAG, TEAM_TAG
from training_constructs.checkpoint_store import CheckpointStore
from training_constructs.job_spec_parameter import (
    JobSpecParameter,
    cluster_job_spec,
    job_parameter_arns,
    job_parameter_name,
)
from training_constructs.node_bootstrap import NodeBootstrap
from training_constructs.node_image import node_image
from training_constructs.node_permissions import JobInputsPolicy, NodeBootPolicy, PeerDiscoveryPolicy
from training_constructs.spot_fleet import SpotFleet
from training_constructs.training_logs import TrainingLogs
from training_constructs.warm_volume_pool import WarmVolumePool

if TYPE_CHECKING:
    from training_constructs.capacity_watcher import CapacityWatcher
    from training_constructs.interruption_drill import InterruptionDrill


class TrainingCluster(Construct):
    """Spot fleet, logs, job spec, optional warm volume pool and least-privilege grants for one cluster.

    Exposes ``bucket``, ``asg``, ``role``, ``log_group``, ``placement_group``, ``job_spec``,
    ``warm_pool``, ``drill``, ``capacity_watcher``. Every grant is scoped to this cluster: its bucket prefix, its log
    group, its group, its job-spec parameters, its pool's volumes; and to its team: the team's job secrets and data
    buckets.
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        team: str,
        spec: ClusterConfig,
        vpc: ec2.IVpc,
        vpc_subnets: ec2.SubnetSelection,
        checkpoint_store: CheckpointStore,
        log_retention: logs.RetentionDays,
        data_buckets: Sequence[str] = (),
    ) -> None:
        super().__init__(scope, construct_id)
        Tags.of(self).add(CLUSTER_TAG, spec.name)
        self.name = spec.name
        self.bucket = checkpoint_store.bucket
        self.logs = TrainingLogs(self, "Logs", retention=log_retention)
        self.log_group = self.logs.log_group
        self.warm_pool = self._warm_pool(team, spec, vpc, vpc_subnets)
        job_spec = cluster_job_spec(
            team, spec, bucket=self.bucket, log_group=self.log_group, pool=self.warm_pool, data_buckets=data_buckets
        )
        self.job_spec = JobSpecParameter(self, "JobSpec", job_spec=job_spec)
        bootstrap = NodeBootstrap(
            self,
            "BootstrapScripts",
            team=team,
            cluster=spec.name,
            job_spec_parameter=job_parameter_name(team, spec.name),
        )
        self.fleet = SpotFleet(
            self,
            "Fleet",
            vpc=vpc,
            vpc_subnets=vpc_subnets,
            instance_types=spec.instance_types,
            machine_image=node_image(spec),
            user_data=bootstrap.user_data,
            max_nodes=spec.max_nodes,
            on_demand_base_capacity=spec.on_demand_base_capacity,
            on_demand_percentage_above_base=spec.on_demand_percentage_above_base,
            spot_allocation_strategy=spec.spot_allocation_strategy,
            placement_group=spec.placement_group,
            root_volume_size_gib=spec.root_volume_size_gib,
            root_device_name=spec.ami.root_device_name,
            efa_interfaces=spec.efa_interfaces,
        )
        self.asg = self.fleet.asg
        self.role = self.fleet.role
        self.placement_group = self.fleet.placement_group
        if self.warm_pool is not None:
            # CloudFormation deletes the group (terminating its instances) before the pool's volumes: a volume still
            # attached to a running node cannot be deleted (VolumeInUse), and the stack would end DELETE_FAILED.
            for volume in self.warm_pool.volumes:
                self.asg.node.add_dependency(volume)
        self.parameter_arns = job_parameter_arns(self, team, spec.name)
        self._grant_node(team, bootstrap, checkpoint_store, data_buckets)
        self.drill = self._drill(team, spec)
        self.capacity_watcher = self._capacity_watcher(spec, log_retention)

    def _warm_pool(
        self, team: str, spec: ClusterConfig, vpc: ec2.IVpc, vpc_subnets: ec2.SubnetSelection
    ) -> Optional[WarmVolumePool]:
        """The cluster's warm volume pool, in the first AZ of its subnets; None without ``warm_pool``."""
        pool = spec.warm_pool
        if pool is None:
            return None
        assert pool.snapshot_id is not None  # enforced by the config model
        return WarmVolumePool(
            self,
            "WarmPool",
            pool_name=f"{team}-{spec.name}",
            size=pool.size,
            snapshot_id=pool.snapshot_id,
            availability_zone=vpc.select_subnets(
                subnet_type=vpc_subnets.subnet_type, subnets=vpc_subnets.subnets
            ).availability_zones[0],
            volume_size_gib=pool.volume_size_gib,
            iops=pool.iops,
            throughput_mibps=pool.throughput_mibps,
            initialization_rate_mibps=pool.initialization_rate_mibps,
            removal_policy=RemovalPolicy.RETAIN if pool.removal_policy == "retain" else RemovalPolicy.DESTROY,
        )

    def _grant_node(
        self, team: str, bootstrap: NodeBootstrap, checkpoint_store: CheckpointStore, data_buckets: Sequence[str]
    ) -> None:
        """Least privilege for the node role, each grant scoped to this cluster (its team's, for a job's secrets and
        data buckets)."""
        NodeBootPolicy(self, "NodePolicy", role=self.role, bootstrap=bootstrap, parameter_arns=self.parameter_arns)
        JobInputsPolicy(self, "JobInputsPolicy", role=self.role, team=team, data_buckets=data_buckets)
        PeerDiscoveryPolicy(self, "DescribePolicy", role=self.role)
        checkpoint_store.cluster_access_policy(self, "CheckpointAccess", self.role, self.name)
        self.fleet.scale_policy("ScalePolicy", self.role)
        self.logs.grant_write(self.role)
        if self.warm_pool is not None:
            self.warm_pool.claim_policy(
                "ClaimPolicy", self.role, cluster_tag_key=CLUSTER_TAG, cluster=self.name, team_tag=(TEAM_TAG, team)
            )

    def _capacity_watcher(self, spec: ClusterConfig, log_retention: logs.RetentionDays) -> Optional[CapacityWatcher]:
        """The function that falls back to on-demand when spot capacity does not come; None without ``capacity``."""
        if spec.capacity is None:
            return None
        # Imported here: aws_lambda costs every synth an import only clusters with a fallback need.
        from training_constructs.capacity_watcher import CapacityWatcher

        return CapacityWatcher(
            self,
            "CapacityWatcher",
            cluster=spec.name,
            config=spec.capacity,
            fleet=self.fleet,
            spot_percentage=spec.on_demand_percentage_above_base,
            bucket=self.bucket,
            log_retention=log_retention,
        )

    def _drill(self, team: str, spec: ClusterConfig) -> Optional[InterruptionDrill]:
        """The cluster's interruption drill (an AWS FIS experiment template); None without ``interruption_drill``."""
        if spec.interruption_drill is None:
            return None
        # Imported here: aws_fis and aws_cloudwatch cost every synth an import only teams with a drill need.
        from training_constructs.interruption_drill import InterruptionDrill

        return InterruptionDrill(
            self,
            "InterruptionDrill",
            team_tag=(TEAM_TAG, team),
            cluster_tag=(CLUSTER_TAG, spec.name),
            group=self.asg,
            percent=spec.interruption_drill.percent,
            notice_minutes=spec.interruption_drill.notice_minutes,
        )
