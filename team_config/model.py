"""The team file schema: every knob a team can set, validated at synth.

One file per team in ``teams/``; the file name is the team name. Everything here is
plain data: no boto3, no CDK, so it loads in milliseconds and can be reused by tools.
"""

from __future__ import annotations

import ipaddress
import json
import math
import posixpath
import re
from typing import Annotated, Any, Literal, Optional

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StringConstraints,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from bootstrap_scripts.spot_training.job_spec import (
    CHECKPOINT_INTERVAL_MIN_S,
    MTBI_MAX_S,
    PARAMETER_MAX_BYTES,
    STALL_TIMEOUT_MAX_S,
    STALL_TIMEOUT_MIN_S,
    JobSpecError,
    parse_command,
    stall_too_short,
)
from team_config.instance_types import InstanceFacts, closest_instance_type, instance_facts, known_instance_types

# DNS label, short enough to fit in stack names, tags, S3 prefixes and construct ids.
NAME_PATTERN = r"^[a-z]([a-z0-9-]{0,30}[a-z0-9])?$"
Name = Annotated[str, StringConstraints(pattern=NAME_PATTERN)]

INSTANCE_TYPE_PATTERN = r"^[a-z][a-z0-9-]*\.[a-z0-9-]+$"
InstanceType = Annotated[str, StringConstraints(pattern=INSTANCE_TYPE_PATTERN)]

SNAPSHOT_PATTERN = r"^snap-[0-9a-f]{8,17}$"
SnapshotId = Annotated[str, StringConstraints(pattern=SNAPSHOT_PATTERN)]
AMI_PATTERN = r"^ami-[0-9a-f]{8,17}$"
AmiId = Annotated[str, StringConstraints(pattern=AMI_PATTERN)]
VPC_PATTERN = r"^vpc-[0-9a-f]{8,17}$"
VpcId = Annotated[str, StringConstraints(pattern=VPC_PATTERN)]
SUBNET_PATTERN = r"^subnet-[0-9a-f]{8,17}$"
SubnetId = Annotated[str, StringConstraints(pattern=SUBNET_PATTERN)]
ROUTE_TABLE_PATTERN = r"^rtb-[0-9a-f]{8,17}$"
RouteTableId = Annotated[str, StringConstraints(pattern=ROUTE_TABLE_PATTERN)]
AZ_PATTERN = r"^[a-z]{2}(-[a-z]+)+-\d[a-z]$"
AzName = Annotated[str, StringConstraints(pattern=AZ_PATTERN)]
ABS_PATH_PATTERN = r"^/[A-Za-z0-9._/-]*$"
AbsPath = Annotated[str, StringConstraints(pattern=ABS_PATH_PATTERN)]
SSM_PARAMETER_PATTERN = r"^/[A-Za-z0-9._/-]+$"
ROOT_DEVICE_PATTERN = r"^/dev/[a-z0-9]+$"
POOL_DEVICE_PATTERN = r"^/dev/sd[f-p]$"

# job.checkpoint_dir may not be one of these or under a SYSTEM_TREES one: the node agent uploads everything under
# the directory (its flat-layout walker), so "/" or "/usr" would upload the system.
SYSTEM_DIRS = frozenset(
    "/ /bin /boot /dev /etc /home /lib /lib64 /opt /proc /root /run /sbin /srv /sys /tmp /usr /var".split()
)
SYSTEM_TREES = ("/usr", "/etc", "/proc", "/sys")

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

# Deep Learning OSS Nvidia Driver AMI GPU PyTorch (Amazon Linux 2023), public SSM parameters: the driver, CUDA,
# NCCL/EFA and a PyTorch environment at /opt/pytorch (DEFAULT_PYTHON). The Base DLAMI has no PyTorch. The version in
# the name is a pin (the newest release for both architectures in 2026-10): AWS retires old lines, so revisit it.
DEFAULT_AMI_PARAMETER = {
    arch: f"/aws/service/deeplearning/ami/{arch}/oss-nvidia-driver-gpu-pytorch-2.11-amazon-linux-2023/latest/ami-id"
    for arch in ("x86_64", "arm64")
}
DEFAULT_PYTHON = "/opt/pytorch/bin/python"  # the PyTorch DLAMI's python_location


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


