"""How the agent's AWS clients call: botocore's retries and S3 transfers' part size and concurrency."""

from __future__ import annotations

from boto3.s3.transfer import TransferConfig
from botocore.config import Config

# 16 MiB parts, 8 in flight: S3 serves ~85-90 MB/s per connection (AWS: 8-16 MB requests, one per 85-90 MB/s),
# so a 100 MiB checkpoint goes out over 7 connections instead of 2 (benchmarks/RESULTS.md, items 3 and 4).
# botocore's standard retry mode (S3 SlowDown, 5xx, throttling, connection errors; back-off capped at 20 s) with
# 8 attempts instead of its default 3: a brownout of half a minute or so is ridden out instead of raising out of
# the agent, which would leave an idle instance behind.
RETRIES = Config(retries={"mode": "standard", "total_max_attempts": 8})
# Every call names the node in its User-Agent (CloudTrail's userAgent; the emulated cloud's requests.json counts
# calls per node by it: emulator/request_counts.py).
NODE_USER_AGENT = "spot-training-node/{instance_id}"
TRANSFER = TransferConfig(multipart_threshold=16 * 2**20, multipart_chunksize=16 * 2**20, max_concurrency=8)


def client_config(instance_id: str) -> Config:
    """The agent's client configuration: ``RETRIES``, and the node's id in the User-Agent."""
    return RETRIES.merge(Config(user_agent_extra=NODE_USER_AGENT.format(instance_id=instance_id)))
