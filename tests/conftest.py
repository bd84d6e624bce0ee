"""Shared fixtures. jsii starts once per pytest process, so template tests share one runtime."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

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
