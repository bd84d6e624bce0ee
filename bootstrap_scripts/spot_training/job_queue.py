"""A cluster's job queue (first in, first out) and the hand-over from a job that ended to the next one.

Storage: one S3 object per queued job, ``<cluster>/queue/<job>.json`` (the job as the current-job parameter will
hold it, and when it was queued), created with ``IfNoneMatch="*"``: two submits never overwrite each other's entry,
and a job id is queued once. The order is S3's: the entries' ``LastModified`` (one clock for every submitter), then
the submitter's ``submitted_at``, then the job id.

The hand-over: when job J ends (``DONE``, ``FAILED``, ``STOPPED``), whoever comes first (a node of J, or a submit
that queued a job and finds J ended) creates J's ``NEXT`` marker from the queue's head, again with
``IfNoneMatch="*"``: S3 accepts exactly one, so exactly one job follows J, whoever else tries. Everyone then reads
``NEXT`` and completes the same idempotent steps: the current-job parameter names that job (written only while it
still names J), its queue entry is deleted, and the group's desired capacity is raised to its node count if below.
An SSM parameter has no conditional put (its versions order writes but a losing write is visible until taken back),
so the decision lives in S3 and the parameter only follows it.

Standard library and boto3 only: the node agent (Python 3.8) and ``trainctl`` both use it.
"""

from __future__ import annotations

import json
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

from .protocol import END_MARKERS, NEXT, job_prefix, listed, queue_key, queue_prefix, read_marker

# S3's answers to a conditional write that lost: 412 (the object exists), 409 (a write to the key was under way)
CONDITION_LOST = ("PreconditionFailed", "ConditionalRequestConflict")


class Cluster:
    """Where a cluster's queue and jobs live, and the clients that reach them (the caller's role)."""

    def __init__(
        self,
        clients: Callable[[str], Any],
        bucket: str,
        prefix: str,
        current_job_parameter: str,
        group: str,
    ) -> None:
        self.s3, self.ssm, self.asg = clients("s3"), clients("ssm"), clients("autoscaling")
        self.bucket, self.prefix, self.parameter, self.group = bucket, prefix, current_job_parameter, group


def queued(cluster: Cluster) -> List[Dict[str, Any]]:
    """The queued jobs, head first: ``{"job_id", "job", "submitted_at", "key"}`` each (``submitted_at``: S3's time)."""
    entries: List[Tuple[Tuple[float, float, str], Dict[str, Any]]] = []
    pages = cluster.s3.get_paginator("list_objects_v2").paginate(
        Bucket=cluster.bucket, Prefix=queue_prefix(cluster.prefix)
    )
    for page in pages:
        for found in page.get("Contents", []):
            body = read_marker(cluster.s3, cluster.bucket, found["Key"]) or {}
            job = body.get("job")
            if not isinstance(job, dict) or not isinstance(job.get("job_id"), str):
                continue  # taken or cancelled since the listing, or not an entry trainctl wrote
            stamp = float(found["LastModified"].timestamp())
            order = (stamp, float(body.get("submitted_at") or 0.0), job["job_id"])
            entries.append((order, {"job_id": job["job_id"], "job": job, "submitted_at": stamp, "key": found["Key"]}))
    return [entry for _, entry in sorted(entries, key=lambda e: e[0])]


def enqueue(cluster: Cluster, job: Dict[str, Any]) -> bool:
    """Queue ``job`` (it goes last); False when a job of that id is queued already."""
    body = json.dumps({"job": job, "submitted_at": time.time()})
    return conditional_put(cluster, queue_key(cluster.prefix, str(job["job_id"])), body)


def dequeue(cluster: Cluster, job_id: str) -> None:
    """Delete ``job_id``'s entry (nothing to do if it has none)."""
    cluster.s3.delete_object(Bucket=cluster.bucket, Key=queue_key(cluster.prefix, job_id))


def conditional_put(cluster: Cluster, key: str, body: str) -> bool:
    """Create the object at ``key`` unless it exists (S3's ``IfNoneMatch="*"``); whether this call created it."""
    try:
        cluster.s3.put_object(Bucket=cluster.bucket, Key=key, Body=body.encode(), IfNoneMatch="*")
    except cluster.s3.exceptions.ClientError as exc:
        if exc.response.get("Error", {}).get("Code") in CONDITION_LOST:
            return False
        raise
    return True


