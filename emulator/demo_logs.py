"""The job's log lines as the demo and its tests read them (CloudWatch Logs, through ``trainctl``): the trainer's and
the node agent's patterns, and every restart of the trainer they show."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional

from emulator.cloud import EmulatorError

INTERRUPTED = re.compile(r"interrupted: checkpoint (\d+) saved")
RESUMED = re.compile(r"resumed from step (\d+)")
STEP = re.compile(r"\bstep (\d+) epoch \d+ loss")
FRESH = re.compile(r"\bstarting fresh\b")
LAUNCHED = re.compile(r"node-agent \S+ running: ")
DURABLE = re.compile(r"checkpoint (\d+) durable in s3://")
ACCURACY = re.compile(r"epoch (\d+) done: step (\d+) test accuracy ([0-9.]+) world size (\d+)")


@dataclass
class Restart:
    """One restart of the trainer, read from the job's logs: the furthest step any rank had logged before it
    (including the step an interrupted trainer saved), and the step it resumed from (0: started over)."""

    at: float
    furthest_before: int
    resumed_from: int

    @property
    def steps_redone(self) -> int:
        return self.furthest_before - self.resumed_from


def first_after(
    events: list[tuple[float, str, str]], pattern: re.Pattern[str], after: float, stream: Optional[str] = None
) -> tuple[float, re.Match[str]]:
    for ts, name, message in events:
        if ts >= after and (stream is None or name == stream):
            m = pattern.search(message)
            if m:
                return ts, m
    raise EmulatorError(f"no log line matching {pattern.pattern!r} after {after:.3f} in the job's logs")


def restarts(events: list[tuple[float, str, str]]) -> list[Restart]:
    """Every restart of the trainer in the job's log lines: each ``resumed from step N`` (or a ``starting fresh``
    after steps were trained) against the furthest step any rank logged before it.

    "Before" is before the agent launched that trainer (its ``running:`` line in the same stream): lines of
    different nodes are stamped by different agents, so a step of the new run on another node can carry an
    earlier time than the ``resumed from`` line; none can precede the launch of the rank 0 it trains with."""
    steps: list[tuple[float, int]] = []
    launched: dict[str, float] = {}
    resumes: list[tuple[float, float, int]] = []  # (time of the line, launch of its trainer, step resumed from)
    for ts, stream, message in events:
        if (m := STEP.search(message)) or (m := INTERRUPTED.search(message)):
            steps.append((ts, int(m.group(1))))
        elif LAUNCHED.search(message):
            launched[stream] = ts
        elif m := RESUMED.search(message):
            resumes.append((ts, launched.get(stream, ts), int(m.group(1))))
        elif FRESH.search(message):
            resumes.append((ts, launched.get(stream, ts), -1))
    found = []
    for at, cutoff, resumed in resumes:
        furthest = max((step for ts, step in steps if ts < cutoff), default=0)
        if resumed >= 0 or furthest > 0:
            found.append(Restart(at, furthest, max(resumed, 0)))
    return found
