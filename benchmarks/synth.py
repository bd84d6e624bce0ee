"""Item 1 of ``make bench``: ``npx cdk synth`` of our app next to a trivial one-bucket app, side by side.

The sides: 10 teams x 2 clusters vs a trivial CDK app with one bucket; 1 team vs 10 teams; the trivial app with 10
one-bucket stacks vs 1 (what the stacks cost by themselves), and with cdk-nag's AwsSolutions pack over them (the
floor of a stack per team and the gate); ours as cdk.json runs it (``python3 -O``) vs plain ``python3``; ours with
aws-cdk-lib's validator in the jsii kernel vs in a worker; and the CPU time of that worker with node's default V8
flags vs the app's.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

import cfn_validate
from benchmarks import REPO
from benchmarks.report import alternate, ratio
from emulator.deploy import JSII_QUIET

CDK = REPO / "node_modules" / ".bin" / "cdk"
TRIVIAL_APP = """
import sys
from aws_cdk import App, Stack
from aws_cdk import aws_s3 as s3
app = App(context={"aws:cdk:disable-creation-stack-traces": True})  # as app.py sets it
for i in range(int(sys.argv[1])):
    s3.Bucket(Stack(app, f"Trivial{i or ''}"), "Bucket")
if sys.argv[2:] == ["nag"]:  # the gate every synth of ours passes, over the same buckets
    from aws_cdk import Acknowledgment, Validations
    from cdk_nag import AwsSolutionsChecks
    for rule in ("S1", "S10"):  # a bare bucket logs nothing and allows plain HTTP; the app must still synthesize
        Validations.of(app).acknowledge(Acknowledgment(id=f"AwsSolutions-{rule}", reason="a benchmark's bucket"))
    Validations.of(app).add_plugins(AwsSolutionsChecks(app))
app.synth()
"""


def app_interpreter() -> list[str]:
    """cdk.json's app command without its script: the interpreter and the flags it runs app.py with."""
    *interpreter, script = json.loads((REPO / "cdk.json").read_text())["app"].split()
    if script != "app.py":
        raise SystemExit(f"cdk.json: app: the command should end in app.py, not {script!r}")
    return interpreter


def timed(cmd: list[str], cwd: Path, env: dict[str, str]) -> float:
    started = time.monotonic()
    out = subprocess.DEVNULL
    subprocess.run(cmd, cwd=cwd, env=env, check=True, stdout=out, stderr=out, timeout=600)  # noqa: S603 - our argv
    return time.monotonic() - started


def write_teams(directory: Path, count: int) -> Path:
    """``count`` team files in a new ``directory``, each the shipped default team with two clusters (main, dev)."""
    team = yaml.safe_load((REPO / "teams" / "default.yaml").read_text())
    team["clusters"] = [dict(team["clusters"][0], name=n) for n in ("main", "dev")]
    directory.mkdir()
    for i in range(count):
        (directory / f"{'default' if i == 0 else f'team{i}'}.yaml").write_text(yaml.safe_dump(team))
    return directory


def trivial_project(work: Path) -> tuple[Path, str]:
    """The trivial app's directory and the interpreter command cdk.json runs app.py with.

    Like for like: the trivial app runs with our cdk.json's context and interpreter flags (`python3 -O`) and, like
    app.py, without creation stack traces, so the ratio measures what our constructs cost, not settings the trivial
    app could use as well."""
    trivial = work / "trivial"
    trivial.mkdir()
    (trivial / "app.py").write_text(TRIVIAL_APP)
    (trivial / "cdk.json").write_text(json.dumps({"context": json.loads((REPO / "cdk.json").read_text())["context"]}))
    return trivial, " ".join(app_interpreter())


def synth_sides(work: Path) -> dict[str, Callable[[], float]]:
    """Each side of item 1 by name: a call that synthesizes it once and returns the seconds it took."""
    env = dict(os.environ, **JSII_QUIET, CDK_DISABLE_VERSION_CHECK="1")
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    dirs = {count: write_teams(work / f"teams-{count}", count) for count in (1, 10)}
    trivial, interpreter = trivial_project(work)
    # CDK_VALIDATION=false turns off aws-cdk-lib's built-in CloudFormation validation (a WASM rule engine that
    # every app, the trivial one too, loads at synth): the sides without it show what our constructs cost.
    quiet = dict(env, CDK_VALIDATION="false")

    def ours(count: int, env: dict[str, str] = env, app: tuple[str, ...] = ()) -> Callable[[], float]:
        args = [str(CDK), "synth", "--quiet", "--no-notices", "-c", f"teams_dir={dirs[count]}", *app]
        return lambda: timed([*args, "-o", str(work / f"out-{count}")], REPO, env)

    def trivial_app(env: dict[str, str] = env, stacks: int = 1, nag: bool = False) -> Callable[[], float]:
        app = f"{interpreter} app.py {stacks}{' nag' if nag else ''}"
        args = [str(CDK), "synth", "--quiet", "--no-notices", "-a", app]
        return lambda: timed([*args, "-o", f"out-{stacks}{'-nag' if nag else ''}"], trivial, env)

    return {
        "trivial": trivial_app(),
        "10 trivial stacks": trivial_app(stacks=10),
        # The floor the brief sets before any resource of ours: ten stacks (one per team) and cdk-nag on every synth.
        "10 trivial stacks, cdk-nag": trivial_app(stacks=10, nag=True),
        "1 team": ours(1),
        "10 teams": ours(10),
        "trivial, no validation": trivial_app(quiet),
        "10 teams, no validation": ours(10, quiet),
        # What cdk.json's `python3 -O` buys: the same app with jsii's Python-side type checks on.
        "10 teams, plain python3": ours(10, app=("-a", "python3 app.py")),
        # What cfn_validate/ buys: training_app.wiring.main() called from an import starts no worker, and its App keeps
        # aws-cdk-lib's own validator, in the jsii kernel.
        "10 teams, validator in the kernel": ours(
            10, app=("-a", f'{interpreter} -c "from training_app import wiring; wiring.main()"')
        ),
    }


