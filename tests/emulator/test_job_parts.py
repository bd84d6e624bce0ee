"""A job's setup, env, secrets and inputs on the emulated cloud (issue 38), end to end.

A team whose one-node cluster has a warm pool of one volume, and whose team file lists a data bucket, is deployed;
the nodes run with their instance role's credentials under moto's IAM enforcement. The job is a job file submitted
with ``trainctl submit job.yaml``: its setup installs a wheel from a wheelhouse inside the code archive into a
virtual environment in its cache directory; it has an env value, one SSM SecureString secret under the team's
prefix and one S3 input from the data bucket. It trains the example
through a spot notice to DONE; the replacement claims the same volume (the emulator gives each volume a directory:
``SPOT_TRAINING_WARM_VOLUME_DIRS``), and its log says the setup was skipped and the input kept.

The secret's value is planted (unique): afterwards every artifact of the job is searched for it (every S3 object of
the emulated cloud, every CloudWatch Logs event, the clusters' SSM parameters, every file of the run directory
(consoles, node roots, the server's log), ``trainctl status`` and ``trainctl logs``); it is found nowhere, while the
sha256 the trainer printed from its environment matches it.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from bootstrap_scripts.spot_training.protocol import DONE, FAILED
from emulator import EmulatedCloud
from emulator.demo import EXAMPLE_DIR, NODE_ENV, JobRun, interrupt_once
from emulator.deploy import bootstrap, deploy
from emulator.nodes import NodeLauncher
from tests.emulator.user_environment import use_emulator_exports
from tests.wheelhouse import IMPORT_FROM_SETUP, WHEEL_VALUE, wheel_files
from trainctl import jobs
from trainctl.cli import main as trainctl_main

pytestmark = pytest.mark.slow

TEAM, CLUSTER = "jobparts", "main"
DATA_BUCKET = f"jobparts-data-{uuid.uuid4().hex[:8]}"  # the team file's data_buckets
# The example's trainer, after it proves what it got: the wheel from the setup's venv, the env value, the input's
# content, and the sha256 of the secret (never the secret itself).
TRAIN = (
    IMPORT_FROM_SETUP
    + """import hashlib, os, runpy, sys
