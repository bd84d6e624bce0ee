"""SpotTrainingChecks: each rule fails on a template that breaks it and passes on one that keeps it; the pack runs
in app.py and stops a synth whose raw override breaks a rule."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Optional

import pytest
from aws_cdk import App

from compliance.spot_training import RULES, Rule, SpotTrainingChecks
from training_app import wiring as cdk_app

from .test_app import CONTEXT, assembly, team_config

__all__ = ["assembly"]  # the synthesized app of tests/test_app.py, reused as a fixture here

RULE = {r.id: r for r in RULES}
AZ = {"Fn::Select": [0, {"Fn::GetAZs": ""}]}


def lt(**metadata: str) -> dict[str, Any]:
    return {"Type": "AWS::EC2::LaunchTemplate", "Properties": {"LaunchTemplateData": {"MetadataOptions": metadata}}}


def group(**props: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "MinSize": "0",
        "MaxSize": "2",
        "CapacityRebalance": True,
        "VPCZoneIdentifier": [{"Ref": "Subnet"}],
        "Tags": [{"Key": "spot-training:cluster", "Value": "main", "PropagateAtLaunch": True}],
        "MixedInstancesPolicy": {
            "InstancesDistribution": {
                "OnDemandPercentageAboveBaseCapacity": 0,
                "SpotAllocationStrategy": "price-capacity-optimized",
            },
            "LaunchTemplate": {"Overrides": [{"InstanceType": "g5.xlarge"}, {"InstanceType": "g5.2xlarge"}]},
        },
    }
    base.update(props)
    return {"Type": "AWS::AutoScaling::AutoScalingGroup", "Properties": base}


SUBNET = {"Type": "AWS::EC2::Subnet", "Properties": {"AvailabilityZone": AZ}}


def bucket(**override: Any) -> dict[str, Any]:
    p: dict[str, Any] = {
        "Tags": [{"Key": "spot-training:role", "Value": "checkpoints"}],
        "VersioningConfiguration": {"Status": "Enabled"},
        "BucketEncryption": {"ServerSideEncryptionConfiguration": [{"ServerSideEncryptionByDefault": {}}]},
        "PublicAccessBlockConfiguration": dict.fromkeys(
            ["BlockPublicAcls", "BlockPublicPolicy", "IgnorePublicAcls", "RestrictPublicBuckets"], True
        ),
        "LifecycleConfiguration": {"Rules": [{"AbortIncompleteMultipartUpload": {"DaysAfterInitiation": 1}}]},
    }
    p.update(override)
    return {"Type": "AWS::S3::Bucket", "Properties": p}


BUCKET_ARN = {"Fn::GetAtt": ["Bucket", "Arn"]}
TLS_DENY = {  # as CDK's enforce_ssl writes it
    "Effect": "Deny",
    "Principal": {"AWS": "*"},
    "Action": "s3:*",
    "Resource": [BUCKET_ARN, {"Fn::Join": ["", [BUCKET_ARN, "/*"]]}],
    "Condition": {"Bool": {"aws:SecureTransport": "false"}},
}
TLS_POLICY: dict[str, Any] = {
    "Type": "AWS::S3::BucketPolicy",
    "Properties": {
        "Bucket": {"Ref": "Bucket"},
        "PolicyDocument": {"Statement": [TLS_DENY]},
    },
}
NO_TLS = (
    "no bucket policy denying aws:SecureTransport=false to everyone, for every action on the bucket and its objects"
)


def tls_policy(**statement: Any) -> dict[str, Any]:
    """TLS_POLICY with its statement changed."""
    return {**TLS_POLICY, "Properties": {**TLS_POLICY["Properties"], "PolicyDocument": {
        "Statement": [{**TLS_DENY, **statement}]}}}  # fmt: skip


ROLE: dict[str, Any] = {
    "Type": "AWS::IAM::Role",
    "Properties": {"AssumeRolePolicyDocument": {"Statement": [{"Principal": {"Service": "ec2.amazonaws.com"}}]}},
}


def policy(action: str, resource: Any) -> dict[str, Any]:
    statement = {"Effect": "Allow", "Action": action, "Resource": resource}
    return {
        "Type": "AWS::IAM::Policy",
        "Properties": {"Roles": [{"Ref": "Role"}], "PolicyDocument": {"Statement": [statement]}},
    }


SCOPED = "arn:aws:s3:::b/main/*"  # one cluster's prefix of one bucket
SSM_ARN = "arn:aws:ssm:${AWS::Region}:${AWS::AccountId}"


def conditioned(policy: dict[str, Any], condition: Optional[dict[str, Any]] = None) -> dict[str, Any]:
    """``policy`` with a Condition on its statement: by default, to resources tagged as the warm pool's."""
    [statement] = policy["Properties"]["PolicyDocument"]["Statement"]
    statement["Condition"] = condition or {"StringEquals": {"aws:ResourceTag/spot-training:warm-pool": "t-main"}}
    return policy


