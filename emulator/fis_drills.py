"""FIS experiments in the emulated cloud: the drill runner, in the process that runs the nodes, runs every experiment
started against the emulated FIS on the nodes, as FIS does on EC2.

    with NodeLauncher(cloud, work_dir) as launcher, DrillRunner(cloud, launcher, time_scale=0.05):
        fis.start_experiment(experimentTemplateId=...)   # e.g. by `trainctl drill`

It polls ``ListExperiments`` (every ``poll_s``); each new ``pending`` experiment runs in a thread of its own:

1. ``initiating``: a stop condition's CloudWatch alarm in ``ALARM`` fails the experiment (as FIS refuses to start);
   the targets are resolved as FIS does: instances of the target's ``resourceTags`` whose lifecycle is spot (for
   ``aws:ec2:spot-instance``), then its ``filters`` (a path into the described instance, e.g. ``State.Name``), then
   its ``selectionMode``: ``ALL``, ``COUNT(n)`` or ``PERCENT(n)`` (n % of them, rounded down, at least one: the
   emulator's choice, FIS's docs do not say how it rounds), picked at random. Only instances booted as nodes of the
   launcher count. No target fails the experiment (``emptyTargetResolutionMode`` ``fail``, the default) or completes
   it (``skip``).
2. ``running``: the action ``aws:ec2:send-spot-instance-interruptions`` (the only one emulated: another fails the
   experiment) of duration D (``durationBeforeInterruption``): a rebalance recommendation at the start when D is over
   2 minutes, the spot interruption notice 2 minutes before D, and at D the instance is taken
   (:meth:`~emulator.nodes.NodeLauncher.interrupt`: at once if its node already exited). Every time is multiplied by
   ``time_scale`` (``python -m emulator up --drill-time-scale``): at 0.05 a 2-minute notice lasts 6 s.
3. ``completed`` once every target is gone; ``StopExperiment`` (state ``stopping``) ends it ``stopped``, with no
   further notice sent (one already delivered is not taken back, as on AWS).

The states and the resolved targets reach the emulated FIS API through the server's route (:mod:`emulator.fis_state`).
"""

from __future__ import annotations

import json
import math
import random
import re
import ssl
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Optional

from emulator.cloud import EmulatedCloud
from emulator.fis_state import ROUTE
from emulator.nodes import NodeLauncher

SPOT_INTERRUPTIONS = "aws:ec2:send-spot-instance-interruptions"
NOTICE_S = 120.0  # the interruption notice comes this long before the interruption
_DURATION = re.compile(r"^PT(?:(\d+)H)?(?:(\d+)M)?(?:(\d+)S)?$")
_SELECTION = re.compile(r"^(ALL|COUNT\((\d+)\)|PERCENT\((\d+)\))$")


class DrillFailed(Exception):
    """Why an experiment fails (its state's reason)."""


def duration_s(text: str) -> float:
    """An ISO 8601 duration of FIS's parameters (``PT2M``, ``PT90S``, ``PT1H``) in seconds."""
    match = _DURATION.match(text)
    if not match or not any(match.groups()):
        raise DrillFailed(f"durationBeforeInterruption {text!r} is no ISO 8601 duration such as PT2M")
    hours, minutes, seconds = (int(g or 0) for g in match.groups())
    return float(hours * 3600 + minutes * 60 + seconds)


def select(found: list[str], mode: str, pick: Callable[[list[str], int], list[str]] = random.sample) -> list[str]:
    """The targets ``mode`` selects among ``found`` (see the module doc)."""
    match = _SELECTION.match(mode or "ALL")
    if not match:
        raise DrillFailed(f"selectionMode {mode!r} is not ALL, COUNT(n) or PERCENT(n)")
    if match.group(2) is not None:
        count = int(match.group(2))
    elif match.group(3) is not None:
        count = max(1, math.floor(len(found) * int(match.group(3)) / 100)) if found else 0
    else:
        count = len(found)
    return sorted(pick(found, min(count, len(found))))


def _path(item: Any, path: str) -> Any:
    for part in path.split("."):
        item = item.get(part) if isinstance(item, dict) else None
    return item


