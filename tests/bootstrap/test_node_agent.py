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

from trainctl.cli import main as trainctl_main

from .conftest import EXAMPLE_FILES, TEAM, Clients, Cluster, Node, address_map, loopback, states

TRAIN = EXAMPLE_FILES  # the example's folder: train.py and its data
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
    node = Node(cluster, instance_id, private_ip, loopback(10))
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
    assert states(node.output) == ["BOOT", "RESTORE", "WAIT_FOR_PEERS", "TRAIN", "DRAIN", "DONE"]


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
    # The notice can land just after the periodic checkpoint of the same step became durable (a loaded machine):
    # then the trainer's save at the notice is that step again, and the agent says nothing newer was needed.
    durable = (f"emergency checkpoint {step} is durable in S3", f"nothing newer than checkpoint {step} to save")
    assert any(line in first.text for line in durable), first.text
    assert "killing it" not in first.text  # the trainer stopped within the grace
    assert cluster.manifests("resume-run")[0] == step
    assert cluster.marker("resume-run", "DONE") is None
    assert not out.exists()

    # The agent handed the instance back to the group, which launched a replacement; it boots as a new node.
    assert f"left {cluster.group}" in first.text
    assert first.instance_id not in [i for i, _ in cluster.instances()]
    assert states(first.output) == ["BOOT", "RESTORE", "WAIT_FOR_PEERS", "TRAIN", "DRAIN", "LEAVING"]
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
    for name, data in TRAIN.items():
        (code / name).write_bytes(data)

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
