"""trainctl review: the Markdown a pull request carries, from two real synths (a base and a change)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from trainctl import review
from trainctl.cli import main as trainctl_main
from trainctl.prices import load_prices

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
    return review.synthesize(tmp / "base", base_teams), review.synthesize(tmp / "head", head_teams)


def _template(assembly: Path) -> dict[str, Any]:
    return dict(json.loads((assembly / "TrainingStack-alpha.template.json").read_text()))


def test_review_prices_each_cluster_and_lists_budgets_and_acknowledgements(assemblies: tuple[Path, Path]) -> None:
    _, head = assemblies
    prices = load_prices()
    text = review.summary(review.load_assembly(head), prices, spot={"g5.2xlarge": 0.5, "g5.xlarge": 0.25})
    dearest = max(TYPES, key=prices.on_demand_price)
    worst = 3 * prices.on_demand_price(dearest)
    assert f"| alpha | main | g5.xlarge, g5.2xlarge | 3 | 0 + 0% above | {worst:.2f} | {3 * 0.5:.2f} |" in text
    assert "| TrainingStack-alpha | spot-training-alpha | 500 |" in text
    # every acknowledgement of the template's metadata, with its reason
    assert "AwsSolutions-IAM5[Resource::*]" in text
    assert "Read-only Describe* calls for peer discovery and volume claims" in text
    assert "Replaced or deleted" not in text  # only with a base


def test_the_worst_case_at_spot_counts_the_on_demand_share_above_the_base() -> None:
    """4 nodes, 1 on demand as base, 50% of the 3 above it on demand (rounded up for the worst case): 3 on demand,
    1 at spot. It used to price all 3 above the base at spot."""
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
    stack = review.Stack("TrainingStack-alpha", {"Resources": {"Group": group}}, [])
    prices = load_prices()
    text = review.summary({stack.name: stack}, prices, spot={"g5.xlarge": 0.3})
    on_demand = prices.on_demand_price("g5.xlarge")
    assert f"| alpha | main | g5.xlarge | 4 | 1 + 50% above | {4 * on_demand:.2f} | {0.3 + 3 * on_demand:.2f} |" in text


def test_review_lists_resource_policies_and_security_group_rules_with_the_iam_statements() -> None:
    """A pull request that opens a port or a bucket to someone shows it where reviewers read the IAM changes;
    before, only identity and trust policies were listed."""
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
    stack = review.Stack("TrainingStack-alpha", {"Resources": resources}, [])
    assert review.iam_statements(stack) == {
        'BucketPolicy: Deny {"AWS": "*"} s3:* on <Bucket.Arn> if {"Bool": {"aws:SecureTransport": "false"}}',
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
    text = review.summary(review.load_assembly(head), load_prices(), base=review.load_assembly(base))
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
    base = review.Stack("S", {"Resources": {"CDKMetadata": {"Type": "AWS::CDK::Metadata"}, "B": bucket}}, [])
    renamed = {"Type": "AWS::S3::Bucket", "Properties": {"BucketName": "c"}}
    assert review.replaced(base, review.Stack("S", {"Resources": {"B": bucket}}, [])) == []
    assert review.replaced(base, review.Stack("S", {"Resources": {"B": renamed}}, [])) == [
        ("B", "AWS::S3::Bucket", "replaced: BucketName changes")
    ]


def _group_stack(types: list[str], max_nodes: int) -> review.Stack:
    group = {
        "Type": "AWS::AutoScaling::AutoScalingGroup",
        "Properties": {
            "MaxSize": str(max_nodes),
            "Tags": [
                {"Key": "spot-training:team", "Value": "alpha"},
                {"Key": "spot-training:cluster", "Value": "main"},
            ],
            "MixedInstancesPolicy": {"LaunchTemplate": {"Overrides": [{"InstanceType": t} for t in types]}},
        },
    }
    return review.Stack("TrainingStack-alpha", {"Resources": {"Group": group}}, [])


def test_the_worst_case_at_spot_takes_the_dearest_spot_price_not_the_dearest_on_demand_types() -> None:
    """g5.2xlarge is dearer on demand, g5.xlarge at spot: 2 nodes at 0.5 is the worst case, not 2 at 0.3."""
    stack = _group_stack(TYPES, 2)
    prices = load_prices()
    worst = f"{2 * prices.on_demand_price('g5.2xlarge'):.2f}"
    text = review.summary({stack.name: stack}, prices, spot={"g5.xlarge": 0.5, "g5.2xlarge": 0.3})
    assert f"| alpha | main | g5.xlarge, g5.2xlarge | 2 | 0 + 0% above | {worst} | 1.00 |" in text
    text = review.summary({stack.name: stack}, prices, spot={"g5.xlarge": 0.3})  # g5.2xlarge's could be dearer
    assert f"| alpha | main | g5.xlarge, g5.2xlarge | 2 | 0 + 0% above | {worst} | - |" in text


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
    """`trainctl review` used to print only the first line of the config error, as if the rest were fine."""
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
