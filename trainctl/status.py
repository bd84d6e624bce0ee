"""``trainctl status`` and ``trainctl list``: a job's state and progress, the jobs of a cluster."""

from __future__ import annotations

import time
from dataclasses import asdict
from typing import Any, Optional

from bootstrap_scripts.spot_training.protocol import FAILED
from trainctl.budget import Budget, team_budget
from trainctl.capacity import capacity
from trainctl.checkpoints import Checkpoint, checkpoints
from trainctl.cluster import ClientFactory, ClusterRef, JobError, described, group
from trainctl.current_job import current_job_id, submitted_job
from trainctl.job_logs import planned_steps
from trainctl.job_queue import queue_summary
from trainctl.job_state import eta_s, job_state, marker, node_states, run_starts, spot_interruptions, submitted


def current_job(client: ClientFactory, ref: ClusterRef) -> str:
    job_id = current_job_id(client, ref)
    if job_id is None:
        raise JobError(f"no job was ever submitted to {ref.team}/{ref.cluster}")
    return job_id


def known_job(client: ClientFactory, ref: ClusterRef, job_id: str) -> str:
    if not submitted(client, ref, job_id):
        raise JobError(f"no job {job_id!r} on {ref.team}/{ref.cluster} (see 'trainctl list')")
    return job_id


def status(client: ClientFactory, ref: ClusterRef, job_id: str) -> dict[str, Any]:
    """The job's state and progress; the group's capacity and nodes only for the cluster's current job (``group_job``):
    the group belongs to it, an earlier job has no node."""
    group_job = current_job_id(client, ref)
    members = group(client, ref) if group_job == job_id else {"DesiredCapacity": None, "Instances": []}
    done = checkpoints(client, ref, job_id)
    last = done[-1] if done else None
    budget = team_budget(client, ref.team)
    state = job_state(client, ref, job_id)
    failed = marker(client, ref, job_id, FAILED) if state == FAILED else None
    planned = planned_steps(client, ref, job_id)
    job = submitted_job(client, ref, job_id)
    return {
        "job_id": job_id,
        "team": ref.team,
        "cluster": ref.cluster,
        "state": state,
        "reason": None if failed is None else str(failed.get("reason") or "(the FAILED marker gives no reason)"),
        "group": ref.group,
        "group_job": group_job,
        "desired_capacity": members["DesiredCapacity"],
        "capacity": capacity(client, ref, members) if group_job == job_id else None,
        "nodes": _nodes(client, ref, job_id, members["Instances"]),
        # a flat checkpoint (the script's own files) has no step: its number counts the snapshots
        "last_checkpoint_step": last.step if last and last.layout == "step" else None,
        "last_flat_checkpoint": last.step if last and last.layout == "flat" else None,
        "last_checkpoint_age_s": round(time.time() - last.manifest_time, 1) if last else None,
        "planned_steps": planned,
        "eta_s": _eta_s(client, ref, job_id, state, planned, done),
        "interruptions": spot_interruptions(client, ref, job_id),
        "env": dict(job.get("env") or {}),  # plain values, shown as they are
        "secrets": sorted(job.get("secrets") or {}),  # the variables' names only: never a value, nor where it is
        "budget": asdict(budget) if isinstance(budget, Budget) else budget,  # None, a dict or BUDGET_UNKNOWN
        **queue_summary(client, ref),  # the cluster's queue: how many, and which starts next
    }


def _nodes(client: ClientFactory, ref: ClusterRef, job_id: str, members: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The group's instances: id, lifecycle state in the group, market, zone and type (the group's, else EC2's), and
    the node agent's own lifecycle state (``agent_state``: BOOT, TRAIN, DRAIN ...; docs/reference/node-lifecycle.md),
    how long it has been in it by S3's clock and why it went there; None until the agent writes one."""
    ids = [m["InstanceId"] for m in members]
    details, agents, now = described(client, ids), node_states(client, ref, job_id, ids), time.time()
    return [
        {
            "instance": m["InstanceId"],
            "state": m["LifecycleState"],
            "market": "spot" if details.get(m["InstanceId"], {}).get("InstanceLifecycle") == "spot" else "on-demand",
            "az": m.get("AvailabilityZone"),
            "type": m.get("InstanceType") or details.get(m["InstanceId"], {}).get("InstanceType"),
            **_agent_state(agents.get(m["InstanceId"]), now),
        }
        for m in members
    ]


def _agent_state(agent: Optional[dict[str, Any]], now: float) -> dict[str, Any]:
    if agent is None:
        return {"agent_state": None, "agent_state_age_s": None, "agent_reason": None}
    age = round(max(now - agent["written"], 0.0), 1)
    return {"agent_state": agent["state"], "agent_state_age_s": age, "agent_reason": agent["reason"]}


def _eta_s(
    client: ClientFactory, ref: ClusterRef, job_id: str, state: str, planned: Optional[int], done: list[Checkpoint]
) -> Optional[int]:
    """A running job's ETA at the pace of the current run (no restart between its checkpoints), if it has one."""
    if state != "RUNNING" or not planned:
        return None
    return eta_s(done, planned, run_starts(client, ref, job_id), time.time())


def list_jobs(client: ClientFactory, ref: ClusterRef) -> list[dict[str, Any]]:
    rows = []
    pages = client("s3").get_paginator("list_objects_v2").paginate(Bucket=ref.bucket, Prefix=ref.code_prefix)
    for page in pages:
        for obj in page.get("Contents", []):
            job_id = obj["Key"][len(ref.code_prefix) :].split(".", 1)[0]
            rows.append({"job_id": job_id, "submitted": obj["LastModified"].strftime("%Y-%m-%d %H:%M:%S")})
    for row in rows:
        row["state"] = job_state(client, ref, row["job_id"])
    return sorted(rows, key=lambda r: r["submitted"])
