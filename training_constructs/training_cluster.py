"""TrainingCluster: one spot training cluster, composed from the smaller constructs."""

from __future__ import annotations

from pathlib import Path

from aws_cdk import Aws, RemovalPolicy, Stack, Tags
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_iam as iam
from aws_cdk import aws_logs as logs
from aws_cdk import aws_s3_assets as s3_assets
from aws_cdk import aws_ssm as ssm
from constructs import Construct

from bootstrap_scripts.spot_training.job_spec import DRAIN_HOOK
from compliance.nag import acknowledge
from team_config.model import DEFAULT_AMI_PARAMETER, ClusterConfig
from team_config.naming import CLUSTER_TAG, POOL_TAG, TEAM_TAG, parameter_path
from training_constructs.checkpoint_store import CheckpointStore
from training_constructs.spot_fleet import FixedImage, SpotFleet
from training_constructs.training_logs import TrainingLogs
from training_constructs.warm_volume_pool import WarmVolumePool

BOOTSTRAP_DIR = Path(__file__).resolve().parent.parent / "bootstrap_scripts"
# What a checkout leaves next to the scripts (tool caches, bytecode) is not shipped: it would be hashed on every
# synth, uploaded, downloaded by every node, and change the asset hash (and so the launch template) for nothing.
BOOTSTRAP_EXCLUDE = [".*", "__pycache__", "*.pyc"]
INSTALL_DIR = "/opt/spot-training"


def hand_back_unless(command: str, failure: str, *, region: str, tries: int = 3, pause_s: int = 10) -> list[str]:
    """Shell lines: run ``command`` up to ``tries`` times; if it never succeeds, the instance leaves its group (one
    fewer desired), completes the group's drain hook for itself (or the hook would hold it, billed, for its
    heartbeat) and the user data exits 2. Before the bootstrap scripts are on disk no agent runs to do it, and
    the instance would idle in the group, billed, counted as a peer."""
    imds = "${AWS_EC2_METADATA_SERVICE_ENDPOINT:-http://169.254.169.254}"
    return [
        f"for try in $(seq {tries}); do",
        f"  if {command}; then break; fi",
        f'  if [ "$try" = {tries} ]; then',
        f"    token=$(curl -sf --max-time 5 -X PUT {imds}/latest/api/token "
        "-H 'X-aws-ec2-metadata-token-ttl-seconds: 300') || true",
        f'    id=$(curl -sf --max-time 5 -H "X-aws-ec2-metadata-token: $token" {imds}/latest/meta-data/instance-id) '
        "|| true",
        f'    echo "user-data: error: {failure} ({tries} tries); instance $id leaves its group (one fewer desired)" '
        ">&2",
        f'    aws autoscaling terminate-instance-in-auto-scaling-group --region {region} --instance-id "$id" '
        "--should-decrement-desired-capacity >/dev/null || true",
        f'    group=$(curl -sf --max-time 5 -H "X-aws-ec2-metadata-token: $token" '
        f"{imds}/latest/meta-data/tags/instance/aws:autoscaling:groupName) || true",
        "    for pause in 1 2 3 4; do",  # Terminating:Wait begins a moment after the terminate call
        f'      if aws autoscaling complete-lifecycle-action --region {region} --auto-scaling-group-name "$group" '
        f'--lifecycle-hook-name {DRAIN_HOOK} --instance-id "$id" --lifecycle-action-result CONTINUE >/dev/null 2>&1; '
        "then break; fi",
        '      sleep "$pause"',
        "    done",
        "    exit 2",
        "  fi",
        f"  sleep {pause_s}",
        "done",
    ]


