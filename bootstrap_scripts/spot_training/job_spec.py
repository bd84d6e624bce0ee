"""The job spec's schema and rules, shared by the node agent (which refuses a bad job), the stack (which writes the
job spec) and the tools that write a job.

A job on a cluster is the stack's job spec (SSM ``.../job-spec``, a :class:`JobSpec`) merged with the submitted job
(SSM ``.../current-job``, written by ``trainctl submit``). The node agent checks the merged job before it runs
anything; ``trainctl submit`` and the team file loader run the same checks first, so a job the agent would
refuse is refused where it is written, before any node starts. Standard library only: it runs on the node too.
"""

from __future__ import annotations

import math
import re
import shlex
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Dict, List, Optional

from .job_parts import check_job_parts
from .job_spec_error import JobSpecError
from .protocol import CODE_FOLDER, QUEUE_FOLDER

__all__ = ["JobSpecError", "check_job"]


SPEC_VERSION = 1  # the job spec's schema version: the agent refuses any other
# warm_pool.min_free_percent: the free space the agent keeps on a claimed warm volume, and its bounds; above 90 it
# would prune nearly every entry at each job
MIN_FREE_PERCENT_DEFAULT, MIN_FREE_PERCENT_MAX = 20, 90


@dataclass(frozen=True)
class WarmPoolSpec:
    """The cluster's warm volume pool, for a node's claim: the tag key and value (``pool``) its volumes carry, where
    the node attaches the volume it claims, and the pool's volume ids; and the free space, in percent, the agent
    keeps on a claimed volume by pruning the setup caches and inputs it keeps there (``agent/warm_cache_pruning``)."""

    tag_key: str
    pool: str
    device_name: str
    volumes: List[str]
    min_free_percent: int = MIN_FREE_PERCENT_DEFAULT


@dataclass(frozen=True)
class JobSpec:
    """The stack's job spec: where the cluster's jobs keep their state (bucket, prefix, log group, current-job
    parameter), and the defaults of the job settings (:data:`JOB_SETTINGS`) a submitted job may override.

    The stack writes :meth:`as_dict` as the parameter's JSON (deploy-time values are CDK tokens then, and a None is
    left out of the JSON); :func:`check_job` reads it back by the same field names.
    """

    team: str
    cluster: str
    region: str
    bucket: str
    prefix: str  # '<cluster>/'
    log_group: str
    current_job_parameter: str
    command: str
    python: str
    nproc_per_node: int
    min_nodes: int
    desired_nodes: int
    max_nodes: int
    checkpoint_dir: str
    checkpoint_interval_s: Optional[float]  # None: the agent picks the Young/Daly interval
    checkpoint_wait_for_upload: bool
    mean_time_between_interruptions_s: float
    max_restarts: int
    interruption_grace_s: float
    rendezvous_port: int
    stall_timeout_s: int  # 0: the stall watchdog is off
    warm_pool: Optional[WarmPoolSpec]
    efa: bool = False  # the nodes have EFA interfaces: the agent sets NCCL's EFA environment (agent/efa.py)
    data_buckets: List[str] = field(default_factory=list)  # the S3 buckets a job's inputs may come from

    def as_dict(self) -> Dict[str, Any]:
        """The job spec as its JSON object: ``version`` first, then the fields in their order."""
        return {"version": SPEC_VERSION, **asdict(self)}


