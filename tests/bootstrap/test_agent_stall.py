"""The stall watchdog (job.stall_timeout_s): a hung trainer (a DataLoader deadlock, a collective that never returns)
would keep the node billed forever if the agent waited only for the trainer's exit, a notice, a stop or a lost peer.
A job with no progress for the timeout (no output line and no checkpoint write on any node, no new durable
checkpoint) has its trainer ended and counted like a failed one. Against moto; the agent runs in-process with a
small trainer in place of torchrun, and SPOT_TRAINING_TEST_STALL_TIMEOUT_S holds the timeout below the job's 300 s
minimum."""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from spot_training.agent.checkpoint_store import CheckpointStore
from spot_training.agent.stall import StallWatch

from .conftest import Cluster, address_map
from .test_agent_notice import agent_for, raising, store_of

STALL_S = 3  # SPOT_TRAINING_TEST_STALL_TIMEOUT_S
# For a real torchrun: its start-up (1.1-1.3 s idle, 3 s and more on a loaded 2-core runner) counts as silence
TORCHRUN_STALL_S = 15
# Silent for <quiet> s (less than the timeout), prints <lines> lines, one every <every> s (longer in all than the
# timeout: output is progress), then hangs silently for <hang> s (bounded: a trainer the agent does not end exits 0
# by itself, and the test fails).
CHATTY_THEN_HUNG = """
import os, sys, time
quiet, lines, every, hang = float(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
attempt = os.environ["SPOT_TRAINING_ATTEMPT"]
time.sleep(quiet)
for i in range(lines):
    print(f"attempt {attempt} step {i}", flush=True)
    time.sleep(every)
print(f"attempt {attempt} hangs", flush=True)
time.sleep(hang)
"""
# Prints nothing; saves a flat checkpoint (write, then rename) every <every> s until <seconds> have passed, then
# writes how many saves and how long it ran to <report> and exits 0.
QUIET_SAVER = """
import os, sys, time
every, seconds, report = float(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
ckpt = os.environ["SPOT_TRAINING_CHECKPOINT_DIR"]
start, saves = time.monotonic(), 0
while time.monotonic() - start < seconds:
    saves += 1
    with open(os.path.join(ckpt, ".model.tmp"), "w") as f:
        f.write(f"state {saves}")
    os.replace(os.path.join(ckpt, ".model.tmp"), os.path.join(ckpt, "model.bin"))
    time.sleep(every)
with open(report, "w") as f:
    f.write(f"{saves} {time.monotonic() - start:.1f}")
"""


def stall_agent(
    cluster: Cluster,
    tmp_path: Path,
    trainer: list[str],
    monkeypatch: pytest.MonkeyPatch,
    attempts: int,
    agents_env: bool = False,
) -> Any:
    """The agent of the cluster's node running ``trainer`` as its torchrun, for at most ``attempts`` attempts (one
    more fails the test instead of training again), with its job and the lines it logs. ``agents_env``: the trainer
    gets the environment the agent's torchrun_command gives torchrun (else this process's)."""
    monkeypatch.setenv("SPOT_TRAINING_TEST_STALL_TIMEOUT_S", str(STALL_S))
    agent, job, lines = agent_for(cluster)
    job.checkpoint_dir = str(tmp_path / "ckpt")
    agent.rendezvous.world_file = str(tmp_path / "world.json")
    if agents_env:
        torchrun_command = agent.rendezvous.torchrun_command
        monkeypatch.setattr(
            agent.rendezvous, "torchrun_command", lambda job, peers: (trainer, torchrun_command(job, peers)[1])
        )
    else:
        env = {**os.environ, "SPOT_TRAINING_STORE_BIND_ADDRESS": "127.0.0.1"}
        monkeypatch.setattr(agent.rendezvous, "torchrun_command", lambda job, peers: (trainer, env))
    run = agent.attempt

    def attempt(job: Any, group: str, code_dir: str, store: Any, number: int) -> Any:
        if number >= attempts:
            raise AssertionError(f"training attempt {number}: expected at most {attempts}:\n" + "\n".join(lines))
        return run(job, group, code_dir, store, number)

    agent.attempt = attempt
    return agent, job, lines


