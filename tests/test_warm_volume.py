"""Warm-pool claims against moto with EC2's attachment rules (emulator/ebs_strict.py).

moto alone would let two nodes attach one volume; with the strict layer exactly one wins.
"""

from __future__ import annotations

import logging
import random
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError
from moto.ec2.models.elastic_block_store import EBSBackend

from emulator import ebs_strict, http_serving

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bootstrap_scripts"))
from spot_training import warm_volume

TAG = "spot-training:warm-pool"
POOL = "team-a-main"
AZ = "us-east-1a"
DEVICE = "/dev/sdf"
NODES = 8
ROUNDS = 20


@pytest.fixture(scope="module")
def endpoint() -> Iterator[str]:
    """A moto server in this process with EC2's attachment rules, for this module only: the patch of moto's
    EBSBackend is undone afterwards, so the in-process moto of other tests (mock_aws) stays moto's own."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(EBSBackend, "attach_volume", EBSBackend.attach_volume)  # what undo puts back
        ebs_strict.install()
        with http_serving.moto_in_thread() as url:
            yield url


def client(endpoint: str) -> Any:
    return boto3.client(
        "ec2",
        region_name="us-east-1",
        endpoint_url=endpoint,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        config=Config(retries={"max_attempts": 1}),
    )


@pytest.fixture(scope="module")
def cloud(endpoint: str) -> dict[str, list[str]]:
    """A pool of 8 in us-east-1a, decoys (other pool, other AZ), and 9 instances in us-east-1a."""
    ec2 = client(endpoint)
    image = ec2.describe_images()["Images"][0]["ImageId"]

    def volumes(count: int, pool: str, az: str) -> list[str]:
        return [
            ec2.create_volume(
                AvailabilityZone=az,
                Size=10,
                VolumeType="gp3",
                Encrypted=True,
                TagSpecifications=[{"ResourceType": "volume", "Tags": [{"Key": TAG, "Value": pool}]}],
            )["VolumeId"]
            for _ in range(count)
        ]

    pool = volumes(NODES, POOL, AZ)
    decoys = volumes(2, "team-b-main", AZ) + volumes(2, POOL, "us-east-1b")
    reservation = ec2.run_instances(
        ImageId=image,
        MinCount=NODES + 1,
        MaxCount=NODES + 1,
        InstanceType="g5.xlarge",
        Placement={"AvailabilityZone": AZ},
    )
    instances = [i["InstanceId"] for i in reservation["Instances"]]
    return {"pool": pool, "decoys": decoys, "instances": instances}


def claim(
    endpoint: str, volume_ids: list[str], instance_id: str, seed: int, timeout_s: float = 10, ec2: Any = None
) -> str | None:
    return warm_volume.claim_volume(
        ec2 or client(endpoint),
        instance_id=instance_id,
        availability_zone=AZ,
        tag_key=TAG,
        pool=POOL,
        volume_ids=volume_ids,
        device=DEVICE,
        timeout_s=timeout_s,
        poll_s=0.05,
        rng=random.Random(seed),
    )


def release_all(endpoint: str, claims: dict[str, str]) -> None:
    ec2 = client(endpoint)
    for instance_id, volume_id in claims.items():
        warm_volume.release_volume(
            ec2, volume_id=volume_id, instance_id=instance_id, device=DEVICE, timeout_s=10, poll_s=0.05
        )


def test_emulator_refuses_a_second_attachment_like_ec2(endpoint: str, cloud: dict[str, list[str]]) -> None:
    ec2 = client(endpoint)
    volume, (first, second) = cloud["pool"][0], cloud["instances"][:2]
    ec2.attach_volume(VolumeId=volume, InstanceId=first, Device=DEVICE)
    try:
        with pytest.raises(ClientError) as exc:
            ec2.attach_volume(VolumeId=volume, InstanceId=second, Device=DEVICE)
        assert exc.value.response["Error"]["Code"] == "VolumeInUse"
        with pytest.raises(ClientError) as zone:
            ec2.attach_volume(VolumeId=cloud["decoys"][-1], InstanceId=second, Device=DEVICE)
        assert zone.value.response["Error"]["Code"] == "InvalidVolume.ZoneMismatch"
    finally:
        ec2.detach_volume(VolumeId=volume, InstanceId=first, Device=DEVICE)


def test_eight_nodes_racing_for_eight_volumes_never_share_one(endpoint: str, cloud: dict[str, list[str]]) -> None:
    nodes, volume_ids = cloud["instances"][:NODES], cloud["pool"] + cloud["decoys"]
    ec2 = client(endpoint)
    node_clients = {node: client(endpoint) for node in nodes}  # each node its own, for all the rounds

    def node_claims(node: str, seed: int) -> str | None:
        return claim(endpoint, volume_ids, node, seed, ec2=node_clients[node])

    for round_ in range(ROUNDS):
        # Every node starts from the same shuffled order in odd rounds: the worst case, all collide.
        seeds = [round_] * NODES if round_ % 2 else list(range(round_ * NODES, (round_ + 1) * NODES))
        with ThreadPoolExecutor(max_workers=NODES) as pool:
            results = list(pool.map(node_claims, nodes, seeds))
        assert None not in results, f"round {round_}: a node found no volume although the pool had one per node"
        claimed = [v for v in results if v is not None]
        assert sorted(claimed) == sorted(cloud["pool"]), f"round {round_}: volumes shared or taken from outside"
        volumes = {v["VolumeId"]: v for v in ec2.describe_volumes(VolumeIds=cloud["pool"])["Volumes"]}
        for instance_id, volume_id in zip(nodes, claimed, strict=True):
            [attachment] = volumes[volume_id]["Attachments"]
            assert attachment["InstanceId"] == instance_id and attachment["Device"] == DEVICE
        release_all(endpoint, dict(zip(nodes, claimed, strict=True)))


def test_ninth_node_falls_back_and_a_released_volume_is_claimable_again(
    endpoint: str, cloud: dict[str, list[str]], caplog: pytest.LogCaptureFixture
) -> None:
    nodes, ninth = cloud["instances"][:NODES], cloud["instances"][NODES]
    claims = {node: claim(endpoint, cloud["pool"], node, seed) for seed, node in enumerate(nodes)}
    assert None not in claims.values()
    with caplog.at_level(logging.WARNING, logger="spot_training.warm_volume"):
        assert claim(endpoint, cloud["pool"], ninth, 99) is None
    assert f"no free warm volume in pool {POOL} in {AZ} (0 tried); booting from the root volume" in caplog.text

    leaver = nodes[3]
    freed = claims.pop(leaver)
    assert freed is not None
    release_all(endpoint, {leaver: freed})
    assert claim(endpoint, cloud["pool"], ninth, 99) == freed
    release_all(endpoint, {**claims, ninth: freed})  # type: ignore[dict-item]
    free = warm_volume.free_volumes(
        client(endpoint), tag_key=TAG, pool=POOL, availability_zone=AZ, volume_ids=cloud["pool"] + cloud["decoys"]
    )
    assert set(free) == set(cloud["pool"])


def test_a_pool_whose_volumes_are_all_in_another_zone_is_named(
    endpoint: str, cloud: dict[str, list[str]], caplog: pytest.LogCaptureFixture
) -> None:
    """A team file that gives an existing subnet the wrong zone: the pool's volumes are made there, and the nodes
    launch in the subnet's real zone: the node names the mismatch. Without this, each node would log only "no free
    warm volume", as if the pool were merely busy, while every volume was billed for nothing."""
    elsewhere = cloud["decoys"][2:]  # the pool's 2 volumes in us-east-1b
    with caplog.at_level(logging.WARNING, logger="spot_training.warm_volume"):
        assert claim(endpoint, elsewhere, cloud["instances"][0], 0) is None
    assert (
        f"warm pool {POOL} has its volumes in us-east-1b only, and this node runs in {AZ}: no node of the cluster "
        "can attach one while they are billed; the zone the team file gives the cluster's subnet is not the subnet's"
    ) in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="spot_training.warm_volume"):  # a job spec listing none: no zone
        assert claim(endpoint, [], cloud["instances"][0], 0) is None
    assert "only, and this node runs in" not in caplog.text


