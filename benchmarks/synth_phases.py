"""Where the app's synth time goes, phase by phase (not part of ``make bench``; item 1 has the ratios).

    .venv/bin/python -m benchmarks.synth_phases [--teams 10] [--trivial] [--node-profile] [--node PATH]

Runs ``app.py``'s steps in one process per setting (with and without aws-cdk-lib's built-in CloudFormation
validation, ``CDK_VALIDATION``), for N teams of two clusters each as in item 1, with the CLI's context and the
interpreter flags from ``cdk.json``, and prints the seconds of each phase, the jsii round trips of the
construction, and from aws-cdk-lib's own performance counters the time of the validation plugins (cdk-nag's
packs, and with validation on the built-in validator's engine start and its checks of the templates).
``--trivial`` also times item 1's trivial app (one bucket) the same way and prints ours minus trivial per phase:
what our constructs add to the floor every app pays. ``--node-profile`` also runs the jsii kernel (the node
process that does aws-cdk-lib's work) under V8's CPU profiler and prints where its time went, with the packages
whose modules took longest to load. ``--node`` runs the kernel on another Node.js binary (``JSII_NODE``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from types import FrameType
from typing import Any, Optional

from benchmarks import REPO
from benchmarks.synth import TRIVIAL_APP, app_interpreter, write_teams
from emulator.deploy import JSII_QUIET

SLOW_SYNTH_THRESHOLD = "@aws-cdk/core.slowSynthThreshold"
# what phases() reports besides seconds, printed on lines of their own
DETAILS = ("jsii round trips in construction", "slowest aws-cdk-lib classes", "lines with the most round trips")


def count_round_trips() -> tuple[list[int], dict[str, int]]:
    """Count the jsii kernel's round trips from now on: the total (one item) and by the line of our code that caused
    them."""
    from jsii._kernel.providers import process

    calls = [0]
    by_line: dict[str, int] = defaultdict(int)
    send = process._NodeProcess.send

    def counted(self: object, *args: object, **kwargs: object) -> object:
        calls[0] += 1
        frame: Optional[FrameType] = sys._getframe(1)
        while frame is not None and not is_ours(frame.f_code.co_filename):
            frame = frame.f_back
        if frame is not None:
            by_line[f"{Path(frame.f_code.co_filename).relative_to(REPO)}:{frame.f_lineno}"] += 1
        return send(self, *args, **kwargs)  # type: ignore[arg-type]

    process._NodeProcess.send = counted  # type: ignore[method-assign,assignment]
    return calls, by_line


def time_classes() -> dict[str, float]:
    """From now on, the seconds spent creating each aws-cdk-lib class (nested creations included)."""
    from jsii import _runtime

    by_class: dict[str, float] = defaultdict(float)
    create = _runtime.JSIIMeta.__call__

    def timed(cls: type, *args: object, **kwargs: object) -> object:
        t = time.perf_counter()
        try:
            return create(cls, *args, **kwargs)
        finally:
            if cls.__module__.startswith("aws_cdk"):
                by_class[f"{cls.__module__}.{cls.__name__}"] += time.perf_counter() - t

    _runtime.JSIIMeta.__call__ = timed  # type: ignore[method-assign,assignment]
    return by_class


def phases(teams_dir: Path) -> dict[str, Any]:
    """This process: imports, team files, construction, synthesis (validation and cdk-nag included)."""
    started = time.perf_counter()
    from aws_cdk import App

    from team_config import load_teams
    from training_app import wiring as app_module

    calls, by_line = count_round_trips()
    by_class = time_classes()
    imported = time.perf_counter()
    teams = load_teams(teams_dir)
    loaded = time.perf_counter()
    before = calls[0]
    by_line.clear()
    app = App()  # in the construction, as in trivial_phases
    app_module.add_teams(app, teams)
    built = time.perf_counter()
    round_trips = calls[0] - before
    construction_lines = sorted(by_line.items(), key=lambda kv: -kv[1])[:5]
    app.synth()
    done = time.perf_counter()
    slowest = sorted(by_class.items(), key=lambda kv: -kv[1])
    return {
        "imports": imported - started,
        "team files": loaded - imported,
        "construction": built - loaded,
        "synthesis": done - built,
        "total": done - started,
        **counters(),
        "jsii round trips in construction": round_trips,
        "slowest aws-cdk-lib classes": ", ".join(f"{k} {v:.2f} s" for k, v in slowest[:4]),
        "lines with the most round trips": ", ".join(f"{k} {v}" for k, v in construction_lines),
    }


def trivial_phases() -> dict[str, Any]:
    """This process: item 1's trivial app (its own text, one bucket) in the phases of :func:`phases`."""
    started = time.perf_counter()
    import aws_cdk
    from aws_cdk import aws_s3  # noqa: F401 - the trivial app's imports, timed here

    imported = time.perf_counter()
    synth = aws_cdk.App.synth
    synth_started: list[float] = []

    def timed_synth(self: aws_cdk.App, *args: Any, **kwargs: Any) -> Any:
        synth_started.append(time.perf_counter())
        return synth(self, *args, **kwargs)

    aws_cdk.App.synth = timed_synth  # type: ignore[method-assign]
    sys.argv = ["app.py", "1"]
    exec(compile(TRIVIAL_APP, "trivial-app.py", "exec"), {"__name__": "__main__"})  # noqa: S102 - our own text
    done = time.perf_counter()
    return {
        "imports": imported - started,
        "team files": 0.0,
        "construction": synth_started[0] - imported,
        "synthesis": done - synth_started[0],
        "total": done - started,
        **counters(),
    }