class TrainingCluster(Construct):
    """Spot fleet, logs, job spec, optional warm volume pool and least-privilege grants for one cluster.

    Exposes ``bucket``, ``asg``, ``role``, ``log_group``, ``placement_group``, ``job_spec``,
    ``warm_pool``. Every grant is scoped to this cluster: its bucket prefix, its log group, its
    group, its job-spec parameters, its pool's volumes.
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
    ) -> None:
        super().__init__(scope, construct_id)
        stack = Stack.of(self)
        Tags.of(self).add(CLUSTER_TAG, spec.name)
        self.bucket = checkpoint_store.bucket
        self.logs = TrainingLogs(self, "Logs", retention=log_retention)
        self.log_group = self.logs.log_group

        self.warm_pool = None
        if spec.warm_pool is not None:
            pool = spec.warm_pool
            assert pool.snapshot_id is not None  # enforced by the config model
            self.warm_pool = WarmVolumePool(
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

        job = spec.job
        job_spec = {
            "version": 1,
            "team": team,
            "cluster": spec.name,
            "region": Aws.REGION,
            "bucket": self.bucket.bucket_name,
            "prefix": CheckpointStore.cluster_prefix(spec.name),
            "log_group": self.log_group.log_group_name,
            "current_job_parameter": f"{parameter_path(team, spec.name)}/current-job",
            "command": job.command,
            "python": job.python,
            "nproc_per_node": spec.nproc_per_node,
            "min_nodes": spec.min_nodes,
            "desired_nodes": spec.desired_nodes,
            "max_nodes": spec.max_nodes,
            "checkpoint_dir": job.checkpoint_dir,
            "checkpoint_interval_s": job.checkpoint_interval_s,
            "checkpoint_wait_for_upload": job.checkpoint_wait_for_upload,
            "mean_time_between_interruptions_s": job.mean_time_between_interruptions_s,
            "max_restarts": job.max_restarts,
            "interruption_grace_s": job.interruption_grace_s,
            "rendezvous_port": job.rendezvous_port,
            # 0: off (the default). The agent reads a missing key as off too, but an explicit 0 keeps the job spec
            # saying so (CDK leaves a null out of the JSON).
            "stall_timeout_s": job.stall_timeout_s or 0,
            "warm_pool": (
                {
                    "tag_key": POOL_TAG,
                    "pool": self.warm_pool.pool_name,
                    "device_name": spec.warm_pool.device_name,
                    "volumes": [v.volume_id for v in self.warm_pool.volumes],
                }
                if self.warm_pool is not None and spec.warm_pool is not None
                else None
            ),
        }
        job_spec_name = f"{parameter_path(team, spec.name)}/job-spec"
        self.job_spec = ssm.StringParameter(
            self,
            "JobSpec",
            parameter_name=job_spec_name,
            description=f"Job-spec defaults of spot training cluster {team}/{spec.name} (read by the node agent)",
            string_value=stack.to_json_string(job_spec),
        )

        bootstrap = s3_assets.Asset(self, "BootstrapScripts", path=str(BOOTSTRAP_DIR), exclude=BOOTSTRAP_EXCLUDE)
        user_data = ec2.UserData.for_linux()
        user_data.add_commands("set -euo pipefail", "fetch_bootstrap() {")
        archive = user_data.add_s3_download_command(
            bucket=bootstrap.bucket,
            bucket_key=bootstrap.s3_object_key,
            local_file=f"{INSTALL_DIR}/bootstrap.zip",
            region=Aws.REGION,
        )
        user_data.add_commands(
            f"python3 -m zipfile -e {archive} {INSTALL_DIR}/bootstrap",
            "}",
            *hand_back_unless("fetch_bootstrap", "could not fetch the bootstrap scripts", region=Aws.REGION),
            f"exec bash {INSTALL_DIR}/bootstrap/user_data.sh --region {Aws.REGION} --team {team} "
            f"--cluster {spec.name} --job-spec-parameter {job_spec_name}",
        )

        ami = spec.ami
        machine_image = (
            FixedImage(spec.image_id)
            if spec.image_id
            else ec2.MachineImage.from_ssm_parameter(
                ami.ssm_parameter or DEFAULT_AMI_PARAMETER[spec.architecture], os=ec2.OperatingSystemType.LINUX
            )
        )
        self.fleet = SpotFleet(
            self,
            "Fleet",
            vpc=vpc,
            vpc_subnets=vpc_subnets,
            instance_types=spec.instance_types,
            machine_image=machine_image,
            user_data=user_data,
            max_nodes=spec.max_nodes,
            on_demand_base_capacity=spec.on_demand_base_capacity,
            on_demand_percentage_above_base=spec.on_demand_percentage_above_base,
            spot_allocation_strategy=spec.spot_allocation_strategy,
            placement_group=spec.placement_group,
            root_volume_size_gib=spec.root_volume_size_gib,
            root_device_name=ami.root_device_name,
        )
        self.asg = self.fleet.asg
        self.role = self.fleet.role
        self.placement_group = self.fleet.placement_group
        if self.warm_pool is not None:
            # CloudFormation deletes the group (terminating its instances) before the pool's volumes: a volume still
            # attached to a running node cannot be deleted (VolumeInUse), and the stack would end DELETE_FAILED.
            for volume in self.warm_pool.volumes:
                self.asg.node.add_dependency(volume)

        # Least privilege, each grant scoped to this cluster.
        self.name = spec.name
        self.parameter_arns = params = [
            stack.format_arn(
                service="ssm", resource="parameter", resource_name=f"{parameter_path(team, spec.name)[1:]}/{p}"
            )
            for p in ("job-spec", "current-job")
        ]
        iam.Policy(
            self,
            "NodePolicy",
            roles=[self.role],
            statements=[
                iam.PolicyStatement(
                    sid="ReadBootstrapScripts",
                    actions=["s3:GetObject"],
                    resources=[bootstrap.bucket.arn_for_objects(bootstrap.s3_object_key)],
                ),
                iam.PolicyStatement(sid="ReadOwnJobParameters", actions=["ssm:GetParameter"], resources=params),
            ],
        )
        describe = iam.Policy(
            self,
            "DescribePolicy",
            roles=[self.role],
            statements=[
                iam.PolicyStatement(
                    sid="DescribeForPeerDiscovery",
                    actions=[
                        "autoscaling:DescribeAutoScalingGroups",
                        "autoscaling:DescribeAutoScalingInstances",
                        "ec2:DescribeInstances",
                    ],
                    resources=["*"],
                )
            ],
        )
        acknowledge(
            describe,
            "AwsSolutions-IAM5[Resource::*]",
            "Read-only Describe* calls for peer discovery; these actions support no resource-level permissions, so "
            "IAM requires Resource '*'.",
        )
        checkpoint_store.cluster_access_policy(self, "CheckpointAccess", self.role, spec.name)
        self.fleet.scale_policy("ScalePolicy", self.role)
        self.logs.grant_write(self.role)
        if self.warm_pool is not None:
            self.warm_pool.claim_policy(
                "ClaimPolicy", self.role, cluster_tag_key=CLUSTER_TAG, cluster=spec.name, team_tag=(TEAM_TAG, team)
            )
        self.drill = None
        if spec.interruption_drill is not None:
            # Imported here: aws_fis and aws_cloudwatch cost every synth an import only teams with a drill need.
            from training_constructs.interruption_drill import InterruptionDrill

            self.drill = InterruptionDrill(
                self,
                "InterruptionDrill",
                team_tag=(TEAM_TAG, team),
                cluster_tag=(CLUSTER_TAG, spec.name),
                group=self.asg,
                percent=spec.interruption_drill.percent,
                notice_minutes=spec.interruption_drill.notice_minutes,
            )
