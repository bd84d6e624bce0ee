"""A trainer left running by an agent that died (an OOM kill, a crash): found and ended before the next agent runs
one, so a node never runs two trainers at once.

The agent tags each torchrun it starts with ``SPOT_TRAINING_TRAINER_RUN=<token>`` in its environment (torchrun's
workers inherit it, whatever sessions they run in) and keeps the token in ``<work dir>/trainer-run``; it removes the
file once the trainer has exited. An agent that starts and finds the file ends every process whose environment holds
that token (``/proc/<pid>/environ``: the node's own processes, same user) and waits until they are gone. Linux only,
as the nodes; Python 3.8+, stdlib only.
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from typing import Callable, Dict, Optional, Set

TRAINER_RUN_ENV = "SPOT_TRAINING_TRAINER_RUN"
TRAINER_RUN_FILE = "trainer-run"


def tag_trainer(work_dir: str, env: Dict[str, str]) -> str:
    """A new token in ``env`` and in ``<work_dir>/trainer-run`` (written before the trainer starts)."""
    token = uuid.uuid4().hex
    env[TRAINER_RUN_ENV] = token
    os.makedirs(work_dir, exist_ok=True)
    path = os.path.join(work_dir, TRAINER_RUN_FILE)
    with open(path + ".tmp", "w") as out:
        out.write(token)
    os.replace(path + ".tmp", path)
    return token


def trainer_ended(work_dir: str) -> None:
    """The tagged trainer has exited: nothing left to end."""
    try:
        os.remove(os.path.join(work_dir, TRAINER_RUN_FILE))
    except FileNotFoundError:
        pass


def tagged_processes(token: str) -> Set[int]:
    """Processes whose environment holds ``SPOT_TRAINING_TRAINER_RUN=<token>`` (unreadable ones are not ours)."""
    wanted = f"{TRAINER_RUN_ENV}={token}".encode()
    found: Set[int] = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                environ = f.read()
        except OSError:
            continue
        if wanted in environ.split(b"\0"):
            found.add(int(entry))
    return found


def end_leftover_trainer(work_dir: str, log: Callable[[str], None], wait_s: float = 30.0) -> Optional[int]:
    """End the trainer an earlier agent on this node left running, if any; the number of processes ended, or None
    when there was no tagged trainer. Bounded: after ``wait_s`` the survivors are logged and left."""
    path = os.path.join(work_dir, TRAINER_RUN_FILE)
    try:
        with open(path) as f:
            token = f.read().strip()
    except FileNotFoundError:
        return None
    found = tagged_processes(token) if token else set()
    if found:
        log(f"a trainer of an earlier agent is still running ({len(found)} processes): ending it")
    deadline = time.monotonic() + wait_s
    left = found
    while left and time.monotonic() < deadline:
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        time.sleep(0.1)
        left = tagged_processes(token)
    if left:
        log(f"processes {sorted(left)} of the earlier trainer did not end within {wait_s:g} s")
    else:
        trainer_ended(work_dir)
    return len(found)