ATTACHING = {**ROLE, "Properties": {**ROLE["Properties"], "ManagedPolicyArns": [{"Ref": "MP"}]}}


def managed_policy(action: str, resource: Any = "*") -> dict[str, Any]:
    """An AWS::IAM::ManagedPolicy allowing ``action`` on ``resource``, attached to no role by itself."""
    statement = {"Effect": "Allow", "Action": action, "Resource": resource}
    return {"Type": "AWS::IAM::ManagedPolicy", "Properties": {"PolicyDocument": {"Statement": [statement]}}}


def not_action_policy() -> dict[str, Any]:
    """Everything but IAM, on every resource."""
    document = {"Statement": [{"Effect": "Allow", "NotAction": "iam:*", "Resource": "*"}]}
    return {"Type": "AWS::IAM::Policy", "Properties": {"Roles": [{"Ref": "Role"}], "PolicyDocument": document}}


def volume(**props: Any) -> dict[str, Any]:
    base = {
        "AvailabilityZone": AZ,
        "Encrypted": True,
        "Tags": [
            {"Key": "spot-training:warm-pool", "Value": "t-main"},
            {"Key": "spot-training:cluster", "Value": "main"},
        ],
    }
    base.update(props)
    return {"Type": "AWS::EC2::Volume", "Properties": base}


def sg(cidr: Any) -> dict[str, Any]:
    return {"Type": "AWS::EC2::SecurityGroup", "Properties": {"SecurityGroupIngress": [{"CidrIp": cidr}]}}


def placement_group(strategy: str) -> dict[str, Any]:
    return {"Type": "AWS::EC2::PlacementGroup", "Properties": {"Strategy": strategy}}


def with_strategy(strategy: str, *overrides: dict[str, Any]) -> dict[str, Any]:
    distribution = {"OnDemandPercentageAboveBaseCapacity": 0, "SpotAllocationStrategy": strategy}
    return group(MixedInstancesPolicy={
        "InstancesDistribution": distribution, "LaunchTemplate": {"Overrides": list(overrides)}})  # fmt: skip


def lt_in_group(**placement: Any) -> dict[str, Any]:
    return {"Type": "AWS::EC2::LaunchTemplate", "Properties": {"LaunchTemplateData": {"Placement": placement}}}


TWO_SUBNETS = ["subnet-a", "subnet-b"]
CLUSTER_PG = placement_group("cluster")
IN_LT = {
    "MixedInstancesPolicy": {"LaunchTemplate": {"LaunchTemplateSpecification": {"LaunchTemplateId": {"Ref": "LT"}}}}
}


