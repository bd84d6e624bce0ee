"""The S3 contract (``spot_training/protocol.py``): the layout its key builders make, and the one check of a
checkpoint's manifest that the agent's verified download and ``trainctl submit --resume-from`` both make."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
from spot_training import protocol
from spot_training.agent.checkpoint_download import CheckpointDownload
from spot_training.agent.errors import AgentError

from trainctl.checkpoints import intact_manifest

from .conftest import Clients


def test_the_key_builders_make_the_documented_layout() -> None:
    cluster = protocol.cluster_prefix("main")
    job = protocol.job_prefix(cluster, "job-1")
    checkpoints = protocol.checkpoints_prefix(job)
    assert (cluster, job, checkpoints) == ("main/", "main/job-1/", "main/job-1/ckpt/")
    assert protocol.checkpoint_prefix(checkpoints, 20) == "main/job-1/ckpt/20/"
    assert protocol.manifest_key(checkpoints, 20) == "main/job-1/ckpt/20/spot-training-manifest.json"
    assert protocol.checkpoint_object(checkpoints, "main/job-1/ckpt/20/opt/state.pt") == ("20", "opt/state.pt")
    assert protocol.nodes_prefix(job) == "main/job-1/nodes/"
    assert job + protocol.node_marker("i-0abc", protocol.LEAVING_MARKER) == "main/job-1/nodes/i-0abc/leaving"
    assert protocol.node_object("main/job-1/nodes/", "main/job-1/nodes/i-0abc/ready") == ("i-0abc", "ready")
    assert protocol.code_prefix(cluster) == "main/code/"
    assert protocol.code_key(cluster, "job-1") == "main/code/job-1.tar.gz"
    assert [job + m for m in (protocol.STOP, *protocol.END_MARKERS)] == [
        "main/job-1/STOP",
        "main/job-1/DONE",
        "main/job-1/FAILED",
        "main/job-1/STOPPED",
    ]
    assert sorted(protocol.NODE_MARKERS) == [
        "boot",
        "done",
        "leaving",
        "membership",
        "progress",
        "ready",
        "save-request",
        "state",
        "synced",
        "training",
    ]
    assert set(protocol.END_OF_TRAINING) | set(protocol.RUN_MARKERS) <= set(protocol.NODE_MARKERS)


OBJECTS = {"model.pt": b"weights", "opt/state.pt": b"optimizer"}
INTACT = {rel: {"size": len(body), "sha256": "-"} for rel, body in OBJECTS.items()}


@pytest.mark.parametrize(
    ("files", "fault"),
    [
        (INTACT, None),
        ({**INTACT, "gone.pt": {"size": 1}}, "object gone.pt is missing or has the wrong size"),
        ({**INTACT, "model.pt": {"size": 8}}, "object model.pt is missing or has the wrong size"),
        ({**INTACT, "model.pt": {"size": 7.0}}, "object model.pt is missing or has the wrong size"),
        ({**INTACT, "model.pt": 7}, "object model.pt is missing or has the wrong size"),
        ({**INTACT, "../model.pt": {"size": 7}}, "manifest lists an unsafe name '../model.pt'"),
        ({**INTACT, "/model.pt": {"size": 7}}, "manifest lists an unsafe name '/model.pt'"),
        ({**INTACT, protocol.MANIFEST: {"size": 7}}, f"manifest lists an unsafe name {protocol.MANIFEST!r}"),
    ],
)
def test_the_agent_and_trainctl_judge_a_checkpoint_by_the_same_check(
    aws: Clients, files: dict[str, Any], fault: str | None
) -> None:
    """The agent refuses what ``trainctl submit --resume-from`` does not copy, with the check's reason."""
    bucket = f"ckpt-{uuid.uuid4().hex[:10]}"
    aws.s3.create_bucket(Bucket=bucket)
    checkpoints = protocol.checkpoints_prefix(protocol.job_prefix("c/", "job-a"))
    base = protocol.checkpoint_prefix(checkpoints, 20)
    for rel, body in OBJECTS.items():
        aws.s3.put_object(Bucket=bucket, Key=base + rel, Body=body)
    manifest = protocol.new_manifest("job-a", 20, "step", 0.0, files)
    aws.s3.put_object(Bucket=bucket, Key=protocol.manifest_key(checkpoints, 20), Body=json.dumps(manifest))
    sizes = {rel: len(body) for rel, body in OBJECTS.items()}
    sizes[protocol.MANIFEST] = len(json.dumps(manifest))

    assert protocol.manifest_fault(files, sizes) == fault
    download = CheckpointDownload(aws.s3, bucket, checkpoints, "job-a")
    if fault is None:
        assert download.manifest(20, sizes) == manifest
        assert intact_manifest(aws.s3, bucket, base) == manifest
    else:
        with pytest.raises(AgentError) as refused:
            download.manifest(20, sizes)
        assert str(refused.value) == f"checkpoint 20: {fault}"
        assert intact_manifest(aws.s3, bucket, base) is None
