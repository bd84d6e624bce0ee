"""How ``make test`` spreads the suite over pytest-xdist workers.

A test module that defines a module-scoped fixture (a deployed emulated cloud, a synthesized app, a moto server with
a prepared state), or imports one from another test module, is one unit of work: all its tests run on one worker,
so the fixture is built once. Every other test is a unit of its own and goes to whichever worker is free.

pytest-xdist's own ``--dist loadgroup`` does this from ``xdist_group`` marks by renaming each test's node id, which
pytest 9.2's structured node ids no longer allow; so the grouping is a scheduler of its own (``GroupedScheduling``,
installed by ``tests/conftest.py``), decided from the test files' source, which both the controller and the workers
can read before anything is collected.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from xdist.scheduler import LoadScopeScheduling

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
# The grouped modules that take longest (``make test``'s --durations), started first: the run ends when its longest
# unit does, so each of them should have a worker from the start. Only the order depends on this list.
LONGEST_FIRST = (
    "tests/emulator/test_e2e.py",
    "tests/emulator/test_matrix_notices.py",
    "tests/emulator/test_matrix_restores.py",
    "tests/emulator/test_matrix_hard.py",
    "tests/emulator/test_drills.py",
    "tests/emulator/test_queue.py",
    "tests/emulator/test_capacity.py",
    "tests/emulator/test_job_parts.py",
    "tests/emulator/test_iam_job.py",
    "tests/bootstrap/test_node_agent.py",
    "tests/emulator/test_isolation.py",
    "tests/emulator/test_e2e_teams.py",
)


def _module_fixtures(tree: ast.Module) -> set[str]:
    """Names of the fixtures a module defines with ``@pytest.fixture(scope="module")``."""
    found: set[str] = set()
    for node in tree.body:
        if not isinstance(node, ast.FunctionDef):
            continue
        for decorator in node.decorator_list:
            if isinstance(decorator, ast.Call) and any(
                k.arg == "scope" and isinstance(k.value, ast.Constant) and k.value.value == "module"
                for k in decorator.keywords
            ):
                found.add(node.name)
    return found


def _imported_from_tests(path: Path, tree: ast.Module) -> list[tuple[Path, str]]:
    """(module file, name) of every name the module imports from another test module."""
    found = []
    for node in tree.body:
        if not isinstance(node, ast.ImportFrom) or node.module is None:
            continue
        if node.level:  # from .test_x import y
            source = path.parent / (node.module.replace(".", "/") + ".py")
        elif node.module.startswith("tests."):
            source = ROOT / (node.module.replace(".", "/") + ".py")
        else:
            continue
        found += [(source, alias.name) for alias in node.names]
    return found


@functools.cache
def grouped_modules() -> frozenset[str]:
    """Paths (relative to the repository, as in node ids) of the test modules that run whole on one worker."""
    trees = {path: ast.parse(path.read_text(), str(path)) for path in TESTS.rglob("*.py")}
    fixtures = {path: _module_fixtures(tree) for path, tree in trees.items()}
    grouped = set()
    for path, tree in trees.items():
        if not path.name.startswith("test_"):
            continue
        imported = _imported_from_tests(path, tree)
        if fixtures[path] or any(name in fixtures.get(source, set()) for source, name in imported):
            grouped.add(path.relative_to(ROOT).as_posix())
    return frozenset(grouped)


def run_order(nodeid: str) -> tuple[int, int]:
    """Sort key of a test: the longest grouped modules first (in ``LONGEST_FIRST``'s order), then the other grouped
    modules, then the single tests; a stable sort keeps pytest's order within each."""
    module = nodeid.split("::", 1)[0]
    if module in LONGEST_FIRST:
        return 0, LONGEST_FIRST.index(module)
    return (1 if module in grouped_modules() else 2), 0


# Modules whose fixtures start real nodes (user data, agent, torchrun) without the make_nodes fixture
NODE_MODULES = ("tests/bootstrap/test_node_agent.py", "tests/bootstrap/test_node_rendezvous.py")

# Modules that run training processes (PyTorch process groups, the example trainer, torchrun's launcher) or wait out
# the stall watchdog's timeouts against running trainers: seconds of CPU or of waiting per test, not unit tests
TRAINER_MODULES = (
    "tests/bootstrap/test_agent_stall.py",
    "tests/bootstrap/test_checkpointer.py",
    "tests/bootstrap/test_launch.py",
    "tests/test_example.py",
)


# Single tests that run a whole toolchain end to end (the CDK CLI with its validation worker, `make review` on a
# clone, checkov) or eight racing node processes: 6-33 s each in `make quick`'s --durations, where the other tests of
# their modules take a second or less
TOOLCHAIN_TESTS = (
    "tests/test_cfn_validate.py::test_worker_reports_what_aws_cdk_lib_reports",
    "tests/test_cfn_validate.py::test_npx_cdk_synth_fails_when_the_worker_dies",
    "tests/test_cfn_validate.py::test_app_synth_runs_the_worker_not_aws_cdk_libs_copy",
    "tests/test_review_gates.py::test_the_review_of_two_commits_names_the_change_and_passes_the_gates",
    "tests/test_review_gates.py::test_a_head_that_fails_synth_fails_the_review_with_its_lines",
    "tests/test_review_gates.py::test_the_review_gates_report_cfn_lint_and_checkov_findings_one_line_each",
    "tests/test_warm_volume.py::test_eight_nodes_racing_for_eight_volumes_never_share_one",
)


def is_slow(nodeid: str, fixtures: Sequence[str]) -> bool:
    """Whether a test starts the emulated cloud, real nodes, training processes or a whole toolchain: marked
    ``slow``, which ``make quick`` leaves out."""
    module = nodeid.split("::", 1)[0]
    return (
        module.startswith("tests/emulator/")
        or module in NODE_MODULES
        or module in TRAINER_MODULES
        or nodeid.split("[", 1)[0] in TOOLCHAIN_TESTS
        or "make_nodes" in fixtures
    )


def unit_of(nodeid: str) -> str:
    """The unit of work a test belongs to: its module when the module is grouped, else the test itself."""
    module = nodeid.split("::", 1)[0]
    return module if module in grouped_modules() else nodeid


class GroupedScheduling(LoadScopeScheduling):
    """pytest-xdist's scope scheduling with ``unit_of`` as the scope: units go out in collection order (the
    conftest puts the grouped modules first), one or two at a time to each worker as it becomes free."""

    def _split_scope(self, nodeid: str) -> str:
        return unit_of(nodeid)


def make_scheduler(config: Any, log: Any) -> GroupedScheduling:
    return GroupedScheduling(config, log)