# (rule, logical id to check, failing resources, problems found, passing resources)
CASES: list[tuple[str, str, dict[str, Any], list[str], dict[str, Any]]] = [
    ("ST1", "LT", {"LT": lt(HttpTokens="optional", InstanceMetadataTags="enabled")}, ["HttpTokens is 'optional'"],
     {"LT": lt(HttpTokens="required", InstanceMetadataTags="enabled")}),
    ("ST1", "LT", {"LT": lt(HttpTokens="required")}, ["InstanceMetadataTags is None"],
     {"LT": lt(HttpTokens="required", InstanceMetadataTags="enabled")}),
    # fails: with the endpoint disabled, no node could read its identity or a spot notice
    ("ST1", "LT", {"LT": lt(HttpTokens="required", InstanceMetadataTags="enabled", HttpEndpoint="disabled")},
     ["HttpEndpoint is 'disabled'"],
     {"LT": lt(HttpTokens="required", InstanceMetadataTags="enabled", HttpEndpoint="enabled")}),
    ("ST2", "G", {"G": group(MixedInstancesPolicy={
        "InstancesDistribution": {"OnDemandPercentageAboveBaseCapacity": 0, "SpotAllocationStrategy": "lowest-price"},
        "LaunchTemplate": {"Overrides": [{"InstanceType": "g5.xlarge"}]}})},
     ["1 instance type(s)", "SpotAllocationStrategy 'lowest-price'"], {"G": group()}),
    # attribute-based instance selection passes: it names no type, and that is not "0 instance type(s)"; with
    # capacity-optimized-prioritized too
    ("ST2", "G", {"G": with_strategy("capacity-optimized-prioritized", {"InstanceType": "g5.xlarge"})},
     ["1 instance type(s)"],
     {"G": with_strategy("capacity-optimized-prioritized", {"InstanceRequirements": {"VCpuCount": {"Min": 4}}})}),
    ("ST3", "G", {"G": group(PlacementGroup={"Ref": "PG"}, VPCZoneIdentifier=TWO_SUBNETS)},
     ["spans 2 subnets/AZs"], {"G": group(PlacementGroup={"Ref": "PG"})}),
    ("ST3", "G", {"G": group(PlacementGroup={"Ref": "PG"}, VPCZoneIdentifier=TWO_SUBNETS), "PG": CLUSTER_PG},
     ["spans 2 subnets/AZs"], {"G": group(PlacementGroup={"Ref": "PG"}), "PG": CLUSTER_PG}),
    # a launch template naming its placement group by id counts too: it fails on 2 subnets
    ("ST3", "G", {"G": group(**IN_LT, VPCZoneIdentifier=TWO_SUBNETS), "LT": lt_in_group(GroupId={"Ref": "PG"})},
     ["spans 2 subnets/AZs"], {"G": group(**IN_LT), "LT": lt_in_group(GroupId={"Ref": "PG"})}),
    ("ST4", "G", {"G": group(CapacityRebalance=False)}, ["no capacity rebalance and no termination lifecycle hook"],
     {"G": group(CapacityRebalance=False, LifecycleHookSpecificationList=[
         {"LifecycleTransition": "autoscaling:EC2_INSTANCE_TERMINATING"}])}),
    ("ST5", "G", {"G": group(MinSize="1", MaxSize="100000")}, ["MinSize '1'", "MaxSize '100000'"], {"G": group()}),
    # fails: the group would launch 2 nodes at create, with no job to run
    ("ST5", "G", {"G": group(DesiredCapacity="2")}, ["DesiredCapacity '2'"], {"G": group(DesiredCapacity="0")}),
    ("ST5", "G", {"G": group(DesiredCapacity={"Ref": "Nodes"})}, ["DesiredCapacity {'Ref': 'Nodes'}"],
     {"G": group(DesiredCapacity=0)}),
    ("ST6", "Bucket", {"Bucket": bucket(VersioningConfiguration={"Status": "Suspended"}, LifecycleConfiguration={})},
     ["not versioned", "no lifecycle rule aborting incomplete multipart uploads in the whole bucket", NO_TLS],
     {"Bucket": bucket(), "Policy": TLS_POLICY}),
    # each fails: an abort rule for one prefix, a TLS deny of one action, one principal or the bucket alone
    ("ST6", "Bucket", {"Bucket": bucket(LifecycleConfiguration={"Rules": [
        {"Prefix": "logs/", "AbortIncompleteMultipartUpload": {"DaysAfterInitiation": 1}}]}), "Policy": TLS_POLICY},
     ["no lifecycle rule aborting incomplete multipart uploads in the whole bucket"],
     {"Bucket": bucket(), "Policy": TLS_POLICY}),
    ("ST6", "Bucket", {"Bucket": bucket(), "Policy": tls_policy(Action="s3:DeleteBucket")}, [NO_TLS],
     {"Bucket": bucket(), "Policy": tls_policy()}),
    ("ST6", "Bucket", {"Bucket": bucket(), "Policy": tls_policy(Principal={"AWS": "arn:aws:iam::123456789012:root"})},
     [NO_TLS], {"Bucket": bucket(), "Policy": tls_policy()}),
    ("ST6", "Bucket", {"Bucket": bucket(), "Policy": tls_policy(Resource=BUCKET_ARN)}, [NO_TLS],
     {"Bucket": bucket(), "Policy": tls_policy()}),
    ("ST7", "Logs", {"Logs": {"Type": "AWS::Logs::LogGroup", "Properties": {}}}, ["no RetentionInDays"],
     {"Logs": {"Type": "AWS::Logs::LogGroup", "Properties": {"RetentionInDays": 30}}}),
    ("ST8", "Vol", {"Vol": volume(Encrypted=False, AvailabilityZone="us-east-1b"), "G": group(), "Subnet": SUBNET},
     ["not encrypted", "not in the AZ of its cluster's group"], {"Vol": volume(), "G": group(), "Subnet": SUBNET}),
    ("ST9", "P", {"P": policy("s3:PutObject", "*"), "Role": ROLE}, ["Resource '*' for s3:PutObject"],
     {"P": policy("s3:PutObject", "arn:aws:s3:::b/main/*"), "Role": ROLE}),
    ("ST9", "P", {"P": policy("ec2:AttachVolume", "*"), "Role": ROLE}, ["Resource '*' for ec2:AttachVolume"],
     {"P": policy("ec2:DescribeVolumes", "*"), "Role": ROLE}),
    # reads on "*" fail too, read-only or not: they read every team's checkpoints and parameters
    ("ST9", "P", {"P": policy("s3:GetObject", "*"), "Role": ROLE}, ["Resource '*' for s3:GetObject"],
     {"P": policy("autoscaling:DescribeAutoScalingGroups", "*"), "Role": ROLE}),
    ("ST9", "P", {"P": policy("ssm:GetParameters", "*"), "Role": ROLE}, ["Resource '*' for ssm:GetParameters"],
     {"P": policy("ssm:UpdateInstanceInformation", "*"), "Role": ROLE}),
    ("ST9", "P", {"P": policy("s3:ListBucket", "*"), "Role": ROLE}, ["Resource '*' for s3:ListBucket"],
     {"P": policy("s3:ListBucket", "arn:aws:s3:::b"), "Role": ROLE}),
    # each of these fails: a wildcard counts wherever it is, not only as a literal "*" in the role's own policies
    ("ST9", "P", {"P": policy("s3:GetObject", "arn:aws:s3:::*/*"), "Role": ROLE},
     ["Resource 'arn:aws:s3:::*/*' for s3:GetObject"], {"P": policy("s3:GetObject", SCOPED), "Role": ROLE}),
    ("ST9", "P", {"P": policy("s3:GetObject", {"Fn::Join": ["", ["arn:", {"Ref": "AWS::Partition"}, ":s3:::*/*"]]}),
                  "Role": ROLE},
     ["Resource 'arn:<ref>:s3:::*/*' for s3:GetObject"], {"P": policy("s3:GetObject", SCOPED), "Role": ROLE}),
    # each fails: an ARN in Fn::Sub, every parameter or volume of the account without a Condition
    ("ST9", "P", {"P": policy("s3:GetObject", {"Fn::Sub": "arn:${AWS::Partition}:s3:::*/*"}), "Role": ROLE},
     ["Resource 'arn:<ref>:s3:::*/*' for s3:GetObject"],
     {"P": policy("s3:GetObject", {"Fn::Sub": "arn:${AWS::Partition}:s3:::${Bucket}/main/*"}), "Role": ROLE}),
    ("ST9", "P", {"P": policy("ssm:GetParameter", {"Fn::Sub": f"{SSM_ARN}:parameter/*"}), "Role": ROLE},
     ["Resource 'arn:aws:ssm:<ref>:<ref>:parameter/*' for ssm:GetParameter"],
     {"P": policy("ssm:GetParameter", "arn:aws:ssm:us-east-1:123456789012:parameter/spot-training/t/main/*"),
      "Role": ROLE}),
    ("ST9", "P", {"P": policy("ec2:AttachVolume", "arn:aws:ec2:us-east-1:123456789012:volume/*"), "Role": ROLE},
     ["Resource 'arn:aws:ec2:us-east-1:123456789012:volume/*' for ec2:AttachVolume"],
     {"P": conditioned(policy("ec2:AttachVolume", "arn:aws:ec2:us-east-1:123456789012:volume/*")), "Role": ROLE}),
    ("ST9", "P", {"P": policy("autoscaling:SetDesiredCapacity", "arn:aws:autoscaling:us-east-1:1:autoScalingGroup:*"),
                  "Role": ROLE},
     ["Resource 'arn:aws:autoscaling:us-east-1:1:autoScalingGroup:*' for autoscaling:SetDesiredCapacity"],
     {"P": policy("autoscaling:SetDesiredCapacity",
                  "arn:aws:autoscaling:us-east-1:1:autoScalingGroup:*:autoScalingGroupName/t-main"), "Role": ROLE}),
    ("ST9", "P", {"P": policy("ec2:AttachVolume", "arn:aws:ec2:us-east-1:1:volume/vol-*"), "Role": ROLE},
     ["Resource 'arn:aws:ec2:us-east-1:1:volume/vol-*' for ec2:AttachVolume"],
     {"P": policy("ec2:AttachVolume", "arn:aws:ec2:us-east-1:1:volume/vol-0123456789abcdef0"), "Role": ROLE}),
    # a condition that does not limit the resources (TLS only) scopes nothing
    ("ST9", "P", {"P": conditioned(policy("ssm:GetParameter", "arn:aws:ssm:us-east-1:1:parameter/*"),
                                   {"Bool": {"aws:SecureTransport": "true"}}), "Role": ROLE},
     ["Resource 'arn:aws:ssm:us-east-1:1:parameter/*' for ssm:GetParameter"],
     {"P": conditioned(policy("ssm:GetParameter", "arn:aws:ssm:us-east-1:1:parameter/*")), "Role": ROLE}),
    # a variable of Fn::Sub's map is its value
    ("ST9", "P", {"P": policy("s3:GetObject", {"Fn::Sub": ["arn:aws:s3:::${B}/${K}", {"B": "*", "K": "*"}]}),
                  "Role": ROLE},
     ["Resource 'arn:aws:s3:::*/*' for s3:GetObject"],
     {"P": policy("s3:GetObject", {"Fn::Sub": ["arn:aws:s3:::${B}/main/*", {"B": "b"}]}), "Role": ROLE}),
    ("ST9", "P", {"P": not_action_policy(), "Role": ROLE}, ["Allow with NotAction (everything not listed)"],
     {"P": policy("ec2:DescribeInstances", "*"), "Role": ROLE}),
    ("ST9", "Role", {"Role": {**ROLE, "Properties": {**ROLE["Properties"], "ManagedPolicyArns": [
        {"Fn::Join": ["", ["arn:", {"Ref": "AWS::Partition"}, ":iam::aws:policy/AmazonS3ReadOnlyAccess"]]}]}}},
     ["AWS managed policy AmazonS3ReadOnlyAccess (its statements are not in the template)"], {"Role": ROLE}),
    # a customer managed policy the role attaches (CDK's add_managed_policy: the policy lists no role)
    ("ST9", "MP", {"MP": managed_policy("s3:*"), "Role": ATTACHING}, ["Resource '*' for s3:*"],
     {"MP": managed_policy("s3:*", SCOPED), "Role": ATTACHING}),
    ("ST10", "SG", {"SG": sg("0.0.0.0/0")}, ["ingress from 0.0.0.0/0"], {"SG": sg("10.0.0.0/16")}),
]  # fmt: skip


