"""End to end on the emulated cloud: the demo's flow (smaller), every fact read back from S3 and the AWS APIs.

The real CDK CLI deploys TrainingStack; the group's instances boot as local nodes running their real user data;
one node gets a spot interruption notice; the replacement resumes; the job ends DONE with the group at 0. The
final weights (the last checkpoint in S3) are compared bit for bit with an uninterrupted 2-process run.
"""

from __future__ import annotations

import hashlib
import inspect
import io
import json
import os
import re
import socket
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from emulator import EmulatedCloud
from emulator.demo import EXAMPLE_DIR, NODE_ENV, Summary, run_job
from emulator.deploy import bootstrap, deploy
from emulator.nodes import SHUTDOWN_GRACE_S, NodeLauncher
from tests.emulator.reference import reference_weights
from tests.emulator.user_environment import use_emulator_exports
from trainctl import jobs
from trainctl.cli import main as trainctl_main
from trainctl.prices import load_prices

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
EPOCHS = 4
STEPS_PER_EPOCH = 1400 // 2 // 32  # the example's training split, 2 ranks, batch 32 per rank
MANIFEST = "spot-training-manifest.json"
POLL_S = inspect.signature(NodeLauncher).parameters["poll_s"].default  # the launcher's default


@pytest.fixture(scope="module")
def cloud(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmulatedCloud]:
    run_dir = tmp_path_factory.mktemp("e2e")
    with EmulatedCloud(run_dir=run_dir) as c:
        bootstrap(c)
        yield c


@pytest.fixture(scope="module")
def demo_run(cloud: EmulatedCloud) -> tuple[Summary, jobs.ClusterRef]:
    assert cloud.run_dir is not None
    deploy(cloud, "TrainingStack")
    events: list[str] = []
    return run_job(
        cloud,
        cloud.run_dir / "nodes",
        epochs=EPOCHS,
        step_sleep_s=0.1,
        checkpoint_interval_s=2.0,
        interrupt_after_step=15,
        progress=events.append,
    )


def test_interrupting_the_rendezvous_host_loses_nothing(cloud: EmulatedCloud, demo_run: Any) -> None:
    """The survivor re-discovers its peers, elects a new host and resumes from the emergency checkpoint."""
    assert cloud.run_dir is not None
    summary, ref = run_job(
        cloud,
        cloud.run_dir / "nodes-host",
        epochs=EPOCHS,  # 2 epochs left ~2.5 s of training after the first checkpoint: the notice could come too late
        step_sleep_s=0.1,
        checkpoint_interval_s=2.0,
        interrupt_after_step=10,
        interrupt_host=True,
        progress=lambda _: None,
    )
    assert summary.done and summary.desired_capacity == 0 and summary.nodes_running_after == 0
    # the node the agents themselves named host before the notice is the one taken
    elected = [
        m.group(1)
        for ts, _, msg in jobs.log_events(cloud.client, ref, summary.job_id)
        if (m := re.search(r"; rendezvous host (i-\w+)", msg)) and ts < summary.events[0].at
    ]
    assert elected and set(elected) == {summary.victim}, elected
    assert summary.steps_redone == 0
    assert summary.steps_trained == EPOCHS * STEPS_PER_EPOCH


def test_job_is_done_and_the_group_is_back_at_zero(cloud: EmulatedCloud, demo_run: Any) -> None:
    summary, ref = demo_run
    client = cloud.client
    assert jobs.marker(client, ref, summary.job_id, "DONE") is not None
    assert jobs.marker(client, ref, summary.job_id, "FAILED") is None
    group = cloud.client("autoscaling").describe_auto_scaling_groups(AutoScalingGroupNames=[ref.group])
    assert group["AutoScalingGroups"][0]["DesiredCapacity"] == 0
    assert group["AutoScalingGroups"][0]["Instances"] == []


