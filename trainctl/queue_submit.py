"""A submit to a busy cluster: the job goes into the cluster's queue (``spot_training/job_queue.py``) and starts when
the jobs before it have ended."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, Optional

from bootstrap_scripts.spot_training import job_queue
from trainctl.checkpoints import copy_checkpoints, delete_keys
from trainctl.cluster import ClientFactory, ClusterRef, JobError
from trainctl.current_job import current_job_id
from trainctl.job_queue import queue_of, queue_rows
from trainctl.job_state import ENDED, job_state

Upload = Callable[[Any, Path, str, str], None]


def queue_job(
    client: ClientFactory,
    ref: ClusterRef,
    job: dict[str, Any],
    archive: Path,
    resume_from: Optional[str],
    report: Callable[[str], None],
    busy: Optional[str],
    upload: Upload,
) -> list[int]:
    """Copy ``resume_from``'s checkpoints and upload the code under the job's own id (as a submit to an idle cluster
    does), then queue the job; returns the steps copied. ``report`` gets its place in the queue. Then the
    submitter's half of the hand-over (:func:`job_queue.start_if_ended`): when the current job has ended
    meanwhile (its last node may have read the queue just before this entry landed), the queue's head starts
    here. All or nothing up to the entry: a failure deletes what this submit wrote."""
    job_id, cluster = str(job["job_id"]), queue_of(client, ref)
    check_resume_from_ended(client, ref, resume_from)
    written: list[str] = []
    try:
        steps = [] if resume_from is None else copy_checkpoints(client, ref, resume_from, job_id, written)
        written.append(str(job["code_key"]))
        upload(client("s3"), archive, ref.bucket, written[-1])
        if not job_queue.enqueue(cluster, job):  # the same job id queued by a submit racing this one
            written.clear()  # the same keys as the winner's: they stay
            raise JobError(
                f"job {job_id} is queued on {ref.team}/{ref.cluster} already (another submit of it got there first; "
                f"see: trainctl queue --team {ref.team} --cluster {ref.cluster})"
            )
    except BaseException:
        left = delete_keys(client("s3"), ref.bucket, written)
        if left:
            report(f"could not delete {len(left)} object(s) this submit wrote: {', '.join(left)}")
        raise
    started = job_queue.start_if_ended(cluster, idle=busy is None)
    report(queued_line(client, ref, job_id, busy, started))
    return steps


def check_resume_from_ended(client: ClientFactory, ref: ClusterRef, resume_from: Optional[str]) -> None:
    """A queued job copies its checkpoints now: ``resume_from`` must have ended (the running job still writes)."""
    if resume_from is not None and current_job_id(client, ref) == resume_from:
        if job_state(client, ref, resume_from) not in ENDED:
            raise JobError(
                f"--resume-from {resume_from}: it still runs and writes checkpoints; submit once it has ended "
                f"(trainctl status --team {ref.team} --cluster {ref.cluster} {resume_from})"
            )


def queued_line(
    client: ClientFactory, ref: ClusterRef, job_id: str, busy: Optional[str], started: Optional[dict[str, Any]]
) -> str:
    """What became of a queued job: its place, or that it started at once."""
    if started is not None and started.get("job_id") == job_id:
        how = "the cluster's job ended as it was queued" if busy else "the cluster is idle"
        return f"job {job_id} started from the queue: {how}"
    positions = [row["position"] for row in queue_rows(client, ref) if row["job_id"] == job_id]
    why = f"cluster {ref.team}/{ref.cluster} is busy ({busy})" if busy else "jobs are queued before it"
    if not positions:
        return f"job {job_id} left the queue at once: it is the current job now ({why})"
    return (
        f"job {job_id} queued at position {positions[0]}: {why}; it starts when the jobs before it have ended "
        f"(trainctl queue --team {ref.team} --cluster {ref.cluster})"
    )