@pytest.mark.parametrize("max_restarts", [0, 1])
def test_a_trainer_that_hangs_silently_is_ended_and_counted_as_a_failure(
    make_cluster: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, max_restarts: int
) -> None:
    cluster: Cluster = make_cluster(nodes=1, max_restarts=max_restarts, interruption_grace_s=5)
    cluster.submit("job-hung", {"train.py": ""}, "python train.py")
    # 1 s of silence (the clock must start with the trainer, not before), 4 s of output, then silence
    trainer = [sys.executable, "-c", CHATTY_THEN_HUNG, "1", "16", "0.25", "60"]
    agent, job, lines = stall_agent(cluster, tmp_path, trainer, monkeypatch, attempts=max_restarts + 1)
    find_peers = agent.rendezvous.wait_for_peers

    def slow_peers(group: str, job: Any) -> Any:  # longer than the timeout: no trainer runs yet, it does not count
        time.sleep(STALL_S + 0.5)
        return find_peers(group, job)

    agent.rendezvous.wait_for_peers = slow_peers

    assert agent.attempts(job, cluster.group, str(tmp_path), store_of(agent, job)) == 1

    stalled = f"trainer made no progress (no output, no checkpoint write) for {STALL_S} s"
    reason = f"{stalled} (job.stall_timeout_s) after {max_restarts} restart(s) without a new checkpoint"
    expected: list[str] = []
    for attempt in range(max_restarts + 1):  # the clock starts anew with each attempt's trainer
        expected += [
            f"stall timeout {STALL_S} s (SPOT_TRAINING_TEST_STALL_TIMEOUT_S)",
            f"[trainer {agent.node.instance_id}] attempt {attempt} step 0",
            f"[trainer {agent.node.instance_id}] attempt {attempt} step 15",  # output kept it going past the timeout
            f"[trainer {agent.node.instance_id}] attempt {attempt} hangs",
            f"{stalled}: ending it (job.stall_timeout_s)",
            "stall watchdog: sending SIGTERM to the trainer, grace 5 s",
            f"{stalled} (job.stall_timeout_s); no new checkpoint; restarts without progress: "
            f"{attempt + 1}/{max_restarts}",
        ]
    expected.append(f"job job-hung FAILED: {reason}")
    assert [line for line in lines if line in expected] == expected, lines
    failed = cluster.marker("job-hung", "FAILED")
    assert failed is not None and failed["reason"] == reason
    assert cluster.desired_capacity() == 0
    synced = cluster.marker("job-hung", f"nodes/{agent.node.instance_id}/synced")
    assert synced is not None and (synced["rc"], synced["interrupted"]) == (-signal.SIGTERM, False)  # ended by us


def test_a_node_whose_torchrun_hangs_marks_the_job_failed_and_scales_the_group_to_zero(
    make_cluster: Any, make_nodes: Any
) -> None:
    """The whole node: user data, the agent and a real torchrun whose worker hangs after a few lines."""
    cluster: Cluster = make_cluster(nodes=1, max_restarts=0, interruption_grace_s=5)
    cluster.submit("job-torchrun-hung", {"train.py": CHATTY_THEN_HUNG}, "python train.py 0 3 0.1 120")
    (node,) = make_nodes(cluster)
    env = {"SPOT_TRAINING_TEST_STALL_TIMEOUT_S": str(TORCHRUN_STALL_S)}
    assert node.start(address_map([node]), **env).wait(120) == 1, node.text
    stalled = f"trainer made no progress (no output, no checkpoint write) for {TORCHRUN_STALL_S} s"
    assert node.text.count(f"{stalled}: ending it (job.stall_timeout_s)") == 1, node.text
    assert node.text.index("attempt 0 hangs") < node.text.index(f"{stalled}: ending it")
    failed = cluster.marker("job-torchrun-hung", "FAILED")
    assert failed is not None
    assert failed["reason"] == f"{stalled} (job.stall_timeout_s) after 0 restart(s) without a new checkpoint"
    assert node.text.count("training attempt") == 1
    assert cluster.desired_capacity() == 0


