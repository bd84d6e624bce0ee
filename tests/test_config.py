"""The team file is the user interface: every mistake is one line naming file, field and fix."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from team_config import ConfigError, instance_architecture, load_team, load_teams
from team_config.instance_types import (
    REGENERATE,
    TYPES_FILE,
    botocore_instance_types,
    instance_facts,
    known_instance_types,
    moto_instance_facts,
    render,
)

GOOD_CLUSTER = {"name": "main", "instance_types": ["g5.xlarge", "g5.2xlarge"], "max_nodes": 2}
# 41 x86 types sold as spot, without GPUs, that a cluster placement group takes: one more than Auto Scaling takes
FORTY_ONE_TYPES = [
    f"{family}.{size}"
    for family in ("c6i", "m6i", "m5", "r5", "c5")
    for size in ("large", "xlarge", "2xlarge", "4xlarge", "12xlarge", "16xlarge", "24xlarge", "metal", "8xlarge")
    if (family, size) not in (("c5", "16xlarge"), ("c5", "8xlarge"))
][:41]


def write(tmp_path: Path, doc: object, name: str = "team-a.yaml") -> Path:
    path = tmp_path / name
    path.write_text(doc if isinstance(doc, str) else yaml.safe_dump(doc))
    return path


def error_for(tmp_path: Path, doc: object, name: str = "team-a.yaml") -> str:
    path = write(tmp_path, doc, name)
    with pytest.raises(ConfigError) as exc:
        load_team(path)
    message = str(exc.value)
    assert message.startswith(f"{path}: "), message
    assert "\n" not in message, f"expected one line, got: {message!r}"
    assert "Traceback" not in message
    return message


# A warm pool that copies an AMI's root, resolved (resolve_snapshots wrote its snapshot_id).
RESOLVED_POOL = {"size": 2, "ami_id": "ami-0123456789abcdef0", "snapshot_id": "snap-0123456789abcdef0"}
# A pool that copies a snapshot given by hand: the nodes boot the AMI it comes from.
POOL_AMI = {"image_id": "ami-0123456789abcdef0"}


def cluster(**overrides: object) -> dict:
    return {"clusters": [{**GOOD_CLUSTER, **overrides}]}


def new_vpc(vpc: dict, **overrides: object) -> dict:
    """``cluster(**overrides)`` in a new VPC of the given ``network.new_vpc`` settings."""
    return {**cluster(**overrides), "network": {"new_vpc": vpc}}


def test_shipped_team_files_are_valid(repo: Path) -> None:
    teams = load_teams(repo / "teams")
    assert teams[0].name == "default"
    assert teams[0].stack_name == "TrainingStack"
    assert all(t.stack_name == f"TrainingStack-{t.name}" for t in teams[1:])


def test_defaults_are_safe(tmp_path: Path) -> None:
    team = load_team(write(tmp_path, cluster()))
    c = team.config.clusters[0]
    assert (c.on_demand_base_capacity, c.on_demand_percentage_above_base) == (0, 0)
    assert c.placement_group and c.spot_allocation_strategy == "price-capacity-optimized"
    assert team.config.checkpoint_bucket.removal_policy == "retain"
    assert team.config.network.az_count == 1


@pytest.mark.parametrize(
    ("doc", "expected"),
    [
        pytest.param(
            cluster(min_nodes=3, desired_nodes=2, max_nodes=4),
            "clusters[0]: need min_nodes <= desired_nodes <= max_nodes, got 3 <= 2 <= 4",
            id="min>desired",
        ),
        pytest.param(
            cluster(desired_nodes=5, max_nodes=4),
            "need min_nodes <= desired_nodes <= max_nodes, got 1 <= 5 <= 4",
            id="desired>max",
        ),
        pytest.param(
            cluster(instance_types=[]),
            "clusters[0].instance_types: List should have at least 1 item",
            id="no-instance-types",
        ),
        pytest.param(
            cluster(instance_types=["g5.xlarge", "g5g.xlarge"]),
            "instance_types mix CPU architectures: g5.xlarge (x86_64), g5g.xlarge (arm64); use types of one",
            id="mixed-architectures",
        ),
        pytest.param(
            cluster(instance_types=["g5xlarge"]),
            "clusters[0].instance_types[0]: 'g5xlarge' does not match the required form",
            id="bad-type",
        ),
        pytest.param(
            cluster(instance_types=["g5.xlarge", "g5.xlarge"]),
            "instance_types: a type is listed twice",
            id="duplicate-type",
        ),
        pytest.param(
            new_vpc({"az_count": 2, "nat_gateways": 1}),
            "team-a.yaml: clusters[0] (main): a cluster placement group lives in one AZ but the network "
            "spans 2; use one AZ/subnet, list the zones the cluster may move between in capacity.zones, or set "
            "placement_group: false",
            id="placement-group-two-azs",
        ),
        pytest.param(
            {
                **cluster(),
                "network": {
                    "existing_vpc": {
                        "vpc_id": "vpc-0123456789abcdef0",
                        "subnets": [
                            {
                                "subnet_id": "subnet-0123456789abcdef0",
                                "availability_zone": "us-east-1a",
                                "route_table_id": "rtb-01234567",
                            },
                            {
                                "subnet_id": "subnet-0123456789abcdef1",
                                "availability_zone": "us-east-1b",
                                "route_table_id": "rtb-01234568",
                            },
                        ],
                    }
                },
            },
            "a cluster placement group lives in one AZ but the network spans 2",
            id="placement-group-two-subnets",
        ),
        pytest.param(
            cluster(warm_pool={"size": 1, "snapshot_id": "snap-0123456789abcdef0"}, ami=POOL_AMI),
            "warm_pool.size (1) is below max_nodes (2); set size to at least max_nodes",
            id="pool-too-small",
        ),
        pytest.param(  # refused at synth, where the deploy would fail (the job spec is an SSM parameter of 4 KB)
            cluster(job={"command": "python train.py " + "--flag " * 250}),
            "job: command, python and checkpoint_dir take 1,808 bytes together, above the 1,000 the job spec has "
            "room for (an SSM parameter of at most 4,096 bytes: the deploy would fail); shorten the command",
            id="job-spec-too-large",
        ),
        pytest.param(  # not "max_nodes + 1", one short of the 10% above max_nodes rebalancing may launch
            cluster(warm_pool={"size": 3, "snapshot_id": "snap-0123456789abcdef0"}, ami=POOL_AMI, max_nodes=25),
            "warm_pool.size (3) is below max_nodes (25); set size to at least max_nodes so every node finds a warm "
            "volume (size: 28 also covers the replacements capacity rebalancing launches",
            id="pool-too-small-rebalancing-margin",
        ),
        pytest.param(  # accepted, warm and cold nodes would run two environments once the DLAMI parameter moves on
            cluster(warm_pool={"size": 2, "snapshot_id": "snap-0123456789abcdef0"}),
            "clusters[0]: warm_pool.snapshot_id snap-0123456789abcdef0 copies one AMI's root, but the nodes boot the "
            "AMI an SSM parameter names at each deploy (ami.ssm_parameter, or the default DLAMI's): once it moves "
            "on, nodes would mount one AMI's environment over another's; set ami.image_id to the AMI the snapshot "
            "comes from (or give warm_pool.ami_id instead and resolve it)",
            id="pool-snapshot-without-ami",
        ),
        pytest.param(
            {
                **cluster(
                    placement_group=False, warm_pool={"size": 2, "snapshot_id": "snap-0123456789abcdef0"}, ami=POOL_AMI
                ),
                "network": {"new_vpc": {"az_count": 2}},
            },
            "clusters[0] (main): a warm volume pool lives in one AZ but the network spans 2",
            id="pool-two-azs",
        ),
        pytest.param(
            cluster(name="GPU_A"),
            "clusters[0].name: 'GPU_A' does not match the required form ^[a-z]",
            id="cluster-name-not-dns",
        ),
        pytest.param(
            {"clusters": [GOOD_CLUSTER, GOOD_CLUSTER]},
            "clusters: name 'main' is used twice; give each cluster a unique name",
            id="duplicate-cluster",
        ),
        pytest.param(
            {**cluster(), "log_retention_days": 10},
            "log_retention_days: 10 is not a CloudWatch retention value; use one of 1, 3, 5, 7, 14, 30",
            id="retention",
        ),
        pytest.param(
            cluster(max_node=4),
            "clusters[0].max_node: unknown key 'max_node': did you mean 'max_nodes'?",
            id="typo-key",
        ),
        pytest.param(
            {**cluster(), "budget": {"usd_per_month": -5}},
            "budget.usd_per_month: Input should be greater than or equal to 0.01 (got -5)",
            id="negative-budget",
        ),
        pytest.param(
            {**cluster(), "budget": {"usd_per_month": 100, "notify": ["ops"]}},
            "budget.notify[0]: 'ops' does not match the required form ^[^@\\s]+@[^@\\s]+\\.[^@\\s]+$; use an email "
            "address such as ml-leads@example.com",
            id="budget-email",
        ),
        pytest.param(
            cluster(job={"checkpoint_interval_s": 0}),
            "clusters[0].job.checkpoint_interval_s: Input should be greater than or equal to 1 (got 0)",
            id="zero-interval",
        ),
        pytest.param(  # accepted, it would have the checkpoint helper save at every step
            cluster(job={"checkpoint_interval_s": 1e-9}),
            "clusters[0].job.checkpoint_interval_s: Input should be greater than or equal to 1 (got 1e-09)",
            id="tiny-interval",
        ),
        pytest.param(  # accepted, it would go into the job spec as null, and the agent would refuse every submit
            cluster(job={"mean_time_between_interruptions_s": 10**400}),
            "clusters[0].job.mean_time_between_interruptions_s: Input should be less than or equal to 315360000 "
            f"(got {str(10**400)[:77]}...)",  # a value quoted in an error line is cut to 80 characters
            id="huge-mtbi",
        ),
        pytest.param(  # a required key misspelt is one line, not two (the typo, and the key as missing)
            {"clusters": [{"name": "main", "instance_types": ["g5.xlarge", "g5.2xlarge"], "max_node": 2}]},
            "clusters[0].max_node: unknown key 'max_node': did you mean 'max_nodes'? allowed keys here: ",
            id="typo-of-a-required-key",
        ),
        pytest.param(
            {"clusters": [{"name": "main", "instance_types": ["g5.xlarge", "g5.2xlarge"]}]},
            "clusters[0].max_nodes: required key is missing; add max_nodes: (see docs/reference/team-file.md)",
            id="missing-key",
        ),
        pytest.param(  # the next five: pydantic's words, followed by the fix they lack
            cluster(root_volume_size_gib=200.0),
            "clusters[0].root_volume_size_gib: Input should be a valid integer, got 200.0; write it without the "
            "decimal point: 200",
            id="int-as-float",
        ),
        pytest.param(
            cluster(placement_group="true"),
            "clusters[0].placement_group: Input should be a valid boolean, got 'true' (text, in quotes); write true or "
            "false without quotes",
            id="quoted-bool",
        ),
        pytest.param(
            cluster(on_demand_base_capacity=None),
            "clusters[0].on_demand_base_capacity: Input should be a valid integer, got nothing (null, or a key with no "
            "value); remove the line to take the default, or give a value",
            id="null-with-default",
        ),
        pytest.param(
            {"clusters": [{**GOOD_CLUSTER, "max_nodes": None}]},
            "clusters[0].max_nodes: Input should be a valid integer, got nothing (null, or a key with no value); give "
            "a value",
            id="null-required",
        ),
        pytest.param(
            {"clusters": []},
            "clusters: List should have at least 1 item after validation, not 0 (got []); add at least 1",
            id="no-clusters",
        ),
        pytest.param(  # accepted, it would have CloudFormation refuse the group at deploy
            cluster(instance_types=FORTY_ONE_TYPES),
            "clusters[0].instance_types: List should have at most 40 items after validation, not 41: an Auto Scaling "
            "group takes at most 40; remove the rest",
            id="too-many-types",
        ),
        pytest.param(  # accepted, the drill would find no spot instance to interrupt
            cluster(interruption_drill={}, on_demand_percentage_above_base=100),
            "clusters[0]: interruption_drill interrupts spot instances, and this cluster launches none (all "
            "on-demand); remove interruption_drill, or lower on_demand_percentage_above_base / on_demand_base_capacity",
            id="drill-without-spot",
        ),
        pytest.param(
            "",
            "the file is empty; write the team's settings (at least clusters:), as in teams/default.yaml",
            id="empty-file",
        ),
        pytest.param(
            cluster(job={"interruption_grace_s": 150}),
            "clusters[0].job.interruption_grace_s: Input should be less than 120 (got 150)",
            id="grace>notice",
        ),
        pytest.param(
            cluster(interruption_drill={"notice_minutes": 1}),
            "clusters[0].interruption_drill.notice_minutes: Input should be greater than or equal to 2 (got 1)",
            id="drill-notice",
        ),
        *(
            pytest.param(
                cluster(warm_pool={**RESOLVED_POOL, "min_free_percent": free}),
                f"clusters[0].warm_pool.min_free_percent: Input should be {expected}",
                id=f"warm-pool-min-free-{free}",
            )
            for free, expected in (
                (95, "less than or equal to 90 (got 95)"),
                (-1, "greater than or equal to 0 (got -1)"),
                (12.5, "a valid integer, got 12.5; write a whole number"),
            )
        ),
        pytest.param(
            new_vpc({"nat_gateways": 0}),
            "network.new_vpc: nat_gateways 0 leaves the nodes no way to SSM, Auto Scaling, EC2 or CloudWatch Logs "
            "(the stack adds only an S3 endpoint), so they could not even leave the group; use 1, or an existing_vpc "
            "with its own endpoints",
            id="no-nat",
        ),
        pytest.param(
            new_vpc({"cidr": "10.0.0.0/8"}),
            "network.new_vpc: cidr '10.0.0.0/8' has prefix /8; use a /16 to /24 range",
            id="cidr",
        ),
        pytest.param(  # accepted, nodes in it could not reach the metadata service
            new_vpc({"cidr": "169.254.0.0/16"}),
            "network.new_vpc: cidr '169.254.0.0/16' is in 169.254.0.0/16, the link-local range (the instance metadata "
            "service and Amazon DNS); use a private range such as 10.0.0.0/16",
            id="cidr-link-local",
        ),
        pytest.param(
            new_vpc({"cidr": "224.1.0.0/16"}),
            "network.new_vpc: cidr '224.1.0.0/16' is in 224.0.0.0/4, the multicast range; use a private range such "
            "as 10.0.0.0/16",
            id="cidr-multicast",
        ),
        pytest.param(
            {
                **cluster(placement_group=False),
                "network": {
                    "existing_vpc": {
                        "vpc_id": "vpc-0123456789abcdef0",
                        "subnets": [{"subnet_id": "subnet-0123456789abcdef0", "availability_zone": "us-east-1a"}],
                    }
                },
            },
            "route_table_id is required on every subnet when create_s3_endpoint is true",
            id="no-route-table",
        ),
        pytest.param(
            new_vpc({"availability_zones": ["us-east-1b", "us-east-1b"]}),
            "network.new_vpc: availability_zones ['us-east-1b', 'us-east-1b'] names a zone twice; list each zone once",
            id="zone-twice",
        ),
        pytest.param(
            new_vpc({"availability_zones": ["us-east-1b", "eu-west-1a"]}, placement_group=False),
            "availability_zones ['us-east-1b', 'eu-west-1a'] are in different regions; list zones of one region",
            id="zones-two-regions",
        ),
        pytest.param(
            new_vpc({"availability_zones": ["us-east-1b"], "az_count": 2}),
            "network.new_vpc: az_count 2 but availability_zones lists 1; drop az_count (the list sets it)",
            id="zones-and-count",
        ),
        pytest.param(
            new_vpc({"availability_zones": ["us-east-1b", "us-east-1c"]}),
            "a cluster placement group lives in one AZ but the network spans 2",
            id="zones-placement-group",
        ),
        pytest.param(
            new_vpc({"availability_zones": ["useast1b"]}),
            "network.new_vpc.availability_zones[0]: 'useast1b' does not match the required form",
            id="zone-name",
        ),
        pytest.param(
            new_vpc({"az_count": 3}, placement_group=False),
            "network.new_vpc: az_count 3 needs availability_zones: a region-agnostic stack knows only 2 zones",
            id="three-zones-unnamed",
        ),
        pytest.param(
            new_vpc({"availability_zones": []}),
            "team-a.yaml: network.new_vpc.availability_zones: List should have at least 1 item after validation, not 0",
            id="zones-empty",
        ),
        pytest.param(
            cluster(instance_types=["g5.xlarge", "g5.xlarg"]),
            "team-a.yaml: clusters[0]: instance_types: g5.xlarg is not an EC2 instance type (did you mean g5.xlarge?;",
            id="type-typo",
        ),
        pytest.param({"clusters": []}, "clusters: List should have at least 1 item", id="no-clusters"),
        pytest.param(cluster(max_nodes=None), "clusters[0].max_nodes: Input should be a valid integer", id="max-null"),
        pytest.param("clusters: [\n  - name: main\n", "not valid YAML at line", id="yaml-syntax"),
        pytest.param(  # not loaded as 128 GiB without a word
            "clusters:\n  - name: main\n    instance_types: [g5.xlarge, g5.2xlarge]\n    max_nodes: 2\n"
            "    root_volume_size_gib: 0200\n",
            "team-a.yaml: line 5: 0200 is octal to YAML (128); write 200 without the leading 0 (or 128)",
            id="octal",
        ),
        pytest.param(  # not "a number in quotes; remove the quotes", as it has none
            "clusters:\n  - name: main\n    instance_types: [g5.xlarge, g5.2xlarge]\n    max_nodes: 2\n"
            "    job:\n      rendezvous_port: 029400\n",
            "team-a.yaml: line 6: 029400 has a leading 0, so YAML reads it as text; write 29400",
            id="leading-zero",
        ),
        pytest.param(  # not "write 1000...000", 401 digits on one line
            "budget:\n  usd_per_month: 1e400\n  notify: [a@example.com]\n"
            "clusters:\n  - name: main\n    instance_types: [g5.xlarge, g5.2xlarge]\n    max_nodes: 2\n",
            "team-a.yaml: budget.usd_per_month: Input should be a valid number, got '1e400', too large to be a number "
            "here; write a smaller one",
            id="number-too-large",
        ),
        pytest.param(
            "clusters:\n  - name: main\n    instance_types: [g5.xlarge, g5.2xlarge]\n    max_nodes: 0x10\n",
            "team-a.yaml: line 4: 0x10 is hexadecimal to YAML; write 16",
            id="hexadecimal",
        ),
        pytest.param(  # a key is a name, even one with a leading 0: an unknown key, not a number's fix
            "0100: 3\nclusters:\n  - name: main\n    instance_types: [g5.xlarge, g5.2xlarge]\n    max_nodes: 2\n",
            "team-a.yaml: 0100: unknown key '0100'",
            id="leading-zero-key",
        ),
        pytest.param(
            "clusters:\n  - name: main\n    instance_types: [g5.xlarge, g5.2xlarge]\n    max_nodes: 2\n"
            "    on_demand_base_capacity: -010\n",
            "team-a.yaml: line 5: -010 is octal to YAML (-8); write -10 without the leading 0 (or -8)",
            id="negative-octal",
        ),
        pytest.param(
            "- just\n- a list\n", "expected a mapping of keys (clusters:, network:, ...), got list", id="not-a-mapping"
        ),
    ],
)
def test_bad_team_file_is_one_line(tmp_path: Path, doc: object, expected: str) -> None:
    assert expected in error_for(tmp_path, doc)


@pytest.mark.parametrize("zones", [[], ["us-east-1a", "us-east-1b", "us-east-1c", "us-east-1d"]])
def test_a_bad_zone_list_is_not_also_reported_as_an_az_count_never_written(tmp_path: Path, zones: list[str]) -> None:
    message = error_for(tmp_path, new_vpc({"availability_zones": zones}))
    assert "network.new_vpc.availability_zones: List should have at" in message
    assert "az_count" not in message


def test_a_yaml_merge_key_shares_settings_between_clusters(tmp_path: Path) -> None:
    """``<<: *base`` loads: a duplicate-key check that built the merge key as a key would refuse it as "not valid
    YAML"."""
    doc = (
        "x-base: &base\n  instance_types: [g5.xlarge, g5.2xlarge]\n  max_nodes: 4\n"
        "clusters:\n  - <<: *base\n    name: a\n  - <<: *base\n    name: b\n    max_nodes: 2\n"
    )
    with pytest.raises(ConfigError, match=r"x-base"):  # an unknown top-level key is still refused, by name
        load_team(write(tmp_path, doc))
    doc = doc.replace("x-base: &base\n  instance_types: [g5.xlarge, g5.2xlarge]\n  max_nodes: 4\n", "")
    doc = "clusters:\n  - &base\n    name: a\n    instance_types: [g5.xlarge, g5.2xlarge]\n    max_nodes: 4\n" + (
        "  - <<: *base\n    name: b\n    max_nodes: 2\n"
    )
    team = load_team(write(tmp_path, doc))
    a, b = team.config.clusters
    assert (a.name, a.max_nodes, b.name, b.max_nodes) == ("a", 4, "b", 2)
    assert b.instance_types == a.instance_types == ["g5.xlarge", "g5.2xlarge"]
    doc += "    name: c\n"  # an explicit key written twice next to a merge is still refused
    assert error_for(tmp_path, doc).endswith("key 'name' appears twice in one mapping (first at line 7); keep one")


