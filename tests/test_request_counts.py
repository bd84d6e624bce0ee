"""The emulated cloud's request counts (emulator/request_counts.py): real boto3 calls against moto served in a thread
are counted by service, action and caller, and written to requests.json."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.config import Config

from emulator import http_serving
from emulator.request_counts import OTHER_CALLER, RequestCounts, s3_action

REGION = "us-east-1"


@pytest.fixture
def counted(tmp_path: Path) -> Iterator[tuple[str, RequestCounts]]:
    counts = RequestCounts(tmp_path / "requests.json", flush_every_s=0.05)
    counts.start()
    with http_serving.moto_in_thread(counts=counts) as url:
        yield url, counts
    counts.stop()


def client(url: str, service: str, user_agent_extra: str = "") -> Any:
    return boto3.session.Session().client(
        service,
        endpoint_url=url,
        region_name=REGION,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        config=Config(user_agent_extra=user_agent_extra or None, retries={"max_attempts": 1}),
    )


def test_calls_are_counted_by_service_action_and_caller(counted: tuple[str, RequestCounts]) -> None:
    url, counts = counted
    node = "i-0123456789abcdef0"
    asg = client(url, "autoscaling", f"spot-training-node/{node}")
    for _ in range(3):
        asg.describe_auto_scaling_groups()
    s3 = client(url, "s3", f"spot-training-node/{node}")
    s3.create_bucket(Bucket="bucket-1")
    s3.put_object(Bucket="bucket-1", Key="ckpt/step-1/manifest.json", Body=b"{}")
    s3.get_object(Bucket="bucket-1", Key="ckpt/step-1/manifest.json")
    s3.list_objects_v2(Bucket="bucket-1", Prefix="ckpt/")
    ssm = client(url, "ssm")  # no node token: trainctl, the deploys, the tests
    ssm.put_parameter(Name="/p", Value="v", Type="String")
    client(url, "ec2").describe_instances()

    counts.stop()
    written = json.loads(counts.path.read_text())
    assert written == counts.snapshot() | {"written": written["written"]}
    assert written["by_caller"][node] == {
        "autoscaling:DescribeAutoScalingGroups": 3,
        "s3:CreateBucket": 1,
        "s3:GetObject": 1,
        "s3:ListObjectsV2": 1,
        "s3:PutObject": 1,
    }
    assert written["by_caller"][OTHER_CALLER] == {"ec2:DescribeInstances": 1, "ssm:PutParameter": 1}
    assert written["by_action"]["autoscaling:DescribeAutoScalingGroups"] == 3
    assert written["total"] == 9


def test_the_file_follows_the_requests_while_the_server_runs(counted: tuple[str, RequestCounts]) -> None:
    url, counts = counted
    assert json.loads(counts.path.read_text())["total"] == 0  # written at start
    client(url, "sts").get_caller_identity()
    for _ in range(200):  # the flusher writes every 0.05 s here: bounded wait, about 2 s at most
        if json.loads(counts.path.read_text())["total"] == 1:
            break
        time.sleep(0.01)
    assert json.loads(counts.path.read_text())["by_action"] == {"sts:GetCallerIdentity": 1}


@pytest.mark.parametrize(
    ("method", "path", "query", "action"),
    [
        ("GET", "/b/k", {}, "GetObject"),
        ("HEAD", "/b/k", {}, "HeadObject"),
        ("PUT", "/b/k", {"uploadId": ["u"], "partNumber": ["1"]}, "UploadPart"),
        ("POST", "/b/k", {"uploads": [""]}, "CreateMultipartUpload"),
        ("POST", "/b/k", {"uploadId": ["u"]}, "CompleteMultipartUpload"),
        ("POST", "/b", {"delete": [""]}, "DeleteObjects"),
        ("GET", "/b", {"list-type": ["2"]}, "ListObjectsV2"),
        ("GET", "/b", {"versions": [""]}, "ListObjectVersions"),
        ("DELETE", "/b/k", {}, "DeleteObject"),
        ("PUT", "/b", {}, "CreateBucket"),
    ],
)
def test_s3_rest_requests_are_named_by_their_operation(method: str, path: str, query: dict, action: str) -> None:
    assert s3_action(method, path, query) == action