def counters() -> dict[str, float]:
    """aws-cdk-lib's own counters (milliseconds in the file): "validateTemplates" is every validation plugin, engine
    start included; "CloudFormationValidate.validate" is the built-in validator checking the templates."""
    found = json.loads(Path(os.environ["CDK_PERF_COUNTERS_FILE"]).read_text())["counters"]
    return {
        "validation plugins": found.get("validateTemplates", 0) / 1000,
        "built-in validator checking templates": found.get("CloudFormationValidate.validate", 0) / 1000,
    }


# Where the jsii kernel's time goes, from V8's CPU profile: (label, function, file the function is in). Inclusive
# times, so nested ones overlap (module loading happens inside construction and validation too).
NODE_PHASES = (
    ("waiting for Python (our code, jsii marshalling)", "read", ""),
    ("constructs created from Python", "create", "program.js"),
    ("synthesis", "synth", "app.js"),
    ("validation plugins", "validateTemplates", "synthesis-validation.js"),
    ("built-in validator engine start", "_singletonInstance", "cloudformation-validate-plugin.js"),
    ("built-in validator checking templates", "validate", "cloudformation-validate-plugin.js"),
    ("token resolution", "resolve", "resolve.js"),
    ("loading aws-cdk-lib modules", "Module._load", ""),
    ("garbage collection", "(garbage collector)", ""),
)


Stacks = list[tuple[list[dict[str, Any]], float]]  # sampled call stacks (frames innermost first), seconds in each


def stacks(profile: Path) -> Stacks:
    """Each sampled stack of a V8 CPU profile (call frames, innermost first) with the seconds spent in it."""
    data = json.loads(profile.read_text())
    nodes = {n["id"]: n for n in data["nodes"]}
    parent = {child: n["id"] for n in data["nodes"] for child in n.get("children", [])}
    spent: dict[int, float] = defaultdict(float)
    for sample, delta in zip(data["samples"], data["timeDeltas"], strict=True):
        spent[sample] += delta / 1e6
    out: Stacks = []
    for node_id, seconds in spent.items():
        frames: list[dict[str, Any]] = []
        at: Optional[int] = node_id
        while at is not None:
            frames.append(nodes[at]["callFrame"])
            at = parent.get(at)
        out.append((frames, seconds))
    return out


def node_phases(sampled: Stacks) -> list[tuple[str, float]]:
    """Seconds per NODE_PHASES entry (a function's samples counted once per stack) and the profile's total."""
    totals: dict[str, float] = defaultdict(float)
    for frames, seconds in sampled:
        found = {
            label
            for frame in frames
            for label, function, filename in NODE_PHASES
            if frame["functionName"] == function and frame["url"].endswith(filename)
        }
        for label in found:
            totals[label] += seconds
    return [("total", sum(s for _, s in sampled)), *((label, totals[label]) for label, _, _ in NODE_PHASES)]


PACKAGE = re.compile(r"node_modules/((?:@[^/]+/)?[^/]+)(?:/([^/]+))?")


def loading_by_package(sampled: Stacks, top: int = 5) -> list[tuple[str, float]]:
    """Module loading time by the package of the module being loaded (aws-cdk-lib by its submodule), largest first:
    a sample under ``Module._load`` counts for the innermost module body on its stack."""
    totals: dict[str, float] = defaultdict(float)
    for frames, seconds in sampled:
        if not any(f["functionName"] == "Module._load" for f in frames):
            continue
        url = next((f["url"] for f in frames if f["functionName"] == "" and f["url"].endswith(".js")), "")
        m = PACKAGE.search(url)
        if m is None:
            package = "the jsii kernel itself" if url.endswith("program.js") else "other"
        else:
            package = m.group(1) + (f"/{m.group(2)}" if m.group(1) == "aws-cdk-lib" and m.group(2) else "")
        totals[package] += seconds
    return sorted(totals.items(), key=lambda kv: -kv[1])[:top]


def is_ours(filename: str) -> bool:
    """A file of this repository's app (not the venv's packages, not this module)."""
    path = Path(filename)
    return path.is_relative_to(REPO) and not path.is_relative_to(REPO / ".venv") and path.name != "synth_phases.py"


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--teams", type=int, default=10)
    p.add_argument("--trivial", action="store_true", help="also time item 1's trivial app; print ours - trivial")
    p.add_argument("--node-profile", action="store_true", help="profile the jsii kernel (validation on) with V8")
    p.add_argument("--node", default="node", help="the Node.js binary the jsii kernel runs on (JSII_NODE)")
    p.add_argument("--child", help=argparse.SUPPRESS)
    return p.parse_args()


