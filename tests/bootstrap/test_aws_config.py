"""The node agent's AWS client configuration (agent/aws_config.py): its calls name the node in their User-Agent,
which the emulated cloud's request counts attribute to it (emulator/request_counts.py)."""

from __future__ import annotations

from pathlib import Path

import boto3
from spot_training.agent.aws_config import RETRIES, client_config

from emulator import http_serving
from emulator.request_counts import RequestCounts


def test_every_call_names_the_node_and_keeps_the_agents_retries(tmp_path: Path) -> None:
    config = client_config("i-0abc")
    assert config.retries == RETRIES.retries == {"mode": "standard", "total_max_attempts": 8}
    counts = RequestCounts(tmp_path / "requests.json")
    with http_serving.moto_in_thread(counts=counts) as url:
        asg = boto3.session.Session().client(
            "autoscaling",
            endpoint_url=url,
            region_name="us-east-1",
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
            config=config,
        )
        asg.describe_auto_scaling_groups()
    assert counts.snapshot()["by_caller"] == {"i-0abc": {"autoscaling:DescribeAutoScalingGroups": 1}}
