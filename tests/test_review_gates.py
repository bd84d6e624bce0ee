"""The review gates and the pull-request review: cfn-lint's allowed warnings, the review script end to end on two
commits of a clone, `make review`'s missing BASE, and actionlint on the workflow that runs it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from review_gates import GateError, cfn_lint, pull_request

ROLE: dict[str, Any] = {
    "Type": "AWS::IAM::Role",
    "Properties": {
        "AssumeRolePolicyDocument": {
            "Version": "2012-10-17",
            "Statement": [
                {"Effect": "Allow", "Principal": {"Service": "lambda.amazonaws.com"}, "Action": "sts:AssumeRole"}
            ],
        }
    },
}
# A function whose DependsOn repeats its role's GetAtt: cfn-lint W3005.
FUNCTION: dict[str, Any] = {
    "Type": "AWS::Lambda::Function",
    "DependsOn": ["Role"],
    "Properties": {
        "Role": {"Fn::GetAtt": ["Role", "Arn"]},
        "Handler": "index.handler",
        "Runtime": "python3.12",
        "Code": {"ZipFile": "def handler(event, context):\n    return None\n"},
    },
}
REASON = "a reason a reviewer can check, in a sentence long enough"


def write_template(path: Path, resources: dict[str, Any]) -> Path:
    path.write_text(json.dumps({"Resources": resources}, indent=1))
    return path


def test_a_cfn_lint_warning_fails_unless_allowed_and_its_line_names_template_rule_resource_and_file(
    tmp_path: Path,
) -> None:
    template = write_template(tmp_path / "Redundant.template.json", {"Role": ROLE, "Guard": FUNCTION})
    findings = cfn_lint.lint([template])
    [failing] = cfn_lint.not_allowed(findings, {})
    assert (failing.template, failing.rule, failing.resource) == ("Redundant.template.json", "W3005", "resource Guard")
    assert failing.describe().startswith("Redundant.template.json: cfn-lint W3005 on resource Guard: ")
    fix = "; fix it in the construct, or list W3005 with a reason in cfn-lint-allowed.yaml"
    assert failing.describe().endswith(fix)
    assert cfn_lint.not_allowed(findings, {"W3005": REASON}) == []


def test_a_cfn_lint_error_fails_whatever_the_allowed_file_says(tmp_path: Path) -> None:
    broken = {**FUNCTION, "DependsOn": ["Missing"]}
    template = write_template(tmp_path / "Broken.template.json", {"Role": ROLE, "Guard": broken})
    failing = cfn_lint.not_allowed(cfn_lint.lint([template]), {"W3005": REASON})
    assert [(f.rule, f.resource) for f in failing] == [("E3005", "resource Guard")]
    assert failing[0].describe().endswith("; fix it in the construct")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("E3005: " + REASON, "'E3005': only cfn-lint warnings (W and 4 digits) may be listed, errors never"),
        ("W3005: fine", "W3005: give the reason the warning is fine here, in a sentence (40+ characters)"),
        ("- W3005", "must map cfn-lint warning ids to reasons, e.g. `W3010: <why it is fine>`"),
        ("W3005: [", "not valid YAML (while parsing a flow node)"),
    ],
)
def test_a_wrong_allowed_file_is_one_line_naming_it_and_the_fix(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "cfn-lint-allowed.yaml"
    path.write_text(text + "\n")
    with pytest.raises(GateError) as error:
        cfn_lint.load_allowed(path)
    assert str(error.value) == f"{path}: {message}"


def test_the_shipped_allowed_file_gives_each_warning_a_reason() -> None:
    allowed = cfn_lint.load_allowed()
    assert allowed and all(len(reason) >= cfn_lint.MIN_REASON for reason in allowed.values())
    assert "W3005" not in allowed  # training_constructs/team_budget.py gives cfn-lint no W3005 to allow


def test_the_review_gates_report_cfn_lint_and_checkov_findings_one_line_each(tmp_path: Path) -> None:
    bucket = {"Type": "AWS::S3::Bucket", "Properties": {}}  # no versioning: checkov CKV_AWS_21
    template = write_template(tmp_path / "Bad.template.json", {"Role": ROLE, "Guard": FUNCTION, "Bucket": bucket})
    lines = pull_request.gate_findings([template])
    assert any(line.startswith("Bad.template.json: cfn-lint W3005 on resource Guard: ") for line in lines), lines
    assert any(line.startswith("checkov Bad.template.json: CKV_AWS_21 AWS::S3::Bucket.Bucket") for line in lines)


def git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), *args], check=True, capture_output=True, text=True, timeout=60
    ).stdout.strip()


@pytest.fixture(scope="module")
def clone(tmp_path_factory: pytest.TempPathFactory, repo: Path) -> Path:
    """This repository's HEAD, cloned, with one more commit: the research team's dev cluster grows to 3 nodes."""
    path = tmp_path_factory.mktemp("repo") / "clone"
    subprocess.run(["git", "clone", "--quiet", "--no-hardlinks", str(repo), str(path)], check=True, timeout=120)
    team = path / "teams" / "research.yaml"
    text = team.read_text()
    assert text.count("    max_nodes: 2\n") == 1  # the dev cluster's
    team.write_text(text.replace("    max_nodes: 2\n", "    max_nodes: 3\n"))
    git(path, "-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "--quiet", "-am", "dev: 3 nodes")
    return path


def test_the_review_of_two_commits_names_the_change_and_passes_the_gates(
    clone: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = pull_request.main(["--base", "HEAD~1", "--repo", str(clone), "--out", str(clone.parent / "review.md")])
    out = capsys.readouterr().out
    assert code == 0, out
    assert out.startswith(pull_request.MARKER + "\n## Spot training: what this change deploys\n")
    [dev] = [line for line in out.splitlines() if line.startswith("| research | dev |")]
    assert "| 2 -> 3 |" in dev
    assert "cfn-lint (less cfn-lint-allowed.yaml), checkov: no findings." in out
    assert (clone.parent / "review.md").read_text() == out
    assert git(clone, "worktree", "list").count("\n") == 0  # the base's worktree is gone


def test_a_head_that_fails_synth_fails_the_review_with_its_lines(
    clone: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An uncommitted change of the working tree is the head: a team file synth refuses fails the check (exit 1),
    and the Markdown carries synth's own line."""
    team = clone / "teams" / "research.yaml"
    text = team.read_text()
    team.write_text(text.replace("    max_nodes: 3\n", "    max_nodes: 0\n"))
    try:
        code = pull_request.main(["--base", "HEAD", "--repo", str(clone)])
    finally:
        team.write_text(text)
    out = capsys.readouterr().out
    assert code == 1, out
    assert "- head synth failed (exit 2): cdk-nag, SpotTraining or the app, last lines:" in out
    assert f"error: {team}:" in out and "max_nodes" in out
    assert out.count(": 1 finding.") == 1


