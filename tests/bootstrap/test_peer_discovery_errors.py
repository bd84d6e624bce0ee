"""An AWS error while the agent looks for its peers, against moto.

DescribeInstances answers ``InvalidInstanceID.NotFound`` for an instance launched a moment ago (EC2 is eventually
consistent, and botocore does not retry that code); Auto Scaling may throttle. Such an error says nothing about the
job, so it must not reach the agent's catch-all (``FAILED`` and the group at 0): a failed poll is logged and polled
again until the join timeout; one that still fails then ends with that error in the reason.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import pytest
from botocore.awsrequest import AWSResponse
from botocore.exceptions import ClientError
from spot_training.agent import errors

from .conftest import Cluster, states
from .test_agent_notice import agent_for, tune

NOT_FOUND = "InvalidInstanceID.NotFound"


class NotFoundBody:
    """The raw body of EC2's 400 answer to DescribeInstances for an instance it does not know yet."""

    def stream(self, **_: Any) -> Any:
        yield (
            f"<Response><Errors><Error><Code>{NOT_FOUND}</Code><Message>The instance ID 'i-0' does not exist"
            "</Message></Error></Errors><RequestID>r-1</RequestID></Response>"
        ).encode()


def fail_describe_instances(agent: Any, times: Optional[int]) -> list[int]:
    """EC2 answers the agent's first ``times`` DescribeInstances (all: None) with ``InvalidInstanceID.NotFound``, as
    a real 400 through botocore's parser; the list counts the answers given."""
    answered: list[int] = []

    def not_found(request: Any, **_: Any) -> Optional[AWSResponse]:
        if times is not None and len(answered) >= times:
            return None  # the request goes to moto
        answered.append(400)
        return AWSResponse(request.url, 400, {}, NotFoundBody())

    agent.node.ec2.meta.events.register("before-send.ec2.DescribeInstances", not_found)
    return answered


def throttle_describe_groups(agent: Any, times: int, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The agent's first ``times`` DescribeAutoScalingGroups fail with Throttling (as after botocore's retries)."""
    answered: list[int] = []
    describe = agent.node.asg.describe_auto_scaling_groups

    def throttled(**kwargs: Any) -> Any:
        if len(answered) < times:
            answered.append(400)
            raise ClientError(
                {"Error": {"Code": "Throttling", "Message": "Rate exceeded"}}, "DescribeAutoScalingGroups"
            )
        return describe(**kwargs)

    monkeypatch.setattr(agent.node.asg, "describe_auto_scaling_groups", throttled)
    return answered


def prepared(cluster: Cluster, tmp_path: Path) -> tuple[Any, Any, list[str], list[int]]:
    """The agent of the cluster's one node, its job and log; its trainer is a stub that records that it ran."""
    agent, job, lines = agent_for(cluster)
    tune(agent, work_dir=str(tmp_path / "work"))
    agent.rendezvous.world_file = str(tmp_path / "world.json")
    job.checkpoint_dir = str(tmp_path / "ckpt")
    trained: list[int] = []

    def trainer(*_: Any) -> tuple[int, bool]:
        trained.append(len(agent.rendezvous.peers))
        return 0, False

    agent.trainer.run = trainer
    return agent, job, lines, trained


@pytest.mark.parametrize("error", [NOT_FOUND, "Throttling"])
def test_an_aws_error_in_the_first_polls_for_peers_does_not_fail_the_job(
    make_cluster: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, error: str
) -> None:
    cluster: Cluster = make_cluster(nodes=1)
    cluster.submit("peers-run", {"train.py": ""}, "python train.py")
    agent, job, lines, trained = prepared(cluster, tmp_path)
    tune(agent, join_timeout_s=60.0)  # far more than three polls of 0.05 s: the test ends when the fourth poll answers
    if error == NOT_FOUND:
        answered = fail_describe_instances(agent, times=3)
    else:
        answered = throttle_describe_groups(agent, 3, monkeypatch)
    assert agent._run(job) == 0
    assert answered == [400] * 3
    failed_polls = [line for line in lines if line.startswith("peer discovery failed (") and error in line]
    assert len(failed_polls) == 3 and all(line.endswith("; trying again") for line in failed_polls), lines
    assert trained == [1]  # the trainer ran, with this node as its one peer
    assert cluster.marker("peers-run", "FAILED") is None
    assert cluster.marker("peers-run", "DONE") is not None
    assert states(lines) == ["BOOT", "RESTORE", "WAIT_FOR_PEERS", "TRAIN", "DRAIN", "DONE"]
    assert "state DRAIN -> DONE: every peer finished: this node writes DONE" in lines
    node_state = cluster.marker("peers-run", f"nodes/{agent.node.instance_id}/state")
    assert node_state is not None and (node_state["state"], node_state["previous"]) == ("DONE", "DRAIN")
    assert cluster.desired_capacity() == 0  # DONE scales to 0


