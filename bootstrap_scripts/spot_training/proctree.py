"""Process trees on Linux (/proc), whatever their sessions: torchrun starts its workers in sessions of their own,
so killing the launcher's process group leaves them running. Python 3.8+, stdlib only."""

from __future__ import annotations

import os
import signal
from typing import Dict, Iterable, List, Set


def process_tree(root: int) -> Set[int]:
    """``root`` and every process descended from it. Take it before anything dies: orphans get a new parent."""
    children: Dict[int, List[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    stat = f.read()
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(entry))
    found: Set[int] = set()
    todo = [root]
    while todo:
        pid = todo.pop()
        if pid not in found:
            found.add(pid)
            todo.extend(children.get(pid, []))
    return found


def kill_all(pids: Iterable[int], sig: int = signal.SIGKILL) -> None:
    """Send ``sig`` to every process in ``pids`` as one event: the tree is stopped first, so no parent runs another
    line of its script when its child dies (a shell woken by SIGCHLD between two kills would), then signalled, then
    continued (a stopped process acts on a SIGTERM only once it runs)."""
    pids = list(pids)
    for each in (signal.SIGSTOP, sig, signal.SIGCONT):
        for pid in pids:
            try:
                os.kill(pid, each)
            except (ProcessLookupError, PermissionError):
                pass
