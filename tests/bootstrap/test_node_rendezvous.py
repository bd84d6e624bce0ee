"""End to end on one machine, several nodes: user_data.sh -> node agent -> torchrun -> the digits example, against
moto. Nodes that find each other, a node that joins a running training, a job that keeps failing.

Each emulated instance is a process tree with its own IMDS mock on its own loopback address; moto's 10.x private IPs
are mapped to those loopback addresses and never contacted.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from spot_training.peers import launch_order

from .conftest import Cluster, Node, address_map, loopback
from .test_node_agent import TRAIN

# A round that has min_nodes starts after 2 s without more nodes (torch's default: 30 s): A trains alone sooner.
ALONE_AFTER_2_S = {"SPOT_TRAINING_TEST_RDZV_LAST_CALL_S": "2"}


def test_two_nodes_rendezvous_over_loopback(make_cluster: Any, make_nodes: Any, tmp_path: Path) -> None:
    """Two nodes find each other through the ASG, elect the oldest launch as host, and train with DDP."""
    cluster: Cluster = make_cluster(nodes=2)
    cluster.submit("ddp-run", TRAIN, "python train.py --epochs 2 --seed 1")
    nodes: list[Node] = make_nodes(cluster)
    mapping = address_map(nodes)
    for node in nodes:
        node.start(mapping)
    codes = [node.wait() for node in nodes]
    assert codes == [0, 0], "\n\n".join(n.text for n in nodes)
    found = cluster.aws.ec2.describe_instances(InstanceIds=[n.instance_id for n in nodes])["Reservations"]
    host = launch_order(i for r in found for i in r["Instances"])[0]  # launched together: the lower id
    for node in nodes:
        assert f"rendezvous host {host}" in node.text
        assert f"--rdzv-endpoint={nodes[0].host}:" in node.text  # the host's loopback address, not its 10.x IP
    assert re.search(r"test accuracy 0\.\d+ world size 2", "\n".join(n.text for n in nodes))
    assert cluster.marker("ddp-run", "DONE") is not None
    assert cluster.desired_capacity() == 0


def test_repeated_failure_writes_failed_and_scales_to_zero(make_cluster: Any, make_nodes: Any) -> None:
    """A trainer that keeps failing without a new checkpoint: max_restarts restarts, then FAILED and capacity 0."""
    cluster: Cluster = make_cluster(nodes=1, max_restarts=1)
    cluster.submit("bad-run", {"fail.py": "import sys\nsys.exit(3)\n"}, "python fail.py")
    (node,) = make_nodes(cluster)
    assert node.start(address_map([node])).wait() == 1, node.text
    failed = cluster.marker("bad-run", "FAILED")
    assert failed is not None
    assert failed["reason"] == "trainer exited with code 1 after 1 restart(s) without a new checkpoint"
    assert node.text.count("training attempt") == 2
    assert cluster.desired_capacity() == 0


@pytest.mark.parametrize("joiner_rank_0", [False, True], ids=["first-node-rank-0", "joiner-rank-0"])
def test_a_node_that_boots_later_joins_the_running_training_and_its_peer_knows_it(
    make_cluster: Any, make_nodes: Any, joiner_rank_0: bool
) -> None:
    """min_nodes 1, max_nodes 2 (the team file's default min_nodes is 1): A trains alone, then the group grows and
    B joins A's rendezvous (torchrun restarts the workers with both). torch ranks nodes by sorted address: B gets
    rank 0 when its address sorts first, and then hosts the workers' store. A's agent learns of B from the
    recorded round and B's training marker, so B's loss or final upload is not missed; DONE, capacity 0."""
    cluster: Cluster = make_cluster(nodes=1, max_nodes=2, checkpoint_interval_s=1)
    cluster.submit("join-run", TRAIN, "python train.py --epochs 2 --seed 3 --step-sleep-s 0.3")
    (a,) = make_nodes(cluster)
    a.start(address_map([a]), **ALONE_AFTER_2_S)
    for line in a.lines():  # bounded by the run itself
        if "durable in s3://" in line:  # A trains alone
            break
    cluster.aws.asg.set_desired_capacity(AutoScalingGroupName=cluster.group, DesiredCapacity=2)
    [(b_id, b_ip)] = [(i, ip) for i, ip in cluster.instances() if i != a.instance_id]
    b = Node(cluster, b_id, b_ip, loopback(2 if joiner_rank_0 else 99))  # "127.0.W.2" < "127.0.W.20" < "127.0.W.99"
    try:
        b.start(address_map([a, b]), **ALONE_AFTER_2_S)
        (a.dir / "address-map.tmp").write_text(json.dumps(address_map([a, b])))  # the emulator maps B for A too
        (a.dir / "address-map.tmp").replace(a.dir / "address-map.json")
        assert [b.wait(), a.wait()] == [0, 0], a.text + "\n\n" + b.text
    finally:
        b.stop()
    assert f"peer {b.instance_id} joined the training" in a.text
    assert "world size 2" in a.text + b.text
    # torch 2.13 alone: B waited 60 s for the round's shared-store keys, then both trainers failed and restarted
    assert "training attempt 1" not in a.text + b.text and "wait timeout" not in b.text
    assert cluster.marker("join-run", "DONE") is not None
    assert cluster.desired_capacity() == 0
