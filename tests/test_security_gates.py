"""Security review gates on every synthesized template: checkov, and a walk of every IAM policy statement.

Templates: every shipped team file (teams/) plus a team that switches on every optional feature (imported VPC,
warm pool, interruption drill, an arm cluster without placement group). One in-process synth for the module.

checkov runs as review_gates.checkov_scan runs it (its own venv, no update check, a guard that refuses any lookup
or connection off loopback), as ``make review`` does. A failed check fails the test; a check may only be skipped in the
construct, with ``compliance.checkov.skip_checkov`` (CloudFormation ``Metadata: checkov: skip``) and a
reason, and only if it is listed in ``REVIEWED_SKIPS`` below, so a new skip shows up in review here too.

The policy walk reads every identity policy statement (AWS::IAM::Policy, ManagedPolicy, Role/User/Group inline
policies, RolePolicy) and fails on an Allow of any action on Resource ``"*"`` that is not in the explicit
``WILDCARD_RESOURCE_ACTIONS`` (read-only calls AWS authorizes only on ``"*"``), on wildcard actions, on
NotAction/NotResource, and on AWS managed policies other than ``AWS_MANAGED_POLICIES`` (their statements are
not in the template, so the walk cannot see them).
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aws_cdk import App
from aws_cdk import aws_iam as iam
from aws_cdk.assertions import Template

from compliance.spot_training.arns import is_wildcard_resource, render, scoped_by_tag
from review_gates.checkov_scan import CHECKOV, checkov, checkov_env, checks, describe, network_log, run_checkov
from stacks import TrainingStack
from team_config import TeamConfig, load_teams
from tests.synth import CONTEXT, EVERYTHING, team_config

REPO = Path(__file__).resolve().parent.parent


# Every checkov skip in the app, by (check id, resource type). The reason itself sits on the resource (Metadata);
# this list makes a new skip visible in review of this file as well.
REVIEWED_SKIPS: dict[tuple[str, str], str] = {
    ("CKV_AWS_158", "AWS::Logs::LogGroup"): "training and flow-log groups (LOG_GROUP_KMS_SKIP): AWS-managed "
    "encryption at rest; a customer-managed key changes nothing about who may read them (training_logs.py)",
    ("CKV_AWS_18", "AWS::S3::Bucket"): "the access-log bucket itself; logging it into itself would loop "
    "(training_constructs/checkpoint_store.py)",
    # the budget guard function (training_constructs/team_budget.py, GUARD_CHECKOV_SKIPS)
    ("CKV_AWS_116", "AWS::Lambda::Function"): "scheduled run, retried by EventBridge, repeated by the next run: "
    "a dead-letter queue would only hold copies of the timer event",
    ("CKV_AWS_117", "AWS::Lambda::Function"): "calls only AWS APIs, reaches nothing in the VPC; a VPC would need "
    "NAT or endpoints for nothing gained",
    ("CKV_AWS_115", "AWS::Lambda::Function"): "no reserved concurrency: it runs once per schedule period, and "
    "reserving any fails deploys on accounts at the minimum Lambda concurrency quota",
    ("CKV_AWS_173", "AWS::Lambda::Function"): "the environment holds names, no secrets; the AWS-managed key "
    "encrypts it at rest",
    ("CKV_AWS_111", "AWS::IAM::Policy"): "the node role's Session Manager channels (SESSION_MANAGER_ACTIONS in "
    "training_constructs/spot_fleet.py): AWS authorizes them on '*' only; they read and change no data",
}

# Read-only actions that AWS authorizes only on Resource "*" (the service authorization reference lists no
# resource type for them), and who needs each. Nothing that reads or writes data belongs here.
WILDCARD_RESOURCE_ACTIONS: dict[str, str] = {
    # node agent: peer discovery (InService instances); budget guard: group sizes
    "autoscaling:DescribeAutoScalingGroups": "no resource-level permissions",
    "autoscaling:DescribeAutoScalingInstances": "no resource-level permissions",
    # capacity watcher: the group's failed spot launches
    "autoscaling:DescribeScalingActivities": "no resource-level permissions",
    # node agent: peer addresses, launch times (the oldest hosts the rendezvous); FIS: the drill's targets by tag
    "ec2:DescribeInstances": "no resource-level permissions",
    # node agent: finding a free warm-pool volume in its AZ (the claim itself is scoped, see ClaimPolicy); only a
    # cluster with a pool gets it
    "ec2:DescribeVolumes": "no resource-level permissions",
    # the SSM agent, for Session Manager (the only way into a node): registering the node, opening its channels.
    # They read nothing; AWS's own minimal policy for it (AWSCloud9SSMInstanceProfile) grants them on "*".
    "ssm:UpdateInstanceInformation": "Session Manager: the SSM agent registers the node",
    "ssmmessages:CreateControlChannel": "Session Manager channel",
    "ssmmessages:CreateDataChannel": "Session Manager channel",
    "ssmmessages:OpenControlChannel": "Session Manager channel",
    "ssmmessages:OpenDataChannel": "Session Manager channel",
}
# of those, granted only with a warm pool (its ClaimPolicy) or a capacity fallback (the capacity watcher)
OPTIONAL_FEATURE_ONLY = {"ec2:DescribeVolumes", "autoscaling:DescribeScalingActivities"}

# AWS managed policies the templates may attach, and why. Their statements are not in the template.
AWS_MANAGED_POLICIES: dict[str, str] = {}

IDENTITY_POLICY_TYPES = {
    "AWS::IAM::Policy",
    "AWS::IAM::ManagedPolicy",
    "AWS::IAM::RolePolicy",
    "AWS::IAM::UserPolicy",
    "AWS::IAM::GroupPolicy",
}
INLINE_POLICY_HOLDERS = {"AWS::IAM::Role", "AWS::IAM::User", "AWS::IAM::Group"}
# "*", "arn:aws:s3:::*", "arn:aws:s3:::*/*", "arn:<partition>:logs:<region>:<account>:*", ...


# ---------------------------------------------------------------------------------------------------- templates
@pytest.fixture(scope="module")
def templates(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    outdir = tmp_path_factory.mktemp("cdk.out")
    app = App(context=CONTEXT, outdir=str(outdir))
    for team in load_teams(REPO / "teams"):
        TrainingStack(app, team.stack_name, team=team.name, config=team.config)
    TrainingStack(app, "TrainingStack-everything", team="everything", config=TeamConfig.model_validate(EVERYTHING))
    app.synth()
    found = {p.name: p for p in sorted(outdir.glob("*.template.json"))}
    assert len(found) == len(load_teams(REPO / "teams")) + 1
    return found


# ---------------------------------------------------------------------------------------------------- checkov
@pytest.fixture(scope="module")
def checkov_reports(templates: dict[str, Path]) -> list[dict[str, Any]]:
    return run_checkov(list(templates.values()))


def test_checkov_scanned_every_template(checkov_reports: list[dict[str, Any]], templates: dict[str, Path]) -> None:
    assert [r["check_type"] for r in checkov_reports] == ["cloudformation"]
    assert checkov_reports[0]["summary"]["parsing_errors"] == 0
    scanned = {
        Path(c["file_path"]).name for kind in ("passed_checks", "failed_checks") for c in checks(checkov_reports, kind)
    }
    assert scanned == set(templates)
    assert checkov_reports[0]["summary"]["passed"] > 100  # it really ran its checks


def test_checkov_finds_nothing(checkov_reports: list[dict[str, Any]]) -> None:
    failed = sorted(describe(c) for c in checks(checkov_reports, "failed_checks"))
    assert failed == [], "fix the finding in the construct, or skip it there with skip_checkov and a reason:\n" + (
        "\n".join(failed)
    )


def test_every_checkov_skip_is_reviewed_and_has_a_reason(checkov_reports: list[dict[str, Any]]) -> None:
    skipped = checks(checkov_reports, "skipped_checks")
    assert skipped, "the app skips CKV_AWS_158 and CKV_AWS_18 (see REVIEWED_SKIPS): checkov must report them"
    for check in skipped:
        key = (check["check_id"], check["resource"].split(".")[0])
        assert key in REVIEWED_SKIPS, f"unreviewed skip: {describe(check)}; add it to REVIEWED_SKIPS with where/why"
        reason = check["check_result"].get("suppress_comment") or ""
        assert len(reason) >= 40 and "todo" not in reason.lower(), f"{describe(check)}: reason {reason!r}"
    assert {(c["check_id"], c["resource"].split(".")[0]) for c in skipped} == set(REVIEWED_SKIPS), (
        "REVIEWED_SKIPS lists a skip the app no longer makes: remove it"
    )


def test_checkov_gate_can_fail_and_honours_only_skips_in_metadata(tmp_path: Path) -> None:
    """A bucket without versioning fails CKV_AWS_21; the same bucket with the Metadata skip is reported skipped."""
    bucket: dict[str, Any] = {"Type": "AWS::S3::Bucket", "Properties": {}}
    skip = {"checkov": {"skip": [{"id": "CKV_AWS_21", "comment": "a reason a reviewer can check, long enough"}]}}
    bad, skipped = tmp_path / "bad.template.json", tmp_path / "skipped.template.json"
    bad.write_text(json.dumps({"Resources": {"Bucket": bucket}}))
    skipped.write_text(json.dumps({"Resources": {"Bucket": {**bucket, "Metadata": skip}}}))
    reports = run_checkov([bad, skipped])
    failed = {(Path(c["file_path"]).name, c["check_id"]) for c in checks(reports, "failed_checks")}
    assert ("bad.template.json", "CKV_AWS_21") in failed
    assert ("skipped.template.json", "CKV_AWS_21") not in failed
    [skip_report] = [c for c in checks(reports, "skipped_checks") if c["check_id"] == "CKV_AWS_21"]
    assert Path(skip_report["file_path"]).name == "skipped.template.json"
    assert skip_report["check_result"]["suppress_comment"] == "a reason a reviewer can check, long enough"


def test_the_network_guard_refuses_the_update_check_checkov_makes_without_its_setting(tmp_path: Path) -> None:
    """Not vacuous: without CKV_SKIP_PACKAGE_UPDATE_CHECK, checkov looks up pypi.org as it starts, and the guard
    refuses that lookup. The guard is first shown to load in checkov's interpreter, so nothing leaves the machine."""
    env = checkov_env(tmp_path)
    probe = subprocess.run([str(CHECKOV.parent / "python"), "-c", "pass"], env=env, capture_output=True, timeout=60)
    assert (probe.returncode, network_log(tmp_path)) == (0, (True, [])), probe.stderr
    (tmp_path / "network.log").unlink()
    del env["CKV_SKIP_PACKAGE_UPDATE_CHECK"]
    template = tmp_path / "bucket.template.json"
    template.write_text(json.dumps({"Resources": {"Bucket": {"Type": "AWS::S3::Bucket", "Properties": {}}}}))
    result = checkov([template], env)
    assert result.returncode in (0, 1), result.stderr[-3000:]
    loaded, attempts = network_log(tmp_path)
    assert loaded and attempts, attempts
    assert all("pypi.org" in attempt for attempt in attempts), attempts


