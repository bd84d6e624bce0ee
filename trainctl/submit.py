"""Submitting a job: upload the code archive under the cluster's prefix, write the current-job parameter the node
agent merges over the job spec (compare-and-set), set the group's desired capacity; all or nothing."""

from __future__ import annotations

import json
import secrets
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Optional

from boto3.exceptions import S3UploadFailedError
from boto3.s3.transfer import S3Transfer, TransferConfig
from botocore.exceptions import BotoCoreError, ClientError

from bootstrap_scripts.spot_training.job_spec import PARAMETER_MAX_BYTES, JobSpecError, check_job, stall_too_short
from bootstrap_scripts.spot_training.protocol import code_key
from trainctl.budget import team_budget
from trainctl.checkpoints import copy_checkpoints, delete_keys
from trainctl.cluster import ClientFactory, ClusterRef, JobError, group
from trainctl.code_archive import check_script, check_setup, pack_code
from trainctl.current_job import (
    Beaten,
    CurrentJob,
    job_id_in,
    parameter_version,
    read_current_job,
    set_current_job,
)
from trainctl.job_queue import queue_rows
from trainctl.job_state import job_exists, job_state, submitted
from trainctl.queue_submit import queue_job

LARGE_CODE_BYTES = 1 << 30  # a code archive above this gets a warning: data belongs in S3, not in --code
TRANSFER = TransferConfig()  # boto3's managed upload: multipart above 8 MiB (no 5 GB PutObject limit)


def new_job_id() -> str:
    return time.strftime("job-%Y%m%d-%H%M%S-", time.gmtime()) + secrets.token_hex(2)


def submit(
    client: ClientFactory,
    ref: ClusterRef,
    code_dir: Path,
    *,
    command: str,
    nodes: int,
    job_id: Optional[str] = None,
    resume_from: Optional[str] = None,
    report: Callable[[str], None] = lambda _: None,
    **overrides: Any,
) -> str:
    """Upload the code, write the current-job parameter, scale the group to ``nodes``; returns the job id. To a busy
    cluster (or one with queued jobs), queue the job instead (:func:`queue_job`); ``report`` gets its place.

    ``overrides``: other keys the node agent accepts from a submitted job (python, min_nodes, max_nodes,
    checkpoint_interval_s, max_restarts, interruption_grace_s, ..., and the job's setup, env, secrets and inputs),
    checked with the agent's own rules first; the command's script and the setup script must be in the archive.
    ``resume_from``: an earlier job of the cluster that has ended (nothing writes to it any more); its newest intact
    checkpoints are copied under the new job (:func:`copy_checkpoints`), so
    the nodes resume from them as from their own. ``report`` gets a line saying which step the job starts from,
    one when ``nodes`` is below the cluster's min_nodes (the job's min_nodes is lowered to ``nodes``), one when
    the budget cannot be read, and one when the code archive is above :data:`LARGE_CODE_BYTES`.
    Nothing is left of a submit that fails halfway (:func:`take_back`). One that loses a race with another submit
    to the idle cluster takes its write back and is queued behind it (:func:`place_job`): the current-job
    parameter is written compare-and-set (its version, read before the cluster was found idle, must be the one this
    write replaced).
    """
    if not 1 <= nodes <= int(ref.spec["max_nodes"]):
        raise JobError(f"--nodes must be from 1 to {ref.spec['max_nodes']} (the cluster's max_nodes), got {nodes}")
    check_budget(client, ref, report)
    job_id = job_id or new_job_id()
    job = {"job_id": job_id, "code_key": code_key(ref.prefix, job_id), "command": command, "nodes": nodes}
    job.update(overrides)
    cluster_min = int(ref.spec["min_nodes"])
    lowered = "min_nodes" not in job and nodes < cluster_min  # else the job could never start: made visible below
    job.setdefault("min_nodes", min(cluster_min, nodes))
    argv = checked_job(ref, job)
    with tempfile.TemporaryDirectory(prefix="trainctl-code-") as tmp:  # on disk: no archive held in memory
        archive = Path(tmp) / f"{job_id}.tar.gz"
        with archive.open("wb") as out:
            names = pack_code(code_dir, out)  # every refusal comes before the first write
        check_script(argv, names, code_dir)
        check_setup(overrides.get("setup"), names, code_dir)
        size = archive.stat().st_size
        if size > LARGE_CODE_BYTES:
            report(
                f"the code archive of {code_dir} is {size / (1 << 20):,.0f} MiB (above {LARGE_CODE_BYTES >> 20:,} "
                "MiB): data belongs in S3 (the job reads it from there), not in --code"
            )
        before, busy = cluster_busy(client, ref)
        check_new_job(client, ref, job_id, resume_from)
        steps = place_job(client, ref, job, archive, before, busy, resume_from, report)
    if lowered:
        report(f"job {job_id}: min_nodes lowered from the cluster's {cluster_min} to {nodes} (--nodes {nodes})")
    if steps:
        report(
            f"job {job_id} starts from checkpoint {steps[0]} of {resume_from} (copied: {', '.join(map(str, steps))})"
        )
    return job_id


