"""The interruption matrix (tests/emulator/matrix.py), part: (e) a node powered off while it restores; (h) three
interruptions in one job; (j) the group ends a node with no notice.
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from bootstrap_scripts.spot_training.job_spec import DRAIN_HOOK
from emulator import EmulatedCloud
from emulator.demo import JobRun
from tests.emulator.matrix import (  # the cases' helpers
    _INTERRUPTED,
    _RESTORING,
    INTERVAL_S,
    INTERVAL_STEPS,
    assert_done_and_clean,
    assert_nothing_redone,
    notices,
    rank0_node,
    replacement_restoring,
    run_case,
)
from tests.emulator.matrix import cloud as cloud  # a module-scoped fixture: a stack deployed for this module
from tests.emulator.matrix import reference as reference  # a module-scoped fixture
from trainctl import jobs

pytestmark = pytest.mark.slow


def test_e_power_off_while_a_node_restores(cloud: EmulatedCloud, reference: Any) -> None:
    """After a notice, the replacement loses power while it restores (restores held back by
    SPOT_TRAINING_TEST_RESTORE_DELAY_S); the survivor drops it, a second replacement restores; the job goes on."""
    facts: dict[str, Any] = {}

    def scenario(run: JobRun) -> None:
        replacement = replacement_restoring(run)
        kill = run.power_off(replacement.instance_id)
        run.wait_for_replacement(kill)
        facts.update(kill=kill)

    case = run_case(cloud, "e-restore", scenario, node_env={"SPOT_TRAINING_TEST_RESTORE_DELAY_S": "6"})
    assert_done_and_clean(cloud, case, reference)
    kill = facts["kill"]
    assert [e.kind for e in case.summary.events] == ["notice", "power-off"]
    # it was restoring: it started and never finished, never resumed, never trained
    assert case.lines(_RESTORING, kill.instance_id)
    for unfinished in (r"step 'restore checkpoint' took", r"resume step:", r"running: "):
        assert not case.lines(re.compile(unfinished), kill.instance_id), unfinished
    assert "leaving" not in jobs.node_markers(cloud.client, case.ref, case.job_id).get(kill.instance_id, {})
    assert len(case.summary.nodes) == 4  # 2 + the replacement that died + its replacement
    assert all(0 <= r.steps_redone <= INTERVAL_STEPS for r in case.summary.restarts)
    assert case.summary.restarts[0].steps_redone == 0  # the notice


def test_h_three_interruptions_in_one_job(cloud: EmulatedCloud, reference: Any) -> None:
    """Three notices, each once training has made a checkpoint past the last restart: a plain node, the
    replacement of the first one, then the rendezvous host."""

    def scenario(run: JobRun) -> None:
        last = -1
        for number, pick in enumerate(("plain", "replacement", "host"), start=1):
            last = run.wait_durable(last + 1)
            assert last < run.planned_steps(), f"the job reached its end before interruption {number}"
            if pick == "replacement":
                victim = max(run.launcher.all_nodes(), key=lambda n: n.booted_at).instance_id
            else:
                victim = run.running()[0 if pick == "host" else -1]
            notice = run.interrupt(victim)
            run.wait_for_replacement(notice)
            last = max(last, run.durable_step())

    # 3 checkpoints past 3 restarts within 2 epochs (42 steps): a shorter interval than the other cases
    case = run_case(cloud, "h-three", scenario, checkpoint_interval_s=INTERVAL_S / 2, step_sleep_s=0.3)
    assert_done_and_clean(cloud, case, reference)
    sent = notices(case)
    assert len(sent) == 3 and len({e.instance_id for e in sent}) == 3
    assert len(case.summary.nodes) == 5
    stopped = [int(m.group(1)) for _, m in case.lines(_INTERRUPTED)]
    assert len(set(stopped)) == 3 and max(stopped) < case.summary.steps_trained  # three saves mid-training
    assert len({r.resumed_from for r in case.summary.restarts}) >= 3
    assert_nothing_redone(case)


def test_j_the_group_ends_a_node_with_no_spot_notice(cloud: EmulatedCloud, reference: Any) -> None:
    """Capacity rebalancing ends the old instance once its replacement runs, with no spot notice (a scale-in the
    same). The group's drain hook holds it in Terminating:Wait; its agent reads ``autoscaling/target-lifecycle-state``
    ``Terminated``, has the trainer save, makes that checkpoint durable and completes the hook: nothing is redone, and
    the instance goes once the agent is done, not after the hook's heartbeat. Without the hook, the node would be
    shut down mid-training and up to one interval redone."""
    facts: dict[str, Any] = {}

    def scenario(run: JobRun) -> None:
        run.wait_durable(0)
        # rank 0's node (its emergency checkpoint is the one the job resumes from; its step lines are shipped
        # already, where the checkpoint's "durable" line may take the agent's 2 s log flush)
        victim = rank0_node(run)
        run.wait_for_replacement(run.end_by_group(victim))

        def left_the_group() -> bool:
            return victim not in {i["InstanceId"] for i in jobs.group(run.client, run.ref)["Instances"]}

        run.wait_for(left_the_group, f"{victim} to leave its group")
        facts["victim"] = victim

    case = run_case(cloud, "j-ended-by-group", scenario, step_sleep_s=0.25)  # room for the group's end mid-training
    assert_done_and_clean(cloud, case, reference)
    victim = facts["victim"]
    assert [(e.kind, e.instance_id) for e in case.summary.events] == [("ended", victim)]
    assert case.lines(re.compile(r"its Auto Scaling group is ending this instance .*sending SIGTERM"), victim)
    assert case.lines(re.compile(rf"completed {DRAIN_HOOK}: \S+ terminates this instance now"), victim)
    assert "leaving" in jobs.node_markers(cloud.client, case.ref, case.job_id)[victim]
    [reservation] = cloud.client("ec2").describe_instances(InstanceIds=[victim])["Reservations"]
    assert reservation["Instances"][0]["State"]["Name"] == "terminated"
    assert_nothing_redone(case)
