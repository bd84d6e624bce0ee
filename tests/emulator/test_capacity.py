"""Spot capacity runs out on the emulated cloud: the job waits, the deployed capacity watcher moves the group to
on-demand after the configured minutes (0.1 here), the job runs to DONE on on-demand nodes, ``trainctl status`` and
``trainctl cost`` show it; with capacity back, the next job starts on spot again.

The emulator does not run Lambda schedules: the test runs the deployed function's code with the function's own
environment, as tests/emulator/test_budget.py runs the budget guard.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from capacity_watcher.handler import watch
from emulator import EmulatedCloud
from emulator.demo import EXAMPLE_DIR, NODE_ENV
from emulator.deploy import bootstrap, deploy
from emulator.nodes import NodeLauncher
from emulator.spot_capacity import NO_CAPACITY_MESSAGE
from tests.emulator.user_environment import use_emulator_exports
from trainctl import jobs
from trainctl.cli import main as trainctl_main

pytestmark = pytest.mark.slow

TEAM, CLUSTER, AFTER_MINUTES = "capacity", "main", 0.1
JOB_TIMEOUT_S = 600  # bounded: one node, one epoch of the example
COMMAND = "python train.py --epochs 1 --seed 0 --step-sleep-s 0.01"


@pytest.fixture(scope="module")
def cloud(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmulatedCloud]:
    teams = tmp_path_factory.mktemp("teams")
    cluster = {
        "name": CLUSTER,
        "instance_types": ["g5.xlarge", "g6.xlarge"],
        "max_nodes": 2,
        "capacity": {"on_demand_after_minutes": AFTER_MINUTES},
    }
    (teams / f"{TEAM}.yaml").write_text(yaml.safe_dump({"clusters": [cluster]}))
    with EmulatedCloud(run_dir=tmp_path_factory.mktemp("capacity")) as c:
        bootstrap(c)
        deploy(c, f"TrainingStack-{TEAM}", context={"teams_dir": str(teams), "team": TEAM})
        yield c


def _watcher_env(cloud: EmulatedCloud, group: str) -> dict[str, str]:
    functions = cloud.client("lambda").list_functions()["Functions"]
    [env] = [
        f["Environment"]["Variables"]
        for f in functions
        if f.get("Environment", {}).get("Variables", {}).get("GROUP_NAME") == group
    ]
    return dict(env)


def watched_cluster(
    cloud: EmulatedCloud, monkeypatch: pytest.MonkeyPatch, team: str
) -> tuple[jobs.ClusterRef, dict[str, str]]:
    """The team's cluster and its capacity watcher's environment; trainctl's own clients reach the emulator."""
    use_emulator_exports(cloud, monkeypatch)
    ref = jobs.find_cluster(cloud.client, team, CLUSTER)
    return ref, _watcher_env(cloud, ref.group)


def _zone(cloud: EmulatedCloud, group: str) -> str:
    [found] = cloud.client("autoscaling").describe_auto_scaling_groups(AutoScalingGroupNames=[group])[
        "AutoScalingGroups"
    ]
    subnet = found["VPCZoneIdentifier"].split(",")[0]
    return str(cloud.client("ec2").describe_subnets(SubnetIds=[subnet])["Subnets"][0]["AvailabilityZone"])


def _lifecycles(cloud: EmulatedCloud, group: str) -> list[str]:
    """The market of every instance the group has now, as DescribeInstances tells it."""
    ids = [
        i["InstanceId"] for i in jobs.group(cloud.client, jobs.find_cluster(cloud.client, TEAM, CLUSTER))["Instances"]
    ]
    if not ids:
        return []
    reservations = cloud.client("ec2").describe_instances(InstanceIds=ids)["Reservations"]
    return [i.get("InstanceLifecycle", "on-demand") for r in reservations for i in r["Instances"]]


