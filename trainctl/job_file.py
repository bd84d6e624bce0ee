"""The job file ``trainctl submit JOB_FILE`` reads: its schema (:class:`JobFile`) and loader.

A job file holds the options of ``trainctl submit`` under the same names (``--checkpoint-interval-s`` is
``checkpoint_interval_s:``), and a job's own parts: ``setup``, ``env``, ``secrets``, ``inputs``
(bootstrap_scripts/spot_training/job_parts.py). A mistake is one line naming the file, the key and the fix, as in the
team file; what needs the cluster (the team's secret prefix, its data buckets, the agent's rules for the job
settings) is checked by :func:`check_against_cluster` once the cluster is found.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Optional

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError

from bootstrap_scripts.spot_training.job_spec import JOB_ID_RE, JobSpecError, check_job
from team_config.loader import ConfigError, read_yaml_mapping
from team_config.model import Name
from team_config.validation_errors import error_lines
from trainctl.cluster import ClusterRef, JobError

REFERENCE = "docs/reference/job-file.md"


def unset(description: str) -> Any:
    """A key the file may leave out (None: the option's or the cluster's value)."""
    return Field(None, description=description)


JobId = Annotated[str, StringConstraints(pattern=JOB_ID_RE.pattern)]


class Strict(BaseModel):
    # strict: YAML gives numbers and booleans already; `yes` must not become a restart count.
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class InputEntry(Strict):
    s3: str = Field(
        description="Where the data is: s3://bucket/prefix, the bucket one of the team file's data_buckets."
    )
    path: str = Field(description="The absolute directory on each node the objects under the prefix are downloaded to.")


class JobFile(Strict):
    """One job; every key is optional. The options of ``trainctl submit`` override the file's values."""

    cluster: Optional[Name] = unset("The cluster to run on (--cluster).")
    team: Optional[Name] = unset("The cluster's team (--team); default: default.")
    code: Optional[str] = unset(
        "The directory packed as the job's code archive, relative to the job file (--code); default: "
        "the job file's directory.",
    )
    command: Optional[str] = unset(
        "Entry command: python SCRIPT [ARGS] or python -m MODULE [ARGS] (--command); default: the "
        "cluster's job.command."
    )
    nodes: Optional[int] = Field(
        None, ge=1, description="Number of nodes (--nodes); default: the cluster's desired_nodes."
    )
    setup: Optional[str] = unset(
        "A script in the code directory, run with bash on each node before the trainer, once per node boot (--setup).",
    )
    env: dict[str, str] = Field(
        {}, description="Plain environment variables of the trainer, NAME: value; shown by trainctl status (--env)."
    )
    secrets: dict[str, str] = Field(
        {},
        description="Environment variables of the trainer read from secrets, NAME: ssm:/spot-training-secrets/<team>/"
        "... (an SSM SecureString parameter) or secretsmanager:spot-training-secrets/<team>/... (a Secrets Manager "
        "secret); only the names travel, trainctl status shows only the variable names (--secret).",
    )
    inputs: list[InputEntry] = Field(
        [], description="S3 data downloaded to each node before the trainer starts: - {s3: ..., path: ...} (--input)."
    )
    job_id: Optional[JobId] = unset("Job id (--job-id); default: job-<time>-<random>.")
    resume_from: Optional[JobId] = unset(
        "An earlier job of the cluster whose newest intact checkpoint the job starts from (--resume-from)."
    )
    python: Optional[str] = unset("Interpreter of the training environment on the node (--python).")
    nproc_per_node: Optional[int] = unset("Processes per node (--nproc-per-node).")
    min_nodes: Optional[int] = unset("Fewest nodes the job trains on (--min-nodes).")
    max_nodes: Optional[int] = unset("Most nodes the job trains on (--max-nodes).")
    checkpoint_interval_s: Optional[float] = unset(
        "Fixed checkpoint interval in seconds (--checkpoint-interval-s); default: Young/Daly."
    )
    checkpoint_wait_for_upload: Optional[bool] = unset(
        "Train on only once each checkpoint is durable in S3 (--checkpoint-wait-for-upload)."
    )
    mean_time_between_interruptions_s: Optional[float] = unset(
        "Expected seconds between spot interruptions, for the Young/Daly interval "
        "(--mean-time-between-interruptions-s)."
    )
    max_restarts: Optional[int] = unset("Restarts of the trainer before the job fails (--max-restarts).")
    interruption_grace_s: Optional[float] = unset(
        "Seconds of a spot notice the emergency checkpoint may take (--interruption-grace-s)."
    )
    stall_timeout_s: Optional[int] = unset(
        "Seconds without progress before the trainer is ended as hung; 0: off (--stall-timeout-s)."
    )


# Keys that say where and what to run rather than what the node agent reads from the submitted job.
PLACEMENT_KEYS = ("cluster", "team", "code", "resume_from")


def load_job_file(path: Path) -> JobFile:
    """The job file at ``path``; a one-line :class:`JobError` naming the file, the key and the fix."""
    try:
        _, raw = read_yaml_mapping(
            path, empty="write the job's keys (at least cluster:)", keys="cluster:, command:, ..."
        )
    except ConfigError as exc:
        raise JobError(str(exc)) from None
    try:
        return JobFile.model_validate(raw)
    except ValidationError as exc:
        # one line: an unknown key first (a misspelt one also leaves its key missing; the fix is the spelling)
        errors = sorted(exc.errors(), key=lambda error: error["type"] != "extra_forbidden")
        [first, *_] = error_lines(errors, root=JobFile, reference=REFERENCE)
        raise JobError(f"{path}: {first}") from None


def job_values(job_file: JobFile) -> dict[str, Any]:
    """The keys the file sets that the node agent reads from a submitted job (job id, command, settings, parts)."""
    values = job_file.model_dump(exclude_none=True, exclude=set(PLACEMENT_KEYS))
    return {key: value for key, value in values.items() if value not in ({}, [])}


def code_dir(path: Path, job_file: JobFile) -> Path:
    """The job's code directory: the file's ``code``, relative to the file, or the file's directory."""
    return path.parent / job_file.code if job_file.code is not None else path.parent


def check_against_cluster(path: Path, values: dict[str, Any], ref: ClusterRef) -> None:
    """The node agent's rules for the job file's ``values`` (:func:`job_values`, less what options override) on
    cluster ``ref``: the team's secret prefix, the team file's data buckets, the job settings' ranges; a one-line
    :class:`JobError` naming the file and the key."""
    values = dict(values)
    if "nodes" in values:  # as submit does: a job on fewer nodes than the cluster's min_nodes lowers its own
        values.setdefault("min_nodes", min(int(ref.spec["min_nodes"]), values["nodes"]))
    placeholder = "job-file-check"  # check_job wants an id and a code key; the file's own are checked as they are
    job = {"job_id": placeholder, "code_key": f"{ref.prefix}code/{placeholder}.tar.gz", **values}
    try:
        check_job(ref.spec, job, str(path))
    except JobSpecError as exc:
        raise JobError(f"{path}: {exc}") from None
