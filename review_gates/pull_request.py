"""The pull-request review: synthesize the base (a temporary ``git worktree`` of it) and the working tree side by
side, run the gates on the head, and print ``trainctl review --base`` Markdown with the gates' findings.

``python -m review_gates --base REF [--out FILE]`` (``make review BASE=REF``, .github/workflows/review.yml).
Each synth runs the app as ``cdk synth`` does (cdk.json's ``app`` command, with this interpreter), so cdk-nag and
the SpotTraining checks run in it and a violation fails it. cfn-lint (``cfn-lint-allowed.yaml``) and checkov then
read the head's templates. Exit 0: no findings; 1: a gate found something (the Markdown says what); 2: bad input.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Optional

from review_gates import GateError, cfn_lint
from review_gates.checkov_scan import checks, describe, run_checkov

MARKER = "<!-- spot-training-review -->"  # the workflow finds its previous comment by it
SYNTH_TIMEOUT_S = 900
STDERR_LINES = 40  # of a failed synth, in the Markdown


class ReviewInputError(Exception):
    """A one-line reason the review cannot start (not a git checkout, unknown base ref)."""


def git(repo: Path, *args: str) -> str:
    # git from PATH, as the user runs it; the subcommands are fixed here
    command = ["git", "-C", str(repo), *args]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120)  # noqa: S603
    if result.returncode != 0:
        why = (result.stderr.strip().splitlines() or [f"exit {result.returncode}"])[-1]
        raise ReviewInputError(f"git {' '.join(args)} in {repo}: {why}")
    return result.stdout.strip()


def base_commit(repo: Path, ref: str) -> str:
    try:
        return git(repo, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}")
    except ReviewInputError:
        raise ReviewInputError(
            f"--base {ref}: no such commit in {repo}; fetch it first (a CI checkout needs fetch-depth: 0)"
        ) from None


def synth(checkout: Path, outdir: Path) -> subprocess.CompletedProcess[str]:
    """The app of ``checkout`` synthesized into ``outdir`` as ``cdk synth`` runs it (cdk.json's ``app``)."""
    command = shlex.split(json.loads((checkout / "cdk.json").read_text())["app"])
    if Path(command[0]).name.startswith("python"):
        command[0] = sys.executable  # this venv's interpreter: the toolchain the requirements pin
    env = {**os.environ, "CDK_OUTDIR": str(outdir)}
    return subprocess.run(  # noqa: S603 - the checkout's own cdk.json app, as `cdk synth` runs it
        command, cwd=checkout, env=env, capture_output=True, text=True, timeout=SYNTH_TIMEOUT_S
    )


def synth_both(repo: Path, commit: str, work: Path) -> tuple[subprocess.CompletedProcess[str], ...]:
    """The base (a detached worktree of ``commit``, removed after) and the head, synthesized at the same time."""
    worktree = work / "base"
    git(repo, "worktree", "add", "--detach", "--quiet", str(worktree), commit)
    try:
        with ThreadPoolExecutor(2) as pool:
            runs = [pool.submit(synth, worktree, work / "base.out"), pool.submit(synth, repo, work / "head.out")]
            return tuple(r.result() for r in runs)
    finally:
        git(repo, "worktree", "remove", "--force", str(worktree))


def failed_synth(side: str, run: subprocess.CompletedProcess[str]) -> str:
    tail = "\n".join(run.stderr.rstrip().splitlines()[-STDERR_LINES:])
    heading = f"- {side} synth failed (exit {run.returncode}): cdk-nag, SpotTraining or the app, last lines:"
    return f"{heading}\n\n```\n{tail}\n```"


def gate_findings(templates: Sequence[Path]) -> list[str]:
    """One line per finding of cfn-lint (less the allowed warnings) and checkov on ``templates``."""
    allowed = cfn_lint.load_allowed()
    lines = [f.describe() for f in cfn_lint.not_allowed(cfn_lint.lint(templates), allowed)]
    return lines + [f"checkov {describe(c)}" for c in checks(run_checkov(list(templates)), "failed_checks")]


def review_markdown(head_out: Path, base_out: Path) -> str:
    from trainctl import assembly, prices, review  # the same summary as `trainctl review --assembly ... --base ...`

    try:
        head, base = assembly.load_assembly(head_out), assembly.load_assembly(base_out)
        return review.summary(head, prices.load_prices(), None, base)
    except (prices.PriceError, assembly.ReviewError) as exc:
        raise GateError(str(exc)) from None


def review(repo: Path, ref: str) -> tuple[str, bool]:
    """The Markdown for the change from ``ref`` to ``repo``'s working tree, and whether the gates passed."""
    commit = base_commit(repo, ref)
    out = [MARKER]
    with tempfile.TemporaryDirectory(prefix="spot-training-review-") as tmp:
        work = Path(tmp)
        base_run, head_run = synth_both(repo, commit, work)
        findings: list[str] = []
        if head_run.returncode != 0:
            out.append("## Spot training: this change does not synthesize (see Gates)")
            findings.append(failed_synth("head", head_run))
        else:
            templates = sorted((work / "head.out").glob("*.template.json"))
            findings += [f"- {line}" for line in gate_findings(templates)]
        if base_run.returncode == 0 and head_run.returncode == 0:
            out.append(review_markdown(work / "head.out", work / "base.out").rstrip("\n"))
        elif base_run.returncode != 0:
            out.append(failed_synth(f"base ({ref} {commit[:12]})", base_run))
    gates = "cdk-nag and SpotTraining (in synth), cfn-lint (less cfn-lint-allowed.yaml), checkov"
    count = f"{len(findings)} finding{'' if len(findings) == 1 else 's'}." if findings else "no findings."
    out += ["", "### Gates", "", f"{gates}: {count}"]
    out += findings
    return "\n".join(out) + "\n", not findings


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m review_gates", description=__doc__.split("\n\n")[0])
    p.add_argument("--base", required=True, help="git ref to compare with (e.g. origin/main)")
    p.add_argument("--repo", type=Path, default=Path.cwd(), help="the checkout to review (default: here)")
    p.add_argument("--out", type=Path, help="also write the Markdown to this file (the workflow's comment)")
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parser().parse_args(argv)
    try:
        repo = Path(git(args.repo, "rev-parse", "--show-toplevel"))
        text, passed = review(repo, args.base)
    except (ReviewInputError, GateError) as exc:
        print(f"review: error: {exc}", file=sys.stderr)
        return 2
    print(text, end="")
    if args.out:
        args.out.write_text(text)
    return 0 if passed else 1