data = os.environ.get("SPOT_TRAINING_NODE_ROOT", "") + "/data/digits"
print("job parts: greeting", os.environ["GREETING"], "wheel", tinypkg.VALUE, "input", open(data + "/part-0.txt").read())
print("job parts: token sha256", hashlib.sha256(os.environ["HF_TOKEN"].encode()).hexdigest())
sys.argv = ["train.py"] + sys.argv[1:]
runpy.run_path("train.py", run_name="__main__")
"""
)


@pytest.fixture(scope="module")
def cloud(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmulatedCloud]:
    run_dir = tmp_path_factory.mktemp("job-parts")
    with EmulatedCloud(run_dir=run_dir, iam_enforcement=True) as c:
        ec2 = c.client("ec2")
        source = ec2.create_volume(AvailabilityZone=f"{c.region}a", Size=8)
        cluster = {
            "name": CLUSTER,
            "instance_types": ["g5.xlarge", "g5.2xlarge"],
            "min_nodes": 1,
            "desired_nodes": 1,
            "max_nodes": 1,
            "warm_pool": {
                "size": 1,
                "snapshot_id": ec2.create_snapshot(VolumeId=source["VolumeId"])["SnapshotId"],
                "volume_size_gib": 8,
                "removal_policy": "destroy",
            },
            "ami": {"image_id": ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]},
        }
        teams_dir = run_dir / "teams"
        teams_dir.mkdir()
        team = {"data_buckets": [DATA_BUCKET], "clusters": [cluster]}
        (teams_dir / f"{TEAM}.yaml").write_text(yaml.safe_dump(team))
        bootstrap(c)
        deploy(c, f"TrainingStack-{TEAM}", context={"teams_dir": str(teams_dir)})
        c.use_admin_user()  # the harness's calls keep working under IAM enforcement; the nodes' are their role's
        yield c


@pytest.fixture(scope="module")
def run(cloud: EmulatedCloud) -> dict[str, Any]:
    """The job run through a spot notice to DONE: its ids, the planted secret, the replacement."""
    assert cloud.run_dir is not None
    client = cloud.client
    client("s3").create_bucket(Bucket=DATA_BUCKET)
    client("s3").put_object(Bucket=DATA_BUCKET, Key="digits/part-0.txt", Body=b"rows 0-1399")
    secret = f"planted-{uuid.uuid4().hex}"
    parameter = f"/spot-training-secrets/{TEAM}/digits/hf-token"
    client("ssm").put_parameter(Name=parameter, Value=secret, Type="SecureString")
    code = cloud.run_dir / "code"
    shutil.copytree(EXAMPLE_DIR, code)
    for name, body in wheel_files().items():
        (code / name).parent.mkdir(parents=True, exist_ok=True)
        (code / name).write_bytes(body)
    (code / "train_parts.py").write_text(TRAIN)
    ref = jobs.find_cluster(client, TEAM, CLUSTER)
    launcher = NodeLauncher(
        cloud, cloud.run_dir / "nodes", groups=[ref.group], node_env=NODE_ENV, instance_credentials=True
    )
    with launcher, enforced(cloud):  # the launcher assumes the node role before enforcement goes on
        job_id = submit_job_file(cloud, code, parameter)
        job = JobRun(client, ref, job_id, launcher, time.monotonic() + 480, lambda _: None)
        interrupt_once(8)(job)
        markers = (DONE, FAILED)
        job.wait_for(lambda: any(jobs.marker(client, ref, job_id, m) for m in markers), f"job {job_id} to end")
        job.wait_for(lambda: not launcher.running(), "every node shut down")
        nodes = [n.instance_id for n in sorted(launcher.all_nodes(), key=lambda n: n.booted_at)]
    return {
        "ref": ref,
        "job_id": job_id,
        "secret": secret,
        "nodes": nodes,
        "failed": jobs.marker(client, ref, job_id, FAILED),
    }


def submit_job_file(cloud: EmulatedCloud, code: Path, parameter: str) -> str:
    """``trainctl submit job.yaml``, the job file in the code directory, as a user runs it (the emulator's
    exports in the environment); the job's id."""
    job_id = f"parts-{uuid.uuid4().hex[:8]}"
    job = {
        "team": TEAM,
        "cluster": CLUSTER,
        "job_id": job_id,
        "nodes": 1,
        "command": "python train_parts.py --epochs 3 --seed 0 --step-sleep-s 0.1",
        "python": sys.executable,  # the environment with torch (on an AMI: the job spec's /opt/pytorch/...)
        "checkpoint_interval_s": 2.0,
        "setup": "setup.sh",
        "env": {"GREETING": "hello"},
        "secrets": {"HF_TOKEN": f"ssm:{parameter}"},
        "inputs": [{"s3": f"s3://{DATA_BUCKET}/digits", "path": "/data/digits"}],
    }
    (code / "job.yaml").write_text(yaml.safe_dump(job))
    with pytest.MonkeyPatch.context() as patch:
        use_emulator_exports(cloud, patch)
        assert trainctl_main(["submit", str(code / "job.yaml")]) == 0
    return job_id


@contextlib.contextmanager
def enforced(cloud: EmulatedCloud) -> Iterator[None]:
    """moto's IAM enforcement on while the block runs: the nodes' calls are checked against their role's policies."""
    cloud.enforce_iam(True)
    try:
        yield
    finally:
        cloud.enforce_iam(False)


def _stream(cloud: EmulatedCloud, run: dict[str, Any], instance_id: str) -> list[str]:
    return [
        msg
        for _, stream, msg in jobs.log_events(cloud.client, run["ref"], run["job_id"])
        if stream.endswith(instance_id)
    ]


