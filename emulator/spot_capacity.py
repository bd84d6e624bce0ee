"""Spot capacity in the emulated cloud, in the server process: which zones have none, for which instance types.

EC2 has spot capacity or it does not; moto always has it. :func:`set_capacity` (a server option, ``--no-spot-capacity
ZONE[:TYPE,TYPE]``, and the route ``POST /_emulator/spot-capacity`` with ``{"zone": ..., "available": bool,
"instance_types": [...] or null}``, which :meth:`emulator.cloud.EmulatedCloud.set_spot_capacity` posts) says that a
zone has none for some types (or for all). A spot launch of a group (:mod:`emulator.billing` decides which of its new
instances are spot) then takes the first of the policy's types that the zone has capacity for; with none, no instance
is launched (moto's is withdrawn before anyone saw it) and the group's scaling activities get a failed launch, as EC2
Auto Scaling reports it: StatusCode ``Failed``, StatusMessage ``Could not launch Spot Instances.
InsufficientInstanceCapacity - ...``. On-demand launches always succeed. The group does not try again by itself: the
next launch is at the next change of its desired capacity or policy (EC2 Auto Scaling retries every few minutes).
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any, Optional

from emulator.request_counts import WsgiApp

ROUTE = "/_emulator/spot-capacity"
NO_CAPACITY_MESSAGE = (
    "Could not launch Spot Instances. InsufficientInstanceCapacity - There is no Spot capacity available that matches "
    "your request. Launching EC2 instance failed."
)
ALL_TYPES = "*"
_missing: dict[str, set[str]] = {}  # zone -> types without spot capacity (ALL_TYPES: every type)
_failed: dict[str, list[dict[str, Any]]] = {}  # group -> its failed launch activities, oldest first
_lock = threading.Lock()


def parse_option(text: str) -> tuple[str, Optional[list[str]]]:
    """``ZONE`` or ``ZONE:TYPE,TYPE`` (the server option) as (zone, types or None for all)."""
    zone, _, types = text.partition(":")
    return zone, [t for t in types.split(",") if t] or None


def set_capacity(zone: str, available: bool, instance_types: Optional[list[str]] = None) -> dict[str, Any]:
    """Switch spot capacity for ``instance_types`` (None: every type) in ``zone`` off or back on."""
    with _lock:
        types = set(instance_types or [ALL_TYPES])
        if available:
            left = set() if ALL_TYPES in types else _missing.get(zone, set()) - types
            _missing.pop(zone, None)
            if left:
                _missing[zone] = left
        else:
            _missing[zone] = _missing.get(zone, set()) | types
        return {"zone": zone, "without_spot_capacity": sorted(_missing.get(zone, set()))}


def spot_type(zone: str, candidates: list[str]) -> Optional[str]:
    """The first of ``candidates`` with spot capacity in ``zone``, or None."""
    with _lock:
        missing = _missing.get(zone, set())
        if ALL_TYPES in missing:
            return None
        return next((t for t in candidates if t not in missing), None)


def record_failure(group: str, desired_from: int, desired_to: int, zone: str) -> None:
    """A failed spot launch in ``group``'s scaling activities, worded as EC2 Auto Scaling words it."""
    at = datetime.now(UTC)
    with _lock:
        activities = _failed.setdefault(group, [])
        activities.append(
            {
                "ActivityId": hashlib.sha256(f"{group}/failed/{len(activities)}".encode()).hexdigest()[:36],
                "AutoScalingGroupName": group,
                "Description": f"Launching a new EC2 instance.  Status Reason: {NO_CAPACITY_MESSAGE}",
                "Cause": (
                    f"At {at:%Y-%m-%dT%H:%M:%SZ} an instance was started in response to a difference between desired "
                    f"and actual capacity, increasing the capacity from {desired_from} to {desired_to}."
                ),
                "StartTime": at,
                "EndTime": at,
                "StatusCode": "Failed",
                "StatusMessage": NO_CAPACITY_MESSAGE,
                "Progress": 100,
                "Details": json.dumps({"Availability Zone": zone}),
            }
        )


def failed_activities(group: str) -> list[dict[str, Any]]:
    with _lock:
        return list(_failed.get(group, []))


def serving(app: WsgiApp) -> WsgiApp:
    """``app`` with the route that switches spot capacity (see the module doc)."""

    def wrapped(environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        if environ.get("PATH_INFO") != ROUTE or environ.get("REQUEST_METHOD") != "POST":
            return app(environ, start_response)
        length = int(environ.get("CONTENT_LENGTH") or 0)
        try:
            body = json.loads(environ["wsgi.input"].read(length))
            types = body.get("instance_types")
            answer = set_capacity(str(body["zone"]), bool(body["available"]), None if types is None else list(types))
            code = "200 OK"
        except (ValueError, KeyError, TypeError) as exc:
            answer, code = {"error": f"{type(exc).__name__}: {exc}"}, "400 Bad Request"
        data = json.dumps(answer).encode()
        start_response(code, [("Content-Type", "application/json"), ("Content-Length", str(len(data)))])
        return [data]

    return wrapped
