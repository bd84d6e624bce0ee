"""Jobs on a deployed cluster, through the AWS APIs only (real AWS or the emulated cloud alike): one import for the
callers that use several duties (the emulator's demo, the tests). Each duty is a module of its own:

- :mod:`trainctl.cluster`: the cluster by team and name, its Auto Scaling group;
- :mod:`trainctl.code_archive`: the code directory packed as the job's archive;
- :mod:`trainctl.budget`: the team's budget;
- :mod:`trainctl.submit`: a submit and its rollback;
- :mod:`trainctl.current_job`: the current-job parameter, written compare-and-set;
- :mod:`trainctl.checkpoints`: the job's checkpoints in S3;
- :mod:`trainctl.job_state`: the job's state (its markers, the group) and ETA;
- :mod:`trainctl.job_logs`: the job's log streams.
"""

from __future__ import annotations

from bootstrap_scripts.spot_training.protocol import CHECKPOINT_FOLDER, MANIFEST
from trainctl.checkpoints import Checkpoint, checkpoints
from trainctl.cluster import ClientFactory, ClusterRef, JobError, described, desired_capacity, find_cluster, group
from trainctl.current_job import set_current_job
from trainctl.job_logs import log_events, planned_steps, stream_events
from trainctl.job_state import (
    end_marker,
    eta_s,
    job_exists,
    job_state,
    leaving_nodes,
    marker,
    node_markers,
    object_time,
)
from trainctl.submit import submit, upload

__all__ = [
    "CHECKPOINT_FOLDER",
    "MANIFEST",
    "Checkpoint",
    "ClientFactory",
    "ClusterRef",
    "JobError",
    "checkpoints",
    "described",
    "desired_capacity",
    "end_marker",
    "eta_s",
    "find_cluster",
    "group",
    "job_exists",
    "job_state",
    "leaving_nodes",
    "log_events",
    "marker",
    "node_markers",
    "object_time",
    "planned_steps",
    "set_current_job",
    "stream_events",
    "submit",
    "upload",
]
