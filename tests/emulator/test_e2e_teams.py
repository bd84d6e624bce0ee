"""End to end on the emulated cloud: stacks of other teams than the demo's, each deployed by the real CDK CLI (a
module of its own, so that pytest-xdist runs it beside ``test_e2e.py``'s demo job)."""

from __future__ import annotations

import base64
import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from emulator import EmulatedCloud
from emulator.demo import NODE_ENV
from emulator.deploy import bootstrap, deploy
from emulator.nodes import NodeLauncher

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cloud(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmulatedCloud]:
    with EmulatedCloud(run_dir=tmp_path_factory.mktemp("e2e-teams")) as c:
        bootstrap(c)
        yield c


def test_a_team_with_a_warm_pool_and_two_clusters_deploys(cloud: EmulatedCloud, tmp_path: Path) -> None:
    ec2 = cloud.client("ec2")
    volume = ec2.create_volume(AvailabilityZone=f"{cloud.region}a", Size=8)
    snapshot = ec2.create_snapshot(VolumeId=volume["VolumeId"])["SnapshotId"]
    team = {
        "clusters": [
            {
                "name": "pooled",
                "instance_types": ["g5.xlarge", "g5.2xlarge"],
                "max_nodes": 2,
                "warm_pool": {"size": 2, "snapshot_id": snapshot, "volume_size_gib": 8, "removal_policy": "destroy"},
                "ami": {"image_id": ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]},  # the snapshot's
            },
            {"name": "plain", "instance_types": ["c7i.xlarge", "c6i.xlarge"], "max_nodes": 3},
        ]
    }
    (tmp_path / "pooled.yaml").write_text(yaml.safe_dump(team))
    outputs = deploy(cloud, "TrainingStack-pooled", context={"teams_dir": str(tmp_path), "team": "pooled"})
    assert {"GroupNamepooled", "GroupNameplain"} <= set(outputs)
    volumes = ec2.describe_volumes(Filters=[{"Name": "tag:spot-training:warm-pool", "Values": ["pooled-pooled"]}])
    assert len(volumes["Volumes"]) == 2
    assert {v["SnapshotId"] for v in volumes["Volumes"]} == {snapshot}
    assert all(v["Encrypted"] and v["VolumeType"] == "gp3" for v in volumes["Volumes"])
    groups = cloud.client("autoscaling").describe_auto_scaling_groups(
        AutoScalingGroupNames=[outputs["GroupNamepooled"], outputs["GroupNameplain"]]
    )["AutoScalingGroups"]
    assert sorted(g["MaxSize"] for g in groups) == [2, 3]


def test_a_node_that_cannot_fetch_the_bootstrap_scripts_leaves_its_group(cloud: EmulatedCloud, tmp_path: Path) -> None:
    """Before the scripts are on disk no agent runs to hand the instance back, so the user data does. Without this,
    the user data would stop at the failed download and the instance would idle in the group, billed and counted as
    a peer."""
    team = {"clusters": [{"name": "nofetch", "instance_types": ["c7i.xlarge", "c6i.xlarge"], "max_nodes": 1}]}
    (tmp_path / "nofetch.yaml").write_text(yaml.safe_dump(team))
    group = deploy(cloud, "TrainingStack-nofetch", context={"teams_dir": str(tmp_path), "team": "nofetch"})[
        "GroupNamenofetch"
    ]
    ec2, s3, asg = cloud.client("ec2"), cloud.client("s3"), cloud.client("autoscaling")
    user_data = [
        base64.b64decode(v["LaunchTemplateData"].get("UserData", "")).decode()
        for t in ec2.describe_launch_templates()["LaunchTemplates"]
        for v in ec2.describe_launch_template_versions(LaunchTemplateId=t["LaunchTemplateId"])["LaunchTemplateVersions"]
    ]
    [(bucket, key)] = {
        m.groups()
        for text in user_data
        if "--cluster nofetch" in text
        for m in [re.search(r"s3://([^/]+)/([^']+)'", text)]
        if m
    }
    asset = s3.get_object(Bucket=bucket, Key=key)["Body"].read()
    s3.delete_object(Bucket=bucket, Key=key)  # as if the asset were gone, or the role could not read it
    try:
        with NodeLauncher(cloud, tmp_path / "nodes", groups=[group], node_env=NODE_ENV) as launcher:
            asg.set_desired_capacity(AutoScalingGroupName=group, DesiredCapacity=1)
            deadline = time.monotonic() + 120  # bounded: 3 tries 10 s apart, then the hand-back
            while time.monotonic() < deadline:
                [found] = asg.describe_auto_scaling_groups(AutoScalingGroupNames=[group])["AutoScalingGroups"]
                if launcher.nodes and found["DesiredCapacity"] == 0 and not found["Instances"]:
                    break
                time.sleep(0.5)
            [node] = launcher.nodes.values()
            console = node.console.read_text(errors="replace")
        assert (found["DesiredCapacity"], found["Instances"]) == (0, []), console
        assert (
            f"user-data: error: could not fetch the bootstrap scripts (3 tries); instance {node.instance_id} leaves "
            "its group (one fewer desired)"
        ) in console
    finally:
        s3.put_object(Bucket=bucket, Key=key, Body=asset)


def test_a_team_with_efa_clusters_deploys_and_its_nodes_launch_in_the_security_group(
    cloud: EmulatedCloud, tmp_path: Path
) -> None:
    """EFA interfaces (4 on p4d, 32 on p5, a launch template per count in the group's overrides) are accepted; a node
    launches with one interface in the node security group (emulator/cfn_compat/ec2.py, item 15)."""
    team = {"clusters": [{"name": "mixed", "instance_types": ["p4d.24xlarge", "p5.48xlarge"], "max_nodes": 2}]}
    (tmp_path / "efa.yaml").write_text(yaml.safe_dump(team))
    group = deploy(cloud, "TrainingStack-efa", context={"teams_dir": str(tmp_path), "team": "efa"})["GroupNamemixed"]
    ec2, asg = cloud.client("ec2"), cloud.client("autoscaling")
    [found] = asg.describe_auto_scaling_groups(AutoScalingGroupNames=[group])["AutoScalingGroups"]
    policy = found["MixedInstancesPolicy"]["LaunchTemplate"]
    counts = {}
    for override in policy["Overrides"]:
        spec = override.get("LaunchTemplateSpecification", policy["LaunchTemplateSpecification"])
        [version] = ec2.describe_launch_template_versions(LaunchTemplateId=spec["LaunchTemplateId"])[
            "LaunchTemplateVersions"
        ]
        interfaces = version["LaunchTemplateData"]["NetworkInterfaces"]
        counts[override["InstanceType"]] = len([i for i in interfaces if i["InterfaceType"] == "efa"])
        groups = {g for i in interfaces for g in i["Groups"]}
    assert counts == {"p4d.24xlarge": 4, "p5.48xlarge": 32}
    asg.set_desired_capacity(AutoScalingGroupName=group, DesiredCapacity=1)  # no node launcher: no node process
    try:
        [found] = asg.describe_auto_scaling_groups(AutoScalingGroupNames=[group])["AutoScalingGroups"]
        [instance] = [
            i
            for r in ec2.describe_instances(InstanceIds=[i["InstanceId"] for i in found["Instances"]])["Reservations"]
            for i in r["Instances"]
        ]
        assert {g["GroupId"] for g in instance["SecurityGroups"]} == groups
        assert len(instance["NetworkInterfaces"]) == 1
    finally:
        asg.set_desired_capacity(AutoScalingGroupName=group, DesiredCapacity=0)
