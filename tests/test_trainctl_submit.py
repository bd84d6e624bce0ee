"""``trainctl submit`` refuses, before it uploads or scales anything, a job the node agent would refuse.

The agent checks the job when a node boots; a job it refuses used to leave the group scaled up with every node
idle (and billed). AWS is moto in-process here: no server, no network.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from moto import mock_aws

from team_config.model import JobConfig
from team_config.naming import CLUSTER_TAG, TEAM_TAG, parameter_path
from trainctl.cli import main as trainctl_main

TEAM, CLUSTER, BUCKET, GROUP = "default", "main", "checkpoints", "main-group"
CURRENT = f"{parameter_path(TEAM, CLUSTER)}/current-job"


@pytest.fixture
def aws(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for key, value in {
        "AWS_ACCESS_KEY_ID": "x",
        "AWS_SECRET_ACCESS_KEY": "x",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    with mock_aws():
        ec2 = boto3.client("ec2")
        ec2.create_launch_template(
            LaunchTemplateName="nodes", LaunchTemplateData={"ImageId": "ami-12345678", "InstanceType": "g5.xlarge"}
        )
        boto3.client("autoscaling").create_auto_scaling_group(
            AutoScalingGroupName=GROUP,
            MinSize=0,
            MaxSize=2,
            DesiredCapacity=0,
            LaunchTemplate={"LaunchTemplateName": "nodes"},
            AvailabilityZones=["us-east-1a"],
            Tags=[{"Key": TEAM_TAG, "Value": TEAM}, {"Key": CLUSTER_TAG, "Value": CLUSTER}],
        )
        boto3.client("s3").create_bucket(Bucket=BUCKET)
        job = JobConfig()  # the team file's defaults, as the stack writes them into the job spec
        spec = {
            "version": 1,
            "team": TEAM,
            "cluster": CLUSTER,
            "region": "us-east-1",
            "bucket": BUCKET,
            "prefix": f"{CLUSTER}/",
            "log_group": "/spot-training/default/main",
            "current_job_parameter": CURRENT,
            **job.model_dump(),
            "min_nodes": 1,
            "desired_nodes": 1,
            "max_nodes": 2,
            "warm_pool": None,
        }
        boto3.client("ssm").put_parameter(
            Name=f"{parameter_path(TEAM, CLUSTER)}/job-spec", Value=json.dumps(spec), Type="String"
        )
        yield


def submit(capsys: pytest.CaptureFixture[str], code: Path, *extra: str) -> tuple[int, str]:
    (code / "train.py").write_text("print('training')\n")
    rc = trainctl_main(["submit", "--team", TEAM, "--cluster", CLUSTER, "--code", str(code), "--nodes", "2", *extra])
    return rc, capsys.readouterr().err


def state() -> dict[str, Any]:
    group = boto3.client("autoscaling").describe_auto_scaling_groups(AutoScalingGroupNames=[GROUP])
    objects = boto3.client("s3").list_objects_v2(Bucket=BUCKET).get("Contents", [])
    names = [p["Name"] for p in boto3.client("ssm").describe_parameters()["Parameters"]]
    return {
        "desired": group["AutoScalingGroups"][0]["DesiredCapacity"],
        "objects": len(objects),
        "current job written": CURRENT in names,
    }


@pytest.mark.parametrize(
    ("extra", "reason"),
    [
        (
            ("--command", "python train.py > out.log"),
            "command contains shell syntax '>': it runs without a shell; put the logic in a script",
        ),
        (
            ("--command", "torchrun train.py"),
            "command must be 'python SCRIPT [ARGS]' or 'python -m MODULE [ARGS]', got 'torchrun train.py'",
        ),
        (
            ("--job-id", "My_Job.v2"),
            "job_id must be a DNS label (lowercase letters, digits, '-', at most 63), got 'My_Job.v2'",
        ),
        (("--checkpoint-interval-s", "-5"), "checkpoint_interval_s must be a positive number or null, got -5.0"),
        (("--python", "python3"), "python must be an absolute path, got 'python3'"),
    ],
)
def test_a_job_the_agent_would_refuse_is_refused_before_anything_starts(
    aws: None, capsys: pytest.CaptureFixture[str], tmp_path: Path, extra: tuple[str, ...], reason: str
) -> None:
    rc, err = submit(capsys, tmp_path, *extra)
    assert (rc, err) == (2, f"trainctl: error: the node agent would refuse this job: {reason}\n")
    assert state() == {"desired": 0, "objects": 0, "current job written": False}


def test_a_good_job_is_submitted(aws: None, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    rc, err = submit(capsys, tmp_path, "--command", "python train.py --epochs 3", "--job-id", "run-1")
    assert (rc, err) == (0, "")
    assert state() == {"desired": 2, "objects": 1, "current job written": True}
    current = json.loads(boto3.client("ssm").get_parameter(Name=CURRENT)["Parameter"]["Value"])
    assert (current["job_id"], current["command"], current["nodes"]) == ("run-1", "python train.py --epochs 3", 2)