def empty_section(fix: str) -> Any:
    """A ``mode="before"`` field validator that refuses a section written with nothing under it (YAML null): an
    empty ``budget:`` would otherwise turn the budget off without a word."""

    def check(value: Any) -> Any:
        if value is None:
            raise PydanticCustomError("empty_section", fix)
        return value

    return check


class Strict(BaseModel):
    # strict: YAML already gives ints, floats and booleans; `yes` must not become 1 day of log retention.
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


# Ranges no VPC's hosts can use (RFC 6890): their addresses mean something else on every host.
NOT_FOR_HOSTS = {
    ipaddress.IPv4Network("0.0.0.0/8"): '"this network"',
    ipaddress.IPv4Network("127.0.0.0/8"): "the loopback range",
    ipaddress.IPv4Network("169.254.0.0/16"): "the link-local range (the instance metadata service and Amazon DNS)",
    ipaddress.IPv4Network("224.0.0.0/4"): "the multicast range",
    ipaddress.IPv4Network("240.0.0.0/4"): "a reserved range",
}


class NewVpcConfig(Strict):
    cidr: str = Field(
        "10.0.0.0/16",
        description="IPv4 range of the new VPC, /16 to /24, not in 0/8, 127/8, 169.254/16, 224/4 or 240/4.",
    )
    az_count: int = Field(1, ge=1, le=3, description="Availability zones the VPC spans.")
    availability_zones: Optional[list[AzName]] = Field(
        None,
        min_length=1,
        max_length=3,
        description="The zones by name, in the region the stack deploys to (where the instance types have spot "
        "capacity); unset: the region's first az_count zones.",
    )
    nat_gateways: int = Field(
        1, ge=0, le=3, description="NAT gateways for egress, 1 to az_count (the nodes reach AWS APIs through them)."
    )

    @model_validator(mode="before")
    @classmethod
    def _count_the_zones(cls, data: Any) -> Any:
        """``availability_zones`` alone sets ``az_count``."""
        zones = data.get("availability_zones") if isinstance(data, dict) else None
        if isinstance(zones, list) and 1 <= len(zones) <= 3 and "az_count" not in data:  # else: its own error
            return {**data, "az_count": len(zones)}
        return data

    @model_validator(mode="after")
    def _cidr(self) -> NewVpcConfig:
        try:
            net = ipaddress.IPv4Network(self.cidr)
        except ValueError as exc:
            raise ValueError(f"cidr {self.cidr!r} is not an IPv4 network ({exc}); use e.g. 10.0.0.0/16") from None
        if not 16 <= net.prefixlen <= 24:
            raise ValueError(f"cidr {self.cidr!r} has prefix /{net.prefixlen}; use a /16 to /24 range")
        for special, what in NOT_FOR_HOSTS.items():
            if net.overlaps(special):
                raise ValueError(f"cidr {self.cidr!r} is in {special}, {what}; use a private range such as 10.0.0.0/16")
        zones = self.availability_zones
        if zones is None and self.az_count > 2:
            raise ValueError(
                f"az_count {self.az_count} needs availability_zones: a region-agnostic stack knows only 2 zones "
                "(list the zones by name, e.g. [us-east-1a, us-east-1b, us-east-1c])"
            )
        if zones is not None:
            if len(set(zones)) != len(zones):
                raise ValueError(f"availability_zones {zones} names a zone twice; list each zone once")
            one_region("availability_zones", zones)
            if self.az_count != len(zones):
                raise ValueError(
                    f"az_count {self.az_count} but availability_zones lists {len(zones)}; drop az_count "
                    "(the list sets it)"
                )
        if self.nat_gateways == 0:
            raise ValueError(
                "nat_gateways 0 leaves the nodes no way to SSM, Auto Scaling, EC2 or CloudWatch Logs (the stack adds "
                "only an S3 endpoint), so they could not even leave the group; use 1, or an existing_vpc with its own "
                "endpoints"
            )
        if self.nat_gateways > self.az_count:
            raise ValueError(
                f"nat_gateways ({self.nat_gateways}) exceeds az_count ({self.az_count}); use at most one per AZ"
            )
        return self