def run(
    rule: Rule, logical_id: str, resources: dict[str, Any], parameters: Optional[dict[str, Any]] = None
) -> Optional[list[str]]:
    template = {"Resources": copy.deepcopy(resources), "Parameters": copy.deepcopy(parameters or {})}
    return rule.check(logical_id, template["Resources"][logical_id], template)


def test_ingress_from_a_parameter_that_can_be_open_fails() -> None:
    """Fails: the deployer chooses the CIDR, 0.0.0.0/0 included."""
    resources = {"SG": sg({"Ref": "Cidr"})}
    expected = ["ingress from parameter Cidr (can be 0.0.0.0/0 at deploy)"]
    assert run(RULE["ST10"], "SG", resources, {"Cidr": {"Type": "String"}}) == expected
    assert (
        run(RULE["ST10"], "SG", resources, {"Cidr": {"Type": "String", "AllowedValues": ["10.0.0.0/8", "0.0.0.0/0"]}})
        == expected
    )
    assert run(RULE["ST10"], "SG", resources, {"Cidr": {"Type": "String", "AllowedValues": ["10.0.0.0/8"]}}) == []
    # a pattern that admits only 10.x ranges passes (it is not flagged like no pattern); one that admits anything
    assert run(RULE["ST10"], "SG", resources, {"Cidr": {"Type": "String", "AllowedPattern": r"10\..*"}}) == []
    assert run(RULE["ST10"], "SG", resources, {"Cidr": {"Type": "String", "AllowedPattern": r".+/\d+"}}) == expected
    # the parameter read through Fn::Select (a list of CIDRs) or Fn::Sub fails too
    listed = {"SG": sg({"Fn::Select": [0, {"Ref": "Cidrs"}]})}
    assert run(RULE["ST10"], "SG", listed, {"Cidrs": {"Type": "CommaDelimitedList"}}) == [
        "ingress from parameter Cidrs (can be 0.0.0.0/0 at deploy)"
    ]
    assert run(RULE["ST10"], "SG", {"SG": sg({"Fn::Sub": "${Cidr}"})}, {"Cidr": {"Type": "String"}}) == expected
    ipv6 = {"SG": {"Type": "AWS::EC2::SecurityGroup",
                   "Properties": {"SecurityGroupIngress": [{"CidrIpv6": {"Ref": "Cidr"}}]}}}  # fmt: skip
    assert run(RULE["ST10"], "SG", ipv6, {"Cidr": {"Type": "String"}}) == [
        "ingress from parameter Cidr (can be ::/0 at deploy)"
    ]
    # a CIDR from another resource (the VPC's) is no deploy-time choice
    assert run(RULE["ST10"], "SG", {"SG": sg({"Fn::GetAtt": ["Vpc", "CidrBlock"]})}) == []


