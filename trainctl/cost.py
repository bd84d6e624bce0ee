"""``trainctl cost JOB``: what a job's instances cost, what interruptions wasted, and the same hours on demand.

Which instances ran the job: the node agent's ``nodes/<id>/boot`` markers in S3 (instance type, spot or
on-demand, AZ) and the job's log streams. How long each ran: the Auto Scaling group's activity
(``Launching a new EC2 instance: i-...`` to ``Terminating EC2 instance: i-...``, i.e. billed time including
boot); when the group no longer reports an instance (EC2 Auto Scaling keeps six weeks), from the boot marker to
the node's last log line. Prices: spot instances at the time-weighted spot price of their type and AZ from EC2's
spot price history; on-demand instances and the on-demand comparison from :mod:`trainctl.prices`.
Redone work: from the log lines, for each restart the steps between the checkpoint it resumed from (the agent's
``resume step: N``, logged before it launches the trainer; ``none``: from scratch) and the furthest step the
trainer run before it logged (the run since the restart before, not the whole job), timed by when that run
logged them, times the nodes that ran them.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from itertools import islice
from typing import Any, Optional

from botocore.exceptions import ClientError

from trainctl import jobs
from trainctl.prices import PriceError, PriceTable, average_price, spot_history

_ACTIVITY = re.compile(r"^(Launching a new EC2 instance|Terminating EC2 instance): (i-[0-9a-zA-Z]+)")
_STEP = re.compile(r"\bstep (\d+) epoch \d+ loss|interrupted: checkpoint (\d+) saved")
# The agent's line before it launches a (re)started trainer: no step of that trainer can be logged before it.
_RESUMED = re.compile(r"resume step: (\d+|none)")
ACTIVITY_PAGES = 50  # bounded: 50 pages of 100 activities


@dataclass
class NodeCost:
    instance: str
    type: str
    market: str
    az: str
    start: float
    end: float
    timed_by: str
    usd_per_hour: float
    on_demand_usd_per_hour: float

    @property
    def hours(self) -> float:
        return max(self.end - self.start, 0.0) / 3600.0

    @property
    def cost_usd(self) -> float:
        return self.hours * self.usd_per_hour


@dataclass
class Redone:
    steps: int
    node_hours: float
    gpu_hours: Optional[float]
    usd: float


def _activities(client: jobs.ClientFactory, group: str) -> dict[str, dict[str, float]]:
    """Per instance: launch and termination times (s) from the group's scaling activities."""
    found: dict[str, dict[str, float]] = {}
    pages = client("autoscaling").get_paginator("describe_scaling_activities").paginate(AutoScalingGroupName=group)
    for page in islice(pages, ACTIVITY_PAGES):
        for activity in page["Activities"]:
            m = _ACTIVITY.match(activity.get("Description", ""))
            if m and m.group(1).startswith("Launching"):
                found.setdefault(m.group(2), {})["launch"] = activity["StartTime"].timestamp()
            elif m:
                found.setdefault(m.group(2), {})["end"] = (activity.get("EndTime") or activity["StartTime"]).timestamp()
    return found


def _boot_markers(client: jobs.ClientFactory, ref: jobs.ClusterRef, job_id: str) -> dict[str, dict[str, Any]]:
    s3 = client("s3")
    return {
        instance: json.loads(s3.get_object(Bucket=ref.bucket, Key=names["boot"])["Body"].read())
        for instance, names in jobs.node_markers(client, ref, job_id).items()
        if "boot" in names
    }


def node_costs(
    client: jobs.ClientFactory,
    ref: jobs.ClusterRef,
    job_id: str,
    prices: PriceTable,
    events: list[tuple[float, str, str]],
    now: Optional[float] = None,
) -> list[NodeCost]:
    now = time.time() if now is None else now
    markers = _boot_markers(client, ref, job_id)
    last_line: dict[str, float] = {}
    for ts, stream, _ in events:
        last_line[stream.rsplit("/", 1)[-1]] = ts
    activity = _activities(client, ref.group)
    in_group = {m["InstanceId"] for m in jobs.group(client, ref)["Instances"]}
    described = _describe(client, [i for i in set(markers) | set(last_line) if i not in markers])
    nodes = []
    for instance in sorted(set(markers) | set(last_line)):
        facts = markers.get(instance) or described.get(instance)
        if not facts or not facts.get("instance_type") or not facts.get("availability_zone"):
            raise PriceError(f"instance {instance} of job {job_id}: no boot marker and EC2 no longer describes it")
        times = activity.get(instance, {})
        if "launch" in times:
            end = times.get("end") or (now if instance in in_group else last_line.get(instance, now))
            start, timed_by = times["launch"], "group activity"
        else:
            start = float(facts.get("time") or min(ts for ts, s, _ in events if s.endswith("/" + instance)))
            end, timed_by = (now if instance in in_group else last_line.get(instance, start)), "node logs"
        market = "spot" if facts.get("lifecycle") == "spot" else "on-demand"
        itype, az = str(facts["instance_type"]), str(facts["availability_zone"])
        on_demand = prices.on_demand_price(itype)
        if market == "spot":
            history = spot_history(client, itype, az, _dt(start), _dt(max(end, start)))
            price = average_price(history, start, end)
            if price is None:
                raise PriceError(f"no spot price history for {itype} in {az} between {_dt(start)} and {_dt(end)}")
        else:
            price = on_demand
        nodes.append(NodeCost(instance, itype, market, az, start, end, timed_by, price, on_demand))
    return nodes


