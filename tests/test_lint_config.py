"""The lint configuration in pyproject.toml: mypy follows every aws-cdk-lib module the code imports.

mypy skips aws-cdk-lib's service modules except those listed (pyproject.toml says why); a module the code imports
but the list lacks would be Any to mypy, and its calls unchecked, without any message."""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PYPROJECT = REPO / "pyproject.toml"


def mypy_config() -> dict:
    return dict(tomllib.loads(PYPROJECT.read_text())["tool"]["mypy"])


def followed_cdk_modules() -> set[str]:
    return {
        module
        for override in mypy_config().get("overrides", [])
        if override.get("follow_imports") == "normal"
        for module in override["module"]
        if module == "aws_cdk" or module.startswith("aws_cdk.")
    }


def checked_sources() -> list[Path]:
    """The Python files mypy checks (pyproject.toml's ``files``)."""
    sources: list[Path] = []
    for entry in mypy_config()["files"]:
        path = REPO / entry
        sources.extend(sorted(path.rglob("*.py")) if path.is_dir() else [path])
    return sources


def imported_cdk_modules(source: str) -> set[str]:
    """aws_cdk and its submodules a module imports (``from aws_cdk import aws_ec2`` counts as aws_cdk.aws_ec2)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == "aws_cdk")
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "aws_cdk":
            found.add(node.module)
            if node.module == "aws_cdk":
                found.update(
                    f"aws_cdk.{a.name}" for a in node.names if a.name.startswith("aws_") or a.name == "assertions"
                )
    return found


def test_the_scan_finds_each_form_of_import() -> None:
    source = "import aws_cdk\nfrom aws_cdk import App, aws_s3 as s3, assertions\nfrom aws_cdk.aws_iam import Role\n"
    assert imported_cdk_modules(source) == {"aws_cdk", "aws_cdk.aws_s3", "aws_cdk.assertions", "aws_cdk.aws_iam"}


def test_mypy_follows_every_aws_cdk_module_the_code_imports() -> None:
    sources = checked_sources()
    assert len(sources) > 50, sources  # the scan sees the project, not an empty list
    imported = set().union(*(imported_cdk_modules(path.read_text()) for path in sources))
    assert "aws_cdk.aws_ec2" in imported
    missing = sorted(imported - followed_cdk_modules())
    assert not missing, f'pyproject.toml: add {missing} to the mypy override with follow_imports = "normal"'
