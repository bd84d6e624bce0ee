"""The job spec: the stack's SSM job-spec parameter merged with the submitted job's, validated into a ``Job``."""

from __future__ import annotations

import json
from typing import Any, Dict, List, Optional, Tuple

from botocore.exceptions import ClientError

from spot_training.agent.errors import AgentError, JobRefused
from spot_training.job_spec import JOB_ID_RE, JobSpecError, check_job
from spot_training.protocol import FAILED, cluster_prefix, job_prefix


class Job:
    """The validated job: the stack's spec merged with the submitted job's overrides."""

    def __init__(self, spec: Dict[str, Any]) -> None:
        self.spec = spec
        self.job_id: str = spec["job_id"]
        self.bucket: str = spec["bucket"]
        self.prefix: str = spec["prefix"]
        self.code_key: str = spec["code_key"]
        self.argv: List[str] = spec["argv"]
        self.python: str = spec["python"]
        self.nproc_per_node: int = spec["nproc_per_node"]
        self.min_nodes: int = spec["min_nodes"]
        self.max_nodes: int = spec["max_nodes"]
        self.checkpoint_dir: str = spec["checkpoint_dir"]
        self.checkpoint_interval_s: Optional[float] = spec["checkpoint_interval_s"]
        self.checkpoint_wait_for_upload: bool = spec["checkpoint_wait_for_upload"]
        self.mtbi_s: float = spec["mean_time_between_interruptions_s"]
        self.max_restarts: int = spec["max_restarts"]
        self.grace_s: float = spec["interruption_grace_s"]
        self.rendezvous_port: int = spec["rendezvous_port"]
        self.log_group: str = spec["log_group"]
        self.stall_timeout_s: Optional[int] = spec["stall_timeout_s"]  # None: the stall watchdog is off
        self.warm_pool: Optional[Dict[str, Any]] = spec["warm_pool"]
        self.efa: bool = spec["efa"]  # the nodes have EFA interfaces (agent/efa.py)

    @property
    def job_prefix(self) -> str:
        return job_prefix(self.prefix, self.job_id)


def validate_job(spec: Any, current: Any, current_name: str) -> Job:
    try:
        return Job(check_job(spec, current, current_name))
    except JobSpecError as exc:
        raise JobRefused(str(exc), failed_marker(spec, current)) from None


def failed_marker(spec: Any, current: Any) -> Optional[Tuple[str, str]]:
    """(bucket, key) of the FAILED marker of a job the agent refuses, if its spec and job id can say where."""
    if not (isinstance(spec, dict) and isinstance(current, dict) and JOB_ID_RE.match(str(current.get("job_id")))):
        return None
    bucket, cluster = spec.get("bucket"), spec.get("cluster")
    if not (isinstance(bucket, str) and bucket and isinstance(cluster, str) and cluster):
        return None
    return bucket, job_prefix(cluster_prefix(cluster), current["job_id"]) + FAILED


def load_job(ssm: Any, spec_parameter: str) -> Job:
    spec = _read_parameter(ssm, spec_parameter, required=True)
    current_name = spec.get("current_job_parameter") if isinstance(spec, dict) else None
    if not isinstance(current_name, str) or not current_name.startswith("/"):
        raise JobRefused(f"current_job_parameter must be an SSM parameter name, got {current_name!r}")
    current = _read_parameter(ssm, current_name, required=False)
    if current is None:
        raise JobRefused(f"no job submitted: SSM parameter {current_name} does not exist (submit a job first)")
    return validate_job(spec, current, current_name)


def _read_parameter(ssm: Any, name: str, required: bool) -> Any:
    try:
        value = ssm.get_parameter(Name=name)["Parameter"]["Value"]
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") == "ParameterNotFound" and not required:
            return None
        raise AgentError(f"cannot read SSM parameter {name}: {exc.response.get('Error', {}).get('Code')}") from None
    try:
        return json.loads(value)
    except ValueError as exc:
        raise JobRefused(f"SSM parameter {name} is not valid JSON: {exc}") from None


def trainer_env(
    job: Job, instance_id: str, attempt: int, resume_step: Optional[int], flat: Optional[int], ids: List[str]
) -> Dict[str, str]:
    """The trainer's ``SPOT_TRAINING_*`` environment (``node_agent``'s docstring lists it)."""
    interval = job.checkpoint_interval_s
    return {
        "SPOT_TRAINING_JOB_ID": job.job_id,
        "SPOT_TRAINING_CHECKPOINT_DIR": job.checkpoint_dir,
        "SPOT_TRAINING_RESUME_STEP": "" if resume_step is None or flat is not None else str(resume_step),
        "SPOT_TRAINING_RESUMED": "0" if resume_step is None else "1",
        "SPOT_TRAINING_CHECKPOINT_INTERVAL_S": "" if interval is None else str(interval),
        "SPOT_TRAINING_CHECKPOINT_WAIT_FOR_UPLOAD": "1" if job.checkpoint_wait_for_upload else "0",
        "SPOT_TRAINING_MTBI_S": str(job.mtbi_s),
        "SPOT_TRAINING_INSTANCE_ID": instance_id,
        "SPOT_TRAINING_NODE_INDEX": str(ids.index(instance_id)),
        "SPOT_TRAINING_NUM_PEERS": str(len(ids)),
        "SPOT_TRAINING_ATTEMPT": str(attempt),
    }
