"""Shared fixtures. jsii starts once per pytest process, so template tests share one runtime."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from tests import parallel

os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")
os.environ.setdefault("JSII_SILENCE_WARNING_DEPRECATED_NODE_VERSION", "1")

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def repo() -> Path:
    return REPO


@pytest.fixture(scope="session")
def cdk_context() -> dict:
    """The feature flags from cdk.json, so in-process synths match `npx cdk synth`."""
    return json.loads((REPO / "cdk.json").read_text())["context"]


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """make test's spread over pytest-xdist workers (tests/parallel.py)."""
    return parallel.make_scheduler(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The modules that run whole on one worker first, the longest of them at the very start (tests/parallel.py):
    each is one long unit of work, and the single tests fill in around them."""
    items.sort(key=lambda item: parallel.run_order(item.nodeid))
    for item in items:  # `make quick` leaves these out
        if parallel.starts_nodes_or_cloud(item.nodeid, getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)
