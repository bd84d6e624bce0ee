"""The checkpoint helper's ``wait_for_upload``: whether training goes on before the agent made a checkpoint durable.

The agent's side is played by a thread doing what the node agent's sync does: see ``<dir>/<step>/state.pt``, then
report it durable in ``<dir>/.spot-training/sync-state.json``. Every wait is bounded.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
import torch
from spot_training.checkpoint import STATE_DIR, STATE_FILE, Checkpointer

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
