"""The node agent's report to the checkpoint helper, ``<checkpoint dir>/.spot-training/sync-state.json``:
``last_uploaded_step`` (the newest checkpoint durable in S3, or null) and ``last_upload_s`` (how long its upload
took). The agent writes it, the helper reads it; stdlib only, as the agent imports it too."""

from __future__ import annotations

import json
import os
from typing import Any, Dict, Optional

STATE_DIR = ".spot-training"  # the agent's files in the checkpoint directory; never synced
SYNC_STATE = "sync-state.json"
# In a step directory: the checkpoint helper writes it into ``.tmp-<step>-<pid>/`` before renaming that to
# ``<step>/``, so a step directory holding it is complete. One without it (a script writing ``<step>/`` in place)
# is uploaded once two polls see it unchanged. Never uploaded itself.
COMPLETE = ".spot-training-complete"


def step_number(name: str) -> Optional[int]:
    """The step a checkpoint folder (on disk or in S3) named ``name`` holds: a canonical decimal (``500``; not
    ``000500``, which would be read back as another folder, nor a non-ASCII digit), else None."""
    return int(name) if name.isascii() and name.isdigit() and name == str(int(name)) else None


def read_sync_state(directory: str) -> Dict[str, Any]:
    """The agent's last report in checkpoint ``directory``; {} before its first (or when unreadable)."""
    try:
        with open(os.path.join(directory, STATE_DIR, SYNC_STATE)) as f:
            state = json.load(f)
    except (OSError, ValueError):
        return {}
    return state if isinstance(state, dict) else {}


def write_sync_state(directory: str, last_uploaded_step: Optional[int], last_upload_s: float) -> None:
    """Replace the report in checkpoint ``directory`` at once (a reader never sees half of it)."""
    state_dir = os.path.join(directory, STATE_DIR)
    os.makedirs(state_dir, exist_ok=True)
    tmp = os.path.join(state_dir, SYNC_STATE + ".tmp")
    with open(tmp, "w") as f:
        json.dump({"last_uploaded_step": last_uploaded_step, "last_upload_s": last_upload_s}, f)
    os.replace(tmp, os.path.join(state_dir, SYNC_STATE))
