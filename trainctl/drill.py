"""``trainctl drill --cluster C``: start the cluster's interruption drill, follow the running job through it, report.

The drill is the cluster's AWS FIS experiment template (``interruption_drill:`` in the team file): the one whose
tags name the team (``spot-training:team``) and whose target selects the cluster's instances by the tag
``spot-training:cluster``. The command starts it (``StartExperiment``) while the cluster's current job runs, polls the
experiment (``GetExperiment``) and the job until the experiment has ended and the job either ended or went on with a
replacement for every node the drill took, then reports from the job's facts, not from the processes:

- the nodes FIS targeted (``ListExperimentResolvedTargets``) and those whose agent logged the spot interruption
  notice; per node, notice to the newest checkpoint being durable in S3 before it leaves (its own emergency
  checkpoint, or a peer's it finds durable: both lines from its log stream);
- steps redone by the restarts after the drill began (as ``trainctl cost`` counts them);
- per replacement (an instance the group launched after the first notice), boot (the group's launch activity) to
  the first training step the job logged after the replacement's first log line;
- whether the job went on: it ended DONE, or every node taken has a replacement that trained.

The same calls run against AWS and the emulated cloud (where :mod:`emulator.fis_drills` runs the experiment).
"""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Callable
from typing import Any, Optional

from team_config.naming import CLUSTER_TAG, TEAM_TAG
from trainctl.cluster import ClientFactory, ClusterRef, JobError
from trainctl.cost import instance_activities, restart_spans
from trainctl.job_logs import log_events
from trainctl.job_state import job_state
from trainctl.status import current_job

ENDED_EXPERIMENT = ("completed", "stopped", "failed")
_NOTICE = re.compile(r"spot interruption notice")
# The agent's line once the newest checkpoint is durable before it leaves: its own emergency checkpoint, or the one
# it finds durable already (a peer's, saved for the same notice).
_DURABLE = re.compile(r"emergency checkpoint (\d+) is durable in S3|nothing newer than checkpoint (\d+) to save")
_STEP = re.compile(r"\bstep (\d+) epoch \d+ loss")
DEFAULT_TIMEOUT_S = 3600.0


def find_template(client: ClientFactory, ref: ClusterRef) -> str:
    """The id of the cluster's experiment template; a one-line JobError if it has none."""
    fis = client("fis")
    for page in fis.get_paginator("list_experiment_templates").paginate():
        for summary in page["experimentTemplates"]:
            if summary.get("tags", {}).get(TEAM_TAG) != ref.team:
                continue
            template = fis.get_experiment_template(id=summary["id"])["experimentTemplate"]
            if any(t.get("resourceTags", {}).get(CLUSTER_TAG) == ref.cluster for t in template["targets"].values()):
                return str(summary["id"])
    raise JobError(
        f"cluster {ref.team}/{ref.cluster} has no interruption drill (no FIS experiment template tagged "
        f"{TEAM_TAG}={ref.team} targeting {CLUSTER_TAG}={ref.cluster}): add 'interruption_drill: {{}}' to the "
        f"cluster in teams/{ref.team}.yaml and deploy"
    )


def drill(
    client: ClientFactory,
    ref: ClusterRef,
    *,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    poll_s: float = 5.0,
    progress: Callable[[str], None] = lambda _: None,
) -> dict[str, Any]:
    """Start the drill on the cluster's running job, follow it, return the report (see the module doc)."""
    job_id = current_job(client, ref)
    if job_state(client, ref, job_id) != "RUNNING":
        raise JobError(f"the current job {job_id} of {ref.team}/{ref.cluster} is not RUNNING: submit one first")
    template_id = find_template(client, ref)
    fis = client("fis")
    started = time.time()
    experiment = fis.start_experiment(experimentTemplateId=template_id, clientToken=str(uuid.uuid4()))["experiment"]
    experiment_id = str(experiment["id"])
    progress(f"started experiment {experiment_id} of template {template_id} on job {job_id}")
    deadline = time.monotonic() + timeout_s
    status = ""
    while True:
        state = fis.get_experiment(id=experiment_id)["experiment"]["state"]
        if state["status"] != status:
            status = state["status"]
            progress(f"experiment {experiment_id}: {status} ({state.get('reason', '')})")
        if status in ENDED_EXPERIMENT:
            report = drill_report(client, ref, job_id, experiment_id, started)
            if status != "completed" or report["job_went_on"] or report["job_state"] != "RUNNING":
                return report
        if time.monotonic() > deadline:
            raise JobError(f"the drill did not end within {timeout_s:.0f} s (experiment {experiment_id}: {status})")
        time.sleep(poll_s)