def test_a_trainer_quiet_on_stdout_that_keeps_writing_checkpoints_is_not_ended(
    make_cluster: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A fixed interval far beyond the run: after the first, no upload round holds the watchdog back; the
    # checkpoint writes alone keep the trainer going.
    cluster: Cluster = make_cluster(nodes=1, max_restarts=0, checkpoint_interval_s=3600)
    cluster.submit("job-quiet", {"train.py": ""}, "python train.py")
    report = tmp_path / "report"
    trainer = [sys.executable, "-c", QUIET_SAVER, "0.4", str(3 * STALL_S), str(report)]
    agent, job, lines = stall_agent(cluster, tmp_path, trainer, monkeypatch, attempts=1)

    assert agent.attempts(job, cluster.group, str(tmp_path), store_of(agent, job)) == 0

    assert f"stall timeout {STALL_S} s (SPOT_TRAINING_TEST_STALL_TIMEOUT_S)" in lines  # the watchdog was on
    assert not any(line.startswith("[trainer ") for line in lines), lines  # no output at all
    assert not any("no progress" in line or "stall watchdog" in line for line in lines), lines
    saves, ran = report.read_text().split()  # written only by a trainer that ran to its end
    assert int(saves) > 1 and float(ran) >= 3 * STALL_S
    assert cluster.marker("job-quiet", "DONE") is not None and cluster.marker("job-quiet", "FAILED") is None
    synced = cluster.marker("job-quiet", f"nodes/{agent.node.instance_id}/synced")
    assert synced is not None and synced["rc"] == 0


# Prints and saves nothing, sleeps <seconds>, then writes <report> and exits 0.
SILENT = """
import sys, time
time.sleep(float(sys.argv[1]))
open(sys.argv[2], "w").write("ran to its end")
"""


def time_trainer(agent: Any, around: Callable[[], contextlib.AbstractContextManager[None]]) -> list[float]:
    """Each of the agent's trainer runs from now on inside ``around()``; the list gets how long each took."""
    run_trainer, timed = agent.trainer.run, list[float]()

    def timed_run(*args: Any) -> Any:
        started = time.monotonic()
        try:
            with around():
                return run_trainer(*args)
        finally:
            timed.append(time.monotonic() - started)

    agent.trainer.run = timed_run
    return timed


def run_silent_beside(
    make_cluster: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, job_id: str, seconds: int, peer: Any
) -> Any:
    """A silent trainer (no output, no checkpoint) running ``seconds`` on this node while ``peer(done, cluster, job,
    store, state)`` plays another node of the job on a thread (its checkpoint store and a state file to upload; it
    returns once ``done`` is set). The trainer must run to its end: never ended, the job DONE."""
    cluster: Cluster = make_cluster(nodes=1, max_restarts=0)
    cluster.submit(job_id, {"train.py": ""}, "python train.py")
    report = tmp_path / "report"
    agent, job, lines = stall_agent(
        cluster, tmp_path, [sys.executable, "-c", SILENT, str(seconds), str(report)], monkeypatch, attempts=1
    )
    peer_log: list[str] = []
    store = CheckpointStore(cluster.aws.s3, job.bucket, f"{job.job_prefix}ckpt/", job.job_id, peer_log.append)
    state = tmp_path / "state.pt"
    state.write_text("rank 0's state")
    done = threading.Event()
    thread = threading.Thread(target=peer, args=(done, cluster, job, store, state), daemon=True)
    thread.start()
    try:
        assert agent.attempts(job, cluster.group, str(tmp_path), store_of(agent, job)) == 0
    finally:
        done.set()
        thread.join(timeout=30)
    assert f"stall timeout {STALL_S} s (SPOT_TRAINING_TEST_STALL_TIMEOUT_S)" in lines  # the watchdog was on
    assert not any("no progress" in line or "stall watchdog" in line for line in lines), lines
    assert report.read_text() == "ran to its end"
    assert cluster.marker(job_id, "DONE") is not None and cluster.marker(job_id, "FAILED") is None
    return cluster, agent


def test_a_node_whose_trainer_is_silent_goes_on_while_the_jobs_checkpoints_become_durable(
    make_cluster: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A script that prints and saves on rank 0 only: on the other nodes the trainer shows neither. The job's
    checkpoints that rank 0's node makes durable in S3 meanwhile keep their trainers going."""

    def rank_0_node_saves(done: threading.Event, cluster: Any, job: Any, store: Any, state: Path) -> None:
        for step in range(1, 6 * STALL_S):  # one durable checkpoint a second, as long as the trainer runs (bounded)
            if done.wait(1.0):
                return
            store.upload(step, {"state.pt": str(state)}, "step")

    run_silent_beside(make_cluster, tmp_path, monkeypatch, "job-silent", 3 * STALL_S, rank_0_node_saves)


# Prints a short line every <every> s without flushing, for <seconds>, then writes <report> and exits 0.
UNFLUSHED = """
import sys, time
every, seconds, report = float(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
start, step = time.monotonic(), 0
while time.monotonic() - start < seconds:
    print(f"step {step}")
    step += 1
    time.sleep(every)
open(report, "w").write("ran to its end")
"""


def test_a_trainer_that_prints_short_lines_without_flushing_is_not_ended(
    make_cluster: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through a pipe Python block-buffers print() (8 KiB): nothing set PYTHONUNBUFFERED, so a script printing a
    short line a minute reached the agent every ~80 minutes and the watchdog ended it. The agent's own environment
    for torchrun, with PYTHONUNBUFFERED cleared here (this sandbox sets it, which hid the bug)."""
    monkeypatch.delenv("PYTHONUNBUFFERED", raising=False)
    cluster: Cluster = make_cluster(nodes=1, max_restarts=0)
    cluster.submit("job-unflushed", {"train.py": ""}, "python train.py")
    report = tmp_path / "report"
    trainer = [sys.executable, "-c", UNFLUSHED, "0.2", str(3 * STALL_S), str(report)]
    agent, job, lines = stall_agent(cluster, tmp_path, trainer, monkeypatch, attempts=1, agents_env=True)

    assert agent.attempts(job, cluster.group, str(tmp_path), store_of(agent, job)) == 0

    assert f"stall timeout {STALL_S} s (SPOT_TRAINING_TEST_STALL_TIMEOUT_S)" in lines  # the watchdog was on
    assert not any("no progress" in line or "stall watchdog" in line for line in lines), lines
    assert f"[trainer {agent.node.instance_id}] step 0" in lines
    assert report.read_text() == "ran to its end"
    assert cluster.marker("job-unflushed", "DONE") is not None


def test_a_job_sets_pythonunbuffered_for_its_trainer_unless_it_is_set(
    make_cluster: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    cluster: Cluster = make_cluster(nodes=1)
    cluster.submit("job-env", {"train.py": ""}, "python train.py")
    agent, job, _ = agent_for(cluster)
    monkeypatch.delenv("PYTHONUNBUFFERED", raising=False)
    assert agent.rendezvous.torchrun_command(job, cluster.instances())[1]["PYTHONUNBUFFERED"] == "1"
    monkeypatch.setenv("PYTHONUNBUFFERED", "")  # the operator's choice: kept
    assert agent.rendezvous.torchrun_command(job, cluster.instances())[1]["PYTHONUNBUFFERED"] == ""


def test_an_agent_whose_trainer_prints_writes_its_progress_marker_at_most_every_quarter_timeout(
    make_cluster: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What tells the job's other nodes, whose trainers may show nothing, that this one makes progress."""
    cluster: Cluster = make_cluster(nodes=1, max_restarts=0)
    cluster.submit("job-marks", {"train.py": ""}, "python train.py")
    trainer = [sys.executable, "-c", UNFLUSHED, "0.05", str(2 * STALL_S), str(tmp_path / "report")]
    agent, job, lines = stall_agent(cluster, tmp_path, trainer, monkeypatch, attempts=1, agents_env=True)
    written: list[float] = []  # the agent's own time of each mark (its clock read before the PUT)
    puts: list[str] = []
    put_marker, mark = agent.markers.put_marker, StallWatch.mark

    def recording_put(job: Any, name: str, body: Any) -> None:
        if name == f"nodes/{agent.node.instance_id}/progress":
            puts.append(name)
        put_marker(job, name, body)

    def recording_mark(watch: StallWatch) -> None:
        before = watch.marked_at
        mark(watch)
        if watch.marked_at != before:
            written.append(watch.marked_at)

    monkeypatch.setattr(agent.markers, "put_marker", recording_put)
    monkeypatch.setattr(StallWatch, "mark", recording_mark)

    assert agent.attempts(job, cluster.group, str(tmp_path), store_of(agent, job)) == 0

    assert len(written) >= 3, (written, lines)  # printing for 2 timeouts: about every quarter of one
    assert len(puts) == len(written)  # each mark is one PUT of the marker
    gaps = [b - a for a, b in itertools.pairwise(written)]
    assert min(gaps) >= STALL_S / 4, gaps
    assert cluster.marker("job-marks", f"nodes/{agent.node.instance_id}/progress") is not None


def test_a_silent_node_goes_on_while_a_peer_makes_progress_with_checkpoints_further_apart_than_the_timeout(
    make_cluster: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rank 0 prints and saves on another node (the project's own example does so): this node's trainer shows
    nothing, and the job's checkpoints come further apart than the timeout. The peer's progress marker (written
    here as its agent would) keeps this trainer going."""

    def peer_node(done: threading.Event, cluster: Any, job: Any, store: Any, state: Path) -> None:
        for tick in range(1, 20 * STALL_S):  # a progress marker every half second, a checkpoint every 2 timeouts
            if done.wait(0.5):
                return
            cluster.aws.s3.put_object(Bucket=job.bucket, Key=f"{job.job_prefix}nodes/i-peer/progress", Body=b"{}")
            if tick % (4 * STALL_S) == 0:
                store.upload(tick, {"state.pt": str(state)}, "step")

    cluster, agent = run_silent_beside(make_cluster, tmp_path, monkeypatch, "job-peer", 4 * STALL_S, peer_node)
    assert cluster.marker("job-peer", f"nodes/{agent.node.instance_id}/progress") is None  # it showed nothing itself


def test_a_job_where_no_node_makes_progress_is_ended(
    make_cluster: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A peer's marker from before this trainer started and its last ones early in the run: once none is newer
    than the timeout, the trainer is ended."""
    cluster: Cluster = make_cluster(nodes=1, max_restarts=0, interruption_grace_s=5)
    cluster.submit("job-none", {"train.py": ""}, "python train.py")
    report = tmp_path / "report"
    agent, job, lines = stall_agent(
        cluster, tmp_path, [sys.executable, "-c", SILENT, str(8 * STALL_S), str(report)], monkeypatch, attempts=1
    )

    def peer_marks() -> None:
        cluster.aws.s3.put_object(Bucket=job.bucket, Key=f"{job.job_prefix}nodes/i-peer/progress", Body=b"{}")

    peer_marks()  # an earlier attempt's

    @contextlib.contextmanager
    def marked_early() -> Iterator[None]:  # the peer shows progress 2.5 s into the trainer, then hangs
        timer = threading.Timer(2.5, peer_marks)
        timer.start()
        try:
            yield
        finally:
            timer.cancel()

    timed = time_trainer(agent, marked_early)

    assert agent.attempts(job, cluster.group, str(tmp_path), store_of(agent, job)) == 1

    stalled = f"trainer made no progress (no output, no checkpoint write) for {STALL_S} s"
    assert f"{stalled}: ending it (job.stall_timeout_s)" in lines
    assert not report.exists()  # ended, not run to its end
    # The peer's marker 2.5 s in counted (S3 times are whole seconds: at least 1.5 s in), then nothing did.
    assert STALL_S + 1 <= timed[0] < 8 * STALL_S, timed
    failed = cluster.marker("job-none", "FAILED")
    assert failed is not None and failed["reason"].startswith(stalled)


def test_a_listing_that_keeps_failing_counts_as_no_progress_after_a_further_timeout(
    make_cluster: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A watchdog that cannot list the job's checkpoints does not ask again every poll forever (logging each time):
    after a further timeout of failures it counts as no progress, so an S3 outage does not keep a hung trainer, and
    every node, running."""
    cluster: Cluster = make_cluster(nodes=1, max_restarts=0, interruption_grace_s=5)
    cluster.submit("job-unlisted", {"train.py": ""}, "python train.py")
    report = tmp_path / "report"
    agent, job, lines = stall_agent(
        cluster, tmp_path, [sys.executable, "-c", SILENT, str(8 * STALL_S), str(report)], monkeypatch, attempts=1
    )
    store = store_of(agent, job)
    failing = threading.Event()  # only while the trainer runs: the restore and the end need S3

    def failing_while_training(method: Any, operation: str) -> Any:
        refused = raising(operation)

        def call(*args: Any, **kwargs: Any) -> Any:
            return refused() if failing.is_set() else method(*args, **kwargs)

        return call

    monkeypatch.setattr(
        agent.markers, "node_markers", failing_while_training(agent.markers.node_markers, "ListObjectsV2")
    )
    monkeypatch.setattr(store, "newest_complete", failing_while_training(store.newest_complete, "ListObjectsV2"))

    @contextlib.contextmanager
    def s3_down() -> Iterator[None]:
        failing.set()
        try:
            yield
        finally:
            failing.clear()

    timed = time_trainer(agent, s3_down)

    assert agent.attempts(job, cluster.group, str(tmp_path), store) == 1

    failures = [line for line in lines if line.startswith("stall watchdog: could not list")]
    assert len(failures) == 1, failures  # at most one line a minute, not one a poll
    assert (
        failures[0].startswith("stall watchdog: could not list the nodes' progress markers (")
        and "SlowDown" in (failures[0])
    )
    gave_up = f"stall watchdog: no answer listing the job's progress for {STALL_S} s: counted as no progress"
    stalled = f"trainer made no progress (no output, no checkpoint write) for {STALL_S} s"
    assert lines.index(gave_up) < lines.index(f"{stalled}: ending it (job.stall_timeout_s)"), lines
    assert not report.exists()
    assert 2 * STALL_S <= timed[0] < 8 * STALL_S, timed
    assert cluster.marker("job-unlisted", "FAILED") is not None
