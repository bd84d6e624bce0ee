"""The uninterrupted run interrupted jobs are compared with: the example on 2 local processes, same seed."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import torch

from emulator.demo import EXAMPLE_DIR

REPO = Path(__file__).resolve().parents[2]


def reference_weights(tmp: Path, epochs: int) -> dict[str, torch.Tensor]:
    """Final weights of the example trained for ``epochs`` by 2 processes on one node, never checkpointing."""
    out = tmp / "reference.pt"
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO / "bootstrap_scripts"),
        "SPOT_TRAINING_CHECKPOINT_DIR": str(tmp / "ckpt"),
        "SPOT_TRAINING_CHECKPOINT_INTERVAL_S": "1000000",
        "SPOT_TRAINING_STORE_BIND_ADDRESS": "127.0.0.1",
        "GLOO_SOCKET_IFNAME": "lo",
    }
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    cmd = [
        sys.executable, "-m", "spot_training.launch", "--nnodes=1", "--nproc-per-node=2", "--rdzv-backend=c10d",
        f"--rdzv-endpoint=127.0.0.1:{port}", "--rdzv-id=reference", "--local-addr=127.0.0.1",
        str(EXAMPLE_DIR / "train.py"), "--epochs", str(epochs), "--seed", "0", "--output", str(out),
    ]  # fmt: skip
    done = subprocess.run(cmd, env=env, cwd=tmp, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    return dict(torch.load(out))
