"""``trainctl submit --resume-from JOB``: a new job starts from an ended job's newest intact checkpoint.

The checkpoints are written and read back by the node agent's own CheckpointStore, against moto on loopback:
the copy must be one the agent restores (its sha256 checks and its rule that a manifest belongs to the job).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from node_agent import MANIFEST, CheckpointStore

from trainctl.cli import main as trainctl_main

from .conftest import TEAM, Cluster

EARLIER = "first-run"


def store(cluster: Cluster, job_id: str) -> CheckpointStore:
    lines: list[str] = []
    return CheckpointStore(cluster.aws.s3, cluster.bucket, f"{cluster.name}/{job_id}/ckpt/", job_id, lines.append)


def save(cluster: Cluster, tmp_path: Path, job_id: str, step: int, files: dict[str, bytes]) -> None:
    src = tmp_path / f"{job_id}-{step}"
    for rel, data in files.items():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_bytes(data)
    store(cluster, job_id).upload(step, {rel: str(src / rel) for rel in files}, "step")


def objects(cluster: Cluster, prefix: str) -> dict[str, bytes]:
    s3 = cluster.aws.s3
    found = s3.list_objects_v2(Bucket=cluster.bucket, Prefix=prefix).get("Contents", [])
    return {o["Key"]: s3.get_object(Bucket=cluster.bucket, Key=o["Key"])["Body"].read() for o in found}


def ended(cluster: Cluster, job_id: str, marker: str = "FAILED") -> None:
    """A job that was submitted and ended (``marker`` as the node agent writes it); the group is at 0."""
    cluster.submit(job_id, {"train.py": "print('x')\n"}, "python train.py")
    body = json.dumps({"reason": "restore: S3 did not answer", "time": 0})
    cluster.aws.s3.put_object(Bucket=cluster.bucket, Key=f"{cluster.name}/{job_id}/{marker}", Body=body)
    cluster.aws.asg.set_desired_capacity(AutoScalingGroupName=cluster.group, DesiredCapacity=0)


def submit(capsys: pytest.CaptureFixture[str], cluster: Cluster, tmp_path: Path, *extra: str) -> tuple[int, str]:
    code = tmp_path / "code"
    code.mkdir(exist_ok=True)
    (code / "train.py").write_text("print('training')\n")
    argv = ["submit", "--team", TEAM, "--cluster", cluster.name, "--code", str(code), "--nodes", "1", *extra]
    rc = trainctl_main(argv)
    return rc, capsys.readouterr().err


def test_the_new_job_restores_the_newest_intact_checkpoint_and_the_earlier_job_is_untouched(
    make_cluster: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cluster: Cluster = make_cluster(nodes=1)
    ended(cluster, EARLIER)
    save(cluster, tmp_path, EARLIER, 10, {"model.pt": b"ten" * 1000, "opt/state.pt": b"optimizer ten"})
    save(cluster, tmp_path, EARLIER, 20, {"model.pt": b"twenty" * 1000, "opt/state.pt": b"optimizer twenty"})
    cut = f"{cluster.name}/{EARLIER}/ckpt/20/model.pt"  # its object cut short after the manifest was written
    cluster.aws.s3.put_object(Bucket=cluster.bucket, Key=cut, Body=b"twen")
    cluster.aws.s3.put_object(Bucket=cluster.bucket, Key=f"{cluster.name}/{EARLIER}/ckpt/30/model.pt", Body=b"30")
    before = objects(cluster, f"{cluster.name}/{EARLIER}/")

    rc, err = submit(capsys, cluster, tmp_path, "--job-id", "second-run", "--resume-from", EARLIER)

    assert (rc, err) == (0, "")
    assert objects(cluster, f"{cluster.name}/{EARLIER}/") == before
    current = json.loads(cluster.aws.ssm.get_parameter(Name=cluster.current_parameter)["Parameter"]["Value"])
    assert current["job_id"] == "second-run" and cluster.desired_capacity() == 1
    manifest = json.loads(objects(cluster, f"{cluster.name}/second-run/ckpt/10/{MANIFEST}").popitem()[1])
    assert (manifest["job_id"], manifest["resumed_from"]) == ("second-run", {"job_id": EARLIER, "step": 10})
    dest = tmp_path / "node-checkpoints"
    dest.mkdir()
    assert store(cluster, "second-run").restore_newest(str(dest)) == (10, "step")
    assert (dest / "10" / "model.pt").read_bytes() == b"ten" * 1000
    assert (dest / "10" / "opt" / "state.pt").read_bytes() == b"optimizer ten"


@pytest.mark.parametrize(
    ("case", "job_id", "message"),
    [
        ("unknown", "second-run", "--resume-from first-run: no such job on team-a/{cluster} (see 'trainctl list')"),
        (
            "no checkpoint",
            "second-run",
            "--resume-from first-run: the job has no complete checkpoint in s3://{bucket}/{cluster}/first-run/ckpt/ "
            "to resume from",
        ),
        (
            "running",
            "second-run",
            "--resume-from first-run: that job is RUNNING; stop it first (trainctl stop first-run), its nodes save "
            "a final checkpoint",
        ),
        ("itself", EARLIER, "job first-run already exists on team-a/{cluster}; choose another --job-id "
         "(to go on from its checkpoint: --resume-from first-run)"),
    ],
)  # fmt: skip
def test_a_job_that_cannot_resume_is_refused_before_anything_is_written(
    make_cluster: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str, job_id: str, message: str
) -> None:
    cluster: Cluster = make_cluster(nodes=1)
    if case == "running":  # the current job, group scaled up, no end marker
        cluster.submit(EARLIER, {"train.py": "print('x')\n"}, "python train.py")
        save(cluster, tmp_path, EARLIER, 10, {"model.pt": b"ten"})
    elif case != "unknown":
        ended(cluster, EARLIER)
        if case == "itself":
            save(cluster, tmp_path, EARLIER, 10, {"model.pt": b"ten"})
    before = objects(cluster, "")
    parameter = cluster.aws.ssm.get_parameters(Names=[cluster.current_parameter])["Parameters"]
    desired = cluster.desired_capacity()

    rc, err = submit(capsys, cluster, tmp_path, "--job-id", job_id, "--resume-from", EARLIER)

    assert (rc, err) == (2, f"trainctl: error: {message.format(cluster=cluster.name, bucket=cluster.bucket)}\n")
    assert objects(cluster, "") == before
    assert cluster.aws.ssm.get_parameters(Names=[cluster.current_parameter])["Parameters"] == parameter
    assert cluster.desired_capacity() == desired
