"""A cluster's ``job`` section: the defaults of the job spec the node agent reads."""

from __future__ import annotations

import json
import math
import posixpath
from typing import Optional

from pydantic import Field, field_validator, model_validator

from bootstrap_scripts.spot_training.job_spec import (
    CHECKPOINT_INTERVAL_MIN_S,
    MTBI_MAX_S,
    PARAMETER_MAX_BYTES,
    STALL_TIMEOUT_MAX_S,
    STALL_TIMEOUT_MIN_S,
    JobSpecError,
    parse_command,
    stall_too_short,
)
from team_config.model.base import AbsPath, Strict

# job.checkpoint_dir may not be one of these or under a SYSTEM_TREES one: the node agent uploads everything under
# the directory (its flat-layout walker), so "/" or "/usr" would upload the system.
SYSTEM_DIRS = frozenset(
    "/ /bin /boot /dev /etc /home /lib /lib64 /opt /proc /root /run /sbin /srv /sys /tmp /usr /var".split()
)
SYSTEM_TREES = ("/usr", "/etc", "/proc", "/sys")


DEFAULT_PYTHON = "/opt/pytorch/bin/python"  # the PyTorch DLAMI's python_location


# What job.command, job.python and job.checkpoint_dir may take of the job spec, an SSM parameter of at most
# PARAMETER_MAX_BYTES: the rest at its longest (64 warm volume ids, 32-character names, the longest numbers) takes
# about 2,600 bytes (tests/test_constructs.py synthesizes that job spec and checks the sum).
JOB_SPEC_TEXT_BYTES = 1000


def json_bytes(text: str) -> int:
    """Bytes ``text`` takes inside a JSON document (UTF-8, escapes, without the quotes)."""
    return len(json.dumps(text, ensure_ascii=False).encode()) - 2


class JobConfig(Strict):
    """Defaults for the job spec the boot script reads; a submitted job may override them."""

    command: str = Field(
        "python train.py", min_length=1, description="Entry command run by torchrun, relative to the code directory."
    )
    python: AbsPath = Field(DEFAULT_PYTHON, description="Interpreter (of the environment with torch) on the AMI.")
    nproc_per_node: Optional[int] = Field(
        None,
        ge=1,
        le=64,
        description="Processes (GPUs) per node; unset: one per GPU of the instance types (1 on types without GPUs).",
    )
    checkpoint_dir: AbsPath = Field(
        "/opt/ml/checkpoints",
        description="Directory the trainer writes checkpoints to; the agent uploads everything under it, so system "
        "directories are refused.",
    )
    checkpoint_interval_s: Optional[float] = Field(
        None,
        ge=CHECKPOINT_INTERVAL_MIN_S,
        allow_inf_nan=False,
        description="Fixed interval; unset: Young/Daly from measured cost.",
    )
    checkpoint_wait_for_upload: bool = Field(
        False,
        description="Training waits at each checkpoint until it is durable in S3: a hard kill then loses at most one "
        "interval (default: training goes on while it uploads, so one interval plus the write and upload time).",
    )
    mean_time_between_interruptions_s: int = Field(
        3600, gt=0, le=MTBI_MAX_S, description="Assumed MTBI for the Young/Daly interval."
    )
    max_restarts: int = Field(
        3, ge=0, le=100, description="Restarts in a row without a new checkpoint before the job is marked FAILED."
    )
    interruption_grace_s: int = Field(
        90, gt=0, lt=120, description="Seconds the trainer gets after SIGTERM; under the 120 s notice."
    )
    rendezvous_port: int = Field(29400, ge=1024, le=65535, description="torchrun c10d rendezvous port.")
    # Off by default: the agent cannot tell a silent healthy phase (a data download, a long evaluation,
    # torch.compile) from a hang, so a default would end healthy jobs. A team opts in with the longest such phase
    # plus a margin.
    stall_timeout_s: Optional[int] = Field(
        None,
        description="Seconds the job may go without progress (an output line or a checkpoint write on any of its "
        "nodes, or a new checkpoint of the job durable in S3) before the node agent ends its trainer as hung and "
        f"counts a trainer failure ({STALL_TIMEOUT_MIN_S}-{STALL_TIMEOUT_MAX_S}). Unset (null): off. Set it above the "
        "longest silent phase of the job (data download, evaluation, torch.compile) and at least twice "
        "checkpoint_interval_s.",
    )

    @field_validator("stall_timeout_s")
    @classmethod
    def _stall_timeout(cls, seconds: Optional[int]) -> Optional[int]:
        if seconds is not None and not STALL_TIMEOUT_MIN_S <= seconds <= STALL_TIMEOUT_MAX_S:
            raise ValueError(
                f"{seconds} is outside {STALL_TIMEOUT_MIN_S} to {STALL_TIMEOUT_MAX_S} seconds (5 minutes to a day: a "
                "trainer silent for less may just be loading or saving); give seconds in that range, or null to turn "
                "the stall watchdog off"
            )
        return seconds

    @model_validator(mode="after")
    def _fits_the_job_spec(self) -> JobConfig:
        used = sum(json_bytes(text) for text in (self.command, self.python, self.checkpoint_dir))
        if used > JOB_SPEC_TEXT_BYTES:
            raise ValueError(
                f"command, python and checkpoint_dir take {used:,} bytes together, above the {JOB_SPEC_TEXT_BYTES:,} "
                f"the job spec has room for (an SSM parameter of at most {PARAMETER_MAX_BYTES:,} bytes: the deploy "
                "would fail); shorten the command (long arguments go in a file of your code)"
            )
        return self

    @model_validator(mode="after")
    def _stall_timeout_above_the_interval(self) -> JobConfig:
        stall, interval = self.stall_timeout_s, self.checkpoint_interval_s
        if stall is not None and interval is not None and stall_too_short(stall, interval):  # both set
            raise ValueError(
                f"stall_timeout_s {stall} is less than twice checkpoint_interval_s {interval:g}: a node whose only "
                "sign of progress is its checkpoints would be ended as hung between two; set job.checkpoint_interval_s "
                f"to at most {stall / 2:g}, or job.stall_timeout_s to at least {math.ceil(2 * interval)}"
            )
        return self

    @field_validator("python", "checkpoint_dir")
    @classmethod
    def _no_parent(cls, path: str) -> str:
        if ".." in path.split("/"):
            raise ValueError(f"{path!r} climbs out with '..'; give the absolute path without '..'")
        return path

    @field_validator("checkpoint_dir")
    @classmethod
    def _not_a_system_dir(cls, path: str) -> str:
        # The node agent uploads the whole tree under checkpoint_dir (and restores into it).
        clean = posixpath.normpath(path)
        clean = "/" + clean.lstrip("/")  # POSIX keeps a leading "//" (//usr is /usr)
        if clean in SYSTEM_DIRS or clean.startswith(tuple(f"{tree}/" for tree in SYSTEM_TREES)):
            raise ValueError(
                f"{path!r} is a system directory: the node agent uploads everything under checkpoint_dir to S3; "
                "use a directory of its own, such as /opt/ml/checkpoints"
            )
        return path

    @field_validator("command")
    @classmethod
    def _command(cls, command: str) -> str:
        try:  # the node agent's own rule: a command it would refuse fails here, not on a billed node
            parse_command(command)
        except JobSpecError as exc:
            raise ValueError(str(exc)) from None
        return command