# Job settings: the stack's job spec holds their defaults (from the team file), a submitted job may override them.
JOB_SETTINGS = {
    "command",
    "python",
    "nproc_per_node",
    "min_nodes",
    "desired_nodes",
    "max_nodes",
    "checkpoint_interval_s",
    "checkpoint_wait_for_upload",
    "mean_time_between_interruptions_s",
    "max_restarts",
    "interruption_grace_s",
    "stall_timeout_s",
}
# A submitted job's own parts (spot_training/job_parts.py); the job spec has no defaults for them.
JOB_PARTS = {"setup", "env", "secrets", "inputs"}
# Keys a submitted job (the current-job parameter) may set; everything else comes from the stack's job spec.
JOB_KEYS = JOB_SETTINGS | JOB_PARTS | {"job_id", "code_key", "nodes"}
SPEC_KEYS = {f.name for f in fields(JobSpec)} | {"version"}
# The keys a warm_pool entry must hold; its volumes may be missing (the node claims a volume by its tag then), and
# its min_free_percent (the node keeps MIN_FREE_PERCENT_DEFAULT free then).
WARM_POOL_KEYS = {f.name for f in fields(WarmPoolSpec)} - {"volumes", "min_free_percent"}

SPOT_NOTICE_S = 120  # an interruption notice comes this long before EC2 reclaims the instance
PARAMETER_MAX_BYTES = 4096  # an SSM Standard parameter's value: the job spec, and the current job trainctl writes
# A fixed checkpoint interval under a second would save at every step; an MTBI over ten years is no estimate (and
# one of hundreds of digits is no number once it is JSON: CDK writes it as null).
CHECKPOINT_INTERVAL_MIN_S = 1.0
MTBI_MAX_S = 10 * 365 * 24 * 3600
# The cluster group's terminating lifecycle hook: an instance the group itself ends (capacity rebalancing, a scale-in)
# waits in Terminating:Wait until its agent has saved and completes this hook, or DRAIN_HEARTBEAT_S has passed.
# Above the longest interruption_grace_s (119 s) plus the final upload.
DRAIN_HOOK, DRAIN_HEARTBEAT_S = "spot-training-drain", 300
# How long a node agent waits for min_nodes peers (SPOT_TRAINING_RDZV_JOIN_TIMEOUT_S's default) before the job fails;
# a cluster's capacity fallback must come within it (team_config/model/cluster.py)
JOIN_TIMEOUT_S = 600.0
JOB_ID_RE = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
MODULE_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.]*$")
SHELL_CHARS = set(";&|`$<>(){}\\\n\r\0*?~!#")
# stall_timeout_s: seconds without progress (an output line or a checkpoint write on any node of the job, or a new
# durable checkpoint of the job) before the agent ends a hung trainer (a DataLoader deadlock, a collective that never
# returns). Off unless set: it cannot tell a silent healthy phase (a data download, a long evaluation, torch.compile)
# from a hang. Absent (a job spec without the key), null (a submitted job) or 0 (what the stack writes for a team
# file that leaves it unset: CDK leaves a null out of the JSON): off.
STALL_TIMEOUT_MIN_S, STALL_TIMEOUT_MAX_S = 300, 86400


def stall_too_short(stall_timeout_s: Optional[float], checkpoint_interval_s: Optional[float]) -> bool:
    """Whether the stall watchdog would end, as hung, a node whose only sign of progress is its checkpoints between
    two of them: a timeout under twice the checkpoint interval (both set). The team file and ``trainctl submit``
    refuse it; the agent does not (a booting node must not refuse a job for it)."""
    return bool(stall_timeout_s and checkpoint_interval_s and stall_timeout_s < 2 * checkpoint_interval_s)


def _int(d: Dict[str, Any], key: str, lo: int, hi: int) -> int:
    value = d.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise JobSpecError(f"{key} must be an integer from {lo} to {hi}, got {value!r}")
    return value


def _number(
    d: Dict[str, Any],
    key: str,
    optional: bool = False,
    below: float = math.inf,
    minimum: float = 0.0,
    maximum: float = math.inf,
) -> Optional[float]:
    """``d[key]``: a number above 0 (and at least ``minimum``, below ``below``, at most ``maximum``)."""
    value = d.get(key)
    if value is None and optional:
        return None
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not (0 < value < below and minimum <= value <= maximum)
    ):
        if minimum > 0:
            what = f"a number of at least {minimum:g}"
        elif maximum < math.inf:
            what = f"a positive number of at most {maximum:g}"
        else:
            what = "a positive number" if below == math.inf else f"a number above 0 and below {below:g}"
        raise JobSpecError(f"{key} must be {what}{' or null' if optional else ''}, got {value!r}")
    return float(value)