def drill_report(
    client: ClientFactory, ref: ClusterRef, job_id: str, experiment_id: str, started: float
) -> dict[str, Any]:
    """The drill's figures, read from FIS, the job's logs, its state and the group's activities."""
    fis = client("fis")
    experiment = fis.get_experiment(id=experiment_id)["experiment"]
    targets = [
        t["targetInformation"]["arn"].rsplit("/", 1)[-1]
        for page in fis.get_paginator("list_experiment_resolved_targets").paginate(experimentId=experiment_id)
        for t in page["resolvedTargets"]
    ]
    events = log_events(client, ref, job_id)
    notified = _notified_nodes(events, job_id, started)
    first_notice = min((n["notice_at"] for n in notified), default=None)
    replacements = [] if first_notice is None else _replacements(client, ref, events, job_id, first_notice)
    state = job_state(client, ref, job_id)
    spans = restart_spans(events)
    redone = None if spans is None else sum(steps for steps, _, until in spans if until >= started)
    trained = [r for r in replacements if r["boot_to_first_step_s"] is not None]
    return {
        "experiment_id": experiment_id,
        "template_id": experiment["experimentTemplateId"],
        "experiment_state": experiment["state"]["status"],
        "experiment_reason": experiment["state"].get("reason"),
        "job_id": job_id,
        "targets": sorted(targets),
        "notices": notified,
        "replacements": replacements,
        "steps_redone": redone,
        "job_state": state,
        "job_went_on": state == "DONE" or (bool(notified) and len(trained) >= len(notified)),
    }


def _streams(events: list[tuple[float, str, str]], job_id: str) -> dict[str, list[tuple[float, str]]]:
    lines: dict[str, list[tuple[float, str]]] = {}
    for ts, stream, message in events:
        lines.setdefault(stream[len(job_id) + 1 :], []).append((ts, message))
    return lines


def _notified_nodes(events: list[tuple[float, str, str]], job_id: str, started: float) -> list[dict[str, Any]]:
    """Per node whose agent logged the spot notice after ``started``: when, and when its emergency checkpoint was
    durable."""
    found = []
    for instance, lines in sorted(_streams(events, job_id).items()):
        notice_at = next((ts for ts, msg in lines if ts >= started and _NOTICE.search(msg)), None)
        if notice_at is None:
            continue
        durable = next(((ts, m) for ts, msg in lines if ts >= notice_at and (m := _DURABLE.search(msg))), None)
        found.append(
            {
                "instance": instance,
                "notice_at": notice_at,
                "durable_step": None if durable is None else int(durable[1].group(1) or durable[1].group(2)),
                "notice_to_durable_s": None if durable is None else round(durable[0] - notice_at, 1),
            }
        )
    return found


def _replacements(
    client: ClientFactory, ref: ClusterRef, events: list[tuple[float, str, str]], job_id: str, after: float
) -> list[dict[str, Any]]:
    """The instances the group launched after ``after`` that logged for the job: boot to the job's next step."""
    launches = {i: t["launch"] for i, t in instance_activities(client, ref.group).items() if "launch" in t}
    found = []
    for instance, lines in sorted(_streams(events, job_id).items()):
        first_line = lines[0][0]
        launched = launches.get(instance, first_line)
        if launched < after:
            continue
        first_step = next((ts for ts, _, msg in events if ts >= first_line and _STEP.search(msg)), None)
        found.append(
            {
                "instance": instance,
                "launched_at": launched,
                "boot_to_first_step_s": None if first_step is None else round(first_step - launched, 1),
            }
        )
    return found


def format_drill(report: dict[str, Any]) -> str:
    """The report as text."""

    def seconds(value: Optional[float]) -> str:
        return "-" if value is None else f"{value:.1f} s"

    lines = [
        f"experiment {report['experiment_id']} (template {report['template_id']}): {report['experiment_state']}"
        + (f" ({report['experiment_reason']})" if report["experiment_state"] != "completed" else ""),
        f"job {report['job_id']}: {report['job_state']}; went on: {'yes' if report['job_went_on'] else 'no'}",
        f"targets: {', '.join(report['targets']) or 'none'}",
    ]
    for node in report["notices"]:
        durable = (
            "no emergency checkpoint logged"
            if node["durable_step"] is None
            else (f"checkpoint {node['durable_step']} durable {seconds(node['notice_to_durable_s'])} after the notice")
        )
        lines.append(f"notice: {node['instance']}: {durable}")
    if not report["notices"]:
        lines.append("notice: no node logged a spot interruption notice")
    for node in report["replacements"]:
        lines.append(f"replacement: {node['instance']}: boot to first step {seconds(node['boot_to_first_step_s'])}")
    redone = report["steps_redone"]
    lines.append(f"steps redone: {'unknown (no step lines)' if redone is None else redone}")
    return "\n".join(lines)
