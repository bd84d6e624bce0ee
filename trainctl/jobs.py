"""Jobs on a deployed cluster, through the AWS APIs only (real AWS or the emulated cloud alike).

A cluster is found by team and cluster name: its job-spec parameter ``/spot-training/<team>/<cluster>/job-spec``
(written by the stack) names the bucket, prefix and current-job parameter; its Auto Scaling group carries the
tags ``spot-training:team`` and ``spot-training:cluster``. Submitting a job = upload the code tarball under the
cluster's prefix, write the current-job parameter the node agent merges over the job spec, set the group's
desired capacity. Everything the node agent writes (checkpoints, markers) is read back from S3.
"""

from __future__ import annotations

import json
import os
import posixpath
import re
import secrets
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import IO, Any, Optional, Union

import pathspec
from boto3.exceptions import S3UploadFailedError
from boto3.s3.transfer import S3Transfer, TransferConfig
from botocore.exceptions import BotoCoreError, ClientError

from bootstrap_scripts.spot_training.job_spec import (
    CHECKPOINT_FOLDER,
    CODE_FOLDER,
    END_MARKERS,
    PARAMETER_MAX_BYTES,
    SPOT_NOTICE,
    JobSpecError,
    check_job,
    stall_too_short,
)
from bootstrap_scripts.spot_training.sync_state import step_number
from budget_guard.handler import read_marker, written_at
from team_config.naming import CLUSTER_TAG, TEAM_TAG, is_budget_of, parameter_path

ClientFactory = Callable[[str], Any]
MANIFEST = "spot-training-manifest.json"  # bootstrap_scripts/node_agent.py writes it last
ENDED = END_MARKERS
NOT_RUNNING = (*ENDED, "UNFINISHED")  # job_state: no node runs it, none will
COPIED_CHECKPOINTS = 2  # as many as the node agent keeps in S3 by default (SPOT_TRAINING_KEEP_CHECKPOINTS)
_PLAN = re.compile(r"\bplan: (\d+) steps\b")
STREAM_PAGES = 200  # bounded: 200 pages of up to 50 log streams (one per node of a job)
LIST_PASSES = 3  # listings of a job's checkpoints when manifests vanish under one (the agent pruning)
FILTER_PAGES = 1000  # bounded: 1000 pages of FilterLogEvents (a page may be empty while CloudWatch searches)
ALWAYS_SKIPPED = (".git", "__pycache__", "*.pyc", ".venv", "node_modules")
LARGE_CODE_BYTES = 1 << 30  # a code archive above this gets a warning: data belongs in S3, not in --code
TRANSFER = TransferConfig()  # boto3's managed upload: multipart above 8 MiB (no 5 GB PutObject limit)
BUDGET_UNKNOWN = "unknown (no budgets:ViewBudget)"
ACCESS_DENIED = ("AccessDeniedException", "AccessDenied")
# Node markers written when a training attempt starts or ends (a boot, each torchrun attempt, a notice): a
# checkpoint before one of them and one after are of different runs, and their pace includes the restart.
RUN_MARKERS = ("boot", "training", "leaving")


class JobError(Exception):
    """A one-line reason (unknown team/cluster/job, bad code directory)."""


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
class ClusterRef:
    team: str
    cluster: str
    spec: dict[str, Any]
    group: str

    @property
    def bucket(self) -> str:
        return str(self.spec["bucket"])

    @property
    def prefix(self) -> str:
        return str(self.spec["prefix"])

    def job_prefix(self, job_id: str) -> str:
        return f"{self.prefix}{job_id}/"

    @property
    def code_prefix(self) -> str:
        """Where the jobs' code archives are: ``<prefix>code/<job>.tar.gz`` (so no job may be called ``code``)."""
        return f"{self.prefix}{CODE_FOLDER}/"


def find_cluster(client: ClientFactory, team: str, cluster: str) -> ClusterRef:
    name = f"{parameter_path(team, cluster)}/job-spec"
    ssm = client("ssm")
    try:
        spec = json.loads(ssm.get_parameter(Name=name)["Parameter"]["Value"])
    except ssm.exceptions.ParameterNotFound:
        raise JobError(
            f"no cluster {team}/{cluster}: SSM parameter {name} does not exist (is the stack deployed?)"
        ) from None
    wanted = {TEAM_TAG: team, CLUSTER_TAG: cluster}
    for page in client("autoscaling").get_paginator("describe_auto_scaling_groups").paginate():
        for group in page["AutoScalingGroups"]:
            tags = {t["Key"]: t["Value"] for t in group.get("Tags", [])}
            if all(tags.get(k) == v for k, v in wanted.items()):
                return ClusterRef(team, cluster, spec, group["AutoScalingGroupName"])
    raise JobError(f"no Auto Scaling group tagged {TEAM_TAG}={team}, {CLUSTER_TAG}={cluster}")


