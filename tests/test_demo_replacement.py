"""``JobRun.wait_for_replacement``: a job that ends before the interrupted node is replaced fails at once with what to
change, instead of waiting out the scenario's deadline for a replacement that never boots (a group at 0 after DONE)."""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace
from typing import Any, Optional

import pytest

from emulator.cloud import EmulatorError
from emulator.demo import JobEvent, JobRun
from trainctl import jobs


class Launcher:
    """The launcher's two calls the wait uses: its nodes, and a poll of the predicate (bounded: 5 polls)."""

    def __init__(self, nodes: list[Any]) -> None:
        self.nodes, self.polls = nodes, 0

    def all_nodes(self) -> list[Any]:
        return list(self.nodes)

    def wait_for(self, predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
        for _ in range(5):
            self.polls += 1
            if predicate():
                return
        raise EmulatorError(f"timed out waiting for {what}")


def job_run(launcher: Launcher, monkeypatch: pytest.MonkeyPatch, markers: dict[str, dict[str, Any]]) -> JobRun:
    def marker(client: Any, ref: Any, job_id: str, name: str) -> Optional[dict[str, Any]]:
        assert job_id == "job-1"
        return markers.get(name)

    monkeypatch.setattr(jobs, "marker", marker)
    monkeypatch.setattr("trainctl.job_state.marker", marker)  # jobs.end_marker's
    return JobRun(lambda _: None, SimpleNamespace(), "job-1", launcher, 0.0, lambda _: None)  # type: ignore[arg-type]


def test_a_job_done_before_the_replacement_fails_at_once_saying_what_to_change(monkeypatch: pytest.MonkeyPatch) -> None:
    launcher = Launcher([SimpleNamespace(instance_id="i-old", booted_at=10.0)])
    run = job_run(launcher, monkeypatch, {"DONE": {}})
    with pytest.raises(EmulatorError) as failed:
        run.wait_for_replacement(JobEvent("notice", "i-old", 20.0))
    assert str(failed.value) == (
        "the job ended (DONE) before a replacement for i-old booted: give the job more epochs (--epochs) or a slower "
        "step (--step-sleep-s)"
    )
    assert launcher.polls == 1


def test_a_replacement_that_booted_is_returned_even_once_the_job_ended(monkeypatch: pytest.MonkeyPatch) -> None:
    new = SimpleNamespace(instance_id="i-new", booted_at=21.0)
    run = job_run(Launcher([SimpleNamespace(instance_id="i-old", booted_at=10.0), new]), monkeypatch, {"DONE": {}})
    assert run.wait_for_replacement(JobEvent("notice", "i-old", 20.0)) is new


def test_a_running_job_is_waited_on(monkeypatch: pytest.MonkeyPatch) -> None:
    launcher = Launcher([SimpleNamespace(instance_id="i-old", booted_at=10.0)])
    run = job_run(launcher, monkeypatch, {})
    with pytest.raises(EmulatorError, match="timed out waiting for a replacement for i-old"):
        run.wait_for_replacement(JobEvent("notice", "i-old", 20.0))
    assert launcher.polls == 5


def test_a_job_done_before_the_checkpoint_to_interrupt_after_fails_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """``--epochs 1``: the example's 21 steps end the job before step 40. The demo says so at once, instead of
    waiting out its 480 s deadline and then blaming the checkpoint ("timed out ... waiting for a checkpoint")."""
    launcher = Launcher([])
    run = job_run(launcher, monkeypatch, {"DONE": {}})
    monkeypatch.setattr(jobs, "checkpoints", lambda *_: [SimpleNamespace(step=21)])
    with pytest.raises(EmulatorError) as failed:
        run.wait_durable(40)
    assert str(failed.value) == (
        "the job ended (DONE) before a checkpoint of step 40 or later in S3: give the job more epochs (--epochs) or a "
        "slower step (--step-sleep-s)"
    )
    assert launcher.polls == 1
