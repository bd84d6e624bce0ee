"""``trainctl submit --resume-from JOB``: a new job starts from an ended job's newest intact checkpoint.

The checkpoints are written and read back by the node agent's own CheckpointStore, against moto on loopback:
the copy must be one the agent restores (its sha256 checks and its rule that a manifest belongs to the job).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError
from spot_training.agent.checkpoint_store import CheckpointStore
from spot_training.protocol import MANIFEST

from trainctl import jobs
from trainctl.cli import _client_factory as client_factory
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


@pytest.mark.parametrize("source", ["failed", "unfinished"])
def test_the_new_job_restores_the_newest_intact_checkpoint_and_the_earlier_job_is_untouched(
    make_cluster: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str], source: str
) -> None:
    """``failed``: ended with FAILED, group at 0. ``unfinished``: no end marker (its nodes went without writing
    one), another job is current, the group at 0: nothing writes its checkpoints any more either."""
    cluster: Cluster = make_cluster(nodes=1)
    if source == "failed":
        ended(cluster, EARLIER)
    else:
        cluster.submit(EARLIER, {"train.py": "print('x')\n"}, "python train.py")
        ended(cluster, "other-run", "DONE")
        assert jobs.job_state(client_factory(None), jobs.find_cluster(client_factory(None), TEAM, cluster.name),
                              EARLIER) == "UNFINISHED"  # fmt: skip
    for step in (5, 10, 20):
        save(cluster, tmp_path, EARLIER, step, {"model.pt": b"%d" % step * 1000, "opt/state.pt": b"opt %d" % step})
    cut = f"{cluster.name}/{EARLIER}/ckpt/20/model.pt"  # its object cut short after the manifest was written
    cluster.aws.s3.put_object(Bucket=cluster.bucket, Key=cut, Body=b"20")
    cluster.aws.s3.put_object(Bucket=cluster.bucket, Key=f"{cluster.name}/{EARLIER}/ckpt/30/model.pt", Body=b"30")
    before = objects(cluster, f"{cluster.name}/{EARLIER}/")

    rc, err = submit(capsys, cluster, tmp_path, "--job-id", "second-run", "--resume-from", EARLIER)

    assert (rc, err) == (0, f"job second-run starts from checkpoint 10 of {EARLIER} (copied: 10, 5)\n")
    assert objects(cluster, f"{cluster.name}/{EARLIER}/") == before
    current = json.loads(cluster.aws.ssm.get_parameter(Name=cluster.current_parameter)["Parameter"]["Value"])
    assert current["job_id"] == "second-run" and cluster.desired_capacity() == 1
    manifest = json.loads(objects(cluster, f"{cluster.name}/second-run/ckpt/10/{MANIFEST}").popitem()[1])
    assert (manifest["job_id"], manifest["resumed_from"]) == ("second-run", {"job_id": EARLIER, "step": 10})
    assert store(cluster, "second-run").complete_steps() == [10, 5]
    dest = tmp_path / "node-checkpoints"
    dest.mkdir()
    assert store(cluster, "second-run").restore_newest(str(dest)) == (10, "step")
    assert (dest / "10" / "model.pt").read_bytes() == b"10" * 1000
    assert (dest / "10" / "opt" / "state.pt").read_bytes() == b"opt 10"

    # A copy that is bad in a way sizes do not show: the agent falls back to the older copy, not to a fresh start.
    flipped = f"{cluster.name}/second-run/ckpt/10/model.pt"
    cluster.aws.s3.put_object(Bucket=cluster.bucket, Key=flipped, Body=b"01" * 1000)
    other = tmp_path / "another-node"
    other.mkdir()
    assert store(cluster, "second-run").restore_newest(str(other)) == (5, "step")
    assert (other / "5" / "model.pt").read_bytes() == b"5" * 1000


def started(cluster: Cluster, tmp_path: Path, case: str) -> None:
    """The earlier job as each refusal case needs it (the group has one instance, desired capacity 1, unless the
    case puts it at 0)."""
    if case in ("running", "stopping", "failed, node up"):  # the current job; its node still in the group
        cluster.submit(EARLIER, {"train.py": "print('x')\n"}, "python train.py")
        save(cluster, tmp_path, EARLIER, 10, {"model.pt": b"ten"})
        if case != "running":
            key = f"{cluster.name}/{EARLIER}/{'STOP' if case == 'stopping' else 'FAILED'}"
            cluster.aws.s3.put_object(Bucket=cluster.bucket, Key=key, Body=b"{}")
    elif case in ("no checkpoint", "itself", "bad code"):
        ended(cluster, EARLIER)
        save(cluster, tmp_path, EARLIER, 10, {"model.pt": b"ten"})
        if case == "no checkpoint":  # only its manifest is left: no object of it is there
            key = f"{cluster.name}/{EARLIER}/ckpt/10/model.pt"
            cluster.aws.s3.delete_object(Bucket=cluster.bucket, Key=key)
    else:
        cluster.aws.asg.set_desired_capacity(AutoScalingGroupName=cluster.group, DesiredCapacity=0)
        if case == "leftover":  # objects under the new job's prefix, no code archive (a submit cut off halfway)
            key = f"{cluster.name}/second-run/ckpt/3/model.pt"
            cluster.aws.s3.put_object(Bucket=cluster.bucket, Key=key, Body=b"3")


@pytest.mark.parametrize(
    ("case", "extra", "message"),
    [
        ("unknown", (), "--resume-from first-run: no such job on team-a/{cluster} (see 'trainctl list')"),
        ("no checkpoint", (), "--resume-from first-run: the job has no intact checkpoint in "
         "s3://{bucket}/{cluster}/first-run/ckpt/ to resume from"),
        ("running", (), "--resume-from first-run: it still runs and writes checkpoints; submit once it has ended "
         "(trainctl status --team team-a --cluster {cluster} first-run)"),
        ("stopping", (), "--resume-from first-run: it still runs and writes checkpoints; submit once it has ended "
         "(trainctl status --team team-a --cluster {cluster} first-run)"),
        ("itself", ("--job-id", EARLIER), "job first-run already exists on team-a/{cluster}; choose another "
         "--job-id (to go on from its checkpoint: --resume-from first-run)"),
        ("leftover", (), "job second-run already exists on team-a/{cluster}; choose another --job-id (objects of "
         "a submit that did not finish are under s3://{bucket}/{cluster}/second-run/)"),
        ("bad code", ("--code", "/nonexistent"), "code directory /nonexistent does not exist; give the folder that "
         "holds the training script"),
    ],
)  # fmt: skip
def test_a_job_that_cannot_resume_is_refused_before_anything_is_written(
    make_cluster: Any,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    case: str,
    extra: tuple[str, ...],
    message: str,
) -> None:
    cluster: Cluster = make_cluster(nodes=1)
    started(cluster, tmp_path, case)
    before = objects(cluster, "")
    parameter = cluster.aws.ssm.get_parameters(Names=[cluster.current_parameter])["Parameters"]
    desired = cluster.desired_capacity()

    rc, err = submit(capsys, cluster, tmp_path, "--job-id", "second-run", "--resume-from", EARLIER, *extra)

    shown = message.format(cluster=cluster.name, bucket=cluster.bucket)
    assert (rc, err) == (2, f"trainctl: error: {shown}\n")
    assert objects(cluster, "") == before
    assert cluster.aws.ssm.get_parameters(Names=[cluster.current_parameter])["Parameters"] == parameter
    assert cluster.desired_capacity() == desired


def test_resuming_from_a_failed_job_whose_node_is_still_up_queues_the_new_job_with_its_checkpoints(
    make_cluster: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A FAILED job writes nothing more: its checkpoints are copied now, and the new job goes through the queue,
    which hands it the cluster at once (the current job has ended): the node still up goes on to it."""
    cluster: Cluster = make_cluster(nodes=1)
    started(cluster, tmp_path, "failed, node up")
    parameter = cluster.aws.ssm.get_parameters(Names=[cluster.current_parameter])["Parameters"]

    rc, err = submit(capsys, cluster, tmp_path, "--job-id", "second-run", "--resume-from", EARLIER)

    assert rc == 0, err
    assert "job second-run starts from checkpoint 10 of first-run (copied: 10)" in err
    queued = cluster.aws.s3.list_objects_v2(Bucket=cluster.bucket, Prefix=f"{cluster.name}/queue/")
    assert queued.get("Contents", []) == []  # taken from the queue at once
    handed = cluster.aws.s3.get_object(Bucket=cluster.bucket, Key=f"{cluster.name}/{EARLIER}/NEXT")
    assert json.loads(handed["Body"].read())["job"]["job_id"] == "second-run"
    copied = cluster.aws.s3.get_object(Bucket=cluster.bucket, Key=f"{cluster.name}/second-run/ckpt/10/model.pt")
    assert copied["Body"].read() == b"ten"
    now = cluster.aws.ssm.get_parameters(Names=[cluster.current_parameter])["Parameters"]
    assert json.loads(now[0]["Value"])["job_id"] == "second-run" and now != parameter
    assert cluster.desired_capacity() == 1  # the failed job's node goes on to it: nothing scaled


