"""EC2's answers for EBS attachment, which moto's ``attach_volume`` does not give.

moto re-attaches a volume that is already in use without complaint and ignores availability
zones; EC2 answers ``VolumeInUse`` and ``InvalidVolume.ZoneMismatch``. Without this, a test of
nodes racing for warm-pool volumes would prove nothing. ``install()`` wraps
``EBSBackend.attach_volume`` with one lock (EC2 serialises attachments of a volume) and the
checks, in the process that runs the moto server, before it handles a request.
"""

from __future__ import annotations

import threading
from typing import Any

from moto.ec2.exceptions import EC2ClientError, VolumeInUseError
from moto.ec2.models.elastic_block_store import EBSBackend

from emulator.moto_patch import original, patch

_LOCK = threading.Lock()


def _strict_attach_volume(
    self: EBSBackend, volume_id: str, instance_id: str, device_path: str, delete_on_termination: bool = False
) -> Any:
    with _LOCK:
        volume = self.get_volume(volume_id)
        instance = self.get_instance(instance_id)  # type: ignore[attr-defined]
        if volume.attachment is not None:
            raise VolumeInUseError(volume_id, volume.attachment.instance.id)
        if volume.availability_zone != instance.availability_zone:
            raise EC2ClientError(
                "InvalidVolume.ZoneMismatch",
                f"The volume '{volume_id}' is not in the same availability zone as instance '{instance_id}'",
            )
        if device_path in instance.block_device_mapping:
            raise EC2ClientError(
                "InvalidParameterValue",
                f"Invalid value '{device_path}' for unixDevice. Attachment point {device_path} is already in use",
            )
        moto_attach = original(EBSBackend, "attach_volume")
        return moto_attach(self, volume_id, instance_id, device_path, delete_on_termination)


def install() -> None:
    """Idempotent: make every EBS backend in this process answer like EC2."""
    patch(EBSBackend, "attach_volume", _strict_attach_volume)
