"""A job's logs in CloudWatch Logs, one stream per node (``<job>/<instance>``): read, printed (``trainctl logs``),
and the trainer's plan line."""

from __future__ import annotations

import re
import time
from itertools import islice
from typing import Any, Optional

from trainctl.cluster import ClientFactory, ClusterRef, JobError
from trainctl.job_state import NOT_RUNNING, job_state

_PLAN = re.compile(r"\bplan: (\d+) steps\b")
STREAM_PAGES = 200  # bounded: 200 pages of up to 50 log streams (one per node of a job)
FOLLOW_LIMIT_S = 24 * 3600.0  # logs --follow: at most a day
FILTER_PAGES = 1000  # bounded: 1000 pages of FilterLogEvents (a page may be empty while CloudWatch searches)


def planned_steps(client: ClientFactory, ref: ClusterRef, job_id: str) -> Optional[int]:
    """The trainer's newest ``plan: N steps`` line (how many steps the job trains in all), if it prints one."""
    pages = (
        client("logs")
        .get_paginator("filter_log_events")
        .paginate(logGroupName=str(ref.spec["log_group"]), logStreamNamePrefix=f"{job_id}/", filterPattern='"plan:"')
    )
    # only the job's own streams: the emulator's FilterLogEvents (moto) ignores logStreamNamePrefix
    found = [
        e
        for page in islice(pages, FILTER_PAGES)
        for e in page["events"]
        if str(e.get("logStreamName", "")).startswith(f"{job_id}/")
    ]
    plans = [m for e in sorted(found, key=lambda e: e["timestamp"]) if (m := _PLAN.search(e["message"]))]
    return int(plans[-1].group(1)) if plans else None


def stream_events(
    client: ClientFactory, ref: ClusterRef, job_id: str, tokens: Optional[dict[str, str]] = None
) -> dict[str, list[tuple[float, str]]]:
    """Every shipped log line of the job per stream (``<job>/<instance>``): (timestamp s, message), in the
    stream's own order (a node's agent ships its lines in order). ``tokens`` (``logs --follow``): where each stream
    was read to, updated here; only the lines after it are returned."""
    logs = client("logs")
    group = str(ref.spec["log_group"])
    out: dict[str, list[tuple[float, str]]] = {}
    pages = logs.get_paginator("describe_log_streams").paginate(logGroupName=group, logStreamNamePrefix=f"{job_id}/")
    for streams in islice(pages, STREAM_PAGES):
        for stream in streams["logStreams"]:
            name = stream["logStreamName"]
            lines = out.setdefault(name, [])
            token: Optional[str] = None if tokens is None else tokens.get(name)
            for _ in range(1000):  # bounded: 1000 pages of up to 10,000 events
                kwargs: dict[str, Any] = {"logGroupName": group, "logStreamName": name, "startFromHead": True}
                if token:
                    kwargs["nextToken"] = token
                page = logs.get_log_events(**kwargs)
                lines += [(e["timestamp"] / 1000.0, e["message"]) for e in page["events"]]
                # The end is the token coming back: CloudWatch pages by time, so a quiet stretch of the stream (a
                # data download, a replacement booting later) is an empty page with a new token, lines after it.
                if page.get("nextForwardToken") in (token, None):
                    break
                token = page.get("nextForwardToken")
            if tokens is not None and token:
                tokens[name] = token
    return out


def log_events(client: ClientFactory, ref: ClusterRef, job_id: str) -> list[tuple[float, str, str]]:
    """Every shipped log line of the job: (timestamp s, stream, message), in time order."""
    return sorted(
        (ts, name, message) for name, lines in stream_events(client, ref, job_id).items() for ts, message in lines
    )


def print_logs(client: ClientFactory, ref: ClusterRef, job_id: str, node: Optional[str], follow: bool) -> None:
    """Print the job's shipped log lines (``node``: only its stream); ``follow``: until the job ends (at most
    :data:`FOLLOW_LIMIT_S`), polling for the lines shipped since."""
    read_to: dict[str, str] = {}  # per stream, its token after the lines printed: each poll reads only new ones
    deadline = time.monotonic() + FOLLOW_LIMIT_S
    last = not follow
    while True:
        streams = stream_events(client, ref, job_id, read_to)
        if node is not None and not follow and not any(name.endswith("/" + node) for name in streams):
            shipped = ", ".join(sorted(name.split("/", 1)[1] for name in streams)) or "none yet"
            raise JobError(f"no logs of node {node} in job {job_id}; nodes with logs: {shipped}")
        # only the lines not printed yet: one another node ships late is printed when it comes, though lines of a
        # later time were printed before it (sorted by time only: a stream's lines of one time stay in its order)
        new = sorted(
            (
                (ts, name, message)
                for name, lines in streams.items()
                if node is None or name.endswith("/" + node)
                for ts, message in lines
            ),
            key=lambda e: e[0],
        )
        for ts, stream, message in new:
            print(f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(ts))} {stream.split('/', 1)[1]} {message}")
        if last or time.monotonic() > deadline:
            return
        # ended: one more read for the lines shipped with the end (the agent's last flush comes after its marker)
        last = job_state(client, ref, job_id) in NOT_RUNNING
        time.sleep(2.0)