@pytest.mark.parametrize(("rule_id", "logical_id", "failing", "problems", "passing"), CASES)
def test_rule_fails_and_passes(
    rule_id: str, logical_id: str, failing: dict[str, Any], problems: list[str], passing: dict[str, Any]
) -> None:
    rule = RULE[rule_id]
    assert failing[logical_id]["Type"] in rule.types
    assert run(rule, logical_id, failing) == problems
    assert run(rule, logical_id, passing) == []


def test_spot_launch_template_without_mixed_instances_and_placement_from_the_launch_template() -> None:
    spot_lt = {
        "Type": "AWS::EC2::LaunchTemplate",
        "Properties": {
            "LaunchTemplateData": {
                "InstanceMarketOptions": {"MarketType": "spot"},
                "Placement": {"GroupName": {"Ref": "PG"}},
            }
        },
    }
    plain = group(
        MixedInstancesPolicy=None,
        LaunchTemplate={"LaunchTemplateId": {"Ref": "LT"}},
        VPCZoneIdentifier=["subnet-a", "subnet-b"],
    )
    del plain["Properties"]["MixedInstancesPolicy"]
    resources = {"G": plain, "LT": spot_lt}
    assert run(RULE["ST2"], "G", resources) == ["spot launch template without a MixedInstancesPolicy"]
    assert run(RULE["ST3"], "G", resources) == ["spans 2 subnets/AZs"]  # the placement group is the template's


