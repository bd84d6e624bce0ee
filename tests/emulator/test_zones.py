"""Two zones, spot capacity off in the first, on the emulated cloud: the job waits, the deployed capacity watcher moves
the group to the second zone after the configured minutes (0.1 here), and the job runs to DONE there, in that zone's
placement group, on a warm volume of that zone; ``trainctl status`` shows the move.

The emulator does not run Lambda schedules: the test runs the deployed function's code with the function's own
environment, as tests/emulator/test_capacity.py does.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator

import pytest
import yaml

from capacity_watcher.handler import watch
from emulator import EmulatedCloud
from emulator.demo import EXAMPLE_DIR, NODE_ENV
from emulator.deploy import bootstrap, deploy
from emulator.nodes import NodeLauncher
from team_config.naming import POOL_TAG
from tests.emulator.test_capacity import AFTER_MINUTES, CLUSTER, COMMAND, JOB_TIMEOUT_S, _trainctl, watched_cluster
from trainctl import jobs

pytestmark = pytest.mark.slow

TEAM = "zones"


@pytest.fixture(scope="module")
def cloud(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmulatedCloud]:
    teams = tmp_path_factory.mktemp("teams")
    with EmulatedCloud(run_dir=tmp_path_factory.mktemp("zones")) as c:
        ec2 = c.client("ec2")
        zones = [f"{c.region}a", f"{c.region}b"]
        source = ec2.create_volume(AvailabilityZone=zones[0], Size=8)["VolumeId"]
        pool = {"size": 1, "volume_size_gib": 8, "removal_policy": "destroy"}
        cluster = {
            "name": CLUSTER,
            "instance_types": ["g5.xlarge", "g6.xlarge"],
            "max_nodes": 1,
            "capacity": {"on_demand_after_minutes": AFTER_MINUTES, "zones": zones},
            "warm_pool": {**pool, "snapshot_id": ec2.create_snapshot(VolumeId=source)["SnapshotId"]},
            "ami": {"image_id": ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]},  # the snapshot's
        }
        team = {"network": {"new_vpc": {"availability_zones": zones}}, "clusters": [cluster]}
        (teams / f"{TEAM}.yaml").write_text(yaml.safe_dump(team))
        bootstrap(c)
        deploy(c, f"TrainingStack-{TEAM}", context={"teams_dir": str(teams), "team": TEAM})
        yield c


def test_without_spot_in_the_first_zone_the_job_runs_in_the_second_with_its_placement_group_and_volume(
    cloud: EmulatedCloud, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert cloud.run_dir is not None
    client = cloud.client
    ref, env = watched_cluster(cloud, monkeypatch, TEAM)
    first, second = json.loads(env["ZONES"])
    assert (first["zone"], second["zone"]) == (f"{cloud.region}a", f"{cloud.region}b")
    [group] = client("autoscaling").describe_auto_scaling_groups(AutoScalingGroupNames=[ref.group])["AutoScalingGroups"]
    assert (group["PlacementGroup"], group["VPCZoneIdentifier"]) == (first["placement_group"], first["subnets"])
    cloud.set_spot_capacity(first["zone"], False)
    with NodeLauncher(cloud, cloud.run_dir / "nodes", groups=[ref.group], node_env=NODE_ENV) as launcher:
        try:
            assert watch(client, env, time.time())["action"] is None  # the group at 0: settled
            job_id = jobs.submit(client, ref, EXAMPLE_DIR, command=COMMAND, nodes=1, python=sys.executable)
            assert jobs.group(client, ref)["Instances"] == []  # no spot in the first zone
            activities = client("autoscaling").describe_scaling_activities(AutoScalingGroupName=ref.group)
            [failed] = [a for a in activities["Activities"] if a["StatusCode"] == "Failed"]
            time.sleep(max(0.0, failed["StartTime"].timestamp() + AFTER_MINUTES * 60 - time.time()) + 0.5)
            report = watch(client, env, time.time())
            assert report["action"] == "move" and report["record"]["zone"] == second["zone"], report
            assert report["record"]["market"] == "spot"

            [group] = client("autoscaling").describe_auto_scaling_groups(AutoScalingGroupNames=[ref.group])[
                "AutoScalingGroups"
            ]
            assert (group["PlacementGroup"], group["VPCZoneIdentifier"]) == (
                second["placement_group"],
                second["subnets"],
            )
            ids = [i["InstanceId"] for i in group["Instances"]]  # launched in the second zone at once
            [instance] = [
                i for r in client("ec2").describe_instances(InstanceIds=ids)["Reservations"] for i in r["Instances"]
            ]
            assert instance.get("InstanceLifecycle") == "spot"
            assert instance["Placement"]["AvailabilityZone"] == second["zone"]
            assert instance["Placement"]["GroupName"] == second["placement_group"]
            shown = _trainctl(capsys, "status", "--team", TEAM, "--cluster", CLUSTER, job_id)
            assert f"zone: {second['zone']} since " in shown and f"moved to {second['zone']}" in shown

            def claimed() -> list[str]:
                volumes = client("ec2").describe_volumes(
                    Filters=[{"Name": f"tag:{POOL_TAG}", "Values": [f"{TEAM}-{CLUSTER}"]}]
                )["Volumes"]
                return [
                    v["AvailabilityZone"]
                    for v in volumes
                    if any(a["InstanceId"] == instance["InstanceId"] for a in v.get("Attachments", []))
                ]

            launcher.wait_for(lambda: claimed() != [], 120, "a warm volume attached")
            assert claimed() == [second["zone"]]
            launcher.wait_for(lambda: jobs.marker(client, ref, job_id, "DONE") is not None, JOB_TIMEOUT_S, "DONE")
            assert jobs.marker(client, ref, job_id, "FAILED") is None
        finally:
            client("autoscaling").set_desired_capacity(AutoScalingGroupName=ref.group, DesiredCapacity=0)
            cloud.set_spot_capacity(first["zone"], True)