def one_region(field: str, zones: list[str]) -> None:
    """Zones of one region (a zone name is its region's name and a letter)."""
    if len({z[:-1] for z in zones}) > 1:
        raise ValueError(f"{field} {zones} are in different regions; list zones of one region")


class SubnetConfig(Strict):
    subnet_id: SubnetId = Field(description="The subnet (subnet-...).")
    availability_zone: AzName = Field(description="The subnet's zone, such as us-east-1a.")
    route_table_id: Optional[RouteTableId] = Field(None, description="Route table for the S3 gateway endpoint.")


class ExistingVpcConfig(Strict):
    vpc_id: VpcId = Field(description="The VPC (vpc-...).")
    subnets: list[SubnetConfig] = Field(min_length=1, description="Subnets the clusters launch into, one per AZ.")
    create_s3_endpoint: bool = Field(True, description="Add an S3 gateway endpoint on the subnets' route tables.")

    @model_validator(mode="after")
    def _subnets(self) -> ExistingVpcConfig:
        ids = [s.subnet_id for s in self.subnets]
        twice = sorted({i for i in ids if ids.count(i) > 1})
        if twice:
            raise ValueError(f"subnets: {twice[0]} is listed twice; list each subnet once")
        azs = [s.availability_zone for s in self.subnets]
        if len(set(azs)) != len(azs):
            raise ValueError("subnets: two subnets in one availability zone; list one subnet per AZ")
        one_region("subnets: availability zones", azs)
        if self.create_s3_endpoint and any(s.route_table_id is None for s in self.subnets):
            raise ValueError("subnets: route_table_id is required on every subnet when create_s3_endpoint is true")
        with_table = [i for i, s in enumerate(self.subnets) if s.route_table_id is not None]
        if with_table and len(with_table) != len(self.subnets):
            without = next(i for i in range(len(self.subnets)) if i not in with_table)
            raise ValueError(
                f"subnets: route_table_id is given on subnets[{with_table[0]}] but not on subnets[{without}]; "
                "give it on every subnet or on none"
            )
        return self


class NetworkConfig(Strict):
    new_vpc: Annotated[
        Optional[NewVpcConfig], BeforeValidator(empty_section("write new_vpc: {} for the defaults, or remove the line"))
    ] = Field(None, description="A new VPC made by the stack (the default when neither key is set).")
    existing_vpc: Annotated[
        Optional[ExistingVpcConfig],
        BeforeValidator(empty_section("give its keys (vpc_id: ..., subnets: ...) or remove the line")),
    ] = Field(None, description="A VPC the team already has; not together with new_vpc.")

    @model_validator(mode="after")
    def _one(self) -> NetworkConfig:
        if self.new_vpc is not None and self.existing_vpc is not None:
            raise ValueError("set either new_vpc or existing_vpc, not both")
        return self

    @property
    def az_count(self) -> int:
        if self.existing_vpc is not None:
            return len(self.existing_vpc.subnets)
        return (self.new_vpc or NewVpcConfig()).az_count


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
        description="Number of pre-warmed volumes; at least max_nodes (+10%, at least 1, for rebalancing).",
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