def _describe(client: jobs.ClientFactory, instances: list[str]) -> dict[str, dict[str, Any]]:
    if not instances:
        return {}
    try:
        found = client("ec2").describe_instances(InstanceIds=instances)
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") != "InvalidInstanceID.NotFound":
            raise
        return {}  # EC2 forgets terminated instances after about an hour
    return {
        i["InstanceId"]: {
            "instance_type": i.get("InstanceType"),
            "lifecycle": i.get("InstanceLifecycle", "on-demand"),
            "availability_zone": i.get("Placement", {}).get("AvailabilityZone"),
            "time": i["LaunchTime"].timestamp(),
        }
        for r in found["Reservations"]
        for i in r["Instances"]
    }


def _dt(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, tz=UTC)


def redone_work(events: Iterable[tuple[float, str, str]], nodes: list[NodeCost], prices: PriceTable) -> Redone:
    """Work done twice: for each restart, the steps from the checkpoint it resumed from to the furthest step of the
    trainer run before it (the steps logged since the restart before), timed by when that run logged them."""
    run: dict[int, float] = {}  # the current trainer run: step -> when this run first logged it
    steps, node_s, gpu_s, usd = 0, 0.0, 0.0, 0.0
    gpus_known = True
    for ts, _, message in events:
        if m := _STEP.search(message):
            run.setdefault(int(m.group(1) or m.group(2)), ts)
            continue
        if not (m := _RESUMED.search(message)) or not run:
            continue  # every node's agent logs the same restart: the first line ends the run, the others find none
        resumed = 0 if m.group(1) == "none" else int(m.group(1))
        furthest = max(run)
        # the redone steps ran after this run logged the step resumed from (or, if it did not, from its first line)
        began, ended = run[max((s for s in run if s <= resumed), default=min(run))], run[furthest]
        run = {}  # the next run is measured against its own furthest step
        if resumed >= furthest:
            continue
        steps += furthest - resumed
        for node in nodes:  # the nodes that were running while this run ran those steps
            overlap = min(node.end, ended) - max(node.start, began)
            if overlap > 0:
                node_s += overlap
                usd += overlap / 3600.0 * node.usd_per_hour
                gpus = prices.gpus.get(node.type)
                gpus_known = gpus_known and gpus is not None
                gpu_s += overlap * (gpus or 0)
    return Redone(steps, node_s / 3600.0, gpu_s / 3600.0 if gpus_known else None, usd)


def job_cost(
    client: jobs.ClientFactory, ref: jobs.ClusterRef, job_id: str, prices: PriceTable, now: Optional[float] = None
) -> dict[str, Any]:
    events = jobs.log_events(client, ref, job_id)
    nodes = node_costs(client, ref, job_id, prices, events, now)
    redone = redone_work(events, nodes, prices)
    by_type: dict[tuple[str, str], dict[str, Any]] = {}
    for n in nodes:
        row = by_type.setdefault(
            (n.type, n.market), {"type": n.type, "market": n.market, "nodes": 0, "hours": 0.0, "cost_usd": 0.0}
        )
        row["nodes"] += 1
        row["hours"] += n.hours
        row["cost_usd"] += n.cost_usd
        row["on_demand_usd"] = row.get("on_demand_usd", 0.0) + n.hours * n.on_demand_usd_per_hour
    for row in by_type.values():
        row["usd_per_hour"] = row["cost_usd"] / row["hours"] if row["hours"] else 0.0
    total = sum(n.cost_usd for n in nodes)
    on_demand = sum(n.hours * n.on_demand_usd_per_hour for n in nodes)
    return {
        "job_id": job_id,
        "by_type": sorted(by_type.values(), key=lambda r: (r["type"], r["market"])),
        "nodes": [dict(asdict(n), hours=n.hours, cost_usd=n.cost_usd) for n in nodes],
        "total_usd": total,
        "on_demand_usd": on_demand,
        "savings_pct": 100.0 * (1 - total / on_demand) if on_demand else 0.0,
        "interruptions": len(jobs.leaving_nodes(client, ref, job_id)),
        "redone": asdict(redone),
        "on_demand_prices": prices.source,
        "spot_prices": "EC2 spot price history (DescribeSpotPriceHistory), per type and AZ",
    }
