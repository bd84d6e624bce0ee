"""The warm volume: claim (attach and mount) a free pre-warmed volume of the cluster's pool at boot, release it
(unmount and detach) before the instance goes, so that the next node can claim it. Over ``spot_training.warm_volume``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Optional, Tuple

from spot_training import warm_volume
from spot_training.agent.code_fetch import inside
from spot_training.agent.errors import AWS_ERRORS
from spot_training.agent.job import Job
from spot_training.agent.log_shipping import Timed
from spot_training.agent.node import Node

WARM_MOUNT = "/mnt/spot-training-warm"


class WarmClaim:
    """This node's claim on a warm volume (``volume``: (volume id, device, bound env root), or None)."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self.volume: Optional[Tuple[str, str, Optional[str]]] = None

    def claim(self, job: Job) -> None:
        """Attach (and mount) a free pre-warmed volume of the cluster's pool; fall back to the root volume. A volume
        claimed for an earlier job of this boot stays: the claim is the boot's."""
        if job.warm_pool is None or self.volume is not None:
            return
        pool, device = job.warm_pool["pool"], job.warm_pool["device_name"]
        mount = os.environ.get("SPOT_TRAINING_WARM_VOLUME_MOUNT", "1") != "0"
        env_root = os.path.dirname(os.path.dirname(job.python))  # /opt/pytorch/bin/python -> /opt/pytorch
        own = [p for p in (sys.prefix, sys.base_prefix, sys.executable) if inside(p, env_root)]
        if mount and own:  # mounted over the agent's own files, the volume could not be unmounted for the next node
            self.node.log(
                f"not claiming a warm volume of pool {pool}: this agent runs from {own[0]}, inside {env_root} that "
                "the volume is mounted over; use an AMI whose python3 has boto3 (user_data.sh tries it first)"
            )
            return
        volume = self.attach(job, pool, device)
        if volume is None:
            return
        self.volume = (volume, device, None)
        if not mount:
            self.node.log(f"warm volume {volume} attached; mounting skipped (SPOT_TRAINING_WARM_VOLUME_MOUNT=0)")
            return
        self.mount(volume, device, env_root)

    def volume_dir(self) -> Optional[str]:
        """A writable directory on the claimed volume that the next node claiming it finds again (the job's setup
        cache and inputs live there), or None (no volume, or not writable). On an instance: the folder
        ``warm_volume.AGENT_FOLDER`` of the volume's mount. Without a block device (the emulated cloud:
        ``SPOT_TRAINING_WARM_VOLUME_DIRS``): the directory ``<that directory>/<volume id>``, which stands for the
        volume's file system."""
        if self.volume is None:
            return None
        stand_ins = os.environ.get("SPOT_TRAINING_WARM_VOLUME_DIRS", "")
        if stand_ins:
            path = os.path.join(stand_ins, self.volume[0])
            os.makedirs(path, exist_ok=True)
            return path
        if self.volume[2] is None or not os.access(WARM_MOUNT, os.W_OK):
            return None
        path = os.path.join(WARM_MOUNT, warm_volume.AGENT_FOLDER)
        try:
            os.makedirs(path, exist_ok=True)
        except OSError:  # a full volume, or a filesystem mounted read-only after errors
            return None
        return path

    def attach(self, job: Job, pool: str, device: str) -> Optional[str]:
        """The id of a volume of ``pool`` claimed and attached as ``device``, or None (logged)."""
        assert job.warm_pool is not None
        with Timed(self.node.log, "claim warm volume"):
            try:
                return warm_volume.claim_volume(
                    self.node.ec2,
                    instance_id=self.node.instance_id,
                    availability_zone=self.node.availability_zone,
                    tag_key=job.warm_pool["tag_key"],
                    pool=pool,
                    volume_ids=job.warm_pool.get("volumes"),
                    device=device,
                    poll_s=min(self.node.poll_s, 1.0),
                )
            except (*AWS_ERRORS, TimeoutError) as exc:  # best effort: a warm volume never costs the job
                self.node.log(f"claiming a warm volume of pool {pool} failed ({exc}); booting from the root volume")
                return None

    def mount(self, volume: str, device: str, env_root: str) -> None:
        """Mount the attached ``volume`` and lay ``env_root``'s copy over the root's; on a failure, give the volume
        back."""
        try:
            with Timed(self.node.log, "mount warm volume"):
                found = warm_volume.filesystem(warm_volume.block_device(volume, device))
                if found is None:
                    raise OSError(f"no filesystem on {volume}")
                warm_volume.run(warm_volume.mount_commands(*found, WARM_MOUNT, [env_root]))
        except (OSError, TimeoutError, ValueError, subprocess.CalledProcessError) as exc:
            # A volume that cannot be mounted must not cost the job: undo what got mounted, give the volume back.
            self.node.log(f"mounting warm volume {volume} failed ({exc}); booting from the root volume")
            warm_volume.run(warm_volume.unmount_commands(WARM_MOUNT, [env_root]), check=False)
            self.release()
            return
        self.volume = (volume, device, env_root)
        self.node.log(
            f"warm volume {volume} mounted on {WARM_MOUNT} from {found[0]}; {env_root} now reads from it "
            "(writes to it stay on this node)"
        )

    def release(self) -> None:
        """Unmount and detach the claimed volume (idempotent), so the next node can claim it."""
        if self.volume is None:
            return
        volume, device, env_root = self.volume
        self.volume = None
        try:
            if env_root is not None:
                warm_volume.run(warm_volume.unmount_commands(WARM_MOUNT, [env_root]))
            with Timed(self.node.log, "release warm volume"):
                warm_volume.release_volume(
                    self.node.ec2,
                    volume_id=volume,
                    instance_id=self.node.instance_id,
                    device=device,
                    poll_s=min(self.node.poll_s, 1.0),
                )
        except (*AWS_ERRORS, TimeoutError, OSError, subprocess.CalledProcessError) as exc:
            self.node.log(f"could not release warm volume {volume} ({exc}); it frees when the instance terminates")