class Fails:
    """An S3 client whose ``fail_at``-th copy, or PutObject of a code archive, is answered SlowDown."""

    def __init__(self, s3: Any, fail_at: int) -> None:
        self.s3, self.fail_at, self.copies = s3, fail_at, 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.s3, name)

    def slow_down(self, operation: str) -> ClientError:
        return ClientError({"Error": {"Code": "SlowDown", "Message": "Please reduce your request rate."}}, operation)

    def copy(self, *args: Any, **kwargs: Any) -> Any:
        self.copies += 1
        if self.copies == self.fail_at:
            raise self.slow_down("CopyObject")
        return self.s3.copy(*args, **kwargs)

    def put_object(self, **kwargs: Any) -> Any:
        if "/code/" in kwargs["Key"]:
            raise self.slow_down("PutObject")
        return self.s3.put_object(**kwargs)


@pytest.mark.parametrize("fail_at", [3, 0])  # the third copy (the second checkpoint's first file); the code upload
def test_a_submit_that_fails_after_copying_takes_the_copies_back(
    make_cluster: Any, tmp_path: Path, fail_at: int
) -> None:
    """No job without its code: copies left behind would be billed, unlisted, and would block the job id."""
    cluster: Cluster = make_cluster(nodes=1)
    ended(cluster, EARLIER)
    for step in (10, 20):
        save(cluster, tmp_path, EARLIER, step, {"model.pt": b"%d" % step, "opt.pt": b"opt"})
    before = objects(cluster, "")
    real = client_factory(None)

    def client(service: str) -> Any:
        return Fails(real("s3"), fail_at) if service == "s3" else real(service)

    ref = jobs.find_cluster(client, TEAM, cluster.name)
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "train.py").write_text("print('x')\n")
    with pytest.raises(ClientError, match="SlowDown"):
        jobs.submit(client, ref, tmp_path / "code", command="python train.py", nodes=1, resume_from=EARLIER)
    assert objects(cluster, "") == before
    assert cluster.desired_capacity() == 0
