"""Write the generated reference pages: ``python -m docs_gen`` (``--check`` only reports stale ones)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Callable

from docs_gen import rules, team_file, trainctl_ref

REFERENCE = Path(__file__).resolve().parent.parent / "docs" / "reference"
PAGES: dict[str, Callable[[], str]] = {
    "team-file.md": team_file.render,
    "trainctl.md": trainctl_ref.render,
    "spot-training-rules.md": rules.render,
}


def stale_pages() -> list[str]:
    """Generated pages whose file differs from what the code generates now."""
    return [name for name, render in PAGES.items() if not (REFERENCE / name).is_file()
            or (REFERENCE / name).read_text() != render()]  # fmt: skip


def main(argv: list[str]) -> int:
    if "--check" in argv:
        stale = stale_pages()
        for name in stale:
            print(f"docs/reference/{name} is stale: run .venv/bin/python -m docs_gen")
        return 1 if stale else 0
    REFERENCE.mkdir(parents=True, exist_ok=True)
    for name, render in PAGES.items():
        (REFERENCE / name).write_text(render())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
