"""What a cluster's nodes boot and attach: the AMI (and its default, the PyTorch DLAMI of the architecture), the
warm volume pool and the interruption drill."""

from __future__ import annotations

import math
import re
from typing import Annotated, Literal, Optional

from pydantic import Field, StringConstraints, model_validator

from bootstrap_scripts.spot_training.job_spec import MIN_FREE_PERCENT_DEFAULT, MIN_FREE_PERCENT_MAX
from team_config.instance_types import instance_facts
from team_config.model.base import (
    POOL_DEVICE_PATTERN,
    ROOT_DEVICE_PATTERN,
    SSM_PARAMETER_PATTERN,
    AmiId,
    SnapshotId,
    Strict,
)

# Deep Learning OSS Nvidia Driver AMI GPU PyTorch (Amazon Linux 2023), public SSM parameters: the driver, CUDA,
# NCCL/EFA and a PyTorch environment at /opt/pytorch (DEFAULT_PYTHON). The Base DLAMI has no PyTorch. The version in
# the name is a pin (the newest release for both architectures in 2026-10): AWS retires old lines, so revisit it.
DEFAULT_AMI_PARAMETER = {
    arch: f"/aws/service/deeplearning/ami/{arch}/oss-nvidia-driver-gpu-pytorch-2.11-amazon-linux-2023/latest/ami-id"
    for arch in ("x86_64", "arm64")
}


def instance_architecture(instance_type: str) -> str:
    """CPU architecture of an EC2 instance type: EC2's own (``ec2_instance_types.txt``), else from the name
    (Graviton families carry a 'g' after the generation). EC2 Mac types are ``arm64_mac`` or ``x86_64_mac``."""
    facts = instance_facts().get(instance_type)
    if facts is not None:
        return facts.architecture
    family = instance_type.split(".", 1)[0]
    if family == "a1":
        return "arm64"
    match = re.match(r"^[a-z-]+?\d+([a-z0-9-]*)$", family)  # p6e-gb200: Grace (arm64), after the generation
    if match and "g" in match.group(1):
        return "arm64"
    return "x86_64"


class AmiConfig(Strict):
    image_id: Optional[AmiId] = Field(None, description="A fixed AMI id (region-specific).")
    ssm_parameter: Optional[Annotated[str, StringConstraints(pattern=SSM_PARAMETER_PATTERN)]] = Field(
        None, description="An SSM parameter that holds the AMI id, resolved at deploy time."
    )
    root_device_name: Annotated[str, StringConstraints(pattern=ROOT_DEVICE_PATTERN)] = Field(
        "/dev/xvda", description="Root device of the AMI (/dev/sda1 on Ubuntu AMIs)."
    )

    @model_validator(mode="after")
    def _one(self) -> AmiConfig:
        if self.image_id and self.ssm_parameter:
            raise ValueError("set either image_id or ssm_parameter, not both")
        return self


class InterruptionDrillConfig(Strict):
    percent: int = Field(50, ge=1, le=100, description="Share of the running spot instances that get a notice.")
    notice_minutes: int = Field(
        2,
        ge=2,
        le=15,
        description="Minutes from the drill's action to the interruption; the notice comes 2 minutes before it (with "
        "more, a rebalance recommendation first).",
    )


def rebalancing_pool(max_nodes: int) -> int:
    """A pool with a volume for every node and for each replacement capacity rebalancing launches before the node
    it replaces lets its volume go: Auto Scaling may go above the group's maximum by 10% (at least 1) for those."""
    return max_nodes + max(1, math.ceil(max_nodes / 10))


class WarmPoolConfig(Strict):
    size: int = Field(
        ge=1,
        le=64,
        description="Number of pre-warmed volumes per zone; at least max_nodes (+10%, at least 1, for rebalancing). "
        "With capacity.zones each listed zone has its own size volumes, all billed: size x zones.",
    )
    snapshot_id: Optional[SnapshotId] = Field(
        None, description="Snapshot the volumes are created from; required unless ami_id is given and resolved."
    )
    ami_id: Optional[AmiId] = Field(None, description="AMI whose root snapshot the volumes copy (resolve it first).")
    volume_size_gib: int = Field(200, ge=1, le=16384, description="gp3 volume size.")
    iops: int = Field(3000, ge=3000, le=16000, description="gp3 IOPS, at most 500 per GiB.")
    throughput_mibps: int = Field(125, ge=125, le=1000, description="gp3 throughput, at most iops / 4.")
    initialization_rate_mibps: Optional[int] = Field(
        None, ge=100, le=300, description="EBS provisioned initialization rate."
    )
    device_name: Annotated[str, StringConstraints(pattern=POOL_DEVICE_PATTERN)] = Field(
        "/dev/sdf", description="Where a node attaches its claimed volume."
    )
    removal_policy: Literal["retain", "destroy"] = Field(
        "destroy",
        description="destroy: a replaced pool's or deleted stack's volumes are deleted (copies of the snapshot); "
        "retain: they stay, billed, until deleted by hand.",
    )
    min_free_percent: int = Field(
        MIN_FREE_PERCENT_DEFAULT,
        ge=0,
        le=MIN_FREE_PERCENT_MAX,
        description="Percent of its claimed volume a node keeps free: before a job's setup and input downloads, the "
        "node agent removes the least recently used setup caches and inputs the job does not use until that much is "
        "free. 0: never.",
    )

    @model_validator(mode="after")
    def _snapshot(self) -> WarmPoolConfig:
        if self.snapshot_id is None and self.ami_id is not None:
            raise ValueError(
                f"ami_id {self.ami_id} is not resolved to its root snapshot yet; run "
                "`.venv/bin/python -m team_config.resolve_snapshots <team file>` to add snapshot_id"
            )
        if self.snapshot_id is None:
            raise ValueError("snapshot_id (snap-...) or ami_id (ami-...) is required: what the warm volumes copy")
        # gp3's limits (EBS user guide, "General Purpose SSD volumes"): 500 IOPS per GiB, 0.25 MiB/s per IOPS.
        if self.iops > 500 * self.volume_size_gib:
            raise ValueError(
                f"iops {self.iops} exceeds gp3's 500 per GiB of volume_size_gib {self.volume_size_gib}; "
                f"use iops <= {500 * self.volume_size_gib} or a larger volume"
            )
        if self.throughput_mibps * 4 > self.iops:
            raise ValueError(
                f"throughput_mibps {self.throughput_mibps} exceeds gp3's 0.25 MiB/s per IOPS of iops {self.iops}; "
                f"use throughput_mibps <= {self.iops // 4} or iops >= {self.throughput_mibps * 4}"
            )
        return self