EMAIL_PATTERN = r"^[^@\s]+@[^@\s]+\.[^@\s]+$"
# What a valid value looks like, said after a pattern mismatch ("; use ..."): the regex alone tells no one the fix.
PATTERN_EXAMPLES = {
    NAME_PATTERN: "lowercase letters, digits and '-' (a letter first, no '-' last, at most 32), such as gpu-a",
    AMI_PATTERN: "an AMI id such as ami-0123456789abcdef0",
    SNAPSHOT_PATTERN: "a snapshot id such as snap-0123456789abcdef0",
    VPC_PATTERN: "a VPC id such as vpc-0123456789abcdef0",
    SUBNET_PATTERN: "a subnet id such as subnet-0123456789abcdef0",
    ROUTE_TABLE_PATTERN: "a route table id such as rtb-0123456789abcdef0",
    AZ_PATTERN: "a zone name such as us-east-1a",
    EMAIL_PATTERN: "an email address such as ml-leads@example.com",
    INSTANCE_TYPE_PATTERN: "an instance type such as g5.xlarge (lowercase)",
    ABS_PATH_PATTERN: "an absolute path of letters, digits, '.', '_', '-' and '/' (no spaces), such as "
    "/opt/ml/checkpoints or /opt/pytorch/bin/python",
    SSM_PARAMETER_PATTERN: "an SSM parameter name of letters, digits, '.', '_', '-' and '/', starting with '/', such "
    "as /my-team/training-ami-id",
    ROOT_DEVICE_PATTERN: "a device name such as /dev/xvda (/dev/sda1 on Ubuntu AMIs)",
    POOL_DEVICE_PATTERN: "one of /dev/sdf to /dev/sdp, such as /dev/sdf",
}
MAX_BUDGET_SUBSCRIBERS = 10  # AWS Budgets: at most 10 email subscribers per notification


class BudgetConfig(Strict):
    usd_per_month: float = Field(
        # The template carries the number as written by JSON.stringify, and Budgets takes ([0-9]*\.)?[0-9]+: from a
        # cent to a billion it never turns into 1e-7 or 1e+21.
        ge=0.01,
        le=1_000_000_000,
        allow_inf_nan=False,
        description="Monthly spend limit of the team's tagged resources, in USD.",
    )
    warn_at_percent: int = Field(80, ge=1, le=99, description="Email the notify list when actual spend passes this.")
    notify: list[Annotated[str, StringConstraints(pattern=EMAIL_PATTERN)]] = Field(
        default_factory=list, description="Email addresses AWS Budgets alerts (at warn_at_percent and 100 %)."
    )
    check_every_minutes: int = Field(
        60,
        ge=5,
        le=1440,
        description="How often the guard reads the budget (every force_stop_after_minutes when that is shorter).",
    )
    force_stop_after_minutes: int = Field(
        15, ge=5, le=120, description="Set a group to 0 if its job has not stopped this long after the request."
    )

    @field_validator("notify")
    @classmethod
    def _notify(cls, addresses: list[str]) -> list[str]:
        seen: set[str] = set()
        for address in addresses:
            if address.lower() in seen:
                raise ValueError(f"{address} is listed twice; list each address once")
            seen.add(address.lower())
        if len(addresses) > MAX_BUDGET_SUBSCRIBERS:
            raise ValueError(
                f"{len(addresses)} addresses, but AWS Budgets emails at most {MAX_BUDGET_SUBSCRIBERS} per alert; "
                "list at most 10 (a mailing list address reaches more people)"
            )
        return addresses


# What job.command, job.python and job.checkpoint_dir may take of the job spec, an SSM parameter of at most
# PARAMETER_MAX_BYTES: the rest at its longest (64 warm volume ids, 32-character names, the longest numbers) takes
# about 2,600 bytes (tests/test_constructs.py synthesizes that job spec and checks the sum).
JOB_SPEC_TEXT_BYTES = 1400


def json_bytes(text: str) -> int:
    """Bytes ``text`` takes inside a JSON document (UTF-8, escapes, without the quotes)."""
    return len(json.dumps(text, ensure_ascii=False).encode()) - 2