def parse_command(command: Any) -> List[str]:
    """The entry command as torchrun arguments (script or ``-m module``, then its arguments). Never run by a shell."""
    if not isinstance(command, str) or not command.strip():
        raise JobSpecError(f"command must be a non-empty string, got {command!r}")
    bad = sorted(SHELL_CHARS.intersection(command))
    if bad:
        shown = "".join(bad).encode("unicode_escape").decode()
        raise JobSpecError(
            f"command contains shell syntax {shown!r}: it runs without a shell; put the logic in a script"
        )
    try:
        words = shlex.split(command)
    except ValueError as exc:
        raise JobSpecError(f"command cannot be parsed ({exc}): {command!r}") from None
    if words[0] not in ("python", "python3") or len(words) < 2:
        raise JobSpecError(f"command must be 'python SCRIPT [ARGS]' or 'python -m MODULE [ARGS]', got {command!r}")
    if words[1] == "-m":
        if len(words) < 3 or not MODULE_RE.match(words[2]):
            raise JobSpecError(f"command: 'python -m' needs a module name, got {command!r}")
        return words[1:]
    script = words[1]
    if script.startswith(("-", "/")) or ".." in script.split("/"):
        raise JobSpecError(f"command: the script must be a path inside the code archive, got {script!r}")
    return words[1:]


def check_job(spec: Any, current: Any, current_name: str) -> Dict[str, Any]:
    """The stack's job spec merged with a submitted job (``current``, read from ``current_name``), checked: the
    merged dict with ``argv`` added, or :class:`JobSpecError` naming the first wrong key."""
    merged = _merged(spec, current, current_name)
    _check_places(merged)
    merged["argv"] = parse_command(merged.get("command"))
    _check_numbers(merged)
    _check_warm_pool(merged.get("warm_pool"))
    check_job_parts(merged)
    return merged


def _merged(spec: Any, current: Any, current_name: str) -> Dict[str, Any]:
    """The job spec updated with the submitted job, both JSON objects of known keys; unset values filled in."""
    if not isinstance(spec, dict):
        raise JobSpecError("job spec is not a JSON object")
    if spec.get("version") != SPEC_VERSION:
        raise JobSpecError(f"job spec version {spec.get('version')!r} is not supported (expected {SPEC_VERSION})")
    unknown = sorted(set(spec) - SPEC_KEYS)
    if unknown:
        raise JobSpecError(f"job spec has unknown key(s): {', '.join(unknown)}")
    if not isinstance(current, dict):
        raise JobSpecError(f"{current_name} is not a JSON object")
    unknown = sorted(set(current) - JOB_KEYS)
    if unknown:
        raise JobSpecError(
            f"{current_name} has unknown key(s): {', '.join(unknown)} (allowed: {', '.join(sorted(JOB_KEYS))})"
        )
    merged = dict(spec)
    merged.update(current)
    for key in ("checkpoint_interval_s", "warm_pool"):  # the stack leaves unset values out of the JSON
        merged.setdefault(key, None)
    for flag in ("checkpoint_wait_for_upload", "efa"):
        value = merged.setdefault(flag, False)  # a job spec without the option: off
        if not isinstance(value, bool):
            raise JobSpecError(f"{flag} must be true or false, got {value!r}")
    return merged


