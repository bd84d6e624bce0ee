"""spot_training.launch's fixes of torchrun: its store sharing (``share_store``), which reads torch internals, and
its stop signal, which reached a worker's DataLoader processes too."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from spot_training.launch import share_store
from spot_training.proctree import kill_all, process_tree
from torch.distributed.elastic.rendezvous.api import RendezvousStoreInfo

from .conftest import BOOTSTRAP, free_port


class Store:
    """The calls share_store makes on the round's store."""

    def __init__(self) -> None:
        self.keys: dict[str, bytes] = {}

    def set(self, key: str, value: str) -> None:
        self.keys[key] = value.encode()

    def get(self, key: str) -> bytes:
        return self.keys[key]


def test_rank_0_writes_its_own_store_and_another_node_reads_it() -> None:
    store, old = Store(), RendezvousStoreInfo("10.0.0.9", 1111)  # the store of a rank 0 that has left
    handler = SimpleNamespace(
        _this_node=SimpleNamespace(addr="10.0.0.5"), _shared_tcp_store_server=SimpleNamespace(port=2222)
    )
    first = SimpleNamespace(rank=0, store=store, _bootstrap_store_info=old)
    share_store(handler, first)
    assert first._bootstrap_store_info == RendezvousStoreInfo("10.0.0.5", 2222)
    other_handler = SimpleNamespace(_bootstrap_store_info=old)
    other = SimpleNamespace(rank=1, store=store, _bootstrap_store_info=old)
    share_store(other_handler, other)
    assert other._bootstrap_store_info == other_handler._bootstrap_store_info == RendezvousStoreInfo("10.0.0.5", 2222)


def test_a_handler_without_the_internals_it_reads_leaves_torchs_own_behaviour(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Another torch (the default DLAMI's is older than 2.13) whose handler has no ``_shared_tcp_store_server``: the
    round goes on with torch's store info, instead of an AttributeError ending torchrun at every round."""
    old = RendezvousStoreInfo("10.0.0.9", 1111)
    info = SimpleNamespace(rank=0, store=Store(), _bootstrap_store_info=old)
    share_store(SimpleNamespace(_this_node=SimpleNamespace(addr="10.0.0.5")), info)
    assert info._bootstrap_store_info is old
    assert capsys.readouterr().err.startswith(
        "spot_training.launch: could not share the rendezvous store (AttributeError("
    )


# A trainer whose batches come from DataLoader worker processes, as nearly every real script's do.
DATALOADER_TRAINER = """
import subprocess, sys, time, torch
from torch.utils.data import DataLoader, Dataset
from spot_training.checkpoint import EXIT_INTERRUPTED, Checkpointer

class Pairs(Dataset):
    def __len__(self):
        return 10**6
    def __getitem__(self, i):
        return torch.randn(8), torch.randn(1)

helper = subprocess.Popen(["sleep", "600"])  # a process the script starts (an evaluation, a metrics server)
print(f"helper {helper.pid}", flush=True)
model = torch.nn.Linear(8, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
ckpt = Checkpointer(model, optimizer, interval_s=1e9)
step = 0
for x, y in DataLoader(Pairs(), batch_size=4, num_workers=2):
    loss = ((model(x) - y) ** 2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    step += 1
    if step == 20:
        print("step 20", flush=True)
    time.sleep(0.01)
    if ckpt.step(step):
        print(f"saved step {step}", flush=True)
        sys.exit(EXIT_INTERRUPTED)
"""


def test_a_stop_signal_reaches_the_training_process_alone_so_its_dataloader_survives_the_save(tmp_path: Path) -> None:
    """The agent SIGTERMs torchrun on a notice. Signalling each worker's whole process group, as torchrun does, would
    kill the DataLoader's worker processes and fail the training process at its next batch ("DataLoader worker ...
    killed by signal: Terminated") without its emergency checkpoint. The training process alone gets the signal: it
    saves and exits 143, and a process the script started is ended once it has."""
    script = tmp_path / "train.py"
    script.write_text(DATALOADER_TRAINER)
    checkpoints = tmp_path / "checkpoints"
    out = tmp_path / "out.txt"
    env = {
        **os.environ,
        "PYTHONPATH": str(BOOTSTRAP),
        "SPOT_TRAINING_CHECKPOINT_DIR": str(checkpoints),
        "SPOT_TRAINING_STORE_BIND_ADDRESS": "127.0.0.1",  # the rendezvous store on loopback
        "GLOO_SOCKET_IFNAME": "lo",
        "TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "60",
    }
    port = free_port("127.0.0.1")
    args = ["--nnodes=1", "--nproc-per-node=1", "--max-restarts=0", "--rdzv-backend=c10d"]
    with out.open("w") as sink:
        launcher = subprocess.Popen(
            [sys.executable, "-m", "spot_training.launch", *args, f"--rdzv-endpoint=127.0.0.1:{port}", str(script)],
            env=env, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        try:
            deadline = time.monotonic() + 120
            while "step 20" not in out.read_text() and launcher.poll() is None and time.monotonic() < deadline:
                time.sleep(0.2)
            assert "step 20" in out.read_text(), out.read_text()
            launcher.send_signal(signal.SIGTERM)  # as the agent's Trainer does
            launcher.wait(timeout=90)
        finally:
            kill_all(process_tree(launcher.pid))
    text = out.read_text()
    saved = re.search(r"^saved step (\d+)$", text, re.MULTILINE)
    assert saved is not None and "killed by signal" not in text, text
    assert (checkpoints / saved.group(1)).is_dir()
    started = re.search(r"^helper (\d+)$", text, re.MULTILINE)
    assert started is not None
    assert not running(int(started.group(1)))  # ended with its worker's group, as torch's group signal did


def running(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie no init has reaped yet does not)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except FileNotFoundError:
        return False
    return fields[0] != "Z"