def place_job(
    client: ClientFactory,
    ref: ClusterRef,
    job: dict[str, Any],
    archive: Path,
    before: CurrentJob,
    busy: Optional[str],
    resume_from: Optional[str],
    report: Callable[[str], None],
) -> list[int]:
    """Start the job on an idle cluster with an empty queue (:func:`write_job`), else queue it (:func:`queue_job`:
    ``busy`` says why); returns the steps copied. When another submit of another job got to the idle cluster first,
    this one has taken itself back and goes into the queue behind it instead of being refused."""
    if busy is None and not queue_rows(client, ref):  # the queue's jobs go first
        try:
            return write_job(client, ref, job, archive, before, resume_from, report)
        except Beaten as exc:
            if exc.winner in (None, job["job_id"]):
                raise
            busy = f"another submit started job {exc.winner} first"
    return queue_job(client, ref, job, archive, resume_from, report, busy, upload)


def check_budget(client: ClientFactory, ref: ClusterRef, report: Callable[[str], None]) -> None:
    """A one-line :class:`JobError` when the team's budget is spent; a reported line when it cannot be read."""
    budget = team_budget(client, ref.team)
    if isinstance(budget, str):
        report(f"budget of team {ref.team}: {budget}; not checked")
    elif budget is not None and budget.exceeded:
        raise JobError(
            f"team {ref.team} has spent {budget.spent_usd:.2f} of its {budget.limit_usd:.2f} USD budget this month "
            f"({budget.name}); raise budget.usd_per_month in its team file or wait for the next month"
        )


def checked_job(ref: ClusterRef, job: dict[str, Any]) -> list[str]:
    """The job's command as the node agent parses it; a one-line :class:`JobError` for a job the agent would refuse
    (a refused job must not start, and bill, any node), one too long for its SSM parameter, or one whose checkpoint
    interval breaks the team file's rule."""
    try:
        merged = check_job(ref.spec, job, str(ref.spec["current_job_parameter"]))
    except JobSpecError as exc:
        raise JobError(f"the node agent would refuse this job: {exc}") from None
    size = len(json.dumps(job).encode())
    if size > PARAMETER_MAX_BYTES:  # refused by SSM after the code's upload otherwise
        raise JobError(
            f"the job takes {size:,} bytes as JSON, above the {PARAMETER_MAX_BYTES:,} of its SSM "
            f"parameter: shorten --command (long arguments go in a file of your code){_parts_hint(job)}"
        )
    stall, interval = merged["stall_timeout_s"], merged["checkpoint_interval_s"]
    if stall_too_short(stall, interval):  # the team file's rule, which an override must not get round
        raise JobError(
            f"--checkpoint-interval-s {interval:g} is more than half the cluster's job.stall_timeout_s {stall}: a node "
            "whose only sign of progress is its checkpoints would be ended as hung between two; use at most "
            f"{stall / 2:g}"
        )
    return list(merged["argv"])


def _parts_hint(job: dict[str, Any]) -> str:
    """What else to shorten when the job has its own parts."""
    parts = [key for key in ("env", "secrets", "inputs") if job.get(key)]
    return f" or its {', '.join(parts)}" if parts else ""


def check_new_job(client: ClientFactory, ref: ClusterRef, job_id: str, resume_from: Optional[str]) -> None:
    """A one-line :class:`JobError` when the cluster has objects of ``job_id`` already (its code, checkpoints and
    markers would mix with the new job's) or ``resume_from`` is not a job of the cluster."""
    if job_exists(client, ref, job_id):
        if submitted(client, ref, job_id):
            why = f"to go on from its checkpoint: --resume-from {job_id}"
        else:
            why = f"objects of a submit that did not finish are under s3://{ref.bucket}/{ref.job_prefix(job_id)}"
        raise JobError(f"job {job_id} already exists on {ref.team}/{ref.cluster}; choose another --job-id ({why})")
    if resume_from is not None and not submitted(client, ref, resume_from):
        raise JobError(f"--resume-from {resume_from}: no such job on {ref.team}/{ref.cluster} (see 'trainctl list')")


