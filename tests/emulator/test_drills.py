"""Drills on the emulated cloud, as ``python -m emulator up`` runs them: the stack's own FIS experiment template started
by ``trainctl drill`` on a running 2-node job (``percent: 50`` takes one node, ``percent: 100`` both; the job ends
DONE), and ad-hoc faults through the control endpoint (``python -m emulator interrupt``) on a running job."""

from __future__ import annotations

import json
import os
import stat
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

import emulator.__main__ as cli
from emulator import EmulatedCloud
from emulator.control import CONTROL_FILE
from emulator.demo import EXAMPLE_DIR
from emulator.deploy import bootstrap, deploy
from emulator.nodes import NodeLauncher
from tests.emulator.user_environment import use_emulator_exports
from trainctl import jobs
from trainctl.cli import main as trainctl_main
from trainctl.drill import find_template, format_drill

pytestmark = pytest.mark.slow

TEAM = "drills"
TIME_SCALE = 0.2  # a 2-minute notice lasts 24 s
JOB_TIMEOUT_S = 480.0


def cluster(name: str, percent: int) -> dict[str, Any]:
    return {
        "name": name,
        "instance_types": ["g5.xlarge", "g5.2xlarge"],
        "desired_nodes": 2,
        "max_nodes": 2,
        "job": {"command": "python train.py", "nproc_per_node": 1},
        "interruption_drill": {"percent": percent, "notice_minutes": 2},
    }


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[EmulatedCloud, NodeLauncher, Path]]:
    """The emulated cloud with the team deployed and what ``emulator up`` runs while it waits."""
    run_dir = tmp_path_factory.mktemp("drills")
    teams = tmp_path_factory.mktemp("teams")
    (teams / f"{TEAM}.yaml").write_text(yaml.safe_dump({"clusters": [cluster("half", 50), cluster("all", 100)]}))
    with EmulatedCloud(run_dir=run_dir) as cloud:
        bootstrap(cloud)
        deploy(cloud, f"TrainingStack-{TEAM}", context={"teams_dir": str(teams), "team": TEAM})
        with cli.running_nodes(cloud, run_dir, drill_time_scale=TIME_SCALE, on_event=lambda _: None) as launcher:
            yield cloud, launcher, run_dir


def submit(cloud: EmulatedCloud, launcher: NodeLauncher, name: str) -> tuple[jobs.ClusterRef, str]:
    """The example job on 2 nodes of cluster ``name``, once its first checkpoint is durable."""
    ref = jobs.find_cluster(cloud.client, TEAM, name)
    job_id = jobs.submit(
        cloud.client,
        ref,
        EXAMPLE_DIR,
        command="python train.py --epochs 8 --seed 0 --step-sleep-s 0.2",
        nodes=2,
        python=sys.executable,
        min_nodes=2,
        max_nodes=2,
        checkpoint_interval_s=2.0,
    )
    launcher.wait_for(lambda: bool(jobs.checkpoints(cloud.client, ref, job_id)), JOB_TIMEOUT_S, "a first checkpoint")
    return ref, job_id


def wait_done(cloud: EmulatedCloud, launcher: NodeLauncher, ref: jobs.ClusterRef, job_id: str) -> None:
    launcher.wait_for(lambda: jobs.end_marker(cloud.client, ref, job_id) is not None, JOB_TIMEOUT_S, "the job's end")
    assert jobs.marker(cloud.client, ref, job_id, "DONE") is not None, jobs.marker(cloud.client, ref, job_id, "FAILED")
    launcher.wait_for(
        lambda: jobs.desired_capacity(cloud.client, ref) == 0 and not launcher.running(ref.group), 120, "the group at 0"
    )


def trainctl(
    cloud: EmulatedCloud, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], *argv: str
) -> str:
    use_emulator_exports(cloud, monkeypatch)
    code = trainctl_main(list(argv))
    out, err = capsys.readouterr()
    assert code == 0, err
    return out


