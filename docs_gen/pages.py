"""The generated pages: where each one lives and what renders it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from docs_gen import job_file, node_lifecycle, rules, team_file, trainctl_ref

REFERENCE = Path(__file__).resolve().parent.parent / "docs" / "reference"
PAGES: dict[str, Callable[[], str]] = {
    "team-file.md": team_file.render,
    "job-file.md": job_file.render,
    "trainctl.md": trainctl_ref.render,
    "spot-training-rules.md": rules.render,
    "node-lifecycle.md": node_lifecycle.render,
}


def stale_pages() -> list[str]:
    """Generated pages whose file is missing or differs from what the code renders now."""
    return [name for name, render in PAGES.items()
            if not (REFERENCE / name).is_file() or (REFERENCE / name).read_text() != render()]  # fmt: skip


def write_pages() -> None:
    REFERENCE.mkdir(parents=True, exist_ok=True)
    for name, render in PAGES.items():
        (REFERENCE / name).write_text(render())
