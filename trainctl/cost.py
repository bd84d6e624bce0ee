"""``trainctl cost JOB``: what a job's instances cost, what interruptions wasted, and the same hours on demand.

Which instances ran the job: the node agent's ``nodes/<id>/boot`` markers in S3 (instance type, spot or
on-demand, AZ; a missing marker, or a fact missing from one, comes from DescribeInstances) and the job's log
streams. How long each ran: the Auto Scaling group's activity
(``Launching a new EC2 instance: i-...`` to ``Terminating EC2 instance: i-...``, i.e. billed time including
boot); when the group no longer reports an instance (EC2 Auto Scaling keeps six weeks), from the boot marker to
the node's last log line. Prices: spot instances at the time-weighted spot price of their type and AZ from EC2's
spot price history; on-demand instances and the on-demand comparison from :mod:`trainctl.prices`.
Redone work: from the log lines, for each restart the steps between the checkpoint it resumed from (the agent's
``resume step: N``, logged before it launches the trainer; ``none``: from scratch) and the furthest step the
trainer run before it logged (the run since the restart before, not the whole job), timed by when that run
logged them, times the nodes that ran them. Steps are read from the trainer's ``step N epoch M loss ...`` lines
(and the checkpoint helper's ``interrupted: checkpoint N saved``); a trainer that logs none leaves redone work
unknown, never 0. The output warns when on-demand prices are the table's us-east-1 ones for a job in another
region, and names the P-family types priced from before the June 2025 cut.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from itertools import islice
from typing import Any, Optional

from bootstrap_scripts.spot_training.protocol import BOOT_MARKER
from trainctl.cluster import ClientFactory, ClusterRef, described, group
from trainctl.current_job import current_job_id
from trainctl.job_logs import log_events
from trainctl.job_state import ENDED, node_markers, object_time, spot_interruptions
from trainctl.market_split import on_demand_nodes
from trainctl.prices import BEFORE_CUT_NOTE, TABLE_REGION, PriceError, PriceTable, average_price, spot_history

_ACTIVITY = re.compile(r"^(Launching a new EC2 instance|Terminating EC2 instance): (i-[0-9a-zA-Z]+)")
_STEP = re.compile(r"\bstep (\d+) epoch \d+ loss|interrupted: checkpoint (\d+) saved")
# The agent's line before it launches a (re)started trainer: no step of that trainer can be logged before it.
_RESUMED = re.compile(r"resume step: (\d+|none|unknown)")
ACTIVITY_PAGES = 50  # bounded: 50 pages of 100 activities
NODE_FACTS = ("instance_type", "lifecycle", "availability_zone")  # what a node's price needs (boot marker or EC2)
SPOT_HISTORY_S = 90 * 86400  # DescribeSpotPriceHistory: the last 90 days


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
    # an on-demand node's spot price (time-weighted, its type and AZ); None for a spot node or without spot history
    spot_usd_per_hour: Optional[float] = None

    @property
    def hours(self) -> float:
        return max(self.end - self.start, 0.0) / 3600.0

    @property
    def cost_usd(self) -> float:
        return self.hours * self.usd_per_hour


@dataclass
class Redone:
    """Work done twice. Every field None when unknown: the trainer logged no ``step N epoch M loss`` line."""

    steps: Optional[int]
    node_hours: Optional[float]
    gpu_hours: Optional[float]
    usd: Optional[float]


REDONE_UNKNOWN = (
    "redone: unknown (the trainer logs no 'step N ...' lines, or resumed from a flat checkpoint: its step is the "
    "script's)"
)


def redone_text(redone: Mapping[str, Any]) -> str:
    """The redone work of :func:`job_cost`'s ``redone`` as one line: figures, or that they are unknown."""
    if redone["steps"] is None:
        return REDONE_UNKNOWN
    gpu = "-" if redone["gpu_hours"] is None else f"{redone['gpu_hours']:.3f}"
    return (
        f"redone after restarts: {redone['steps']} step(s), {redone['node_hours']:.3f} node-hours ({gpu} GPU-hours), "
        f"{redone['usd']:.4f} USD"
    )


def instance_activities(client: ClientFactory, group: str) -> dict[str, dict[str, float]]:
    """Per instance: launch and termination times (s) from the group's scaling activities. A termination still in
    progress (its drain hook holds the instance, billed) has no end yet."""
    found: dict[str, dict[str, float]] = {}
    pages = client("autoscaling").get_paginator("describe_scaling_activities").paginate(AutoScalingGroupName=group)
    for page in islice(pages, ACTIVITY_PAGES):
        for activity in page["Activities"]:
            m = _ACTIVITY.match(activity.get("Description", ""))
            if m and m.group(1).startswith("Launching"):
                found.setdefault(m.group(2), {})["launch"] = activity["StartTime"].timestamp()
            elif m:
                times = found.setdefault(m.group(2), {})
                if activity.get("EndTime") is not None:
                    times["end"] = activity["EndTime"].timestamp()
    return found


