"""Jobs on a deployed cluster, through the AWS APIs only (real AWS or the emulated cloud alike).

A cluster is found by team and cluster name: its job-spec parameter ``/spot-training/<team>/<cluster>/job-spec``
(written by the stack) names the bucket, prefix and current-job parameter; its Auto Scaling group carries the
tags ``spot-training:team`` and ``spot-training:cluster``. Submitting a job = upload the code tarball under the
cluster's prefix, write the current-job parameter the node agent merges over the job spec, set the group's
desired capacity. Everything the node agent writes (checkpoints, markers) is read back from S3.
"""

from __future__ import annotations

import io
import json
import os
import re
import secrets
import tarfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Any, Optional

import pathspec
from botocore.exceptions import BotoCoreError, ClientError

from bootstrap_scripts.spot_training.job_spec import CODE_FOLDER, JobSpecError, check_job
from budget_guard.handler import read_marker
from team_config.naming import CLUSTER_TAG, TEAM_TAG, budget_name, parameter_path

ClientFactory = Callable[[str], Any]
MANIFEST = "spot-training-manifest.json"  # bootstrap_scripts/node_agent.py writes it last
ENDED = ("DONE", "FAILED", "STOPPED")
NOT_RUNNING = (*ENDED, "UNFINISHED")  # job_state: no node runs it, none will
COPIED_CHECKPOINTS = 2  # as many as the node agent keeps in S3 by default (SPOT_TRAINING_KEEP_CHECKPOINTS)
_PLAN = re.compile(r"\bplan: (\d+) steps\b")
STREAM_PAGES = 200  # bounded: 200 pages of up to 50 log streams (one per node of a job)
FILTER_PAGES = 1000  # bounded: 1000 pages of FilterLogEvents (a page may be empty while CloudWatch searches)
ALWAYS_SKIPPED = (".git", "__pycache__", "*.pyc", ".venv", "node_modules")


class JobError(Exception):
    """A one-line reason (unknown team/cluster/job, bad code directory)."""


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