def test_rules_leave_other_resources_alone() -> None:
    """Not applicable: an on-demand group (ST2), a spread or partition placement group (ST3), a single-node group
    (ST4), a non-checkpoint bucket (ST6), a volume outside any pool (ST8), a policy of a non-instance role (ST9)."""
    on_demand = group(MixedInstancesPolicy={"InstancesDistribution": {"OnDemandPercentageAboveBaseCapacity": 100}})
    assert run(RULE["ST2"], "G", {"G": on_demand}) is None
    for strategy in ("spread", "partition"):  # may span AZs (not failed like a cluster one)
        spread = {
            "G": group(PlacementGroup={"Ref": "PG"}, VPCZoneIdentifier=TWO_SUBNETS),
            "PG": placement_group(strategy),
        }
        assert run(RULE["ST3"], "G", spread) is None
    assert run(RULE["ST4"], "G", {"G": group(MaxSize="1", CapacityRebalance=False)}) is None
    assert run(RULE["ST6"], "B", {"B": {"Type": "AWS::S3::Bucket", "Properties": {}}}) is None
    assert run(RULE["ST8"], "V", {"V": {"Type": "AWS::EC2::Volume", "Properties": {"Encrypted": False}}}) is None
    lambda_role = {"Type": "AWS::IAM::Role", "Properties": {"AssumeRolePolicyDocument": {"Service": "lambda"}}}
    assert run(RULE["ST9"], "P", {"P": policy("s3:*", "*"), "Role": lambda_role}) is None