@dataclass
class Target:
    name: str
    resource_type: str
    instances: list[str]


class DrillRunner:
    """Runs the emulated FIS's experiments on ``launcher``'s nodes; see the module doc."""

    def __init__(
        self,
        cloud: EmulatedCloud,
        launcher: NodeLauncher,
        *,
        time_scale: float = 1.0,
        poll_s: float = 1.0,
        on_event: Optional[Callable[[str], None]] = None,
    ) -> None:
        self.cloud, self.launcher, self.time_scale, self.poll_s = cloud, launcher, time_scale, poll_s
        self.on_event = on_event
        self.errors: list[str] = []
        self._seen: set[str] = set()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def __enter__(self) -> DrillRunner:
        thread = threading.Thread(target=self._loop, name="fis-drills", daemon=True)
        self._threads.append(thread)
        thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=10)

    def _loop(self) -> None:
        fis = self.cloud.client("fis")
        while not self._stop.wait(self.poll_s):
            try:
                for page in fis.get_paginator("list_experiments").paginate():
                    for summary in page["experiments"]:
                        if summary["id"] not in self._seen and summary["state"]["status"] == "pending":
                            self._seen.add(summary["id"])
                            thread = threading.Thread(target=self.run, args=(summary["id"],), daemon=True)
                            self._threads.append(thread)
                            thread.start()
            except Exception as exc:  # reported; the next round tries again
                self._report(f"FIS: listing experiments failed: {type(exc).__name__}: {exc}")

    def run(self, experiment_id: str) -> str:
        """Run one experiment to its end; its final state."""
        try:
            self._set(experiment_id, "initiating", "Experiment is initiating")
            experiment = self.cloud.client("fis").get_experiment(id=experiment_id)["experiment"]
            self._check_stop_conditions(experiment)
            targets = self._resolve(experiment)
            self._set(experiment_id, "running", "Experiment is running", targets)
            if not any(t.instances for t in targets):  # emptyTargetResolutionMode skip
                return self._set(experiment_id, "completed", "no target resolved (emptyTargetResolutionMode skip)")
            self._report(
                f"FIS experiment {experiment_id}: targets {', '.join(i for t in targets for i in t.instances)}"
            )
            stopped = self._act(experiment_id, experiment["actions"], {t.name: t for t in targets})
            if stopped:
                return self._set(experiment_id, "stopped", "Experiment stopped")
            return self._set(experiment_id, "completed", "Experiment completed")
        except DrillFailed as exc:
            return self._set(experiment_id, "failed", str(exc))
        except Exception as exc:  # a failed AWS call: the experiment fails, with the reason
            self.errors.append(f"{experiment_id}: {type(exc).__name__}: {exc}")
            return self._set(experiment_id, "failed", f"{type(exc).__name__}: {exc}")

    def _check_stop_conditions(self, experiment: dict[str, Any]) -> None:
        alarms = [c["value"] for c in experiment.get("stopConditions", []) if c["source"] == "aws:cloudwatch:alarm"]
        if not alarms:
            return
        names = [arn.rsplit(":alarm:", 1)[-1] for arn in alarms]
        found = self.cloud.client("cloudwatch").describe_alarms(AlarmNames=names)["MetricAlarms"]
        firing = [a["AlarmName"] for a in found if a["StateValue"] == "ALARM"]
        if firing:
            raise DrillFailed(f"stop condition alarm {firing[0]} is in ALARM")

    def _resolve(self, experiment: dict[str, Any]) -> list[Target]:
        targets = []
        for name, target in experiment.get("targets", {}).items():
            if target["resourceType"] != "aws:ec2:spot-instance" and target["resourceType"] != "aws:ec2:instance":
                raise DrillFailed(f"target {name}: resource type {target['resourceType']} is not emulated")
            found = [i for i in self._tagged(target) if all(self._passes(i, f) for f in target.get("filters", []))]
            nodes = {n.instance_id for n in self.launcher.running()}
            ids = [i["InstanceId"] for i in found if i["InstanceId"] in nodes]
            targets.append(Target(name, target["resourceType"], select(ids, target.get("selectionMode", "ALL"))))
        mode = experiment.get("experimentOptions", {}).get("emptyTargetResolutionMode", "fail")
        if mode == "fail" and not all(t.instances for t in targets):
            empty = next(t.name for t in targets if not t.instances)
            raise DrillFailed(f"target {empty} resolved to no running instance")
        return targets

    def _tagged(self, target: dict[str, Any]) -> list[dict[str, Any]]:
        filters = [{"Name": f"tag:{k}", "Values": [v]} for k, v in target.get("resourceTags", {}).items()]
        pages = self.cloud.client("ec2").get_paginator("describe_instances").paginate(Filters=filters)
        found = [i for page in pages for r in page["Reservations"] for i in r["Instances"]]
        if target["resourceType"] == "aws:ec2:spot-instance":  # moto has no instance-lifecycle filter
            found = [i for i in found if i.get("InstanceLifecycle") == "spot"]
        return found

    @staticmethod
    def _passes(instance: dict[str, Any], condition: dict[str, Any]) -> bool:
        return str(_path(instance, condition["path"])) in condition["values"]

    def _act(self, experiment_id: str, actions: dict[str, Any], targets: dict[str, Target]) -> bool:
        """Deliver every action's faults on schedule; True if the experiment was stopped on the way."""
        plan: list[tuple[float, str, str]] = []  # (seconds from now, what, instance)
        for name, action in actions.items():
            if action["actionId"] != SPOT_INTERRUPTIONS:
                raise DrillFailed(f"action {name}: {action['actionId']} is not emulated")
            duration = duration_s(action.get("parameters", {}).get("durationBeforeInterruption", "PT2M"))
            for instance in (i for role in action.get("targets", {}).values() for i in targets[role].instances):
                if duration > NOTICE_S:
                    plan.append((0.0, "rebalance", instance))
                plan.append((max(duration - NOTICE_S, 0.0), "notice", instance))
        started = time.monotonic()
        for at, what, instance in sorted(plan):
            if self._wait(experiment_id, started + at * self.time_scale):
                return True
            self._deliver(what, instance)
        victims = {instance for _, _, instance in plan}
        while any(n.instance_id in victims and n.terminated_at is None for n in self.launcher.all_nodes()):
            if self._wait(experiment_id, time.monotonic() + 0.5):
                return True
        return False

    def _deliver(self, what: str, instance: str) -> None:
        if what == "rebalance":
            self.launcher.recommend_rebalance(instance)
        else:
            in_s = max(1, round(NOTICE_S * self.time_scale))
            self.launcher.interrupt(instance, in_s=in_s)

    def _wait(self, experiment_id: str, until: float) -> bool:
        """Sleep until ``until`` (monotonic); True as soon as the experiment is being stopped."""
        fis = self.cloud.client("fis")
        while True:
            if fis.get_experiment(id=experiment_id)["experiment"]["state"]["status"] == "stopping":
                return True
            left = until - time.monotonic()
            if left <= 0:
                return False
            if self._stop.wait(min(left, 0.5)):
                return True

    def _set(self, experiment_id: str, status: str, reason: str, targets: Optional[list[Target]] = None) -> str:
        update: dict[str, Any] = {"status": status, "reason": reason}
        if targets is not None:
            update["targets"] = [
                {"resourceType": t.resource_type, "targetName": t.name, "arn": self._arn(i)}
                for t in targets
                for i in t.instances
            ]
        context = ssl.create_default_context(cafile=str(self.cloud.ca_bundle))
        request = urllib.request.Request(  # noqa: S310 (the emulator's endpoint)
            f"{self.cloud.endpoint_url}{ROUTE}{experiment_id}", data=json.dumps(update).encode(), method="POST"
        )
        with urllib.request.urlopen(request, context=context, timeout=30):  # noqa: S310 (the emulator's endpoint)
            pass
        self._report(f"FIS experiment {experiment_id}: {status} ({reason})")
        return status

    def _arn(self, instance: str) -> str:
        return f"arn:aws:ec2:{self.cloud.region}:{self.cloud.account_id}:instance/{instance}"

    def _report(self, line: str) -> None:
        if self.on_event is not None:
            self.on_event(line)
