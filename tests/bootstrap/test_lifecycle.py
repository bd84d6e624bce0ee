"""The node's lifecycle (``spot_training/agent/lifecycle.py``): the transition table, ``Lifecycle.move``, and the
agent publishing its state to ``nodes/<id>/state`` for ``trainctl status``.

The table is the one place the node's states and transitions are written down (the docs draw it): a state no node
can reach, a final state with a way out, or a state with no way to an end would be a node that never ends, billed.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from spot_training import protocol
from spot_training.agent import lifecycle
from spot_training.agent.lifecycle import BOOT, STATES, TERMINAL, TRANSITIONS, Lifecycle

from .conftest import Cluster, states
from .test_agent_notice import agent_for, raising
from .test_peer_discovery_errors import prepared


def reached_from(start: str) -> set[str]:
    found, frontier = {start}, [start]
    while frontier:
        source = frontier.pop()
        for a, b in TRANSITIONS:
            if a == source and b not in found:
                found.add(b)
                frontier.append(b)
    return found


def test_every_state_is_reachable_from_boot() -> None:
    assert reached_from(BOOT) == set(STATES)


def test_every_state_leads_to_an_end_and_the_ends_have_no_way_out() -> None:
    assert TERMINAL == {"DONE", "FAILED", "STOPPED", "LEAVING", "REFUSED"}
    assert [(a, b) for a, b in TRANSITIONS if a in TERMINAL] == []
    for name in set(STATES) - TERMINAL:
        assert reached_from(name) & TERMINAL, f"{name} has no way to an end"


def test_the_table_names_known_states_each_transition_with_its_reason() -> None:
    assert {s for pair in TRANSITIONS for s in pair} == set(STATES)
    assert TERMINAL <= set(STATES)
    assert all(reason.strip() for reason in [*TRANSITIONS.values(), *STATES.values()])
    assert all(a != b for a, b in TRANSITIONS)  # staying is no transition


def test_a_move_is_logged_once_in_one_format_and_published() -> None:
    lines: list[str] = []
    published: list[dict[str, object]] = []
    life = Lifecycle(lines.append)
    before = time.time()
    life.publish_to(published.append)
    assert published == [{"state": "BOOT", "previous": None, "since": life.since, "reason": "the agent starts"}]
    assert life.move(lifecycle.RESTORE, "attempt 0")
    assert lines == ["state BOOT -> RESTORE: attempt 0"]
    assert published[-1] == {"state": "RESTORE", "previous": "BOOT", "since": life.since, "reason": "attempt 0"}
    assert float(str(published[-1]["since"])) >= before
    assert not life.move(lifecycle.RESTORE, "again")  # the same state: no transition, no line
    assert len(lines) == 1 and len(published) == 2


@pytest.mark.parametrize(
    ("path", "wrong"),
    [
        ([], lifecycle.TRAIN),  # BOOT -> TRAIN skips the restore and the peers
        ([lifecycle.RESTORE, lifecycle.WAIT_FOR_PEERS, lifecycle.TRAIN, lifecycle.DRAIN, lifecycle.DONE], "RESTORE"),
        ([lifecycle.LEAVING], lifecycle.BOOT),
    ],
)
def test_a_transition_not_in_the_table_is_refused_and_logged_not_raised(path: list[str], wrong: str) -> None:
    lines: list[str] = []
    published: list[dict[str, object]] = []
    life = Lifecycle(lines.append)
    life.publish = published.append
    for name in path:
        assert life.move(name, "on the way")
    here, seen = life.state, len(published)
    assert not life.move(wrong, "a bug")
    assert life.state == here and len(published) == seen  # refused: the state stays, nothing new is published
    assert lines[-1] == f"refused state {here} -> {wrong}: a bug (not in the node's transition table: an agent bug)"
    assert states(lines) == ([BOOT, *path] if path else [])  # the refusal is no transition


def test_a_state_s3_does_not_take_is_logged_and_the_agent_goes_on(make_cluster: Any) -> None:
    cluster: Cluster = make_cluster(nodes=1)
    cluster.submit("state-run", {"train.py": ""}, "python train.py")
    agent, job, lines = agent_for(cluster)
    agent.node.s3.put_object = raising("PutObject")
    agent.lifecycle.publish_to(lambda record: agent.publish_state(job, record))
    assert agent.lifecycle.move(lifecycle.RESTORE, "attempt 0")
    failed = [line for line in lines if line.startswith("could not write this node's state ") and "SlowDown" in line]
    assert [line.split(" (")[0] for line in failed] == [
        "could not write this node's state BOOT",
        "could not write this node's state RESTORE",
    ]
    assert states(lines) == ["BOOT", "RESTORE"]


def test_a_notice_while_training_moves_the_node_through_drain_to_leaving(make_cluster: Any, tmp_path: Path) -> None:
    """In-process, the whole run: the trainer stops on a notice, the node hands its instance back; its states in the
    log, in order, and the last one in ``nodes/<id>/state``."""
    cluster: Cluster = make_cluster(nodes=1, interruption_grace_s=1)
    cluster.submit("notice-run", {"train.py": ""}, "python train.py")
    agent, job, lines, _ = prepared(cluster, tmp_path)

    def stopped_by_a_notice(*_: Any) -> tuple[int, bool]:
        agent.trainer.notice_at = time.monotonic()
        return 143, True

    agent.trainer.run = stopped_by_a_notice
    assert agent._run(job) == 0
    assert states(lines) == ["BOOT", "RESTORE", "WAIT_FOR_PEERS", "TRAIN", "DRAIN", "LEAVING"]
    assert "state TRAIN -> DRAIN: the trainer exited with code 143 (a notice or a stop)" in lines
    marker = cluster.marker("notice-run", f"nodes/{agent.node.instance_id}/state")
    assert marker is not None
    assert (marker["state"], marker["previous"]) == ("LEAVING", "DRAIN")
    assert marker["reason"] == "interrupted: the group replaces this instance"
    assert agent.node.instance_id not in [i for i, _ in cluster.instances()]


def test_the_final_states_of_a_job_are_named_as_its_end_markers() -> None:
    """The supervisor moves a node to the state named as the job's end marker it found or wrote."""
    assert (lifecycle.DONE, lifecycle.FAILED, lifecycle.STOPPED) == protocol.END_MARKERS
