"""Least-recently-used pruning of what the agent keeps on a claimed warm volume, so that a volume that nodes of many
different jobs claim in turn never fills up and fails their setups and downloads.

Entries: each directory in the volume's ``setup-cache/`` (one setup's cache, ``job_setup``) and ``inputs/`` (one
input's store, ``job_inputs``; its record ``<store>.json`` beside it belongs to it).

Last use: an entry's own modification time. ``prune`` sets it to now (``os.utime``) for each entry of the current
job before it removes anything, and an entry the job creates gets it from its creation; so it is when a job last
started to use the entry. A file inside would not do: an input store holds what S3 lists and nothing else (the job's
path is a link to it, and its sync removes any other file); nor would the access time (volumes mount with
``relatime`` or ``noatime``). A directory's mtime also moves when a name is added to or removed from it, which
happens only while a job uses the entry.

Pruning, before the job's setup and input downloads: while the volume's free space (``os.statvfs``: the blocks
available to users, of all its blocks) is below the threshold (the team file's ``warm_pool.min_free_percent``),
remove the least recently used entry that is not the current job's, one at a time, oldest first. One log line per
removed entry (which, its last use, bytes freed), and one line when the space is still short with nothing left to
remove.

Removal is safe at any point of a crash: an input store's record goes first (a store without its record is fetched
again in whole: ``job_inputs`` keeps only the files its record lists), then the directory is renamed in one step to
a trash name beside it (``<name>.pruning``; a setup cache's ``COMPLETE`` marker leaves with it, so nothing half
deleted looks complete), then deleted. Trash a crash left behind is deleted at the next pruning, before the volume's
free space is measured.
"""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass
from typing import Callable, Iterable, List, Optional

from spot_training.agent.job_inputs import PART, RECORD, STORES
from spot_training.agent.job_setup import SETUP_CACHES

TRASH = ".pruning"  # suffix of an entry renamed for deletion
FOLDERS = (SETUP_CACHES, STORES)  # the folders of entries, in the agent's folder of the volume


@dataclass(frozen=True)
class Entry:
    """One reusable entry on the volume: its directory, its folder's name, and its last use (epoch seconds)."""

    path: str
    folder: str
    last_used: float

    @property
    def name(self) -> str:
        return f"{self.folder}/{os.path.basename(self.path)}"


def disk_free_percent(path: str) -> float:
    """The share of the file system holding ``path`` that users may still write, in percent; 100 when the file
    system does not say (nothing is removed on a guess)."""
    try:
        stat = os.statvfs(path)
    except OSError:
        return 100.0
    return 100.0 * stat.f_bavail / stat.f_blocks if stat.f_blocks else 100.0


def mark_used(path: str) -> None:
    """Record a use of the entry at ``path`` now (its mtime); an entry that is not there yet is left alone."""
    try:
        os.utime(path)
    except OSError:
        pass


def entries(volume_dir: str) -> List[Entry]:
    """The volume's entries, least recently used first; trash and stray files are no entries."""
    found = []
    for folder in FOLDERS:
        top = os.path.join(volume_dir, folder)
        try:
            names = sorted(os.listdir(top))
        except OSError:
            continue
        for name in names:
            path = os.path.join(top, name)
            if name.endswith(TRASH) or os.path.islink(path) or not os.path.isdir(path):
                continue
            found.append(Entry(path, folder, os.stat(path).st_mtime))
    return sorted(found, key=lambda entry: (entry.last_used, entry.path))


def tree_bytes(path: str) -> int:
    """The bytes of the files under ``path`` (links not followed)."""
    total = 0
    for folder, _, names in os.walk(path):
        for name in names:
            try:
                total += os.lstat(os.path.join(folder, name)).st_size
            except OSError:
                pass
    return total


def sweep_trash(volume_dir: str) -> None:
    """Delete what an earlier pruning renamed for deletion and did not finish deleting."""
    for folder in FOLDERS:
        top = os.path.join(volume_dir, folder)
        for name in os.listdir(top) if os.path.isdir(top) else []:
            if name.endswith(TRASH):
                shutil.rmtree(os.path.join(top, name), ignore_errors=True)


def remove(entry: Entry) -> int:
    """Remove ``entry``: its record, a rename to trash, the deletion (see the module's docstring); the bytes freed."""
    freed = tree_bytes(entry.path)
    for record in (entry.path + RECORD, entry.path + RECORD + PART):
        if os.path.isfile(record):
            freed += os.path.getsize(record)
            os.remove(record)
    trash = entry.path + TRASH
    shutil.rmtree(trash, ignore_errors=True)
    os.rename(entry.path, trash)
    shutil.rmtree(trash, ignore_errors=True)
    return freed


def when(epoch: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))


def prune(
    volume_dir: str,
    current: Iterable[str],
    min_free_percent: float,
    log: Callable[[str], None],
    free_percent: Optional[Callable[[str], float]] = None,
) -> List[str]:
    """Mark the current job's entries (``current``: their paths) used, then remove the least recently used others
    while the volume's free space is below ``min_free_percent``; the names of the removed entries.
    ``free_percent``: how full the volume is (default ``disk_free_percent``; tests give their own)."""
    measure = free_percent or disk_free_percent
    keep = {os.path.realpath(path) for path in current}
    for path in sorted(keep):
        mark_used(path)
    sweep_trash(volume_dir)
    free = measure(volume_dir)
    if free >= min_free_percent:
        return []
    removed: List[str] = []
    for entry in entries(volume_dir):
        if os.path.realpath(entry.path) in keep:
            continue
        try:
            freed = remove(entry)
        except OSError as exc:  # a volume gone read-only, say: what stays costs space, never the job
            log(f"warm volume: could not remove {entry.name} ({exc}); left in place")
            continue
        removed.append(entry.name)
        free = measure(volume_dir)
        log(
            f"warm volume: removed {entry.name} (last used {when(entry.last_used)}, {freed:,} bytes freed); "
            f"{free:.1f}% free, min_free_percent {min_free_percent:g}"
        )
        if free >= min_free_percent:
            return removed
    log(
        f"warm volume: {free:.1f}% free, below min_free_percent {min_free_percent:g}, and nothing else to remove "
        f"({len(removed)} removed; the current job's own entries stay); size the pool's volumes for its jobs"
    )
    return removed