def test_an_aws_error_that_lasts_past_the_join_timeout_fails_the_job_with_that_error(
    make_cluster: Any, tmp_path: Path
) -> None:
    cluster: Cluster = make_cluster(nodes=1)
    cluster.submit("peers-gone", {"train.py": ""}, "python train.py")
    agent, job, lines, trained = prepared(cluster, tmp_path)
    tune(agent, join_timeout_s=3)  # room for a second poll when one takes over a second on a loaded machine
    answered = fail_describe_instances(agent, times=None)
    with pytest.raises(errors.JobFailed) as failed:
        agent._run(job)
    reason = str(failed.value)
    assert reason.startswith(
        f"peer discovery in {cluster.group} still failing after 3 s: An error occurred ({NOT_FOUND})"
    )
    assert "\n" not in reason
    marker = cluster.marker("peers-gone", "FAILED")
    assert marker is not None and marker["reason"] == reason
    assert trained == []
    assert states(lines) == ["BOOT", "RESTORE", "WAIT_FOR_PEERS", "FAILED"]
    assert f"state WAIT_FOR_PEERS -> FAILED: {reason}" in lines
    # polled again and again until the deadline (0.05 s apart, 3 s: far more than two), each failure one line
    assert len(answered) >= 2
    assert len([line for line in lines if line.startswith("peer discovery failed (")]) == len(answered)
    assert cluster.desired_capacity() == 0


def test_a_spare_node_whose_last_poll_fails_still_leaves_without_failing_the_job(make_cluster: Any) -> None:
    """A node past max_nodes (capacity rebalancing) that found itself spare, then got an AWS error in every poll up
    to the deadline: it leaves, as a spare does, and the running job goes on (a failed poll does not make it forget
    that it is spare)."""
    cluster: Cluster = make_cluster(nodes=2, min_nodes=1, max_nodes=1)
    cluster.submit("spare-run", {"train.py": ""}, "python train.py")
    (a, _), (b, _) = cluster.instances()
    agent, job, lines = agent_for(cluster, b)
    # Long enough for polls after the first on a loaded machine (a poll is several AWS calls); each poll sleeps poll_s
    tune(agent, join_timeout_s=3)
    tune(agent, work_dir=str(cluster.root / "work-b"))
    job.checkpoint_dir = str(cluster.root / "ckpt-b")
    answered: list[int] = []

    def not_found_once_spare(request: Any, **_: Any) -> Optional[AWSResponse]:
        if not any("more than max_nodes 1; waiting for a place" in line for line in lines):
            return None  # the polls until it knows it is spare go to moto
        answered.append(400)
        return AWSResponse(request.url, 400, {}, NotFoundBody())

    agent.node.ec2.meta.events.register("before-send.ec2.DescribeInstances", not_found_once_spare)
    assert agent._run(job) == 0
    assert answered, lines  # the polls after it found itself spare failed, up to the deadline
    assert any(line.startswith("still past max_nodes 1 after 3 s (2 InService in ") for line in lines), lines
    assert cluster.marker("spare-run", "FAILED") is None
    assert cluster.marker("spare-run", f"nodes/{b}/leaving") is not None
    assert states(lines) == ["BOOT", "RESTORE", "WAIT_FOR_PEERS", "LEAVING"]
    assert a in [i for i, _ in cluster.instances()] and b not in [i for i, _ in cluster.instances()]