def profiling_node(node: str, work: Path, profiles: Path) -> str:
    """A script that runs ``node`` writing V8 CPU profiles into ``profiles`` (the jsii runtime starts
    "$JSII_NODE <script>")."""
    wrapper = work / "node-with-cpu-profile"
    wrapper.parent.mkdir(parents=True, exist_ok=True)
    wrapper.write_text(f'#!/bin/sh\nexec "{node}" --cpu-prof --cpu-prof-dir="{profiles}" "$@"\n')
    wrapper.chmod(0o755)
    return str(wrapper)


def print_profile(profiles: Path) -> None:
    """The jsii kernel's phases and module loading by package, from its V8 CPU profile."""
    # the kernel is the process with the largest profile (its launcher is tiny)
    kernel = stacks(max(profiles.glob("*.cpuprofile"), key=lambda f: f.stat().st_size))
    spent = ", ".join(f"{label} {seconds:.2f} s" for label, seconds in node_phases(kernel))
    print(f"  jsii kernel (V8 CPU profile, inclusive times that overlap): {spent}")
    loading = ", ".join(f"{package} {seconds:.2f} s" for package, seconds in loading_by_package(kernel))
    print(f"  jsii kernel, loading modules, by package: {loading}")


def run_child(child: str, work: Path, env: dict[str, str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """A child process's phases (``child``: a teams directory or "trivial") and their details."""
    flags = app_interpreter()[1:]  # the interpreter flags cdk.json runs the app with ("-O")
    out = subprocess.run(  # noqa: S603 - our argv
        [sys.executable, *flags, "-m", "benchmarks.synth_phases", "--child", child],
        cwd=REPO, env=env, capture_output=True, text=True, check=True, timeout=600,
    ).stdout  # fmt: skip
    result = json.loads(out.strip().splitlines()[-1])
    details = {k: result.pop(k) for k in DETAILS if k in result}
    return result, details


def measure(
    args: argparse.Namespace, node: str, version: str, validation: str, apps: dict[str, str], tmp: Path
) -> None:
    """Print each app's phases with ``CDK_VALIDATION=validation`` (and ours - trivial with ``--trivial``) on the
    Node.js binary ``node`` of ``version``."""
    # A threshold of 0 ms per stack makes aws-cdk-lib write its performance counters on every synth.
    context = {**json.loads((REPO / "cdk.json").read_text()).get("context", {}), SLOW_SYNTH_THRESHOLD: 0}
    results = {}
    for name, child in apps.items():
        work = tmp / f"{name.replace(' ', '-')}-{validation}"
        env = dict(
            os.environ,
            CDK_VALIDATION=validation,
            CDK_OUTDIR=str(work / "out"),
            CDK_PERF_COUNTERS_FILE=str(work / "counters.json"),
            CDK_CONTEXT_JSON=json.dumps(context),
            PYTHONPATH=str(REPO),
            JSII_NODE=node,
            **JSII_QUIET,
        )
        profiles = work / "node-profile"
        if args.node_profile and validation == "true":
            env["JSII_NODE"] = profiling_node(node, work, profiles)
        results[name], details = run_child(child, work, env)
        line = ", ".join(f"{k} {v:.2f} s" for k, v in results[name].items())
        print(f"{name}, CDK_VALIDATION={validation}, node {version}: {line}")
        for k, v in details.items():
            print(f"  {k}: {v}")
        if profiles.is_dir():
            print_profile(profiles)
    if args.trivial:
        ours, trivial = results[f"{args.teams} teams"], results["trivial app"]
        diff = ", ".join(f"{k} {ours[k] - trivial[k]:+.2f} s" for k in ours)
        print(f"  {args.teams} teams - trivial app, CDK_VALIDATION={validation}: {diff}")


def main() -> int:
    args = parse_args()
    if args.child:
        print(json.dumps(trivial_phases() if args.child == "trivial" else phases(Path(args.child))))
        return 0
    node = shutil.which(args.node)
    if node is None:
        raise SystemExit(f"synth_phases: --node: no Node.js binary {args.node!r}; give its path")
    version = subprocess.run(  # noqa: S603 - our argv
        [node, "--version"], capture_output=True, text=True, check=True
    ).stdout.strip()
    with tempfile.TemporaryDirectory(prefix="synth-phases-") as tmp:
        teams_dir = write_teams(Path(tmp) / "teams", args.teams)
        apps = {f"{args.teams} teams": str(teams_dir), **({"trivial app": "trivial"} if args.trivial else {})}
        for validation in ("true", "false"):
            measure(args, node, version, validation, apps, Path(tmp))
    return 0


if __name__ == "__main__":
    sys.exit(main())
