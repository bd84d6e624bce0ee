"""``emulator.demo.restarts``: the parser behind every "nothing redone" and "at most one interval" assertion of the
emulator tests, on hand-made log lines in the shipped format (agent lines and ``[trainer ...]`` lines)."""

from __future__ import annotations

from emulator.demo import Restart, restarts

A, B, C = "job-1/i-aaa", "job-1/i-bbb", "job-1/i-ccc"


def agent(stream: str, message: str) -> str:
    return f"2026-11-25T04:19:57Z node-agent {stream.rsplit('/', 1)[1]} {message}"


def trainer(stream: str, message: str) -> str:
    return f"[trainer {stream.rsplit('/', 1)[1]}] {message}"


def launch(stream: str) -> str:
    return agent(stream, "running: /usr/bin/python -m spot_training.launch --nnodes=2:2 --nproc-per-node=1")


def step(stream: str, number: int, rank: int = 0) -> str:
    return trainer(stream, f"step {number} epoch 0 loss 2.2342 rank {rank}")


def steps(stream: str, first: int, last: int, start_s: float, rank: int = 0) -> list[tuple[float, str, str]]:
    """Steps ``first``..``last`` of one rank, one every 0.1 s from ``start_s``."""
    return [(start_s + 0.1 * (n - first), stream, step(stream, n, rank)) for n in range(first, last + 1)]


def fresh_start() -> list[tuple[float, str, str]]:
    """Both nodes launch at 1.0 s; rank 0 (on A) starts fresh and both ranks train steps 1..10 (to 1.9 s)."""
    return sorted(
        [
            (1.0, A, launch(A)),
            (1.0, B, launch(B)),
            (1.2, A, trainer(A, "starting fresh")),
            *steps(A, 1, 10, 1.0),
            *steps(B, 1, 10, 1.0, rank=1),
        ]
    )


def test_a_job_that_only_started_fresh_has_no_restart() -> None:
    assert restarts(fresh_start()) == []
    assert restarts([]) == []


def test_a_resume_from_the_emergency_checkpoint_redoes_nothing() -> None:
    events = [
        *fresh_start(),
        (2.0, A, trainer(A, "interrupted: checkpoint 10 saved, exiting")),
        (5.0, A, launch(A)),
        (5.0, C, launch(C)),
        (6.0, A, trainer(A, "resumed from step 10 (epoch 0, sample 640)")),
        *steps(A, 11, 15, 6.1),
    ]
    [restart] = restarts(sorted(events))
    assert restart == Restart(at=6.0, furthest_before=10, resumed_from=10)
    assert restart.steps_redone == 0


def test_steps_past_the_checkpoint_resumed_from_are_redone() -> None:
    """No notice: the ranks trained to step 10 (rank 1's lines: rank 0's node vanished with its unshipped logs), the
    newest durable checkpoint is step 6; the restart redoes steps 7..10."""
    events = [e for e in fresh_start() if e[1] != A or "step" not in e[2]] + [
        (5.0, B, launch(B)),
        (5.0, C, launch(C)),
        (6.0, C, trainer(C, "resumed from step 6 (epoch 0, sample 384)")),
    ]
    [restart] = restarts(sorted(events))
    assert restart == Restart(at=6.0, furthest_before=10, resumed_from=6)
    assert restart.steps_redone == 4


def test_the_step_an_interrupted_trainer_saved_counts_without_its_step_line() -> None:
    events = [
        *steps(A, 1, 4, 1.0),
        (1.5, A, trainer(A, "interrupted: checkpoint 5 saved, exiting")),
        (3.0, A, launch(A)),
        (3.5, A, trainer(A, "resumed from step 5 (epoch 0, sample 320)")),
    ]
    assert restarts(sorted(events)) == [Restart(at=3.5, furthest_before=5, resumed_from=5)]


def test_starting_fresh_after_steps_were_trained_redoes_them_all() -> None:
    """A hard kill before any checkpoint was durable: the restart trains from step 0 again."""
    events = [*fresh_start(), (5.0, B, launch(B)), (5.0, C, launch(C)), (5.5, B, trainer(B, "starting fresh"))]
    [restart] = restarts(sorted(events))
    assert restart == Restart(at=5.5, furthest_before=10, resumed_from=0)
    assert restart.steps_redone == 10


def test_several_restarts_each_against_the_furthest_step_before_its_own_launch() -> None:
    events = [
        *fresh_start(),
        (2.0, A, trainer(A, "interrupted: checkpoint 10 saved, exiting")),
        (5.0, A, launch(A)),
        (5.0, C, launch(C)),
        (5.5, A, trainer(A, "resumed from step 10 (epoch 0, sample 640)")),
        *steps(A, 11, 25, 5.6),  # to 7.0 s
        (8.0, A, launch(A)),  # no notice: the second restart resumes from durable step 20
        (8.5, A, trainer(A, "resumed from step 20 (epoch 0, sample 1280)")),
        *steps(A, 21, 30, 8.6),
        (10.0, A, trainer(A, "interrupted: checkpoint 30 saved, exiting")),
        (12.0, A, launch(A)),
        (12.5, A, trainer(A, "resumed from step 30 (epoch 1, sample 0)")),
    ]
    found = restarts(sorted(events))
    assert found == [
        Restart(at=5.5, furthest_before=10, resumed_from=10),
        Restart(at=8.5, furthest_before=25, resumed_from=20),
        Restart(at=12.5, furthest_before=30, resumed_from=30),
    ]
    assert [r.steps_redone for r in found] == [0, 5, 0]


def test_steps_of_the_new_run_stamped_before_its_resume_line_are_not_counted_before_it() -> None:
    """Lines of different nodes are stamped by different agents: a step of the resumed run on another node can
    carry an earlier time than the ``resumed from`` line, never an earlier one than rank 0's launch."""
    events = [
        *fresh_start(),
        (2.0, A, trainer(A, "interrupted: checkpoint 10 saved, exiting")),
        (5.0, A, launch(A)),
        (5.0, C, launch(C)),
        (5.8, C, step(C, 11, rank=1)),  # the new run's first step, on C, stamped before A's resume line
        (6.0, A, trainer(A, "resumed from step 10 (epoch 0, sample 640)")),
    ]
    assert restarts(sorted(events)) == [Restart(at=6.0, furthest_before=10, resumed_from=10)]


def test_without_a_launch_line_in_its_stream_the_resume_line_itself_is_the_cutoff() -> None:
    events = [*steps(A, 1, 8, 1.0), (3.0, B, trainer(B, "resumed from step 6 (epoch 0, sample 384)"))]
    events += steps(A, 9, 12, 3.5)
    assert restarts(sorted(events)) == [Restart(at=3.0, furthest_before=8, resumed_from=6)]
