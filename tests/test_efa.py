"""EFA: the team file's efa setting, the instance-type facts it reads, and the launch templates, security group and
group overrides it synthesizes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from aws_cdk import App

from compliance.spot_training import RULES
from team_config import load_team
from team_config.instance_types import instance_facts
from team_config.loader import Team
from team_config.model import ClusterConfig
from tests.synth import CONTEXT, synth, team_config
from trainctl import review
from trainctl.assembly import Stack
from trainctl.prices import load_prices
from training_app import wiring as cdk_app

from .test_config import error_for

REPO = Path(__file__).resolve().parent.parent
P4D = ["p4d.24xlarge", "p4de.24xlarge"]
P5 = ["p5.48xlarge", "p5e.48xlarge"]


def efa_cluster(**overrides: Any) -> dict[str, Any]:
    return {"name": "big", "instance_types": P4D, "max_nodes": 4, **overrides}


@pytest.fixture(scope="module")
def research() -> dict[str, Any]:
    return dict(synth(load_team(REPO / "teams" / "research.yaml").config, "research")[1].to_json())


@pytest.fixture(scope="module")
def p5_and_mixed() -> dict[str, Any]:
    """A p5 cluster and a p4d/p5 cluster (4 and 32 EFA interfaces per node) in one team."""
    config = team_config(
        clusters=[
            efa_cluster(name="h100", instance_types=P5),
            efa_cluster(name="mixed", instance_types=["p4d.24xlarge", "p5.48xlarge"]),
        ]
    )
    return dict(synth(config)[1].to_json())


def of_type(template: dict[str, Any], type_name: str) -> dict[str, dict[str, Any]]:
    return {k: v for k, v in template["Resources"].items() if v["Type"] == type_name}


def group_of(template: dict[str, Any], cluster: str) -> dict[str, Any]:
    """The Auto Scaling group of ``cluster`` (by the tag it propagates to its nodes)."""
    [group] = [
        g["Properties"]
        for g in of_type(template, "AWS::AutoScaling::AutoScalingGroup").values()
        if {"Key": "spot-training:cluster", "PropagateAtLaunch": True, "Value": cluster} in g["Properties"]["Tags"]
    ]
    return group


def launch_template_data(template: dict[str, Any], spec: dict[str, Any]) -> dict[str, Any]:
    """The LaunchTemplateData a ``LaunchTemplateSpecification`` refers to."""
    return template["Resources"][spec["LaunchTemplateId"]["Ref"]]["Properties"]["LaunchTemplateData"]


def main_template(template: dict[str, Any], cluster: str) -> dict[str, Any]:
    spec = group_of(template, cluster)["MixedInstancesPolicy"]["LaunchTemplate"]["LaunchTemplateSpecification"]
    return launch_template_data(template, spec)


def security_group_id(template: dict[str, Any], cluster: str) -> dict[str, Any]:
    [sg] = [
        k
        for k, v in of_type(template, "AWS::EC2::SecurityGroup").items()
        if {"Key": "spot-training:cluster", "Value": cluster} in v["Properties"].get("Tags", [])
    ]
    return {"Fn::GetAtt": [sg, "GroupId"]}


def test_the_facts_hold_efa_interfaces_and_network_cards_from_ec2s_data() -> None:
    facts = instance_facts()
    layout = {t: (f.efa_interfaces, f.network_cards, f.efa_layout) for t in P4D + P5 if (f := facts[t])}
    assert layout == {
        "p4d.24xlarge": (4, 4, 4),
        "p4de.24xlarge": (4, 4, 4),
        "p5.48xlarge": (32, 32, 32),
        "p5e.48xlarge": (32, 32, 32),
    }
    g5 = facts["g5.xlarge"]
    assert g5 is not None and g5.efa_interfaces == 0


def test_the_research_team_synthesizes_four_efa_interfaces_on_network_cards_0_to_3(research: dict[str, Any]) -> None:
    data = main_template(research, "a100")
    sg = security_group_id(research, "a100")
    assert "SecurityGroupIds" not in data  # on the interfaces: EC2 takes the groups in one place only
    assert data["NetworkInterfaces"] == [
        {"DeviceIndex": 0, "NetworkCardIndex": 0, "InterfaceType": "efa", "Groups": [sg], "DeleteOnTermination": True},
        *(
            {
                "DeviceIndex": 1,
                "NetworkCardIndex": card,
                "InterfaceType": "efa",
                "Groups": [sg],
                "DeleteOnTermination": True,
            }
            for card in (1, 2, 3)
        ),
    ]
    overrides = group_of(research, "a100")["MixedInstancesPolicy"]["LaunchTemplate"]["Overrides"]
    assert overrides == [{"InstanceType": t} for t in P4D]  # the same layout: one launch template
    dev = main_template(research, "dev")  # single-type-family g4dn/g5/g6: no EFA
    assert "NetworkInterfaces" not in dev and dev["SecurityGroupIds"] == [security_group_id(research, "dev")]


def test_no_efa_interface_asks_for_a_public_ip_and_the_subnets_give_none(research: dict[str, Any]) -> None:
    interfaces = main_template(research, "a100")["NetworkInterfaces"]
    assert all(not i.get("AssociatePublicIpAddress", False) for i in interfaces)
    subnets = [s["Properties"] for s in of_type(research, "AWS::EC2::Subnet").values()]
    assert subnets and not any(s.get("MapPublicIpOnLaunch") for s in subnets if "private" in str(s.get("Tags")).lower())
    for subnet_ref in group_of(research, "a100")["VPCZoneIdentifier"]:
        assert not research["Resources"][subnet_ref["Ref"]]["Properties"].get("MapPublicIpOnLaunch", False)


def _allows_all(rule: dict[str, Any]) -> bool:
    return rule.get("IpProtocol") == "-1"


def test_the_efa_security_group_lets_all_traffic_from_itself_in_and_to_itself_out(research: dict[str, Any]) -> None:
    """EFA needs both directions. Egress: the group's allow-all rule covers the outbound half; narrowed, it needs a
    rule to the group itself, or this test fails."""
    sg = security_group_id(research, "a100")
    name = sg["Fn::GetAtt"][0]
    ingress = [r["Properties"] for r in of_type(research, "AWS::EC2::SecurityGroupIngress").values()]
    assert any(r["GroupId"] == sg and r["SourceSecurityGroupId"] == sg and _allows_all(r) for r in ingress)
    inline = research["Resources"][name]["Properties"].get("SecurityGroupEgress", [])
    separate = [r["Properties"] for r in of_type(research, "AWS::EC2::SecurityGroupEgress").values()]
    to_all = [r for r in inline if r.get("CidrIp") == "0.0.0.0/0" and _allows_all(r)]
    to_itself = [r for r in inline + separate if r.get("DestinationSecurityGroupId") == sg and _allows_all(r)]
    assert to_all or to_itself, f"egress of {name} reaches neither everywhere nor the group itself: {inline}"


def test_a_p5_cluster_gets_32_efa_interfaces(p5_and_mixed: dict[str, Any]) -> None:
    interfaces = main_template(p5_and_mixed, "h100")["NetworkInterfaces"]
    assert [i["NetworkCardIndex"] for i in interfaces] == list(range(32))
    assert [i["DeviceIndex"] for i in interfaces] == [0] + [1] * 31
    assert {i["InterfaceType"] for i in interfaces} == {"efa"}


def test_a_mixed_cluster_gets_a_launch_template_per_interface_count(p5_and_mixed: dict[str, Any]) -> None:
    policy = group_of(p5_and_mixed, "mixed")["MixedInstancesPolicy"]["LaunchTemplate"]
    main = launch_template_data(p5_and_mixed, policy["LaunchTemplateSpecification"])
    assert len(main["NetworkInterfaces"]) == 4  # the first type's, p4d
    p4d, p5 = policy["Overrides"]
    assert p4d == {"InstanceType": "p4d.24xlarge"}
    assert p5["InstanceType"] == "p5.48xlarge"
    other = launch_template_data(p5_and_mixed, p5["LaunchTemplateSpecification"])
    assert len(other["NetworkInterfaces"]) == 32
    for key in ("MetadataOptions", "BlockDeviceMappings", "UserData", "IamInstanceProfile", "Placement"):
        assert other[key] == main[key], key


@pytest.mark.parametrize(
    ("cluster", "efa"),
    [
        (efa_cluster(), True),  # auto: EFA types, 4 nodes, a placement group
        (efa_cluster(max_nodes=1, desired_nodes=1), False),  # one node: nothing to talk to
        (efa_cluster(efa=False), False),
        (efa_cluster(placement_group=False), False),
        (efa_cluster(instance_types=["p4d.24xlarge", "g5.48xlarge"], job={"nproc_per_node": 8}), True),
        (efa_cluster(instance_types=["g6.xlarge", "g5.xlarge"]), False),  # no EFA on either
        (efa_cluster(instance_types=["p4d.24xlarge", "p3.16xlarge"]), False),  # p3: facts unknown
    ],
)
def test_auto_is_on_for_multi_node_clusters_of_efa_types_in_a_placement_group(cluster: dict, efa: bool) -> None:
    assert ClusterConfig.model_validate(cluster).efa_enabled is efa


@pytest.mark.parametrize(
    ("cluster", "network", "expected"),
    [
        (
            efa_cluster(efa=True, instance_types=["g6.xlarge", "g5.xlarge"]),
            None,
            "clusters[0]: efa: true on cluster big, but g6.xlarge has no EFA; list only EFA types (such as "
            "p4d.24xlarge, p5.48xlarge) or set efa: auto (off for this cluster)",
        ),
        (
            efa_cluster(efa=True, placement_group=False),
            None,
            "clusters[0]: efa: true on cluster big (p4d.24xlarge, p4de.24xlarge) with placement_group: false; EFA "
            "wants its nodes in one cluster placement group: set placement_group: true or efa: false",
        ),
        (
            efa_cluster(efa=True, cross_zone_training=True),
            {"new_vpc": {"az_count": 2}},
            "clusters[0] (big): efa: true (p4d.24xlarge, p4de.24xlarge) across 2 AZs, but EFA traffic stays within "
            "one subnet; use one AZ/subnet or set efa: false",
        ),
    ],
)
def test_efa_true_where_it_cannot_work_is_one_line_naming_cluster_type_and_fix(
    tmp_path: Path, cluster: dict, network: Any, expected: str
) -> None:
    doc: dict[str, Any] = {"clusters": [cluster], **({"network": network} if network else {})}
    assert error_for(tmp_path, doc) == f"{tmp_path / 'team-a.yaml'}: {expected}"


def test_efa_takes_auto_true_or_false_only(tmp_path: Path) -> None:
    assert error_for(tmp_path, {"clusters": [efa_cluster(efa="yes")]}) == (
        f"{tmp_path / 'team-a.yaml'}: clusters[0].efa: expected auto, true or false; write efa: auto, true or false "
        "(no quotes) (got 'yes')"
    )


def st11(max_size: str = "4", types: tuple[str, ...] = tuple(P4D), **data: Any) -> dict[str, Any]:
    """A group over ``types`` with launch template ``LT`` (of ``data``, in placement group PG unless given)."""
    data.setdefault("Placement", {"GroupName": {"Ref": "PG"}})
    group = {
        "Type": "AWS::AutoScaling::AutoScalingGroup",
        "Properties": {
            "MaxSize": max_size,
            "MixedInstancesPolicy": {
                "LaunchTemplate": {
                    "LaunchTemplateSpecification": {"LaunchTemplateId": {"Ref": "LT"}},
                    "Overrides": [{"InstanceType": t} for t in types],
                }
            },
        },
    }
    template = {"G": group, "LT": {"Type": "AWS::EC2::LaunchTemplate", "Properties": {"LaunchTemplateData": data}}}
    rule = {r.id: r for r in RULES}["ST11"]
    return {"rule": rule, "template": {"Resources": template}}


def run_st11(case: dict[str, Any]) -> Any:
    template = case["template"]
    return case["rule"].check("G", template["Resources"]["G"], template)


def test_st11_warns_on_a_multi_node_group_of_efa_types_without_efa() -> None:
    assert {r.id: r for r in RULES}["ST11"].severity == "warning"
    assert run_st11(st11()) == ["p4d.24xlarge, p4de.24xlarge in a placement group with no EFA interface"]
    assert run_st11(st11(NetworkInterfaces=[{"DeviceIndex": 0, "InterfaceType": "efa"}])) == []
    assert run_st11(st11(max_size="1")) is None  # one node: nothing to talk to
    assert run_st11(st11(Placement={})) is None  # no placement group: efa: true is refused there
    assert run_st11(st11(types=("g5.xlarge", "g6.xlarge"))) is None  # no EFA on the types


def test_efa_off_on_a_multi_node_efa_cluster_is_a_warning_and_the_synth_goes_on(tmp_path: Path) -> None:
    app = App(context=CONTEXT, outdir=str(tmp_path))
    config = team_config(clusters=[efa_cluster(efa=False)])
    cdk_app.add_teams(app, [Team(name="x", path=Path("x.yaml"), config=config)])
    app.synth()  # a warning: no ValidationFailed
    report = json.loads((tmp_path / "validation-report.json").read_text())
    found = [(v["ruleName"], v["severity"]) for p in report["pluginReports"] for v in p["violations"]]
    assert found == [("SpotTraining-ST11", "warning")]


def test_review_shows_efa_interfaces_per_cluster(
    p5_and_mixed: dict[str, Any], research: dict[str, Any], tmp_path: Path
) -> None:
    (tmp_path / "prices.yaml").write_text("p5e.48xlarge: 60.0\n")  # not in the built-in table
    prices = load_prices(tmp_path / "prices.yaml")
    text = review.summary({"S": Stack("S", p5_and_mixed, []), "R": Stack("R", research, [])}, prices)
    table = text.split("### Clusters")[1].split("\n\n")[1].splitlines()
    assert table[0].split(" | ")[5] == "EFA interfaces"
    rows = {cells[1]: cells[5] for line in table[2:] for cells in [line.split(" | ")]}
    assert rows["h100"] == "32 per node"
    assert rows["mixed"] == "p4d.24xlarge 4, p5.48xlarge 32"
    assert rows["a100"] == "4 per node"
    assert rows["dev"] == "off"


def test_the_job_spec_tells_the_agent_which_clusters_have_efa(research: dict[str, Any]) -> None:
    specs = {
        name: json.dumps(p["Properties"]["Value"])
        for p in of_type(research, "AWS::SSM::Parameter").values()
        for name in ("a100", "dev")
        if p["Properties"].get("Name") == f"/spot-training/research/{name}/job-spec"
    }
    assert '\\"efa\\":true' in specs["a100"]
    assert '\\"efa\\":false' in specs["dev"]