def _trainctl(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    code = trainctl_main(list(argv))
    captured = capsys.readouterr()
    assert code == 0, captured.err
    return captured.out


def _wait(predicate: Any, timeout_s: float, what: str, launcher: NodeLauncher) -> None:
    launcher.wait_for(predicate, timeout_s, what)


def test_without_spot_capacity_the_job_waits_then_runs_on_demand_to_done_and_the_next_job_is_spot(
    cloud: EmulatedCloud, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert cloud.run_dir is not None
    client = cloud.client
    ref, env = watched_cluster(cloud, monkeypatch, TEAM)
    assert env["ON_DEMAND_AFTER_S"] == "6.0"
    zone = _zone(cloud, ref.group)
    assert cloud.set_spot_capacity(zone, False) == ["*"]
    assert watch(client, env, time.time())["action"] is None  # the group at 0: settled
    with NodeLauncher(cloud, cloud.run_dir / "nodes", groups=[ref.group], node_env=NODE_ENV) as launcher:
        try:
            job_id = jobs.submit(client, ref, EXAMPLE_DIR, command=COMMAND, nodes=1, python=sys.executable)
            # no instance: the spot launch failed, as EC2 Auto Scaling records it
            assert jobs.desired_capacity(client, ref) == 1 and jobs.group(client, ref)["Instances"] == []
            activities = client("autoscaling").describe_scaling_activities(AutoScalingGroupName=ref.group)
            failed = [a for a in activities["Activities"] if a["StatusCode"] == "Failed"]
            assert [a["StatusMessage"] for a in failed] == [NO_CAPACITY_MESSAGE]
            status = json.loads(_trainctl(capsys, "--json", "status", "--team", TEAM, "--cluster", CLUSTER, job_id))
            assert status["capacity"]["waiting"]["reason"] == NO_CAPACITY_MESSAGE
            assert status["capacity"]["waiting"]["since"] == failed[0]["StartTime"].timestamp()
            shown = _trainctl(capsys, "status", "--team", TEAM, "--cluster", CLUSTER, job_id)
            assert "waiting for capacity: 0 of 1 node(s) since " in shown and NO_CAPACITY_MESSAGE in shown

            # 5 s after the failed launch, whatever the status calls above took on a loaded machine: not yet 6 s
            report = watch(client, env, failed[0]["StartTime"].timestamp() + 5.0)
            assert report["action"] is None and report["record"]["market"] == "spot"
            time.sleep(max(0.0, failed[0]["StartTime"].timestamp() + 6.0 - time.time()) + 0.5)
            report = watch(client, env, time.time())
            assert report["action"] == "on-demand", report
            assert report["reason"].startswith("spot launched 0 of 1 node(s) in ")
            assert _lifecycles(cloud, ref.group) == ["on-demand"]  # launched under the new policy at once
            shown = _trainctl(capsys, "status", "--team", TEAM, "--cluster", CLUSTER, job_id)
            assert "capacity: on-demand since " in shown and ": spot launched 0 of 1 node(s) in " in shown

            _wait(lambda: jobs.marker(client, ref, job_id, "DONE") is not None, JOB_TIMEOUT_S, "DONE", launcher)
            assert jobs.marker(client, ref, job_id, "FAILED") is None
            _wait(lambda: jobs.desired_capacity(client, ref) == 0 and not launcher.running(), 120, "0", launcher)
            cost = _trainctl(capsys, "cost", "--team", TEAM, "--cluster", CLUSTER, job_id)
            costed = json.loads(_trainctl(capsys, "--json", "cost", "--team", TEAM, "--cluster", CLUSTER, job_id))
            assert costed["on_demand_nodes"]["hours"] > 0 and costed["on_demand_nodes"]["at_spot_usd"] > 0
            assert {r["market"] for r in costed["by_type"]} == {"on-demand"}
            assert f"on-demand: {costed['on_demand_nodes']['hours']:.3f} node-hours" in cost

            # the group at 0: the watcher puts it back to spot; with capacity back, the next job is spot
            report = watch(client, env, time.time())
            assert report["action"] == "spot" and report["record"]["market"] == "spot"
            [found] = client("autoscaling").describe_auto_scaling_groups(AutoScalingGroupNames=[ref.group])[
                "AutoScalingGroups"
            ]
            assert found["MixedInstancesPolicy"]["InstancesDistribution"]["OnDemandPercentageAboveBaseCapacity"] == 0
            cloud.set_spot_capacity(zone, True)
            again = jobs.submit(client, ref, EXAMPLE_DIR, command=COMMAND, nodes=1, python=sys.executable)
            assert _lifecycles(cloud, ref.group) == ["spot"]
            _wait(lambda: jobs.marker(client, ref, again, "DONE") is not None, JOB_TIMEOUT_S, "DONE", launcher)
        finally:
            client("autoscaling").set_desired_capacity(AutoScalingGroupName=ref.group, DesiredCapacity=0)
            cloud.set_spot_capacity(zone, True)