def test_every_rule_has_an_id_a_fix_and_a_reason() -> None:
    assert [r.id for r in RULES] == [f"ST{i}" for i in range(1, 12)]
    for rule in RULES:
        assert rule.message.endswith(".") and len(rule.message.splitlines()) == 1
        assert rule.why


def _synth_with(tmp_path: Path, breaks: Any) -> set[str]:
    app = App(context=CONTEXT, outdir=str(tmp_path))
    [stack] = cdk_app.add_teams(app, [type("T", (), {"name": "x", "stack_name": "S", "config": team_config()})()])
    breaks(stack.clusters["main"])
    with pytest.raises(RuntimeError, match="ValidationFailed"):
        app.synth()
    report = json.loads((tmp_path / "validation-report.json").read_text())
    return {v["ruleName"] for p in report["pluginReports"] for v in p["violations"]}


def test_a_raw_override_that_breaks_imdsv2_stops_synth(tmp_path: Path) -> None:
    """A hand-written escape hatch on the launch template is seen: the pack reads the synthesized template."""

    def breaks(cluster: Any) -> None:
        cfn = cluster.fleet.launch_template.node.default_child
        cfn.add_property_override("LaunchTemplateData.MetadataOptions.HttpTokens", "optional")

    assert "SpotTraining-ST1" in _synth_with(tmp_path, breaks)


def test_a_raw_override_that_pins_min_size_stops_synth(tmp_path: Path) -> None:
    def breaks(cluster: Any) -> None:
        cluster.asg.node.default_child.add_property_override("MinSize", "2")

    assert "SpotTraining-ST5" in _synth_with(tmp_path, breaks)


def test_shipped_teams_are_checked_and_pass(assembly: Path) -> None:
    """Every rule applies to something in the shipped teams (plus a team with every option) and finds nothing:
    the checkpoint bucket, warm-pool volumes and instance-role policies are recognised, not skipped."""
    applied: set[str] = set()
    for path in sorted(assembly.glob("*.template.json")):
        template = json.loads(path.read_text())
        for logical_id, resource in template["Resources"].items():
            for rule in RULES:
                if resource["Type"] in rule.types:
                    result = rule.check(logical_id, resource, template)
                    assert not result, f"{path.name} {logical_id}: {rule.id} {result}"
                    if result is not None:
                        applied.add(rule.id)
    assert applied == {r.id for r in RULES}


def test_a_template_the_pack_cannot_read_fails_the_synth_instead_of_passing_it(tmp_path: Path) -> None:
    """A plugin that throws is a success to the CDK CLI (it only notes the error in the validation report): the
    pack returns an error on every stack instead."""
    missing = SimpleNamespace(stack_construct_path="S", template_path=str(tmp_path / "S.template.json"))
    found = SpotTrainingChecks().validate(SimpleNamespace(stack_templates=[missing], app_construct=None))
    assert found.success is False
    [violation] = found.violations
    assert violation.rule_name == "SpotTraining-Error" and violation.severity == "error"
    assert violation.description.startswith("SpotTrainingChecks could not check the templates: FileNotFoundError")