def _check_places(merged: Dict[str, Any]) -> None:
    """The job's id, where its state lives (bucket, prefix, log group, code archive) and its paths on the node."""
    job_id = merged.get("job_id")
    if not isinstance(job_id, str) or not JOB_ID_RE.match(job_id):
        raise JobSpecError(f"job_id must be a DNS label (lowercase letters, digits, '-', at most 63), got {job_id!r}")
    for folder, what in ((CODE_FOLDER, "the code archives"), (QUEUE_FOLDER, "the queued jobs")):
        if job_id == folder:
            raise JobSpecError(f"job_id {folder!r} is reserved: {what} are under '<cluster>/{folder}/'")
    for key in ("bucket", "prefix", "log_group"):
        if not isinstance(merged.get(key), str) or not merged[key]:
            raise JobSpecError(f"{key} must be a non-empty string, got {merged.get(key)!r}")
    if merged["prefix"] != f"{merged.get('cluster')}/":
        raise JobSpecError(
            f"prefix must be '<cluster>/', got {merged['prefix']!r} for cluster {merged.get('cluster')!r}"
        )
    code_key = merged.get("code_key")
    if not isinstance(code_key, str) or not code_key.startswith(merged["prefix"]) or ".." in code_key.split("/"):
        raise JobSpecError(
            f"code_key must be an S3 key under {merged['prefix']!r} (the cluster's prefix), got {code_key!r}"
        )
    for key in ("python", "checkpoint_dir"):
        value = merged.get(key)
        if not isinstance(value, str) or not value.startswith("/") or ".." in value.split("/"):
            raise JobSpecError(f"{key} must be an absolute path, got {value!r}")


def _check_numbers(merged: Dict[str, Any]) -> None:
    """The node counts, restarts, port and intervals; a stall timeout of 0 becomes None (the watchdog is off)."""
    _int(merged, "nproc_per_node", 1, 64)
    _int(merged, "min_nodes", 1, 1000)
    _int(merged, "max_nodes", merged["min_nodes"], 1000)
    if "nodes" in merged:
        _int(merged, "nodes", merged["min_nodes"], merged["max_nodes"])
    _int(merged, "max_restarts", 0, 100)
    _int(merged, "rendezvous_port", 1024, 65535)
    _number(merged, "checkpoint_interval_s", optional=True, minimum=CHECKPOINT_INTERVAL_MIN_S)
    _number(merged, "mean_time_between_interruptions_s", maximum=MTBI_MAX_S)
    _number(merged, "interruption_grace_s", below=SPOT_NOTICE_S)
    stall = merged.setdefault("stall_timeout_s", None)
    whole = isinstance(stall, int) and not isinstance(stall, bool)
    if stall is None or (whole and stall == 0):
        merged["stall_timeout_s"] = None  # the stall watchdog is off
    elif not (whole and STALL_TIMEOUT_MIN_S <= stall <= STALL_TIMEOUT_MAX_S):
        raise JobSpecError(
            f"stall_timeout_s must be an integer from {STALL_TIMEOUT_MIN_S} to {STALL_TIMEOUT_MAX_S} (seconds), or "
            f"null or 0 (off), got {stall!r}"
        )


def _check_warm_pool(warm: Any) -> None:
    """None, or a :class:`WarmPoolSpec`'s JSON object (its volumes may be missing: the node claims by tag then)."""
    volumes = warm.get("volumes", []) if isinstance(warm, dict) else None
    if warm is not None and not (
        isinstance(warm, dict)
        and WARM_POOL_KEYS <= set(warm)
        and isinstance(volumes, list)
        and all(isinstance(v, str) for v in volumes)
    ):
        raise JobSpecError(f"warm_pool must be null or {{tag_key, pool, device_name, volumes: [ids]}}, got {warm!r}")
    free = warm.get("min_free_percent", MIN_FREE_PERCENT_DEFAULT) if warm is not None else 0
    if isinstance(free, bool) or not isinstance(free, int) or not 0 <= free <= MIN_FREE_PERCENT_MAX:
        raise JobSpecError(
            f"warm_pool.min_free_percent must be an integer from 0 to {MIN_FREE_PERCENT_MAX}, got {free!r}"
        )
