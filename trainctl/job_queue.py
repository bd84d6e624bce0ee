"""``trainctl queue`` and ``trainctl cancel``: the cluster's queued jobs (``spot_training/job_queue.py`` keeps them in
S3 and hands an ended job over to the next one)."""

from __future__ import annotations

import time
from typing import Any

from bootstrap_scripts.spot_training import job_queue
from bootstrap_scripts.spot_training.protocol import listed, queue_key
from trainctl.cluster import ClientFactory, ClusterRef, JobError
from trainctl.current_job import current_job_id


def queue_of(client: ClientFactory, ref: ClusterRef) -> job_queue.Cluster:
    """The cluster's queue, reached with the operator's clients."""
    return job_queue.Cluster(client, ref.bucket, ref.prefix, str(ref.spec["current_job_parameter"]), ref.group)


def queue_rows(client: ClientFactory, ref: ClusterRef) -> list[dict[str, Any]]:
    """The queued jobs, head first: position (1: starts next), job id, nodes, when it was queued (UTC)."""
    return [
        {
            "position": position,
            "job_id": entry["job_id"],
            "nodes": entry["job"].get("nodes"),
            "submitted": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(entry["submitted_at"])),
        }
        for position, entry in enumerate(job_queue.queued(queue_of(client, ref)), start=1)
    ]


def is_queued(client: ClientFactory, ref: ClusterRef, job_id: str) -> bool:
    """Whether ``job_id`` waits in the cluster's queue."""
    return listed(client("s3"), ref.bucket, queue_key(ref.prefix, job_id)) is not None


def cancel(client: ClientFactory, ref: ClusterRef, job_id: str) -> str:
    """Take a queued job out of the queue (its code archive stays, as an unfinished job's does); a one-line
    :class:`JobError` for a job that is not queued: the running one (``trainctl stop``) or an unknown one."""
    where = f"--team {ref.team} --cluster {ref.cluster}"
    if current_job_id(client, ref) == job_id:
        raise JobError(
            f"job {job_id} is not queued but the cluster's current job; stop it with: trainctl stop {where} {job_id}"
        )
    if not is_queued(client, ref, job_id):
        raise JobError(f"job {job_id} is not queued on {ref.team}/{ref.cluster} (see: trainctl queue {where})")
    job_queue.dequeue(queue_of(client, ref), job_id)
    if current_job_id(client, ref) == job_id:  # a node took it from the queue as it was cancelled
        return f"job {job_id} started as it was cancelled; stop it with: trainctl stop {where} {job_id}"
    return f"job {job_id} taken out of the queue of {ref.team}/{ref.cluster}; it never starts"


def clear(client: ClientFactory, ref: ClusterRef) -> list[str]:
    """Take every queued job out of the queue; their ids, head first."""
    cluster = queue_of(client, ref)
    ids = [entry["job_id"] for entry in job_queue.queued(cluster)]
    for job_id in ids:
        job_queue.dequeue(cluster, job_id)
    return ids


def queue_summary(client: ClientFactory, ref: ClusterRef) -> dict[str, Any]:
    """For ``trainctl status``: how many jobs are queued and which starts next (None: none)."""
    rows = queue_rows(client, ref)
    return {"queued": len(rows), "next_job": rows[0]["job_id"] if rows else None}


def queue_after_stop(client: ClientFactory, ref: ClusterRef, *, clear_queue: bool) -> str:
    """After ``trainctl stop``: what happens to the queue, in one line ("" when it is empty). ``clear_queue``: every
    queued job is taken out first. Otherwise the queue stays, and the next job starts when the stopped job's nodes
    hand over to it, or here when the stop itself wrote ``STOPPED`` (no node ran the job)."""
    if clear_queue:
        cleared = clear(client, ref)
        return f"queue cleared: {', '.join(cleared)} will not start" if cleared else ""
    started = job_queue.start_if_ended(queue_of(client, ref))
    rows = queue_rows(client, ref)
    if started is not None:
        return f"queue: the next job, {started['job_id']}, starts now; {len(rows)} job(s) stay queued"
    if not rows:
        return ""
    return (
        f"queue: {len(rows)} job(s) stay queued; the next, {rows[0]['job_id']}, starts once this job has stopped "
        "(trainctl stop --clear-queue also empties the queue)"
    )