def test_interrupted_node_was_replaced_and_nothing_was_redone(cloud: EmulatedCloud, demo_run: Any) -> None:
    summary, ref = demo_run
    client = cloud.client
    assert summary.nodes_booted == 3
    assert summary.replacement != summary.victim
    steps = [c.step for c in jobs.checkpoints(client, ref, summary.job_id)]
    assert summary.interrupted_at_step in steps or summary.interrupted_at_step < steps[0]  # pruned if old
    assert summary.resumed_from_step == summary.interrupted_at_step
    assert summary.steps_redone == 0
    assert steps[-1] == summary.steps_trained == EPOCHS * STEPS_PER_EPOCH
    assert summary.final_world_size == 2
    assert summary.final_accuracy > 0.8


def test_every_manifest_points_at_objects_that_verify(cloud: EmulatedCloud, demo_run: Any) -> None:
    summary, ref = demo_run
    s3 = cloud.client("s3")
    prefix = f"{ref.job_prefix(summary.job_id)}ckpt/"
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=ref.bucket, Prefix=prefix).get("Contents", [])]
    manifests = [k for k in keys if k.endswith("/" + MANIFEST)]
    assert manifests
    for key in manifests:
        base = key[: -len(MANIFEST)]
        manifest = json.loads(s3.get_object(Bucket=ref.bucket, Key=key)["Body"].read())
        for rel, meta in manifest["files"].items():
            body = s3.get_object(Bucket=ref.bucket, Key=base + rel)["Body"].read()
            assert len(body) == meta["size"]
            assert hashlib.sha256(body).hexdigest() == meta["sha256"]


def test_final_weights_equal_an_uninterrupted_run_bitwise(cloud: EmulatedCloud, demo_run: Any, tmp_path: Path) -> None:
    summary, ref = demo_run
    s3 = cloud.client("s3")
    final = f"{ref.job_prefix(summary.job_id)}ckpt/{summary.steps_trained}/state.pt"
    state = torch.load(io.BytesIO(s3.get_object(Bucket=ref.bucket, Key=final)["Body"].read()), weights_only=False)

    reference = reference_weights(tmp_path, EPOCHS)
    assert state["step"] == EPOCHS * STEPS_PER_EPOCH
    assert state["model"].keys() == reference.keys()
    assert all(torch.equal(state["model"][k], reference[k]) for k in reference)


def test_no_node_process_or_metadata_port_is_left(demo_run: Any) -> None:
    summary, _ = demo_run
    assert len(summary.nodes) == 3
    for node in summary.nodes:
        assert node.proc.poll() is not None
        with pytest.raises(ProcessLookupError):
            os.killpg(node.proc.pid, 0)  # no process of the node's tree is left
        for entry in Path("/proc").iterdir():  # nor any process working in the node's directories
            try:
                cwd = os.readlink(entry / "cwd")
            except OSError:
                continue
            assert not cwd.startswith(str(node.root)), f"process {entry.name} of {node.instance_id} is left"
        port = int(node.imds_url.rsplit(":", 1)[1])
        with socket.socket() as s:  # its metadata mock no longer listens
            assert s.connect_ex((node.host, port)) != 0


