"""Capacity watcher: a scheduled Lambda function that moves one cluster's group to on-demand when spot capacity has
not come for ``ON_DEMAND_AFTER_S``, and back to spot once the group stands at 0 (:mod:`capacity_watcher.decision`).

Every run: read the group (DescribeAutoScalingGroups), its newest scaling activities (one page of
DescribeScalingActivities: the failed spot launches, ``Could not launch Spot Instances. InsufficientInstanceCapacity
...``) and the watcher's record (``<cluster>/capacity.json`` in the checkpoint bucket, see
``bootstrap_scripts/spot_training/protocol.py``). To switch, it updates the group's MixedInstancesPolicy, only its
InstancesDistribution (``OnDemandPercentageAboveBaseCapacity`` 100 for on-demand, ``SPOT_PERCENTAGE``, the team
file's value, for spot; an update that names no launch template needs no ec2:RunInstances or iam:PassRole), and its
desired capacity (unchanged: the group launches what it lacks under the new distribution). It writes the record when
it changes: trainctl status reads it.
Environment: ``GROUP_NAME``, ``BUCKET``, ``RECORD_KEY``, ``ON_DEMAND_AFTER_S``, ``SPOT_PERCENTAGE``. Standard library
and boto3 only (the Lambda runtime's), the S3 contract's reader (``protocol.py``) and the decision;
``training_constructs/guard_code.py`` bundles them at their repository paths.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import boto3

from bootstrap_scripts.spot_training.protocol import read_marker
from capacity_watcher.decision import ON_DEMAND, capacity_failures, decide

LAUNCHED_STATES = ("Pending", "Pending:Wait", "Pending:Proceed", "InService")


def distribution(group: dict[str, Any], on_demand_percentage: int) -> dict[str, Any]:
    """The group's InstancesDistribution with ``on_demand_percentage`` above the base: the only part of its
    MixedInstancesPolicy the update names (its launch templates stay as they are)."""
    current = dict(group["MixedInstancesPolicy"].get("InstancesDistribution", {}))
    return {**current, "OnDemandPercentageAboveBaseCapacity": on_demand_percentage}


def watch(clients: Any, env: dict[str, str], now: float) -> dict[str, Any]:
    """One run; its report (what it read and did)."""
    autoscaling, s3 = clients("autoscaling"), clients("s3")
    name, bucket, key = env["GROUP_NAME"], env["BUCKET"], env["RECORD_KEY"]
    groups = autoscaling.describe_auto_scaling_groups(AutoScalingGroupNames=[name])["AutoScalingGroups"]
    if not groups:
        raise LookupError(f"no Auto Scaling group {name}")
    group = groups[0]
    activities = autoscaling.describe_scaling_activities(AutoScalingGroupName=name, MaxRecords=100)["Activities"]
    record = read_marker(s3, bucket, key) or {}
    launched = sum(1 for i in group["Instances"] if i["LifecycleState"] in LAUNCHED_STATES)
    decision = decide(
        desired=group["DesiredCapacity"],
        launched=launched,
        failures=capacity_failures(activities),
        record=record,
        now=now,
        after_s=float(env["ON_DEMAND_AFTER_S"]),
    )
    if decision.action is not None:
        percentage = 100 if decision.action == ON_DEMAND else int(env["SPOT_PERCENTAGE"])
        autoscaling.update_auto_scaling_group(
            AutoScalingGroupName=name,
            MixedInstancesPolicy={"InstancesDistribution": distribution(group, percentage)},
            DesiredCapacity=group["DesiredCapacity"],
        )
    if decision.record != record:
        s3.put_object(Bucket=bucket, Key=key, Body=json.dumps(decision.record).encode())
    return {
        "group": name,
        "desired": group["DesiredCapacity"],
        "launched": launched,
        "action": decision.action,
        "reason": decision.reason,
        "record": decision.record,
    }


def handler(event: Any, context: Any) -> dict[str, Any]:
    report = watch(boto3.session.Session().client, dict(os.environ), time.time())
    print(json.dumps(report))
    return report