def test_the_job_trains_to_done_and_the_replacement_skips_setup_and_download(
    cloud: EmulatedCloud, run: dict[str, Any]
) -> None:
    assert run["failed"] is None
    assert jobs.marker(cloud.client, run["ref"], run["job_id"], DONE) is not None
    first, replacement = run["nodes"]
    first_log, replacement_log = _stream(cloud, run, first), _stream(cloud, run, replacement)
    expected = f"job parts: greeting hello wheel {WHEEL_VALUE} input rows 0-1399"
    assert any(line.endswith(expected) for line in first_log), first_log
    assert any(line.endswith(expected) for line in replacement_log), replacement_log
    assert any("setup: running bash setup.sh" in line for line in first_log)
    assert any(re.search(r"\[setup i-\w+\] Successfully installed tinypkg-1\.0", line) for line in first_log)
    assert any("1 object(s) fetched, 0 kept on the warm volume" in line for line in first_log)
    volumes = {
        m.group(1) for line in first_log + replacement_log if (m := re.search(r"claimed warm volume (vol-\w+)", line))
    }
    assert len(volumes) == 1  # both nodes had the one volume
    assert any("setup: cached on the warm volume" in line and line.endswith("skipped") for line in replacement_log)
    assert not any("setup: running" in line or "[setup " in line for line in replacement_log)
    assert any("0 object(s) fetched, 1 kept on the warm volume, 0 removed" in line for line in replacement_log)
    assert any("resume step: " in line and "none" not in line for line in replacement_log)


def _s3_holding(cloud: EmulatedCloud, value: bytes) -> list[str]:
    s3 = cloud.client("s3")
    found = []
    for bucket in s3.list_buckets()["Buckets"]:
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket["Name"]):
            for item in page.get("Contents", []):
                if value in s3.get_object(Bucket=bucket["Name"], Key=item["Key"])["Body"].read():
                    found.append(f"s3://{bucket['Name']}/{item['Key']}")
    return found


def _logs_holding(cloud: EmulatedCloud, value: str) -> tuple[list[str], int]:
    logs, found, events = cloud.client("logs"), [], 0
    for group in logs.describe_log_groups()["logGroups"]:
        for page in logs.get_paginator("filter_log_events").paginate(logGroupName=group["logGroupName"]):
            events += len(page["events"])
            found += [f"{group['logGroupName']}: {e['message']}" for e in page["events"] if value in e["message"]]
    return found, events


def _files_holding(root: Path, value: bytes) -> tuple[list[str], int]:
    found, files = [], 0
    for folder, _, names in os.walk(root):
        for name in names:
            path = Path(folder) / name
            if path.is_symlink() or not path.is_file():
                continue
            files += 1
            if value in path.read_bytes():
                found.append(str(path))
    return found, files


def test_the_planted_secret_is_nowhere_but_in_the_trainers_environment(
    cloud: EmulatedCloud, run: dict[str, Any], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert cloud.run_dir is not None
    secret, ref, job_id = run["secret"], run["ref"], run["job_id"]
    digest = hashlib.sha256(secret.encode()).hexdigest()
    proof = [
        m for _, _, m in jobs.log_events(cloud.client, ref, job_id) if m.endswith(f"job parts: token sha256 {digest}")
    ]
    assert len(proof) == 2  # each node's trainer had it in its environment
    assert _s3_holding(cloud, secret.encode()) == []
    found, events = _logs_holding(cloud, secret)
    assert found == [] and events > 100
    ssm = cloud.client("ssm")
    parameters = [
        p
        for page in ssm.get_paginator("get_parameters_by_path").paginate(Path="/spot-training/", Recursive=True)
        for p in page["Parameters"]
    ]
    current = [p["Value"] for p in parameters if p["Name"].endswith("/current-job")]
    assert current and "ssm:/spot-training-secrets/" in current[0]  # the name travels, not the value
    assert not [p["Name"] for p in parameters if secret in p["Value"]]
    found_files, files = _files_holding(cloud.run_dir, secret.encode())
    assert found_files == [] and files > 10
    use_emulator_exports(cloud, monkeypatch)
    for argv in (
        ["status", "--team", TEAM, "--cluster", CLUSTER, job_id],
        ["logs", "--team", TEAM, "--cluster", CLUSTER, job_id],
    ):
        assert trainctl_main(argv) == 0
        out = capsys.readouterr()
        assert secret not in out.out + out.err and out.out
