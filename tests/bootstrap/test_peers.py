"""Who hosts the rendezvous, against moto: the oldest launch, so an elastic job (min_nodes < max_nodes) never splits.

A survivor that restarted alone (world size 1 is enough with min_nodes 1) hosts a rendezvous. Its replacement, launched
later, must not host a second one because its instance id sorts first: two trainings on one checkpoint prefix would
each upload and prune the other's checkpoints.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from botocore.exceptions import ClientError
from spot_training.agent.peers import discover_peers

from .conftest import Cluster
from .test_agent_notice import agent_for, tune


def survivor_sorting_late(cluster: Cluster) -> str:
    """The group's one instance, launched again until its id sorts in the upper half (ids are random: each launch
    does so with odds of 1/2, so that a later id sorting before it is as likely; bounded)."""
    for _ in range(30):
        ((survivor, _),) = cluster.instances()
        if survivor[len("i-") :] >= "8":
            return survivor
        asg = cluster.aws.asg
        asg.terminate_instance_in_auto_scaling_group(InstanceId=survivor, ShouldDecrementDesiredCapacity=True)
        asg.set_desired_capacity(AutoScalingGroupName=cluster.group, DesiredCapacity=1)
    raise AssertionError("30 launches, none with an id in the upper half")


def replacement_sorting_first(cluster: Cluster, survivor: str) -> str:
    """Launch a second instance, later than ``survivor``, whose id sorts before it (ids are random: retry, bounded)."""
    time.sleep(1.1)  # EC2 launch times have whole seconds
    for _ in range(30):
        cluster.aws.asg.set_desired_capacity(AutoScalingGroupName=cluster.group, DesiredCapacity=2)
        (new,) = [i for i, _ in cluster.instances() if i != survivor]
        if new < survivor:
            return new
        cluster.aws.asg.terminate_instance_in_auto_scaling_group(InstanceId=new, ShouldDecrementDesiredCapacity=True)
    raise AssertionError("30 launches, none with an id sorting before the survivor's")


def test_a_replacement_joins_the_survivors_rendezvous_even_when_its_id_sorts_first(make_cluster: Any) -> None:
    cluster: Cluster = make_cluster(nodes=1, min_nodes=1, max_nodes=2)
    cluster.submit("elastic", {"train.py": ""}, "python train.py")
    survivor = survivor_sorting_late(cluster)
    replacement = replacement_sorting_first(cluster, survivor)

    peers = discover_peers(cluster.aws.asg, cluster.aws.ec2, cluster.group)
    assert [i for i, _ in peers] == [survivor, replacement]  # not sorted by id: the survivor goes on hosting
    hosts = set()
    for instance_id in (survivor, replacement):
        agent, job, _ = agent_for(cluster, instance_id)
        cmd, _ = agent.rendezvous.torchrun_command(job, agent.rendezvous.wait_for_peers(cluster.group, job))
        hosts.add(next(a for a in cmd if a.startswith("--rdzv-endpoint=")))
        assert f"is_host={'true' if instance_id == survivor else 'false'}" in " ".join(cmd)
    assert len(hosts) == 1  # one rendezvous for both nodes


def test_a_node_waits_for_the_rendezvous_host_as_long_as_the_join_timeout(make_cluster: Any) -> None:
    """torch's c10d rendezvous connects a non-host node to the host's store within ``read_timeout`` (default 60 s),
    whatever ``join_timeout`` says. The agent sets both to its join timeout: a host that comes up more than a minute
    later (restoring a big checkpoint rank 0's node already held) would otherwise fail every other node's torchrun,
    each failure a restart without progress, until enough of them marked the job FAILED. Read as torch's own launcher
    and backend read it."""
    from torch.distributed.elastic.rendezvous import RendezvousParameters
    from torch.distributed.run import config_from_args, parse_args

    cluster: Cluster = make_cluster(nodes=2)
    cluster.submit("late-host", {"train.py": ""}, "python train.py")
    (_, _), (other, _) = cluster.instances()
    agent, job, _ = agent_for(cluster, other)
    cmd, _ = agent.rendezvous.torchrun_command(job, agent.rendezvous.wait_for_peers(cluster.group, job))
    assert "is_host=false" in " ".join(cmd)
    config, _, _ = config_from_args(parse_args(cmd[3:]))  # after `python -m spot_training.launch`
    params = RendezvousParameters(
        config.rdzv_backend,
        config.rdzv_endpoint,
        config.run_id,
        config.min_nodes,
        config.max_nodes,
        **config.rdzv_configs,
    )
    read_timeout = params.get_as_int("read_timeout", 60)  # as c10d_rendezvous_backend._create_tcp_store reads it
    assert read_timeout == params.get_as_int("join_timeout") == int(agent.node.settings.join_timeout_s) > 60


def test_a_node_ec2_took_hard_is_no_peer_while_its_group_still_lists_it(make_cluster: Any) -> None:
    """A node EC2 ended without a notice the agent saw stays InService until the group's next health check, and
    discovery leaves it out (EC2 says shutting-down or terminated; stopped here). Were it kept, as the oldest launch it
    would host the next rendezvous: every survivor's torchrun would fail on it, each failure a restart without
    progress."""
    cluster: Cluster = make_cluster(nodes=2)
    cluster.submit("hard-kill", {"train.py": ""}, "python train.py")
    (host, _), (survivor, _) = cluster.instances()
    assert [i for i, _ in discover_peers(cluster.aws.asg, cluster.aws.ec2, cluster.group)] == [
        host,
        survivor,
    ]
    # EC2's side only (moto's group does no health checks; its terminate would take the instance out of the group)
    cluster.aws.ec2.stop_instances(InstanceIds=[host])
    group = cluster.aws.asg.describe_auto_scaling_groups(AutoScalingGroupNames=[cluster.group])["AutoScalingGroups"][0]
    assert {i["InstanceId"]: i["LifecycleState"] for i in group["Instances"]}[host] == "InService"
    peers = discover_peers(cluster.aws.asg, cluster.aws.ec2, cluster.group)
    assert [i for i, _ in peers] == [survivor]


def elastic_pair(make_cluster: Any, job_id: str) -> tuple[Cluster, str, Any, Any, list[str]]:
    """An elastic job (min 1, max 2) on two InService instances; the second one's agent, its job and lines, its
    peers found; the first (returned) has no agent: the test plays it."""
    cluster: Cluster = make_cluster(nodes=2, min_nodes=1, max_nodes=2)
    cluster.submit(job_id, {"train.py": ""}, "python train.py")
    (first, _), (second, _) = cluster.instances()
    agent, job, lines = agent_for(cluster, second)
    agent.rendezvous.peers = agent.rendezvous.wait_for_peers(cluster.group, job)
    return cluster, first, agent, job, lines


def test_a_ready_node_of_an_elastic_job_waits_for_its_late_peer_at_the_first_attempt(make_cluster: Any) -> None:
    """torchrun's first round closes 30 s after min_nodes joined; EC2 boots one launch's instances minutes apart. The
    first node up waits for its peer, instead of starting alone and restarting its workers when the second joins."""
    cluster, late, agent, job, lines = elastic_pair(make_cluster, "skew")

    def log(message: str) -> None:  # the late peer gets ready once this node said it waits for it
        lines.append(message)
        if message.startswith("waiting up to"):
            agent.markers.put_marker(job, f"nodes/{late}/ready", {})

    agent.node.log = log
    peers = agent.rendezvous.wait_for_ready_peers(job, cluster.group)
    assert [i for i, _ in peers] == [i for i, _ in cluster.instances()]
    assert cluster.marker("skew", f"nodes/{late}/ready") is not None  # it returned once the late peer was ready
    assert cluster.marker("skew", f"nodes/{agent.node.instance_id}/ready") is not None  # what the late peer waits for
    assert f"waiting up to 300 s for peer(s) {late} to be ready, so that the first rendezvous round has every node" in (
        lines
    )


def test_the_wait_for_a_late_peer_is_bounded_and_ends_when_it_leaves(make_cluster: Any) -> None:
    cluster, late, agent, job, lines = elastic_pair(make_cluster, "bounded")
    tune(agent, start_wait_s=0.3)
    assert len(agent.rendezvous.wait_for_ready_peers(job, cluster.group)) == 2  # starts without it: it joins later
    assert (
        f"peer(s) {late} not ready after 0.3 s; starting without them (torchrun restarts the workers when they join)"
        in (lines)
    )
    tune(agent, start_wait_s=60.0)
    cluster.aws.asg.terminate_instance_in_auto_scaling_group(InstanceId=late, ShouldDecrementDesiredCapacity=True)
    assert [i for i, _ in agent.rendezvous.wait_for_ready_peers(job, cluster.group)] == [agent.node.instance_id]


def test_once_a_peer_trains_nobody_waits_for_the_others(make_cluster: Any) -> None:
    """A replacement (its agent's first attempt) joins peers that train, and once one node trains, waiting for a late
    one only splits the round again. A replacement does not wait its bound for a second replacement or a node whose
    agent never came up, which would leave the job one node short meanwhile."""
    cluster: Cluster = make_cluster(nodes=3, min_nodes=1, max_nodes=3)
    cluster.submit("joining", {"train.py": ""}, "python train.py")
    (survivor, _), _, (replacement, _) = cluster.instances()  # the second: no marker at all
    agent, job, lines = agent_for(cluster, replacement)
    agent.rendezvous.peers = agent.rendezvous.wait_for_peers(cluster.group, job)
    agent.markers.put_marker(job, f"nodes/{survivor}/training", {"attempt": 3})
    tune(agent, start_wait_s=60.0)
    assert len(agent.rendezvous.wait_for_ready_peers(job, cluster.group)) == 3  # at once
    assert not any("waiting up to" in line or "not ready after" in line for line in lines), lines


def test_a_ready_marker_s3_refuses_does_not_end_the_job(make_cluster: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The marker is best effort (peers wait at most their bound without it): S3 refusing it after the retries does
    not reach the agent's catch-all (FAILED, and the group to 0 with every healthy peer)."""
    cluster, _, agent, job, lines = elastic_pair(make_cluster, "no-ready")
    put = agent.markers.put_marker

    def refused(job_: Any, name: str, body: Any) -> Any:
        if name.endswith("/ready"):
            raise ClientError(
                {"Error": {"Code": "SlowDown", "Message": "Please reduce your request rate."}}, "PutObject"
            )
        return put(job_, name, body)

    monkeypatch.setattr(agent.markers, "put_marker", refused)
    tune(agent, start_wait_s=0.2)
    assert len(agent.rendezvous.wait_for_ready_peers(job, cluster.group)) == 2
    assert any(line.startswith("could not report that this node is ready (") for line in lines), lines
