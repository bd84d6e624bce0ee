"""What every section of the team file shares: the value patterns (and the examples an error gives for each),
the strict base model and the check that refuses a section written with nothing under it."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, StringConstraints
from pydantic_core import PydanticCustomError

from bootstrap_scripts.spot_training.job_parts import BUCKET_RE

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
# An S3 bucket name (S3's rules; the dots' further rules are checked where a name is used: see team.py), the
# pattern the node agent checks a job's input buckets with
BUCKET_PATTERN = BUCKET_RE.pattern
BucketName = Annotated[str, StringConstraints(pattern=BUCKET_PATTERN)]


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
    BUCKET_PATTERN: "an S3 bucket name of 3 to 63 lowercase letters, digits, '.' and '-' (a letter or digit first and "
    "last), such as my-team-datasets",
}


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