@pytest.mark.parametrize(("name", "taken"), [("half", 1), ("all", 2)])
def test_trainctl_drill_interrupts_the_share_of_nodes_and_the_job_ends_done(
    up: Any, name: str, taken: int, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    cloud, launcher, _ = up
    ref, job_id = submit(cloud, launcher, name)
    report = json.loads(trainctl(cloud, monkeypatch, capsys, "--json", "drill", "--team", TEAM, "--cluster", name))
    wait_done(cloud, launcher, ref, job_id)
    assert report["job_id"] == job_id and report["experiment_state"] == "completed", report
    assert len(report["targets"]) == taken
    assert sorted(n["instance"] for n in report["notices"]) == report["targets"]
    for node in report["notices"]:  # the emergency checkpoint is durable well inside the (scaled) 2-minute notice
        assert node["durable_step"] is not None and 0 <= node["notice_to_durable_s"] < 120 * TIME_SCALE, node
    assert len(report["replacements"]) >= taken
    assert all(r["boot_to_first_step_s"] is not None and r["boot_to_first_step_s"] > 0 for r in report["replacements"])
    assert report["steps_redone"] == 0
    assert report["job_went_on"] is True
    experiment = cloud.client("fis").get_experiment(id=report["experiment_id"])["experiment"]
    assert experiment["state"]["status"] == "completed" and experiment["endTime"] is not None
    text = trainctl(cloud, monkeypatch, capsys, "status", "--team", TEAM, "--cluster", name, job_id)
    assert f"interruptions: {taken}" in text
    lines = format_drill(report).splitlines()
    assert lines[1] == f"job {job_id}: {report['job_state']}; went on: yes"
    assert [line.split(":")[1].strip() for line in lines if line.startswith("notice: ")] == report["targets"]
    assert "steps redone: 0" in lines


def test_emulator_interrupt_reaches_a_node_of_a_running_job(up: Any, capsys: pytest.CaptureFixture[str]) -> None:
    cloud, launcher, run_dir = up
    assert stat.S_IMODE(os.stat(run_dir / CONTROL_FILE).st_mode) == 0o600
    ref, job_id = submit(cloud, launcher, "half")
    before = {n.instance_id for n in launcher.running(ref.group)}
    assert cli.main(["interrupt", "--any", ref.group, "--run-dir", str(run_dir)]) == 0
    out = capsys.readouterr().out
    [victim] = [i for i in before if out.startswith(f"{i} ({ref.group}): spot interruption notice delivered")]
    wait_done(cloud, launcher, ref, job_id)
    assert launcher.node(victim).notice_at is not None
    assert any(n.booted_at > launcher.node(victim).notice_at for n in launcher.all_nodes() if n.group == ref.group)
    # the node it took is no target any more: one line, exit code 1
    assert cli.main(["power-off", victim, "--run-dir", str(run_dir)]) == 1
    assert capsys.readouterr().err == f"error: instance {victim} is not running (its node has shut down)\n"


def test_a_fault_for_an_unknown_instance_or_no_emulator_is_one_line(
    up: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, _, run_dir = up
    assert cli.main(["end", "i-0123456789abcdef0", "--run-dir", str(run_dir)]) == 1
    assert capsys.readouterr().err.startswith("error: unknown instance i-0123456789abcdef0: no emulated node runs it")
    assert cli.main(["rebalance", "--any", "no-such-group", "--run-dir", str(run_dir)]) == 1
    assert capsys.readouterr().err.startswith("error: no running node without a notice in group no-such-group")
    assert cli.main(["interrupt", "i-0123456789abcdef0", "--run-dir", str(tmp_path)]) == 1
    assert capsys.readouterr().err == (
        f"error: no emulator is running with run directory {tmp_path} (no {CONTROL_FILE}): start one with "
        f"`python -m emulator up --run-dir {tmp_path}`\n"
    )


def test_the_control_endpoint_refuses_a_request_without_the_run_directory_s_token(up: Any) -> None:
    _, _, run_dir = up
    control = json.loads((run_dir / CONTROL_FILE).read_text())
    assert control["url"].startswith("http://127.0.0.1:")
    request = urllib.request.Request(
        f"{control['url']}/faults",
        data=json.dumps({"fault": "power-off", "group": "x"}).encode(),
        headers={"Authorization": "Bearer guessed"},
        method="POST",
    )
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=30)
    assert refused.value.code == 403


def test_an_experiment_whose_stop_condition_is_in_alarm_fails(up: Any) -> None:
    """As FIS refuses to start a drill while its stop condition's alarm fires (the cluster has no capacity)."""
    cloud, _, _ = up
    ref = jobs.find_cluster(cloud.client, TEAM, "half")
    fis = cloud.client("fis")
    template = fis.get_experiment_template(id=find_template(cloud.client, ref))["experimentTemplate"]
    alarm = template["stopConditions"][0]["value"].rsplit(":alarm:", 1)[1]
    cloud.client("cloudwatch").set_alarm_state(AlarmName=alarm, StateValue="ALARM", StateReason="test")
    try:
        experiment = fis.start_experiment(experimentTemplateId=template["id"])["experiment"]
        deadline = time.monotonic() + 60
        while fis.get_experiment(id=experiment["id"])["experiment"]["state"]["status"] != "failed":
            assert time.monotonic() < deadline, "the experiment did not fail"
            time.sleep(0.5)
        state = fis.get_experiment(id=experiment["id"])["experiment"]["state"]
        assert state["reason"] == f"stop condition alarm {alarm} is in ALARM"
    finally:
        cloud.client("cloudwatch").set_alarm_state(AlarmName=alarm, StateValue="OK", StateReason="test")
