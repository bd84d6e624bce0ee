"""This process's environment as a user's after ``eval $(python -m emulator up)``: trainctl's clients reach the
emulator and nothing else."""

from __future__ import annotations

import os

import pytest

from emulator import EmulatedCloud


def use_emulator_exports(cloud: EmulatedCloud, patch: pytest.MonkeyPatch) -> dict[str, str]:
    """Every ``AWS_*`` variable removed, then the emulator's exports set (undone with ``patch``); returns them.

    Removing comes first: a variable another test module left (the node tests' session fixture sets fake
    credentials with a session token) would otherwise outlive the exports, and an IAM user's key with a stray
    session token is an invalid token under the emulator's IAM enforcement."""
    for key in [k for k in os.environ if k.startswith("AWS_")]:
        patch.delenv(key)
    exports = cloud.client_env({})
    for key, value in exports.items():
        patch.setenv(key, value)
    return exports