def pack_code(directory: Path) -> bytes:
    """A gzipped tarball of ``directory`` (relative paths, regular files only), minus what its ``.gitignore``
    leaves out (git's rules, by pathspec; nested ``.gitignore`` files are not read) and ``ALWAYS_SKIPPED``. A file
    that cannot be read is a one-line :class:`JobError` naming it.
    """
    if not directory.is_dir():
        raise JobError(f"code directory {directory} does not exist")
    try:
        return _pack(directory)
    except UnicodeDecodeError as exc:
        raise JobError(f"{directory / '.gitignore'}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except OSError as exc:
        raise JobError(f"{exc.filename}: cannot read it for the code archive ({exc.strerror})") from None


def _pack(directory: Path) -> bytes:
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

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for root, dirs, files in os.walk(directory):
            rel_root = Path(root).relative_to(directory).as_posix()
            prefix = "" if rel_root == "." else rel_root + "/"
            dirs[:] = sorted(d for d in dirs if not skipped_folder(f"{prefix}{d}/"))
            for name in sorted(files):
                path = Path(root) / name
                if path.is_file() and not path.is_symlink() and not left_out(prefix + name):
                    tar.add(path, arcname=prefix + name, recursive=False)
    return buf.getvalue()


@dataclass(frozen=True)
class Budget:
    name: str
    limit_usd: float
    spent_usd: float

    @property
    def exceeded(self) -> bool:
        return self.spent_usd >= self.limit_usd


def team_budget(client: ClientFactory, team: str) -> Optional[Budget]:
    """The team's AWS Budgets budget (``budget:`` in its team file), or None if it has none."""
    account = client("sts").get_caller_identity()["Account"]
    name = budget_name(team)
    budgets = client("budgets")
    try:
        found = budgets.describe_budget(AccountId=account, BudgetName=name)["Budget"]
    except budgets.exceptions.NotFoundException:
        return None
    spent = found.get("CalculatedSpend", {}).get("ActualSpend", {}).get("Amount", 0)
    return Budget(name, float(found["BudgetLimit"]["Amount"]), float(spent))


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
    and one when ``nodes`` is below the cluster's min_nodes: the job's min_nodes is lowered to ``nodes``.
    Nothing is left of a submit that fails halfway (:func:`take_back`).
    """
    if not 1 <= nodes <= int(ref.spec["max_nodes"]):
        raise JobError(f"--nodes must be from 1 to {ref.spec['max_nodes']} (the cluster's max_nodes), got {nodes}")
    budget = team_budget(client, ref.team)
    if budget is not None and budget.exceeded:
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
        check_job(ref.spec, job, str(ref.spec["current_job_parameter"]))
    except JobSpecError as exc:
        raise JobError(f"the node agent would refuse this job: {exc}") from None
    code = pack_code(code_dir)  # every refusal comes before the first write
    check_idle(client, ref)
    if job_exists(client, ref, job_id):  # its code, checkpoints and markers would mix with the new job's
        if submitted(client, ref, job_id):
            why = f"to go on from its checkpoint: --resume-from {job_id}"
        else:
            why = f"objects of a submit that did not finish are under s3://{ref.bucket}/{ref.job_prefix(job_id)}"
        raise JobError(f"job {job_id} already exists on {ref.team}/{ref.cluster}; choose another --job-id ({why})")
    if resume_from is not None and not submitted(client, ref, resume_from):
        raise JobError(f"--resume-from {resume_from}: no such job on {ref.team}/{ref.cluster} (see 'trainctl list')")
    previous = current_job_value(client, ref)
    written: list[str] = []  # keys this submit wrote, for the clean-up
    steps: list[int] = []
    try:
        if resume_from is not None:
            steps = copy_checkpoints(client, ref, resume_from, job_id, written)
        written.append(code_key)
        client("s3").put_object(Bucket=ref.bucket, Key=code_key, Body=code)
        set_current_job(client, ref, json.dumps(job))
        client("autoscaling").set_desired_capacity(AutoScalingGroupName=ref.group, DesiredCapacity=nodes)
    except BaseException:  # all or nothing: what is left would be billed, would block the job id or start nodes
        take_back(client, ref, previous, written, report)
        raise
    if lowered:
        report(f"job {job_id}: min_nodes lowered from the cluster's {cluster_min} to {nodes} (--nodes {nodes})")
    if steps:
        report(
            f"job {job_id} starts from checkpoint {steps[0]} of {resume_from} (copied: {', '.join(map(str, steps))})"
        )
    return job_id


@dataclass(frozen=True)
class Checkpoint:
    step: int
    size_bytes: int
    files: int
    manifest_time: float  # LastModified of the manifest (when the checkpoint became durable)


def checkpoints(client: ClientFactory, ref: ClusterRef, job_id: str) -> list[Checkpoint]:
    """The job's complete checkpoints in S3 (those with a manifest), oldest first."""
    s3 = client("s3")
    prefix = f"{ref.job_prefix(job_id)}ckpt/"
    found: list[Checkpoint] = []
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=ref.bucket, Prefix=prefix):
        for obj in page.get("Contents", []):
            step, _, rel = obj["Key"][len(prefix) :].partition("/")
            if rel == MANIFEST and step.isdigit():
                try:
                    files = json.loads(s3.get_object(Bucket=ref.bucket, Key=obj["Key"])["Body"].read())["files"]
                    size = sum(int(f["size"]) for f in files.values())
                except s3.exceptions.NoSuchKey:
                    continue  # pruned by the node agent since the listing: no longer a checkpoint
                except (ValueError, KeyError, TypeError, AttributeError):
                    continue  # an unreadable manifest: the agent does not restore it either
                found.append(Checkpoint(int(step), size, len(files), obj["LastModified"].timestamp()))
    return sorted(found, key=lambda c: c.step)


def submitted(client: ClientFactory, ref: ClusterRef, job_id: str) -> bool:
    """Whether a job of that id was submitted to the cluster (its code archive is there)."""
    found = client("s3").list_objects_v2(Bucket=ref.bucket, Prefix=f"{ref.code_prefix}{job_id}.", MaxKeys=1)
    return bool(found.get("KeyCount"))


