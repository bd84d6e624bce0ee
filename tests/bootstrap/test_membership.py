"""One node per cluster asks Auto Scaling which instances the group holds while the trainers run
(agent/membership.py): the rendezvous host publishes the group's membership each poll, the other nodes read it from
the listing of ``nodes/`` they make anyway, and ask Auto Scaling themselves only when it is missing or stale."""

from __future__ import annotations

import time
from typing import Any

import pytest

from .conftest import Cluster
from .test_agent_notice import restarting, tune


@pytest.fixture
def cluster(make_cluster: Any) -> Any:
    c = make_cluster(nodes=3)
    c.submit("job-m", {"train.py": ""}, "python train.py")
    return c


def counting_describes(agent: Any, monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """The DescribeAutoScalingGroups calls ``agent`` makes from here on, each still answered by moto."""
    calls: list[dict[str, Any]] = []
    describe = agent.node.asg.describe_auto_scaling_groups

    def counted(**kwargs: Any) -> Any:
        calls.append(kwargs)
        return describe(**kwargs)

    monkeypatch.setattr(agent.node.asg, "describe_auto_scaling_groups", counted)
    return calls


def host_and_peer(cluster: Cluster) -> tuple[Any, Any, Any, list[str], str]:
    """The agents of the rendezvous host and of a peer after an attempt of all three nodes, the job, the peer's log
    lines, and the third node's id."""
    (host_id, _), (peer_id, _), (other_id, _) = cluster.instances()
    started = time.time()
    host, job, _ = restarting(cluster, host_id, started=started)
    peer, _, lines = restarting(cluster, peer_id, started=started)
    return host, peer, job, lines, other_id


def poll(agent: Any, job: Any) -> Any:
    """What a trainer poll does: one listing of ``nodes/``, then the lost-peer check over it."""
    published: dict[str, float] = {}
    markers = agent.markers.node_markers(job, {}, published)
    return agent.rendezvous.lost_peer(job, markers, published)


def test_the_host_publishes_the_same_bytes_while_the_group_does_not_change(cluster: Cluster) -> None:
    host, job, _ = restarting(cluster, cluster.instances()[0][0], started=time.time())
    assert poll(host, job) is None
    key = f"{job.job_prefix}nodes/{host.node.instance_id}/membership"
    first = cluster.aws.s3.head_object(Bucket=job.bucket, Key=key)
    assert cluster.marker("job-m", f"nodes/{host.node.instance_id}/membership") == {
        "instances": {instance_id: "InService" for instance_id, _ in cluster.instances()}
    }
    assert poll(host, job) is None
    assert cluster.aws.s3.head_object(Bucket=job.bucket, Key=key)["ETag"] == first["ETag"]  # peers GET it once


def test_a_peer_reads_the_hosts_membership_and_asks_auto_scaling_nothing(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    host, peer, job, lines, gone_id = host_and_peer(cluster)
    tune(peer, poll_s=5.0)  # the real poll: a membership up to 17 s old is fresh
    describes = counting_describes(peer, monkeypatch)
    assert poll(host, job) is None
    for _ in range(3):
        assert poll(peer, job) is None
    # A peer taken without a notice: the host sees it go, the other nodes learn it from the host
    cluster.aws.asg.terminate_instance_in_auto_scaling_group(InstanceId=gone_id, ShouldDecrementDesiredCapacity=True)
    assert poll(host, job) == (gone_id, "left the group without a notice")
    assert poll(peer, job) == (gone_id, "left the group without a notice")
    assert describes == [], "a peer asked Auto Scaling while the host published"
    assert not [line for line in lines if "membership" in line], lines


def test_a_peer_asks_auto_scaling_itself_once_the_hosts_membership_is_stale(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    host, peer, job, lines, gone_id = host_and_peer(cluster)
    tune(peer, poll_s=0.01)  # stale after 3 polls + 2 s of S3's whole-second LastModified
    assert poll(host, job) is None  # published once, then the host is gone
    describes = counting_describes(peer, monkeypatch)
    cluster.aws.asg.terminate_instance_in_auto_scaling_group(InstanceId=gone_id, ShouldDecrementDesiredCapacity=True)
    deadline = time.monotonic() + 10
    while not describes and time.monotonic() < deadline:  # bounded: about 3 s
        assert poll(peer, job) in (None, (gone_id, "left the group without a notice"))
        time.sleep(0.2)
    assert describes, "the peer kept using a stale membership"
    assert poll(peer, job) == (gone_id, "left the group without a notice")
    stale = [line for line in lines if "membership from" in line]
    assert len(stale) == 1 and stale[0].startswith(f"membership from {host.node.instance_id} is "), lines
    assert stale[0].endswith("s old: asking Auto Scaling"), stale


def test_without_a_published_membership_a_peer_asks_auto_scaling(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    (host_id, _), (peer_id, _), (gone_id, _) = cluster.instances()
    peer, job, lines = restarting(cluster, peer_id, started=time.time())
    describes = counting_describes(peer, monkeypatch)
    assert poll(peer, job) is None  # the host has not published (yet): asked directly, no complaint
    cluster.aws.asg.terminate_instance_in_auto_scaling_group(InstanceId=gone_id, ShouldDecrementDesiredCapacity=True)
    assert peer.rendezvous.lost_peer(job) == (gone_id, "left the group without a notice")  # no listing given
    assert len(describes) == 2
    assert not [line for line in lines if "membership" in line], lines
    assert host_id != peer_id


def test_a_listing_without_ages_asks_auto_scaling_without_a_stale_complaint(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    host, peer, job, lines, _ = host_and_peer(cluster)
    assert poll(host, job) is None  # published
    describes = counting_describes(peer, monkeypatch)
    markers = peer.markers.node_markers(job)  # the membership's ETag, but no ages
    assert peer.rendezvous.lost_peer(job, markers) is None
    assert len(describes) == 1
    assert not [line for line in lines if "membership" in line], lines