def pack_code(directory: Path, out: IO[bytes]) -> list[str]:
    """Write to ``out`` a gzipped tarball of ``directory`` (relative paths, regular files only), minus what its
    ``.gitignore`` leaves out (git's rules, by pathspec; nested ``.gitignore`` files are not read) and
    ``ALWAYS_SKIPPED``; returns the members' names. A file that cannot be read is a one-line :class:`JobError`
    naming it.
    """
    if not directory.is_dir():
        what = "is a file, not a directory" if directory.exists() else "does not exist"
        raise JobError(f"code directory {directory} {what}; give the folder that holds the training script")
    try:
        return _pack(directory, out)
    except UnicodeDecodeError as exc:
        raise JobError(f"{directory / '.gitignore'}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except OSError as exc:
        raise JobError(f"{exc.filename}: cannot read it for the code archive ({exc.strerror})") from None


def _pack(directory: Path, out: IO[bytes]) -> list[str]:
    always = pathspec.GitIgnoreSpec.from_lines(ALWAYS_SKIPPED)  # a "!" line of the .gitignore cannot bring them back
    gitignore = directory / ".gitignore"
    ignored = pathspec.GitIgnoreSpec.from_lines(
        gitignore.read_text(encoding="utf-8-sig").splitlines() if gitignore.is_file() else []  # git skips a BOM
    )
    # A folder is skipped whole only when no "!" line could bring back a file in it; otherwise each of its files
    # is matched on its own (git itself keeps out a file whose folder is excluded: then this archive holds more).
    negated = any(pattern.include is False for pattern in ignored.patterns)

    def left_out(rel: str) -> bool:
        return always.match_file(rel) or ignored.match_file(rel)

    def skipped_folder(rel: str) -> bool:
        return always.match_file(rel) or (not negated and ignored.match_file(rel))

    names: list[str] = []
    with tarfile.open(fileobj=out, mode="w:gz") as tar:
        for root, dirs, files in os.walk(directory):
            rel_root = Path(root).relative_to(directory).as_posix()
            prefix = "" if rel_root == "." else rel_root + "/"
            dirs[:] = sorted(d for d in dirs if not skipped_folder(f"{prefix}{d}/"))
            for name in sorted(files):
                path = Path(root) / name
                if path.is_file() and not path.is_symlink() and not left_out(prefix + name):
                    tar.add(path, arcname=prefix + name, recursive=False)
                    names.append(prefix + name)
    return names


def check_script(argv: list[str], names: list[str], directory: Path) -> None:
    """A one-line :class:`JobError` unless the command's script (``argv[0]``, the parsed command; a ``-m`` module
    is not checked) is a member of the code archive: else a billed node would boot only to fail."""
    if argv[0] == "-m":
        return
    script = posixpath.normpath(argv[0])
    if script not in names:
        raise JobError(
            f"the command's script {argv[0]} is not in the code archive of {directory} (not there, left out by "
            ".gitignore or always skipped, or a symbolic link: links are left out)"
        )


@dataclass(frozen=True)
class Budget:
    name: str
    limit_usd: float
    spent_usd: float

    @property
    def exceeded(self) -> bool:
        return self.spent_usd >= self.limit_usd


def team_budget(client: ClientFactory, team: str) -> Union[Budget, str, None]:
    """The team's AWS Budgets budget (``budget:`` in its team file), None if it has none, or
    :data:`BUDGET_UNKNOWN` when the caller may not read it (no ``budgets:ViewBudget``)."""
    account = client("sts").get_caller_identity()["Account"]
    budgets = client("budgets")
    try:  # its name carries a hash of its notifications (team_config.naming.budget_name): found by listing
        pages = budgets.get_paginator("describe_budgets").paginate(AccountId=account)
        found = next(
            (b for page in pages for b in page.get("Budgets", []) if is_budget_of(team, b["BudgetName"])), None
        )
    except budgets.exceptions.NotFoundException:  # an account without any budget
        return None
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") in ACCESS_DENIED:
            return BUDGET_UNKNOWN
        raise
    if found is None:
        return None
    spent = found.get("CalculatedSpend", {}).get("ActualSpend", {}).get("Amount", 0)
    return Budget(found["BudgetName"], float(found["BudgetLimit"]["Amount"]), float(spent))


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
    """Upload the code, write the current-job parameter, scale the group to ``nodes``; returns the job id.

    ``overrides``: other keys the node agent accepts from a submitted job (python, min_nodes, max_nodes,
    checkpoint_interval_s, max_restarts, interruption_grace_s, ...), checked with the agent's own rules first.
    ``resume_from``: an earlier job of the cluster (nothing writes to it any more: the group is idle, see
    :func:`check_idle`); its newest intact checkpoints are copied under the new job (:func:`copy_checkpoints`), so
    the nodes resume from them as from their own. ``report`` gets a line saying which step the job starts from,
    one when ``nodes`` is below the cluster's min_nodes (the job's min_nodes is lowered to ``nodes``), one when
    the budget cannot be read, and one when the code archive is above :data:`LARGE_CODE_BYTES`.
    Nothing is left of a submit that fails halfway (:func:`take_back`), nor of one that loses a race with another
    submit to the cluster: the current-job parameter is written compare-and-set (its version, read before the
    cluster was found idle, must be the one this write replaced).
    """
    if not 1 <= nodes <= int(ref.spec["max_nodes"]):
        raise JobError(f"--nodes must be from 1 to {ref.spec['max_nodes']} (the cluster's max_nodes), got {nodes}")
    budget = team_budget(client, ref.team)
    if isinstance(budget, str):
        report(f"budget of team {ref.team}: {budget}; not checked")
    elif budget is not None and budget.exceeded:
        raise JobError(
            f"team {ref.team} has spent {budget.spent_usd:.2f} of its {budget.limit_usd:.2f} USD budget this month "
            f"({budget.name}); raise budget.usd_per_month in its team file or wait for the next month"
        )
    job_id = job_id or new_job_id()
    code_key = f"{ref.code_prefix}{job_id}.tar.gz"
    job = {"job_id": job_id, "code_key": code_key, "command": command, "nodes": nodes, **overrides}
    cluster_min = int(ref.spec["min_nodes"])
    lowered = "min_nodes" not in job and nodes < cluster_min  # else the job could never start: made visible below
    job.setdefault("min_nodes", min(cluster_min, nodes))
    try:  # the agent's own checks: a job it would refuse must not start (and bill) any node
        merged = check_job(ref.spec, job, str(ref.spec["current_job_parameter"]))
    except JobSpecError as exc:
        raise JobError(f"the node agent would refuse this job: {exc}") from None
    argv = merged["argv"]
    value = json.dumps(job)
    if len(value.encode()) > PARAMETER_MAX_BYTES:  # refused by SSM after the code's upload otherwise
        raise JobError(
            f"the job takes {len(value.encode()):,} bytes as JSON, above the {PARAMETER_MAX_BYTES:,} of its SSM "
            "parameter: shorten --command (long arguments go in a file of your code)"
        )
    stall, interval = merged["stall_timeout_s"], merged["checkpoint_interval_s"]
    if stall_too_short(stall, interval):  # the team file's rule, which an override must not get round
        raise JobError(
            f"--checkpoint-interval-s {interval:g} is more than half the cluster's job.stall_timeout_s {stall}: a node "
            "whose only sign of progress is its checkpoints would be ended as hung between two; use at most "
            f"{stall / 2:g}"
        )
    with tempfile.TemporaryDirectory(prefix="trainctl-code-") as tmp:  # on disk: no archive held in memory
        archive = Path(tmp) / f"{job_id}.tar.gz"
        with archive.open("wb") as out:
            names = pack_code(code_dir, out)  # every refusal comes before the first write
        check_script(argv, names, code_dir)
        size = archive.stat().st_size
        if size > LARGE_CODE_BYTES:
            report(
                f"the code archive of {code_dir} is {size / (1 << 20):,.0f} MiB (above {LARGE_CODE_BYTES >> 20:,} "
                "MiB): data belongs in S3 (the job reads it from there), not in --code"
            )
        before = check_idle(client, ref)
        if job_exists(client, ref, job_id):  # its code, checkpoints and markers would mix with the new job's
            if submitted(client, ref, job_id):
                why = f"to go on from its checkpoint: --resume-from {job_id}"
            else:
                why = f"objects of a submit that did not finish are under s3://{ref.bucket}/{ref.job_prefix(job_id)}"
            raise JobError(f"job {job_id} already exists on {ref.team}/{ref.cluster}; choose another --job-id ({why})")
        if resume_from is not None and not submitted(client, ref, resume_from):
            raise JobError(
                f"--resume-from {resume_from}: no such job on {ref.team}/{ref.cluster} (see 'trainctl list')"
            )
        mine: Optional[int] = None  # the current-job parameter's version this submit wrote, for the clean-up
        written: list[str] = []  # keys this submit wrote, for the clean-up
        steps: list[int] = []
        try:
            if resume_from is not None:
                steps = copy_checkpoints(client, ref, resume_from, job_id, written)
            written.append(code_key)
            upload(client("s3"), archive, ref.bucket, code_key)
            now = read_current_job(client, ref)  # the copies and the upload take time: another submit may be done
            if now.version != before.version:
                raise Beaten(ref, job_id, now.value)
            mine = set_current_job(client, ref, value)
            if mine != before.version + 1:  # SSM has no conditional put: its versions order the writes
                raise Beaten(ref, job_id, parameter_version(client, ref, before.version + 1))
            suspend_az_rebalance(client, ref, report)
            client("autoscaling").set_desired_capacity(AutoScalingGroupName=ref.group, DesiredCapacity=nodes)
        except BaseException as exc:
            # All or nothing: what is left would be billed, would block the job id or start nodes. When the same job
            # id won (a retried CI step: the same arguments), the keys written are the winner's too.
            same_job = isinstance(exc, Beaten) and exc.winner == job_id
            take_back(client, ref, mine, [] if same_job else written, report)
            raise
    if lowered:
        report(f"job {job_id}: min_nodes lowered from the cluster's {cluster_min} to {nodes} (--nodes {nodes})")
    if steps:
        report(
            f"job {job_id} starts from checkpoint {steps[0]} of {resume_from} (copied: {', '.join(map(str, steps))})"
        )
    return job_id


def upload(s3: Any, path: Path, bucket: str, key: str) -> None:
    """boto3's managed upload (multipart above :data:`TRANSFER`'s threshold: no 5 GB PutObject limit); S3's answer
    to a failed part or PutObject is raised as the ClientError it is (boto3 wraps it in S3UploadFailedError)."""
    try:
        S3Transfer(s3, TRANSFER).upload_file(str(path), bucket, key)
    except S3UploadFailedError as exc:
        if isinstance(exc.__context__, ClientError):
            raise exc.__context__ from None
        raise


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
    prefix = f"{ref.job_prefix(job_id)}{CHECKPOINT_FOLDER}/"
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
            name, _, rel = obj["Key"][len(prefix) :].partition("/")
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


def submitted(client: ClientFactory, ref: ClusterRef, job_id: str) -> bool:
    """Whether a job of that id was submitted to the cluster (its code archive is there)."""
    found = client("s3").list_objects_v2(Bucket=ref.bucket, Prefix=f"{ref.code_prefix}{job_id}.", MaxKeys=1)
    return bool(found.get("KeyCount"))


def job_exists(client: ClientFactory, ref: ClusterRef, job_id: str) -> bool:
    """Whether the cluster has anything of a job of that id: its code archive, or objects under its prefix."""
    found = client("s3").list_objects_v2(Bucket=ref.bucket, Prefix=ref.job_prefix(job_id), MaxKeys=1)
    return bool(found.get("KeyCount")) or submitted(client, ref, job_id)


@dataclass(frozen=True)
class CurrentJob:
    """The current-job parameter as read: its value (None: never submitted) and SSM version (0: none)."""

    value: Optional[str]
    version: int


def check_idle(client: ClientFactory, ref: ClusterRef) -> CurrentJob:
    """The current-job parameter, read before the group (a submit's compare-and-set starts from its version); a
    one-line :class:`JobError` unless the cluster's group is at 0 with no instance in it. Nodes read the job
    when they boot: a new job submitted while the group runs another would share the group with it (its
    replacements would boot into the new job), and the first job to end would scale the group to 0 under the
    other. An ended job's nodes may also still save, prune and scale the group to 0 for the grace."""
    before = read_current_job(client, ref)
    members = group(client, ref)
    desired, nodes = int(members["DesiredCapacity"]), len(members["Instances"])
    if desired == 0 and not nodes:
        return before
    busy = f"cluster {ref.team}/{ref.cluster} is busy: its group is at {desired} with {nodes} node(s)"
    current = None if before.value is None else job_id_in(ref, before.value)
    state = None if current is None else job_state(client, ref, current)
    where = f"--team {ref.team} --cluster {ref.cluster} {current}"
    if state in ("RUNNING", "WAITING"):
        raise JobError(
            f"{busy} for job {current} ({state}); stop it first (trainctl stop {where}) or wait until it ends, "
            "then submit when the group is at 0 with no node"
        )
    if nodes:
        raise JobError(f"{busy} (job {current}: {state}); submit when they have left it (trainctl status {where})")
    raise JobError(
        f"{busy} (job {current}: {state}), which nothing will scale down; set its desired capacity to 0 "
        f"(aws autoscaling set-desired-capacity --auto-scaling-group-name {ref.group} --desired-capacity 0)"
    )


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


def copy_checkpoints(
    client: ClientFactory, ref: ClusterRef, earlier: str, job_id: str, written: list[str]
) -> list[int]:
    """Copy ``earlier``'s newest intact checkpoints (up to :data:`COPIED_CHECKPOINTS`) to ``job_id``, same steps;
    returns the steps, newest first. Each key is appended to ``written`` before it is written (for a clean-up).

    Intact: the manifest is there and every object it lists has the listed size (the node agent checks the
    sha256 on restore, and falls back to the older copy if the newest fails). Copies are server side (nothing
    passes through this machine); each manifest goes last, with the new job's id (the agent restores only its own
    job's checkpoints) and where it came from. The earlier job's objects are only read.
    """
    s3 = client("s3")
    source, target = f"{ref.job_prefix(earlier)}{CHECKPOINT_FOLDER}/", f"{ref.job_prefix(job_id)}{CHECKPOINT_FOLDER}/"
    steps: list[int] = []
    for checkpoint in reversed(checkpoints(client, ref, earlier)):
        manifest = intact_manifest(s3, ref.bucket, f"{source}{checkpoint.step}/")
        if manifest is None:
            continue
        for rel in manifest["files"]:
            written.append(f"{target}{checkpoint.step}/{rel}")
            s3.copy({"Bucket": ref.bucket, "Key": f"{source}{checkpoint.step}/{rel}"}, ref.bucket, written[-1])
        manifest.update(job_id=job_id, resumed_from={"job_id": earlier, "step": checkpoint.step})
        written.append(f"{target}{checkpoint.step}/{MANIFEST}")
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
    """The manifest under ``base`` if every object it lists is there with the listed size, else None."""
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
    if not isinstance(files, dict) or not files:
        return None
    if any(not isinstance(meta, dict) or sizes.get(rel) != meta.get("size") for rel, meta in files.items()):
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


def job_state(client: ClientFactory, ref: ClusterRef, job_id: str) -> str:
    """DONE, FAILED or STOPPED: its marker. Else, for the current job: STOPPING (stop requested, the group not yet
    empty; STOPPED once it is), RUNNING (a node in the group), WAITING (the group above 0, no node yet). Any other
    job without an end marker is STOPPED if a stop was requested (``trainctl stop --force`` with no agent to write
    the marker), else UNFINISHED: nothing runs it (a job submitted after it, or the group at 0 with no node while
    it is current: its nodes went without writing a marker)."""
    ended = end_marker(client, ref, job_id)
    if ended is not None:
        return ended
    if current_job_id(client, ref) != job_id:
        return "STOPPED" if marker(client, ref, job_id, "STOP") is not None else "UNFINISHED"
    members = group(client, ref)
    empty = not members["Instances"] and int(members["DesiredCapacity"]) == 0
    if marker(client, ref, job_id, "STOP") is not None:
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
    try:
        return read_marker(client("s3"), ref.bucket, ref.job_prefix(job_id) + name)
    except (ValueError, TypeError):
        return {}


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
    prefix = f"{ref.job_prefix(job_id)}nodes/"
    for page in client("s3").get_paginator("list_objects_v2").paginate(Bucket=ref.bucket, Prefix=prefix):
        for obj in page.get("Contents", []):
            instance, _, name = obj["Key"][len(prefix) :].partition("/")
            yield instance, name, obj


def leaving_nodes(client: ClientFactory, ref: ClusterRef, job_id: str) -> list[str]:
    """Instances that announced they leave the job (their agent wrote ``nodes/<id>/leaving``): on a spot notice, or
    when their group ended them (capacity rebalancing, a scale-in, ``stop --force``) or their OS shut down."""
    return sorted(i for i, names in node_markers(client, ref, job_id).items() if "leaving" in names)


def spot_interruptions(client: ClientFactory, ref: ClusterRef, job_id: str) -> int:
    """Nodes of the job that left on a spot interruption notice (their ``leaving`` marker names it)."""
    notices = (marker(client, ref, job_id, f"nodes/{i}/leaving") for i in leaving_nodes(client, ref, job_id))
    return sum(1 for m in notices if str((m or {}).get("notice", "")).startswith(SPOT_NOTICE))


def group(client: ClientFactory, ref: ClusterRef) -> dict[str, Any]:
    """The cluster's Auto Scaling group as DescribeAutoScalingGroups returns it (instances, desired capacity)."""
    groups = client("autoscaling").describe_auto_scaling_groups(AutoScalingGroupNames=[ref.group])
    return dict(groups["AutoScalingGroups"][0])


def described(client: ClientFactory, instances: list[str]) -> dict[str, dict[str, Any]]:
    """EC2's view of ``instances``, by id. EC2 is eventually consistent: one just launched may not be known yet, and
    one unknown id fails the whole call: then one by one, leaving out the unknown."""
    if not instances:
        return {}
    try:
        found = client("ec2").describe_instances(InstanceIds=instances)
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") != "InvalidInstanceID.NotFound":
            raise
        return {k: v for i in instances if len(instances) > 1 for k, v in described(client, [i]).items()}
    return {i["InstanceId"]: i for r in found["Reservations"] for i in r["Instances"]}


def desired_capacity(client: ClientFactory, ref: ClusterRef) -> int:
    return int(group(client, ref)["DesiredCapacity"])


def planned_steps(client: ClientFactory, ref: ClusterRef, job_id: str) -> Optional[int]:
    """The trainer's newest ``plan: N steps`` line (how many steps the job trains in all), if it prints one."""
    pages = (
        client("logs")
        .get_paginator("filter_log_events")
        .paginate(logGroupName=str(ref.spec["log_group"]), logStreamNamePrefix=f"{job_id}/", filterPattern='"plan:"')
    )
    # only the job's own streams: the emulator's FilterLogEvents (moto) ignores logStreamNamePrefix
    found = [
        e
        for page in islice(pages, FILTER_PAGES)
        for e in page["events"]
        if str(e.get("logStreamName", "")).startswith(f"{job_id}/")
    ]
    plans = [m for e in sorted(found, key=lambda e: e["timestamp"]) if (m := _PLAN.search(e["message"]))]
    return int(plans[-1].group(1)) if plans else None


def stream_events(
    client: ClientFactory, ref: ClusterRef, job_id: str, tokens: Optional[dict[str, str]] = None
) -> dict[str, list[tuple[float, str]]]:
    """Every shipped log line of the job per stream (``<job>/<instance>``): (timestamp s, message), in the
    stream's own order (a node's agent ships its lines in order). ``tokens`` (``logs --follow``): where each stream
    was read to, updated here; only the lines after it are returned."""
    logs = client("logs")
    group = str(ref.spec["log_group"])
    out: dict[str, list[tuple[float, str]]] = {}
    pages = logs.get_paginator("describe_log_streams").paginate(logGroupName=group, logStreamNamePrefix=f"{job_id}/")
    for streams in islice(pages, STREAM_PAGES):
        for stream in streams["logStreams"]:
            name = stream["logStreamName"]
            lines = out.setdefault(name, [])
            token: Optional[str] = None if tokens is None else tokens.get(name)
            for _ in range(1000):  # bounded: 1000 pages of up to 10,000 events
                kwargs: dict[str, Any] = {"logGroupName": group, "logStreamName": name, "startFromHead": True}
                if token:
                    kwargs["nextToken"] = token
                page = logs.get_log_events(**kwargs)
                lines += [(e["timestamp"] / 1000.0, e["message"]) for e in page["events"]]
                # The end is the token coming back: CloudWatch pages by time, so a quiet stretch of the stream (a
                # data download, a replacement booting later) is an empty page with a new token, lines after it.
                if page.get("nextForwardToken") in (token, None):
                    break
                token = page.get("nextForwardToken")
            if tokens is not None and token:
                tokens[name] = token
    return out


def log_events(client: ClientFactory, ref: ClusterRef, job_id: str) -> list[tuple[float, str, str]]:
    """Every shipped log line of the job: (timestamp s, stream, message), in time order."""
    return sorted(
        (ts, name, message) for name, lines in stream_events(client, ref, job_id).items() for ts, message in lines
    )
