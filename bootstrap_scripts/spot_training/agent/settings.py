"""The agent's knobs from its environment, read once at start into a frozen ``AgentSettings``."""

from __future__ import annotations

import os
from dataclasses import dataclass

from spot_training.agent.errors import env_float
from spot_training.job_spec import JOIN_TIMEOUT_S


@dataclass(frozen=True)
class AgentSettings:
    """What the node's environment sets (``node_agent``'s docstring lists the variables and their defaults)."""

    poll_s: float  # SPOT_TRAINING_POLL_INTERVAL_S: IMDS and sync poll interval
    join_timeout_s: float  # SPOT_TRAINING_RDZV_JOIN_TIMEOUT_S: peer discovery and rendezvous join timeout
    start_wait_s: float  # SPOT_TRAINING_START_WAIT_S: a ready node's wait for its InService peers (first attempt)
    barrier_s: float  # SPOT_TRAINING_DONE_BARRIER_S: a finished node's wait for its peers' done markers
    keep: int  # SPOT_TRAINING_KEEP_CHECKPOINTS: complete checkpoints kept in S3
    test_stall_timeout_s: float  # SPOT_TRAINING_TEST_STALL_TIMEOUT_S (tests only; 0: the job's stall_timeout_s)
    test_last_call_s: int  # SPOT_TRAINING_TEST_RDZV_LAST_CALL_S (tests only; 0: torch's default)
    node_root: str  # SPOT_TRAINING_NODE_ROOT: prefix of the node's local paths ("" for "/")
    work_dir: str  # SPOT_TRAINING_WORK_DIR: where code is unpacked

    @classmethod
    def from_env(cls) -> "AgentSettings":
        """Read the knobs; a knob that is not a number raises ``AgentError`` naming it."""
        node_root = os.environ.get("SPOT_TRAINING_NODE_ROOT", "").rstrip("/")
        return cls(
            poll_s=env_float("SPOT_TRAINING_POLL_INTERVAL_S", 5.0),
            join_timeout_s=env_float("SPOT_TRAINING_RDZV_JOIN_TIMEOUT_S", JOIN_TIMEOUT_S),
            start_wait_s=env_float("SPOT_TRAINING_START_WAIT_S", 300.0),
            barrier_s=env_float("SPOT_TRAINING_DONE_BARRIER_S", 120.0),
            keep=int(env_float("SPOT_TRAINING_KEEP_CHECKPOINTS", 2)),
            test_stall_timeout_s=env_float("SPOT_TRAINING_TEST_STALL_TIMEOUT_S", 0.0),
            test_last_call_s=int(env_float("SPOT_TRAINING_TEST_RDZV_LAST_CALL_S", 0.0)),
            node_root=node_root,
            work_dir=os.environ.get("SPOT_TRAINING_WORK_DIR") or node_root + "/opt/spot-training/work",
        )
