"""trainctl review: the Markdown a pull request carries, from two real synths (a base and a change)."""

from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path
from typing import Any, Optional

import pytest
import yaml

from team_config.naming import budget_name
from trainctl import review
from trainctl.assembly import Stack, load_assembly, synthesize
from trainctl.cli import main as trainctl_main
from trainctl.prices import PriceTable, load_prices
from trainctl.review_changes import REFERENCE_CREATE_ONLY, replaced
from trainctl.review_iam import iam_statements

from .synth import EVERYTHING, OVERSIZED, oversized_team, synth, team_config

TYPES = ["g5.xlarge", "g5.2xlarge"]
CLUSTER = {"name": "main", "instance_types": TYPES, "max_nodes": 2}


def _team_dir(root: Path, **team: Any) -> Path:
    root.mkdir()
    (root / "alpha.yaml").write_text(yaml.safe_dump({"clusters": [CLUSTER], **team}))
    return root


@pytest.fixture(scope="module")
def assemblies(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Base: one cluster in 10.0.0.0/16. Change: a new VPC range, 3 nodes, and a budget."""
    tmp = tmp_path_factory.mktemp("review")
    base_teams = _team_dir(tmp / "base-teams", network={"new_vpc": {"cidr": "10.0.0.0/16"}})
    head_teams = _team_dir(
        tmp / "head-teams",
        network={"new_vpc": {"cidr": "10.1.0.0/16"}},
        clusters=[{**CLUSTER, "max_nodes": 3}],
        budget={"usd_per_month": 500},
    )
    return synthesize(tmp / "base", base_teams), synthesize(tmp / "head", head_teams)


def _template(assembly: Path) -> dict[str, Any]:
    return dict(json.loads((assembly / "TrainingStack-alpha.template.json").read_text()))


def test_review_prices_each_cluster_and_lists_budgets_and_acknowledgements(assemblies: tuple[Path, Path]) -> None:
    _, head = assemblies
    prices = load_prices()
    text = review.summary(load_assembly(head), prices, spot={"g5.2xlarge": 0.5, "g5.xlarge": 0.25})
    dearest = max(TYPES, key=prices.on_demand_price)
    worst = 3 * prices.on_demand_price(dearest)
    assert f"| alpha | main | g5.xlarge, g5.2xlarge | 3 | 0 + 0% above | off | {worst:.2f} | {3 * 0.5:.2f} |" in text
    assert f"| TrainingStack-alpha | {budget_name('alpha', [], 80)} | 500 |" in text
    # every acknowledgement of the template's metadata, with its reason
    assert "AwsSolutions-IAM5[Resource::*]" in text
    assert "Read-only Describe* calls for peer discovery;" in text
    assert "Replaced or deleted" not in text  # only with a base


def test_the_worst_case_at_spot_counts_the_on_demand_share_above_the_base() -> None:
    """4 nodes, 1 on demand as base, 50% of the 3 above it on demand (rounded up for the worst case): 3 on demand,
    1 at spot (not all 3 above the base at spot)."""
    group = {
        "Type": "AWS::AutoScaling::AutoScalingGroup",
        "Properties": {
            "MaxSize": "4",
            "Tags": [
                {"Key": "spot-training:team", "Value": "alpha"},
                {"Key": "spot-training:cluster", "Value": "main"},
            ],
            "MixedInstancesPolicy": {
                "LaunchTemplate": {"Overrides": [{"InstanceType": "g5.xlarge"}]},
                "InstancesDistribution": {"OnDemandBaseCapacity": 1, "OnDemandPercentageAboveBaseCapacity": 50},
            },
        },
    }
    stack = Stack("TrainingStack-alpha", {"Resources": {"Group": group}}, [])
    prices = load_prices()
    text = review.summary({stack.name: stack}, prices, spot={"g5.xlarge": 0.3})
    on_demand = prices.on_demand_price("g5.xlarge")
    assert (
        f"| alpha | main | g5.xlarge | 4 | 1 + 50% above | off | {4 * on_demand:.2f} | {0.3 + 3 * on_demand:.2f} |"
        in text
    )


def test_review_lists_resource_policies_and_security_group_rules_with_the_iam_statements() -> None:
    """A pull request that opens a port or a bucket to someone shows it where reviewers read the IAM changes,
    beside the identity and trust policies."""
    deny_plain_http = {
        "Effect": "Deny",
        "Principal": {"AWS": "*"},
        "Action": "s3:*",
        "Resource": [{"Fn::GetAtt": ["Bucket", "Arn"]}],
        "Condition": {"Bool": {"aws:SecureTransport": "false"}},
    }
    resources = {
        "BucketPolicy": {
            "Type": "AWS::S3::BucketPolicy",
            "Properties": {"Bucket": {"Ref": "Bucket"}, "PolicyDocument": {"Statement": [deny_plain_http]}},
        },
        "Invoke": {
            "Type": "AWS::Lambda::Permission",
            "Properties": {
                "Action": "lambda:InvokeFunction",
                "FunctionName": {"Fn::GetAtt": ["Guard", "Arn"]},
                "Principal": "events.amazonaws.com",
                "SourceArn": {"Fn::GetAtt": ["Schedule", "Arn"]},
            },
        },
        "Nodes": {
            "Type": "AWS::EC2::SecurityGroup",
            "Properties": {
                "SecurityGroupEgress": [{"IpProtocol": "-1", "CidrIp": "0.0.0.0/0"}],
                "SecurityGroupIngress": [{"IpProtocol": "tcp", "FromPort": 22, "ToPort": 22, "CidrIp": "0.0.0.0/0"}],
            },
        },
        "NodesFromNodes": {
            "Type": "AWS::EC2::SecurityGroupIngress",
            "Properties": {
                "GroupId": {"Fn::GetAtt": ["Nodes", "GroupId"]},
                "IpProtocol": "-1",
                "SourceSecurityGroupId": {"Fn::GetAtt": ["Nodes", "GroupId"]},
            },
        },
    }
    stack = Stack("TrainingStack-alpha", {"Resources": resources}, [])
    assert iam_statements(stack) == {
        'BucketPolicy (bucket <Bucket>): Deny {"AWS": "*"} s3:* on <Bucket.Arn> if {"Bool": {"aws:SecureTransport": '
        '"false"}}',
        "Invoke: events.amazonaws.com may lambda:InvokeFunction <Guard.Arn> from <Schedule.Arn>",
        "Nodes: egress all traffic to 0.0.0.0/0",
        "Nodes: ingress tcp ports 22-22 from 0.0.0.0/0",
        "<Nodes.GroupId>: ingress all traffic from <Nodes.GroupId>",
    }
    text = review.summary({stack.name: stack}, load_prices())
    assert "### IAM, resource policies and security group rules" in text
    assert "- `Nodes: ingress tcp ports 22-22 from 0.0.0.0/0`" in text


def test_review_against_a_base_shows_iam_changes_and_replacements(assemblies: tuple[Path, Path]) -> None:
    base, head = assemblies
    text = review.summary(load_assembly(head), load_prices(), base=load_assembly(base))
    [vpc] = [k for k, r in _template(head)["Resources"].items() if r["Type"] == "AWS::EC2::VPC"]
    assert f"| TrainingStack-alpha | {vpc} | AWS::EC2::VPC | replaced: CidrBlock changes |" in text
    subnets = [k for k, r in _template(head)["Resources"].items() if r["Type"] == "AWS::EC2::Subnet"]
    assert subnets and all(f"| TrainingStack-alpha | {s} | AWS::EC2::Subnet | replaced: " in text for s in subnets)
    bucket = next(k for k, r in _template(head)["Resources"].items() if r["Type"] == "AWS::S3::Bucket")
    assert f"| {bucket} |" not in text  # the checkpoint bucket survives the change
    assert "- added `BudgetGuardPolicy" in text and "Allow budgets:ViewBudget on arn:" in text
    assert "- removed `" not in text  # nothing of the base's IAM goes away


def _trainctl(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = trainctl_main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_trainctl_review_writes_the_markdown_and_errors_are_one_line(
    assemblies: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base, head = assemblies
    out_file = tmp_path / "review.md"
    code, out, err = _trainctl(capsys, "review", "--assembly", str(head), "--base", str(base), "--out", str(out_file))
    assert (code, err) == (0, "")
    assert out.startswith("## Spot training: what this change deploys") and out_file.read_text() == out

    code, out, err = _trainctl(capsys, "review", "--assembly", str(tmp_path / "nope"))
    assert (code, out) == (2, "")
    assert (
        err
        == f"trainctl: error: {tmp_path}/nope is not a cloud assembly (no manifest.json); run `npx cdk synth` first\n"
    )
    (tmp_path / "spot.yaml").write_text("g5.xlarge: cheap\n")
    code, _, err = _trainctl(capsys, "review", "--assembly", str(head), "--spot-prices", str(tmp_path / "spot.yaml"))
    assert code == 2
    assert err == (
        f"trainctl: error: {tmp_path}/spot.yaml: g5.xlarge: price must be a positive number of USD per hour, "
        "got 'cheap'\n"
    )
    bad = tmp_path / "teams"
    bad.mkdir()
    (bad / "beta.yaml").write_text(yaml.safe_dump({"clusters": [{**CLUSTER, "max_nodes": 0}]}))
    code, _, err = _trainctl(capsys, "review", "--teams-dir", str(bad))
    assert code == 2
    assert err.startswith(f"trainctl: error: {bad}/beta.yaml: clusters[0].max_nodes: ") and err.count("\n") == 1


def test_the_cli_analytics_resource_is_not_a_deletion() -> None:
    """`npx cdk synth` adds AWS::CDK::Metadata, an in-process synth does not: comparing them deletes nothing."""
    bucket = {"Type": "AWS::S3::Bucket", "Properties": {"BucketName": "b"}}
    base = Stack("S", {"Resources": {"CDKMetadata": {"Type": "AWS::CDK::Metadata"}, "B": bucket}}, [])
    renamed = {"Type": "AWS::S3::Bucket", "Properties": {"BucketName": "c"}}
    assert replaced(base, Stack("S", {"Resources": {"B": bucket}}, [])) == []
    assert replaced(base, Stack("S", {"Resources": {"B": renamed}}, [])) == [
        ("B", "AWS::S3::Bucket", "replaced: BucketName changes")
    ]


def _group_stack(types: list[str], max_nodes: int, on_demand_pct: Optional[int] = 0) -> Stack:
    """A group of the given types; ``on_demand_pct`` None: the template leaves OnDemandPercentageAboveBaseCapacity
    out."""
    distribution = {} if on_demand_pct is None else {"OnDemandPercentageAboveBaseCapacity": on_demand_pct}
    group = {
        "Type": "AWS::AutoScaling::AutoScalingGroup",
        "Properties": {
            "MaxSize": str(max_nodes),
            "Tags": [
                {"Key": "spot-training:team", "Value": "alpha"},
                {"Key": "spot-training:cluster", "Value": "main"},
            ],
            "MixedInstancesPolicy": {
                "LaunchTemplate": {"Overrides": [{"InstanceType": t} for t in types]},
                "InstancesDistribution": distribution,
            },
        },
    }
    return Stack("TrainingStack-alpha", {"Resources": {"Group": group}}, [])


def test_the_worst_case_at_spot_takes_the_dearest_spot_price_not_the_dearest_on_demand_types() -> None:
    """g5.2xlarge is dearer on demand, g5.xlarge at spot: 2 nodes at 0.5 is the worst case, not 2 at 0.3."""
    stack = _group_stack(TYPES, 2)
    prices = load_prices()
    worst = f"{2 * prices.on_demand_price('g5.2xlarge'):.2f}"
    text = review.summary({stack.name: stack}, prices, spot={"g5.xlarge": 0.5, "g5.2xlarge": 0.3})
    assert f"| alpha | main | g5.xlarge, g5.2xlarge | 2 | 0 + 0% above | off | {worst} | 1.00 |" in text
    text = review.summary({stack.name: stack}, prices, spot={"g5.xlarge": 0.3})  # g5.2xlarge's could be dearer
    assert f"| alpha | main | g5.xlarge, g5.2xlarge | 2 | 0 + 0% above | off | {worst} | - |" in text


def test_a_broken_assembly_is_one_line_naming_the_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "manifest.json").write_text('{"artifacts": {')
    code, out, err = _trainctl(capsys, "review", "--assembly", str(tmp_path))
    assert (code, out) == (2, "")
    assert err == (
        f"trainctl: error: {tmp_path}/manifest.json: cannot read it as JSON (Expecting property name enclosed in "
        "double quotes: line 1 column 16 (char 15)); synthesize the assembly again\n"
    )
    artifact = {"type": "aws:cloudformation:stack", "properties": {"templateFile": "S.template.json"}}
    (tmp_path / "manifest.json").write_text(json.dumps({"artifacts": {"S": artifact}}))
    code, out, err = _trainctl(capsys, "review", "--assembly", str(tmp_path))
    assert (code, out) == (2, "")
    assert err == (
        f"trainctl: error: {tmp_path}/S.template.json: missing from the assembly; synthesize it again "
        "(`npx cdk synth`)\n"
    )


def test_review_reports_every_team_file_problem_not_just_the_first(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`trainctl review` prints every line of the config error, not the first alone as if the rest were fine."""
    bad = tmp_path / "teams"
    bad.mkdir()
    (bad / "beta.yaml").write_text(yaml.safe_dump({"clusters": [{**CLUSTER, "max_nodes": 0}], "log_retention_days": 2}))
    (bad / "gamma.yaml").write_text(yaml.safe_dump({"clusters": [{**CLUSTER, "min_nodes": 3}]}))
    code, out, err = _trainctl(capsys, "review", "--teams-dir", str(bad))
    assert (code, out) == (2, "")
    assert err.splitlines() == [
        f"trainctl: error: {bad}/beta.yaml: clusters[0].max_nodes: Input should be greater than or equal to 1 (got 0)",
        f"{bad}/beta.yaml: log_retention_days: 2 is not a CloudWatch retention value; use one of 1, 3, 5, 7, 14, 30, "
        "60, 90, 120, 150, 180, 365, 400, 545, 731, 1096, 1827, 2192, 2557, 2922, 3288, 3653",
        f"{bad}/gamma.yaml: clusters[0]: need min_nodes <= desired_nodes <= max_nodes, got 3 <= 1 <= 2",
    ]


def test_a_group_that_does_not_set_its_on_demand_percentage_is_all_on_demand() -> None:
    """CloudFormation's default OnDemandPercentageAboveBaseCapacity is 100, not 0 (all spot)."""
    stack = _group_stack(TYPES, 2, on_demand_pct=None)
    prices = load_prices()
    worst = f"{2 * prices.on_demand_price('g5.2xlarge'):.2f}"
    text = review.summary({stack.name: stack}, prices, spot={"g5.xlarge": 0.5, "g5.2xlarge": 0.3})
    assert f"| alpha | main | g5.xlarge, g5.2xlarge | 2 | 0 + 100% above | off | {worst} | {worst} |" in text


def test_against_a_base_the_clusters_table_shows_changed_values_as_base_to_head(
    assemblies: tuple[Path, Path],
) -> None:
    """The change raises max_nodes 2 -> 3: the table shows both, not 3 alone."""
    base, head = assemblies
    prices = load_prices()
    text = review.summary(load_assembly(head), prices, base=load_assembly(base))
    dearest = prices.on_demand_price(max(TYPES, key=prices.on_demand_price))
    assert (
        f"| alpha | main | g5.xlarge, g5.2xlarge | 2 -> 3 | 0 + 0% above | off | {2 * dearest:.2f} -> "
        f"{3 * dearest:.2f} | - |" in text
    )
    # a changed type list, and a cluster the base does not have
    before, after = _group_stack(["g5.xlarge"], 2), _group_stack(TYPES, 2)
    text = review.summary({after.name: after}, prices, base={before.name: before})
    one = prices.on_demand_price("g5.xlarge")
    assert (
        f"| alpha | main | g5.xlarge -> g5.xlarge, g5.2xlarge | 2 | 0 + 0% above | off | {2 * one:.2f} -> "
        f"{2 * dearest:.2f} | - |" in text
    )
    text = review.summary({after.name: after}, prices, base={before.name: Stack(before.name, {}, [])})
    assert f"| alpha | main (new) | g5.xlarge, g5.2xlarge | 2 | 0 + 0% above | off | {2 * dearest:.2f} | - |" in text
    # a new team (its stack not in the base): its clusters are new, not unchanged
    text = review.summary({after.name: after}, prices, base={})
    assert f"| alpha | main (new) | g5.xlarge, g5.2xlarge | 2 | 0 + 0% above | off | {2 * dearest:.2f} | - |" in text


def test_against_a_base_a_budget_reads_new_or_base_to_head(assemblies: tuple[Path, Path]) -> None:
    """Both amounts: with the head's alone, a limit raised from 500 to 50000 would look like any budget."""
    base, head = assemblies
    prices, head_stacks = load_prices(), load_assembly(head)
    name = budget_name("alpha", [], 80)
    text = review.summary(head_stacks, prices, base=load_assembly(base))
    assert f"| TrainingStack-alpha | {name} | 500 (new) |" in text  # the base has no budget
    text = review.summary(head_stacks, prices, base=head_stacks)
    assert f"| TrainingStack-alpha | {name} | 500 |" in text
    raised = json.loads(json.dumps(head_stacks["TrainingStack-alpha"].template))
    for resource in raised["Resources"].values():
        if resource["Type"] == "AWS::Budgets::Budget":
            resource["Properties"]["Budget"]["BudgetLimit"]["Amount"] = 50000
    stack = head_stacks["TrainingStack-alpha"]
    text = review.summary({stack.name: Stack(stack.name, raised, [])}, prices, base=head_stacks)
    assert f"| TrainingStack-alpha | {name} | 500 -> 50000 |" in text


def test_a_new_vpc_range_replaces_every_resource_whose_create_only_property_refers_to_a_replaced_one(
    assemblies: tuple[Path, Path],
) -> None:
    """Not only the VPC and its subnets: their security groups, route tables, routes, endpoint, gateway attachment,
    NAT gateway and flow log are replaced with them, and listed."""
    base, head = assemblies
    text = review.summary(load_assembly(head), load_prices(), base=load_assembly(base))
    resources = _template(head)["Resources"]
    [vpc] = [k for k, r in resources.items() if r["Type"] == "AWS::EC2::VPC"]
    by_vpc = (
        "AWS::EC2::SecurityGroup",
        "AWS::EC2::RouteTable",
        "AWS::EC2::VPCEndpoint",
        "AWS::EC2::VPCGatewayAttachment",
    )
    followers = [(k, r) for k, r in resources.items() if r["Type"] in by_vpc]
    assert {r["Type"] for _, r in followers} == set(by_vpc)
    for logical_id, r in followers:
        assert f"| {logical_id} | {r['Type']} | replaced: VpcId refers to {vpc} (replaced) |" in text
    routes = [(k, r) for k, r in resources.items() if r["Type"] == "AWS::EC2::Route"]
    assert routes
    for logical_id, r in routes:  # a route refers to a route table, which refers to the VPC: a fixed point
        table = r["Properties"]["RouteTableId"]["Ref"]
        assert f"| {logical_id} | AWS::EC2::Route | replaced: RouteTableId refers to {table} (replaced) |" in text
    for kind in ("AWS::EC2::SubnetRouteTableAssociation", "AWS::EC2::NatGateway", "AWS::EC2::FlowLog"):
        ids = [k for k, r in resources.items() if r["Type"] == kind]
        assert ids and all(f"| {k} | {kind} | replaced: " in text for k in ids)
    launch = [k for k, r in resources.items() if r["Type"] == "AWS::EC2::LaunchTemplate"]
    assert launch and not any(f"| {k} |" in text for k in launch)  # its security group ids are updated, not create-only


def test_the_reference_create_only_properties_are_create_only_in_the_cloudformation_schemas() -> None:
    from cfnlint.schema import PROVIDER_SCHEMA_MANAGER

    for kind, props in REFERENCE_CREATE_ONLY.items():
        schema = PROVIDER_SCHEMA_MANAGER.get_resource_schema(region="us-east-1", resource_type=kind).schema
        assert {f"/properties/{p}" for p in props} <= set(schema["createOnlyProperties"]), kind


@pytest.fixture(scope="module")
def everything() -> tuple[dict[str, Any], dict[str, Any]]:
    """Templates of the team using every feature (a warm pool, whose volumes are deleted with the stack) and of a
    change: the checkpoint bucket deleted with the stack and replaced versions kept 1 day, the volumes retained."""
    changed = copy.deepcopy(EVERYTHING)
    changed["checkpoint_bucket"] = {"removal_policy": "destroy", "noncurrent_version_expiration_days": 1}
    changed["clusters"][0]["warm_pool"]["removal_policy"] = "retain"
    _, base = synth(team_config(**EVERYTHING))
    _, head = synth(team_config(**changed))
    return dict(base.to_json()), dict(head.to_json())


def _prices() -> PriceTable:
    """The table, and prices (inputs, any positive number) for the arm cluster's types it lacks."""
    table = load_prices()
    return dataclasses.replace(table, on_demand={**table.on_demand, "c7g.large": 0.1, "m7g.large": 0.2})


def _checkpoint_bucket(template: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    [(logical_id, bucket)] = [
        (k, r)
        for k, r in template["Resources"].items()
        if k.startswith("CheckpointsBucket") and r["Type"] == "AWS::S3::Bucket"
    ]
    return logical_id, bucket


def test_data_retention_changes_are_listed_against_the_base(everything: tuple[dict[str, Any], dict[str, Any]]) -> None:
    """A bucket going from Retain to Delete, losing versioning, gaining a 1-day expiration: each change is a row,
    not "None"."""
    base, head = copy.deepcopy(everything)
    bucket_id, bucket = _checkpoint_bucket(head)
    del bucket["Properties"]["VersioningConfiguration"]  # a change of the construct, as a reviewer would make it
    expire = {"Id": "ExpireAll", "Status": "Enabled", "ExpirationInDays": 1}
    bucket["Properties"]["LifecycleConfiguration"]["Rules"].append(expire)
    text = review.summary({"S": Stack("S", head, [])}, _prices(), base={"S": Stack("S", base, [])})
    assert "### Data retention changes" in text
    section = text.split("### Data retention changes", 1)[1]
    _, old = _checkpoint_bucket(base)
    assert (old["DeletionPolicy"], bucket["DeletionPolicy"]) == ("Retain", "Delete")
    row = f"| S | {bucket_id} | AWS::S3::Bucket |"
    assert f"{row} DeletionPolicy | Retain | Delete |" in section
    assert f"{row} UpdateReplacePolicy | Retain | Delete |" in section
    assert (
        f"{row} versioning | {old['Properties']['VersioningConfiguration']['Status']} | none (unversioned) |" in section
    )
    assert f"{row} lifecycle rule ExpireAll | none | {json.dumps(expire, sort_keys=True)} |" in section
    [(old_rule, new_rule)] = [
        (a, b)
        for a, b in zip(  # noqa: B905 (the head has one rule more)
            old["Properties"]["LifecycleConfiguration"]["Rules"],
            bucket["Properties"]["LifecycleConfiguration"]["Rules"],
        )
        if a != b
    ]
    assert (
        f"{row} lifecycle rule {old_rule['Id']} | {json.dumps(old_rule, sort_keys=True)} | "
        f"{json.dumps(new_rule, sort_keys=True)} |" in section
    )
    volumes = [k for k, r in head["Resources"].items() if r["Type"] == "AWS::EC2::Volume"]
    assert volumes and {base["Resources"][k]["DeletionPolicy"] for k in volumes} == {"Delete"}
    assert all(f"| S | {k} | AWS::EC2::Volume | DeletionPolicy | Delete | Retain |" in section for k in volumes)
    same = review.summary({"S": Stack("S", base, [])}, _prices(), base={"S": Stack("S", base, [])})
    assert same.split("### Data retention changes", 1)[1].strip() == "None."


def _policy(template: dict[str, Any], name: str) -> dict[str, Any]:
    [policy] = [r for k, r in template["Resources"].items() if name in k and r["Type"] == "AWS::IAM::Policy"]
    return dict(policy)


def _iam_changes(base: dict[str, Any], head: dict[str, Any]) -> list[str]:
    text = review.summary({"S": Stack("S", head, [])}, _prices(), base={"S": Stack("S", base, [])})
    section = text.split("### IAM, resource policies and security group rules", 1)[1].split("###", 1)[0]
    return [line for line in section.strip().splitlines() if line]


def test_not_action_and_not_resource_are_labelled_so_turning_a_statement_into_them_is_a_change(
    everything: tuple[dict[str, Any], dict[str, Any]],
) -> None:
    """A statement whose Action becomes NotAction (it grants everything but those actions) is a removed and an added
    line, not "0 added, 0 removed"; NotResource is labelled, not read as "on *"."""
    base, _ = everything
    head = copy.deepcopy(base)
    statements = _policy(head, "ClusterpoolCheckpointAccess")["Properties"]["PolicyDocument"]["Statement"]
    first, second = statements[0], statements[1]
    first["NotAction"] = first.pop("Action")
    second["NotResource"] = second.pop("Resource")
    lines = _iam_changes(base, head)
    assert lines[0] == "S: 2 added, 2 removed"
    added = [line for line in lines if line.startswith("- added")]
    assert sum(" NotAction " in line for line in added) == 1 and sum(" on NotResource " in line for line in added) == 1
    stack = Stack("S", {"Resources": {"P": {"Type": "AWS::S3::BucketPolicy", "Properties": {
        "Bucket": "b", "PolicyDocument": {"Statement": [
            {"Effect": "Deny", "NotPrincipal": {"AWS": "arn:aws:iam::1:root"}, "Action": "s3:*", "NotResource": "x"}
        ]}}}}}, [])  # fmt: skip
    assert iam_statements(stack) == {
        'P (bucket b): Deny NotPrincipal {"AWS": "arn:aws:iam::1:root"} s3:* on NotResource x'
    }


def test_a_policy_attached_to_another_role_is_a_change(everything: tuple[dict[str, Any], dict[str, Any]]) -> None:
    """Attaching the checkpoint policy to one more role gave "0 added, 0 removed": attachments were not shown."""
    base, _ = everything
    head = copy.deepcopy(base)
    policy = _policy(head, "ClusterpoolCheckpointAccess")
    roles = {r["Ref"] for r in policy["Properties"]["Roles"]}
    other = next(k for k, r in head["Resources"].items() if r["Type"] == "AWS::IAM::Role" and k not in roles)
    policy["Properties"]["Roles"].append({"Ref": other})
    n = len(policy["Properties"]["PolicyDocument"]["Statement"])
    lines = _iam_changes(base, head)
    assert lines[0] == f"S: {n} added, {n} removed"
    assert all(f"<{other}>" in line for line in lines[1:] if line.startswith("- added"))
    assert not any(f"<{other}>" in line for line in lines[1:] if line.startswith("- removed"))


def test_review_of_a_stack_over_cloudformation_s_resource_quota_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """One line, not a 43-line jsii traceback. 589: an in-process synth has no CDK::Metadata."""
    path = oversized_team(tmp_path / "teams")
    code, out, err = _trainctl(capsys, "review", "--teams-dir", str(path.parent), "--out", str(tmp_path / "r.md"))
    assert (code, out, err) == (2, "", f"trainctl: error: {path}: {OVERSIZED.format(count=589)}\n")


def test_review_of_a_synth_the_gates_refuse_names_no_removed_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A construct change with an unacknowledged cdk-nag finding. The error does not send the reader to
    ``<temporary folder>/validation-report.json``: review removes that folder before the line is printed."""
    from aws_cdk import aws_s3

    from training_app import wiring as cdk_app

    add_teams = cdk_app.add_teams

    def with_a_naked_bucket(application: Any, teams: Any) -> Any:
        stacks = add_teams(application, teams)
        aws_s3.CfnBucket(stacks[0], "Naked")  # AwsSolutions-S1 and -S10, neither acknowledged
        return stacks

    monkeypatch.setattr(cdk_app, "add_teams", with_a_naked_bucket)
    teams = tmp_path / "teams"
    teams.mkdir()
    (teams / "default.yaml").write_text(yaml.safe_dump({"clusters": [CLUSTER]}))
    code, out, err = _trainctl(capsys, "review", "--teams-dir", str(teams))
    assert (code, out) == (2, "")
    assert err.splitlines()[-1] == (
        "trainctl: error: synth found cdk-nag or SpotTraining violations, listed above (`npx cdk synth` lists them too)"
    )


def test_replaced_warm_pool_volumes_come_with_the_rule_to_deploy_at_0(
    everything: tuple[dict[str, Any], dict[str, Any]],
) -> None:
    """A new snapshot or volume size replaces the pool: the review lists the old volumes as deleted and
    notes that a deploy while a node holds one leaves it billed outside the stack."""
    base, _ = copy.deepcopy(everything)
    bigger = copy.deepcopy(EVERYTHING)
    bigger["clusters"][0]["warm_pool"]["volume_size_gib"] = 300
    head = dict(synth(team_config(**bigger))[1].to_json())
    text = review.summary({"S": Stack("S", head, [])}, _prices(), base={"S": Stack("S", base, [])})
    volumes = [k for k, r in base["Resources"].items() if r["Type"] == "AWS::EC2::Volume"]
    assert volumes and all(
        f"| S | {v} | AWS::EC2::Volume | deleted (not in the new template) |" in text for v in volumes
    )
    assert review.POOL_REPLACED_NOTE in text
    same = review.summary({"S": Stack("S", base, [])}, _prices(), base={"S": Stack("S", base, [])})
    assert review.POOL_REPLACED_NOTE not in same


def _pool_stack(iops: int, volumes: int = 4) -> Stack:
    """The group of _group_stack and ``volumes`` warm pool volumes of 100 GiB, ``iops`` and 250 MB/s."""
    tags = [{"Key": "spot-training:team", "Value": "alpha"}, {"Key": "spot-training:cluster", "Value": "main"},
            {"Key": "spot-training:warm-pool", "Value": "alpha-main"}]  # fmt: skip
    volume = {"Size": 100, "VolumeType": "gp3", "Iops": iops, "Throughput": 250, "Tags": tags}
    stack = _group_stack(TYPES, 2)
    stack.template["Resources"].update({f"Volume{i}": {"Type": "AWS::EC2::Volume", "Properties": volume}
                                        for i in range(volumes)})  # fmt: skip
    return stack


def test_warm_pools_are_priced_per_month_and_their_changes_read_base_to_head() -> None:
    """A pool is billed while no node runs, so the review prices it beside the nodes. gp3 in us-east-1: $0.08 per
    GB-month, $0.005 per IOPS-month above 3,000, $0.04 per MB/s-month above 125. 4 volumes of 100 GiB, 6,000 IOPS
    and 250 MB/s: 4 x (8 + 15 + 5) = 112; at 3,000 IOPS: 4 x (8 + 5) = 52."""
    head, base = _pool_stack(6000), _pool_stack(3000)
    text = review.summary({head.name: head}, load_prices())
    assert "### Warm pools (billed while idle)" in text
    assert "| alpha | main | 4 | 100 | 6000 | 250 | 112.00 |" in text
    text = review.summary({head.name: head}, load_prices(), base={base.name: base})
    assert "| alpha | main | 4 | 100 | 3000 -> 6000 | 250 | 52.00 -> 112.00 |" in text
    text = review.summary({head.name: head}, load_prices(), base={base.name: _group_stack(TYPES, 2)})
    assert "| alpha | main (new) | 4 | 100 | 6000 | 250 | 112.00 |" in text
    text = review.summary({base.name: _group_stack(TYPES, 2)}, load_prices(), base={head.name: head})
    assert "| alpha | main (removed) | 4 -> - | 100 -> - | 6000 -> - | 250 -> - | 112.00 -> - |" in text
    no_pool = review.summary({base.name: _group_stack(TYPES, 2)}, load_prices())
    assert "Warm pools" not in no_pool


def test_a_synthesized_warm_pool_is_listed_with_its_team_and_cluster(
    everything: tuple[dict[str, Any], dict[str, Any]],
) -> None:
    """The team file's pool (2 volumes; team_config's defaults: 200 GiB, 3,000 IOPS, 125 MB/s): 2 x 200 x 0.08."""
    base, _ = everything
    text = review.summary({"S": Stack("S", base, [])}, _prices())
    assert "| team-a | pool | 2 | 200 | 3000 | 125 | 32.00 |" in text
