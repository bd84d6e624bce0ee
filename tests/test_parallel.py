"""tests/parallel.py: which tests ``make quick`` leaves out and how the suite is split over workers."""

from __future__ import annotations

import ast

import pytest

from tests import parallel


@pytest.mark.parametrize("module", [*parallel.LONGEST_FIRST, *parallel.NODE_MODULES, *parallel.TRAINER_MODULES])
def test_every_module_the_scheduling_names_exists(module: str) -> None:
    # A renamed module would drop out of these lists silently: into make quick, or to the end of the run
    assert (parallel.ROOT / module).is_file(), f"{module} is named in tests/parallel.py but does not exist"


@pytest.mark.parametrize("nodeid", parallel.TOOLCHAIN_TESTS)
def test_every_test_the_slow_list_names_exists(nodeid: str) -> None:
    # A renamed test would drop back into make quick silently
    module, name = nodeid.split("::")
    source = ast.parse((parallel.ROOT / module).read_text())
    tests = {node.name for node in source.body if isinstance(node, ast.FunctionDef)}
    assert name in tests, f"{nodeid} is named in tests/parallel.py but {module} has no such test"


@pytest.mark.parametrize(
    ("nodeid", "fixtures", "slow"),
    [
        ("tests/emulator/test_deploy.py::test_x", (), True),
        ("tests/bootstrap/test_node_agent.py::test_x", (), True),
        ("tests/bootstrap/test_checkpointer.py::test_x[rank 0]", (), True),
        ("tests/test_example.py::test_x", (), True),
        ("tests/test_warm_volume.py::test_x", ("make_nodes",), True),
        ("tests/test_config.py::test_x", ("tmp_path",), False),
        ("tests/bootstrap/test_agent_endings.py::test_x", (), False),
        ("tests/test_review_gates.py::test_the_review_of_two_commits_names_the_change_and_passes_the_gates", (), True),
        ("tests/test_cfn_validate.py::test_worker_reports_what_aws_cdk_lib_reports", (), True),
        ("tests/test_cfn_validate.py::test_the_collector_answers_for_its_own_templates", (), False),
        ("tests/test_warm_volume.py::test_eight_nodes_racing_for_eight_volumes_never_share_one[x]", (), True),
    ],
)
def test_slow_means_the_emulated_cloud_nodes_training_processes_or_a_toolchain(
    nodeid: str, fixtures: tuple, slow: bool
) -> None:
    assert parallel.is_slow(nodeid, fixtures) is slow


def test_a_module_with_a_module_scoped_fixture_is_one_unit_and_others_are_single_tests() -> None:
    grouped = "tests/test_constructs.py"  # defines module-scoped synthesized apps
    assert grouped in parallel.grouped_modules()
    assert parallel.unit_of(f"{grouped}::test_a") == parallel.unit_of(f"{grouped}::test_b") == grouped
    assert parallel.unit_of("tests/test_lint_config.py::test_a") == "tests/test_lint_config.py::test_a"
    assert parallel.run_order("tests/emulator/test_e2e.py::t") < parallel.run_order(f"{grouped}::t")
    assert parallel.run_order(f"{grouped}::t") < parallel.run_order("tests/test_lint_config.py::t")
