"""Claim a pre-warmed EBS volume from the cluster's pool at boot; give it back on the way out.

Runs on the instance: Python 3.8+, stdlib + boto3 only. Nodes race for volumes: each lists the
pool's *available* volumes in its AZ, of those the stack lists in the job spec (a volume the stack no
longer has, retained by CloudFormation with the pool's tag, is never claimed: IAM would refuse it
anyway), in its own shuffled order to spread the herd, and tries
``attach-volume``; EC2 lets exactly one attachment of a volume succeed and answers the losers
``VolumeInUse``/``IncorrectState``, so a loser moves on to the next volume. With no volume left
the node boots from its root volume and says so (slower first reads, never stuck).
"""

from __future__ import annotations

import functools
import logging
import os
import random
import shlex
import subprocess
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from botocore.exceptions import ClientError

log = logging.getLogger("spot_training.warm_volume")

# Answers that mean "another node got there first / this one is not usable": try the next volume.
LOST_RACE = {"VolumeInUse", "IncorrectState", "InvalidVolume.ZoneMismatch", "InvalidVolume.NotFound"}


def free_volumes(
    ec2, *, tag_key: str, pool: str, availability_zone: str, volume_ids: Optional[Sequence[str]]
) -> List[str]:
    """The pool's available volumes in the AZ, of ``volume_ids`` (None: every volume with the pool's tag, for a job
    spec written before the stack listed them)."""
    free = [{"Name": "availability-zone", "Values": [availability_zone]}, {"Name": "status", "Values": ["available"]}]
    return sorted(
        v["VolumeId"] for v in pool_volumes(ec2, tag_key=tag_key, pool=pool, volume_ids=volume_ids, more=free)
    )


def pool_volumes(
    ec2, *, tag_key: str, pool: str, volume_ids: Optional[Sequence[str]], more: Sequence[Dict[str, Any]] = ()
) -> List[Dict[str, Any]]:
    """The pool's volumes (DescribeVolumes), of ``volume_ids`` (None: every volume with the pool's tag), that also
    pass the filters ``more``."""
    if volume_ids is not None and not volume_ids:
        return []
    by_id = [] if volume_ids is None else [{"Name": "volume-id", "Values": list(volume_ids)}]
    pages = ec2.get_paginator("describe_volumes").paginate(
        Filters=[*by_id, {"Name": f"tag:{tag_key}", "Values": [pool]}, *more]
    )
    return [v for page in pages for v in page["Volumes"]]


def _attachment_state(ec2, volume_id: str, instance_id: str) -> Optional[str]:
    [volume] = ec2.describe_volumes(VolumeIds=[volume_id])["Volumes"]
    for attachment in volume.get("Attachments", []):
        if attachment.get("InstanceId") == instance_id:
            return attachment.get("State")
    return None if volume["State"] == "available" else volume["State"]


def _attaching_here(ec2, volume_id: str, instance_id: str) -> bool:
    """Whether the volume is attaching or attached to this instance; False when EC2 does not say (a lost race)."""
    try:
        return _attachment_state(ec2, volume_id, instance_id) in ("attaching", "attached")
    except ClientError:
        return False


def _is_attached(ec2, volume_id: str, instance_id: str) -> bool:
    return _attachment_state(ec2, volume_id, instance_id) == "attached"