@pytest.mark.parametrize(
    ("doc", "expected"),
    [
        pytest.param(
            "clusters: [{name: a, instance_types: [g5.xlarge], max_nodes: 4}]\nlog_retention_days: 30\n"
            "clusters: [{name: b, instance_types: [g5.xlarge], max_nodes: 2}]\n",
            "line 3: key 'clusters' appears twice in one mapping (first at line 1); keep one",
            id="duplicate-top-level-key",
        ),
        pytest.param(
            "clusters:\n  - name: a\n    instance_types: [g5.xlarge]\n    max_nodes: 2\n    max_nodes: 1000\n",
            "line 5: key 'max_nodes' appears twice in one mapping (first at line 4); keep one",
            id="duplicate-nested-key",
        ),
        pytest.param(
            "clusters: [{name: a, instance_types: [g5.xlarge, g5.2xlarge], max_nodes: 1}]\nlog_retention_days: yes\n",
            "log_retention_days: Input should be a valid integer, got True (YAML reads yes/no/on/off/true/false as "
            "booleans); write a number",
            id="boolean-for-a-number",
        ),
        pytest.param(
            cluster(
                warm_pool={"size": 2, "snapshot_id": "snap-12345678", "volume_size_gib": 20, "iops": 16000},
                ami=POOL_AMI,
            ),
            "clusters[0].warm_pool: iops 16000 exceeds gp3's 500 per GiB of volume_size_gib 20; use iops <= 10000 "
            "or a larger volume",
            id="gp3-iops-per-gib",
        ),
        pytest.param(
            cluster(warm_pool={"size": 2, "snapshot_id": "snap-12345678", "throughput_mibps": 1000}, ami=POOL_AMI),
            "clusters[0].warm_pool: throughput_mibps 1000 exceeds gp3's 0.25 MiB/s per IOPS of iops 3000; use "
            "throughput_mibps <= 750 or iops >= 4000",
            id="gp3-throughput-per-iops",
        ),
        pytest.param(
            {**cluster(), "budget": {"usd_per_month": float("inf")}},
            "budget.usd_per_month: Input should be a finite number (got inf)",
            id="infinite-budget",
        ),
        pytest.param(
            cluster(job={"command": "torchrun train.py"}),
            "clusters[0].job.command: command must be 'python SCRIPT [ARGS]' or 'python -m MODULE [ARGS]', got "
            "'torchrun train.py'",
            id="command-the-agent-refuses",
        ),
        pytest.param(
            cluster(job={"command": "python train.py > out.log"}),
            "clusters[0].job.command: command contains shell syntax '>': it runs without a shell; put the logic in a "
            "script",
            id="command-with-shell-syntax",
        ),
        pytest.param(
            cluster(job={"python": "/opt/../usr/bin/python3"}),
            "clusters[0].job.python: '/opt/../usr/bin/python3' climbs out with '..'; give the absolute path",
            id="python-with-dotdot",
        ),
        pytest.param(
            cluster(ami={"ssm_parameter": "/my/ami"}, warm_pool={**RESOLVED_POOL}),
            "clusters[0]: warm_pool.ami_id ami-0123456789abcdef0 is a copy of one AMI, but ami.ssm_parameter picks "
            "the AMI again at every deploy: nodes would mount one AMI's environment over another's; remove "
            "ami.ssm_parameter (the nodes then boot ami-0123456789abcdef0)",
            id="warm-pool-ami-vs-ssm-parameter",
        ),
        pytest.param(
            cluster(ami={"image_id": "ami-0fedcba9876543210"}, warm_pool={**RESOLVED_POOL}),
            "clusters[0]: ami.image_id ami-0fedcba9876543210 differs from warm_pool.ami_id ami-0123456789abcdef0: "
            "nodes would mount one AMI's environment over another's; set both to the same AMI (or remove "
            "ami.image_id: it defaults to warm_pool.ami_id)",
            id="warm-pool-ami-vs-image-id",
        ),
    ],
)
def test_mistakes_yaml_or_the_agent_would_let_through_are_one_line(tmp_path: Path, doc: object, expected: str) -> None:
    """Each of these is refused in one line; loaded, the last duplicate key would win, `yes` would become 1, the bad
    volume or job would fail only in the CDK construct (a traceback) or on a billed node (the agent refuses the
    command)."""
    assert expected in error_for(tmp_path, doc)