# ---------------------------------------------------------------------------------------------------- trainctl
@pytest.fixture
def aws_env(cloud: EmulatedCloud, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """The environment a user sets from `python -m emulator up`'s exports (and nothing of the real AWS)."""
    return use_emulator_exports(cloud, monkeypatch)


def _trainctl(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = trainctl_main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_trainctl_status_list_and_logs_of_the_demo_job(
    demo_run: Any, aws_env: dict[str, str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    summary, _ = demo_run
    code, out, _ = _trainctl(capsys, "--json", "status", "--cluster", "main", summary.job_id)
    assert code == 0
    info = json.loads(out)
    assert info["state"] == "DONE"
    assert info["last_checkpoint_step"] == summary.steps_trained
    assert info["interruptions"] == 1
    assert info["nodes"] == []
    # The group's capacity is shown for the cluster's current job only; which job that is depends on the tests run
    # before this one (the rendezvous-host and submit tests submit later ones): both cases, whatever ran first (the
    # group is at 0 between tests).
    for current, shown in ((summary.job_id, 0), ("job-submitted-later", None)):
        with monkeypatch.context() as patch:
            patch.setattr("trainctl.status.current_job_id", lambda client, ref, current=current: current)
            code, out, _ = _trainctl(capsys, "--json", "status", "--cluster", "main", summary.job_id)
        assert code == 0
        info = json.loads(out)
        assert (info["state"], info["group_job"], info["desired_capacity"]) == ("DONE", current, shown)
    code, out, _ = _trainctl(capsys, "list", "--cluster", "main")
    assert code == 0
    assert re.search(rf"^{summary.job_id}\s+DONE\s", out, re.MULTILINE)
    code, out, _ = _trainctl(capsys, "logs", "--cluster", "main", summary.job_id, "--node", summary.replacement)
    assert code == 0
    lines = out.splitlines()
    assert lines and all(line.split()[1] == summary.replacement for line in lines)  # only that node's stream
    assert f"resume step: {summary.resumed_from_step}" in out


def test_trainctl_errors_are_one_line(
    cloud: EmulatedCloud, aws_env: dict[str, str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    code, out, err = _trainctl(capsys, "status", "--cluster", "nope")
    assert (code, out) == (2, "")
    assert err == (
        "trainctl: error: no cluster default/nope: SSM parameter /spot-training/default/nope/job-spec "
        "does not exist (is the stack deployed?)\n"
    )
    code, _, err = _trainctl(capsys, "status", "--cluster", "main", "job-that-never-was")
    assert code == 2
    assert err == "trainctl: error: no job 'job-that-never-was' on default/main (see 'trainctl list')\n"
    code, _, err = _trainctl(capsys, "submit", "--cluster", "main", "--code", "/nonexistent", "--nodes", "1")
    assert (code, err) == (
        2,
        "trainctl: error: code directory /nonexistent does not exist; give the folder that holds the training script\n",
    )
    code, _, err = _trainctl(capsys, "submit", "--cluster", "main", "--code", str(EXAMPLE_DIR), "--nodes", "9")
    assert (code, err) == (2, "trainctl: error: --nodes must be from 1 to 2 (the cluster's max_nodes), got 9\n")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]  # nothing listens once the socket is closed
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"https://localhost:{closed}")
    code, _, err = _trainctl(capsys, "list", "--cluster", "main")
    assert code == 3
    assert err == f"trainctl: error: the AWS endpoint does not answer: https://localhost:{closed}/\n"
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    code, _, err = _trainctl(capsys, "list", "--cluster", "main")
    assert code == 3
    assert err == "trainctl: error: no AWS credentials (set AWS_PROFILE or AWS_ACCESS_KEY_ID/...)\n"


def test_trainctl_submit_then_stop_saves_a_checkpoint_and_scales_to_zero(
    cloud: EmulatedCloud, demo_run: Any, aws_env: dict[str, str], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    client = cloud.client
    ref = jobs.find_cluster(client, "default", "main")
    with NodeLauncher(cloud, tmp_path / "nodes", groups=[ref.group], node_env=NODE_ENV) as launcher:
        code, out, err = _trainctl(
            capsys, "submit", "--cluster", "main", "--code", str(EXAMPLE_DIR), "--nodes", "1",
            "--command", "python train.py --epochs 50 --seed 0 --step-sleep-s 0.1", "--python", sys.executable,
            "--checkpoint-interval-s", "2",
        )  # fmt: skip
        assert code == 0, err
        job_id = out.strip()
        launcher.wait_for(lambda: len(jobs.checkpoints(client, ref, job_id)) >= 2, 180, "two checkpoints")
        # the agent ships its lines every 2 s, so the plan line may reach CloudWatch after a checkpoint is durable
        launcher.wait_for(lambda: jobs.planned_steps(client, ref, job_id) is not None, 60, "the plan line shipped")
        code, out, _ = _trainctl(capsys, "--json", "status", "--cluster", "main", job_id)
        running = json.loads(out)
        assert running["state"] == "RUNNING"
        assert running["planned_steps"] == 50 * (1400 // 32)  # the example's training split, 1 rank, batch 32
        assert running["eta_s"] is not None and running["eta_s"] > 0
        code, out, _ = _trainctl(capsys, "stop", "--cluster", "main", job_id)
        assert code == 0
        assert "stop requested" in out
        launcher.wait_for(
            lambda: jobs.marker(client, ref, job_id, "STOPPED") is not None and not launcher.running(),
            180,
            "the job to stop",
        )
    stopped = jobs.marker(client, ref, job_id, "STOPPED")
    assert stopped is not None
    steps = [c.step for c in jobs.checkpoints(client, ref, job_id)]
    assert stopped["last_checkpoint"] == steps[-1] < 50 * 1400 // 32  # stopped before the end, state saved
    assert jobs.marker(client, ref, job_id, "DONE") is None
    assert jobs.desired_capacity(client, ref) == 0
    code, out, _ = _trainctl(capsys, "--json", "status", "--cluster", "main", job_id)
    assert json.loads(out)["state"] == "STOPPED"


def test_trainctl_cost_prices_every_node_of_the_demo_job(
    cloud: EmulatedCloud, demo_run: Any, aws_env: dict[str, str], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """Hours from the group's activity, spot prices from EC2's history, on-demand from the table, per node."""
    summary, ref = demo_run
    code, out, err = _trainctl(capsys, "--json", "cost", "--cluster", "main", summary.job_id)
    assert code == 0, err
    info = json.loads(out)
    ec2 = cloud.client("ec2")
    table = load_prices()
    assert {n["instance"] for n in info["nodes"]} == {n.instance_id for n in summary.nodes}
    lines = jobs.log_events(cloud.client, ref, summary.job_id)
    for node in info["nodes"]:
        described = ec2.describe_instances(InstanceIds=[node["instance"]])["Reservations"][0]["Instances"][0]
        assert (node["type"], node["az"]) == (described["InstanceType"], described["Placement"]["AvailabilityZone"])
        assert node["market"] == described.get("InstanceLifecycle") == "spot"  # the default team: no on-demand base
        history = ec2.describe_spot_price_history(InstanceTypes=[node["type"]], AvailabilityZone=node["az"])
        assert node["usd_per_hour"] == pytest.approx(float(history["SpotPriceHistory"][0]["SpotPrice"]))
        assert node["on_demand_usd_per_hour"] == table.on_demand[node["type"]]
        assert node["timed_by"] == "group activity"
        assert node["start"] == pytest.approx(described["LaunchTime"].timestamp(), abs=1.0)  # from launch (1 s steps)
        own = [ts for ts, stream, _ in lines if stream.endswith("/" + node["instance"])]
        # ... to termination. EC2 ends that activity once the instance is down; the emulator terminates at the API
        # call and shuts the node down at its next poll, so a node may log until then (and the time has 1 s steps).
        assert node["start"] <= own[0] and own[-1] <= node["end"] + 1.0 + POLL_S + SHUTDOWN_GRACE_S
    assert info["total_usd"] == pytest.approx(sum(n["hours"] * n["usd_per_hour"] for n in info["nodes"]))
    assert info["on_demand_usd"] == pytest.approx(sum(n["hours"] * n["on_demand_usd_per_hour"] for n in info["nodes"]))
    assert 0 < info["total_usd"] < info["on_demand_usd"]
    assert info["savings_pct"] == pytest.approx(100 * (1 - info["total_usd"] / info["on_demand_usd"]))
    assert info["interruptions"] == 1
    assert info["redone"]["steps"] == summary.steps_redone
    code, out, _ = _trainctl(capsys, "cost", "--cluster", "main", summary.job_id)
    assert code == 0
    assert summary.replacement in out and f"savings {info['savings_pct']:.1f} %" in out
    prices = tmp_path / "prices.yaml"
    prices.write_text("g5.xlarge: free\n")
    code, out, err = _trainctl(capsys, "cost", "--cluster", "main", summary.job_id, "--prices", str(prices))
    assert (code, out) == (2, "")
    assert err == f"trainctl: error: {prices}: g5.xlarge: price must be a positive number of USD per hour, got 'free'\n"
