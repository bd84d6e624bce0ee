"""How ``make bench`` measures and reports: sides run alternately, their ratios and spreads, and RESULTS.md."""

from __future__ import annotations

import itertools
import os
import platform
import statistics
import time
from collections.abc import Callable

from benchmarks import REPO

RESULTS = REPO / "benchmarks" / "RESULTS.md"


def alternate(sides: dict[str, Callable[[], float]], reps: int) -> dict[str, list[float]]:
    """Run every side once per repetition, the order reversed every other repetition; the seconds of each run."""
    out: dict[str, list[float]] = {name: [] for name in sides}
    names = list(sides)
    for rep in range(reps):
        for name in names if rep % 2 == 0 else reversed(names):
            out[name].append(sides[name]())
    return out


def ratio(a: list[float], b: list[float]) -> str:
    """median (min-max) of the per-repetition ratios a/b."""
    rs = [x / y for x, y in zip(a, b, strict=True)]
    return f"{statistics.median(rs):.2f} ({min(rs):.2f}-{max(rs):.2f})"


def spread(values: list[float], fmt: str = "{:.1f}") -> str:
    """median (min-max)."""
    return f"{fmt.format(statistics.median(values))} ({fmt.format(min(values))}-{fmt.format(max(values))})"


def machine() -> str:
    cpu = ""
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    system = f"{platform.system()} {platform.release()}, Python {platform.python_version()}"
    return f"{os.cpu_count()} cores ({cpu or platform.machine()}), {system}"


def replace_section(text: str, heading: str, section: str) -> str:
    """``text`` with its ``heading`` section (up to the next ``## `` heading) replaced by ``section``, or with
    ``section`` appended when it has none."""
    lines = text.splitlines()
    if heading not in lines:
        return text.rstrip("\n") + "\n\n" + section.rstrip("\n") + "\n"
    start = lines.index(heading)
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
    return "\n".join([*lines[:start], *section.rstrip("\n").splitlines(), "", *lines[end:]]).rstrip("\n") + "\n"


class Clock:
    """When each part of a run started, for the durations RESULTS.md lists."""

    def __init__(self) -> None:
        self.started = time.monotonic()
        self.marks: dict[str, float] = {}

    def mark(self, name: str) -> None:
        """``name`` starts now (and the previous part ends)."""
        self.marks[name] = time.monotonic()

    def elapsed(self) -> float:
        """Seconds since the run started."""
        return time.monotonic() - self.started

    def durations(self, ran: set[str]) -> str:
        """How long each part in ``ran`` took, in the order they ran."""
        marks = list(self.marks.items())
        return ", ".join(
            f"{name} {end - begin:.0f} s" for (name, begin), (_, end) in itertools.pairwise(marks) if name in ran
        )


def results_text(reps: str, took: str, rows: list[str], sections: list[str]) -> str:
    """RESULTS.md: the header, ``rows`` as the ratio table (none without rows), then ``sections``. ``reps`` says
    how many repetitions each ratio is the median of; ``took`` how long the run and each part took."""
    table = ["| what | ratio | goal | notes |", "|---|---|---|---|", *rows, ""] if rows else []
    return "\n".join(
        [
            "# Benchmark results",
            "",
            f"Written by `make bench` on {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; machine: {machine()}.",
            f"Each ratio is the median of {reps}, with the range in brackets; the whole run took {took}. The "
            "machine is shared (other jobs run on the same cores), so absolute times are noisy; the ratios compare "
            "sides run alternately in this run.",
            "",
            *table,
            *sections,
        ]
    )