def test_non_utf8_team_file_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "team-a.yaml"
    path.write_bytes(b"# caf\xe9\nclusters: []\n")
    with pytest.raises(ConfigError) as exc:
        load_team(path)
    assert str(exc.value) == f"{path}: not UTF-8 text (byte 0xe9 at offset 5); save it as UTF-8"


def test_missing_teams_dir_and_uppercase_extension_are_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as exc:
        load_teams(tmp_path / "nope")
    assert str(exc.value) == f"{tmp_path / 'nope'}: no such directory; give the folder that holds the team files"
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError) as exc:
        load_teams(tmp_path / "empty")
    assert (
        str(exc.value) == f"{tmp_path / 'empty'}: no team files (*.yaml); add one, e.g. {tmp_path}/empty/default.yaml"
    )
    write(tmp_path, cluster(), "default.yaml")
    write(tmp_path, cluster(), "research.YAML")
    with pytest.raises(ConfigError) as exc:
        load_teams(tmp_path)
    assert str(exc.value) == (
        f"{tmp_path / 'research.YAML'}: team files end in .yaml or .yml (lowercase); rename it to research.yaml"
    )


def test_unknown_top_level_key_lists_allowed_keys(tmp_path: Path) -> None:
    message = error_for(tmp_path, {**cluster(), "log_retention": 30})
    assert "log_retention: unknown key 'log_retention': did you mean 'log_retention_days'?" in message
    assert "allowed keys here: budget, checkpoint_bucket, clusters" in message


