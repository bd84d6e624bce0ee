"""The node agent claims a pre-warmed volume of its cluster's pool at boot and gives it back on the way out.

Mounting needs a real block device: these nodes run with SPOT_TRAINING_WARM_VOLUME_MOUNT=0 (as emulated nodes
do); the mount commands themselves are covered in tests/test_warm_volume.py.
"""

from __future__ import annotations

import subprocess
import uuid
from typing import Any

import pytest
from spot_training import warm_volume
from spot_training.agent import warm_claim

from .conftest import Cluster, address_map
from .test_agent_notice import agent_for

POOL_TAG = "spot-training:warm-pool"
JOB = {"ok.py": "print('trained')\n"}


def _cluster(make_cluster: Any) -> tuple[Cluster, str]:
    pool = f"pool-{uuid.uuid4().hex[:8]}"
    warm_pool = {"tag_key": POOL_TAG, "pool": pool, "device_name": "/dev/sdf", "volumes": []}
    cluster: Cluster = make_cluster(nodes=1, warm_pool=warm_pool)
    return cluster, pool


def _volume(cluster: Cluster, pool: str, az: str = "us-east-1a", listed: bool = True) -> str:
    """A volume tagged with the pool; ``listed``: one of the pool's volumes in the job spec, as the stack lists them
    (else one the stack no longer has, retained by CloudFormation)."""
    tags = [{"ResourceType": "volume", "Tags": [{"Key": POOL_TAG, "Value": pool}]}]
    volume = str(cluster.aws.ec2.create_volume(AvailabilityZone=az, Size=8, TagSpecifications=tags)["VolumeId"])
    if listed:
        cluster.spec["warm_pool"]["volumes"].append(volume)
        cluster.put_spec()
    return volume


def _mounting(
    make_cluster: Any, monkeypatch: pytest.MonkeyPatch, job_id: str
) -> tuple[Cluster, str, str, Any, Any, Any]:
    """A cluster with one free pool volume in us-east-1a and a submitted job; its agent there, mounting on (as on an
    instance): (cluster, pool, volume, agent, job, lines)."""
    cluster, pool = _cluster(make_cluster)
    volume = _volume(cluster, pool)
    cluster.submit(job_id, JOB, "python ok.py")
    monkeypatch.delenv("SPOT_TRAINING_WARM_VOLUME_MOUNT", raising=False)
    agent, job, lines = agent_for(cluster)
    agent.node.availability_zone = "us-east-1a"
    return cluster, pool, volume, agent, job, lines


def test_node_claims_a_pool_volume_and_releases_it(make_cluster: Any, make_nodes: Any) -> None:
    cluster, pool = _cluster(make_cluster)
    other_az = _volume(cluster, pool, az="us-east-1b")  # the node's AZ is us-east-1a: never claimed
    retained = [_volume(cluster, pool, listed=False) for _ in range(3)]  # not the stack's any more: never claimed
    volume = _volume(cluster, pool)
    cluster.submit("warm-run", JOB, "python ok.py")
    (node,) = make_nodes(cluster)
    assert node.start(address_map([node]), SPOT_TRAINING_WARM_VOLUME_MOUNT="0").wait() == 0, node.text
    assert f"claimed warm volume {volume} from pool {pool} as /dev/sdf" in node.text
    assert f"released warm volume {volume}" in node.text
    assert other_az not in node.text and not any(v in node.text for v in retained)
    states = cluster.aws.ec2.describe_volumes(VolumeIds=[volume, other_az])["Volumes"]
    assert {v["State"] for v in states} == {"available"}  # claimable again by the next node
    assert cluster.marker("warm-run", "DONE") is not None


def test_a_job_spec_that_does_not_list_the_volumes_claims_by_tag(make_cluster: Any, make_nodes: Any) -> None:
    """A stack deployed before the job spec listed the pool's volumes: its nodes (new scripts, old spec, say a
    replacement booted during the deploy) claim by tag, instead of refusing the job (FAILED, group at 0)."""
    cluster, pool = _cluster(make_cluster)
    del cluster.spec["warm_pool"]["volumes"]
    cluster.put_spec()
    volume = _volume(cluster, pool, listed=False)
    cluster.submit("old-spec-run", JOB, "python ok.py")
    (node,) = make_nodes(cluster)
    assert node.start(address_map([node]), SPOT_TRAINING_WARM_VOLUME_MOUNT="0").wait() == 0, node.text
    assert f"claimed warm volume {volume} from pool {pool} as /dev/sdf" in node.text
    assert cluster.marker("old-spec-run", "DONE") is not None


def test_no_free_volume_boots_from_the_root_volume(make_cluster: Any, make_nodes: Any) -> None:
    cluster, pool = _cluster(make_cluster)
    cluster.submit("cold-run", JOB, "python ok.py")
    (node,) = make_nodes(cluster)
    assert node.start(address_map([node]), SPOT_TRAINING_WARM_VOLUME_MOUNT="0").wait() == 0, node.text
    assert f"no free warm volume in pool {pool} in us-east-1a (0 tried); booting from the root volume" in node.text
    assert cluster.marker("cold-run", "DONE") is not None


