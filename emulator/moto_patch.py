"""The one way the emulator changes moto's behaviour (the compatibility layer, EBS, billing, lifecycle hooks, IAM):
replace a function on one of moto's classes and keep moto's own, for the replacement to call."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

_ORIGINALS: dict[tuple[type, str], Any] = {}


def patch(owner: type, name: str, replacement: Callable[..., Any]) -> None:
    """Make ``owner.<name>`` ``replacement``; moto's own (None where moto has none) stays available through
    :func:`original`. Idempotent: patching again keeps moto's original, never the replacement."""
    _ORIGINALS.setdefault((owner, name), getattr(owner, name, None))
    setattr(owner, name, replacement)


def original(owner: type, name: str) -> Any:
    """moto's ``owner.<name>`` as it was before :func:`patch` replaced it."""
    return _ORIGINALS[(owner, name)]
