"""synth_phases' reading of a V8 CPU profile: phase times and module loading by package, on a hand-made profile."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from benchmarks.synth_phases import loading_by_package, node_phases, stacks

KERNEL = "file:///tmp/jsii-runtime/lib/program.js"
NAG = "file:///tmp/jsii-kernel-x/node_modules/cdk-nag/lib/index.js"
GLUE = "file:///tmp/jsii-kernel-x/node_modules/aws-cdk-lib/aws-glue/lib/index.js"


def frame(function: str, url: str = "") -> dict[str, Any]:
    return {"functionName": function, "url": url}


@pytest.fixture
def profile(tmp_path: Path) -> Path:
    """(root) -> Module._load -> cdk-nag's body -> Module._load -> aws-glue's body: 0.3 s in glue, 0.2 s in nag's
    own body; (root) -> Module._load -> the kernel's own code: 0.1 s; (root) -> read (waiting for Python): 0.5 s."""
    nodes = [
        {"id": 1, "callFrame": frame("(root)"), "children": [2, 6, 7]},
        {"id": 2, "callFrame": frame("Module._load"), "children": [3]},
        {"id": 3, "callFrame": frame("", NAG), "children": [4]},
        {"id": 4, "callFrame": frame("Module._load"), "children": [5]},
        {"id": 5, "callFrame": frame("", GLUE)},
        {"id": 6, "callFrame": frame("read")},
        {"id": 7, "callFrame": frame("Module._load"), "children": [8]},
        {"id": 8, "callFrame": frame("", KERNEL)},
    ]
    samples = {5: 0.3, 3: 0.2, 8: 0.1, 6: 0.5}
    path = tmp_path / "kernel.cpuprofile"
    path.write_text(
        json.dumps(
            {
                "nodes": nodes,
                "samples": list(samples),
                "timeDeltas": [int(seconds * 1e6) for seconds in samples.values()],
            }
        )
    )
    return path


def test_module_loading_counts_for_the_innermost_module_being_loaded(profile: Path) -> None:
    got = dict(loading_by_package(stacks(profile)))
    assert got == pytest.approx({"aws-cdk-lib/aws-glue": 0.3, "cdk-nag": 0.2, "the jsii kernel itself": 0.1})
    assert [package for package, _ in loading_by_package(stacks(profile), top=1)] == ["aws-cdk-lib/aws-glue"]


def test_phases_count_a_sample_once_per_phase_on_its_stack(profile: Path) -> None:
    got = dict(node_phases(stacks(profile)))
    assert got["total"] == pytest.approx(1.1)
    assert got["loading aws-cdk-lib modules"] == pytest.approx(0.6)  # nested Module._load frames counted once
    assert got["waiting for Python (our code, jsii marshalling)"] == pytest.approx(0.5)
    assert got["built-in validator engine start"] == 0
