"""The checkpoint helper: ``wait_for_upload`` (whether training goes on before the agent made a checkpoint durable),
and when the ranks agree to save or stop.

The agent's side is played by a thread doing what the node agent's sync does: see ``<dir>/<step>/state.pt``, then
report it durable in ``<dir>/.spot-training/sync-state.json``. Every wait is bounded.
"""

from __future__ import annotations

import json
import math
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from spot_training.agent.checkpoint_store import CheckpointStore
from spot_training.agent.checkpoint_sync import Syncer
from spot_training.checkpoint import CHECK_S, STATE_DIR, STATE_FILE, Checkpointer
from spot_training.protocol import MANIFEST
from spot_training.sync_state import COMPLETE

from .conftest import BOOTSTRAP

BOUND_S = 30.0


def fake_agent(directory: Path, step: int, go: threading.Event, reported: threading.Event) -> threading.Thread:
    """Once ``go`` is set and checkpoint ``step`` is on disk: report it durable (``reported`` is set first)."""

    def run() -> None:
        deadline = time.monotonic() + BOUND_S
        go.wait(BOUND_S)
        while not (directory / str(step) / STATE_FILE).exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        reported.set()
        (directory / STATE_DIR).mkdir(exist_ok=True)
        (directory / STATE_DIR / "sync-state.json").write_text(
            json.dumps({"last_uploaded_step": step, "last_upload_s": 0.1})
        )

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def checkpointer(directory: Path, wait: bool) -> Checkpointer:
    return Checkpointer(
        torch.nn.Linear(2, 2), directory=str(directory), interval_s=0.0, wait_for_upload=wait, handle_sigterm=False
    )


def test_with_wait_for_upload_a_checkpoint_step_returns_only_once_the_agent_reports_it_durable(
    tmp_path: Path,
) -> None:
    go, reported = threading.Event(), threading.Event()
    agent = fake_agent(tmp_path, 1, go, reported)
    go.set()
    assert checkpointer(tmp_path, wait=True).step(1) is False  # a periodic checkpoint (interval 0), not a stop
    assert reported.is_set()
    agent.join(BOUND_S)


def test_by_default_training_goes_on_while_the_checkpoint_uploads(tmp_path: Path) -> None:
    go, reported = threading.Event(), threading.Event()
    agent = fake_agent(tmp_path, 1, go, reported)  # holds its report until after step() returned
    ckpt = checkpointer(tmp_path, wait=False)
    assert ckpt.step(1) is False
    assert not reported.is_set()
    go.set()
    agent.join(BOUND_S)
    ckpt.close()
    assert (tmp_path / "1" / STATE_FILE).exists()


def test_the_agent_uploads_a_helper_checkpoint_in_its_first_round_without_the_helper_s_marker(
    aws: Any, tmp_path: Path
) -> None:
    """The helper renames a complete folder into place: the agent need not wait a second round (a poll, 5 s) to see
    it unchanged, as it does for a folder a script writes in place. The marker saying so is not uploaded."""
    ckpt = checkpointer(tmp_path, wait=False)
    assert ckpt.step(4) is False
    ckpt.close()
    assert sorted(p.name for p in (tmp_path / "4").iterdir()) == [COMPLETE, STATE_FILE]
    aws.s3.create_bucket(Bucket="ckpt-helper")
    store = CheckpointStore(aws.s3, "ckpt-helper", "c/j/ckpt/", "j", lambda line: None)
    job = type("Job", (), {"checkpoint_dir": str(tmp_path), "checkpoint_interval_s": None, "mtbi_s": 3600.0})
    assert Syncer(store, job, lambda line: None, 2).sync() == 4
    assert sorted(store.listing()[4]) == [MANIFEST, STATE_FILE]


