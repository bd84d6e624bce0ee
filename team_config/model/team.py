"""The team file as a whole: its clusters, network, checkpoint bucket, log retention and budget."""

from __future__ import annotations

import json
import re
from typing import Annotated, Literal, Optional

from pydantic import BeforeValidator, Field, field_validator, model_validator

from team_config.model.base import BucketName, Strict, empty_section
from team_config.model.budget import BudgetConfig
from team_config.model.cluster import ClusterConfig
from team_config.model.network import NetworkConfig

# The values CloudWatch Logs accepts for a log group's retention (days).
LOG_RETENTION_DAYS = (
    1,
    3,
    5,
    7,
    14,
    30,
    60,
    90,
    120,
    150,
    180,
    365,
    400,
    545,
    731,
    1096,
    1827,
    2192,
    2557,
    2922,
    3288,
    3653,
)

# data_buckets: at most this many, taking at most this many bytes of the job spec's JSON (an SSM parameter of at
# most 4,096 bytes; tests/test_constructs.py synthesizes the longest job spec and checks that it fits).
MAX_DATA_BUCKETS, DATA_BUCKETS_JSON_BYTES = 16, 400
# A bucket name CloudFormation gives a training stack's checkpoint or access-log bucket: trainingstack[-<team>]-
# checkpoints... (the stack name, the logical id, a suffix; lowercased).
STACK_BUCKET = re.compile(r"^trainingstack[a-z0-9-]*-checkpoints")
IP_ADDRESS = re.compile(r"^\d+\.\d+\.\d+\.\d+$")


def _data_bucket_problem(name: str) -> Optional[str]:
    """Why ``name`` cannot be a data bucket (S3's rules beyond the pattern; a training stack's own bucket); None if
    it can."""
    if ".." in name or IP_ADDRESS.match(name):
        return f"{name!r} is no S3 bucket name (no '..', not an IP address); give the bucket's name as S3 shows it"
    if STACK_BUCKET.match(name):
        return (
            f"{name!r} is a training stack's checkpoint bucket; the nodes reach their own cluster's prefix of it "
            "already, so list only buckets of training data"
        )
    return None


class CheckpointBucketConfig(Strict):
    noncurrent_version_expiration_days: int = Field(
        3,
        ge=1,
        le=3650,
        description="Days a replaced or deleted checkpoint object stays recoverable (and billed): every checkpoint "
        "the agent prunes stays this long.",
    )
    access_log_expiration_days: int = Field(365, ge=1, le=3650, description="Days S3 server access logs are kept.")
    removal_policy: Literal["retain", "destroy"] = Field(
        "retain",
        description="retain: both buckets outlive the stack; destroy: DeletionPolicy Delete (CloudFormation deletes "
        "only an empty bucket).",
    )


class TeamConfig(Strict):
    clusters: Annotated[
        list[ClusterConfig], BeforeValidator(empty_section("give at least one cluster (- name: ...) under it"))
    ] = Field(min_length=1, description="The team's clusters; names unique, also without their '-'.")
    network: Annotated[
        NetworkConfig,
        BeforeValidator(
            empty_section("give new_vpc: or existing_vpc: under it, or remove the line for a new single-AZ VPC")
        ),
    ] = Field(NetworkConfig(), description="new_vpc or existing_vpc; default: a new single-AZ VPC.")
    checkpoint_bucket: Annotated[
        CheckpointBucketConfig,
        BeforeValidator(empty_section("give its keys (removal_policy: ..., ...) or remove the line for the defaults")),
    ] = Field(CheckpointBucketConfig(), description="Lifecycle and removal of the checkpoint bucket.")
    log_retention_days: int = Field(30, description="CloudWatch retention of training and flow logs.")
    data_buckets: list[BucketName] = Field(
        [],
        max_length=MAX_DATA_BUCKETS,
        description="S3 buckets the team's jobs read inputs from (a job's inputs: s3://bucket/prefix); the nodes may "
        "get and list objects in exactly these, and trainctl submit refuses an input from any other. Names only, no "
        "s3:// and no prefix; not the team's checkpoint bucket.",
    )
    budget: Annotated[
        Optional[BudgetConfig],
        BeforeValidator(empty_section("give its keys (usd_per_month: ...) or remove the line")),
    ] = Field(None, description="Monthly AWS Budgets budget; at 100 % the team's jobs are stopped and groups set to 0.")

    @field_validator("log_retention_days")
    @classmethod
    def _retention(cls, days: int) -> int:
        if days not in LOG_RETENTION_DAYS:
            allowed = ", ".join(map(str, LOG_RETENTION_DAYS))
            raise ValueError(f"{days} is not a CloudWatch retention value; use one of {allowed}")
        return days

    @field_validator("data_buckets")
    @classmethod
    def _data_buckets(cls, names: list[str]) -> list[str]:
        for name in names:
            problem = _data_bucket_problem(name)
            if problem:
                raise ValueError(problem)
        twice = sorted({name for name in names if names.count(name) > 1})
        if twice:
            raise ValueError(f"{', '.join(twice)} listed twice; list each bucket once")
        size = len(json.dumps(names))
        if size > DATA_BUCKETS_JSON_BYTES:
            raise ValueError(
                f"the names take {size:,} bytes of the job spec, above the {DATA_BUCKETS_JSON_BYTES:,} it has room "
                "for (an SSM parameter of at most 4,096 bytes); list fewer buckets"
            )
        return names

    @model_validator(mode="after")
    def _team(self) -> TeamConfig:
        seen: dict[str, str] = {}
        for cluster in self.clusters:
            # Stack outputs and construct ids drop the '-', so 'a-1' and 'a1' would clash there.
            key = cluster.name.replace("-", "")
            if key in seen:
                same = seen[key] == cluster.name
                raise ValueError(
                    f"clusters: name {cluster.name!r} is used twice; give each cluster a unique name"
                    if same
                    else f"clusters: names {seen[key]!r} and {cluster.name!r} differ only by '-'; rename one"
                )
            seen[key] = cluster.name
        for i, cluster in enumerate(self.clusters):
            if cluster.efa is True and self.network.az_count != 1:
                raise ValueError(
                    f"clusters[{i}] ({cluster.name}): efa: true ({', '.join(cluster.instance_types)}) across "
                    f"{self.network.az_count} AZs, but EFA traffic stays within one subnet; use one AZ/subnet or set "
                    "efa: false"
                )
            if cluster.placement_group and self.network.az_count != 1:
                raise ValueError(
                    f"clusters[{i}] ({cluster.name}): a cluster placement group lives in one AZ but the network "
                    f"spans {self.network.az_count}; use one AZ/subnet or set placement_group: false"
                )
            if cluster.warm_pool is not None and self.network.az_count != 1:
                raise ValueError(
                    f"clusters[{i}] ({cluster.name}): a warm volume pool lives in one AZ but the network spans "
                    f"{self.network.az_count}; use one AZ/subnet or remove warm_pool"
                )
            if cluster.max_nodes > 1 and self.network.az_count != 1 and not cluster.cross_zone_training:
                raise ValueError(
                    f"clusters[{i}] ({cluster.name}): max_nodes {cluster.max_nodes} across {self.network.az_count} "
                    "AZs: the nodes' gradient exchange at every step would cross zones, billed as inter-AZ data "
                    "transfer (about $0.01 per GB each way, not in trainctl cost) and slower than within one; use one "
                    "AZ/subnet, or set cross_zone_training: true to accept the charge"
                )
        return self
