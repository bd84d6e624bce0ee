"""The interruption matrix (tests/emulator/matrix.py), part: (c) hard terminations with no notice, with and without
waiting for uploads; (i) a notice while a node restores.
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from emulator import EmulatedCloud
from emulator.demo import JobRun
from tests.emulator.matrix import (  # the cases' helpers
    _DURABLE,
    _PEERS,
    _RESTORING,
    INTERVAL_STEPS,
    assert_done_and_clean,
    assert_nothing_redone,
    in_flight,
    rank0_node,
    run_case,
    wait_for_upload_in_flight,
)
from tests.emulator.matrix import cloud as cloud  # a module-scoped fixture: a stack deployed for this module
from tests.emulator.matrix import reference as reference  # a module-scoped fixture
from trainctl import jobs

pytestmark = pytest.mark.slow


def test_c_hard_termination_without_notice(cloud: EmulatedCloud, reference: Any) -> None:
    """The node of rank 0 (it writes and uploads the checkpoints) loses power: its unsynced work and unshipped
    logs are gone. The survivor notices its peer left, the replacement restores; at most one interval redone."""
    facts: dict[str, Any] = {}

    def scenario(run: JobRun) -> None:
        first = run.wait_durable(0)
        facts["durable_at_kill"] = run.wait_durable(first + 1)
        assert facts["durable_at_kill"] < run.planned_steps(), "the job reached its end before the power-off"
        victim = run.checkpoint_writer()
        run.wait_for_replacement(run.power_off(victim))

    # The kill comes after the agent's sync poll, the upload and the test's poll: at most one interval redone needs
    # it within about 2.3 s of the save; polling every 0.25 s, not 1 s, leaves room on a loaded runner. Slower steps
    # keep the kill mid-training when other tests share the cores (pytest-xdist).
    case = run_case(
        cloud, "c-power-off", scenario, step_sleep_s=0.3, node_env={"SPOT_TRAINING_POLL_INTERVAL_S": "0.25"}
    )
    assert_done_and_clean(cloud, case, reference)
    (kill,) = case.summary.events
    assert kill.kind == "power-off"
    markers = jobs.node_markers(cloud.client, case.ref, case.job_id)
    assert "leaving" not in markers[kill.instance_id]  # it never knew
    assert facts["durable_at_kill"] < case.summary.steps_trained  # it struck mid-training
    restart = next(r for r in case.summary.restarts if r.at > kill.at)
    assert restart.resumed_from >= facts["durable_at_kill"]  # from the newest durable checkpoint (or newer)
    assert 0 <= restart.steps_redone <= INTERVAL_STEPS
    assert all(r.steps_redone <= INTERVAL_STEPS for r in case.summary.restarts)


def test_c_hard_termination_mid_upload_loses_at_most_one_interval_with_wait_for_upload(
    cloud: EmulatedCloud, reference: Any
) -> None:
    """(c) at the worst moment: the node of rank 0 loses power while a checkpoint uploads (objects in S3, no
    manifest; uploads held by SPOT_TRAINING_TEST_UPLOAD_DELAY_S). With the job's ``checkpoint_wait_for_upload``
    training waited for that upload, so exactly one interval is redone: from the last durable checkpoint to the
    step of the one in flight, and not a step beyond it. (By default training goes on during the upload and those
    steps are lost too: the README's trade-off.)"""
    facts: dict[str, Any] = {}

    def scenario(run: JobRun) -> None:
        writer, durable, flying = wait_for_upload_in_flight(cloud, run)
        kill = run.power_off(writer)
        facts.update(kill=kill, durable=durable, flying=max(flying), after=in_flight(cloud, run.ref, run.job_id))
        run.wait_for_replacement(kill)

    env = {"SPOT_TRAINING_TEST_UPLOAD_DELAY_S": "3"}
    case = run_case(cloud, "c-mid-upload", scenario, node_env=env, checkpoint_wait_for_upload=True)
    assert_done_and_clean(cloud, case, reference)
    (kill,) = case.summary.events
    assert kill.kind == "power-off"
    durable, flying = facts["durable"], facts["flying"]
    assert facts["after"].get(flying) == ["state.pt"]  # still in flight after the kill: it never became durable
    durable_before_kill = [int(m.group(1)) for ts, m in case.lines(_DURABLE) if ts < kill.at]
    assert max(durable_before_kill) == durable < flying
    restart = next(r for r in case.summary.restarts if r.at > kill.at)
    assert restart.resumed_from == durable
    # one interval: the steps between the last durable checkpoint and the one in flight, nothing trained past it
    assert restart.furthest_before == flying
    assert restart.steps_redone == flying - durable <= INTERVAL_STEPS
    assert all(r.steps_redone <= INTERVAL_STEPS for r in case.summary.restarts)


def test_i_notice_while_a_node_restores(cloud: EmulatedCloud, reference: Any) -> None:
    """After a notice, the replacement gets a notice of its own while it restores (restores held back by
    SPOT_TRAINING_TEST_RESTORE_DELAY_S): it leaves before its trainer starts instead of joining the rendezvous, the
    survivor, which already waits for it there, restarts without it, a second replacement restores; nothing is
    redone."""
    facts: dict[str, Any] = {}

    def scenario(run: JobRun) -> None:
        run.wait_durable(0)
        # The first notice goes to the node without rank 0: the survivor then holds the emergency checkpoint and
        # restores it locally at once (no held download), so it launches its trainer with the replacement ...
        survivor = rank0_node(run)  # the checkpoint writer; its step lines are shipped already (no 2 s log flush)
        replacement = run.wait_for_replacement(run.interrupt(next(i for i in run.running() if i != survivor)))

        def survivor_counts_on_it() -> bool:
            return any(
                stream.endswith("/" + survivor) and (m := _PEERS.search(msg)) and replacement.instance_id in m.group(1)
                for _, stream, msg in run.log_events()
            )

        def is_restoring() -> bool:
            return any(
                stream.endswith("/" + replacement.instance_id) and _RESTORING.search(msg)
                for _, stream, msg in run.log_events()
            )

        run.wait_for(survivor_counts_on_it, f"{survivor} to launch its trainer with {replacement.instance_id}")
        run.wait_for(is_restoring, f"{replacement.instance_id} to restore")
        # ... which gets its own notice while its restore is held
        second = run.interrupt(replacement.instance_id)
        run.wait_for_replacement(second)
        facts.update(second=second, survivor=survivor)

    # 10 s: the notice must land while the restore is held, after the "restoring" line reached CloudWatch Logs
    env = {"SPOT_TRAINING_TEST_RESTORE_DELAY_S": "10"}
    case = run_case(cloud, "i-restore-notice", scenario, node_env=env, step_sleep_s=0.25)  # room for the notices
    assert_done_and_clean(cloud, case, reference)
    leaver = facts["second"].instance_id
    assert [e.kind for e in case.summary.events] == ["notice", "notice"]
    # (if a loaded machine delays the notice past the restore, the check before the rendezvous catches it)
    assert case.lines(
        re.compile(r"during (checkpoint restore|peer discovery): leaving before the trainer starts"), leaver
    )
    assert not case.lines(re.compile(r"running: "), leaver)  # it never launched torchrun
    assert (jobs.marker(cloud.client, case.ref, case.job_id, f"nodes/{leaver}/leaving") or {}).get("trainer") is False
    assert case.lines(re.compile(r"left \S+: the group launches a replacement"), leaver)
    # Every trainer the other nodes launched after the first notice (the survivor's, the second replacement's)
    # either left the leaver out of its peers or, launched with it (the survivor's first, at least), restarted when it
    # went instead of waiting for it at the rendezvous until the join timeout; the last launch on each node, the one
    # that finished the job, did not count on it.
    after = case.summary.events[0].at
    left_early = re.compile(rf"peer {leaver} left on a notice before its trainer started: restarting")
    launches: dict[str, list[list[str]]] = {}  # stream -> the peers of each of its launches, in time order
    restarts: dict[str, int] = {}  # stream -> its restarts because the leaver went
    for ts, stream, msg in case.log:
        if ts < after or stream.endswith("/" + leaver):
            continue
        if m := _PEERS.search(msg):
            launches.setdefault(stream, []).append(m.group(1).split(", "))
        elif left_early.search(msg):
            restarts[stream] = restarts.get(stream, 0) + 1
    assert launches, "no trainer launched after the first notice"
    counted_on_it = {stream: sum(leaver in peers for peers in each) for stream, each in launches.items()}
    survivor = f"{case.job_id}/{facts['survivor']}"
    assert counted_on_it.get(survivor, 0) >= 1, launches  # the scenario waited for that launch
    assert restarts == {stream: n for stream, n in counted_on_it.items() if n}
    assert all(leaver not in each[-1] for each in launches.values()), launches
    assert len(case.summary.nodes) == 4  # 2 + the replacement that left + its replacement
    assert_nothing_redone(case)
