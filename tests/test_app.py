"""The whole app: every team file synthesizes, cdk-nag and cfn-lint (less cfn-lint-allowed.yaml) are clean, teams never
collide."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from aws_cdk import App, Stack
from aws_cdk import aws_ec2 as ec2

from review_gates import cfn_lint
from team_config import load_teams
from team_config.naming import budget_name
from tests.synth import CONTEXT, EVERYTHING, OVERSIZED, oversized_team, team_config, write_app_teams
from training_app import wiring as cdk_app

# Physical-name properties: a literal value here would collide when two teams deploy to one account.
NAME_PROPERTIES = {
    "BucketName",
    "RoleName",
    "LogGroupName",
    "AutoScalingGroupName",
    "LaunchTemplateName",
    "GroupName",
    "InstanceProfileName",
    "PolicyName",
    "TopicName",
    "Name",
    "ManagedPolicyName",
}


def literal_names(template: dict[str, Any]) -> set[tuple[str, str]]:
    names = set()
    for resource in template["Resources"].values():
        for key, value in resource.get("Properties", {}).items():
            if key in NAME_PROPERTIES and isinstance(value, str) and resource["Type"] != "AWS::IAM::Policy":
                names.add((resource["Type"], value))
        if resource["Type"] == "AWS::Budgets::Budget":  # the name sits inside the Budget property
            names.add((resource["Type"], resource["Properties"]["Budget"]["BudgetName"]))
    return names


@pytest.fixture(scope="module")
def assembly(tmp_path_factory: pytest.TempPathFactory, repo: Path) -> Path:
    """`app.py` over the shipped teams/ plus a team exercising every optional feature, with the cdk-nag gate on."""
    teams_dir = write_app_teams(tmp_path_factory.mktemp("teams"), repo)
    outdir = tmp_path_factory.mktemp("cdk.out")
    # Runs the same entry point as `npx cdk synth`; raises if cdk-nag reports anything unacknowledged.
    cdk_app.main(App(context={**CONTEXT, "teams_dir": str(teams_dir)}, outdir=str(outdir)), teams_dir=teams_dir)
    return outdir


def test_one_stack_per_team_file(assembly: Path, repo: Path) -> None:
    manifest = json.loads((assembly / "manifest.json").read_text())
    stacks = {k for k, v in manifest["artifacts"].items() if v["type"] == "aws:cloudformation:stack"}
    expected = {t.stack_name for t in load_teams(repo / "teams")} | {"TrainingStack-everything"}
    assert stacks == expected
    assert "TrainingStack" in stacks


def test_cdk_nag_reports_nothing_unacknowledged(assembly: Path) -> None:
    """CDK writes the report whenever validation plugins ran (cdk-nag's packs from add_teams, and its own
    CloudFormation check), with no plugin report when all pass: a missing report means nothing was checked, not
    that all is clean. That add_teams' cdk-nag gate can fail synth: the next test."""
    report_file = assembly / "validation-report.json"
    assert report_file.is_file(), f"no {report_file.name} in the assembly: no validation plugin ran"
    report = json.loads(report_file.read_text())
    violations = [v for p in report["pluginReports"] for v in p.get("violations", [])]
    assert violations == []


def test_cdk_nag_gate_fails_synth_on_an_open_security_group(tmp_path: Path) -> None:
    """The gate can fail: an SSH-from-anywhere rule stops synth with the cdk-nag finding."""
    app = App(context=CONTEXT, outdir=str(tmp_path))
    [stack] = cdk_app.add_teams(app, [type("T", (), {"name": "x", "stack_name": "S", "config": team_config()})()])
    sg = stack.clusters["main"].fleet.security_group
    sg.add_ingress_rule(ec2.Peer.any_ipv4(), ec2.Port.tcp(22))
    with pytest.raises(RuntimeError, match="ValidationFailed"):
        app.synth()
    report = json.loads((tmp_path / "validation-report.json").read_text())
    rules = {v["ruleName"] for p in report["pluginReports"] for v in p["violations"]}
    assert "AwsSolutions-EC23" in rules


def test_cfn_lint_reports_no_error_and_no_warning_but_the_allowed_ones(assembly: Path) -> None:
    """Every template of the shipped teams and of the every-option team; the gate itself: test_review_gates.py."""
    templates = sorted(assembly.glob("*.template.json"))
    assert len(templates) >= 3
    allowed = cfn_lint.load_allowed()
    findings = cfn_lint.lint(templates)
    failing = cfn_lint.not_allowed(findings, allowed)
    assert failing == [], "\n".join(f.describe() for f in failing)
    unused = set(allowed) - {f.rule for f in findings}
    assert not unused, f"{cfn_lint.ALLOWED_FILE.name} lists {sorted(unused)}, which cfn-lint no longer reports: remove"