def job_exists(client: ClientFactory, ref: ClusterRef, job_id: str) -> bool:
    """Whether the cluster has anything of a job of that id: its code archive, or objects under its prefix."""
    found = client("s3").list_objects_v2(Bucket=ref.bucket, Prefix=ref.job_prefix(job_id), MaxKeys=1)
    return bool(found.get("KeyCount")) or submitted(client, ref, job_id)


def check_idle(client: ClientFactory, ref: ClusterRef) -> None:
    """A one-line :class:`JobError` unless the cluster's group is at 0 with no instance in it. Nodes read the job
    when they boot: a new job submitted while the group runs another would share the group with it (its
    replacements would boot into the new job), and the first job to end would scale the group to 0 under the
    other. An ended job's nodes may also still save, prune and scale the group to 0 for the grace."""
    members = group(client, ref)
    desired, nodes = int(members["DesiredCapacity"]), len(members["Instances"])
    if desired == 0 and not nodes:
        return
    busy = f"cluster {ref.team}/{ref.cluster} is busy: its group is at {desired} with {nodes} node(s)"
    current = current_job_id(client, ref)
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


def take_back(
    client: ClientFactory, ref: ClusterRef, previous: Optional[str], written: list[str], report: Callable[[str], None]
) -> None:
    """Undo a submit that failed halfway: the current-job parameter as it was, the objects it wrote deleted. What
    cannot be undone is reported."""
    try:
        if current_job_value(client, ref) != previous:
            set_current_job(client, ref, previous)
    except (ClientError, BotoCoreError) as exc:
        report(f"could not put back {ref.spec['current_job_parameter']} as it was ({exc})")
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
    source, target = f"{ref.job_prefix(earlier)}ckpt/", f"{ref.job_prefix(job_id)}ckpt/"
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


def current_job_value(client: ClientFactory, ref: ClusterRef) -> Optional[str]:
    """The cluster's current-job parameter (the submitted job, JSON), or None if no job was ever submitted."""
    ssm = client("ssm")
    try:
        return str(ssm.get_parameter(Name=str(ref.spec["current_job_parameter"]))["Parameter"]["Value"])
    except ssm.exceptions.ParameterNotFound:
        return None


def set_current_job(client: ClientFactory, ref: ClusterRef, value: Optional[str]) -> None:
    """Write the current-job parameter (None: delete it, as before the first submit)."""
    ssm, name = client("ssm"), str(ref.spec["current_job_parameter"])
    if value is not None:
        ssm.put_parameter(Name=name, Value=value, Type="String", Overwrite=True)
        return
    try:
        ssm.delete_parameter(Name=name)
    except ssm.exceptions.ParameterNotFound:
        pass


def current_job_id(client: ClientFactory, ref: ClusterRef) -> Optional[str]:
    """The job id in the cluster's current-job parameter, or None if no job was ever submitted."""
    value = current_job_value(client, ref)
    return None if value is None else str(json.loads(value)["job_id"])


def job_state(client: ClientFactory, ref: ClusterRef, job_id: str) -> str:
    """DONE, FAILED or STOPPED: its marker. Else, for the current job: STOPPING (stop requested, the group not yet
    empty; STOPPED once it is), RUNNING (a node in the group), WAITING (the group above 0, no node yet). Any other
    job without an end marker is UNFINISHED: nothing runs it (a job submitted after it, or the group at 0 with no
    node while it is current: its nodes went without writing a marker)."""
    for name in ENDED:
        if marker(client, ref, job_id, name) is not None:
            return name
    if current_job_id(client, ref) != job_id:
        return "UNFINISHED"
    members = group(client, ref)
    empty = not members["Instances"] and int(members["DesiredCapacity"]) == 0
    if marker(client, ref, job_id, "STOP") is not None:
        return "STOPPED" if empty else "STOPPING"
    if members["Instances"]:
        return "RUNNING"
    return "UNFINISHED" if empty else "WAITING"


