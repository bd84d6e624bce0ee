"""The example trainer resumes at the same data position on another number of processes (an elastic job).

Two processes under torchrun (the node agent's launcher, every store and socket on 127.0.0.1) train one epoch,
a SIGTERM stops them at an emergency checkpoint; one process resumes it and finishes the epoch. The samples
trained before and after add up to the epoch: none skipped, none trained twice.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from emulator.demo import EXAMPLE_DIR

BOOTSTRAP = Path(__file__).resolve().parent.parent / "bootstrap_scripts"
TRAIN_SAMPLES, BATCH = 1400, 32  # examples/digits/train.py: its training split and --batch-size
DEADLINE_S = 120.0


def _env(directory: Path) -> dict[str, str]:
    return dict(
        os.environ,
        PYTHONPATH=str(BOOTSTRAP),
        SPOT_TRAINING_CHECKPOINT_DIR=str(directory),
        SPOT_TRAINING_STORE_BIND_ADDRESS="127.0.0.1",
        GLOO_SOCKET_IFNAME="lo",
    )


def test_a_resume_on_fewer_processes_neither_skips_nor_repeats_samples(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # 0.05 s a step: the 11 steps after step 10 leave room for the signal to arrive on a loaded machine
    train = [str(EXAMPLE_DIR / "train.py"), "--epochs", "1", "--batch-size", str(BATCH), "--step-sleep-s", "0.05"]
    two = subprocess.Popen(
        [sys.executable, "-m", "spot_training.launch", "--nnodes=1", "--nproc-per-node=2", "--rdzv-backend=c10d",
         f"--rdzv-endpoint=127.0.0.1:{port}", "--local-addr=127.0.0.1", "--max-restarts=0", *train],
        env=_env(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )  # fmt: skip
    output: list[str] = []
    try:
        deadline = time.monotonic() + DEADLINE_S
        assert two.stdout is not None
        for line in two.stdout:  # bounded: the deadline below, and the kill in finally
            output.append(line)
            if re.match(r"(\[\S+\]:)?step 10 ", line) or time.monotonic() > deadline:
                break
        os.killpg(two.pid, signal.SIGTERM)  # torchrun passes it on to both processes
        out, _ = two.communicate(timeout=DEADLINE_S)
        output.append(out)
    finally:
        two.kill()
        two.wait()
    text = "".join(output)
    stopped = re.search(r"interrupted: checkpoint (\d+) saved", text)
    assert stopped is not None, text
    steps_on_two = int(stopped.group(1))

    one = subprocess.run(
        [sys.executable, *train], env=_env(tmp_path), capture_output=True, text=True, timeout=DEADLINE_S
    )
    assert one.returncode == 0, one.stderr
    resumed = re.search(r"resumed from step (\d+) \(epoch 0, sample (\d+)\)", one.stdout)
    finished = re.search(r"training finished at step (\d+)", one.stdout)
    assert resumed is not None and finished is not None, one.stdout
    assert int(resumed.group(1)) == steps_on_two
    trained = steps_on_two * 2 * BATCH + (int(finished.group(1)) - steps_on_two) * BATCH
    assert int(resumed.group(2)) == steps_on_two * 2 * BATCH
    assert TRAIN_SAMPLES - BATCH < trained <= TRAIN_SAMPLES  # the epoch, less a tail shorter than one batch
    assert re.search(rf"plan: {finished.group(1)} steps", one.stdout)