class JobConfig(Strict):
    """Defaults for the job spec the boot script reads; a submitted job may override them."""

    command: str = Field(
        "python train.py", min_length=1, description="Entry command run by torchrun, relative to the code directory."
    )
    python: AbsPath = Field(DEFAULT_PYTHON, description="Interpreter (of the environment with torch) on the AMI.")
    nproc_per_node: Optional[int] = Field(
        None,
        ge=1,
        le=64,
        description="Processes (GPUs) per node; unset: one per GPU of the instance types (1 on types without GPUs).",
    )
    checkpoint_dir: AbsPath = Field(
        "/opt/ml/checkpoints",
        description="Directory the trainer writes checkpoints to; the agent uploads everything under it, so system "
        "directories are refused.",
    )
    checkpoint_interval_s: Optional[float] = Field(
        None,
        ge=CHECKPOINT_INTERVAL_MIN_S,
        allow_inf_nan=False,
        description="Fixed interval; unset: Young/Daly from measured cost.",
    )
    checkpoint_wait_for_upload: bool = Field(
        False,
        description="Training waits at each checkpoint until it is durable in S3: a hard kill then loses at most one "
        "interval (default: training goes on while it uploads, so one interval plus the write and upload time).",
    )
    mean_time_between_interruptions_s: int = Field(
        3600, gt=0, le=MTBI_MAX_S, description="Assumed MTBI for the Young/Daly interval."
    )
    max_restarts: int = Field(
        3, ge=0, le=100, description="Restarts in a row without a new checkpoint before the job is marked FAILED."
    )
    interruption_grace_s: int = Field(
        90, gt=0, lt=120, description="Seconds the trainer gets after SIGTERM; under the 120 s notice."
    )
    rendezvous_port: int = Field(29400, ge=1024, le=65535, description="torchrun c10d rendezvous port.")
    # Off by default: the agent cannot tell a silent healthy phase (a data download, a long evaluation,
    # torch.compile) from a hang, so a default would end healthy jobs. A team opts in with the longest such phase
    # plus a margin.
    stall_timeout_s: Optional[int] = Field(
        None,
        description="Seconds the job may go without progress (an output line or a checkpoint write on any of its "
        "nodes, or a new checkpoint of the job durable in S3) before the node agent ends its trainer as hung and "
        f"counts a trainer failure ({STALL_TIMEOUT_MIN_S}-{STALL_TIMEOUT_MAX_S}). Unset (null): off. Set it above the "
        "longest silent phase of the job (data download, evaluation, torch.compile) and at least twice "
        "checkpoint_interval_s.",
    )

    @field_validator("stall_timeout_s")
    @classmethod
    def _stall_timeout(cls, seconds: Optional[int]) -> Optional[int]:
        if seconds is not None and not STALL_TIMEOUT_MIN_S <= seconds <= STALL_TIMEOUT_MAX_S:
            raise ValueError(
                f"{seconds} is outside {STALL_TIMEOUT_MIN_S} to {STALL_TIMEOUT_MAX_S} seconds (5 minutes to a day: a "
                "trainer silent for less may just be loading or saving); give seconds in that range, or null to turn "
                "the stall watchdog off"
            )
        return seconds

    @model_validator(mode="after")
    def _fits_the_job_spec(self) -> JobConfig:
        used = sum(json_bytes(text) for text in (self.command, self.python, self.checkpoint_dir))
        if used > JOB_SPEC_TEXT_BYTES:
            raise ValueError(
                f"command, python and checkpoint_dir take {used:,} bytes together, above the {JOB_SPEC_TEXT_BYTES:,} "
                f"the job spec has room for (an SSM parameter of at most {PARAMETER_MAX_BYTES:,} bytes: the deploy "
                "would fail); shorten the command (long arguments go in a file of your code)"
            )
        return self

    @model_validator(mode="after")
    def _stall_timeout_above_the_interval(self) -> JobConfig:
        stall, interval = self.stall_timeout_s, self.checkpoint_interval_s
        if stall is not None and interval is not None and stall_too_short(stall, interval):  # both set
            raise ValueError(
                f"stall_timeout_s {stall} is less than twice checkpoint_interval_s {interval:g}: a node whose only "
                "sign of progress is its checkpoints would be ended as hung between two; set job.checkpoint_interval_s "
                f"to at most {stall / 2:g}, or job.stall_timeout_s to at least {math.ceil(2 * interval)}"
            )
        return self

    @field_validator("python", "checkpoint_dir")
    @classmethod
    def _no_parent(cls, path: str) -> str:
        if ".." in path.split("/"):
            raise ValueError(f"{path!r} climbs out with '..'; give the absolute path without '..'")
        return path

    @field_validator("checkpoint_dir")
    @classmethod
    def _not_a_system_dir(cls, path: str) -> str:
        # The node agent uploads the whole tree under checkpoint_dir (and restores into it).
        clean = posixpath.normpath(path)
        clean = "/" + clean.lstrip("/")  # POSIX keeps a leading "//" (//usr is /usr)
        if clean in SYSTEM_DIRS or clean.startswith(tuple(f"{tree}/" for tree in SYSTEM_TREES)):
            raise ValueError(
                f"{path!r} is a system directory: the node agent uploads everything under checkpoint_dir to S3; "
                "use a directory of its own, such as /opt/ml/checkpoints"
            )
        return path

    @field_validator("command")
    @classmethod
    def _command(cls, command: str) -> str:
        try:  # the node agent's own rule: a command it would refuse fails here, not on a billed node
            parse_command(command)
        except JobSpecError as exc:
            raise ValueError(str(exc)) from None
        return command