def test_cluster_names_that_differ_only_by_dash_are_refused(tmp_path: Path) -> None:
    message = error_for(tmp_path, {"clusters": [{**GOOD_CLUSTER, "name": "a-1"}, {**GOOD_CLUSTER, "name": "a1"}]})
    assert message.endswith("clusters: names 'a-1' and 'a1' differ only by '-'; rename one")


def test_team_name_comes_from_file_and_must_be_dns_safe(tmp_path: Path) -> None:
    message = error_for(tmp_path, cluster(), name="Team_A.yaml")
    assert "team name 'Team_A' (from the file name) is not DNS-safe; rename the file" in message


def test_two_files_for_one_team_are_refused(tmp_path: Path) -> None:
    write(tmp_path, cluster(), "a.yaml")
    write(tmp_path, cluster(), "a.yml")
    with pytest.raises(ConfigError, match=r"a.yml: team 'a' is also defined by .*a.yaml; keep one file per team"):
        load_teams(tmp_path)


def test_unknown_team_selection_names_known_teams(tmp_path: Path) -> None:
    write(tmp_path, cluster(), "default.yaml")
    with pytest.raises(ConfigError, match=r"no team file for -c team=nope; known teams: default$"):
        load_teams(tmp_path, only="nope")


def test_every_bad_file_is_reported_not_just_the_first(tmp_path: Path) -> None:
    write(tmp_path, cluster(max_nodes=0), "a.yaml")
    write(tmp_path, {**cluster(), "log_retention_days": 2}, "b.yaml")
    with pytest.raises(ConfigError) as exc:
        load_teams(tmp_path)
    lines = str(exc.value).splitlines()
    assert len(lines) == 2
    assert lines[0].startswith(f"{tmp_path / 'a.yaml'}: clusters[0].max_nodes")
    assert lines[1].startswith(f"{tmp_path / 'b.yaml'}: log_retention_days: 2 is not a CloudWatch retention value")


@pytest.mark.parametrize(
    ("instance_type", "arch"),
    [
        ("g5.xlarge", "x86_64"),
        ("p4d.24xlarge", "x86_64"),
        ("m7i-flex.large", "x86_64"),
        ("g6e.2xlarge", "x86_64"),
        ("g5g.xlarge", "arm64"),
        ("m7gd.large", "arm64"),
        ("c6gn.16xlarge", "arm64"),
        ("a1.large", "arm64"),
        ("hpc7g.16xlarge", "arm64"),
        ("im4gn.large", "arm64"),
        ("x2gd.large", "arm64"),
        ("trn1n.32xlarge", "x86_64"),
        ("p6e-gb200.36xlarge", "arm64"),  # no facts in moto: by its name (not the x86_64 fallback)
        ("u-12tb1.metal", "x86_64"),
        ("u7ib-12tb.224xlarge", "x86_64"),
        ("g4ad.xlarge", "x86_64"),
    ],
)
def test_instance_architecture(instance_type: str, arch: str) -> None:
    assert instance_architecture(instance_type) == arch


