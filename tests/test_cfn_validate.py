"""aws-cdk-lib's CloudFormation validation with its engine in a worker process (cfn_validate/): the same report
as aws-cdk-lib's own plugin on the same app, the gate still fails synth, acknowledgements still apply, and
``python3 -O app.py`` (what cdk.json runs) uses the worker instead of aws-cdk-lib's copy."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Optional

import pytest
from aws_cdk import App, CfnResource, Stack
from aws_cdk import aws_ec2 as ec2

import cfn_validate
from benchmarks.synth_phases import SLOW_SYNTH_THRESHOLD
from cfn_validate.plugin import CloudFormationValidateWorker
from compliance.nag import acknowledge
from team_config import load_teams
from tests.synth import CONTEXT, write_app_teams
from training_app import wiring as cdk_app
from training_app.validator import start_cfn_validate


def broken_app(outdir: Path, teams_dir: Path, validator: Optional[CloudFormationValidateWorker]) -> App:
    """The shipped teams and the every-option team, plus a stack the validator finds fault with: a volume without
    its required AvailabilityZone (an error), a bucket's versioning status CloudFormation does not know and two
    volumes in a literal AZ (warnings), one of them acknowledged."""
    app = App(context=CONTEXT, outdir=str(outdir), builtin_cloud_formation_validation=validator is None)
    cdk_app.add_teams(app, load_teams(teams_dir), validator)
    stack = Stack(app, "Broken")
    CfnResource(stack, "NoZone", type="AWS::EC2::Volume", properties={"Size": 10, "Encrypted": True})
    CfnResource(stack, "Bucket", type="AWS::S3::Bucket", properties={"VersioningConfiguration": {"Status": "Often"}})
    for name in ("Acknowledged", "Reported"):
        volume = ec2.CfnVolume(stack, name, availability_zone="us-east-1a", size=10, encrypted=True)
        if name == "Acknowledged":
            acknowledge(volume, "CloudFormation-Validate::W3010", "a test: this one is acknowledged, the other not")
    return app


@pytest.fixture(scope="module")
def teams_dir(tmp_path_factory: pytest.TempPathFactory, repo: Path) -> Path:
    return write_app_teams(tmp_path_factory.mktemp("teams"), repo)


def report(outdir: Path) -> dict[str, Any]:
    found = json.loads((outdir / "validation-report.json").read_text())
    return {p["pluginName"]: p for p in found["pluginReports"]}


def test_worker_reports_what_aws_cdk_lib_reports(tmp_path: Path, teams_dir: Path) -> None:
    engine = cfn_validate.start_engine()
    assert engine is not None, "no engine copy in the venv: make run-deps writes it (python -m cfn_validate)"
    reports = {}
    for side, validator in (("aws-cdk-lib", None), ("worker", CloudFormationValidateWorker(engine))):
        outdir = tmp_path / side
        with pytest.raises(RuntimeError, match="ValidationFailed"):
            broken_app(outdir, teams_dir, validator).synth()
        reports[side] = report(outdir)
    assert reports["worker"] == reports["aws-cdk-lib"]
    found = reports["worker"]["CloudFormation Validate"]
    assert found["conclusion"] == "failure"  # the error fails synth, as cdk.json's validateAgainstDefaultRules asks
    by_rule = {v["ruleName"]: v for v in found["violations"]}
    assert by_rule["F3017"]["severity"] == "error"  # the volume without a zone
    assert [c["constructPath"] for c in by_rule["W3010"]["violatingConstructs"]] == ["Broken/Reported"]
    assert by_rule["W3030"]["severity"] == "warning"
    suppressed = {c["constructPath"] for v in found["suppressedViolations"] for c in v["violatingConstructs"]}
    # the test's acknowledgement, and the app's own on the every-option team's warm pool volumes (a literal AZ)
    assert "Broken/Acknowledged" in suppressed
    assert any(p.startswith("TrainingStack-everything/Cluster-pool/WarmPool/") for p in suppressed)
    # the engine copied into the venv is the one aws-cdk-lib runs
    copied = json.loads((cfn_validate.engine_dir() / "cloudformation-validate" / "package.json").read_text())
    assert found["pluginVersion"] == copied["version"]


UNCHECKED = "the validator worker ended (exit code 3); the templates were not checked, so the synth fails"


def test_a_worker_that_died_fails_synth(tmp_path: Path, teams_dir: Path) -> None:
    """No answer is no pass: a worker that ended (a crash, a kill) stops synth with an error on every stack."""
    dead = subprocess.Popen(["node", "-e", "process.exit(3)"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    dead.wait(timeout=30)
    with pytest.raises(RuntimeError, match=re.escape(UNCHECKED)):
        broken_app(tmp_path, teams_dir, CloudFormationValidateWorker(dead)).synth()
    [violation] = report(tmp_path)["CloudFormation Validate"]["violations"]
    assert violation["ruleName"] == "ValidatorWorkerFailed" and violation["severity"] == "error"
    assert {c["constructPath"] for c in violation["violatingConstructs"]} >= {"Broken", "TrainingStack"}


def test_npx_cdk_synth_fails_when_the_worker_dies(tmp_path: Path, repo: Path) -> None:
    """Through the CDK CLI, as `npx cdk synth` runs the app. The CLI reports a validation plugin that throws in the
    validation report and still calls the synth a success: the worker's error is a finding, and the CLI fails the
    synth on it. Otherwise a worker that died while it checked the templates would pass synth unchecked."""
    node = tmp_path / "node"  # node as JSII_NODE, except for the worker: it reads the templates' request and dies
    node.write_text('#!/bin/sh\ncase "$*" in *worker.js*) read -r request; exit 3;; esac\nexec node "$@"\n')
    node.chmod(0o755)
    env = dict(os.environ, JSII_NODE=str(node), CDK_DISABLE_VERSION_CHECK="1")
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), str(repo / "node_modules" / ".bin"), env["PATH"]])
    env.pop("CDK_VALIDATION", None)
    command = ["npx", "--no", "cdk", "synth", "--quiet", "--no-notices", "-o", str(tmp_path / "out")]
    result = subprocess.run(command, cwd=repo, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode != 0, result.stdout + result.stderr
    assert UNCHECKED in result.stderr and "Synthesis finished with errors" in result.stderr


def test_app_synth_runs_the_worker_not_aws_cdk_libs_copy(tmp_path: Path, repo: Path) -> None:
    """``python3 -O app.py``, as cdk.json runs it: the shipped teams pass, and aws-cdk-lib's own validator never
    ran (its counter, CloudFormationValidate.validate, is missing from aws-cdk-lib's performance counters, which
    list the validation plugins' run, validateTemplates)."""
    counters = tmp_path / "counters.json"
    env = dict(
        os.environ,
        CDK_OUTDIR=str(tmp_path / "out"),
        CDK_PERF_COUNTERS_FILE=str(counters),
        CDK_CONTEXT_JSON=json.dumps({SLOW_SYNTH_THRESHOLD: 0}),  # counters written on every synth
    )
    env.pop("CDK_VALIDATION", None)
    done = subprocess.run(
        [sys.executable, "-O", "app.py"], cwd=repo, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    found = json.loads(counters.read_text())["counters"]
    assert "validateTemplates" in found
    assert "CloudFormationValidate.validate" not in found
    assert json.loads((tmp_path / "out" / "validation-report.json").read_text())["pluginReports"] == []


def test_validation_off_starts_no_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    """``CDK_VALIDATION=false`` (what ``cdk synth --no-validation`` sets) turns the worker off, as it turns off
    aws-cdk-lib's validator."""
    monkeypatch.setenv("CDK_VALIDATION", "false")
    assert start_cfn_validate() is None


def test_without_the_engine_copy_or_node_no_worker_starts(tmp_path: Path) -> None:
    """A venv without the copy (made by hand), or no such node: no worker, so app.py keeps aws-cdk-lib's own
    validator on (and the jsii kernel, which needs node too, says what is missing)."""
    assert cfn_validate.start_engine(directory=tmp_path) is None
    assert cfn_validate.start_engine(node=str(tmp_path / "no-node")) is None


def stacks(*templates: Path) -> SimpleNamespace:
    """A validation context as the plugins read it: each stack's construct path, template, account and region."""
    found = [
        SimpleNamespace(stack_construct_path=t.stem, template_path=str(t), account_id=None, region=None)
        for t in templates
    ]
    return SimpleNamespace(stack_templates=found)


def test_the_collector_answers_for_its_own_templates(tmp_path: Path) -> None:
    """Without a sender before it the collector asks itself; after a sender that handed over other templates, it
    reads that answer and asks again for its own (never reporting another set's findings)."""
    broken, clean = tmp_path / "Broken.template.json", tmp_path / "Clean.template.json"
    broken.write_text(json.dumps({"Resources": {"Disk": {"Type": "AWS::EC2::Volume", "Properties": {"Size": 1}}}}))
    clean.write_text(json.dumps({"Resources": {"Topic": {"Type": "AWS::SNS::Topic"}}}))
    engine = cfn_validate.start_engine()
    assert engine is not None
    worker = CloudFormationValidateWorker(engine)
    try:
        alone = worker.validate(stacks(broken))
        assert not alone.success
        assert [v.rule_name for v in alone.violations] == ["F3017"]
        assert worker.version  # the engine's, once it answered
        worker.sender.validate(stacks(broken))
        after_other = worker.validate(stacks(clean))
        assert after_other.success
        assert list(after_other.violations) == []
    finally:
        worker.close()
    assert engine.wait(timeout=60) == 0  # it ends when its input closes


def test_extract_copies_the_engine_and_rules_once(tmp_path: Path) -> None:
    target = cfn_validate.extract(tmp_path / "engine")
    assert (target / "cloudformation-validate" / "bindings_wasm_bg.wasm").is_file()
    assert sorted(p.name for p in (target / "rules").iterdir()) == ["gamelift-fleet.rego"]
    marker = (target / cfn_validate.COMPLETE).stat().st_mtime_ns
    assert cfn_validate.extract(target) == target
    assert (target / cfn_validate.COMPLETE).stat().st_mtime_ns == marker  # not copied again
