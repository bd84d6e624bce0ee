"""End to end on one machine: user_data.sh -> node agent -> torchrun -> the digits example, against moto.

Each emulated instance is a process tree with its own IMDS mock on its own 127.0.0.x address; moto's 10.x
private IPs are mapped to those loopback addresses and never contacted.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from spot_training.peers import launch_order

from trainctl.cli import main as trainctl_main

from .conftest import EXAMPLE, TEAM, Clients, Cluster, Node, address_map

TRAIN = {"train.py": EXAMPLE.read_text()}
EPOCHS = 3


def weights_equal(a: Path, b: Path) -> bool:
    sa, sb = torch.load(a), torch.load(b)
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


@dataclass(frozen=True)
class Run:
    cluster: Cluster
    node: Node
    weights: Path


@pytest.fixture(scope="module")
def reference(aws: Clients, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    """The uninterrupted run: one node trains the example to the end. Run once for the module, by the first test
    that needs it (whatever runs, in whatever order): the resume tests compare their final weights with it."""
    root = tmp_path_factory.mktemp("reference")
    cluster = Cluster(aws, root, nodes=1)
    out = root / "reference.pt"
    cluster.submit("ref-run", TRAIN, f"python train.py --epochs {EPOCHS} --seed 7 --output {out}")
    [(instance_id, private_ip)] = cluster.instances()
    node = Node(cluster, instance_id, private_ip, "127.0.0.10")
    try:
        code = node.start(address_map([node])).wait()
    finally:
        node.stop()
    assert code == 0 and out.is_file(), f"the uninterrupted reference run failed (exit code {code}):\n{node.text}"
    yield Run(cluster, node, out)


def test_job_runs_to_done(reference: Run) -> None:
    """One node trains the example to the end: DONE marker, desired capacity 0, logs shipped per job and node."""
    cluster, node = reference.cluster, reference.node
    assert cluster.marker("ref-run", "DONE") is not None
    assert cluster.marker("ref-run", "FAILED") is None
    assert cluster.desired_capacity() == 0
    assert reference.weights.is_file()
    assert re.search(rf"epoch {EPOCHS - 1} done: step \d+ test accuracy 0\.9\d+ world size 1", node.text)
    shipped = "\n".join(cluster.log_messages("ref-run", node.instance_id))
    assert "training finished" in shipped and "DONE" in shipped


def interrupted_after_a_checkpoint(cluster: Cluster, make_nodes: Any, job_id: str, command: str) -> Any:
    """Submit ``command``, boot a node, deliver a spot notice once a checkpoint is durable; the node, exited 0."""
    cluster.submit(job_id, TRAIN, command)
    (node,) = make_nodes(cluster)
    node.start(address_map([node]))
    for line in node.lines():  # bounded by the run itself: it ends after EPOCHS epochs at the latest
        if "durable in s3://" in line:
            node.imds.interrupt()
            break
    assert node.wait() == 0, node.text
    return node


def test_interruption_checkpoint_then_resume_is_bitwise_identical(
    make_cluster: Any, make_nodes: Any, tmp_path: Path, reference: Run
) -> None:
    """Notice -> SIGTERM -> emergency checkpoint durable in S3 within the grace; a replacement instance resumes
    from it and ends with weights bitwise identical to the uninterrupted run."""
    cluster: Cluster = make_cluster(nodes=1, checkpoint_interval_s=1, interruption_grace_s=30)
    out = tmp_path / "resumed.pt"
    command = f"python train.py --epochs {EPOCHS} --seed 7 --output {out} --step-sleep-s 0.05"
    first = interrupted_after_a_checkpoint(cluster, make_nodes, "resume-run", command)
    saved = re.search(r"interrupted: checkpoint (\d+) saved", first.text)
    assert saved, first.text
    step = int(saved.group(1))
    assert f"emergency checkpoint {step} is durable in S3" in first.text
    assert "killing it" not in first.text  # the trainer stopped within the grace
    assert cluster.manifests("resume-run")[0] == step
    assert cluster.marker("resume-run", "DONE") is None
    assert not out.exists()

    # The agent handed the instance back to the group, which launched a replacement; it boots as a new node.
    assert f"left {cluster.group}" in first.text
    assert first.instance_id not in [i for i, _ in cluster.instances()]
    (second,) = make_nodes(cluster)
    assert second.instance_id != first.instance_id
    assert second.start(address_map([second])).wait() == 0, second.text
    assert f"resumed from step {step}" in second.text
    assert cluster.marker("resume-run", "DONE") is not None
    assert cluster.desired_capacity() == 0
    assert weights_equal(out, reference.weights)


def test_a_failed_job_goes_on_as_a_new_job_from_its_checkpoint_bitwise_identical(
    make_cluster: Any, make_nodes: Any, tmp_path: Path, reference: Run, capsys: pytest.CaptureFixture[str]
) -> None:
    """A job interrupted after a checkpoint, then FAILED (say S3 did not answer its replacement's restore):
    ``trainctl submit --resume-from`` starts a new job from that checkpoint, which ends with the weights of the
    uninterrupted run."""
    cluster: Cluster = make_cluster(nodes=1, checkpoint_interval_s=1, interruption_grace_s=30)
    out = tmp_path / "resumed.pt"
    command = f"python train.py --epochs {EPOCHS} --seed 7 --output {out} --step-sleep-s 0.05"
    interrupted_after_a_checkpoint(cluster, make_nodes, "failed-run", command)
    step = cluster.manifests("failed-run")[0]
    failed = json.dumps({"reason": "restore: S3 did not answer", "time": time.time()})
    cluster.aws.s3.put_object(Bucket=cluster.bucket, Key=f"{cluster.name}/failed-run/FAILED", Body=failed)
    cluster.aws.asg.set_desired_capacity(AutoScalingGroupName=cluster.group, DesiredCapacity=0)
    for instance, _ in cluster.instances():  # moto keeps the replacement it launched: gone with the group at 0
        cluster.aws.asg.terminate_instance_in_auto_scaling_group(
            InstanceId=instance, ShouldDecrementDesiredCapacity=True
        )
    code = tmp_path / "code"
    code.mkdir()
    (code / "train.py").write_text(TRAIN["train.py"])

    argv = ["submit", "--team", TEAM, "--cluster", cluster.name, "--code", str(code), "--nodes", "1"]
    rc = trainctl_main([*argv, "--command", command, "--job-id", "next-run", "--resume-from", "failed-run"])
    copied = ", ".join(map(str, cluster.manifests("failed-run")[:2]))
    assert (rc, capsys.readouterr().err) == (
        0,
        f"job next-run starts from checkpoint {step} of failed-run (copied: {copied})\n",
    )
    (second,) = make_nodes(cluster)
    assert second.start(address_map([second])).wait() == 0, second.text
    assert f"restoring checkpoint {step} from s3://{cluster.bucket}/{cluster.name}/next-run/ckpt/{step}/" in second.text
    assert f"resumed from step {step}" in second.text
    assert cluster.marker("next-run", "DONE") is not None
    assert cluster.marker("failed-run", "DONE") is None
    assert step in cluster.manifests("failed-run")  # the earlier job's checkpoint stays where it was
    assert weights_equal(out, reference.weights)


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
    a.start(address_map([a]))
    for line in a.lines():  # bounded by the run itself
        if "durable in s3://" in line:  # A trains alone
            break
    cluster.aws.asg.set_desired_capacity(AutoScalingGroupName=cluster.group, DesiredCapacity=2)
    [(b_id, b_ip)] = [(i, ip) for i, ip in cluster.instances() if i != a.instance_id]
    b = Node(cluster, b_id, b_ip, "127.0.0.2" if joiner_rank_0 else "127.0.0.99")  # "127.0.0.2" < "127.0.0.20"
    try:
        b.start(address_map([a, b]))
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