def marker(client: ClientFactory, ref: ClusterRef, job_id: str, name: str) -> Optional[dict[str, Any]]:
    """The job's marker ``name`` (``DONE``, ``FAILED``, ``STOP`` ...; JSON), or None."""
    return read_marker(client("s3"), ref.bucket, ref.job_prefix(job_id) + name)


def node_markers(client: ClientFactory, ref: ClusterRef, job_id: str) -> dict[str, dict[str, str]]:
    """The node agents' markers of a job, ``nodes/<instance>/<name>``: {instance: {name: S3 key}}."""
    prefix = f"{ref.job_prefix(job_id)}nodes/"
    found: dict[str, dict[str, str]] = {}
    for page in client("s3").get_paginator("list_objects_v2").paginate(Bucket=ref.bucket, Prefix=prefix):
        for obj in page.get("Contents", []):
            instance, _, name = obj["Key"][len(prefix) :].partition("/")
            found.setdefault(instance, {})[name] = obj["Key"]
    return found


def leaving_nodes(client: ClientFactory, ref: ClusterRef, job_id: str) -> list[str]:
    """Instances that left the job on an interruption notice (their agent wrote ``nodes/<id>/leaving``)."""
    return sorted(i for i, names in node_markers(client, ref, job_id).items() if "leaving" in names)


def group(client: ClientFactory, ref: ClusterRef) -> dict[str, Any]:
    """The cluster's Auto Scaling group as DescribeAutoScalingGroups returns it (instances, desired capacity)."""
    groups = client("autoscaling").describe_auto_scaling_groups(AutoScalingGroupNames=[ref.group])
    return dict(groups["AutoScalingGroups"][0])


def desired_capacity(client: ClientFactory, ref: ClusterRef) -> int:
    return int(group(client, ref)["DesiredCapacity"])


def planned_steps(client: ClientFactory, ref: ClusterRef, job_id: str) -> Optional[int]:
    """The trainer's newest ``plan: N steps`` line (how many steps the job trains in all), if it prints one."""
    pages = (
        client("logs")
        .get_paginator("filter_log_events")
        .paginate(logGroupName=str(ref.spec["log_group"]), logStreamNamePrefix=f"{job_id}/", filterPattern='"plan:"')
    )
    found = [e for page in islice(pages, FILTER_PAGES) for e in page["events"]]
    plans = [m for e in sorted(found, key=lambda e: e["timestamp"]) if (m := _PLAN.search(e["message"]))]
    return int(plans[-1].group(1)) if plans else None


def stream_events(client: ClientFactory, ref: ClusterRef, job_id: str) -> dict[str, list[tuple[float, str]]]:
    """Every shipped log line of the job per stream (``<job>/<instance>``): (timestamp s, message), in the
    stream's own order (a node's agent ships its lines in order)."""
    logs = client("logs")
    group = str(ref.spec["log_group"])
    out: dict[str, list[tuple[float, str]]] = {}
    pages = logs.get_paginator("describe_log_streams").paginate(logGroupName=group, logStreamNamePrefix=f"{job_id}/")
    for streams in islice(pages, STREAM_PAGES):
        for stream in streams["logStreams"]:
            name = stream["logStreamName"]
            lines = out.setdefault(name, [])
            token: Optional[str] = None
            for _ in range(1000):  # bounded: 1000 pages of up to 10,000 events
                kwargs: dict[str, Any] = {"logGroupName": group, "logStreamName": name, "startFromHead": True}
                if token:
                    kwargs["nextToken"] = token
                page = logs.get_log_events(**kwargs)
                lines += [(e["timestamp"] / 1000.0, e["message"]) for e in page["events"]]
                if not page["events"] or page.get("nextForwardToken") == token:
                    break
                token = page.get("nextForwardToken")
    return out


def log_events(client: ClientFactory, ref: ClusterRef, job_id: str) -> list[tuple[float, str, str]]:
    """Every shipped log line of the job: (timestamp s, stream, message), in time order."""
    return sorted(
        (ts, name, message) for name, lines in stream_events(client, ref, job_id).items() for ts, message in lines
    )