def test_an_unknown_base_is_one_line(clone: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert pull_request.main(["--base", "no-such-branch", "--repo", str(clone)]) == 2
    assert capsys.readouterr().err == (
        f"review: error: --base no-such-branch: no such commit in {clone}; fetch it first (a CI checkout needs "
        "fetch-depth: 0)\n"
    )


def test_make_review_without_base_is_one_line(repo: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "BASE"}
    result = subprocess.run(["make", "-s", "review"], cwd=repo, env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert result.stderr.strip().endswith(
        "make review needs BASE, the git ref to compare with: make review BASE=origin/main.  Stop."
    )


ACTIONLINT = Path(sys.executable).parent / "actionlint"


def test_actionlint_passes_on_the_review_workflow(repo: Path) -> None:
    result = subprocess.run(
        [str(ACTIONLINT), str(repo / ".github" / "workflows" / "review.yml")], capture_output=True, text=True
    )
    assert (result.returncode, result.stdout) == (0, "")


def test_actionlint_fails_on_a_broken_workflow(tmp_path: Path, repo: Path) -> None:
    """Not vacuous: the same workflow with an unknown context in a step fails."""
    text = (repo / ".github" / "workflows" / "review.yml").read_text()
    broken = tmp_path / "review.yml"
    broken.write_text(text.replace("github.base_ref", "github.no_such_property", 1))
    assert text != broken.read_text()
    result = subprocess.run([str(ACTIONLINT), str(broken)], capture_output=True, text=True)
    assert result.returncode == 1 and "no_such_property" in result.stdout, result.stdout
