"""S3 marker names a node writes under ``<job>/nodes/<instance-id>/`` and the time a marker's JSON carries."""

from __future__ import annotations

from typing import Any, Dict

# a node's markers written when its trainer stopped, or it leaves: after them, its ``training`` marker is stale
END_OF_TRAINING = ("synced", "leaving", "done")
PROGRESS_MARKER = "progress"  # nodes/<id>/progress: the stall watchdog's job-wide progress
READY_MARKER = "ready"  # nodes/<id>/ready: at an elastic job's first attempt, restored and about to start torchrun


def stamp(marker: Dict[str, Any]) -> float:
    """When a marker was written (``put_marker``'s ``time``, the writer's clock); 0 if it says not."""
    return float(marker.get("time", 0))