class ClusterConfig(Strict):
    name: Name = Field(description="Cluster name; S3 prefix <name>/ and tag spot-training:cluster.")
    instance_types: list[InstanceType] = Field(
        min_length=1, max_length=40, description="Candidate types, one CPU architecture (Auto Scaling takes 40)."
    )
    min_nodes: int = Field(1, ge=1, description="Fewest nodes training continues with (torchrun --nnodes MIN:MAX).")
    desired_nodes: int = Field(1, ge=1, description="Nodes a job asks for by default.")
    max_nodes: int = Field(ge=1, le=1000, description="Upper bound of the Auto Scaling group.")
    on_demand_base_capacity: int = Field(0, ge=0, description="On-demand nodes before any spot (at most max_nodes).")
    on_demand_percentage_above_base: int = Field(
        0, ge=0, le=100, description="Share of on-demand capacity above the base (100: no spot)."
    )
    spot_allocation_strategy: Literal["price-capacity-optimized", "capacity-optimized"] = Field(
        "price-capacity-optimized", description="How Auto Scaling picks spot pools."
    )
    placement_group: bool = Field(True, description="Launch into a cluster placement group (one AZ).")
    cross_zone_training: bool = Field(
        False,
        description="Let a multi-node cluster span the network's AZs (more spot pools), its traffic between them "
        "billed as inter-AZ data transfer.",
    )
    root_volume_size_gib: int = Field(200, ge=8, le=16384, description="Encrypted gp3 root volume size.")
    ami: Annotated[
        AmiConfig,
        BeforeValidator(
            empty_section("give its keys (image_id: ... or ssm_parameter: ...) or remove the line for the default AMI")
        ),
    ] = Field(AmiConfig(), description="The AMI the nodes boot; default: the PyTorch DLAMI of the architecture.")
    job: Annotated[
        JobConfig,
        BeforeValidator(
            empty_section("give its keys (command: ..., nproc_per_node: ...) or remove the line for the defaults")
        ),
    ] = Field(JobConfig(), description="Defaults of the job spec; trainctl submit may override them.")
    warm_pool: Annotated[
        Optional[WarmPoolConfig],
        BeforeValidator(empty_section("give its keys (size: ..., snapshot_id: ...) or remove the line")),
    ] = Field(None, description="A pool of pre-warmed EBS volumes the nodes attach at boot.")
    interruption_drill: Annotated[
        Optional[InterruptionDrillConfig],
        BeforeValidator(empty_section("write interruption_drill: {} for the defaults, or remove the line")),
    ] = Field(None, description="Create an AWS FIS experiment template that interrupts this cluster's spot instances.")

    @model_validator(mode="after")
    def _nodes(self) -> ClusterConfig:
        if not self.min_nodes <= self.desired_nodes <= self.max_nodes:
            raise ValueError(
                f"need min_nodes <= desired_nodes <= max_nodes, got {self.min_nodes} <= "
                f"{self.desired_nodes} <= {self.max_nodes}"
            )
        if len(set(self.instance_types)) != len(self.instance_types):
            raise ValueError("instance_types: a type is listed twice; list each type once")
        for name in self.instance_types:
            if name not in known_instance_types():
                close = closest_instance_type(name)
                fix = f"did you mean {close}?" if close else "see aws ec2 describe-instance-types"
                raise ValueError(
                    f"instance_types: {name} is not an EC2 instance type ({fix}; a type newer than the pinned boto3: "
                    "upgrade it and run .venv/bin/python -m team_config.instance_types)"
                )
        arches = {t: instance_architecture(t) for t in self.instance_types}
        for name, arch in arches.items():
            if arch.endswith("_mac"):
                raise ValueError(
                    f"instance_types: {name} is an EC2 Mac ({arch}: macOS on a Dedicated Host), which neither spot "
                    "groups nor the Linux training AMIs run on; use x86_64 or arm64 Linux types"
                )
        if len(set(arches.values())) > 1:
            listed = ", ".join(f"{t} ({a})" for t, a in arches.items())
            raise ValueError(f"instance_types mix CPU architectures: {listed}; use types of one architecture")
        self._check_instance_facts()
        if self.on_demand_base_capacity > self.max_nodes:
            raise ValueError(
                f"on_demand_base_capacity ({self.on_demand_base_capacity}) exceeds max_nodes ({self.max_nodes})"
            )
        no_spot = self.on_demand_percentage_above_base == 100 or self.on_demand_base_capacity >= self.max_nodes
        if self.interruption_drill is not None and no_spot:
            raise ValueError(
                "interruption_drill interrupts spot instances, and this cluster launches none (all on-demand); remove "
                "interruption_drill, or lower on_demand_percentage_above_base / on_demand_base_capacity"
            )
        if self.warm_pool is not None and self.warm_pool.size < self.max_nodes:
            raise ValueError(
                f"warm_pool.size ({self.warm_pool.size}) is below max_nodes ({self.max_nodes}); "
                f"set size to at least max_nodes so every node finds a warm volume (size: "
                f"{rebalancing_pool(self.max_nodes)} also covers the replacements capacity rebalancing launches before "
                "the nodes they replace let their volumes go: up to 10% of max_nodes, at least 1)"
            )
        pool_ami = self.warm_pool.ami_id if self.warm_pool is not None else None
        if pool_ami is not None and self.ami.ssm_parameter is not None:
            raise ValueError(
                f"warm_pool.ami_id {pool_ami} is a copy of one AMI, but ami.ssm_parameter picks the AMI again at every "
                f"deploy: nodes would mount one AMI's environment over another's; remove ami.ssm_parameter (the nodes "
                f"then boot {pool_ami})"
            )
        if self.warm_pool is not None and pool_ami is None and self.ami.image_id is None:
            raise ValueError(
                f"warm_pool.snapshot_id {self.warm_pool.snapshot_id} copies one AMI's root, but the nodes boot the AMI "
                "an SSM parameter names at each deploy (ami.ssm_parameter, or the default DLAMI's): once it moves on, "
                "nodes would mount one AMI's environment over another's; set ami.image_id to the AMI the snapshot "
                "comes from (or give warm_pool.ami_id instead and resolve it)"
            )
        if pool_ami is not None and self.ami.image_id not in (None, pool_ami):
            raise ValueError(
                f"ami.image_id {self.ami.image_id} differs from warm_pool.ami_id {pool_ami}: nodes would mount one "
                f"AMI's environment over another's; set both to the same AMI (or remove ami.image_id: it defaults to "
                "warm_pool.ami_id)"
            )
        return self

    @property
    def nproc_per_node(self) -> int:
        """Processes per node: ``job.nproc_per_node``, or one per GPU of the types (all have the same count; 1 for
        types without GPUs or without known facts). A node of 8 GPUs left at 1 would bill 8 and train on 1."""
        if self.job.nproc_per_node is not None:
            return self.job.nproc_per_node
        gpus = [f.gpus for t in self.instance_types if (f := instance_facts().get(t)) is not None]
        return max(gpus, default=0) or 1

    def _check_instance_facts(self) -> None:
        """GPUs, placement and spot, from EC2's facts of each type (types without known facts are skipped)."""
        facts = {t: f for t in self.instance_types if (f := instance_facts().get(t)) is not None}
        with_gpu = {t: f for t, f in facts.items() if f.gpus}
        if with_gpu and len(with_gpu) != len(facts):
            listed = ", ".join(f"{t} ({f.describe_gpus()})" for t, f in facts.items())
            raise ValueError(f"instance_types mix GPU and non-GPU types: {listed}; use types of one kind")
        counts = {f.gpus for f in with_gpu.values()}
        if len(counts) > 1:
            listed = ", ".join(f"{t} ({f.gpus})" for t, f in with_gpu.items())
            raise ValueError(
                f"instance_types have different GPU counts: {listed}; job.nproc_per_node is one number for every "
                "node: list types with the same GPU count"
            )
        nproc = self.job.nproc_per_node or 0  # unset: the GPU count (nproc_per_node)
        for name, f in with_gpu.items():
            if nproc > f.gpus:
                raise ValueError(
                    f"job.nproc_per_node {nproc} exceeds the {f.describe_gpus()} GPU{'s' * (f.gpus > 1)} of {name}; "
                    "set nproc_per_node "
                    f"to at most {f.gpus} (one process per GPU) or use types with {nproc} GPUs"
                )
        spot = self.on_demand_percentage_above_base < 100
        for name, f in facts.items():
            if self.placement_group and not f.cluster_placement:
                raise ValueError(
                    f"instance_types: {name} cannot launch into a cluster placement group (EC2 does not place it "
                    "there); set placement_group: false or use another type"
                )
            if spot and not f.spot:
                raise ValueError(
                    f"instance_types: {name} is not sold as spot; remove it, or set on_demand_percentage_above_base: "
                    "100 (all on-demand)"
                )
        # SpotTraining-ST2's condition (compliance/spot_training/): unless all capacity above the base is
        # on-demand, the group's MixedInstancesPolicy needs at least 2 instance types.
        if spot and len(set(self.instance_types)) < 2:
            only = self.instance_types[0]
            other = self._similar_type(only)
            such_as = f", such as {other}" if other else ""
            raise ValueError(
                f"instance_types lists one type ({only}), but a spot group needs at least 2 to fall back on "
                f"(SpotTraining-ST2); list a second type with the same GPU count{such_as}, or set "
                "on_demand_percentage_above_base: 100"
            )

    def _similar_type(self, name: str) -> Optional[str]:
        """A type that could join ``name`` here: same architecture and GPUs, sold as spot; the same family and the
        nearest vCPU count first."""
        mine = instance_facts().get(name)
        if mine is None:
            return None

        def fits(f: InstanceFacts) -> bool:
            same = (f.architecture, f.gpus, f.spot) == (mine.architecture, mine.gpus, True)
            return same and (f.cluster_placement or not self.placement_group)

        family = name.split(".", 1)[0]
        candidates = [(t, f) for t, f in instance_facts().items() if t != name and f is not None and fits(f)]
        ranked = sorted(
            candidates,
            key=lambda c: (c[0].split(".", 1)[0] != family, c[1].gpu != mine.gpu, abs(c[1].vcpus - mine.vcpus), c[0]),
        )
        return ranked[0][0] if ranked else None

    @property
    def image_id(self) -> Optional[str]:
        """The fixed AMI the nodes boot: ``ami.image_id``, else the warm pool's AMI; None: the SSM parameter."""
        return self.ami.image_id or (self.warm_pool.ami_id if self.warm_pool is not None else None)

    @property
    def architecture(self) -> str:
        return instance_architecture(self.instance_types[0])


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
