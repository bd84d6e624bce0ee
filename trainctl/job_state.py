"""A job's state (its markers, the group) and its ETA, from what the node agents write to S3."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any, Optional

from bootstrap_scripts.spot_training.protocol import (
    END_MARKERS,
    LEAVING_MARKER,
    NODE_STATE,
    RUN_MARKERS,
    SPOT_NOTICE,
    STOP,
    node_marker,
    node_object,
    nodes_prefix,
    read_marker,
    written_at,
)
from trainctl.checkpoints import Checkpoint
from trainctl.cluster import ClientFactory, ClusterRef, group
from trainctl.current_job import current_job_id
from trainctl.job_queue import is_queued

ENDED = END_MARKERS
NOT_RUNNING = (*ENDED, "UNFINISHED")  # job_state: no node runs it, none will


def submitted(client: ClientFactory, ref: ClusterRef, job_id: str) -> bool:
    """Whether a job of that id was submitted to the cluster (its code archive is there)."""
    found = client("s3").list_objects_v2(Bucket=ref.bucket, Prefix=f"{ref.code_prefix}{job_id}.", MaxKeys=1)
    return bool(found.get("KeyCount"))


def job_exists(client: ClientFactory, ref: ClusterRef, job_id: str) -> bool:
    """Whether the cluster has anything of a job of that id: its code archive, or objects under its prefix."""
    found = client("s3").list_objects_v2(Bucket=ref.bucket, Prefix=ref.job_prefix(job_id), MaxKeys=1)
    return bool(found.get("KeyCount")) or submitted(client, ref, job_id)


def job_state(client: ClientFactory, ref: ClusterRef, job_id: str) -> str:
    """DONE, FAILED or STOPPED: its marker. Else, for the current job: STOPPING (stop requested, the group not yet
    empty; STOPPED once it is), RUNNING (a node in the group), WAITING (the group above 0, no node yet). Any other
    job without an end marker is STOPPED if a stop was requested (``trainctl stop --force`` with no agent to write
    the marker), else UNFINISHED: nothing runs it (a job submitted after it, or the group at 0 with no node while
    it is current: its nodes went without writing a marker), or QUEUED while it waits in the cluster's queue."""
    ended = end_marker(client, ref, job_id)
    if ended is not None:
        return ended
    if current_job_id(client, ref) != job_id:
        if is_queued(client, ref, job_id):
            return "QUEUED"
        return "STOPPED" if marker(client, ref, job_id, STOP) is not None else "UNFINISHED"
    members = group(client, ref)
    empty = not members["Instances"] and int(members["DesiredCapacity"]) == 0
    if marker(client, ref, job_id, STOP) is not None:
        return "STOPPED" if empty else "STOPPING"
    if members["Instances"]:
        return "RUNNING"
    return "UNFINISHED" if empty else "WAITING"


def end_marker(client: ClientFactory, ref: ClusterRef, job_id: str) -> Optional[str]:
    """The job's end marker (DONE, FAILED or STOPPED) if it has one, else None."""
    return next((name for name in ENDED if marker(client, ref, job_id, name) is not None), None)


def marker(client: ClientFactory, ref: ClusterRef, job_id: str, name: str) -> Optional[dict[str, Any]]:
    """The job's marker ``name`` (``DONE``, ``FAILED``, ``STOP`` ...; JSON), or None. One that is not a JSON
    object is there all the same: ``{}``."""
    return read_marker(client("s3"), ref.bucket, ref.job_prefix(job_id) + name)


def object_time(client: ClientFactory, ref: ClusterRef, key: str) -> Optional[float]:
    """When S3 stored the object at ``key`` (its LastModified; listed, as :func:`marker` reads), or None."""
    return written_at(client("s3"), ref.bucket, key)


def run_starts(client: ClientFactory, ref: ClusterRef, job_id: str) -> list[float]:
    """When a node of the job booted, started a training attempt or announced leaving (S3's LastModified of its
    ``nodes/<id>/boot``, ``training`` and ``leaving`` markers; ``training`` is rewritten at each attempt)."""
    return sorted(
        obj["LastModified"].timestamp() for _, name, obj in _node_objects(client, ref, job_id) if name in RUN_MARKERS
    )


