"""Write the generated reference pages: ``python -m docs_gen``; ``--check`` only names the stale ones."""

from __future__ import annotations

import sys

from docs_gen.pages import stale_pages, write_pages


def main(argv: list[str]) -> int:
    if "--check" not in argv:
        write_pages()
        return 0
    stale = stale_pages()
    for name in stale:
        print(f"docs/reference/{name} is stale: run .venv/bin/python -m docs_gen")
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