def _boot_markers(client: ClientFactory, ref: ClusterRef, job_id: str) -> dict[str, dict[str, Any]]:
    s3 = client("s3")
    return {
        instance: json.loads(s3.get_object(Bucket=ref.bucket, Key=names[BOOT_MARKER])["Body"].read())
        for instance, names in node_markers(client, ref, job_id).items()
        if BOOT_MARKER in names
    }


@dataclass
class _Evidence:
    """What tells which instances ran the job and for how long."""

    job_id: str
    events: list[tuple[float, str, str]]  # the job's log lines: (time, stream, message)
    now: float
    markers: dict[str, dict[str, Any]]  # boot markers by instance
    last_line: dict[str, float]  # by instance: when it logged last
    activity: dict[str, dict[str, float]]  # by instance: launch and end from the group's activities
    in_group: set[str]  # the group's instances, if the job is the cluster's current one
    silent: set[str]  # launched for the job, with no boot marker and no log line


def _evidence(
    client: ClientFactory, ref: ClusterRef, job_id: str, events: list[tuple[float, str, str]], now: float
) -> _Evidence:
    markers = _boot_markers(client, ref, job_id)
    last_line: dict[str, float] = {}
    for ts, stream, _ in events:
        last_line[stream.rsplit("/", 1)[-1]] = ts
    activity = instance_activities(client, ref.group)
    current = current_job_id(client, ref) == job_id
    in_group = {m["InstanceId"] for m in group(client, ref)["Instances"]} if current else set()
    # Instances the group launched for the job that never told (no boot marker, no log line: their user data or
    # agent failed early) are billed all the same: launched between the submit and the job's end, or in the group.
    submitted, ended = _window(client, ref, job_id, current, now)
    launched = {i for i, t in activity.items() if submitted <= t.get("launch", -1.0) <= ended}
    silent = (launched | in_group) - set(markers) - set(last_line)
    return _Evidence(job_id, events, now, markers, last_line, activity, in_group, silent)


def node_costs(
    client: ClientFactory,
    ref: ClusterRef,
    job_id: str,
    prices: PriceTable,
    events: list[tuple[float, str, str]],
    now: Optional[float] = None,
    warnings: Optional[list[str]] = None,
) -> list[NodeCost]:
    """What each node of the job cost; ``warnings`` gets a line for each billed instance that cannot be priced."""
    warnings = [] if warnings is None else warnings
    seen = _evidence(client, ref, job_id, events, time.time() if now is None else now)
    instances = sorted(set(seen.markers) | set(seen.last_line) | seen.silent)
    # a marker the agent wrote without some fact (IMDS did not answer) is completed from EC2, as is a missing one
    described = _describe(client, [i for i in instances if _missing(seen.markers.get(i, {}))])
    nodes = []
    for instance in instances:
        marker = seen.markers.get(instance)
        facts = {**described.get(instance, {}), **{k: v for k, v in (marker or {}).items() if v}}
        if (missing := _missing(facts)) and instance in seen.silent:
            warnings.append(
                f"instance {instance}, launched for job {job_id}, wrote no boot marker and no log line, and EC2 no "
                "longer describes it: its cost is not counted"
            )
            continue
        if missing:
            why = f"its boot marker lacks {', '.join(missing)};" if marker is not None else "no boot marker and"
            raise PriceError(f"instance {instance} of job {job_id}: {why} EC2 no longer describes it")
        start, end, timed_by = _timed(seen, instance, facts, warnings)
        nodes.append(_priced(client, prices, instance, facts, (start, end, timed_by), seen.now))
    return nodes


def _timed(seen: _Evidence, instance: str, facts: Mapping[str, Any], warnings: list[str]) -> tuple[float, float, str]:
    """(start, end, what timed them) of an instance: the group's activity; else its launch (boot marker or EC2, else
    its first log line) to now while in the group, else to its last log line."""
    times = seen.activity.get(instance, {})
    if "launch" in times:
        end = times.get("end") or (seen.now if instance in seen.in_group else seen.last_line.get(instance, seen.now))
        return times["launch"], end, "group activity"
    logged = (ts for ts, s, _ in seen.events if s.endswith("/" + instance))
    start = float(facts.get("time") or min(logged, default=seen.now))
    end = seen.now if instance in seen.in_group else seen.last_line.get(instance, start)
    if instance not in seen.in_group and instance not in seen.last_line:
        warnings.append(
            f"instance {instance} of job {seen.job_id}: no Auto Scaling activity (kept six weeks) and no log line "
            "(kept for the log group's retention) is left to time it: its hours are not counted"
        )
    return start, end, "EC2 launch time" if instance in seen.silent else "node logs"


