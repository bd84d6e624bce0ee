"""A submitted job's own parts beyond its command: a setup script, plain environment values, secrets and S3 data
inputs; their schema and the rules the node agent and ``trainctl submit`` both apply.

- ``setup``: a path inside the code archive, run with bash on each node before the trainer.
- ``env``: ``{NAME: value}``, plain values set in the trainer's environment (shown by ``trainctl status``).
- ``secrets``: ``{NAME: source}``, ``source`` being ``ssm:<parameter name>`` (an SSM SecureString parameter) or
  ``secretsmanager:<secret name>``, under the team's secret prefix (:func:`secret_prefix`); only the names travel,
  the node reads the values into the trainer's environment.
- ``inputs``: ``[{s3: "s3://bucket/prefix", path: "/absolute/dir"}]``, downloaded before the trainer starts, from
  the buckets the team file lists (``data_buckets``, in the job spec).

Standard library only: it runs on the node too.
"""

from __future__ import annotations

import re
from typing import Any, Dict, List, Optional

from .job_spec_error import JobSpecError

ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# The agent and torchrun set these in the trainer's environment; a job may not set them itself. NCCL_* and FI_* stay
# the job's: the agent's EFA settings never override the environment (agent/efa.py).
RESERVED_ENV_PREFIXES = ("SPOT_TRAINING_", "TORCHELASTIC_")
RESERVED_ENV_NAMES = {
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
}
SECRET_SOURCES = ("ssm:", "secretsmanager:")
SECRET_NAME_RE = re.compile(r"^[A-Za-z0-9/_.+=@-]{1,512}$")
BUCKET_RE = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
MAX_INPUTS = 16


def secret_prefix(team: str) -> str:
    """Where a team's job secrets live: SSM parameters under ``/<prefix>``, Secrets Manager secrets named
    ``<prefix>...``. Outside the clusters' parameter path (``/spot-training/<team>/<cluster>``): no cluster name
    can put a job spec among the secrets."""
    return f"spot-training-secrets/{team}/"


def check_job_parts(merged: Dict[str, Any]) -> None:
    """The merged job's setup, env, secrets and inputs (missing: none), filled in with their empty values;
    :class:`JobSpecError` naming the first wrong key."""
    merged["setup"] = _check_setup(merged.get("setup"))
    merged["env"] = _check_env(merged.get("env"))
    merged["secrets"] = _check_secrets(merged.get("secrets"), str(merged.get("team", "")))
    merged["inputs"] = _check_inputs(merged.get("inputs"), _data_buckets(merged.get("data_buckets")))
    both = sorted(set(merged["env"]) & set(merged["secrets"]))
    if both:
        raise JobSpecError(f"env and secrets both set {', '.join(both)}; set each variable in one of them")


def _data_buckets(buckets: Any) -> List[str]:
    """The job spec's data buckets (missing: none); a job spec the stack did not write is refused."""
    if buckets is None:
        return []
    if not isinstance(buckets, list) or not all(isinstance(b, str) and BUCKET_RE.match(b) for b in buckets):
        raise JobSpecError(f"data_buckets must be a list of S3 bucket names, got {buckets!r}")
    return buckets


def _check_setup(setup: Any) -> Optional[str]:
    if setup is None:
        return None
    if not isinstance(setup, str) or not setup or setup.startswith(("-", "/")) or ".." in setup.split("/"):
        raise JobSpecError(f"setup must be the path of a script inside the code archive, got {setup!r}")
    return setup


def _env_name(key: str, name: Any) -> str:
    if not isinstance(name, str) or not ENV_NAME_RE.match(name):
        raise JobSpecError(f"{key}: {name!r} is not an environment variable name (letters, digits, '_')")
    if name in RESERVED_ENV_NAMES or name.startswith(RESERVED_ENV_PREFIXES):
        raise JobSpecError(f"{key}: {name} is set by the node agent or torchrun; choose another name")
    return name


def _check_env(env: Any) -> Dict[str, str]:
    if env is None:
        return {}
    if not isinstance(env, dict):
        raise JobSpecError(f"env must be a mapping of NAME: value, got {env!r}")
    for name, value in env.items():
        _env_name("env", name)
        if not isinstance(value, str):
            raise JobSpecError(f"env: {name} must be a string (quote it in YAML), got {value!r}")
    return dict(env)


def _check_secrets(secrets: Any, team: str) -> Dict[str, str]:
    if secrets is None:
        return {}
    if not isinstance(secrets, dict):
        raise JobSpecError(
            f"secrets must be a mapping of NAME: ssm:<parameter> or secretsmanager:<secret>, got {secrets!r}"
        )
    prefix = secret_prefix(team)
    for name, source in secrets.items():
        _env_name("secrets", name)
        kind, _, secret = source.partition(":") if isinstance(source, str) else ("", "", "")
        if f"{kind}:" not in SECRET_SOURCES or not SECRET_NAME_RE.match(secret):
            raise JobSpecError(
                f"secrets: {name} must be ssm:<parameter name> or secretsmanager:<secret name>, got {source!r}"
            )
        wanted = f"/{prefix}" if kind == "ssm" else prefix
        if not secret.startswith(wanted) or ".." in secret.split("/"):
            raise JobSpecError(
                f"secrets: {name} names {secret!r}, outside the team's secrets ({kind}:{wanted}...); the nodes may "
                "read only those"
            )
    return dict(secrets)


def split_s3_url(url: Any) -> Optional[tuple]:
    """``(bucket, prefix)`` of an ``s3://bucket/prefix`` URL, None if it is not one."""
    if not isinstance(url, str) or not url.startswith("s3://"):
        return None
    bucket, _, prefix = url[len("s3://") :].partition("/")
    return (bucket, prefix) if BUCKET_RE.match(bucket) and ".." not in prefix.split("/") else None


def _check_inputs(inputs: Any, data_buckets: List[str]) -> List[Dict[str, str]]:
    if inputs is None:
        return []
    if not isinstance(inputs, list) or len(inputs) > MAX_INPUTS:
        raise JobSpecError(f"inputs must be a list of at most {MAX_INPUTS} {{s3, path}} entries, got {inputs!r}")
    paths: List[str] = []
    for number, entry in enumerate(inputs, 1):
        if not isinstance(entry, dict) or set(entry) != {"s3", "path"}:
            raise JobSpecError(f"inputs[{number}] must be {{s3: s3://bucket/prefix, path: /dir}}, got {entry!r}")
        where = split_s3_url(entry["s3"])
        if where is None:
            raise JobSpecError(f"inputs[{number}].s3 must be s3://bucket/prefix, got {entry['s3']!r}")
        if where[0] not in data_buckets:
            listed = ", ".join(data_buckets) or "none"
            raise JobSpecError(
                f"inputs[{number}].s3: bucket {where[0]} is not in the team file's data_buckets ({listed}); ask the "
                "team's ops to add it"
            )
        path = entry["path"]
        if not isinstance(path, str) or not path.startswith("/") or ".." in path.split("/") or path.rstrip("/") == "":
            raise JobSpecError(f"inputs[{number}].path must be an absolute directory, got {path!r}")
        if any(_overlap(path, other) for other in paths):
            raise JobSpecError(f"inputs[{number}].path {path} overlaps another input's path; give each its own")
        paths.append(path)
    return [dict(entry) for entry in inputs]


def _overlap(one: str, other: str) -> bool:
    """Whether one directory is the other or inside it."""
    one, other = one.rstrip("/") + "/", other.rstrip("/") + "/"
    return one.startswith(other) or other.startswith(one)
