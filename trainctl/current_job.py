"""The cluster's current-job parameter: the submitted job (JSON) the node agent merges over the job spec.

SSM has no conditional put: a submit writes it compare-and-set by its versions (:class:`CurrentJob`), and
:class:`Beaten` names the submit that wrote it first.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Optional

from trainctl.cluster import ClientFactory, ClusterRef, JobError


class Beaten(JobError):
    """Another submit wrote the current-job parameter first: ``winner`` is its job id (None: none)."""

    def __init__(self, ref: ClusterRef, job_id: str, winner_value: Optional[str]) -> None:
        self.winner = None if winner_value is None else job_id_in(ref, winner_value)
        if self.winner == job_id:  # the same job id: the objects under its prefix are the winner's as well
            why = (
                f"another submit of job {job_id} to {ref.team}/{ref.cluster} got there first; the objects under that "
                "id are left as they are (the same keys as its: its code archive is whichever upload came last, and "
                "checkpoints this one copied with --resume-from stay)"
            )
        else:
            why = (
                f"another submit to {ref.team}/{ref.cluster} got there first: job {self.winner or 'none'}; nothing "
                f"of this one ({job_id}) was kept"
            )
        super().__init__(f"{why} (trainctl status --team {ref.team} --cluster {ref.cluster})")


@dataclass(frozen=True)
class CurrentJob:
    """The current-job parameter as read: its value (None: never submitted) and SSM version (0: none)."""

    value: Optional[str]
    version: int


def read_current_job(client: ClientFactory, ref: ClusterRef) -> CurrentJob:
    """The cluster's current-job parameter (the submitted job, JSON) and its version."""
    ssm = client("ssm")
    try:
        found = ssm.get_parameter(Name=str(ref.spec["current_job_parameter"]))["Parameter"]
    except ssm.exceptions.ParameterNotFound:
        return CurrentJob(None, 0)
    return CurrentJob(str(found["Value"]), int(found["Version"]))


def current_job_value(client: ClientFactory, ref: ClusterRef) -> Optional[str]:
    """The cluster's current-job parameter (the submitted job, JSON), or None if no job was ever submitted."""
    return read_current_job(client, ref).value


def parameter_version(client: ClientFactory, ref: ClusterRef, version: int) -> str:
    """The current-job parameter's value at ``version`` (SSM keeps a parameter's last 100 versions)."""
    name = f"{ref.spec['current_job_parameter']}:{version}"
    return str(client("ssm").get_parameter(Name=name)["Parameter"]["Value"])


def set_current_job(client: ClientFactory, ref: ClusterRef, value: Optional[str]) -> Optional[int]:
    """Write the current-job parameter (None: delete it, as before the first submit); returns the version the
    write made (None for a delete)."""
    ssm, name = client("ssm"), str(ref.spec["current_job_parameter"])
    if value is not None:
        return int(ssm.put_parameter(Name=name, Value=value, Type="String", Overwrite=True)["Version"])
    try:
        ssm.delete_parameter(Name=name)
    except ssm.exceptions.ParameterNotFound:
        pass
    return None


def job_id_in(ref: ClusterRef, value: str) -> str:
    """The job id in a current-job parameter's value; a one-line :class:`JobError` if it is not a job."""
    try:
        job = json.loads(value)
        if isinstance(job, dict) and isinstance(job.get("job_id"), str):
            return job["job_id"]
    except ValueError:
        pass
    name = ref.spec["current_job_parameter"]
    raise JobError(
        f"SSM parameter {name} is not a job trainctl submitted (a JSON object with a job_id): {value[:40]!r}; "
        f"with the group at 0, the next submit replaces it (or: aws ssm delete-parameter --name {name})"
    )


def current_job_id(client: ClientFactory, ref: ClusterRef) -> Optional[str]:
    """The job id in the cluster's current-job parameter, or None if no job was ever submitted."""
    value = current_job_value(client, ref)
    return None if value is None else job_id_in(ref, value)


def submitted_job(client: ClientFactory, ref: ClusterRef, job_id: str) -> dict[str, Any]:
    """The job ``job_id`` as submitted (its current-job parameter value), from the parameter or, for an earlier
    job, its history (SSM keeps the last 100 versions); {} when it is no longer there."""
    current = current_job_value(client, ref)
    values = [] if current is None else [current]
    if current is None or _job(current).get("job_id") != job_id:
        pages = client("ssm").get_paginator("get_parameter_history")
        try:
            history = pages.paginate(Name=str(ref.spec["current_job_parameter"]))
            values = [str(v["Value"]) for page in history for v in page["Parameters"]][::-1]  # newest first
        except client("ssm").exceptions.ParameterNotFound:
            values = []
    return next((job for job in map(_job, values) if job.get("job_id") == job_id), {})


def _job(value: str) -> dict[str, Any]:
    try:
        job = json.loads(value)
    except ValueError:
        return {}
    return job if isinstance(job, dict) else {}
