"""The team file schema: every knob a team can set, validated at synth.

One file per team in ``teams/``; the file name is the team name. Everything here is
plain data: no boto3, no CDK, so it loads in milliseconds and can be reused by tools.

One module per section of the file: :mod:`~team_config.model.team` (the file as a whole),
:mod:`~team_config.model.cluster`, :mod:`~team_config.model.job`, :mod:`~team_config.model.node` (AMI, warm pool,
drill), :mod:`~team_config.model.network`, :mod:`~team_config.model.budget`; :mod:`~team_config.model.base` holds
what they share. Importers take every name from ``team_config.model``.
"""

from __future__ import annotations

from team_config.model.base import (
    ABS_PATH_PATTERN,
    AMI_PATTERN,
    AZ_PATTERN,
    BUCKET_PATTERN,
    EMAIL_PATTERN,
    INSTANCE_TYPE_PATTERN,
    NAME_PATTERN,
    PATTERN_EXAMPLES,
    POOL_DEVICE_PATTERN,
    ROOT_DEVICE_PATTERN,
    ROUTE_TABLE_PATTERN,
    SNAPSHOT_PATTERN,
    SSM_PARAMETER_PATTERN,
    SUBNET_PATTERN,
    VPC_PATTERN,
    AbsPath,
    AmiId,
    AzName,
    BucketName,
    InstanceType,
    Name,
    RouteTableId,
    SnapshotId,
    Strict,
    SubnetId,
    VpcId,
    empty_section,
)
from team_config.model.budget import MAX_BUDGET_SUBSCRIBERS, BudgetConfig
from team_config.model.capacity import CapacityConfig
from team_config.model.cluster import ClusterConfig
from team_config.model.job import DEFAULT_PYTHON, JOB_SPEC_TEXT_BYTES, SYSTEM_DIRS, SYSTEM_TREES, JobConfig, json_bytes
from team_config.model.network import (
    NOT_FOR_HOSTS,
    ExistingVpcConfig,
    NetworkConfig,
    NewVpcConfig,
    SubnetConfig,
    one_region,
)
from team_config.model.node import (
    DEFAULT_AMI_PARAMETER,
    AmiConfig,
    InterruptionDrillConfig,
    WarmPoolConfig,
    instance_architecture,
    rebalancing_pool,
)
from team_config.model.team import (
    DATA_BUCKETS_JSON_BYTES,
    LOG_RETENTION_DAYS,
    MAX_DATA_BUCKETS,
    CheckpointBucketConfig,
    TeamConfig,
)

__all__ = [
    "ABS_PATH_PATTERN",
    "AMI_PATTERN",
    "AZ_PATTERN",
    "BUCKET_PATTERN",
    "DATA_BUCKETS_JSON_BYTES",
    "DEFAULT_AMI_PARAMETER",
    "DEFAULT_PYTHON",
    "EMAIL_PATTERN",
    "INSTANCE_TYPE_PATTERN",
    "JOB_SPEC_TEXT_BYTES",
    "LOG_RETENTION_DAYS",
    "MAX_BUDGET_SUBSCRIBERS",
    "MAX_DATA_BUCKETS",
    "NAME_PATTERN",
    "NOT_FOR_HOSTS",
    "PATTERN_EXAMPLES",
    "POOL_DEVICE_PATTERN",
    "ROOT_DEVICE_PATTERN",
    "ROUTE_TABLE_PATTERN",
    "SNAPSHOT_PATTERN",
    "SSM_PARAMETER_PATTERN",
    "SUBNET_PATTERN",
    "SYSTEM_DIRS",
    "SYSTEM_TREES",
    "VPC_PATTERN",
    "AbsPath",
    "AmiConfig",
    "AmiId",
    "AzName",
    "BucketName",
    "BudgetConfig",
    "CapacityConfig",
    "CheckpointBucketConfig",
    "ClusterConfig",
    "ExistingVpcConfig",
    "InstanceType",
    "InterruptionDrillConfig",
    "JobConfig",
    "Name",
    "NetworkConfig",
    "NewVpcConfig",
    "RouteTableId",
    "SnapshotId",
    "Strict",
    "SubnetConfig",
    "SubnetId",
    "TeamConfig",
    "VpcId",
    "WarmPoolConfig",
    "empty_section",
    "instance_architecture",
    "json_bytes",
    "one_region",
    "rebalancing_pool",
]
