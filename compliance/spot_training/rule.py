"""A SpotTraining rule: a plain function of (logical id, resource, template) and the one-line message of its finding."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Optional

from compliance.spot_training.template import Resource, Template

# None: not applicable; []: compliant; otherwise the problems found (for the log, the message says the fix)
Check = Callable[[str, Resource, Template], Optional[list[str]]]


@dataclass(frozen=True)
class Rule:
    id: str
    types: tuple[str, ...]
    message: str  # one line: what is wrong and how to fix it
    why: str
    check: Check
    severity: str = "error"  # "warning": reported, the synth goes on
