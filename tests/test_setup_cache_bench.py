"""benchmarks/setup_cache.py's report, and ``make bench --only setup-cache`` replacing only its own section of
RESULTS.md (the measurement itself runs in ``make bench``, never in the tests)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from benchmarks import bench, setup_cache
from benchmarks.setup_cache import SETUP_CACHE_HEADING, section


def test_the_section_reports_the_median_ratio_of_the_repetitions_and_their_range() -> None:
    text = "\n".join(section([(4.0, 8.0), (6.0, 6.0), (3.0, 10.0)]))  # ratios 0.50, 1.00, 0.30
    assert text.startswith(SETUP_CACHE_HEADING)
    assert "3 alternated repetitions" in text
    assert "| 4.00 s | 8.00 s | 0.50 | 0.30-1.00 |" in text


def test_only_setup_cache_replaces_its_own_section(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    results = tmp_path / "RESULTS.md"
    results.write_text(
        f"# Benchmark results\n\n| a |\n\n{SETUP_CACHE_HEADING}\n\nan older figure\n\n## Control plane\n\nc\n"
    )
    monkeypatch.setattr(bench, "RESULTS", results)

    def measured(work: Any, reps: int) -> list[str]:
        return section([(1.0, 2.0)] * reps)

    monkeypatch.setattr(bench, "bench_setup_cache", measured)
    assert bench.main(["--only", "setup-cache", "--reps", "2"]) == 0
    text = results.read_text()
    assert text.startswith("# Benchmark results\n\n| a |\n\n" + SETUP_CACHE_HEADING)
    assert "an older figure" not in text and "| 1.00 s | 2.00 s | 0.50 | 0.50-0.50 |" in text
    assert text.endswith("## Control plane\n\nc\n")
    assert setup_cache.FIRST_STEP in setup_cache.TRAIN  # the trainer prints the line the boot is timed to
