"""WarmVolumePool: EBS volumes created ahead of time from a snapshot, claimed by nodes at boot."""

from __future__ import annotations

from typing import Optional

from aws_cdk import RemovalPolicy, Size, Stack, Tags, Token
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_iam as iam
from constructs import Construct

from compliance.nag import acknowledge, acknowledge_all
from team_config.naming import POOL_TAG

# A pool of this size has no size in its volumes' logical ids, so a deployed pool of it keeps its volumes whatever
# team_config's default (also 200) becomes; another size is part of the id.
DEFAULT_VOLUME_GIB = 200


class WarmVolumePool(Construct):
    """``size`` gp3 volumes from ``snapshot_id`` in each of ``availability_zones``, tagged as one pool (a node claims a
    free one in its own zone).

    A replacement spot node attaches a volume that is already initialised instead of paying the
    snapshot's lazy loading on first read. ``initialization_rate_mibps`` (100-300) makes EBS
    initialise each volume at that rate when it is created. Only instances of this cluster may
    attach or detach the pool's volumes (see ``claim_policy``).

    CloudFormation cannot update a volume's snapshot, AZ or initialization rate (the update fails), EBS cannot
    shrink a volume, and a volume grown in place gives a node nothing (the copy's filesystem keeps the snapshot's
    size), so the volumes sit under a scope named after these and the size (when not the default, so that a
    deployed pool of the default size keeps its logical ids): a change creates new volumes with new logical ids
    and removes the old ones. IOPS and throughput are updated in place. ``removal_policy`` DESTROY (the default)
    deletes removed volumes and those of a deleted stack: they are only copies of the snapshot, and a retained set
    would stay billed (64 x 200 GiB of gp3 is about $1k a month). RETAIN keeps them. The cluster makes its group
    depend on the volumes, so a stack delete terminates the nodes before it deletes the volumes they may have
    attached.
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        pool_name: str,
        size: int,
        snapshot_id: str,
        availability_zones: list[str],
        volume_size_gib: int = DEFAULT_VOLUME_GIB,
        iops: int = 3000,
        throughput_mibps: int = 125,
        initialization_rate_mibps: Optional[int] = None,
        removal_policy: RemovalPolicy = RemovalPolicy.DESTROY,
    ) -> None:
        super().__init__(scope, construct_id)
        if size < 1:
            raise ValueError("WarmVolumePool: size must be at least 1")
        self.pool_name = pool_name
        self.volumes: list[ec2.Volume] = []
        for zone in availability_zones:
            self._volumes(
                zone,
                size,
                snapshot_id,
                volume_size_gib=volume_size_gib,
                iops=iops,
                throughput_mibps=throughput_mibps,
                initialization_rate_mibps=initialization_rate_mibps,
                removal_policy=removal_policy,
            )

    def _volumes(
        self,
        availability_zone: str,
        size: int,
        snapshot_id: str,
        *,
        volume_size_gib: int,
        iops: int,
        throughput_mibps: int,
        initialization_rate_mibps: Optional[int],
        removal_policy: RemovalPolicy,
    ) -> None:
        """The pool's ``size`` volumes in one zone, under the scope of their generation."""
        literal_az = not Token.is_unresolved(availability_zone)
        generation = Construct(
            self,
            "-".join(
                [snapshot_id]
                + ([availability_zone] if literal_az else [])
                + ([f"init{initialization_rate_mibps}"] if initialization_rate_mibps else [])
                + ([f"{volume_size_gib}GiB"] if volume_size_gib != DEFAULT_VOLUME_GIB else [])
            ),
        )
        for i in range(size):
            volume = ec2.Volume(
                generation,
                f"Volume{i}",
                availability_zone=availability_zone,
                snapshot_id=snapshot_id,
                size=Size.gibibytes(volume_size_gib),
                volume_type=ec2.EbsDeviceVolumeType.GP3,
                iops=iops,
                throughput=throughput_mibps,
                encrypted=True,
                volume_initialization_rate=(
                    Size.mebibytes(initialization_rate_mibps) if initialization_rate_mibps else None
                ),
                removal_policy=removal_policy,
            )
            Tags.of(volume).add(POOL_TAG, self.pool_name)
            if literal_az:
                acknowledge(
                    volume,
                    "CloudFormation-Validate::W3010",
                    "The AZ is the one the team file names for the cluster (its imported subnet's, or its new "
                    "VPC's availability_zones): the pool must be where the nodes launch.",
                )
            self.volumes.append(volume)

    def claim_policy(
        self,
        construct_id: str,
        role: iam.IRole,
        *,
        cluster_tag_key: str,
        cluster: str,
        team_tag: Optional[tuple[str, str]] = None,
    ) -> iam.Policy:
        """Attach/detach exactly this pool's volumes (ARN and tag), only to instances tagged with this cluster
        (and, with ``team_tag``, this team: cluster names repeat across teams, so the cluster tag alone would let
        this pool's volumes be attached to another team's instances of a cluster with the same name)."""
        stack = Stack.of(self)
        instance_tags = {cluster_tag_key: cluster, **dict([team_tag] if team_tag else [])}
        policy = iam.Policy(
            self,
            construct_id,
            roles=[role],
            statements=[
                iam.PolicyStatement(
                    sid="ClaimOwnPoolVolumes",
                    actions=["ec2:AttachVolume", "ec2:DetachVolume"],
                    resources=[
                        stack.format_arn(service="ec2", resource="volume", resource_name=v.volume_id)
                        for v in self.volumes
                    ],
                    conditions={"StringEquals": {f"aws:ResourceTag/{POOL_TAG}": self.pool_name}},
                ),
                iam.PolicyStatement(
                    sid="AttachToOwnClusterInstances",
                    actions=["ec2:AttachVolume", "ec2:DetachVolume"],
                    resources=[stack.format_arn(service="ec2", resource="instance", resource_name="*")],
                    conditions={"StringEquals": {f"aws:ResourceTag/{k}": v for k, v in instance_tags.items()}},
                ),
                # Only a cluster with a pool looks for a free volume (spot_training/warm_volume.py).
                iam.PolicyStatement(sid="FindFreePoolVolumes", actions=["ec2:DescribeVolumes"], resources=["*"]),
            ],
        )
        acknowledge_all(
            policy,
            {
                "AwsSolutions-IAM5[Resource::*]": (
                    "ec2:DescribeVolumes, to find a free volume of the pool in the node's AZ: it supports no "
                    "resource-level permissions, so IAM requires Resource '*'. Read-only; only clusters with a warm "
                    "pool get it."
                ),
                "AwsSolutions-IAM5[Resource::arn:<AWS::Partition>:ec2:<AWS::Region>:<AWS::AccountId>:instance/*]": (
                    "Spot instance ids are only known at launch; the statement is limited to instances tagged "
                    + ", ".join(f"{k}={v}" for k, v in instance_tags.items())
                    + " and to this pool's volumes, listed by ARN."
                ),
            },
        )
        return policy
