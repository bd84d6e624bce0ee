"""A node's process tree: the user data started as cloud-init would, in a session of its own; its exit status read
without reaping it; its end reaching only the node's own processes.

The user data's process is not reaped until its node is shut down (a zombie keeps its pid and process group id from
being reused), and its descendants are signalled through pidfds taken while they were its descendants. A node whose
process was reaped elsewhere gets no signal at all.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Optional

from bootstrap_scripts.spot_training.proctree import process_tree

SHUTDOWN_GRACE_S = 10.0
BASH = shutil.which("bash") or "/bin/bash"


def start_user_data(script: Path, root: Path, console: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    """Run the instance's user data script in ``root``, its output appended to ``console``."""
    with open(console, "ab") as out:
        return subprocess.Popen(  # noqa: S603 - the instance's own user data, as cloud-init runs it
            [BASH, str(script)],
            cwd=root,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def exit_status(proc: subprocess.Popen[bytes]) -> Optional[int]:
    """The process's exit code (negative: the signal that ended it) once it exited, else None; without reaping it
    (``WNOWAIT``): until the launcher reaps it, its pid and process group id cannot be reused."""
    if proc.returncode is not None:
        return proc.returncode
    try:
        info = os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:  # reaped elsewhere
        return proc.poll()
    if info is None:
        return None
    return info.si_status if info.si_code == os.CLD_EXITED else -info.si_status


def end_process_tree(proc: subprocess.Popen[bytes], *, hard: bool, on_running: Callable[[], None]) -> None:
    """End the tree of the unreaped ``proc`` (SIGTERM, SIGKILL after ``SHUTDOWN_GRACE_S``; ``hard``: SIGKILL at
    once, a power cut) and reap ``proc``. ``on_running`` is called first if ``proc`` is still running.

    While ``proc`` is unreaped its pid and process group id are the node's; once reaped (by someone else), they may
    belong to anything on the machine, so nothing is signalled."""
    if proc.returncode is not None:
        return
    leader = proc.pid
    # torchrun starts its workers in sessions of their own: take the whole tree, not just the group, and take it
    # before anything dies (the parent of an orphan cannot be followed).
    with contextlib.ExitStack() as fds:
        tree = _pidfds(process_tree(leader) - {leader}, fds)
        try:
            if exit_status(proc) is None:
                on_running()
                if not hard:
                    _signal_group(proc, signal.SIGTERM)
                    deadline = time.monotonic() + SHUTDOWN_GRACE_S
                    while exit_status(proc) is None and time.monotonic() < deadline:
                        time.sleep(0.05)
                    tree += _pidfds(process_tree(leader) - {leader}, fds)
        finally:  # also when the grace is cut short (a second Ctrl-C)
            _signal_group(proc, signal.SIGKILL)  # whatever the tree left behind
            for fd in tree:
                with contextlib.suppress(ProcessLookupError):
                    signal.pidfd_send_signal(fd, signal.SIGKILL)
    proc.wait(timeout=SHUTDOWN_GRACE_S)


def _pidfds(pids: set[int], fds: contextlib.ExitStack) -> list[int]:
    """pidfds of ``pids`` (closed with ``fds``): a signal through one reaches that process or none, never a
    process that got its pid later."""
    found = []
    for pid in pids:
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            continue
        fds.callback(os.close, fd)
        found.append(fd)
    return found


def _signal_group(proc: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    """Only while ``proc`` is unreaped (see :func:`exit_status`): its process group is then the node's."""
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass
