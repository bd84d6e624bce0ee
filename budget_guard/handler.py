"""Budget guard: a scheduled Lambda function that stops a team's jobs once its monthly budget is spent.

Every run: read the team's AWS Budgets budget. Below the limit, only set to 0 a group still above 0 after its current
job ended (``DONE``, ``FAILED`` or ``STOPPED``: its agents could not scale it down). At or over it, for each cluster
(its job-spec parameter names the bucket, prefix and current-job parameter): ask the current job to stop the
way ``trainctl stop`` does (a ``STOP`` object: the node agents save a checkpoint, write ``STOPPED`` and scale
the group to 0), clear the cluster's queue first (``<cluster>/queue/``: no queued job starts after the stop; each one
cleared is named in the run's report, and its code archive stays for a submit next month), and set the group to 0
at once when no instance runs or the stop was asked more than
``FORCE_AFTER_S`` ago and instances still run (an agent that does not answer must not keep spending).
Environment: ``BUDGET_NAME``, ``JOB_SPEC_PARAMETERS`` (comma-separated), ``TEAM_TAG``, ``TEAM``,
``FORCE_AFTER_S``. Standard library and boto3 only (the Lambda runtime's), and the S3 contract of the jobs,
``bootstrap_scripts/spot_training/protocol.py``, which the function's package holds at the same path
(``training_constructs/guard_code.py``).
"""

from __future__ import annotations

import json
import os
import time
from typing import Any, Optional

import boto3

from bootstrap_scripts.spot_training.protocol import (
    END_MARKERS,
    QUEUE_SUFFIX,
    STOP,
    job_prefix,
    listed,
    queue_prefix,
    written_at,
)


def _groups(autoscaling: Any, team_tag: str, team: str) -> dict[str, dict[str, Any]]:
    """The team's groups by cluster name (tag ``<team_tag>`` = team, cluster from the cluster tag)."""
    cluster_tag = team_tag.rsplit(":", 1)[0] + ":cluster"
    found: dict[str, dict[str, Any]] = {}
    for page in autoscaling.get_paginator("describe_auto_scaling_groups").paginate():
        for group in page["AutoScalingGroups"]:
            tags = {t["Key"]: t["Value"] for t in group.get("Tags", [])}
            if tags.get(team_tag) == team and cluster_tag in tags:
                found[tags[cluster_tag]] = group
    return found


def guard(clients: Any, env: dict[str, str], account: str, now: float) -> dict[str, Any]:
    """One run. Each cluster is judged on its own: a cluster that cannot be judged (an AWS error, a parameter that
    is not JSON) does not keep the guard from the others; the run then raises at the end, naming it, so the
    function's errors show it and EventBridge tries the run again."""
    budget = clients("budgets").describe_budget(AccountId=account, BudgetName=env["BUDGET_NAME"])["Budget"]
    limit = float(budget["BudgetLimit"]["Amount"])
    spent = float(budget.get("CalculatedSpend", {}).get("ActualSpend", {}).get("Amount", 0.0))
    report: dict[str, Any] = {"budget": env["BUDGET_NAME"], "limit_usd": limit, "spent_usd": spent, "actions": []}
    s3, ssm, autoscaling = clients("s3"), clients("ssm"), clients("autoscaling")
    groups = _groups(autoscaling, env["TEAM_TAG"], env["TEAM"])
    force_after = float(env.get("FORCE_AFTER_S", "900"))
    failed: list[str] = []
    for name in filter(None, env["JOB_SPEC_PARAMETERS"].split(",")):
        try:
            if spent < limit:
                _sweep_cluster(s3, ssm, autoscaling, groups, name, report)
            else:
                _stop_cluster(s3, ssm, autoscaling, groups, name, env["BUDGET_NAME"], now, force_after, report)
        except Exception as exc:  # one cluster must not keep the guard from the others
            failed.append(f"{name}: {type(exc).__name__}: {exc}")
    if failed:
        print(json.dumps(report))
        raise RuntimeError("budget guard could not judge: " + "; ".join(failed))
    return report


def _current_job(
    s3: Any, ssm: Any, groups: dict[str, dict[str, Any]], spec_parameter: str, report: dict[str, Any]
) -> Optional[tuple[dict[str, Any], dict[str, Any], Optional[str], Optional[str]]]:
    """(job spec, group, current job id, the end marker it has) of a cluster whose group is above 0, else None."""
    spec = json.loads(ssm.get_parameter(Name=spec_parameter)["Parameter"]["Value"])
    group = groups.get(spec["cluster"])
    if group is None:  # its group lost its tags, or another name: never stopped, so the run says so
        raise LookupError(f"no Auto Scaling group with the team's tags for cluster {spec['cluster']!r}")
    if group["DesiredCapacity"] == 0:
        return None
    job_id = _current_job_id(ssm, spec, report)
    prefix = job_prefix(spec["prefix"], job_id) if job_id else None
    # whether an end marker is there is all the guard needs: it lists them (its ListBucket is limited to the
    # clusters' prefixes: S3 answers a GetObject of a missing key with 403) and never reads one
    ended = prefix and next((m for m in END_MARKERS if listed(s3, spec["bucket"], prefix + m) is not None), None)
    return spec, group, job_id, ended or None