def _priced(
    client: ClientFactory,
    prices: PriceTable,
    instance: str,
    facts: Mapping[str, Any],
    timed: tuple[float, float, str],
    now: float,
) -> NodeCost:
    """The node's cost: a spot one at the time-weighted spot price of its type and AZ, else the on-demand price."""
    start, end, timed_by = timed
    market = "spot" if facts.get("lifecycle") == "spot" else "on-demand"
    itype, az = str(facts["instance_type"]), str(facts["availability_zone"])
    on_demand = prices.on_demand_price(itype)
    spot = average_price(spot_history(client, itype, az, _dt(start), _dt(max(end, start))), start, end)
    if market == "on-demand":
        return NodeCost(instance, itype, market, az, start, end, timed_by, on_demand, on_demand, spot)
    if spot is None:
        kept = " (EC2 keeps 90 days of it)" if now - start > SPOT_HISTORY_S else ""
        raise PriceError(f"no spot price history for {itype} in {az} between {_dt(start)} and {_dt(end)}{kept}")
    return NodeCost(instance, itype, market, az, start, end, timed_by, spot, on_demand)


def _window(client: ClientFactory, ref: ClusterRef, job_id: str, current: bool, now: float) -> tuple[float, float]:
    """When the group's instances were the job's: from its submit (its code archive) to its end marker; without one,
    to now for the cluster's current job, else to the next job's submit (a job after it took the group)."""
    s3 = client("s3")
    submits = sorted(
        (obj["LastModified"].timestamp(), obj["Key"][len(ref.code_prefix) :].split(".", 1)[0])
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=ref.bucket, Prefix=ref.code_prefix)
        for obj in page.get("Contents", [])
    )
    submitted = next((t for t, j in submits if j == job_id), now)
    marked = [t for m in ENDED if (t := object_time(client, ref, ref.job_prefix(job_id) + m)) is not None]
    if marked:
        return submitted, min(marked)
    if current:
        return submitted, now
    return submitted, next((t for t, j in submits if t > submitted and j != job_id), now)


def _missing(facts: Mapping[str, Any]) -> list[str]:
    """The facts a node's price needs that ``facts`` (a boot marker, or what EC2 describes) lacks."""
    return [k for k in NODE_FACTS if not facts.get(k)]


def _describe(client: ClientFactory, instances: list[str]) -> dict[str, dict[str, Any]]:
    # EC2 forgets terminated instances after about an hour: those are left out
    return {
        i["InstanceId"]: {
            "instance_type": i.get("InstanceType"),
            "lifecycle": i.get("InstanceLifecycle", "on-demand"),
            "availability_zone": i.get("Placement", {}).get("AvailabilityZone"),
            "time": i["LaunchTime"].timestamp(),
        }
        for i in described(client, instances).values()
    }


def _dt(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, tz=UTC)


def _redone_span(resumed: int, run: dict[int, float]) -> tuple[int, float, float]:
    """A restart from step ``resumed`` after ``run`` (step -> when it was first logged): (steps redone, from, to),
    from when the run logged the step resumed from (or, if it did not, its first line) to its furthest step."""
    furthest = max(run)
    return furthest - resumed, run[max((s for s in run if s <= resumed), default=min(run))], run[furthest]


def redone_work(events: Iterable[tuple[float, str, str]], nodes: list[NodeCost], prices: PriceTable) -> Redone:
    """Work done twice: for each restart, the steps from the checkpoint it resumed from to the furthest step of the
    trainer run before it (the steps logged since the restart before), timed by when that run logged them.
    A ``resume step`` line is a restart once the next step line goes back: a node that joins a running training
    (``min_nodes`` < ``max_nodes``) logs one too, and the training goes on past it.
    Unknown (None) when the trainer logged no ``step N epoch M loss`` line, or resumed from a flat checkpoint
    (``resume step: unknown``: the step its files hold is the script's to know)."""
    spans = restart_spans(events)
    if spans is None:  # a restart that cannot be measured: "0 redone" would be a guess, not a fact
        return Redone(None, None, None, None)
    node_s, gpu_s, usd, gpus_known = 0.0, 0.0, 0.0, True
    for _, began, ended in spans:
        for node in nodes:  # the nodes that were running while the run before the restart ran those steps
            overlap = min(node.end, ended) - max(node.start, began)
            if overlap > 0:
                node_s += overlap
                usd += overlap / 3600.0 * node.usd_per_hour
                gpus = prices.gpus.get(node.type)
                gpus_known = gpus_known and gpus is not None
                gpu_s += overlap * (gpus or 0)
    steps = sum(redone for redone, _, _ in spans)
    return Redone(steps, node_s / 3600.0, gpu_s / 3600.0 if gpus_known else None, usd)