def eta_s(done: list[Checkpoint], planned: int, starts: list[float], now: float) -> Optional[int]:
    """Seconds left, as of ``now``, to ``planned`` steps at the pace of the current run: its checkpoints made
    durable after the last node boot, training attempt or leaving (``starts``), first to last; None with fewer than
    two. A pace across a restart would count the restart (the boot, the restore) as training time. Training went on
    since the last checkpoint: its age is taken off (at least 0)."""
    since = max(starts, default=float("-inf"))
    run = [c for c in done if c.manifest_time > since]  # S3 times are to the second: a tie is left out
    if len(run) < 2 or any(c.layout == "flat" for c in run):  # a flat checkpoint's number is no training step
        return None
    first, last = run[0], run[-1]
    if last.step <= first.step or last.manifest_time <= first.manifest_time:
        return None
    at_last = max(planned - last.step, 0) * (last.manifest_time - first.manifest_time) / (last.step - first.step)
    return round(max(at_last - max(now - last.manifest_time, 0.0), 0.0))


def node_markers(client: ClientFactory, ref: ClusterRef, job_id: str) -> dict[str, dict[str, str]]:
    """The node agents' markers of a job, ``nodes/<instance>/<name>``: {instance: {name: S3 key}}."""
    found: dict[str, dict[str, str]] = {}
    for instance, name, obj in _node_objects(client, ref, job_id):
        found.setdefault(instance, {})[name] = obj["Key"]
    return found


def _node_objects(client: ClientFactory, ref: ClusterRef, job_id: str) -> Iterator[tuple[str, str, dict[str, Any]]]:
    """(instance, marker name, the listing's entry) of every ``nodes/<instance>/<name>`` object of the job."""
    prefix = nodes_prefix(ref.job_prefix(job_id))
    for page in client("s3").get_paginator("list_objects_v2").paginate(Bucket=ref.bucket, Prefix=prefix):
        for obj in page.get("Contents", []):
            instance, name = node_object(prefix, obj["Key"])
            yield instance, name, obj


def leaving_nodes(client: ClientFactory, ref: ClusterRef, job_id: str) -> list[str]:
    """Instances that announced they leave the job (their agent wrote ``nodes/<id>/leaving``): on a spot notice, or
    when their group ended them (capacity rebalancing, a scale-in, ``stop --force``) or their OS shut down."""
    return sorted(i for i, names in node_markers(client, ref, job_id).items() if LEAVING_MARKER in names)


def spot_interruptions(client: ClientFactory, ref: ClusterRef, job_id: str) -> int:
    """Nodes of the job that left on a spot interruption notice (their ``leaving`` marker names it)."""
    notices = (marker(client, ref, job_id, node_marker(i, LEAVING_MARKER)) for i in leaving_nodes(client, ref, job_id))
    return sum(1 for m in notices if str((m or {}).get("notice", "")).startswith(SPOT_NOTICE))


def node_states(client: ClientFactory, ref: ClusterRef, job_id: str, instances: list[str]) -> dict[str, dict[str, Any]]:
    """The lifecycle state the agent of each of ``instances`` last wrote (``nodes/<instance>/state``): {instance:
    {"state", "reason", "written": S3's time of it}}, from one listing and one read per node that has one. A node
    whose agent has not written it yet (or whose marker is not JSON) has none."""
    s3, found = client("s3"), {}
    listed = [(i, obj) for i, name, obj in _node_objects(client, ref, job_id) if name == NODE_STATE and i in instances]
    for instance, obj in listed:
        try:
            body = json.loads(s3.get_object(Bucket=ref.bucket, Key=obj["Key"])["Body"].read())
        except (s3.exceptions.NoSuchKey, ValueError):  # deleted since the listing, or not JSON
            continue
        if isinstance(body, dict) and isinstance(body.get("state"), str):
            written = obj["LastModified"].timestamp()
            found[instance] = {"state": body["state"], "reason": body.get("reason"), "written": written}
    return found