def _current_job_id(ssm: Any, spec: dict[str, Any], report: dict[str, Any]) -> Optional[str]:
    """The cluster's current job (its current-job parameter), or None: none submitted, or not a job trainctl wrote."""
    try:
        return str(json.loads(ssm.get_parameter(Name=spec["current_job_parameter"])["Parameter"]["Value"])["job_id"])
    except ssm.exceptions.ParameterNotFound:
        return None
    except (ValueError, KeyError, TypeError) as exc:  # not a job trainctl wrote: nothing to ask, stop the spending
        report["actions"].append(f"{spec['cluster']}: current-job parameter unreadable ({exc!r}): no job to ask")
        return None


def _sweep_cluster(
    s3: Any, ssm: Any, autoscaling: Any, groups: dict[str, dict[str, Any]], spec_parameter: str, report: dict[str, Any]
) -> None:
    """Under the budget: a group still above 0 after its job ended (its agents could not scale it down: an Auto
    Scaling outage, an agent that died) goes to 0. Idle nodes must not bill until the budget is spent."""
    current = _current_job(s3, ssm, groups, spec_parameter, report)
    if current is not None and current[3] is not None:
        spec, group, job_id, ended = current
        # a submit since the groups were read (its agents scaled to 0, a new job took the group): leave it
        if _current_job_id(ssm, spec, report) != job_id:
            return
        autoscaling.set_desired_capacity(AutoScalingGroupName=group["AutoScalingGroupName"], DesiredCapacity=0)
        report["actions"].append(
            f"{spec['cluster']}: job {job_id} is {ended}: group {group['AutoScalingGroupName']} set to 0"
        )


def _stop_cluster(
    s3: Any,
    ssm: Any,
    autoscaling: Any,
    groups: dict[str, dict[str, Any]],
    spec_parameter: str,
    budget: str,
    now: float,
    force_after: float,
    report: dict[str, Any],
) -> None:
    _clear_queue(s3, ssm, spec_parameter, report)  # before the stop: its hand-over then finds the queue empty
    current = _current_job(s3, ssm, groups, spec_parameter, report)
    if current is None:
        return
    spec, group, job_id, ended = current
    prefix = job_prefix(spec["prefix"], job_id) if job_id else None
    finished = ended is not None
    asked_at = written_at(s3, spec["bucket"], prefix + STOP) if prefix and not finished else None
    if prefix and not finished and asked_at is None:
        body = {"requested_at": now, "by": "budget guard", "reason": f"budget {budget} spent"}
        s3.put_object(Bucket=spec["bucket"], Key=prefix + STOP, Body=json.dumps(body).encode())
        report["actions"].append(f"{spec['cluster']}: asked job {job_id} to stop")
    overdue = asked_at is not None and now - asked_at > force_after
    if prefix is None or finished or overdue or not group["Instances"]:
        autoscaling.set_desired_capacity(AutoScalingGroupName=group["AutoScalingGroupName"], DesiredCapacity=0)
        report["actions"].append(f"{spec['cluster']}: group {group['AutoScalingGroupName']} set to 0")


def _clear_queue(s3: Any, ssm: Any, spec_parameter: str, report: dict[str, Any]) -> None:
    """Over the budget: delete the cluster's queued jobs (listed, never read), so that none starts after the stop. A
    node that took the head just before the clear started it: the next run stops it as the current job."""
    spec = json.loads(ssm.get_parameter(Name=spec_parameter)["Parameter"]["Value"])
    queue = queue_prefix(spec["prefix"])
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=spec["bucket"], Prefix=queue).get("Contents", [])]
    for key in keys:
        s3.delete_object(Bucket=spec["bucket"], Key=key)
    if keys:
        cleared = ", ".join(k[len(queue) : -len(QUEUE_SUFFIX)] for k in keys)
        report["actions"].append(f"{spec['cluster']}: queue cleared ({cleared}): they do not start over the budget")


def handler(event: Any, context: Any) -> dict[str, Any]:
    session = boto3.session.Session()
    account = context.invoked_function_arn.split(":")[4]
    report = guard(session.client, dict(os.environ), account, time.time())
    print(json.dumps(report))
    return report