def test_no_claim_when_the_volume_would_be_mounted_over_the_agents_own_python(
    make_cluster: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The job's python is this test's own (its environment, ``.venv``, is where the volume would be mounted), and
    the agent runs from it: mounted over, it could not be unmounted for the next node. No claim, one line why."""
    cluster, pool, volume, agent, job, lines = _mounting(make_cluster, monkeypatch, "own-run")
    agent.warm.claim(job)
    assert any(
        line.startswith(f"not claiming a warm volume of pool {pool}: this agent runs from ") for line in lines
    ), lines
    assert agent.warm.volume is None
    assert cluster.aws.ec2.describe_volumes(VolumeIds=[volume])["Volumes"][0]["State"] == "available"


def test_a_volume_that_cannot_be_mounted_is_given_back_and_the_node_boots_from_its_root(
    make_cluster: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A failed mount (here the overlay on the environment) is logged and undone, and the node boots from its root
    volume: it neither escapes as a traceback nor FAILs the job."""
    cluster, _, volume, agent, job, lines = _mounting(make_cluster, monkeypatch, "mount-run")
    job.python = "/opt/pytorch/bin/python"  # the DLAMI's environment, not this test's
    ran: list[tuple[list[str], bool]] = []

    def run(commands: Any, check: bool = True) -> None:
        for command in commands:
            ran.append((list(command), check))
            if check and command[:3] == ["mount", "-t", "overlay"]:
                raise subprocess.CalledProcessError(32, command)

    monkeypatch.setattr(warm_claim.warm_volume, "block_device", lambda volume, device: "/dev/nvme1n1")
    monkeypatch.setattr(warm_claim.warm_volume, "filesystem", lambda block: ("/dev/nvme1n1p1", "xfs"))
    monkeypatch.setattr(warm_claim.warm_volume, "run", run)
    agent.warm.claim(job)
    assert any(
        line.startswith(f"mounting warm volume {volume} failed (Command '['mount', '-t', 'overlay', ")
        and line.endswith("; booting from the root volume")
        for line in lines
    ), lines
    assert ran[1] == (["mount", "-o", "rw,nouuid", "/dev/nvme1n1p1", warm_claim.WARM_MOUNT], True)
    assert ran[-1] == (["umount", warm_claim.WARM_MOUNT], False)  # what got mounted is undone, failures or not
    assert agent.warm.volume is None
    assert cluster.aws.ec2.describe_volumes(VolumeIds=[volume])["Volumes"][0]["State"] == "available"


def test_a_node_handing_its_instance_back_ships_its_logs_before_the_volume_detach(
    make_cluster: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a notice the hand-back runs late in the two minutes, and a warm volume's detach may take up to a minute of
    them: the logs are flushed first, or the node's last lines would be lost when the instance goes."""
    cluster, _ = _cluster(make_cluster)
    cluster.submit("order-run", JOB, "python ok.py")
    agent, _, _ = agent_for(cluster)
    steps: list[str] = []
    agent.node.log.shipper = type("Shipper", (), {"flush": lambda self: steps.append("flush logs")})()
    monkeypatch.setattr(agent.warm, "release", lambda: steps.append("detach volume"))
    monkeypatch.setattr(agent.group_exit, "leave_group", lambda *args, **kwargs: steps.append("leave group"))
    agent.group_exit.hand_back(cluster.group)
    assert steps == ["flush logs", "detach volume", "leave group"]


def test_the_volume_directory_is_the_stand_in_or_a_writable_mount(
    make_cluster: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    """Where a job's setup cache and inputs go on the claimed volume: none without a claim; with
    SPOT_TRAINING_WARM_VOLUME_DIRS (the emulated cloud), its directory for the volume; on a mount, the agent's
    folder on it, only when the mount is writable (one the kernel turned read-only after errors gives none)."""
    _, _, volume, agent, _, _ = _mounting(make_cluster, monkeypatch, "dir-run")
    assert agent.warm.volume_dir() is None
    agent.warm.volume = (volume, "/dev/sdf", None)  # attached, not mounted
    monkeypatch.setenv("SPOT_TRAINING_WARM_VOLUME_DIRS", str(tmp_path / "volumes"))
    assert agent.warm.volume_dir() == str(tmp_path / "volumes" / volume)
    assert (tmp_path / "volumes" / volume).is_dir()
    monkeypatch.delenv("SPOT_TRAINING_WARM_VOLUME_DIRS")
    assert agent.warm.volume_dir() is None  # attached without a mount: nothing to write to
    monkeypatch.setattr(warm_claim, "WARM_MOUNT", str(tmp_path / "mnt"))
    (tmp_path / "mnt").mkdir()
    agent.warm.volume = (volume, "/dev/sdf", "/opt/pytorch")
    assert agent.warm.volume_dir() == str(tmp_path / "mnt" / warm_volume.AGENT_FOLDER)
    assert (tmp_path / "mnt" / warm_volume.AGENT_FOLDER).is_dir()
    monkeypatch.setattr(warm_claim.os, "access", lambda path, mode: False)  # turned read-only
    assert agent.warm.volume_dir() is None
    agent.warm.volume = None  # nothing to release
