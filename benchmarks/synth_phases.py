"""Where the app's synth time goes, phase by phase (not part of ``make bench``; item 1 has the ratios).

    .venv/bin/python -m benchmarks.synth_phases [--teams 10] [--node-profile]

Runs ``app.py``'s steps in one process per setting (with and without aws-cdk-lib's built-in CloudFormation
validation, ``CDK_VALIDATION``), for N teams of two clusters each as in item 1, with the CLI's context and the
interpreter flags from ``cdk.json``, and prints the seconds of each phase, the jsii round trips of the
construction, and from aws-cdk-lib's own performance counters the time of the validation plugins (cdk-nag's
packs, and with validation on the built-in validator's engine start and its checks of the templates).
``--node-profile`` also runs the jsii kernel (the node process that does aws-cdk-lib's work) under V8's CPU
profiler and prints where its time went.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from types import FrameType
from typing import Any, Optional

from benchmarks.bench import REPO, app_interpreter, write_teams

SLOW_SYNTH_THRESHOLD = "@aws-cdk/core.slowSynthThreshold"


def phases(teams_dir: Path) -> dict[str, Any]:
    """This process: imports, team files, construction, synthesis (validation and cdk-nag included)."""
    started = time.perf_counter()
    from aws_cdk import App
    from jsii import _runtime
    from jsii._kernel.providers import process

    import app as app_module
    from team_config import load_teams

    calls = [0]
    by_line: dict[str, int] = defaultdict(int)  # round trips by the line of our code that caused them
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
    by_class: dict[str, float] = defaultdict(
        float
    )  # seconds spent creating each aws-cdk-lib class (nested creations included)
    create = _runtime.JSIIMeta.__call__

    def timed(cls: type, *args: object, **kwargs: object) -> object:
        t = time.perf_counter()
        try:
            return create(cls, *args, **kwargs)
        finally:
            if cls.__module__.startswith("aws_cdk"):
                by_class[f"{cls.__module__}.{cls.__name__}"] += time.perf_counter() - t

    _runtime.JSIIMeta.__call__ = timed  # type: ignore[method-assign,assignment]
    imported = time.perf_counter()
    app = App()
    teams = load_teams(teams_dir)
    loaded = time.perf_counter()
    before = calls[0]
    by_line.clear()
    app_module.add_teams(app, teams)
    built = time.perf_counter()
    round_trips = calls[0] - before
    construction_lines = sorted(by_line.items(), key=lambda kv: -kv[1])[:5]
    app.synth()
    done = time.perf_counter()
    slowest = sorted(by_class.items(), key=lambda kv: -kv[1])
    # aws-cdk-lib's own counters (milliseconds): "validateTemplates" is every validation plugin, engine start
    # included; "CloudFormationValidate.validate" is the built-in validator checking the templates.
    counters = json.loads(Path(os.environ["CDK_PERF_COUNTERS_FILE"]).read_text())["counters"]
    return {
        "imports": imported - started,
        "team files": loaded - imported,
        "construction": built - loaded,
        "synthesis": done - built,
        "total": done - started,
        "validation plugins": counters.get("validateTemplates", 0) / 1000,
        "built-in validator checking templates": counters.get("CloudFormationValidate.validate", 0) / 1000,
        "jsii round trips in construction": round_trips,
        "slowest aws-cdk-lib classes": ", ".join(f"{k} {v:.2f} s" for k, v in slowest[:4]),
        "lines with the most round trips": ", ".join(f"{k} {v}" for k, v in construction_lines),
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


def node_phases(profile: Path) -> list[tuple[str, float]]:
    """Seconds per NODE_PHASES entry (a function's samples counted once per stack) and the profile's total."""
    data = json.loads(profile.read_text())
    nodes = {n["id"]: n for n in data["nodes"]}
    parent = {child: n["id"] for n in data["nodes"] for child in n.get("children", [])}
    spent: dict[int, float] = defaultdict(float)
    for sample, delta in zip(data["samples"], data["timeDeltas"], strict=True):
        spent[sample] += delta / 1e6
    totals: dict[str, float] = defaultdict(float)
    for node_id, seconds in spent.items():
        found: set[str] = set()
        at: Optional[int] = node_id
        while at is not None:
            frame = nodes[at]["callFrame"]
            for label, function, filename in NODE_PHASES:
                if frame["functionName"] == function and frame["url"].endswith(filename):
                    found.add(label)
            at = parent.get(at)
        for label in found:
            totals[label] += seconds
    return [("total", sum(spent.values())), *((label, totals[label]) for label, _, _ in NODE_PHASES)]


def is_ours(filename: str) -> bool:
    """A file of this repository's app (not the venv's packages, not this module)."""
    path = Path(filename)
    return path.is_relative_to(REPO) and not path.is_relative_to(REPO / ".venv") and path.name != "synth_phases.py"


def main() -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--teams", type=int, default=10)
    p.add_argument("--node-profile", action="store_true", help="profile the jsii kernel (validation on) with V8")
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(phases(Path(args.child))))
        return 0
    # A threshold of 0 ms per stack makes aws-cdk-lib write its performance counters on every synth.
    context = {**json.loads((REPO / "cdk.json").read_text()).get("context", {}), SLOW_SYNTH_THRESHOLD: 0}
    flags = app_interpreter()[1:]  # the interpreter flags cdk.json runs the app with ("-O")
    with tempfile.TemporaryDirectory(prefix="synth-phases-") as tmp:
        teams_dir = write_teams(Path(tmp) / "teams", args.teams)
        for validation in ("true", "false"):
            env = dict(
                os.environ,
                CDK_VALIDATION=validation,
                CDK_OUTDIR=str(Path(tmp) / f"out-{validation}"),
                CDK_PERF_COUNTERS_FILE=str(Path(tmp) / f"counters-{validation}.json"),
                CDK_CONTEXT_JSON=json.dumps(context),
                PYTHONPATH=str(REPO),
                JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION="20",
                JSII_SILENCE_WARNING_DEPRECATED_NODE_VERSION="1",
            )
            profiles = Path(tmp) / f"node-profile-{validation}"
            if args.node_profile and validation == "true":
                wrapper = Path(tmp) / "node-with-cpu-profile"  # the jsii runtime starts "$JSII_NODE <script>"
                wrapper.write_text(f'#!/bin/sh\nexec node --cpu-prof --cpu-prof-dir="{profiles}" "$@"\n')
                wrapper.chmod(0o755)
                env["JSII_NODE"] = str(wrapper)
            out = subprocess.run(  # noqa: S603 - our argv
                [sys.executable, *flags, "-m", "benchmarks.synth_phases", "--child", str(teams_dir)],
                cwd=REPO, env=env, capture_output=True, text=True, check=True, timeout=600,
            ).stdout  # fmt: skip
            result = json.loads(out.strip().splitlines()[-1])
            trips = result.pop("jsii round trips in construction")
            slowest = result.pop("slowest aws-cdk-lib classes")
            lines = result.pop("lines with the most round trips")
            line = ", ".join(f"{k} {v:.2f} s" for k, v in result.items())
            print(f"{args.teams} teams, CDK_VALIDATION={validation}: {line}; construction: {trips} jsii round trips")
            print(f"  slowest aws-cdk-lib classes to create (nested creations included): {slowest}")
            print(f"  lines of our code with the most round trips: {lines}")
            if profiles.is_dir():  # the kernel is the process with the largest profile (its launcher is tiny)
                kernel = max(profiles.glob("*.cpuprofile"), key=lambda f: f.stat().st_size)
                spent = ", ".join(f"{label} {seconds:.2f} s" for label, seconds in node_phases(kernel))
                print(f"  jsii kernel (V8 CPU profile, inclusive times that overlap): {spent}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
