"""cfn-lint over synthesized templates: every error fails, and every warning fails unless its rule id is listed,
with a reason, in ``cfn-lint-allowed.yaml`` (one file, so that an accepted warning shows up in review)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml

from review_gates import REPO, GateError

ALLOWED_FILE = REPO / "cfn-lint-allowed.yaml"
CFN_LINT = Path(sys.executable).parent / "cfn-lint"
CFN_LINT_TIMEOUT_S = 300
WARNING_RULE = re.compile(r"^W\d{4}$")
MIN_REASON = 40  # characters: a sentence a reviewer can check, not "ok"


@dataclass(frozen=True)
class Finding:
    template: str  # file name
    rule: str  # E3012, W3005, ...
    resource: str  # "resource <logical id>", or the template section cfn-lint points at
    message: str

    @property
    def is_warning(self) -> bool:
        return self.rule.startswith("W")

    def describe(self, allowed_file: Path = ALLOWED_FILE) -> str:
        fix = (
            f"; fix it in the construct, or list {self.rule} with a reason in {allowed_file.name}"
            if self.is_warning
            else "; fix it in the construct"
        )
        return f"{self.template}: cfn-lint {self.rule} on {self.resource}: {self.message}{fix}"


def load_allowed(path: Path = ALLOWED_FILE) -> dict[str, str]:
    """``{warning rule id: reason}`` from ``path``; a wrong entry is a one-line :class:`GateError`."""
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise GateError(f"{path}: cannot read it ({exc.strerror})") from None
    except yaml.YAMLError as exc:
        raise GateError(f"{path}: not valid YAML ({str(exc).splitlines()[0]})") from None
    if data is None:
        return {}
    if not isinstance(data, Mapping):
        raise GateError(f"{path}: must map cfn-lint warning ids to reasons, e.g. `W3010: <why it is fine>`")
    for rule, reason in data.items():
        if not isinstance(rule, str) or not WARNING_RULE.match(rule):
            raise GateError(f"{path}: {rule!r}: only cfn-lint warnings (W and 4 digits) may be listed, errors never")
        if not isinstance(reason, str) or len(reason.strip()) < MIN_REASON:
            raise GateError(
                f"{path}: {rule}: give the reason the warning is fine here, in a sentence ({MIN_REASON}+ characters)"
            )
    return dict(data)


def lint(templates: Sequence[Path]) -> list[Finding]:
    """Every error and warning cfn-lint reports on ``templates``."""
    if not CFN_LINT.exists():
        raise GateError(f"cfn-lint is not installed at {CFN_LINT}: run `make deps` (requirements-dev.txt)")
    result = subprocess.run(  # noqa: S603 - the venv's cfn-lint, on our templates
        [str(CFN_LINT), "--format", "json", *map(str, templates)],
        capture_output=True,
        text=True,
        timeout=CFN_LINT_TIMEOUT_S,
    )
    # Exit code bits: 2 errors, 4 warnings, 8 informational; 1 is cfn-lint itself failing.
    if result.returncode & 1 or not result.stdout.strip():
        raise GateError(f"cfn-lint failed (exit {result.returncode}): {result.stderr.strip()[-2000:]}")
    return [
        Finding(
            template=Path(match["Filename"]).name,
            rule=match["Rule"]["Id"],
            resource=_where(match["Location"]["Path"]),
            message=match["Message"],
        )
        for match in json.loads(result.stdout)
        if match["Level"] in ("Error", "Warning")
    ]


def _where(path: Sequence[object]) -> str:
    """The logical id of the resource cfn-lint points at, else the template section (Outputs/X, ...)."""
    if len(path) > 1 and path[0] == "Resources":
        return f"resource {path[1]}"
    return "/".join(str(p) for p in path) or "the template"


def not_allowed(findings: Sequence[Finding], allowed: Mapping[str, str]) -> list[Finding]:
    """The findings that fail the gate: every error, and each warning whose rule ``allowed`` does not list."""
    return [f for f in findings if not (f.is_warning and f.rule in allowed)]