# ---------------------------------------------------------------------------------------------------- policy walk
def as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def policy_statements(template: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """``(where, statement)`` for every statement of every identity policy in ``template``."""
    for logical_id, resource in template.get("Resources", {}).items():
        props = resource.get("Properties", {})
        documents: list[tuple[str, Any]] = []
        if resource["Type"] in IDENTITY_POLICY_TYPES:
            documents.append((logical_id, props.get("PolicyDocument", {})))
        elif resource["Type"] in INLINE_POLICY_HOLDERS:
            documents += [
                (f"{logical_id}/{p.get('PolicyName')}", p["PolicyDocument"]) for p in props.get("Policies", [])
            ]
        for where, document in documents:
            for i, statement in enumerate(as_list(document.get("Statement", []))):
                yield f"{where} statement {statement.get('Sid') or i}", statement


def managed_policy_arns(template: dict[str, Any]) -> Iterator[tuple[str, str]]:
    for logical_id, resource in template.get("Resources", {}).items():
        if resource["Type"] in INLINE_POLICY_HOLDERS:
            for arn in resource.get("Properties", {}).get("ManagedPolicyArns", []):
                yield logical_id, render(arn)


def policy_findings(name: str, template: dict[str, Any]) -> list[str]:
    """One line per statement part that widens a policy beyond what the gate allows (empty: the template passes)."""
    findings: list[str] = []
    for where, statement in policy_statements(template):
        if statement.get("Effect") != "Allow":
            continue
        for key in ("NotAction", "NotResource"):
            if key in statement:
                findings.append(f"{name}: {where}: Allow with {key} grants everything not listed; list what it needs")
        actions = [str(a) for a in as_list(statement.get("Action", []))]
        for action in actions:
            if action == "*" or action.endswith(":*"):
                findings.append(f"{name}: {where}: wildcard action {action!r}; name the actions")
        tagged = scoped_by_tag(statement)  # instance/* of the cluster's own tags
        resources = as_list(statement.get("Resource", []))
        wildcards = ", ".join(
            repr(w) for w in sorted({render(r) for r in resources if is_wildcard_resource(r, tagged)})
        )
        if wildcards:
            for action in actions:
                if action not in WILDCARD_RESOURCE_ACTIONS:
                    findings.append(
                        f"{name}: {where}: {action} on Resource {wildcards}: scope it to the team's own resources "
                        "(bucket prefix, log group, group, volumes, parameters); only read-only actions without "
                        "resource-level permissions may use '*' (WILDCARD_RESOURCE_ACTIONS)"
                    )
    for holder, arn in managed_policy_arns(template):
        if ":iam::aws:policy/" in arn and arn.rsplit("/", 1)[-1] not in AWS_MANAGED_POLICIES:
            findings.append(
                f"{name}: {holder}: AWS managed policy {arn.rsplit('/', 1)[-1]}: its statements are not in the "
                "template; write the statements the role needs instead"
            )
    return findings


def load(path: Path) -> dict[str, Any]:
    return dict(json.loads(path.read_text()))


def test_no_policy_grants_data_plane_actions_on_every_resource(templates: dict[str, Path]) -> None:
    findings = [f for name, path in templates.items() for f in policy_findings(name, load(path))]
    assert findings == [], "\n".join(findings)


def test_policy_walk_reads_every_policy_kind_it_must(templates: dict[str, Path]) -> None:
    """Not vacuous: the walk sees the instance role's scoped grants and the allow-listed Describe* statements (the
    warm pool's only in a team with a pool)."""
    seen: set[str] = set()
    for name, path in templates.items():
        template = load(path)
        actions = {str(a) for _, s in policy_statements(template) for a in as_list(s.get("Action", []))}
        assert {"s3:PutObject", "logs:PutLogEvents", "autoscaling:SetDesiredCapacity", "ssm:GetParameter"} <= actions
        assert set(WILDCARD_RESOURCE_ACTIONS) - OPTIONAL_FEATURE_ONLY <= actions, name
        assert {arn.rsplit("/", 1)[-1] for _, arn in managed_policy_arns(template)} == set(AWS_MANAGED_POLICIES)
        seen |= actions
    assert set(WILDCARD_RESOURCE_ACTIONS) <= seen


def test_walk_flags_a_widened_statement() -> None:
    template = {
        "Resources": {
            "Scale": {
                "Type": "AWS::IAM::Policy",
                "Properties": {
                    "PolicyDocument": {
                        "Statement": [
                            {
                                "Sid": "ScaleOwnGroup",
                                "Effect": "Allow",
                                "Action": ["autoscaling:DescribeAutoScalingGroups", "autoscaling:SetDesiredCapacity"],
                                "Resource": "*",
                            },
                            {"Effect": "Deny", "Action": "s3:DeleteObject", "Resource": "*"},
                        ]
                    }
                },
            },
            "Logs": {
                "Type": "AWS::IAM::Role",
                "Properties": {
                    "Policies": [
                        {
                            "PolicyName": "Write",
                            "PolicyDocument": {
                                "Statement": {
                                    "Effect": "Allow",
                                    "Action": "logs:PutLogEvents",
                                    "Resource": {"Fn::Join": ["", ["arn:", {"Ref": "AWS::Partition"}, ":logs:*:*:*"]]},
                                }
                            },
                        }
                    ]
                },
            },
        }
    }
    findings = policy_findings("t.json", template)
    assert len(findings) == 2, findings  # the Describe* action and the Deny pass
    assert findings[0].startswith(
        "t.json: Scale statement ScaleOwnGroup: autoscaling:SetDesiredCapacity on Resource '*'"
    )
    assert findings[1].startswith(
        "t.json: Logs/Write statement 0: logs:PutLogEvents on Resource 'arn:<ref>:logs:*:*:*'"
    )


def test_walk_flags_policies_widened_in_a_real_stack() -> None:
    """A raw override of the checkpoint grant to Resource '*' and an extra AWS managed policy both fail the gate."""
    app = App(context=CONTEXT)
    stack = TrainingStack(app, "TrainingStack-widened", team="widened", config=team_config())
    cluster = stack.clusters["main"]
    policy = cluster.node.find_child("CheckpointAccess")
    assert isinstance(policy, iam.Policy)
    cfn_policy = policy.node.default_child
    assert isinstance(cfn_policy, iam.CfnPolicy)
    for statement in (1, 2, 3, 4, 5):  # the object grants, and the Deny of code writes (which passes)
        cfn_policy.add_property_override(f"PolicyDocument.Statement.{statement}.Resource", "*")
    cluster.role.add_managed_policy(iam.ManagedPolicy.from_aws_managed_policy_name("AmazonS3FullAccess"))
    findings = policy_findings("widened", dict(Template.from_stack(stack).to_json()))
    widened = [f for f in findings if "on Resource '*'" in f]
    assert {(f.split(" statement ")[1].split(":")[0], f.split(": ")[2].split(" on ")[0]) for f in widened} == {
        ("ReadOwnClusterObjects", "s3:GetObject"),
        ("WriteJobCheckpointsAndMarkers", "s3:PutObject"),
        ("PruneJobCheckpoints", "s3:AbortMultipartUpload"),
        ("PruneJobCheckpoints", "s3:DeleteObject"),
        ("TakeQueuedJobs", "s3:DeleteObject"),
    }
    [managed] = [f for f in findings if "AWS managed policy" in f]
    assert managed.startswith("widened: ") and managed.endswith(
        ": AWS managed policy AmazonS3FullAccess: its statements are not in the template; "
        "write the statements the role needs instead"
    )
    assert len(findings) == len(widened) + 1
