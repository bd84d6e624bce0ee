"""``make bench``'s benchmarks (``benchmarks/bench.py`` is the entry point) and the paths they share."""

from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BOOTSTRAP = REPO / "bootstrap_scripts"