def ended(cluster: Cluster, job_id: str) -> Optional[str]:
    """The end marker ``job_id`` has (``DONE``, ``FAILED``, ``STOPPED``), or None while it has none."""
    prefix = job_prefix(cluster.prefix, job_id)
    return next((m for m in END_MARKERS if listed(cluster.s3, cluster.bucket, prefix + m) is not None), None)


def current_job_id(cluster: Cluster) -> Optional[str]:
    """The job id the current-job parameter names, or None (none, or not a job)."""
    try:
        value = cluster.ssm.get_parameter(Name=cluster.parameter)["Parameter"]["Value"]
    except cluster.ssm.exceptions.ParameterNotFound:
        return None
    try:
        found = json.loads(value).get("job_id")
    except (ValueError, AttributeError):
        return None
    return found if isinstance(found, str) else None


def next_after(cluster: Cluster, job_id: str) -> Optional[Dict[str, Any]]:
    """The job ``job_id``'s ``NEXT`` marker names (the one that follows it), or None."""
    claim = read_marker(cluster.s3, cluster.bucket, job_prefix(cluster.prefix, job_id) + NEXT)
    job = None if claim is None else claim.get("job")
    return job if isinstance(job, dict) else None


def start_next(cluster: Cluster, ended_job: str) -> Optional[Dict[str, Any]]:
    """After ``ended_job`` ended: the job that follows it (created from the queue's head if nobody chose one yet),
    made the current job and given its nodes; None when nothing follows it (the queue is empty). Idempotent: every
    caller gets the same job, and the steps after the choice are safe to repeat."""
    job = next_after(cluster, ended_job)
    if job is None:
        entries = queued(cluster)
        if not entries:
            return None
        body = json.dumps({"job": entries[0]["job"], "time": time.time()})
        conditional_put(cluster, job_prefix(cluster.prefix, ended_job) + NEXT, body)
        job = next_after(cluster, ended_job)  # this caller's choice, or the one that came first
        if job is None:
            return None
    if current_job_id(cluster) == ended_job:  # not yet handed over (whoever chose may have stopped halfway)
        cluster.ssm.put_parameter(Name=cluster.parameter, Value=json.dumps(job), Type="String", Overwrite=True)
    dequeue(cluster, str(job["job_id"]))
    group = cluster.asg.describe_auto_scaling_groups(AutoScalingGroupNames=[cluster.group])["AutoScalingGroups"]
    if group and int(group[0]["DesiredCapacity"]) < int(job["nodes"]):
        cluster.asg.set_desired_capacity(
            AutoScalingGroupName=cluster.group, DesiredCapacity=int(job["nodes"]), HonorCooldown=False
        )
    return job


def after_end(cluster: Cluster, ended_job: str, let_go: Callable[[], None]) -> Tuple[Optional[Dict[str, Any]], bool]:
    """The ending node's half of the hand-over, once ``ended_job`` has its end marker: (the job that follows it, or
    None; whether ``let_go`` ran). With the queue empty, ``let_go`` (the group to 0) runs, then the queue is read
    again: a submit that found the cluster busy may have queued a job just after the first read, and when its own
    check (:func:`start_if_ended`) came first, it raised the group before ``let_go`` lowered it; the second
    :func:`start_next` raises it again. Whichever of the two reads last sees the entry, so the job starts."""
    job = start_next(cluster, ended_job)
    if job is not None:
        return job, False
    let_go()
    return start_next(cluster, ended_job), True


def start_if_ended(cluster: Cluster, idle: bool = False) -> Optional[Dict[str, Any]]:
    """The submitter's half of the hand-over, after it queued a job: when the current job has ended meanwhile (its
    last node may have read the queue just before the entry landed), or the cluster was ``idle`` (its group at 0
    with no instance: no node will end the current job), start the queue's head here, the same way a node does
    (:func:`start_next`). None when the current job still runs (its end starts the head)."""
    current = current_job_id(cluster)
    if current is None or not (idle or ended(cluster, current) is not None):
        return None
    return start_next(cluster, current)
