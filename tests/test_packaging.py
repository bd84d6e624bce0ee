"""The trainctl package's metadata (pyproject.toml) against the dev venv's pins: the venv tests what the package asks.
``tests/emulator/test_pip_install.py`` installs the package itself."""

from __future__ import annotations

import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parent.parent


def pins(path: Path) -> dict[str, str]:
    """name -> version of every ``name==version`` line of a requirements file."""
    found: dict[str, str] = {}
    for line in path.read_text().splitlines():
        spec = line.split("#", 1)[0].strip()
        if "==" in spec:
            name, version = spec.split("==", 1)
            found[canonicalize_name(Requirement(name).name)] = version.strip()
    return found


def test_every_dependency_of_the_package_admits_the_version_requirements_txt_pins() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    pinned = pins(REPO / "requirements.txt")
    for dependency in map(Requirement, project["dependencies"]):
        name = canonicalize_name(dependency.name)
        assert name in pinned, f"pyproject.toml: {dependency.name} is not pinned in requirements.txt; pin it there"
        assert dependency.specifier.contains(pinned[name]), (
            f"pyproject.toml: {dependency} excludes {name}=={pinned[name]} (requirements.txt); widen the range"
        )
    assert project["scripts"] == {"trainctl": "trainctl.cli:main"}
