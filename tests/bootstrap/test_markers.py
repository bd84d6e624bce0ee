"""Job markers (``STOP``, ``DONE``, ``nodes/<id>/leaving`` ...) read the way real S3 answers a least-privilege role.

The node role's ListBucket carries an ``s3:prefix`` condition, and the budget guard's is limited to the clusters'
prefixes. S3 answers a GetObject of a missing key with 403 AccessDenied, not 404, to a caller without an
unconditional ListBucket; moto always answers 404. ``Forbidding`` makes moto answer as S3 would: a reader that
took "no such key" for "no marker" failed every poll and every boot on AWS while it passed here.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError
from spot_training.agent.code_fetch import download_code
from spot_training.agent.errors import AgentError
from spot_training.protocol import read_marker

from .conftest import Cluster
from .test_agent_notice import Imds, agent_for, run


class Forbidding:
    """An S3 client whose GetObject of a missing key raises AccessDenied (403), as S3 does without ListBucket."""

    def __init__(self, s3: Any) -> None:
        self.s3 = s3

    def get_object(self, **kwargs: Any) -> Any:
        try:
            return self.s3.get_object(**kwargs)
        except self.s3.exceptions.NoSuchKey:
            error = {"Error": {"Code": "AccessDenied", "Message": "Access Denied"}, "ResponseMetadata": {}}
            raise ClientError(error, "GetObject") from None

    def download_file(self, bucket: str, key: str, *args: Any, **kwargs: Any) -> Any:
        try:  # the transfer manager's HeadObject first: a bare 403 for a missing key
            self.s3.head_object(Bucket=bucket, Key=key)
        except ClientError:
            raise ClientError({"Error": {"Code": "403", "Message": "Forbidden"}}, "HeadObject") from None
        return self.s3.download_file(bucket, key, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.s3, name)


@pytest.fixture
def cluster(make_cluster: Any) -> Cluster:
    c: Cluster = make_cluster(nodes=1)
    c.submit("job-m", {"train.py": ""}, "python train.py")
    return c


def test_the_agent_reads_missing_markers_as_none_where_s3_answers_403(cluster: Cluster) -> None:
    agent, job, _ = agent_for(cluster)
    agent.node.s3 = Forbidding(agent.node.s3)
    assert agent.markers.marker(job, "STOP") is None
    agent.markers.put_marker(job, "STOPPED", {"by": "test"})
    assert agent.markers.marker(job, "STOP") is None  # "STOP" prefixes "STOPPED": not the same marker
    assert (agent.markers.marker(job, "STOPPED") or {}).get("by") == "test"


@pytest.mark.parametrize("body", [b"", b"stop please", b"null", b"[1]"])
def test_a_marker_that_is_not_a_json_object_is_there_all_the_same(
    cluster: Cluster, tmp_path: Path, body: bytes
) -> None:
    """A STOP written by hand (``aws s3 cp /dev/null s3://.../STOP``) is a stop all the same: its JSON error must not
    escape the trainer's poll loop (the trainer would be SIGKILLed without its emergency checkpoint and the job end
    FAILED, "node agent error: JSONDecodeError"), and a ``null`` body is a marker too."""
    agent, job, lines = agent_for(cluster)
    key = job.job_prefix + "STOP"
    cluster.aws.s3.put_object(Bucket=cluster.bucket, Key=key, Body=body)
    assert agent.markers.marker(job, "STOP") == {} and agent.markers.marked(job, "STOP")
    cluster.aws.s3.delete_object(Bucket=cluster.bucket, Key=key)
    agent.node.imds = Imds()  # no spot notice: the STOP alone stops the trainer

    def stop_once_the_trainer_handles_sigterm() -> None:  # earlier, SIGTERM would find Python's default handler
        for _ in range(400):  # bounded: 20 s
            if (tmp_path / "saved.ready").exists():
                break
            time.sleep(0.05)
        cluster.aws.s3.put_object(Bucket=cluster.bucket, Key=key, Body=body)

    writer = threading.Thread(target=stop_once_the_trainer_handles_sigterm, daemon=True)
    writer.start()
    rc, interrupted, saved = run(agent, job, tmp_path, seconds=60)
    writer.join(30)
    assert (rc, interrupted, agent.trainer.stop_requested) == (143, True, True)
    assert saved.read_text() == "saved"  # SIGTERM: the emergency checkpoint, not a SIGKILL
    assert any("sending SIGTERM to the trainer" in line for line in lines), lines


def test_a_missing_code_object_is_named_as_missing_where_s3_answers_403(cluster: Cluster, tmp_path: Path) -> None:
    agent, job, _ = agent_for(cluster)
    s3 = Forbidding(agent.node.s3)
    assert download_code(s3, job, str(tmp_path))  # there: downloaded and unpacked
    cluster.aws.s3.delete_object(Bucket=cluster.bucket, Key=job.code_key)
    with pytest.raises(AgentError) as refused:
        download_code(s3, job, str(tmp_path))
    assert str(refused.value) == f"code object s3://{job.bucket}/{job.code_key} does not exist"  # not "... 403"


def test_missing_job_markers_read_as_none_where_s3_answers_403(cluster: Cluster) -> None:
    s3, prefix = Forbidding(cluster.aws.s3), f"{cluster.name}/job-m/"
    assert read_marker(s3, cluster.bucket, prefix + "DONE") is None
    s3.put_object(Bucket=cluster.bucket, Key=prefix + "DONE-not", Body=b"{}")
    assert read_marker(s3, cluster.bucket, prefix + "DONE") is None
    s3.put_object(Bucket=cluster.bucket, Key=prefix + "DONE", Body=json.dumps({"step": 7}).encode())
    assert read_marker(s3, cluster.bucket, prefix + "DONE") == {"step": 7}