def test_wait_for_upload_without_an_agent_gives_up_with_one_line_and_a_notice_cuts_the_wait_short(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ckpt = checkpointer(tmp_path, wait=True)
    ckpt.save(1)
    assert ckpt.wait_uploaded(1, timeout_s=0.2) is False
    assert capsys.readouterr().out == (
        "spot_training: checkpoint 1 not reported durable in S3 within 0.2 s; training goes on "
        "(is the node agent running?)\n"
    )
    ckpt.stop_requested.set()  # SIGTERM: the emergency checkpoint is next, the wait must not use the grace
    assert ckpt.wait_uploaded(1, timeout_s=BOUND_S) is False
    assert capsys.readouterr().out == ""


def test_a_save_request_is_acted_on_within_one_check_period_of_training(tmp_path: Path) -> None:
    """The helper looks for the agent's save-request at the ranks' periodic agreement (CHECK_S of training), not at
    every step: with steps of at least 1 ms it is seen within CHECK_S / 1 ms calls, and removed once saved."""
    ckpt = Checkpointer(torch.nn.Linear(2, 2), directory=str(tmp_path), interval_s=1e9, handle_sigterm=False)
    for step in range(1, 51):  # the helper learns the step time
        time.sleep(0.001)
        assert ckpt.step(step) is False
    assert ckpt.local_steps() == []
    request = tmp_path / STATE_DIR / "save-request"
    request.parent.mkdir()
    request.touch()
    bound = int(CHECK_S / 0.001) + 1
    for step in range(51, 51 + bound):
        time.sleep(0.001)
        assert ckpt.step(step) is False
        ckpt.wait()
        if ckpt.local_steps():
            break
    assert ckpt.local_steps() == [step]
    assert not request.exists()
    ckpt.close()


def start_two_ranks(tmp_path: Path, script_text: str, *args: str) -> list[subprocess.Popen[str]]:
    """Ranks 0 and 1 of ``script_text`` (argv: rank, port, checkpoint dir, *args), gloo over loopback."""
    script = tmp_path / "two_ranks.py"
    script.write_text(script_text)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, PYTHONPATH=str(BOOTSTRAP))
    return [
        subprocess.Popen(
            [sys.executable, str(script), str(rank), str(port), str(tmp_path / "ckpt"), *args],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in (0, 1)
    ]


def results(procs: list[subprocess.Popen[str]]) -> list[dict[str, Any]]:
    """Each rank's JSON line; both must exit 0 (bounded: 120 s each)."""
    outs = []
    try:
        for proc in procs:
            out, err = proc.communicate(timeout=120)
            assert proc.returncode == 0, err
            outs.append(json.loads(out))
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
    return outs


TWO_RANKS = """
import datetime, json, os, sys, time
import torch
import torch.distributed as dist
from spot_training.checkpoint import Checkpointer

rank, port, directory = int(sys.argv[1]), sys.argv[2], sys.argv[3]
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
                        timeout=datetime.timedelta(seconds=60))
count = [0]
all_reduce = dist.all_reduce
def counted(*args, **kwargs):
    count[0] += 1
    return all_reduce(*args, **kwargs)
dist.all_reduce = counted
if rank == 0:  # rank 0 writes slowly: the other rank must not leave before the emergency checkpoint is on disk
    save = torch.save
    def slow_save(*args, **kwargs):
        time.sleep(1.0)
        return save(*args, **kwargs)
    torch.save = slow_save
ckpt = Checkpointer(torch.nn.Linear(2, 2), directory=directory, interval_s=1e9, handle_sigterm=False)
stopped, on_disk, start = None, None, time.monotonic()
for step in range(1, 5001):
    time.sleep(0.002 if rank == 0 else 0.003)  # the ranks run at different speeds between agreements
    if rank == 1 and step == 300:
        ckpt.stop_requested.set()  # SIGTERM on rank 1 only
    if ckpt.step(step):
        stopped, on_disk = step, os.path.isfile(os.path.join(directory, str(step), "state.pt"))
        break
elapsed = time.monotonic() - start
ckpt.close()
print(json.dumps({"stopped": stopped, "all_reduces": count[0], "saved": ckpt.local_steps(), "on_disk": on_disk,
                  "elapsed_s": elapsed}))
# As the example trainer leaves (exit_process): gloo's teardown at interpreter exit can abort or deadlock.
dist.destroy_process_group()
sys.stdout.flush()
os._exit(0)
"""


def test_two_ranks_agree_every_few_steps_and_a_notice_on_one_rank_stops_both_at_the_same_step(
    tmp_path: Path,
) -> None:
    """Two gloo ranks on loopback: a SIGTERM seen by rank 1 only stops both at the same step with the emergency
    checkpoint of that step, rank 1 leaves only once rank 0 has written it, and they all-reduce about every
    CHECK_S of training, not at every step."""
    outs = results(start_two_ranks(tmp_path, TWO_RANKS))
    stopped = outs[0]["stopped"]
    assert stopped is not None and outs[1]["stopped"] == stopped
    assert 300 <= stopped <= 300 + int(CHECK_S / 0.002) + 1  # within one agreement period after the notice
    assert outs[0]["saved"] == [stopped]  # rank 0 wrote the emergency checkpoint of the step both stopped at
    # rank 1 left only once it was on disk (torchrun would close rank 0 within 30 s of rank 1's exit)
    assert outs[1]["on_disk"] is True
    for out in outs:
        # about one agreement per CHECK_S of training (the ramp-up doubles the gap from 1 step), not one a step: a
        # bound in time, since a loaded machine makes steps slower and so fewer of them between two agreements
        assert out["all_reduces"] <= 1.5 * out["elapsed_s"] / CHECK_S + math.log2(stopped) + 2, out


# Restore on two ranks, each with its own checkpoint directory (argv[4]: "both" have step 5, "rank 0" only, or
# "other bytes": rank 1's step 5 is another state).
RESTORE_TWO_RANKS = """
import datetime, json, os, shutil, sys
import torch
import torch.distributed as dist
from spot_training.checkpoint import Checkpointer

rank, port, directory, has = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
                        timeout=datetime.timedelta(seconds=60))
mine = f"{directory}-{rank}"
if rank == 0 or has == "both":
    shutil.copytree(os.path.join(directory, "5"), os.path.join(mine, "5"))
elif has == "other bytes":  # rank 1 holds a step 5 of its own (say, saved again after its upload)
    shutil.copytree(os.path.join(directory + "-other", "5"), os.path.join(mine, "5"))
sent = [0]
broadcast = dist.broadcast_object_list
def counted(*args, **kwargs):
    sent[0] += 1
    return broadcast(*args, **kwargs)
dist.broadcast_object_list = counted
model = torch.nn.Linear(2, 2)
restored = Checkpointer(model, directory=mine, handle_sigterm=False).restore()
print(json.dumps({"step": restored.step, "weight": model.weight.tolist(), "broadcasts": sent[0]}))
dist.destroy_process_group()
sys.stdout.flush()
os._exit(0)
"""


@pytest.mark.parametrize("has", ["both", "rank 0", "other bytes"])
def test_a_rank_that_has_the_checkpoint_reads_its_own_copy_and_only_a_rank_without_it_is_sent_one(
    tmp_path: Path, has: str
) -> None:
    """Both ranks restore rank 0's state. When every rank holds the same bytes (the agent restores the checkpoint on
    every node), nothing is broadcast: sending rank 0's whole state to every rank would take a GPU buffer of its size
    on NCCL (a large model's restore could run out of GPU memory). A rank with other bytes under the step number is
    sent rank 0's."""
    model = torch.nn.Linear(2, 2)
    for directory, weight in (("ckpt", 0.25), ("ckpt-other", 0.75)):
        torch.nn.init.constant_(model.weight, weight)
        saver = Checkpointer(model, directory=str(tmp_path / directory), handle_sigterm=False)
        saver.save(5, block=True)
        saver.close()
    outs = results(start_two_ranks(tmp_path, RESTORE_TWO_RANKS, has))
    for out in outs:
        assert (out["step"], out["weight"]) == (5, [[0.25, 0.25], [0.25, 0.25]])
    assert [out["broadcasts"] for out in outs] == ([0, 0] if has == "both" else [1, 1])


# wait_for_upload on two ranks with a 2 s process-group timeout. Rank 0 asks for a checkpoint at step 20 (the agent's
# save-request). Mode "slow": the agent (a thread of rank 0) reports it durable 4 s after it is on disk, longer than
# the timeout. Mode "notice": the agent never reports; rank 1 gets a SIGTERM 0.5 s after the checkpoint is on disk.
WAIT_TWO_RANKS = """
import datetime, json, os, sys, threading, time
import torch
import torch.distributed as dist
from spot_training.checkpoint import Checkpointer

rank, port, directory, mode = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
# Both ranks reach the rendezvous together: its 2 s timeout covers the rendezvous too, and the two imports of torch
# can end seconds apart on a loaded machine (bounded: 60 s)
ready = os.path.join(os.path.dirname(directory), "ready-{}")
open(ready.format(rank), "w").close()
for _ in range(6000):
    if os.path.exists(ready.format(1 - rank)):
        break
    time.sleep(0.01)
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
                        timeout=datetime.timedelta(seconds=2))
ckpt = Checkpointer(torch.nn.Linear(2, 2), directory=directory, interval_s=1e9, wait_for_upload=True,
                    handle_sigterm=False)
state_dir = os.path.join(directory, ".spot-training")

def on_disk():  # the step of the first checkpoint rank 0 wrote (renamed into place when complete)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        steps = [int(n) for n in (os.listdir(directory) if os.path.isdir(directory) else []) if n.isdigit()]
        if steps:
            return min(steps)
        time.sleep(0.01)

def agent():
    step = on_disk()
    time.sleep(4)
    with open(os.path.join(state_dir, "sync-state.json"), "w") as f:
        json.dump({"last_uploaded_step": step, "last_upload_s": 4}, f)

def sigterm():
    on_disk()
    time.sleep(0.5)
    ckpt.stop_requested.set()

if rank == 0 and mode in ("slow", "slow-write"):
    threading.Thread(target=agent, daemon=True).start()
if rank == 0 and mode == "slow-write":  # the local write alone outlasts the process group's timeout twice
    write = Checkpointer._write
    Checkpointer._write = lambda *args: (time.sleep(4), write(*args))[1]
if rank == 1 and mode == "notice":
    threading.Thread(target=sigterm, daemon=True).start()
stopped, durable_at_return = None, None
for step in range(1, 401):
    time.sleep(0.002)
    if rank == 0 and step == 20:
        os.makedirs(state_dir, exist_ok=True)
        open(os.path.join(state_dir, "save-request"), "w").close()
    saved_before = bool(ckpt.local_steps())
    if ckpt.step(step):
        stopped = step
        break
    if rank == 0 and ckpt.local_steps() and not saved_before:
        durable_at_return = os.path.exists(os.path.join(state_dir, "sync-state.json"))
ckpt.close()
print(json.dumps({"stopped": stopped, "last": step, "saved": ckpt.local_steps(), "durable": durable_at_return}))
# As the example trainer leaves (exit_process): gloo's teardown at interpreter exit can abort or deadlock.
dist.destroy_process_group()
sys.stdout.flush()
os._exit(0)
"""


@pytest.mark.parametrize("slow", ["slow", "slow-write"], ids=["upload", "local-write"])
def test_with_wait_for_upload_all_ranks_wait_together_longer_than_the_process_group_timeout(
    tmp_path: Path, slow: str
) -> None:
    """The upload, or rank 0's write of the checkpoint to its disk, takes twice the process group's timeout: the
    ranks wait together (polling), nobody sits in a collective for its length or times out, and the checkpoint step
    returned only once the agent reported it durable."""
    rank0, rank1 = results(start_two_ranks(tmp_path, WAIT_TWO_RANKS, slow))
    assert rank0["stopped"] is None and rank1["stopped"] is None
    assert rank0["last"] == rank1["last"] == 400  # both trained to the end
    assert len(rank0["saved"]) == 1 and rank0["saved"][0] >= 20
    assert rank0["durable"] is True


def test_with_wait_for_upload_a_notice_on_another_rank_ends_the_wait_and_stops_both(tmp_path: Path) -> None:
    """The agent never reports; a SIGTERM on rank 1 during the wait stops both ranks at the checkpoint's step,
    whose checkpoint rank 0 has on disk (the emergency checkpoint)."""
    rank0, rank1 = results(start_two_ranks(tmp_path, WAIT_TWO_RANKS, "notice"))
    assert rank0["stopped"] is not None and rank1["stopped"] == rank0["stopped"]
    assert rank0["saved"] == [rank0["stopped"]]


def test_a_failed_checkpoint_write_leaves_no_half_written_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A write that fails (a full disk) kept its ``.tmp-<step>-<pid>``: the next save then found the disk fuller."""

    def disk_full(obj: Any, f: Any) -> None:
        f.write(b"half a checkpoint")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(torch, "save", disk_full)
    helper = checkpointer(tmp_path, wait=False)
    helper.save(1)
    with pytest.raises(RuntimeError, match=r"writing the checkpoint failed: .*No space left on device"):
        helper.wait()
    assert sorted(p.name for p in tmp_path.iterdir() if p.name != STATE_DIR) == []


def test_the_agent_removes_what_killed_writers_and_restores_left_before_an_attempt(tmp_path: Path) -> None:
    """A trainer SIGKILLed mid-write (after the grace, or on a lost peer) leaves ``.tmp-<step>-<pid>``, a new pid
    each attempt: across restarts they filled the disk. Checkpoints and the trainer's own files stay."""
    from spot_training.agent.local_checkpoints import remove_partial_writes

    for name in (".tmp-7-4242", ".tmp-8-4343", ".restore-6-x1y2", "6", ".spot-training"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "state.pt").write_bytes(b"x")
    (tmp_path / "model.bin").write_bytes(b"flat")
    remove_partial_writes(str(tmp_path))
    assert sorted(p.name for p in tmp_path.iterdir()) == [".spot-training", "6", "model.bin"]


def test_a_sharded_model_is_refused_in_one_line_not_saved_as_rank_0s_shard(tmp_path: Path) -> None:
    """FSDP2 (``fully_shard``) makes every parameter a DTensor, each rank holding a shard: the helper refuses it in
    one line. Without the refusal, the helper would save rank 0's shard as the whole model and load it on every rank:
    training would resume from wrong weights, and nothing would say so. One process group of one rank (an in-memory
    store: no sockets) is enough to shard."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 1))
        fully_shard(model, mesh=init_device_mesh("cpu", (1,)))
        with pytest.raises(ValueError) as refused:
            Checkpointer(model, directory=str(tmp_path), handle_sigterm=False)
    finally:
        dist.destroy_process_group()
    assert str(refused.value) == (
        "Checkpointer saves rank 0's copy of the state and loads it on every rank; its parameter 0.weight is a "
        "DTensor (fully_shard, tensor parallelism), so each rank holds a shard and the others' would be lost. It "
        "supports one process and DistributedDataParallel; save a sharded model with torch.distributed.checkpoint "
        "(docs/concepts/checkpoint-protocol.md)"
    )
    assert list(tmp_path.iterdir()) == []


def test_fsdp_wrapping_anywhere_in_the_model_is_refused_and_an_object_with_a_state_dict_is_not() -> None:
    """FSDP1 keeps FlatParameters, not DTensors: a wrapped submodule, or FSDP under torch.compile, is refused by name.
    A check for DTensors alone would let it through, and rank 0's lone full-state-dict call (a collective) would hang
    the first save."""
    import torch.distributed as dist
    from spot_training.checkpoint import _sharded
    from torch.distributed.fsdp import FullyShardedDataParallel

    class Duck:  # anything with state_dict/load_state_dict is a model, not refused
        def state_dict(self) -> dict[str, Any]:
            return {}

    assert _sharded(Duck()) is None
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        nested = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 1))
        assert _sharded(nested) is None
        nested[0] = FullyShardedDataParallel(nested[0], device_id=torch.device("cpu"))
        assert _sharded(nested) == "0 is wrapped in FullyShardedDataParallel"
        compiled = torch.compile(FullyShardedDataParallel(torch.nn.Linear(4, 4), device_id=torch.device("cpu")))
        assert _sharded(compiled) == "_orig_mod is wrapped in FullyShardedDataParallel"
    finally:
        dist.destroy_process_group()


def test_a_restored_state_is_not_saved_again_at_the_first_step(tmp_path: Path) -> None:
    """The restore's load time is the first cost estimate of the Young/Daly interval: the interval is above 0, and
    the first save waits for it. With no measured cost the interval would be 0: a node that had just restored a
    checkpoint (already durable in S3) would write and upload the same state again at its first step."""
    first = Checkpointer(torch.nn.Linear(2, 2), directory=str(tmp_path), interval_s=0.0, handle_sigterm=False)
    assert first.step(5) is False  # saved: its interval is 0
    first.close()
    assert first.local_steps() == [5]
    resumed = Checkpointer(torch.nn.Linear(2, 2), directory=str(tmp_path), handle_sigterm=False)  # Young/Daly
    restored = resumed.restore()
    assert restored is not None and restored.step == 5
    assert resumed._interval() > 0
    assert resumed.step(6) is False
    resumed.close()
    assert resumed.local_steps() == [5]  # no copy of the restored state at step 6
