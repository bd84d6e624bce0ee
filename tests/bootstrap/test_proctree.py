"""Ending a process tree: every process in it, and none of them runs another line after a child is killed (a shell
woken by its child's death between two kills would run the next command of its script)."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import pytest
from spot_training import proctree
from spot_training.proctree import kill_all, process_tree

SCRIPT = 'echo started\nsleep 60\necho never > "$1"\n'
ROUNDS = 20


def _shell(marker: Path) -> subprocess.Popen[bytes]:
    """``SCRIPT`` under bash, once bash has forked its ``sleep`` (a tree of two; bounded: 10 s)."""
    proc = subprocess.Popen(["bash", "-c", SCRIPT, "bash", str(marker)], stdout=subprocess.PIPE)
    assert proc.stdout is not None
    assert proc.stdout.readline() == b"started\n"
    deadline = time.monotonic() + 10
    while len(process_tree(proc.pid)) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(process_tree(proc.pid)) == 2
    return proc


def test_killing_a_shell_and_its_child_leaves_the_shell_no_next_line(tmp_path: Path) -> None:
    for n in range(ROUNDS):
        marker = tmp_path / f"never-{n}"
        proc = _shell(marker)
        tree = process_tree(proc.pid)
        kill_all(tree)
        assert proc.wait(timeout=10) == -signal.SIGKILL
        assert not marker.exists(), f"round {n}: the shell ran its next line after its sleep was killed"
        assert _all_ended(tree), f"round {n}: a process of the tree runs on"


def test_a_killer_preempted_between_two_kills_still_leaves_the_shell_no_next_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The agent's thread can lose the CPU between two ``os.kill`` calls on a busy node; the child killed first
    wakes its shell then. Each kill here is followed by a 50 ms pause, and the child is signalled first."""
    real_kill = proctree.os.kill

    def slow_kill(pid: int, sig: int) -> None:
        real_kill(pid, sig)
        time.sleep(0.05)

    monkeypatch.setattr(proctree.os, "kill", slow_kill)
    marker = tmp_path / "never"
    proc = _shell(marker)
    children_first = sorted(process_tree(proc.pid), key=lambda pid: pid == proc.pid)
    kill_all(children_first)  # the child first
    assert proc.wait(timeout=10) == -signal.SIGKILL
    assert not marker.exists(), "the shell ran its next line after its sleep was killed"


def test_a_sigterm_reaches_the_stopped_tree(tmp_path: Path) -> None:
    proc = _shell(tmp_path / "never")
    kill_all(process_tree(proc.pid), signal.SIGTERM)
    assert proc.wait(timeout=10) == -signal.SIGTERM


def _all_ended(pids: set[int]) -> bool:
    """Every process gone or a zombie within 5 s (a killed process is reaped by its parent or init)."""
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        if all(_state(pid) in ("gone", "Z", "X") for pid in pids):
            return True
        time.sleep(0.01)
    return False


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"
