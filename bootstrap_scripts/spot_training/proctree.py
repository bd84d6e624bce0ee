"""Process trees on Linux (/proc), whatever their sessions: torchrun starts its workers in sessions of their own,
so killing the launcher's process group leaves them running. Python 3.8+, stdlib only."""

from __future__ import annotations

import os
import signal
from typing import Dict, List, Set


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


def kill_all(pids: Set[int], sig: int = signal.SIGKILL) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass
