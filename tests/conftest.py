"""Shared fixtures. jsii starts once per pytest process, so template tests share one runtime; botocore reads its
service models once per pytest process, so every boto3 session of the tests shares them."""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Optional

import botocore.loaders
import botocore.session
import pytest

from tests import parallel

os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")
os.environ.setdefault("JSII_SILENCE_WARNING_DEPRECATED_NODE_VERSION", "1")

REPO = Path(__file__).resolve().parent.parent


class _SearchPaths(list):
    """A loader's search paths, each once: boto3 appends its own data path for every session it makes."""

    def append(self, path: Any) -> None:
        if path not in self:
            super().append(path)


@functools.cache
def _shared_loader(search_paths: Optional[str] = None) -> botocore.loaders.Loader:
    """One botocore loader per search path setting for the whole process. Every new boto3 session (moto's mock_aws
    resets the default one; trainctl and the emulator make their own) otherwise parses botocore's service models
    again: the JSON of EC2's alone is about 1 MB, and a profile of test_trainctl_cli showed half its time there.
    The models are read-only files, so sharing what was read from them changes no answer."""
    loader = botocore.loaders.create_loader(search_paths)
    loader._search_paths = _SearchPaths(loader.search_paths)
    return loader


botocore.session.create_loader = _shared_loader


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
        if parallel.is_slow(item.nodeid, getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)


@pytest.fixture
def mocked_aws(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """moto in this process (``mock_aws``) for boto3 clients made with the default session, in us-east-1, with fake
    credentials and no endpoint from the environment (a developer's emulator exports one)."""
    from moto import mock_aws

    for key, value in {
        "AWS_ACCESS_KEY_ID": "x",
        "AWS_SECRET_ACCESS_KEY": "x",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    with mock_aws():
        yield