def test_two_teams_side_by_side_have_no_colliding_physical_names(assembly: Path, repo: Path) -> None:
    templates = {p.name: json.loads(p.read_text()) for p in assembly.glob("*.template.json")}
    seen: dict[tuple[str, str], str] = {}
    for name, template in templates.items():
        for physical in literal_names(template):
            assert physical not in seen, f"{physical} is fixed in both {seen[physical]} and {name}"
            seen[physical] = name
    # The only fixed names are the team-scoped SSM parameters and budgets, of the teams the assembly holds.
    teams = {t.name: t.config for t in load_teams(repo / "teams")} | {"everything": team_config(**EVERYTHING)}
    budgets = {budget_name(team, c.budget.notify, c.budget.warn_at_percent) for team, c in teams.items() if c.budget}
    assert {n for _, n in seen} == budgets | {
        f"/spot-training/{team}/{cluster.name}/job-spec" for team, c in teams.items() for cluster in c.clusters
    }


# Every venv module that `python -O` loads for the app and every module of its packages (the Makefile's
# SYNTH_IMPORTS), without optimized bytecode.
MISSING_OPTIMIZED_BYTECODE = """
import importlib, importlib.util, os, pkgutil, sys, sysconfig
import app
for p in ("training_app", "compliance", "training_constructs"):
    for m in pkgutil.walk_packages(importlib.import_module(p).__path__, p + "."):
        importlib.import_module(m.name)
site = sysconfig.get_paths()["purelib"]
files = {getattr(m, "__file__", None) or "" for m in list(sys.modules.values())}
for f in sorted(f for f in files if f.startswith(site) and f.endswith(".py")):
    if not os.path.exists(importlib.util.cache_from_source(f, optimization=1)):
        print(f)
"""


def test_venv_has_the_optimized_bytecode_that_cdk_json_runs(repo: Path) -> None:
    """cdk.json runs the app under -O; without optimized bytecode, where PYTHONDONTWRITEBYTECODE is set, every
    synth would compile aws-cdk-lib's modules again. The venv's install (Makefile) writes it."""
    assert json.loads((repo / "cdk.json").read_text())["app"] == "python3 -O app.py"
    result = subprocess.run(
        [sys.executable, "-O", "-c", MISSING_OPTIMIZED_BYTECODE],
        cwd=repo,
        env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    missing = result.stdout.split()
    assert missing == [], f"{len(missing)} modules without .opt-1.pyc (make -W requirements.txt run-deps): {missing}"


def test_synth_records_no_creation_stack_traces(assembly: Path) -> None:
    """app.py turns them off: in a Python app they hold only jsii runtime frames, and cost every construct."""
    metadata = "".join(p.read_text() for p in assembly.glob("*.metadata.json"))
    assert "aws:cdk:logicalId" in metadata
    assert "aws:cdk:creationStack" not in metadata


def test_team_context_synthesizes_only_that_team(tmp_path: Path, repo: Path) -> None:
    app = App(context={**CONTEXT, "team": "research"}, outdir=str(tmp_path))
    cdk_app.main(app)
    assert [s.stack_name for s in app.node.children if isinstance(s, Stack)] == ["TrainingStack-research"]


def test_a_stack_over_cloudformation_s_resource_quota_is_one_line_naming_the_team_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A team file the schema accepts whose stack would exceed 500 resources. Without the check, synth would end in
    a 40-line jsii traceback naming neither the file nor a fix. (589 in-process; `npx cdk synth` adds the CLI's
    CDK::Metadata.)"""
    path = oversized_team(tmp_path / "teams")
    app = App(context={**CONTEXT, "teams_dir": str(path.parent)}, outdir=str(tmp_path / "out"))
    with pytest.raises(SystemExit) as exit_:
        cdk_app.main(app)
    assert exit_.value.code == 2
    assert capsys.readouterr().err == f"error: {path}: {OVERSIZED.format(count=589)}\n"


def test_the_cdk_cli_sends_no_telemetry_and_fetches_no_notices_from_this_repo() -> None:
    """Everything talks to 127.0.0.0/8 only. The pinned CLI with its defaults sends telemetry to
    cdk-cli-telemetry.us-east-1.api.aws and fetches notices from the CDK's site (both seen by strace under `make synth`
    and `npx cdk synth`); cdk.json turns both off for every command run from the checkout, and the CLI's own trace says
    what it decided."""
    repo = Path(__file__).resolve().parent.parent
    env = {k: v for k, v in os.environ.items() if k != "CDK_DISABLE_CLI_TELEMETRY"}
    env["PATH"] = f"{repo / 'node_modules' / '.bin'}{os.pathsep}{env.get('PATH', '')}"
    result = subprocess.run(
        ["npx", "--no", "cdk", "context", "-vvv"], cwd=repo, env=env, capture_output=True, text=True, timeout=120
    )
    trace = result.stdout + result.stderr
    assert result.returncode == 0, trace
    assert "Telemetry disabled" in trace and "Telemetry sink registered" not in trace
    assert "notices: false" in trace and "cached notices" not in trace.lower()
