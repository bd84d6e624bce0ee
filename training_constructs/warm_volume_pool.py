"""WarmVolumePool: EBS volumes created ahead of time from a snapshot, claimed by nodes at boot."""

from __future__ import annotations

from typing import Optional

from aws_cdk import RemovalPolicy, Size, Stack, Tags
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_iam as iam
from constructs import Construct

POOL_TAG = "spot-training:warm-pool"


class WarmVolumePool(Construct):
    """``size`` gp3 volumes from ``snapshot_id`` in one AZ, tagged as one pool.

    A replacement spot node attaches a volume that is already initialised instead of paying the
    snapshot's lazy loading on first read. ``initialization_rate_mibps`` (100-300) makes EBS
    initialise each volume at that rate when it is created. Only instances of this cluster may
    attach or detach the pool's volumes (tag conditions, see ``grant_claim``).
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        pool_name: str,
        size: int,
        snapshot_id: str,
        availability_zone: str,
        volume_size_gib: int = 200,
        iops: int = 3000,
        throughput_mibps: int = 125,
        initialization_rate_mibps: Optional[int] = None,
        removal_policy: RemovalPolicy = RemovalPolicy.RETAIN,
    ) -> None:
        super().__init__(scope, construct_id)
        if size < 1:
            raise ValueError("WarmVolumePool: size must be at least 1")
        self.pool_name = pool_name
        self.volumes: list[ec2.Volume] = []
        for i in range(size):
            volume = ec2.Volume(
                self,
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
            Tags.of(volume).add(POOL_TAG, pool_name)
            self.volumes.append(volume)

    def grant_claim(self, grantee: iam.IGrantable, *, cluster_tag_key: str, cluster: str) -> None:
        """Attach/detach exactly this pool's volumes (ARN and tag), only to instances tagged with this cluster."""
        stack = Stack.of(self)
        grantee.grant_principal.add_to_principal_policy(
            iam.PolicyStatement(
                sid="ClaimOwnPoolVolumes",
                actions=["ec2:AttachVolume", "ec2:DetachVolume"],
                resources=[
                    stack.format_arn(service="ec2", resource="volume", resource_name=v.volume_id) for v in self.volumes
                ],
                conditions={"StringEquals": {f"aws:ResourceTag/{POOL_TAG}": self.pool_name}},
            )
        )
        grantee.grant_principal.add_to_principal_policy(
            iam.PolicyStatement(
                sid="AttachToOwnClusterInstances",
                actions=["ec2:AttachVolume", "ec2:DetachVolume"],
                resources=[stack.format_arn(service="ec2", resource="instance", resource_name="*")],
                conditions={"StringEquals": {f"aws:ResourceTag/{cluster_tag_key}": cluster}},
            )
        )
