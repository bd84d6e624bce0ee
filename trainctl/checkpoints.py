"""A job's checkpoints in S3 (``<job>/ckpt/<step>/``, the manifest last): listed, checked intact, copied, deleted."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Optional

from botocore.exceptions import BotoCoreError, ClientError

from bootstrap_scripts.spot_training.protocol import (
    MANIFEST,
    checkpoint_object,
    checkpoint_prefix,
    checkpoints_prefix,
    manifest_fault,
    manifest_key,
)
from bootstrap_scripts.spot_training.sync_state import step_number
from trainctl.cluster import ClientFactory, ClusterRef, JobError

COPIED_CHECKPOINTS = 2  # as many as the node agent keeps in S3 by default (SPOT_TRAINING_KEEP_CHECKPOINTS)
LIST_PASSES = 3  # listings of a job's checkpoints when manifests vanish under one (the agent pruning)


@dataclass(frozen=True)
class Checkpoint:
    step: int
    size_bytes: int
    files: int
    manifest_time: float  # LastModified of the manifest (when the checkpoint became durable)
    # "step": a step folder, numbered by the training step; "flat": a script's own files, numbered 1, 2, 3 ... (the
    # agent cannot tell their step)
    layout: str = "step"


def checkpoints(client: ClientFactory, ref: ClusterRef, job_id: str) -> list[Checkpoint]:
    """The job's complete checkpoints in S3 (those with a manifest), oldest first.

    A manifest pruned between the listing and its read means the agent made a newer checkpoint durable meanwhile
    (it prunes right after): the listing is taken again (at most ``LIST_PASSES`` times), not returned a checkpoint
    short."""
    s3 = client("s3")
    prefix = checkpoints_prefix(ref.job_prefix(job_id))
    found: list[Checkpoint] = []
    for _ in range(LIST_PASSES):
        found, pruned = _listed_checkpoints(s3, ref.bucket, prefix)
        if not pruned:
            break
    return sorted(found, key=lambda c: c.step)


def _listed_checkpoints(s3: Any, bucket: str, prefix: str) -> tuple[list[Checkpoint], bool]:
    """One listing of ``checkpoints``: those whose manifest reads, and whether one was pruned since the listing."""
    found, pruned = [], False
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for obj in page.get("Contents", []):
            name, rel = checkpoint_object(prefix, obj["Key"])
            step = step_number(name)  # as the agent reads it
            if rel != MANIFEST or step is None:
                continue
            try:
                manifest = json.loads(s3.get_object(Bucket=bucket, Key=obj["Key"])["Body"].read())
                files, layout = manifest["files"], str(manifest.get("layout", "step"))
                size = sum(int(f["size"]) for f in files.values())
            except s3.exceptions.NoSuchKey:
                pruned = True  # no longer a checkpoint
                continue
            except (ValueError, KeyError, TypeError, AttributeError):
                continue  # an unreadable manifest: the agent does not restore it either
            found.append(Checkpoint(step, size, len(files), obj["LastModified"].timestamp(), layout))
    return found, pruned


def copy_checkpoints(
    client: ClientFactory, ref: ClusterRef, earlier: str, job_id: str, written: list[str]
) -> list[int]:
    """Copy ``earlier``'s newest intact checkpoints (up to :data:`COPIED_CHECKPOINTS`) to ``job_id``, same steps;
    returns the steps, newest first. Each key is appended to ``written`` before it is written (for a clean-up).

    Intact: the manifest is there and lists objects, each there with the listed size under a safe name
    (:func:`intact_manifest`; the node agent checks the sha256 on restore, and falls back to the older copy if the
    newest fails). Copies are server side (nothing passes through this machine); each manifest goes last, with the
    new job's id (the agent restores only its own job's checkpoints) and where it came from. The earlier job's
    objects are only read.
    """
    s3 = client("s3")
    source, target = checkpoints_prefix(ref.job_prefix(earlier)), checkpoints_prefix(ref.job_prefix(job_id))
    steps: list[int] = []
    for checkpoint in reversed(checkpoints(client, ref, earlier)):
        old, new = checkpoint_prefix(source, checkpoint.step), checkpoint_prefix(target, checkpoint.step)
        manifest = intact_manifest(s3, ref.bucket, old)
        if manifest is None:
            continue
        for rel in manifest["files"]:
            written.append(new + rel)
            s3.copy({"Bucket": ref.bucket, "Key": old + rel}, ref.bucket, written[-1])
        manifest.update(job_id=job_id, resumed_from={"job_id": earlier, "step": checkpoint.step})
        written.append(manifest_key(target, checkpoint.step))
        s3.put_object(Bucket=ref.bucket, Key=written[-1], Body=json.dumps(manifest, indent=1))
        steps.append(checkpoint.step)
        if len(steps) == COPIED_CHECKPOINTS:
            return steps
    if not steps:
        raise JobError(
            f"--resume-from {earlier}: the job has no intact checkpoint in s3://{ref.bucket}/{source} to resume from"
        )
    return steps


def intact_manifest(s3: Any, bucket: str, base: str) -> Optional[dict[str, Any]]:
    """The manifest under ``base`` (a checkpoint's folder) if it lists objects and the checkpoint is intact
    (``protocol.manifest_fault``, the node agent's check before its download), else None."""
    sizes = {
        obj["Key"][len(base) :]: obj["Size"]
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=base)
        for obj in page.get("Contents", [])
    }
    try:
        manifest = json.loads(s3.get_object(Bucket=bucket, Key=base + MANIFEST)["Body"].read())
    except (s3.exceptions.NoSuchKey, ValueError):
        return None
    files = manifest.get("files") if isinstance(manifest, dict) else None
    if not isinstance(files, dict) or not files or manifest_fault(files, sizes) is not None:
        return None
    return dict(manifest)


def delete_keys(s3: Any, bucket: str, keys: list[str]) -> list[str]:
    """Delete ``keys``, manifests first (a checkpoint without its manifest does not exist); returns those S3
    refused to delete."""
    left = []
    for key in sorted(keys, key=lambda k: not k.endswith(MANIFEST)):
        try:
            s3.delete_object(Bucket=bucket, Key=key)
        except (ClientError, BotoCoreError):
            left.append(key)
    return left
