"""The warm volume's setup caches and input stores, pruned least recently used first while the volume's free space is
below the pool's min_free_percent: never the current job's, no further than needed, each renamed to trash before it
is deleted, one log line per removed entry and one when the space stays short. Real directories; the free space is
a fake that follows what is left on disk (no disk is filled)."""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from spot_training.agent import warm_cache_pruning
from spot_training.agent.job_inputs import read_state
from spot_training.agent.job_prepare import prepare_job
from spot_training.agent.job_setup import CACHE_ENV, COMPLETE
from spot_training.agent.warm_cache_pruning import TRASH, entries, prune

from .test_agent_notice import agent_for
from .test_warm_claim import _cluster, _volume

DAY = 86400.0
T0 = 1767323045.0  # 2026-01-02T03:04:05Z
SETUP = "echo setting up\n"


def _cache(volume: Path, name: str, used: float, body: bytes = b"x" * 100) -> Path:
    """A complete setup cache ``setup-cache/<name>`` last used at ``used``."""
    path = volume / "setup-cache" / name
    (path / "venv").mkdir(parents=True)
    (path / "venv" / "lib.so").write_bytes(body)
    (path / COMPLETE).write_text("{}")
    os.utime(path, (used, used))
    return path


def _store(volume: Path, name: str, used: float) -> Path:
    """An input store ``inputs/<name>`` with its record beside it, last used at ``used``."""
    path = volume / "inputs" / name
    path.mkdir(parents=True)
    (path / "part-0.bin").write_bytes(b"d" * 50)
    (volume / "inputs" / f"{name}.json").write_text('{"part-0.bin": ["etag", 50]}')
    os.utime(path, (used, used))
    return path


def _left(volume: Path) -> Callable[[str], float]:
    """A free space that grows 5 points with each entry removed: 5% with five entries on the volume."""
    return lambda path: 30.0 - 5.0 * len(entries(str(volume)))


def _prune(volume: Path, current: list[Path], free: Callable[[str], float], minimum: float = 20) -> tuple[Any, ...]:
    lines: list[str] = []
    removed = prune(str(volume), [str(p) for p in current], minimum, lines.append, free)
    return removed, lines


def test_the_least_recently_used_go_first_and_pruning_stops_once_enough_is_free(tmp_path: Path) -> None:
    volume = tmp_path / "vol"
    newest = _cache(volume, "e", T0 + 5 * DAY)
    a = _cache(volume, "a", T0 + DAY)
    b = _store(volume, "b", T0 + 2 * DAY)
    c = _cache(volume, "c", T0 + 3 * DAY)
    d = _store(volume, "d", T0 + 4 * DAY)
    removed, lines = _prune(volume, [], _left(volume))
    assert removed == ["setup-cache/a", "inputs/b", "setup-cache/c"]
    assert [p.exists() for p in (a, b, c, d, newest)] == [False, False, False, True, True]
    assert not (volume / "inputs" / "b.json").exists() and (volume / "inputs" / "d.json").exists()
    assert len(lines) == 3 and lines[-1].endswith("; 20.0% free, min_free_percent 20")


def test_the_current_jobs_entries_stay_even_when_the_space_stays_short(tmp_path: Path) -> None:
    volume = tmp_path / "vol"
    own_cache = _cache(volume, "own", T0)  # the oldest of all
    own_store = _store(volume, "own-input", T0 + DAY)
    other = _cache(volume, "other", T0 + 2 * DAY)
    started = time.time() - 1  # the file system's clock ticks coarser than time.time()
    removed, lines = _prune(volume, [own_cache, own_store], lambda path: 5.0)
    assert removed == ["setup-cache/other"] and not other.exists()
    assert own_cache.exists() and own_store.exists() and (volume / "inputs" / "own-input.json").exists()
    assert own_cache.stat().st_mtime >= started and own_store.stat().st_mtime >= started  # their use, recorded
    assert lines[-1] == (
        "warm volume: 5.0% free, below min_free_percent 20, and nothing else to remove (1 removed; the current "
        "job's own entries stay); size the pool's volumes for its jobs"
    )


def test_nothing_is_removed_when_the_space_is_ample(tmp_path: Path) -> None:
    volume = tmp_path / "vol"
    old = [_cache(volume, "a", T0), _store(volume, "b", T0)]
    own = _cache(volume, "own", T0)
    removed, lines = _prune(volume, [own, volume / "inputs" / "not-fetched-yet"], lambda path: 20.0)
    assert (removed, lines) == ([], [])
    assert all(p.exists() and p.stat().st_mtime == T0 for p in old)
    assert own.stat().st_mtime > T0


