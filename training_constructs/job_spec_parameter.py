"""JobSpecParameter: the SSM parameter holding a cluster's job spec, which the node agent reads at boot."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Optional

from aws_cdk import Aws, Stack
from aws_cdk import aws_logs as logs
from aws_cdk import aws_s3 as s3
from aws_cdk import aws_ssm as ssm
from constructs import Construct

from bootstrap_scripts.spot_training.job_spec import JobSpec, WarmPoolSpec
from team_config.model import ClusterConfig
from team_config.naming import POOL_TAG, parameter_path
from training_constructs.checkpoint_store import CheckpointStore
from training_constructs.warm_volume_pool import WarmVolumePool

# The cluster's parameters under parameter_path: the stack's job spec, and the job trainctl submits.
JOB_SPEC, CURRENT_JOB = "job-spec", "current-job"


def job_parameter_name(team: str, cluster: str, parameter: str = JOB_SPEC) -> str:
    """The name of a cluster's parameter (:data:`JOB_SPEC` or :data:`CURRENT_JOB`)."""
    return f"{parameter_path(team, cluster)}/{parameter}"


def job_parameter_arns(scope: Construct, team: str, cluster: str) -> list[str]:
    """The ARNs of the cluster's two parameters, the job spec's and the current job's."""
    return [
        Stack.of(scope).format_arn(
            service="ssm", resource="parameter", resource_name=job_parameter_name(team, cluster, p)[1:]
        )
        for p in (JOB_SPEC, CURRENT_JOB)
    ]


def cluster_job_spec(
    team: str,
    spec: ClusterConfig,
    *,
    bucket: s3.IBucket,
    log_group: logs.ILogGroup,
    pool: Optional[WarmVolumePool],
    data_buckets: Sequence[str] = (),
) -> JobSpec:
    """The job spec of cluster ``spec``: the team file's job settings, where the cluster's state lives, and the
    buckets its jobs' inputs may come from (the team file's ``data_buckets``)."""
    job = spec.job
    return JobSpec(
        team=team,
        cluster=spec.name,
        region=Aws.REGION,
        bucket=bucket.bucket_name,
        prefix=CheckpointStore.cluster_prefix(spec.name),
        log_group=log_group.log_group_name,
        current_job_parameter=job_parameter_name(team, spec.name, CURRENT_JOB),
        command=job.command,
        python=job.python,
        nproc_per_node=spec.nproc_per_node,
        min_nodes=spec.min_nodes,
        desired_nodes=spec.desired_nodes,
        max_nodes=spec.max_nodes,
        checkpoint_dir=job.checkpoint_dir,
        checkpoint_interval_s=job.checkpoint_interval_s,
        checkpoint_wait_for_upload=job.checkpoint_wait_for_upload,
        mean_time_between_interruptions_s=job.mean_time_between_interruptions_s,
        max_restarts=job.max_restarts,
        interruption_grace_s=job.interruption_grace_s,
        rendezvous_port=job.rendezvous_port,
        # 0: off. The agent reads a missing key as off too, but an explicit 0 keeps the job spec saying so (CDK
        # leaves a null out of the JSON).
        stall_timeout_s=job.stall_timeout_s or 0,
        warm_pool=(
            WarmPoolSpec(
                tag_key=POOL_TAG,
                pool=pool.pool_name,
                device_name=spec.warm_pool.device_name,
                volumes=[v.volume_id for v in pool.volumes],
                min_free_percent=spec.warm_pool.min_free_percent,
            )
            if pool is not None and spec.warm_pool is not None
            else None
        ),
        efa=spec.efa_enabled,
        data_buckets=list(data_buckets),
    )


class JobSpecParameter(ssm.StringParameter):
    """``<parameter_path>/job-spec``: ``job_spec`` (a :class:`JobSpec`) as JSON, deploy-time values resolved by
    CloudFormation; unset values are left out of the JSON."""

    def __init__(self, scope: Construct, construct_id: str, *, job_spec: JobSpec) -> None:
        super().__init__(
            scope,
            construct_id,
            parameter_name=job_parameter_name(job_spec.team, job_spec.cluster),
            description=f"Job-spec defaults of spot training cluster {job_spec.team}/{job_spec.cluster} (read by the "
            "node agent)",
            string_value=Stack.of(scope).to_json_string(job_spec.as_dict()),
        )
        self.job_spec = job_spec