def test_a_claim_never_takes_a_volume_the_stack_no_longer_lists(endpoint: str, cloud: dict[str, list[str]]) -> None:
    """A volume of an earlier pool (the snapshot changed, or the stack was destroyed and deployed again) that
    CloudFormation retained: same tag, same AZ, available. Not in the job spec's list, so never claimed (IAM, which
    lists the current volumes by ARN, would refuse the attachment, and the claim would then give up on the pool)."""
    ec2 = client(endpoint)
    tags = [{"ResourceType": "volume", "Tags": [{"Key": TAG, "Value": POOL}]}]
    retained = [ec2.create_volume(AvailabilityZone=AZ, Size=10, TagSpecifications=tags)["VolumeId"] for _ in range(3)]
    current, node = cloud["pool"][:1], cloud["instances"][0]
    try:
        for seed in range(8):
            got = claim(endpoint, current, node, seed)
            assert got == current[0], f"seed {seed}: claimed {got}"
            release_all(endpoint, {node: got})
        assert claim(endpoint, [], node, 0) is None
    finally:
        for volume_id in retained:
            ec2.delete_volume(VolumeId=volume_id)


def test_a_claim_whose_attachment_is_never_confirmed_gives_the_volume_back(
    endpoint: str, cloud: dict[str, list[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The attachment is accepted but never shows as attached within the timeout: the claim fails (the agent boots
    from the root volume) and detaches the volume. Left attached, it would stay unused and never released for the
    node's life: one volume fewer in the pool."""
    monkeypatch.setattr(warm_volume, "_is_attached", lambda *args: False)
    node, pool = cloud["instances"][0], cloud["pool"][:1]
    with pytest.raises(TimeoutError, match=f"timed out after 0 s waiting for {pool[0]} to attach"):
        claim(endpoint, pool, node, 0, timeout_s=0.2)
    [volume] = client(endpoint).describe_volumes(VolumeIds=pool)["Volumes"]
    assert (volume["State"], volume["Attachments"]) == ("available", [])


def test_an_attachment_whose_answer_was_lost_is_still_this_nodes_claim(
    endpoint: str, cloud: dict[str, list[str]]
) -> None:
    """EC2 took the AttachVolume but its answer was lost, and botocore's retry got VolumeInUse: the volume is
    attached to this very node. Taking it for a lost race, the node would try the next volume (refused: the device
    is in use) and boot cold, the first volume attached to it unknown and never released."""
    ec2, node, pool = client(endpoint), cloud["instances"][0], cloud["pool"][:2]
    real = ec2.attach_volume

    def answer_lost(**kwargs: Any) -> Any:
        real(**kwargs)  # EC2 attached it; the answer never came back
        return real(**kwargs)  # botocore's retry: VolumeInUse (emulator/ebs_strict.py, as EC2 answers)

    ec2.attach_volume = answer_lost
    claimed = claim(endpoint, pool, node, 0, ec2=ec2)
    try:
        states = {v["VolumeId"]: v for v in client(endpoint).describe_volumes(VolumeIds=pool)["Volumes"]}
        assert claimed in pool and [a["InstanceId"] for a in states[claimed]["Attachments"]] == [node]
        (other,) = set(pool) - {claimed}
        assert states[other]["State"] == "available"  # the next volume was left for another node
    finally:
        release_all(endpoint, {node: claimed or pool[0]})


def test_a_volume_iam_refuses_is_skipped_for_the_next(endpoint: str, cloud: dict[str, list[str]]) -> None:
    """A claim by tag (a job spec from before the stack listed its volumes) also finds a retained volume of an
    earlier pool with the same tag, which the node's policy does not cover: the node tries the next volume. Were
    IAM's refusal to end the claim, the node would boot cold with free volumes left."""
    ec2, node, pool = client(endpoint), cloud["instances"][0], cloud["pool"][:2]
    real, refused = ec2.attach_volume, list[str]()

    def iam(**kwargs: Any) -> Any:
        if not refused:
            refused.append(kwargs["VolumeId"])
            raise ClientError({"Error": {"Code": "UnauthorizedOperation", "Message": "not authorized"}}, "AttachVolume")
        return real(**kwargs)

    ec2.attach_volume = iam
    claimed = claim(endpoint, pool, node, 0, ec2=ec2)
    try:
        assert claimed is not None and refused and claimed != refused[0]
    finally:
        release_all(endpoint, {node: claimed} if claimed else {})


def test_a_lost_race_ec2_cannot_describe_moves_on(endpoint: str, cloud: dict[str, list[str]]) -> None:
    """VolumeInUse, and the look at whose attachment it is fails too (throttled past the retries): taken for a lost
    race, the node tries the next volume instead of ending its claim."""
    ec2, node, pool = client(endpoint), cloud["instances"][0], cloud["pool"][:2]
    attach, describe, refused = ec2.attach_volume, ec2.describe_volumes, list[str]()

    def taken(**kwargs: Any) -> Any:
        if not refused:
            refused.append(kwargs["VolumeId"])
            raise ClientError({"Error": {"Code": "VolumeInUse", "Message": "attached elsewhere"}}, "AttachVolume")
        return attach(**kwargs)

    def throttled_once(**kwargs: Any) -> Any:
        if len(refused) == 1:
            refused.append("described")
            raise ClientError({"Error": {"Code": "RequestLimitExceeded", "Message": "slow down"}}, "DescribeVolumes")
        return describe(**kwargs)

    ec2.attach_volume, ec2.describe_volumes = taken, throttled_once
    claimed = claim(endpoint, pool, node, 0, ec2=ec2)
    try:
        assert claimed is not None and claimed != refused[0] and "described" in refused
    finally:
        release_all(endpoint, {node: claimed} if claimed else {})


def test_mount_commands_overlay_the_environment_on_the_volume_and_handle_xfs_uuid_clash() -> None:
    cmds = warm_volume.mount_commands("/dev/nvme1n1p1", "xfs", "/mnt/warm", ["/opt/conda"])
    assert cmds == [
        ["mkdir", "-p", "/mnt/warm"],
        ["mount", "-o", "rw,nouuid", "/dev/nvme1n1p1", "/mnt/warm"],
        ["rm", "-rf", "/mnt/warm.overlay/0"],
        ["mkdir", "-p", "/mnt/warm.overlay/0/upper", "/mnt/warm.overlay/0/work"],
        [
            "mount", "-t", "overlay", "overlay",
            "-o", "lowerdir=/mnt/warm/opt/conda,upperdir=/mnt/warm.overlay/0/upper,workdir=/mnt/warm.overlay/0/work",
            "/opt/conda",
        ],
    ]  # fmt: skip
    assert warm_volume.mount_commands("/dev/xvdf", "ext4", "/mnt/warm", [])[1] == [
        "mount",
        "-o",
        "rw",
        "/dev/xvdf",
        "/mnt/warm",
    ]
    assert warm_volume.unmount_commands("/mnt/warm", ["/opt/conda", "/usr/local"]) == [
        ["umount", "/usr/local"],
        ["umount", "/opt/conda"],
        ["umount", "/mnt/warm"],
    ]
    with pytest.raises(ValueError, match="cannot overlay '/opt/a,b': ',' and ':' are not allowed in its path"):
        warm_volume.mount_commands("/dev/xvdf", "ext4", "/mnt/warm", ["/opt/a,b"])


def _can_mount() -> str:
    """Why the real mount test cannot run here ('' if it can): it needs root, a loop device, mkfs.ext4, overlayfs."""
    import os
    import shutil

    if os.geteuid() != 0:
        return "needs root (mount, losetup)"
    if not Path("/dev/loop-control").exists() or not shutil.which("losetup") or not shutil.which("mkfs.ext4"):
        return "needs loop devices, losetup and mkfs.ext4"
    if "overlay" not in Path("/proc/filesystems").read_text():
        return "needs overlayfs"
    return ""


@pytest.mark.skipif(bool(_can_mount()), reason=_can_mount() or "runs")
def test_a_job_writing_into_the_mounted_environment_leaves_the_warm_volume_unchanged(tmp_path: Path) -> None:
    """The agent's own mount and unmount commands, run for real on an ext4 image behind a loop device: the
    environment reads the volume's copy; a job may still write into it (pip install); the volume's copy is not
    changed, so the next node that claims it sees the AMI's environment, not this job's, and finds what the agent
    kept in its own folder (setup caches, data inputs)."""
    env_root = tmp_path / "root/opt/pytorch"  # the node's own (lazily loaded) environment
    (env_root / "bin").mkdir(parents=True)
    (env_root / "bin/python").write_text("root copy")
    image_tree = tmp_path / "image"  # what the AMI snapshot holds at the same path
    (image_tree / env_root.relative_to("/") / "bin").mkdir(parents=True)
    (image_tree / env_root.relative_to("/") / "bin/python").write_text("warm copy")
    image = tmp_path / "volume.img"
    with image.open("wb") as f:
        f.truncate(32 * 1024 * 1024)
    subprocess.run(["mkfs.ext4", "-q", "-F", "-d", str(image_tree), str(image)], check=True)
    loop = subprocess.run(["losetup", "--find", "--show", str(image)], check=True, capture_output=True, text=True)
    block, mountpoint, check = loop.stdout.strip(), str(tmp_path / "warm"), tmp_path / "check"
    try:
        # as the agent finds it: lsblk reads the type from udev's database, which may not know a new device yet
        assert warm_volume.filesystem(block) == (block, "ext4")
        warm_volume.run(warm_volume.mount_commands(block, "ext4", mountpoint, [str(env_root)]))
        assert (env_root / "bin/python").read_text() == "warm copy"  # reads come from the warm volume
        (env_root / "installed.txt").write_text("pip install")  # the job may write: pip, caches
        (env_root / "bin/python").write_text("changed by a job")
        assert (env_root / "installed.txt").read_text() == "pip install"
        cache = Path(mountpoint) / warm_volume.AGENT_FOLDER  # the agent's folder: setup caches, data inputs
        cache.mkdir()
        (cache / "kept.txt").write_text("setup cache")
        warm_volume.run(warm_volume.unmount_commands(mountpoint, [str(env_root)]))
        assert sorted(p.name for p in env_root.iterdir()) == ["bin"]  # the root's own environment again
        assert (env_root / "bin/python").read_text() == "root copy"
        check.mkdir()
        subprocess.run(["mount", "-o", "ro", block, str(check)], check=True)
        try:  # what the next node that claims this volume would see
            volume_env = check / env_root.relative_to("/")
            assert sorted(p.name for p in volume_env.iterdir()) == ["bin"]
            assert (volume_env / "bin/python").read_text() == "warm copy"
            assert (check / warm_volume.AGENT_FOLDER / "kept.txt").read_text() == "setup cache"  # kept for the next
        finally:
            subprocess.run(["umount", str(check)], check=False)
    finally:
        warm_volume.run(warm_volume.unmount_commands(mountpoint, [str(env_root)]), check=False)
        subprocess.run(["losetup", "-d", block], check=False)


class Lsblk:
    """``lsblk -P`` as it lists a copy of an AL2023 root snapshot (root XFS, BIOS boot, EFI), or a bare disk; and
    ``blkid -p``, which reads a device's type from the device (``probed``; exit code 2: none found)."""

    def __init__(self, listing: str, probed: dict[str, str]) -> None:
        self.listing, self.probed = listing, probed
        self.argv: list[str] = []

    def __call__(self, argv: list[str], **_: Any) -> Any:
        if argv[0] == "blkid":
            found = self.probed.get(argv[-1], "")
            return subprocess.CompletedProcess(argv, 0 if found else 2, stdout=found and found + "\n", stderr="")
        self.argv = argv
        return subprocess.CompletedProcess(argv, 0, stdout=self.listing, stderr="")


PARTITIONED = (
    'NAME="/dev/nvme1n1" FSTYPE="" SIZE="107374182400"\n'
    'NAME="/dev/nvme1n1p1" FSTYPE="{root}" SIZE="107362648576"\n'
    'NAME="/dev/nvme1n1p127" FSTYPE="" SIZE="1048576"\n'
    'NAME="/dev/nvme1n1p128" FSTYPE="{efi}" SIZE="10485760"\n'
)


@pytest.mark.parametrize(
    ("listing", "probed", "expected"),
    [
        (PARTITIONED.format(root="xfs", efi="vfat"), {}, ("/dev/nvme1n1p1", "xfs")),
        # attached a moment ago: udev has not probed the partitions yet, so lsblk gives no type; blkid reads it
        (
            PARTITIONED.format(root="", efi=""),
            {"/dev/nvme1n1p1": "xfs", "/dev/nvme1n1p128": "vfat"},
            ("/dev/nvme1n1p1", "xfs"),
        ),
        ('NAME="/dev/xvdf" FSTYPE="ext4" SIZE="8589934592"\n', {}, ("/dev/xvdf", "ext4")),
        ('NAME="/dev/xvdf" FSTYPE="" SIZE="8589934592"\n', {}, None),
    ],
)
def test_the_filesystem_of_a_partitioned_root_copy_is_its_largest_formatted_partition(
    monkeypatch: pytest.MonkeyPatch, listing: str, probed: dict[str, str], expected: Any
) -> None:
    """Mounting the whole disk of a partitioned copy fails (its filesystem is on p1): the job would have FAILED.
    Before blkid, a copy udev had not probed yet had no filesystem: the node detached it and booted cold."""
    lsblk = Lsblk(listing, probed)
    monkeypatch.setattr(warm_volume.subprocess, "run", lsblk)
    assert warm_volume.filesystem("/dev/nvme1n1") == expected
    assert lsblk.argv == ["lsblk", "-P", "-b", "-p", "-o", "NAME,FSTYPE,SIZE", "/dev/nvme1n1"]


def test_a_release_ends_when_the_volume_leaves_this_node_even_if_another_claims_it_at_once(
    endpoint: str, cloud: dict[str, list[str]]
) -> None:
    """A booting node that claimed the volume between this node's detach and its next poll kept it "in-use": the
    release waited for "available" until its timeout, said the volume was not released, and delayed the hand-back
    of a node on a spot notice by that long."""
    ec2 = client(endpoint)
    volume, (leaver, booting) = cloud["pool"][0], cloud["instances"][:2]
    ec2.attach_volume(VolumeId=volume, InstanceId=leaver, Device=DEVICE)
    detach = ec2.detach_volume

    def detach_then_claimed(**kwargs: Any) -> Any:
        answer = detach(**kwargs)
        assert claim(endpoint, [volume], booting, seed=0, ec2=client(endpoint)) == volume
        return answer

    ec2.detach_volume = detach_then_claimed
    try:
        warm_volume.release_volume(
            ec2, volume_id=volume, instance_id=leaver, device=DEVICE, timeout_s=2, poll_s=0.05
        )  # no TimeoutError after 2 s
    finally:
        release_all(endpoint, {booting: volume})