def test_a_removed_entry_is_named_with_its_last_use_and_the_bytes_it_freed(tmp_path: Path) -> None:
    volume = tmp_path / "vol"
    _cache(volume, "a", T0, body=b"x" * 1200)
    _store(volume, "b", T0 + DAY)
    record = len((volume / "inputs" / "b.json").read_bytes())
    removed, lines = _prune(volume, [], lambda path: 5.0 if len(entries(str(volume))) > 0 else 25.0)
    assert removed == ["setup-cache/a", "inputs/b"]
    assert lines == [
        "warm volume: removed setup-cache/a (last used 2026-01-02T03:04:05Z, 1,202 bytes freed); 5.0% free, "
        "min_free_percent 20",
        f"warm volume: removed inputs/b (last used 2026-01-03T03:04:05Z, {50 + record} bytes freed); 25.0% free, "
        "min_free_percent 20",
    ]


class Crash(Exception):
    """The agent killed in the middle of a deletion."""


@pytest.mark.parametrize("folder", ["setup-cache", "inputs"])
def test_an_entry_is_renamed_to_trash_before_its_deletion_so_a_crash_leaves_nothing_complete(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, folder: str
) -> None:
    volume = tmp_path / "vol"
    entry = _cache(volume, "old", T0) if folder == "setup-cache" else _store(volume, "old", T0)
    record = volume / "inputs" / "old.json"
    deleting: list[tuple[str, bool, bool]] = []

    def crashing_rmtree(path: str, ignore_errors: bool = False) -> None:
        if os.path.isdir(path):  # the deletion itself: the entry's name and record are gone by now
            deleting.append((os.path.basename(path), entry.exists(), record.exists()))
            os.remove(next(p for p in Path(path).rglob("*") if p.is_file()))  # a part of it deleted
            raise Crash

    monkeypatch.setattr(warm_cache_pruning.shutil, "rmtree", crashing_rmtree)
    with pytest.raises(Crash):
        _prune(volume, [], lambda path: 5.0)
    assert deleting == [("old" + TRASH, False, False)]
    assert not (entry / COMPLETE).exists()  # the setup runs again
    assert read_state(str(record)) == {}  # every file of the input is fetched again
    assert entries(str(volume)) == []

    monkeypatch.undo()
    assert _prune(volume, [], lambda path: 50.0) == ([], [])  # the next pruning deletes the trash
    assert sorted(os.listdir(volume / folder)) == []


def test_the_agent_prunes_an_old_cache_before_the_jobs_setup(
    make_cluster: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Through the agent's claim and ``prepare_job``: another job's setup cache, on the volume claimed, goes (the
    pool's min_free_percent from the job spec) before this job's setup runs and caches its own there."""
    cluster, pool = _cluster(make_cluster)
    cluster.spec["warm_pool"]["min_free_percent"] = 30
    volume_id = _volume(cluster, pool)  # puts the job spec
    cluster.submit("prune-run", {"train.py": "pass\n", "setup.sh": SETUP}, "python train.py", setup="setup.sh")
    monkeypatch.setenv("SPOT_TRAINING_WARM_VOLUME_MOUNT", "0")
    monkeypatch.setenv("SPOT_TRAINING_WARM_VOLUME_DIRS", str(tmp_path / "volumes"))
    agent, job, lines = agent_for(cluster)
    agent.node.availability_zone = "us-east-1a"
    agent.warm.claim(job)
    volume = tmp_path / "volumes" / volume_id
    old = _cache(volume, "0" * 64, T0)
    free: list[float] = []

    def disk_free_percent(path: str) -> float:
        free.append(10.0 if old.exists() else 35.0)
        return free[-1]

    monkeypatch.setattr(warm_cache_pruning, "disk_free_percent", disk_free_percent)
    code = tmp_path / "code"
    code.mkdir()
    (code / "setup.sh").write_text(SETUP)
    prepared = prepare_job(agent.node, agent.notices, agent.warm, job, str(code))
    key = hashlib.sha256(SETUP.encode()).hexdigest()
    assert not old.exists() and free == [10.0, 35.0]
    assert prepared == {CACHE_ENV: str(volume / "setup-cache" / key)}
    assert (volume / "setup-cache" / key / COMPLETE).is_file()
    removed = [line for line in lines if line.startswith("warm volume: removed ")]
    assert removed == [
        f"warm volume: removed setup-cache/{'0' * 64} (last used 2026-01-02T03:04:05Z, 102 bytes freed); 35.0% "
        "free, min_free_percent 30"
    ]
    assert lines.index(removed[0]) < lines.index("[setup " + agent.node.instance_id + "] setting up")