def test_app_exits_2_with_one_line_per_problem_and_no_traceback(tmp_path: Path, repo: Path) -> None:
    """The real entry point (`python3 app.py`, what `cdk synth` runs) on a bad team folder."""
    write(tmp_path, cluster(min_nodes=3, max_nodes=2, desired_nodes=2), "default.yaml")
    env = {**os.environ, "CDK_CONTEXT_JSON": f'{{"teams_dir": "{tmp_path}"}}', "CDK_OUTDIR": str(tmp_path / "out")}
    result = subprocess.run([sys.executable, "app.py"], cwd=repo, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert errors == [
        f"error: {tmp_path / 'default.yaml'}: clusters[0]: "
        "need min_nodes <= desired_nodes <= max_nodes, got 3 <= 2 <= 2"
    ]


def test_the_instance_type_list_is_the_pinned_botocores() -> None:
    """team_config/ec2_instance_types.txt is what the pinned botocore knows (regenerate it after an upgrade)."""
    version, types = botocore_instance_types()
    assert sorted(known_instance_types()) == types, (
        f"run .venv/bin/python -m team_config.instance_types (botocore {version})"
    )
    assert {"g5.xlarge", "g6e.xlarge", "p5.48xlarge", "g5g.xlarge"} <= known_instance_types()


@pytest.mark.parametrize(
    ("doc", "expected"),
    [
        ("? [a, b]\n: 1\n", "line 1: a key is a list, not a name; write a plain key such as max_nodes:"),
        (
            "clusters: []\n? {a: 1}\n: 1\n",
            "line 2: a key is a mapping, not a name; write a plain key such as max_nodes:",
        ),
    ],
)
def test_a_key_that_is_a_list_or_a_mapping_is_one_line(tmp_path: Path, doc: str, expected: str) -> None:
    """YAML allows complex keys (``? [a, b]``); the duplicate-key check must not fail on them (unhashable type)."""
    assert error_for(tmp_path, doc) == f"{tmp_path / 'team-a.yaml'}: {expected}"


SUBNET = {"subnet_id": "subnet-0123456789abcdef0", "availability_zone": "us-east-1a", "route_table_id": "rtb-01234567"}


@pytest.mark.parametrize(
    ("doc", "field", "value", "use"),
    [
        pytest.param(
            cluster(name="Main"),
            "clusters[0].name",
            "Main",
            "lowercase letters, digits and '-' (a letter first, no '-' last, at most 32), such as gpu-a",
            id="name",
        ),
        pytest.param(
            cluster(ami={"image_id": "ami-12"}), "clusters[0].ami.image_id", "ami-12", "an AMI id such as "
            "ami-0123456789abcdef0", id="ami"
        ),
        pytest.param(
            {**cluster(), "network": {"existing_vpc": {"vpc_id": "vpc-0123456789abcdef0",
                                                       "subnets": [{**SUBNET, "subnet_id": "sn-1"}]}}},
            "network.existing_vpc.subnets[0].subnet_id", "sn-1", "a subnet id such as subnet-0123456789abcdef0",
            id="subnet",
        ),
        pytest.param(
            {**cluster(), "network": {"existing_vpc": {"vpc_id": "vpc-0123456789abcdef0",
                                                       "subnets": [{**SUBNET, "availability_zone": "us-east1a"}]}}},
            "network.existing_vpc.subnets[0].availability_zone", "us-east1a", "a zone name such as us-east-1a",
            id="zone",
        ),
    ],
)  # fmt: skip
def test_a_value_of_the_wrong_form_says_what_a_valid_one_looks_like(
    tmp_path: Path, doc: object, field: str, value: str, use: str
) -> None:
    message = error_for(tmp_path, doc)
    assert message.startswith(f"{tmp_path / 'team-a.yaml'}: {field}: {value!r} does not match the required form ^")
    assert message.endswith(f"$; use {use}")


# ------------------------------------------------ review fixes: each is refused here, not loaded (or failed later)
def one_cluster(**fields: object) -> dict:
    """A team of one cluster of exactly ``fields`` (name and max_nodes added)."""
    return {"clusters": [{"name": "main", "max_nodes": 2, **fields}]}


@pytest.mark.parametrize(
    ("doc", "expected"),
    [
        pytest.param(
            one_cluster(instance_types=["g5.xlarge"]),
            "clusters[0]: instance_types lists one type (g5.xlarge), but a spot group needs at least 2 to fall back on "
            "(SpotTraining-ST2); list a second type with the same GPU count, such as g5.2xlarge, or set "
            "on_demand_percentage_above_base: 100",
            id="one-type-spot",
        ),
        pytest.param(
            one_cluster(instance_types=["p4d.24xlarge"], on_demand_base_capacity=2, on_demand_percentage_above_base=99),
            "clusters[0]: instance_types lists one type (p4d.24xlarge), but a spot group needs at least 2 to fall back "
            "on (SpotTraining-ST2); list a second type with the same GPU count, such as p4de.24xlarge, or set "
            "on_demand_percentage_above_base: 100",
            id="one-type-99-percent-on-demand",
        ),
        pytest.param(
            one_cluster(instance_types=["g5.xlarge", "g5.12xlarge"]),
            "clusters[0]: instance_types have different GPU counts: g5.xlarge (1), g5.12xlarge (4); "
            "job.nproc_per_node is one number for every node: list types with the same GPU count",
            id="gpu-counts-differ",
        ),
        pytest.param(
            one_cluster(instance_types=["g5.xlarge", "g6.xlarge"], job={"nproc_per_node": 4}),
            "clusters[0]: job.nproc_per_node 4 exceeds the 1 NVIDIA A10G GPU of g5.xlarge; set nproc_per_node to at "
            "most 1 (one process per GPU) or use types with 4 GPUs",
            id="nproc-above-gpus",
        ),
        pytest.param(
            one_cluster(instance_types=["g5.12xlarge", "g6.12xlarge"], job={"nproc_per_node": 8}),
            "clusters[0]: job.nproc_per_node 8 exceeds the 4 NVIDIA A10G GPUs of g5.12xlarge; set nproc_per_node to at "
            "most 4 (one process per GPU) or use types with 8 GPUs",
            id="nproc-above-four-gpus",
        ),
        pytest.param(
            one_cluster(instance_types=["g5.xlarge", "c5.xlarge"]),
            "clusters[0]: instance_types mix GPU and non-GPU types: g5.xlarge (1 NVIDIA A10G), c5.xlarge (no GPU); "
            "use types of one kind",
            id="gpu-and-cpu",
        ),
        pytest.param(
            one_cluster(instance_types=["t3.large", "t3.xlarge"]),
            "clusters[0]: instance_types: t3.large cannot launch into a cluster placement group (EC2 does not place it "
            "there); set placement_group: false or use another type",
            id="no-cluster-placement",
        ),
        pytest.param(
            one_cluster(instance_types=["hpc7g.8xlarge", "hpc7g.16xlarge"]),
            "clusters[0]: instance_types: hpc7g.8xlarge is not sold as spot; remove it, or set "
            "on_demand_percentage_above_base: 100 (all on-demand)",
            id="no-spot",
        ),
        pytest.param(
            one_cluster(instance_types=["mac2.metal", "mac2-m2.metal"], placement_group=False),
            "clusters[0]: instance_types: mac2.metal is an EC2 Mac (arm64_mac: macOS on a Dedicated Host), which "
            "neither spot groups nor the Linux training AMIs run on; use x86_64 or arm64 Linux types",
            id="mac",
        ),
        pytest.param(
            one_cluster(instance_types=["mac1.metal", "c5.metal"], placement_group=False),
            "clusters[0]: instance_types: mac1.metal is an EC2 Mac (x86_64_mac: macOS on a Dedicated Host), which "
            "neither spot groups nor the Linux training AMIs run on; use x86_64 or arm64 Linux types",
            id="intel-mac",
        ),
    ],
)
def test_instance_types_are_checked_against_ec2s_facts(tmp_path: Path, doc: object, expected: str) -> None:
    assert error_for(tmp_path, doc).endswith(f"team-a.yaml: {expected}")


@pytest.mark.parametrize(
    "fields",
    [
        pytest.param(
            {"instance_types": ["g5.xlarge"], "on_demand_percentage_above_base": 100}, id="one-type-on-demand"
        ),
        pytest.param(
            {"instance_types": ["hpc7g.8xlarge", "hpc7g.16xlarge"], "on_demand_percentage_above_base": 100},
            id="no-spot-type-on-demand",
        ),
        pytest.param({"instance_types": ["t3.large", "t3.xlarge"], "placement_group": False}, id="t3-no-placement"),
        pytest.param({"instance_types": ["g5.12xlarge", "g6.12xlarge"], "job": {"nproc_per_node": 4}}, id="4-gpus"),
        pytest.param({"instance_types": ["g6f.large", "g6f.xlarge"]}, id="fractional-gpu-is-one-device"),
        pytest.param({"instance_types": ["c5.xlarge", "c5.2xlarge"], "job": {"nproc_per_node": 8}}, id="cpu-nproc"),
        # botocore knows these, moto has no facts of them: the fact checks skip them (README says so)
        pytest.param({"instance_types": ["g3.4xlarge", "p3.2xlarge"], "job": {"nproc_per_node": 8}}, id="unknown"),
    ],
)
def test_instance_types_ec2_allows_load(tmp_path: Path, fields: dict) -> None:
    assert (
        load_team(write(tmp_path, one_cluster(**fields))).config.clusters[0].instance_types == fields["instance_types"]
    )


@pytest.mark.parametrize("percent", [0, 50, 99, 100])
@pytest.mark.parametrize("types", [["g5.xlarge"], ["g5.xlarge", "g5.2xlarge"]])
def test_the_model_refuses_exactly_what_spot_training_st2_flags(tmp_path: Path, percent: int, types: list[str]) -> None:
    """The rule reads the group as the construct renders it (training_constructs/spot_fleet.py)."""
    from compliance.spot_training.auto_scaling import check_mixed_instances

    group = {
        "Properties": {
            "MixedInstancesPolicy": {
                "InstancesDistribution": {
                    "OnDemandPercentageAboveBaseCapacity": percent,
                    "SpotAllocationStrategy": "price-capacity-optimized",
                },
                "LaunchTemplate": {"Overrides": [{"InstanceType": t} for t in types]},
            }
        }
    }
    flagged = bool(check_mixed_instances("Group", group, {"Resources": {"Group": group}}))
    path = write(tmp_path, one_cluster(instance_types=types, on_demand_percentage_above_base=percent))
    try:
        load_team(path)
        refused = False
    except ConfigError as exc:
        assert "SpotTraining-ST2" in str(exc)
        refused = True
    assert refused == flagged


def test_the_instance_type_file_has_motos_facts() -> None:
    """team_config/ec2_instance_types.txt is what `python -m team_config.instance_types` writes from the pinned botocore
    and moto: the facts agree with moto's instance type data, and botocore's types moto lacks have none."""
    version, types = botocore_instance_types()
    moto_version, facts = moto_instance_facts()
    assert instance_facts() == {t: facts.get(t) for t in types}, f"run {REGENERATE}"
    assert TYPES_FILE.read_text() == render(version, types, moto_version, facts), f"run {REGENERATE}"
    g5 = instance_facts()["g5.xlarge"]
    assert g5 is not None and (g5.architecture, g5.gpus, g5.gpu, g5.cluster_placement, g5.spot) == (
        "x86_64",
        1,
        "NVIDIA A10G",
        True,
        True,
    )
    assert instance_facts()["g3.4xlarge"] is None  # botocore's, not moto's


@pytest.mark.parametrize(
    ("instance_type", "arch"),
    [
        ("mac2.metal", "arm64_mac"),  # the name alone says x86_64
        ("mac1.metal", "x86_64_mac"),
        ("m9g.metal-24xl", "arm64"),  # botocore's, not moto's: from the name
        ("g4ad.xlarge", "x86_64"),
    ],
)
def test_instance_architecture_comes_from_ec2_where_known(instance_type: str, arch: str) -> None:
    assert instance_architecture(instance_type) == arch


EMPTY = "clusters:\n  - name: main\n    instance_types: [g5.xlarge, g5.2xlarge]\n    max_nodes: 2\n"


@pytest.mark.parametrize(
    ("doc", "expected"),
    [
        pytest.param(EMPTY + "budget:\n", "budget is empty: give its keys (usd_per_month: ...) or remove the line"),
        pytest.param(
            EMPTY + "    interruption_drill:\n",
            "clusters[0].interruption_drill is empty: write interruption_drill: {} for the defaults, or remove the "
            "line",
        ),
        pytest.param(
            EMPTY + "    warm_pool:\n",
            "clusters[0].warm_pool is empty: give its keys (size: ..., snapshot_id: ...) or remove the line",
        ),
        pytest.param(
            EMPTY + "    job:\n",
            "clusters[0].job is empty: give its keys (command: ..., nproc_per_node: ...) or remove the line for the "
            "defaults",
        ),
        pytest.param(
            EMPTY + "    ami: ~\n",
            "clusters[0].ami is empty: give its keys (image_id: ... or ssm_parameter: ...) or remove the line for the "
            "default AMI",
        ),
        pytest.param(
            EMPTY + "network:\n",
            "network is empty: give new_vpc: or existing_vpc: under it, or remove the line for a new single-AZ VPC",
        ),
        pytest.param(
            EMPTY + "network:\n  existing_vpc:\n",
            "network.existing_vpc is empty: give its keys (vpc_id: ..., subnets: ...) or remove the line",
        ),
        pytest.param(
            EMPTY + "network:\n  new_vpc:\n",
            "network.new_vpc is empty: write new_vpc: {} for the defaults, or remove the line",
        ),
        pytest.param("clusters:\n", "clusters is empty: give at least one cluster (- name: ...) under it"),
    ],
)
def test_an_empty_section_is_refused_not_turned_off(tmp_path: Path, doc: str, expected: str) -> None:
    """An empty `budget:` (YAML null) is refused, not loaded as no budget at all; an empty `job:` is named with its
    keys, not with pydantic's class (JobConfig)."""
    assert error_for(tmp_path, doc) == f"{tmp_path / 'team-a.yaml'}: {expected}"


def test_an_empty_mapping_still_means_the_defaults(tmp_path: Path) -> None:
    team = load_team(write(tmp_path, EMPTY + "    interruption_drill: {}\n    job: {}\n"))
    drill = team.config.clusters[0].interruption_drill
    assert drill is not None and (drill.percent, drill.notice_minutes) == (50, 2)


STALL_FIX = (
    "is outside 300 to 86400 seconds (5 minutes to a day: a trainer silent for less may just be loading or saving); "
    "give seconds in that range, or null to turn the stall watchdog off"
)


@pytest.mark.parametrize(("seconds", "shown"), [(299, "299"), (0, "0"), (86401, "86401"), (-1, "-1")])
def test_a_stall_timeout_outside_its_range_is_one_line_with_the_fix(tmp_path: Path, seconds: int, shown: str) -> None:
    assert error_for(tmp_path, cluster(job={"stall_timeout_s": seconds})) == (
        f"{tmp_path / 'team-a.yaml'}: clusters[0].job.stall_timeout_s: {shown} {STALL_FIX}"
    )


def test_a_stall_timeout_is_whole_seconds(tmp_path: Path) -> None:
    assert error_for(tmp_path, cluster(job={"stall_timeout_s": 600.5})) == (
        f"{tmp_path / 'team-a.yaml'}: clusters[0].job.stall_timeout_s: Input should be a valid integer, got 600.5; "
        "write a whole number"
    )


def test_the_stall_timeout_is_off_unless_set(tmp_path: Path) -> None:
    """Off by default (a default of an hour ended healthy jobs with a silent phase longer than that); an explicit null
    is off too (unlike an empty section, refused above)."""

    def loaded(doc: object) -> object:
        return load_team(write(tmp_path, doc)).config.clusters[0].job.stall_timeout_s

    assert loaded(cluster()) is None
    assert loaded(EMPTY + "    job:\n      stall_timeout_s: null\n") is None
    assert [loaded(cluster(job={"stall_timeout_s": s})) for s in (300, 86400)] == [300, 86400]


@pytest.mark.parametrize(("stall", "interval", "fix"), [(600, 301, "at least 602"), (600, 400.5, "at least 801")])
def test_a_stall_timeout_under_twice_the_checkpoint_interval_is_one_line_with_the_fix(
    tmp_path: Path, stall: int, interval: float, fix: str
) -> None:
    """A node whose only sign of progress is its checkpoints would be ended between two."""
    assert error_for(tmp_path, cluster(job={"stall_timeout_s": stall, "checkpoint_interval_s": interval})) == (
        f"{tmp_path / 'team-a.yaml'}: clusters[0].job: stall_timeout_s {stall} is less than twice "
        f"checkpoint_interval_s {interval:g}: a node whose only sign of progress is its checkpoints would be ended "
        f"as hung between two; set job.checkpoint_interval_s to at most 300, or job.stall_timeout_s to {fix}"
    )


def test_a_stall_timeout_of_twice_the_checkpoint_interval_or_more_is_fine(tmp_path: Path) -> None:
    for job in ({"stall_timeout_s": 600, "checkpoint_interval_s": 300}, {"stall_timeout_s": 600}):
        assert load_team(write(tmp_path, cluster(job=job))).config.clusters[0].job.stall_timeout_s == 600


@pytest.mark.parametrize(
    "directory",
    ["/", "//", "/usr", "//usr", "///etc/ckpt", "/usr/local/ckpt", "/etc/ckpt", "/opt/", "/home", "/tmp", "/var"],
)
def test_a_system_directory_is_not_a_checkpoint_dir(tmp_path: Path, directory: str) -> None:
    assert error_for(tmp_path, cluster(job={"checkpoint_dir": directory})).endswith(
        f"clusters[0].job.checkpoint_dir: {directory!r} is a system directory: the node agent uploads everything under "
        "checkpoint_dir to S3; use a directory of its own, such as /opt/ml/checkpoints"
    )


@pytest.mark.parametrize("directory", ["/opt/ml/checkpoints", "/tmp/ckpt", "/home/ubuntu/ckpt", "/dev/shm/ckpt"])
def test_a_checkpoint_dir_of_its_own_is_fine(tmp_path: Path, directory: str) -> None:
    assert load_team(write(tmp_path, cluster(job={"checkpoint_dir": directory}))).config.clusters[0].job.checkpoint_dir


ELEVEN = [f"lead{i}@example.com" for i in range(11)]


@pytest.mark.parametrize(
    ("budget", "expected"),
    [
        pytest.param(
            {"usd_per_month": 100, "notify": ELEVEN},
            "budget.notify: 11 addresses, but AWS Budgets emails at most 10 per alert; list at most 10 (a mailing "
            "list address reaches more people)",
            id="eleven",
        ),
        pytest.param(
            {"usd_per_month": 100, "notify": ["a@example.com", "b@example.com", "A@example.com"]},
            "budget.notify: A@example.com is listed twice; list each address once",
            id="twice",
        ),
        pytest.param(
            {"usd_per_month": 1e300},
            "budget.usd_per_month: Input should be less than or equal to 1000000000 (got 1e+300)",
            id="huge",
        ),
        pytest.param(
            {"usd_per_month": 1e-7},
            "budget.usd_per_month: Input should be greater than or equal to 0.01 (got 1e-07)",
            id="tiny",
        ),
    ],
)
def test_budget_limits_of_aws_budgets(tmp_path: Path, budget: dict, expected: str) -> None:
    assert error_for(tmp_path, {**cluster(), "budget": budget}).endswith(f"team-a.yaml: {expected}")


def test_budget_at_its_limits_loads(tmp_path: Path) -> None:
    team = load_team(write(tmp_path, {**cluster(), "budget": {"usd_per_month": 1_000_000_000, "notify": ELEVEN[:10]}}))
    assert team.config.budget is not None and len(team.config.budget.notify) == 10


def existing(*subnets: dict, **vpc: object) -> dict:
    return {
        **cluster(placement_group=False),
        "network": {"existing_vpc": {"vpc_id": "vpc-0123456789abcdef0", "subnets": list(subnets), **vpc}},
    }


SUBNET_B = {
    "subnet_id": "subnet-0123456789abcdef1",
    "availability_zone": "us-east-1b",
    "route_table_id": "rtb-01234568",
}


@pytest.mark.parametrize(
    ("doc", "expected"),
    [
        pytest.param(
            existing(SUBNET, {**SUBNET_B, "subnet_id": SUBNET["subnet_id"]}),
            "network.existing_vpc: subnets: subnet-0123456789abcdef0 is listed twice; list each subnet once",
            id="subnet-twice",
        ),
        pytest.param(
            existing(SUBNET, {**SUBNET_B, "availability_zone": "eu-west-1b"}),
            "network.existing_vpc: subnets: availability zones ['us-east-1a', 'eu-west-1b'] are in different regions; "
            "list zones of one region",
            id="two-regions",
        ),
        pytest.param(
            existing(SUBNET, {k: v for k, v in SUBNET_B.items() if k != "route_table_id"}, create_s3_endpoint=False),
            "network.existing_vpc: subnets: route_table_id is given on subnets[0] but not on subnets[1]; give it on "
            "every subnet or on none",
            id="some-route-tables",
        ),
    ],
)
def test_existing_vpc_subnets_are_consistent(tmp_path: Path, doc: dict, expected: str) -> None:
    """Each is one line at load: the route tables would otherwise fail synth in jsii (MustBeNumberEqualAmount), the
    rest at deploy."""
    assert error_for(tmp_path, doc).endswith(f"team-a.yaml: {expected}")


def test_existing_vpc_without_any_route_table_loads_without_an_endpoint(tmp_path: Path) -> None:
    bare = [{k: v for k, v in s.items() if k != "route_table_id"} for s in (SUBNET, SUBNET_B)]
    doc = existing(*bare, create_s3_endpoint=False)
    doc["clusters"][0]["cross_zone_training"] = True  # two subnets, two AZs
    assert load_team(write(tmp_path, doc)).config.network.az_count == 2


def test_a_multi_node_cluster_across_zones_is_refused_unless_the_team_accepts_the_charge(tmp_path: Path) -> None:
    """Loaded without a word, it would let Auto Scaling spread the nodes over the zones, and every step's all-reduce
    would cross them, billed per GB each way (for a large model, more than the spot instances)."""
    doc = new_vpc({"az_count": 2}, placement_group=False)
    assert error_for(tmp_path, doc).endswith(
        "clusters[0] (main): max_nodes 2 across 2 AZs: the nodes' gradient exchange at every step would cross zones, "
        "billed as inter-AZ data transfer (about $0.01 per GB each way, not in trainctl cost) and slower than within "
        "one; use one AZ/subnet, or set cross_zone_training: true to accept the charge"
    )
    doc["clusters"][0]["cross_zone_training"] = True
    assert load_team(write(tmp_path, doc)).config.clusters[0].cross_zone_training
    one_node = new_vpc({"az_count": 2}, placement_group=False, max_nodes=1, desired_nodes=1)
    assert load_team(write(tmp_path, one_node)).config.network.az_count == 2  # nothing crosses a zone


@pytest.mark.parametrize(
    ("doc", "expected"),
    [
        pytest.param(
            cluster(job={"checkpoint_dir": "/opt/ml/my checkpoints"}),
            "clusters[0].job.checkpoint_dir: '/opt/ml/my checkpoints' does not match the required form "
            "^/[A-Za-z0-9._/-]*$; use an absolute path of letters, digits, '.', '_', '-' and '/' (no spaces), such as "
            "/opt/ml/checkpoints or /opt/pytorch/bin/python",
            id="checkpoint-dir-form",
        ),
        pytest.param(
            cluster(job={"python": "python3"}),
            "clusters[0].job.python: 'python3' does not match the required form ^/[A-Za-z0-9._/-]*$; use an absolute "
            "path of letters, digits, '.', '_', '-' and '/' (no spaces), such as /opt/ml/checkpoints or "
            "/opt/pytorch/bin/python",
            id="python-form",
        ),
        pytest.param(
            cluster(ami={"ssm_parameter": "my-ami"}),
            "clusters[0].ami.ssm_parameter: 'my-ami' does not match the required form ^/[A-Za-z0-9._/-]+$; use an SSM "
            "parameter name of letters, digits, '.', '_', '-' and '/', starting with '/', such as "
            "/my-team/training-ami-id",
            id="ssm-parameter-form",
        ),
        pytest.param(
            cluster(instance_types=["G5.xlarge", "g5.2xlarge"]),
            "clusters[0].instance_types[0]: 'G5.xlarge' does not match the required form "
            "^[a-z][a-z0-9-]*\\.[a-z0-9-]+$; did you mean g5.xlarge?",
            id="upper-case-type",
        ),
        pytest.param(
            EMPTY.replace("name: main", "name: no"),
            "clusters[0].name: Input should be a valid string, got false (YAML reads unquoted "
            "yes/no/on/off/true/false as booleans); quote the text, e.g. name: 'no'",
            id="name-no",
        ),
        pytest.param(
            EMPTY.replace("name: main", "name: on"),
            "clusters[0].name: Input should be a valid string, got true (YAML reads unquoted "
            "yes/no/on/off/true/false as booleans); quote the text, e.g. name: 'yes'",
            id="name-on",
        ),
        pytest.param(
            EMPTY.replace("name: main", "name: 2024-01-01"),
            "clusters[0].name: Input should be a valid string, got 2024-01-01 (YAML reads it as a date); quote it: "
            "name: '2024-01-01'",
            id="name-date",
        ),
        pytest.param(
            EMPTY.replace("max_nodes: 2", "max_nodes: 1e3"),
            "clusters[0].max_nodes: Input should be a valid integer, got '1e3', which YAML reads as text, not a "
            "number; write 1000",
            id="int-1e3",
        ),
        pytest.param(
            EMPTY + "budget:\n  usd_per_month: 1e6\n",
            "budget.usd_per_month: Input should be a valid number, got '1e6', which YAML reads as text, not a number; "
            "write 1000000",
            id="float-1e6",
        ),
        pytest.param(
            "clusters: {name: main}\n",
            "clusters: expected a list of clusters (each item starts with '- ', or write [a, b]), got a mapping",
            id="clusters-mapping",
        ),
        pytest.param(
            EMPTY + "    job: python train.py\n",
            "clusters[0].job: expected keys (command:, python:, nproc_per_node: ...) indented under job:, got "
            "'python train.py'",
            id="job-a-string",
        ),
        pytest.param(
            existing({**SUBNET, "az": "us-east-1a"}),
            "network.existing_vpc.subnets[0].az: unknown key 'az': did you mean 'availability_zone'? allowed keys "
            "here: availability_zone, route_table_id, subnet_id",
            id="az",
        ),
        pytest.param(
            EMPTY + "    123: x\n",
            "clusters[0].123: unknown key '123': allowed keys here: ami, capacity, cross_zone_training, desired_nodes, "
            "efa, instance_types, interruption_drill, job, max_nodes, min_nodes, name, on_demand_base_capacity, "
            "on_demand_percentage_above_base, placement_group, root_volume_size_gib, spot_allocation_strategy, "
            "warm_pool",
            id="number-key",
        ),
    ],
)
def test_messages_say_the_fix(tmp_path: Path, doc: object, expected: str) -> None:
    assert error_for(tmp_path, doc) == f"{tmp_path / 'team-a.yaml'}: {expected}"


def test_an_editors_dotfile_is_not_a_team(tmp_path: Path) -> None:
    """Emacs's lock file `.#default.yaml` (a dangling link) is skipped; read as a team, it would fail synth as a bad
    team name."""
    write(tmp_path, cluster(), "default.yaml")
    (tmp_path / ".#default.yaml").symlink_to("user@host.1234:1700000000")
    write(tmp_path, "clusters: [", ".backup.yml")
    assert [t.name for t in load_teams(tmp_path)] == ["default"]


def test_app_py_run_by_hand_synthesizes_the_shipped_teams(tmp_path: Path, repo: Path) -> None:
    """`python3 app.py` without the CDK CLI synthesizes; without cdk.json's feature flags it would fail (a traceback
    on objectOwnership)."""
    env = {k: v for k, v in os.environ.items() if k not in ("CDK_CONTEXT_JSON", "CDK_OUTDIR")}
    env["CDK_OUTDIR"] = str(tmp_path / "out")
    result = subprocess.run([sys.executable, "app.py"], cwd=repo, env=env, capture_output=True, text=True, timeout=600)
    assert (result.returncode, result.stderr.count("Traceback")) == (0, 0), result.stderr[-2000:]
    stacks = {t.stack_name for t in load_teams(repo / "teams")}
    assert {f"{s}.template.json" for s in stacks} <= {p.name for p in (tmp_path / "out").iterdir()}


@pytest.mark.parametrize(
    ("buckets", "expected"),
    [
        (
            ["Team-Data"],
            "data_buckets[0]: 'Team-Data' does not match the required form ^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$; use an "
            "S3 bucket name of 3 to 63 lowercase letters, digits, '.' and '-' (a letter or digit first and last), "
            "such as my-team-datasets",
        ),
        (
            ["s3://team-data"],
            "data_buckets[0]: 's3://team-data' does not match the required form ^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$; "
            "use an S3 bucket name of 3 to 63 lowercase letters, digits, '.' and '-' (a letter or digit first and "
            "last), such as my-team-datasets",
        ),
        (
            ["team-data", "corpus", "team-data"],
            "data_buckets: team-data listed twice; list each bucket once",
        ),
        (
            ["team..data"],
            "data_buckets: 'team..data' is no S3 bucket name (no '..', not an IP address); give the bucket's name as "
            "S3 shows it",
        ),
        (
            ["trainingstack-team-a-checkpointsbucket1a2b3c4d-0a1b2c3d4e5f"],
            "data_buckets: 'trainingstack-team-a-checkpointsbucket1a2b3c4d-0a1b2c3d4e5f' is a training stack's "
            "checkpoint bucket; the nodes reach their own cluster's prefix of it already, so list only buckets of "
            "training data",
        ),
        (
            [f"bucket-{i:02}" for i in range(17)],
            "data_buckets: List should have at most 16 items after validation, not 17: the job spec has room for at "
            "most 16; list fewer",
        ),
        (
            [f"{c * 60}-{i:02}" for i, c in enumerate("abcdefg")],
            "data_buckets: the names take 469 bytes of the job spec, above the 400 it has room for (an SSM parameter "
            "of at most 4,096 bytes); list fewer buckets",
        ),
        ("team-data", "data_buckets: expected a list (each item starts with '- ', or write [a, b]), got 'team-data'"),
    ],
)
def test_a_bad_data_bucket_list_is_one_line_with_the_fix(tmp_path: Path, buckets: object, expected: str) -> None:
    assert error_for(tmp_path, {**cluster(), "data_buckets": buckets}) == f"{tmp_path / 'team-a.yaml'}: {expected}"


def test_data_buckets_load_in_their_order(tmp_path: Path) -> None:
    team = load_team(write(tmp_path, {**cluster(), "data_buckets": ["team-data", "corpus.example.com"]}))
    assert team.config.data_buckets == ["team-data", "corpus.example.com"]
