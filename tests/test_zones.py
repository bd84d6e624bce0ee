"""Zones: a cluster that lists several (``capacity.zones``): the team file's refusals, the template (a placement
group per zone on the group, warm volumes per zone, the watcher's zones and permissions) and the watcher's moves."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from aws_cdk.assertions import Template

from capacity_watcher.decision import MOVE, ON_DEMAND, SPOT, Failure, decide, next_zone
from capacity_watcher.handler import current_zone
from compliance.spot_training.warm_volume import check_warm_volume
from emulator.spot_capacity import NO_CAPACITY_MESSAGE
from team_config import load_team
from tests.synth import CLUSTER, resources, synth, team_config
from tests.test_capacity import _watcher_statements
from tests.test_config import POOL_AMI, cluster, error_for, write
from tests.test_review import _prices
from trainctl import review
from trainctl.assembly import Stack
from trainctl.capacity import capacity_lines

AFTER_S = 300.0
ZONES = ["us-east-1a", "us-east-1b"]
NETWORK = {"new_vpc": {"availability_zones": ["us-east-1a", "us-east-1b", "us-east-1c"], "nat_gateways": 1}}
POOL_SIZE = 2
POOL = {"size": POOL_SIZE, "snapshot_id": "snap-0123456789abcdef0"}


def zoned(zones: list[str] = ZONES, network: dict[str, Any] = NETWORK, **overrides: Any) -> dict[str, Any]:
    capacity = {"on_demand_after_minutes": 5, "zones": zones}
    return {**cluster(capacity=capacity, **overrides), "network": network}


# ---- the team file ------------------------------------------------------------------------------------------


def test_zones_of_the_network_with_a_placement_group_and_warm_pool_load(tmp_path: Path) -> None:
    write(tmp_path, zoned(warm_pool=POOL, ami=POOL_AMI))
    [spec] = load_team(tmp_path / "team-a.yaml").config.clusters
    assert spec.zones == ZONES and spec.placement_group and spec.warm_pool is not None


@pytest.mark.parametrize(
    ("doc", "expected"),
    [
        pytest.param(
            zoned(["us-east-1a", "us-east-1d"]),
            "clusters[0] (main).capacity.zones: us-east-1d is not one of the network's zones (us-east-1a, us-east-1b, "
            "us-east-1c); list only those, or add us-east-1d to network.new_vpc",
            id="zone-not-in-network",
        ),
        pytest.param(
            zoned(network={"new_vpc": {"az_count": 2}}),
            "clusters[0] (main).capacity.zones lists us-east-1a, us-east-1b, but the network names no zones; list "
            "them in network.new_vpc.availability_zones",
            id="network-names-no-zones",
        ),
        pytest.param(
            zoned(["us-east-1a", "us-east-1a"]),
            "clusters[0].capacity: zones ['us-east-1a', 'us-east-1a'] names a zone twice; list each zone once",
            id="zone-twice",
        ),
        pytest.param(
            zoned(placement_group=False),
            "clusters[0] (main): max_nodes 2 across 2 AZs: the nodes' gradient exchange at every step would cross",
            id="spread-without-cross-zone-training",
        ),
        pytest.param(
            zoned(warm_pool={**POOL, "size": 1}, ami=POOL_AMI),
            "clusters[0]: warm_pool.size (1) (in each of the 2 capacity.zones) is below max_nodes (2); set size to at "
            "least max_nodes",
            id="pool-too-small-per-zone",
        ),
        pytest.param(
            {**cluster(placement_group=False, warm_pool=POOL, ami=POOL_AMI), "network": NETWORK},
            "clusters[0] (main): a warm volume pool lives in one AZ but the network spans 3; use one AZ/subnet, list "
            "the cluster's zones in capacity.zones (a pool per zone), or remove warm_pool",
            id="pool-without-zones",
        ),
    ],
)
def test_bad_zones_are_refused_in_one_line(tmp_path: Path, doc: dict[str, Any], expected: str) -> None:
    assert expected in error_for(tmp_path, doc)


def test_a_warm_pool_whose_snapshot_is_of_another_region_than_the_zones_is_refused(tmp_path: Path) -> None:
    pool = "    warm_pool:\n      size: 2\n      ami_id: ami-0123456789abcdef0\n"
    text = (
        "network:\n  new_vpc:\n    availability_zones: [us-east-1a, us-east-1b]\n"
        "clusters:\n  - name: main\n    instance_types: [g5.xlarge, g5.2xlarge]\n    max_nodes: 2\n"
        "    capacity:\n      on_demand_after_minutes: 5\n      zones: [us-east-1a, us-east-1b]\n" + pool
    )
    resolved = "      snapshot_id: snap-0123456789abcdef0  # root snapshot of ami-0123456789abcdef0, resolved in {}\n"
    message = error_for(tmp_path, text + resolved.format("eu-west-1"))
    assert message.endswith(
        "clusters[0].warm_pool.snapshot_id snap-0123456789abcdef0 is in eu-west-1 (its comment says so), but "
        "capacity.zones are in us-east-1: a zone's warm volumes need a snapshot in its region; copy "
        "ami-0123456789abcdef0 to us-east-1 (aws ec2 copy-image), set ami_id to the copy and run "
        f"`.venv/bin/python -m team_config.resolve_snapshots {tmp_path / 'team-a.yaml'} --region us-east-1`"
    )
    write(tmp_path, text + resolved.format("us-east-1"))
    assert load_team(tmp_path / "team-a.yaml").config.clusters[0].zones == ZONES


# ---- the template -------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def zoned_template() -> Template:
    spec = {**CLUSTER, "capacity": {"on_demand_after_minutes": 5, "zones": ZONES}, "warm_pool": POOL, "ami": POOL_AMI}
    return synth(team_config(clusters=[spec], network=NETWORK))[1]


def _subnet_zones(template: Template) -> dict[str, str]:
    return {k: v["Properties"]["AvailabilityZone"] for k, v in template.find_resources("AWS::EC2::Subnet").items()}


def test_a_placement_group_per_zone_on_the_group_none_in_the_launch_template(zoned_template: Template) -> None:
    groups = zoned_template.find_resources("AWS::EC2::PlacementGroup")
    assert len(groups) == 2 and all(g["Properties"]["Strategy"] == "cluster" for g in groups.values())
    [group] = resources(zoned_template, "AWS::AutoScaling::AutoScalingGroup")
    [first] = [k for k in groups if "useast1a" in k]
    assert group["Properties"]["PlacementGroup"] == {"Fn::GetAtt": [first, "GroupName"]}
    [subnet] = group["Properties"]["VPCZoneIdentifier"]
    assert _subnet_zones(zoned_template)[subnet["Ref"]] == "us-east-1a"  # the first zone only
    for template in resources(zoned_template, "AWS::EC2::LaunchTemplate"):
        assert "Placement" not in template["Properties"]["LaunchTemplateData"]


def test_warm_volumes_per_listed_zone(zoned_template: Template) -> None:
    volumes = resources(zoned_template, "AWS::EC2::Volume")
    zones = sorted(v["Properties"]["AvailabilityZone"] for v in volumes)
    assert zones == ["us-east-1a"] * POOL_SIZE + ["us-east-1b"] * POOL_SIZE


def test_review_shows_the_pool_volumes_per_zone_and_prices_them_all(zoned_template: Template) -> None:
    """2 volumes in each of 2 zones (team_config's defaults: 200 GiB, 3,000 IOPS, 125 MB/s): 4 x 200 x 0.08 USD."""
    text = review.summary({"S": Stack("S", dict(zoned_template.to_json()), [])}, _prices())
    assert "| team-a | main | 4 (2 in each of 2 zones) | 200 | 3000 | 125 | 64.00 |" in text


def test_the_watcher_knows_each_zone_and_may_only_update_its_group(zoned_template: Template) -> None:
    [function] = resources(zoned_template, "AWS::Lambda::Function")
    zones = json.dumps(function["Properties"]["Environment"]["Variables"]["ZONES"])
    groups = zoned_template.find_resources("AWS::EC2::PlacementGroup")
    subnets = _subnet_zones(zoned_template)
    for key in groups:
        assert f'\\"placement_group\\":\\"", {{"Fn::GetAtt": ["{key}", "GroupName"]}}' in zones
    for zone in ZONES:
        assert f'\\"zone\\":\\"{zone}\\"' in zones
        # the zone's training subnet only (not its public one)
        assert len([k for k, z in subnets.items() if z == zone and f'{{"Ref": "{k}"}}' in zones]) == 1
    statements = _watcher_statements(zoned_template)
    assert set(statements) == {"ReadGroups", "UpdateOwnGroup", "ListRecord", "ReadWriteRecord"}
    actions = {a for s in statements.values() for a in ([s["Action"]] if isinstance(s["Action"], str) else s["Action"])}
    assert not actions & {"ec2:RunInstances", "iam:PassRole", "ec2:CreatePlacementGroup"}


def test_without_a_placement_group_the_group_spreads_over_the_listed_zones() -> None:
    spec = {**CLUSTER, "placement_group": False, "cross_zone_training": True}
    template = synth(team_config(clusters=[{**spec, "capacity": {"on_demand_after_minutes": 5, "zones": ZONES}}],
                                 network=NETWORK))[1]  # fmt: skip
    assert resources(template, "AWS::EC2::PlacementGroup") == []
    [group] = resources(template, "AWS::AutoScaling::AutoScalingGroup")
    subnets = _subnet_zones(template)
    assert sorted(subnets[s["Ref"]] for s in group["Properties"]["VPCZoneIdentifier"]) == ZONES
    [function] = resources(template, "AWS::Lambda::Function")
    assert "ZONES" not in function["Properties"]["Environment"]["Variables"]  # no moves


def test_an_existing_vpc_starts_in_the_first_listed_zone_whatever_the_subnets_order() -> None:
    subnets = [{"subnet_id": f"subnet-0123456789abcdef{i}", "availability_zone": zone} for i, zone in enumerate(ZONES)]
    network = {"existing_vpc": {"vpc_id": "vpc-0123456789abcdef0", "create_s3_endpoint": False, "subnets": subnets}}
    spec = {**CLUSTER, "capacity": {"on_demand_after_minutes": 5, "zones": ["us-east-1b", "us-east-1a"]}}
    template = synth(team_config(clusters=[spec], network=network))[1]
    [group] = resources(template, "AWS::AutoScaling::AutoScalingGroup")
    assert group["Properties"]["VPCZoneIdentifier"] == ["subnet-0123456789abcdef1"]
    [first] = [k for k in template.find_resources("AWS::EC2::PlacementGroup") if "useast1b" in k]
    assert group["Properties"]["PlacementGroup"] == {"Fn::GetAtt": [first, "GroupName"]}
    [function] = resources(template, "AWS::Lambda::Function")
    zones = json.dumps(function["Properties"]["Environment"]["Variables"]["ZONES"])
    assert '\\"zone\\":\\"us-east-1a\\",\\"subnets\\":\\"subnet-0123456789abcdef0\\"' in zones


# ---- the decision -------------------------------------------------------------------------------------------


def test_next_zone_goes_round_the_list_skipping_tried_zones() -> None:
    zones = ["a", "b", "c"]
    assert next_zone(zones, "a", ["a"]) == "b"
    assert next_zone(zones, "b", ["b"]) == "c"
    assert next_zone(zones, "c", ["b", "c"]) == "a"
    assert next_zone(zones, "a", ["a", "b", "c"]) is None


def test_a_group_with_no_node_moves_zone_by_zone_then_goes_on_demand() -> None:
    failures = [Failure(1000.0, NO_CAPACITY_MESSAGE)]
    record = {"market": SPOT, "settled_at": 900.0, "zone": "a", "zones_tried": ["a"]}

    def step(record: dict[str, Any], zone: str, now: float, failures: list[Failure]) -> Any:
        return decide(desired=1, launched=0, failures=failures, record=record, now=now, after_s=AFTER_S,
                      zones=["a", "b"], zone=zone)  # fmt: skip

    assert step(record, "a", 1000.0 + AFTER_S - 1, failures).action is None
    moved = step(record, "a", 1000.0 + AFTER_S, failures)
    assert (moved.action, moved.zone) == (MOVE, "b")
    assert moved.record["zone"] == "b" and moved.record["zones_tried"] == ["a", "b"]
    assert moved.record["market"] == SPOT and moved.record["moved_at"] == 1000.0 + AFTER_S
    assert moved.reason.startswith("no spot in a for 5.0 min: moved to b: ") and NO_CAPACITY_MESSAGE in moved.reason
    # the old zone's failures do not count for the new zone's wait
    assert step(moved.record, "b", 1000.0 + 2 * AFTER_S, failures).action is None
    later = [*failures, Failure(1400.0, NO_CAPACITY_MESSAGE)]
    assert step(moved.record, "b", 1400.0 + AFTER_S - 1, later).action is None
    last = step(moved.record, "b", 1400.0 + AFTER_S, later)
    assert last.action == ON_DEMAND and "every listed zone tried (a, b)" in last.reason


def test_a_group_with_a_node_never_moves() -> None:
    failures = [Failure(1000.0, NO_CAPACITY_MESSAGE)]
    record = {"market": SPOT, "settled_at": 900.0, "zone": "a", "zones_tried": ["a"]}
    decision = decide(desired=2, launched=1, failures=failures, record=record, now=5000.0, after_s=AFTER_S,
                      zones=["a", "b"], zone="a")  # fmt: skip
    assert decision.action == ON_DEMAND and decision.record["zone"] == "a"


def test_a_group_at_zero_or_filled_starts_a_new_attempt_in_its_zone() -> None:
    record = {"market": ON_DEMAND, "settled_at": 900.0, "zone": "b", "zones_tried": ["a", "b"]}
    ended = decide(desired=0, launched=0, failures=[], record=record, now=2000.0, after_s=AFTER_S,
                   zones=["a", "b"], zone="b")  # fmt: skip
    assert ended.action == SPOT and ended.record["zones_tried"] == ["b"] and ended.record["zone"] == "b"
    filled = decide(desired=1, launched=1, failures=[], record=record, now=2000.0, after_s=AFTER_S,
                    zones=["a", "b"], zone="b")  # fmt: skip
    assert filled.action is None and filled.record["zones_tried"] == ["b"]


def test_the_watcher_finds_the_zone_by_the_groups_placement_group() -> None:
    zones = [
        {"zone": "a", "subnets": "subnet-a", "placement_group": "pg-a"},
        {"zone": "b", "subnets": "subnet-b", "placement_group": "pg-b"},
    ]
    assert current_zone({"PlacementGroup": "pg-b", "VPCZoneIdentifier": "subnet-b"}, zones) == "b"
    assert current_zone({"VPCZoneIdentifier": "subnet-a"}, zones) == "a"
    assert current_zone({"VPCZoneIdentifier": "subnet-a"}, []) is None


def test_status_shows_the_zone_and_the_move() -> None:
    moved = "no spot in us-east-1a for 0.1 min: moved to us-east-1b"
    info = {"market": SPOT, "switched_at": None, "switch_reason": None, "waiting": None, "desired": 1,
            "zone": "us-east-1b", "moved_at": 0.0, "move_reason": moved}  # fmt: skip
    assert capacity_lines(info, 10.0) == [f"zone: us-east-1b since 1970-01-01 00:00:00 UTC: {moved}"]


def test_spot_training_st8_takes_the_volumes_in_the_zones_the_watcher_moves_the_group_to(
    zoned_template: Template,
) -> None:
    template = dict(zoned_template.to_json())
    volumes = zoned_template.find_resources("AWS::EC2::Volume")
    assert [check_warm_volume(key, dict(volume), template) for key, volume in volumes.items()] == [[]] * len(volumes)
    [function_id] = zoned_template.find_resources("AWS::Lambda::Function")
    del template["Resources"][function_id]  # without the watcher, the second zone's volumes are out of the group's
    problems = [check_warm_volume(key, dict(volume), template) for key, volume in volumes.items()]
    outside = [["not in the AZ of its cluster's group"]] * POOL_SIZE
    assert sorted(problems, key=lambda p: len(p or [])) == [[]] * POOL_SIZE + outside