def synth_row(t: dict[str, list[float]], label: str, a: str, b: str, goal: str = "-", notes: str = "") -> str:
    """A table row: side ``a``'s time over side ``b``'s, and both medians (then ``notes``)."""
    med_a, med_b = statistics.median(t[a]), statistics.median(t[b])
    return f"| {label} | {ratio(t[a], t[b])} | {goal} | medians {med_a:.1f} s / {med_b:.1f} s{notes} |"


def synth_rows(t: dict[str, list[float]]) -> list[str]:
    """Item 1's rows from the seconds of each side's runs."""
    med = {k: statistics.median(v) for k, v in t.items()}
    validation_costs = (
        f"; the validation costs {med['trivial'] - med['trivial, no validation']:.1f} s in the trivial app, "
        f"{med['10 teams'] - med['10 teams, no validation']:.1f} s in ours"
    )
    return [
        synth_row(t, "synth: 10 teams x 2 clusters / trivial app (1 bucket)", "10 teams", "trivial", "goal <= 1.5"),
        synth_row(t, "synth: 10 teams / 1 team", "10 teams", "1 team"),
        synth_row(
            t, "synth: 1 team / trivial app (how much of item 1's budget the first team spends)", "1 team", "trivial"
        ),
        synth_row(
            t,
            "synth: the trivial app with 10 one-bucket stacks / with 1 (what 10 stacks cost by themselves)",
            "10 trivial stacks",
            "trivial",
        ),
        synth_row(
            t,
            "synth: the trivial app with 10 one-bucket stacks and cdk-nag's AwsSolutions pack / the trivial app (the "
            "floor the brief sets before any resource of ours: a stack per team, cdk-nag on every synth)",
            "10 trivial stacks, cdk-nag",
            "trivial",
        ),
        synth_row(
            t,
            "synth: 10 teams / that floor (what our constructs, templates and SpotTraining pack add)",
            "10 teams",
            "10 trivial stacks, cdk-nag",
        ),
        synth_row(
            t,
            "synth without aws-cdk-lib's built-in CloudFormation validation (`CDK_VALIDATION=false`): 10 teams / "
            "trivial",
            "10 teams, no validation",
            "trivial, no validation",
            notes=validation_costs,
        ),
        synth_row(
            t,
            "synth: 10 teams with aws-cdk-lib's CloudFormation validator in the jsii kernel (the app before "
            "`cfn_validate/`) / with its engine in a worker process (what cdk.json runs)",
            "10 teams, validator in the kernel",
            "10 teams",
        ),
        synth_row(
            t,
            "synth: 10 teams as cdk.json runs the app (`python3 -O`) / with plain `python3`",
            "10 teams",
            "10 teams, plain python3",
        ),
    ]


def worker_cpu(templates: list[Path], v8_flags: tuple[str, ...]) -> tuple[float, Any]:
    """CPU seconds (user + system) of a validator worker that starts and checks ``templates`` once, as a synth's,
    and its report."""
    process = cfn_validate.start_engine(v8_flags=v8_flags)
    if process is None or process.stdin is None or process.stdout is None:
        raise SystemExit("the validator's engine is not in the venv: run `make run-deps`")
    stacks = [(t.name.removesuffix(".template.json"), str(t), None, None) for t in templates]
    process.stdin.write(cfn_validate.request(stacks) + "\n")
    process.stdin.flush()
    answer = json.loads(process.stdout.readline() or "{}")
    process.stdin.close()
    process.stdout.close()
    _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    if "report" not in answer or process.returncode != 0:
        raise SystemExit(f"the validator worker failed (exit {process.returncode}): {answer.get('error', answer)}")
    return usage.ru_utime + usage.ru_stime, answer["report"]


def validator_cpu(templates: list[Path], reps: int) -> dict[str, list[float]]:
    """CPU seconds of the validator worker checking ``templates`` with node's default V8 flags and with the app's,
    run alternately; both sides must give the same report."""
    reports: dict[str, Any] = {}

    def worker(side: str, v8_flags: tuple[str, ...]) -> Callable[[], float]:
        def run() -> float:
            seconds, reports[side] = worker_cpu(templates, v8_flags)
            return seconds

        return run

    cpu = alternate({"default": worker("default", ()), "flags": worker("flags", cfn_validate.V8_FLAGS)}, reps)
    if reports["default"] != reports["flags"]:
        raise SystemExit(f"the validator worker's report differs with {cfn_validate.V8_FLAGS}: {reports}")
    return cpu


def validator_row(templates: int, cpu: dict[str, list[float]]) -> str:
    cpu_med = {k: statistics.median(v) for k, v in cpu.items()}
    return (
        "| CPU time of the validator worker (`cfn_validate/`) starting and checking the 10 teams' "
        f"{templates} templates: node's default V8 flags / `{' '.join(cfn_validate.V8_FLAGS)}` (what the app "
        f"runs) | {ratio(cpu['default'], cpu['flags'])} | - | medians {cpu_med['default']:.1f} s / "
        f"{cpu_med['flags']:.1f} s of CPU (user + system), the same report on both sides; the worker shares the 2 "
        "cores with the app and the jsii kernel |"
    )


def bench_synth(work: Path, reps: int) -> list[str]:
    """Item 1's table rows."""
    t = alternate(synth_sides(work), reps)
    templates = sorted((work / "out-10").glob("*.template.json"))
    return [*synth_rows(t), validator_row(len(templates), validator_cpu(templates, reps))]
