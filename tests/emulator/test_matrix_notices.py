"""The interruption matrix (tests/emulator/matrix.py), part: (b) a rebalance recommendation, then a notice; (d) a notice
while an upload is in flight; (f) both nodes at once.
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from emulator import EmulatedCloud
from emulator.demo import JobRun
from tests.emulator.matrix import (  # the cases' helpers
    _DURABLE,
    _INTERRUPTED,
    _RANK_STEP,
    assert_done_and_clean,
    assert_nothing_redone,
    in_flight,
    notices,
    rank0_node,
    run_case,
    wait_for_upload_in_flight,
)
from tests.emulator.matrix import cloud as cloud  # a module-scoped fixture: a stack deployed for this module
from tests.emulator.matrix import reference as reference  # a module-scoped fixture
from trainctl import jobs

pytestmark = pytest.mark.slow


def test_b_rebalance_recommendation_then_notice(cloud: EmulatedCloud, reference: Any) -> None:
    """A rebalance recommendation to the node *without* rank 0 still gets a checkpoint (the agents relay it);
    the notice that follows loses nothing. No periodic checkpoints: only the recommendation and the notice save."""
    facts: dict[str, Any] = {}

    def scenario(run: JobRun) -> None:
        run.wait_step(5)
        victim = next(i for i in run.running() if i != rank0_node(run))
        rebalance = run.recommend_rebalance(victim)
        facts["rebalance_step"] = saved = run.wait_durable(0)
        run.wait_step(saved + 3)  # train on, so the notice has something to save
        run.wait_for_replacement(run.interrupt(victim))
        facts.update(victim=victim, rebalance=rebalance)

    # The relay takes two agents' metadata polls and the notice one more: slower steps keep the notice mid-training
    # (at 0.15 s a step, a run whose relay took 4 s saw the notice only after the last step; at 0.3 s a step a loaded
    # runner's shipped logs, 2 s behind, could leave about 1.5 s: 0.4 s a step adds 4 s).
    case = run_case(cloud, "b-rebalance", scenario, checkpoint_interval_s=3600.0, step_sleep_s=0.4)
    assert_done_and_clean(cloud, case, reference)
    victim, rebalance, notice = facts["victim"], facts["rebalance"], notices(case)[0]
    assert notice.instance_id == victim and rebalance.at < notice.at
    assert case.lines(re.compile(r"rebalance recommendation .*asking the trainer for a checkpoint"), victim)
    relayed = case.lines(re.compile(rf"peer {victim} got a rebalance recommendation"))
    assert relayed and relayed[0][0] < notice.at
    durable = case.lines(_DURABLE)
    assert min(ts for ts, _ in durable) > rebalance.at  # nothing was saved before the recommendation ...
    before_notice = [int(m.group(1)) for ts, m in durable if ts < notice.at]
    assert before_notice == [facts["rebalance_step"]]  # ... and exactly its checkpoint before the notice
    assert_nothing_redone(case)


def test_d_notice_while_a_checkpoint_upload_is_in_flight(cloud: EmulatedCloud, reference: Any) -> None:
    """Uploads are held between their objects and their manifest (SPOT_TRAINING_TEST_UPLOAD_DELAY_S); the notice
    reaches the uploading node while S3 holds a checkpoint's objects without its manifest."""
    facts: dict[str, Any] = {}

    def scenario(run: JobRun) -> None:
        writer, newest, flying = wait_for_upload_in_flight(cloud, run)
        notice = run.interrupt(writer)
        facts["after_notice"] = in_flight(cloud, run.ref, run.job_id)
        facts.update(before_notice=flying, notice=notice, newest=newest)
        run.wait_for_replacement(notice)

    # held uploads lag 3 s behind: slower steps, so that the notice still lands mid-training
    env = {"SPOT_TRAINING_TEST_UPLOAD_DELAY_S": "3"}
    case = run_case(cloud, "d-upload", scenario, node_env=env, step_sleep_s=0.25)
    assert_done_and_clean(cloud, case, reference)
    notice = facts["notice"]
    flying = sorted(set(facts["before_notice"]) & set(facts["after_notice"]))
    assert flying, "no checkpoint was in flight across the notice"
    step = flying[-1]
    assert step > facts["newest"] and facts["after_notice"][step] == ["state.pt"]  # objects, no manifest
    # that upload completed after the notice (its manifest came last), then the emergency checkpoint
    completed = [ts for ts, m in case.lines(_DURABLE, notice.instance_id) if int(m.group(1)) == step]
    assert completed and completed[0] > notice.at
    assert step in case.manifest_steps
    emergency = [int(m.group(1)) for _, m in case.lines(_INTERRUPTED, after=notice.at)]
    assert emergency and emergency[0] > step and emergency[0] in case.manifest_steps
    assert_nothing_redone(case)


def test_f_both_nodes_interrupted_at_once(cloud: EmulatedCloud, reference: Any) -> None:
    facts: dict[str, Any] = {}

    def scenario(run: JobRun) -> None:
        run.wait_durable(0)
        first, second = run.running()
        events = [run.interrupt(first), run.interrupt(second)]
        run.wait_for(lambda: sum(n.booted_at > events[0].at for n in run.launcher.all_nodes()) >= 2, "two replacements")
        facts["originals"] = {first, second}

    case = run_case(cloud, "f-both", scenario)
    assert_done_and_clean(cloud, case, reference)
    originals = facts["originals"]
    assert {e.instance_id for e in notices(case)} == originals
    markers = jobs.node_markers(cloud.client, case.ref, case.job_id)
    assert {i for i, names in markers.items() if "leaving" in names} == originals
    assert len(case.summary.nodes) == 4
    # the job went on on two new nodes only: every later step line comes from a replacement's stream
    restart = case.summary.restarts[0]
    later = {stream.rsplit("/", 1)[1] for ts, stream, msg in case.log if ts > restart.at and _RANK_STEP.search(msg)}
    assert later and not later & originals
    assert_nothing_redone(case)
