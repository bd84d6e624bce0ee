"""The node's local checkpoint directory: its step folders with files, and what the helper or the agent leaves there
(``.spot-training/`` state, half-written ``.tmp-``/``.restore-`` folders) that is never a checkpoint's."""

from __future__ import annotations

import os
import shutil
from typing import Dict, List

from spot_training.sync_state import COMPLETE, STATE_DIR, step_number

PARTIAL_WRITES = (".tmp-", ".restore-")  # the checkpoint helper's folder being written, a restore under way


def agent_entry(name: str) -> bool:
    """A top-level entry of a checkpoint directory that belongs to the helper or the agent, never a checkpoint's."""
    return name == STATE_DIR or name.startswith(PARTIAL_WRITES)


def remove_partial_writes(checkpoint_dir: str) -> None:
    """Delete what a killed trainer's checkpoint writer (``.tmp-<step>-<pid>``) or an interrupted restore
    (``.restore-<step>-*``) left half-written; no trainer runs now. Each attempt's writer has a new pid, so across
    restarts they would fill the disk."""
    for name in os.listdir(checkpoint_dir):
        if name.startswith(PARTIAL_WRITES):
            shutil.rmtree(os.path.join(checkpoint_dir, name), ignore_errors=True)


def local_steps(checkpoint_dir: str) -> List[int]:
    """The step directories (``<dir>/<step>/``) in a checkpoint directory that hold a file, oldest first. An empty
    one (a script that made it and crashed) is no checkpoint: not the newest, not a resume step."""
    try:
        names = os.listdir(checkpoint_dir)
    except FileNotFoundError:
        return []
    steps = ((step_number(n), os.path.join(checkpoint_dir, n)) for n in names)
    return sorted(s for s, path in steps if s is not None and os.path.isdir(path) and step_files(path))


def step_files(root: str) -> Dict[str, str]:
    """{relative name: path} of the files of step directory ``root``, but the helper's ``COMPLETE`` marker."""
    files = {}
    for dirpath, _, names in os.walk(root):
        for name in names:
            path = os.path.join(dirpath, name)
            files[os.path.relpath(path, root).replace(os.sep, "/")] = path
    files.pop(COMPLETE, None)
    return files