def write_job(
    client: ClientFactory,
    ref: ClusterRef,
    job: dict[str, Any],
    archive: Path,
    before: CurrentJob,
    resume_from: Optional[str],
    report: Callable[[str], None],
) -> list[int]:
    """Copy ``resume_from``'s checkpoints, upload the code archive, write the current-job parameter compare-and-set
    (``before``: its version when the cluster was found idle), scale the group; returns the steps copied. All or
    nothing: what a failure leaves would be billed, would block the job id or start nodes (:func:`take_back`)."""
    job_id = str(job["job_id"])
    mine: Optional[int] = None  # the current-job parameter's version this submit wrote, for the clean-up
    written: list[str] = []  # keys this submit wrote, for the clean-up
    try:
        steps = [] if resume_from is None else copy_checkpoints(client, ref, resume_from, job_id, written)
        written.append(str(job["code_key"]))
        upload(client("s3"), archive, ref.bucket, written[-1])
        now = read_current_job(client, ref)  # the copies and the upload take time: another submit may be done
        if now.version != before.version:
            raise Beaten(ref, job_id, now.value)
        mine = set_current_job(client, ref, json.dumps(job))
        if mine != before.version + 1:  # SSM has no conditional put: its versions order the writes
            raise Beaten(ref, job_id, parameter_version(client, ref, before.version + 1))
        suspend_az_rebalance(client, ref, report)
        client("autoscaling").set_desired_capacity(AutoScalingGroupName=ref.group, DesiredCapacity=int(job["nodes"]))
    except BaseException as exc:
        # When the same job id won (a retried CI step: the same arguments), the keys written are the winner's too.
        same_job = isinstance(exc, Beaten) and exc.winner == job_id
        take_back(client, ref, mine, [] if same_job else written, report)
        raise
    return steps


def upload(s3: Any, path: Path, bucket: str, key: str) -> None:
    """boto3's managed upload (multipart above :data:`TRANSFER`'s threshold: no 5 GB PutObject limit); S3's answer
    to a failed part or PutObject is raised as the ClientError it is (boto3 wraps it in S3UploadFailedError)."""
    try:
        S3Transfer(s3, TRANSFER).upload_file(str(path), bucket, key)
    except S3UploadFailedError as exc:
        if isinstance(exc.__context__, ClientError):
            raise exc.__context__ from None
        raise


def cluster_busy(client: ClientFactory, ref: ClusterRef) -> tuple[CurrentJob, Optional[str]]:
    """The current-job parameter, read before the group (a submit's compare-and-set starts from its version), and
    why the cluster is busy (None: its group is at 0 with no instance in it). Nodes read the job when they boot: a
    new job written while the group runs another would share the group with it, so a busy cluster's next job
    waits in the queue, and the end of the current job starts it."""
    before = read_current_job(client, ref)
    members = group(client, ref)
    desired, nodes = int(members["DesiredCapacity"]), len(members["Instances"])
    if desired == 0 and not nodes:
        return before, None
    current = None if before.value is None else job_id_in(ref, before.value)
    state = None if current is None else job_state(client, ref, current)
    return before, f"its group is at {desired} with {nodes} node(s) for job {current} ({state})"


def suspend_az_rebalance(client: ClientFactory, ref: ClusterRef, report: Callable[[str], None]) -> None:
    """Suspend the group's AZRebalance process (idempotent). Across several zones, Auto Scaling would otherwise
    launch a node in the emptier zone and then terminate one in the fuller one, with no spot notice: a hard kill
    of a training node. CloudFormation has no property for it, so the submit that starts the group sets it. An
    operator who may not suspend processes gets one line, and the job goes on."""
    try:
        client("autoscaling").suspend_processes(AutoScalingGroupName=ref.group, ScalingProcesses=["AZRebalance"])
    except ClientError as exc:
        code = exc.response.get("Error", {}).get("Code", "error")
        report(
            f"could not suspend AZRebalance on {ref.group} ({code}): across several zones Auto Scaling may end a node "
            "to even them out, with no spot notice; allow autoscaling:SuspendProcesses on the group"
        )


def take_back(
    client: ClientFactory, ref: ClusterRef, mine: Optional[int], written: list[str], report: Callable[[str], None]
) -> None:
    """Undo a submit that failed halfway: its write of the current-job parameter (version ``mine``, None if it
    wrote none) replaced by the value before it, but only while that write is still the newest (a later one is
    another submit's, and stays); the objects it wrote deleted. What cannot be undone is reported."""
    name = ref.spec["current_job_parameter"]
    try:
        if mine is not None and read_current_job(client, ref).version == mine:
            set_current_job(client, ref, parameter_version(client, ref, mine - 1) if mine > 1 else None)
        elif mine is not None:
            report(f"{name} left as it is: another submit wrote it after this one")
    except (ClientError, BotoCoreError) as exc:
        report(f"could not put back {name} as it was ({exc})")
    left = delete_keys(client("s3"), ref.bucket, written)
    if left:
        report(f"could not delete {len(left)} object(s) this submit wrote: {', '.join(left)}")