def wait_for(predicate: Callable[[], bool], *, timeout_s: float, poll_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(poll_s)


def _attach(ec2, volume_id: str, instance_id: str, device: str) -> bool:
    """Ask EC2 to attach ``volume_id`` to this instance; False when another node won it (or it is not claimable)."""
    try:
        ec2.attach_volume(VolumeId=volume_id, InstanceId=instance_id, Device=device)
    except ClientError as exc:
        code = exc.response.get("Error", {}).get("Code", "")
        if code in ("VolumeInUse", "IncorrectState") and _attaching_here(ec2, volume_id, instance_id):
            # A retry of an attach EC2 had taken, its answer lost: the volume is this node's.
            log.info("warm volume %s is attaching to this instance already (%s to a retry)", volume_id, code)
        elif code in LOST_RACE or code == "UnauthorizedOperation":  # IAM: not one of the stack's volumes
            log.info("warm volume %s not claimable (%s); trying the next", volume_id, code)
            return False
        else:
            raise
    return True


def claim_volume(
    ec2,
    *,
    instance_id: str,
    availability_zone: str,
    tag_key: str,
    pool: str,
    volume_ids: Optional[Sequence[str]],
    device: str,
    timeout_s: float = 120.0,
    poll_s: float = 1.0,
    rng: Optional[random.Random] = None,
) -> Optional[str]:
    """Attach one free volume of ``pool`` (one of ``volume_ids``) to this instance; its id, or None if none is free."""
    candidates = free_volumes(
        ec2, tag_key=tag_key, pool=pool, availability_zone=availability_zone, volume_ids=volume_ids
    )
    (rng or random.Random(instance_id)).shuffle(candidates)  # noqa: S311 - spreading load, not secrecy
    for volume_id in candidates:
        if not _attach(ec2, volume_id, instance_id, device):
            continue
        try:
            wait_for(
                functools.partial(_is_attached, ec2, volume_id, instance_id),
                timeout_s=timeout_s,
                poll_s=poll_s,
                what=f"{volume_id} to attach",
            )
        except Exception:  # the caller falls back to the root volume: give the volume back to the pool, not keep it
            try:
                ec2.detach_volume(VolumeId=volume_id, InstanceId=instance_id, Device=device)
            except Exception as exc:  # it goes back to the pool when the instance terminates
                log.warning("could not detach warm volume %s after a failed claim: %s", volume_id, exc)
            raise
        log.info("claimed warm volume %s from pool %s as %s", volume_id, pool, device)
        return volume_id
    log.warning(
        "no free warm volume in pool %s in %s (%d tried); booting from the root volume: first reads will be slower",
        pool,
        availability_zone,
        len(candidates),
    )
    if not candidates:
        elsewhere = _zones_elsewhere(
            ec2, tag_key=tag_key, pool=pool, availability_zone=availability_zone, volume_ids=volume_ids
        )
        if elsewhere:
            log.warning(
                "warm pool %s has its volumes in %s only, and this node runs in %s: no node of the cluster can attach "
                "one while they are billed; the zone the team file gives the cluster's subnet is not the subnet's",
                pool,
                ", ".join(elsewhere),
                availability_zone,
            )
    return None


def _zones_elsewhere(
    ec2, *, tag_key: str, pool: str, availability_zone: str, volume_ids: Optional[Sequence[str]]
) -> List[str]:
    """The zones of the pool's volumes when none is in ``availability_zone`` (a wrong zone in the team file), else
    []; [] too when EC2 does not say."""
    try:
        zones = {v["AvailabilityZone"] for v in pool_volumes(ec2, tag_key=tag_key, pool=pool, volume_ids=volume_ids)}
    except ClientError:
        return []
    return [] if not zones or availability_zone in zones else sorted(zones)


def release_volume(
    ec2, *, volume_id: str, instance_id: str, device: str, timeout_s: float = 60.0, poll_s: float = 1.0
) -> None:
    """Detach so the next node can claim the volume; returns once it is no longer attached to this instance (it may
    be another node's already: waiting for "available" timed out then, and a notice's hand-back waited with it)."""
    ec2.detach_volume(VolumeId=volume_id, InstanceId=instance_id, Device=device)
    wait_for(
        lambda: _attachment_state(ec2, volume_id, instance_id) not in ("attaching", "attached", "detaching", "busy"),
        timeout_s=timeout_s,
        poll_s=poll_s,
        what=f"{volume_id} to detach",
    )
    log.info("released warm volume %s", volume_id)


def block_device(volume_id: str, device: str, timeout_s: float = 10.0, poll_s: float = 0.5) -> str:
    """The kernel's name for an attached volume: Nitro exposes EBS as NVMe, found by the volume id (udev makes the
    link a moment after EC2 reports the volume attached: waits for it, at most ``timeout_s``)."""
    nvme = f"/dev/disk/by-id/nvme-Amazon_Elastic_Block_Store_{volume_id.replace('-', '')}"
    wait_for(lambda: os.path.exists(nvme) or os.path.exists(device), timeout_s=timeout_s, poll_s=poll_s,
             what=f"a block device of {volume_id}")  # fmt: skip
    return nvme if os.path.exists(nvme) else device


def filesystem(block: str) -> Optional[Tuple[str, str]]:
    """(device, type) of the filesystem to mount: the volume itself, or, for a copy of a partitioned root snapshot
    (an AMI's root volume), its largest partition that holds a filesystem; None when there is none.

    lsblk lists the partitions; their types come from udev's database, which may not have probed a device attached
    a moment ago: a device it gives no type is probed directly (``blkid -p``)."""
    argv = ["lsblk", "-P", "-b", "-p", "-o", "NAME,FSTYPE,SIZE", block]  # from the AMI's PATH
    listed = subprocess.run(argv, capture_output=True, text=True, check=True).stdout  # noqa: S603 - fixed argv
    rows = [dict(word.split("=", 1) for word in shlex.split(line)) for line in listed.splitlines() if line.strip()]
    typed = [(int(row.get("SIZE") or 0), row["NAME"], row.get("FSTYPE") or probed_type(row["NAME"])) for row in rows]
    found = [row for row in typed if row[2]]
    if not found:
        return None
    _, name, fstype = max(found)
    return name, fstype


def probed_type(device: str) -> str:
    """The filesystem type blkid reads from the device itself, or "" (none, or a partition table: no TYPE)."""
    argv = ["blkid", "-p", "-o", "value", "-s", "TYPE", device]
    probe = subprocess.run(argv, capture_output=True, text=True, check=False)  # noqa: S603 - fixed argv
    return probe.stdout.strip() if probe.returncode == 0 else ""


def mount_commands(block: str, fstype: str, mountpoint: str, bind_paths: Sequence[str]) -> List[List[str]]:
    """Commands that mount the warm volume and lay its copies of ``bind_paths`` over the root's.

    The volume is a copy of the AMI's root snapshot: XFS refuses a second filesystem with the root's UUID unless
    mounted with ``nouuid``. Each path (e.g. ``/opt/pytorch``) becomes an overlay: reads come from the warm volume
    instead of the lazily loaded root volume, writes (a job's ``pip install``, caches) go to an upper layer on the
    root volume and end with the node. The volume's copy of the AMI stays unchanged, so the next node that claims
    it, in this job or another, sees the AMI's environment and nothing a job before it wrote there. The volume is
    mounted read-write for one folder of the agent's own (:data:`AGENT_FOLDER`): the job's setup cache and data
    inputs, which the next node claiming the volume finds again.
    """
    for path in bind_paths:
        if "," in path or ":" in path:  # overlay's option syntax: lowerdir=a:b,upperdir=...
            raise ValueError(f"cannot overlay {path!r}: ',' and ':' are not allowed in its path")
    options = "rw,nouuid" if fstype == "xfs" else "rw"
    commands = [["mkdir", "-p", mountpoint], ["mount", "-o", options, block, mountpoint]]
    for index, path in enumerate(bind_paths):
        layer = f"{overlay_dir(mountpoint)}/{index}"
        layers = f"lowerdir={mountpoint.rstrip('/')}{path},upperdir={layer}/upper,workdir={layer}/work"
        commands += [
            ["rm", "-rf", layer],  # a fresh upper layer: nothing of an earlier mount shows through
            ["mkdir", "-p", f"{layer}/upper", f"{layer}/work"],
            ["mount", "-t", "overlay", "overlay", "-o", layers, path],
        ]
    return commands


AGENT_FOLDER = "spot-training"  # on a mounted warm volume: what the agent keeps there (setup caches, data inputs)


def overlay_dir(mountpoint: str) -> str:
    """Where the overlays' upper layers live: on the root volume, next to (not inside) the warm volume's mountpoint."""
    return f"{mountpoint.rstrip('/')}.overlay"


def unmount_commands(mountpoint: str, bind_paths: Sequence[str]) -> List[List[str]]:
    return [["umount", path] for path in reversed(bind_paths)] + [["umount", mountpoint]]


def run(commands: Sequence[Sequence[str]], check: bool = True) -> None:
    """Run each command; ``check=False``: go on past failures (undoing a mount that got halfway)."""
    for command in commands:
        subprocess.run(list(command), check=check)  # noqa: S603 - fixed argv, no shell