def restart_spans(events: Iterable[tuple[float, str, str]]) -> Optional[list[tuple[int, float, float]]]:
    """Per restart: (steps redone, from, to), see :func:`redone_work`; None when they cannot be measured (no step
    line of the trainer, or a restart from a flat checkpoint)."""
    run: dict[int, float] = {}  # the current trainer run: step -> when this run first logged it
    pending: Optional[tuple[int, dict[int, float]]] = None  # a restart (resumed from, the run before) not yet seen
    spans: list[tuple[int, float, float]] = []  # per restart: (steps redone, from, to)
    step_lines, unknown = False, False
    for ts, _, message in events:
        if m := _STEP.search(message):
            step = int(m.group(1) or m.group(2))
            step_lines = step_lines or m.group(1) is not None  # not just the checkpoint helper's line
            if pending is not None:  # the first step line since a resume line (none since: ``run`` is empty)
                run, pending = _run_after_resume(pending, step, spans), None
            run.setdefault(step, ts)
            continue
        if not (m := _RESUMED.search(message)) or not run or pending is not None:
            continue  # every node's agent logs the same restart: the first line ends the run, the others find none
        if m.group(1) == "unknown":
            unknown, run = True, {}
            continue
        resumed = 0 if m.group(1) == "none" else int(m.group(1))
        if resumed < max(run):
            pending = (resumed, run)
        run = {}  # the next run is measured against its own furthest step
    if pending is not None:  # no step after it (the job ended there): a restart all the same
        spans.append(_redone_span(*pending))
    return None if not step_lines or unknown else spans


def _run_after_resume(
    pending: tuple[int, dict[int, float]], step: int, spans: list[tuple[int, float, float]]
) -> dict[int, float]:
    """The run the first step line after a resume line belongs to. It went back: a restart, a new run, and the steps
    since the one resumed from redone (a span appended to ``spans``); it went on: a node joined the running training,
    the run before goes on."""
    resumed, before = pending
    if step <= max(before):
        spans.append(_redone_span(resumed, before))
        return {}
    return before


def job_cost(
    client: ClientFactory, ref: ClusterRef, job_id: str, prices: PriceTable, now: Optional[float] = None
) -> dict[str, Any]:
    events = log_events(client, ref, job_id)
    unpriced: list[str] = []
    nodes = node_costs(client, ref, job_id, prices, events, now, unpriced)
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
    warnings = price_warnings(nodes, prices, _region(client)) + unpriced
    total = sum(n.cost_usd for n in nodes)
    on_demand = sum(n.hours * n.on_demand_usd_per_hour for n in nodes)
    return {
        "job_id": job_id,
        "by_type": sorted(by_type.values(), key=lambda r: (r["type"], r["market"])),
        "nodes": [dict(asdict(n), hours=n.hours, cost_usd=n.cost_usd) for n in nodes],
        "total_usd": total,
        "on_demand_usd": on_demand,
        "savings_pct": 100.0 * (1 - total / on_demand) if on_demand else 0.0,
        "on_demand_nodes": on_demand_nodes(nodes),
        "interruptions": spot_interruptions(client, ref, job_id),
        "redone": asdict(redone),
        "on_demand_prices": prices.source,
        "spot_prices": "EC2 spot price history (DescribeSpotPriceHistory), per type and AZ",
        "warnings": warnings,
    }


def price_warnings(nodes: list[NodeCost], prices: PriceTable, region: Optional[str]) -> list[str]:
    """One line per doubt about the on-demand prices used: the table's us-east-1 prices for a job in another region
    (on-demand nodes and the on-demand comparison), and P-family list prices from before the June 2025 cut."""
    types = sorted({n.type for n in nodes})
    out = []
    from_table = [t for t in types if prices.from_table(t)]
    if region is not None and region != TABLE_REGION and from_table:
        out.append(
            f"on-demand prices of {', '.join(from_table)} are {TABLE_REGION} list prices, but the job ran in "
            f"{region}: pass --prices FILE with {region}'s prices"
        )
    out += [f"{t}: {BEFORE_CUT_NOTE}" for t in types if prices.before_cut(t)]
    return out


def _region(client: ClientFactory) -> Optional[str]:
    """The region the EC2 client asks (boto3: ``client.meta.region_name``)."""
    meta = getattr(client("ec2"), "meta", None)
    region = getattr(meta, "region_name", None)
    return str(region) if region else None
