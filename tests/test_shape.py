"""The code's shape stays small: no source file outside tests/ over 400 lines, no function over 60 lines.

Cyclomatic complexity (at most 15) is ruff's C901 in ``make lint`` (pyproject.toml); ruff has no rule for lines, so
these two limits are measured here, from git's list of tracked files."""

from __future__ import annotations

import ast
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
MAX_FILE_LINES = 400
MAX_FUNCTION_LINES = 60
# Being split (issue 43); each entry goes when its file is
LONG_FILES: set[str] = set()
LONG_FUNCTION_FILES: set[str] = set()


def sources() -> list[str]:
    """Tracked Python files outside tests/."""
    listed = subprocess.run(
        ["git", "ls-files", "*.py"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.split()
    return sorted(path for path in listed if not path.startswith("tests/") and (REPO / path).is_file())


def long_functions(path: str, root: Path = REPO) -> list[str]:
    """``path:line name (N lines)`` of each function or method over the limit, decorators included."""
    tree = ast.parse((root / path).read_text(), filename=path)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            lines = (node.end_lineno or node.lineno) - first + 1
            if lines > MAX_FUNCTION_LINES:
                found.append(f"{path}:{node.lineno} {node.name} ({lines} lines)")
    return found


def test_no_source_file_is_over_400_lines() -> None:
    too_long = {path: n for path in sources() if (n := len((REPO / path).read_text().splitlines())) > MAX_FILE_LINES}
    assert set(too_long) <= LONG_FILES, f"over {MAX_FILE_LINES} lines (split by duty): " + ", ".join(
        f"{path} ({n})" for path, n in sorted(too_long.items()) if path not in LONG_FILES
    )
    assert set(too_long) == LONG_FILES, f"no longer over {MAX_FILE_LINES} lines: drop from LONG_FILES: " + ", ".join(
        sorted(LONG_FILES - set(too_long))
    )


def test_no_function_is_over_60_lines() -> None:
    found = [line for path in sources() if path not in LONG_FUNCTION_FILES for line in long_functions(path)]
    assert not found, f"functions over {MAX_FUNCTION_LINES} lines (split into small functions): " + "; ".join(found)
    listed = [path for path in sorted(LONG_FUNCTION_FILES) if not long_functions(path)]
    assert not listed, f"no function over {MAX_FUNCTION_LINES} lines: drop from LONG_FUNCTION_FILES: {listed}"


def test_the_measure_counts_a_long_function(tmp_path: Path) -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    (tmp_path / "probe.py").write_text(f"@staticmethod\ndef short():\n    pass\n\n\ndef long():\n{body}\n")
    assert long_functions("probe.py", tmp_path) == [f"probe.py:6 long ({MAX_FUNCTION_LINES + 1} lines)"]


# Entry points: {module: the folder whose code may import it}. A package imports another's library modules, never
# the file that starts it (a node's agent, the app, the trainctl command, the budget guard's Lambda handler).
ENTRY_POINTS = {
    "app": None,
    "node_agent": None,
    "trainctl.__main__": None,
    "budget_guard.handler": "budget_guard/",
}


def imported_modules(path: str) -> set[str]:
    """The modules ``path`` imports (``import a.b``: ``a.b``; ``from a import b``: ``a`` and ``a.b``)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse((REPO / path).read_text(), filename=path)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def imports_an_entry_point(path: str) -> list[str]:
    """The entry points (:data:`ENTRY_POINTS`) that ``path`` imports from outside their own folder."""
    found = []
    for module in sorted(imported_modules(path)):
        name = module.removeprefix("bootstrap_scripts.")  # node_agent, as the repository's root sees it
        if name in ENTRY_POINTS and not path.startswith(ENTRY_POINTS[name] or "\0"):
            found.append(f"{path} imports {module}")
    return found


def test_no_package_imports_another_packages_entry_point() -> None:
    assert imports_an_entry_point("tests/emulator/test_budget.py") == [  # the scan sees what tests import
        "tests/emulator/test_budget.py imports budget_guard.handler"
    ]
    assert [line for path in sources() for line in imports_an_entry_point(path)] == []
