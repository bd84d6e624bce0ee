"""``trainctl drill``: finding the cluster's experiment template (moto's FIS in process) and the text report.
The drill itself runs on the emulated cloud in ``tests/emulator/test_drills.py``."""

from __future__ import annotations

from typing import Any

import boto3
import pytest

from team_config.naming import CLUSTER_TAG, TEAM_TAG
from trainctl import jobs
from trainctl.drill import find_template, format_drill

REF = jobs.ClusterRef("research", "main", {}, "group")


@pytest.fixture
def fis(mocked_aws: None) -> Any:
    return boto3.client("fis")


def template(fis: Any, team: str, cluster: str) -> str:
    created = fis.create_experiment_template(
        description=f"{team}/{cluster}",
        roleArn="arn:aws:iam::123456789012:role/fis",
        stopConditions=[{"source": "none"}],
        targets={
            "ClusterSpotInstances": {
                "resourceType": "aws:ec2:spot-instance",
                "selectionMode": "PERCENT(50)",
                "resourceTags": {TEAM_TAG: team, CLUSTER_TAG: cluster},
            }
        },
        actions={
            "SendInterruptionNotices": {
                "actionId": "aws:ec2:send-spot-instance-interruptions",
                "parameters": {"durationBeforeInterruption": "PT2M"},
                "targets": {"SpotInstances": "ClusterSpotInstances"},
            }
        },
        tags={TEAM_TAG: team},
    )
    return str(created["experimentTemplate"]["id"])


def test_the_cluster_s_template_is_found_by_its_team_tag_and_its_target_s_cluster_tag(fis: Any) -> None:
    template(fis, "research", "other")
    template(fis, "default", "main")
    wanted = template(fis, "research", "main")
    assert find_template(lambda service: boto3.client(service), REF) == wanted


def test_a_cluster_without_a_drill_is_one_line_with_the_fix(fis: Any) -> None:
    template(fis, "research", "other")
    with pytest.raises(jobs.JobError) as missing:
        find_template(lambda service: boto3.client(service), REF)
    assert str(missing.value) == (
        "cluster research/main has no interruption drill (no FIS experiment template tagged "
        "spot-training:team=research targeting spot-training:cluster=main): add 'interruption_drill: {}' to the "
        "cluster in teams/research.yaml and deploy"
    )


def test_the_text_report_of_a_failed_drill_says_why_and_that_no_node_got_a_notice() -> None:
    report: dict[str, Any] = {
        "experiment_id": "EXP1",
        "template_id": "TPL1",
        "experiment_state": "failed",
        "experiment_reason": "stop condition alarm drill-stop is in ALARM",
        "job_id": "job-1",
        "targets": [],
        "notices": [],
        "replacements": [],
        "steps_redone": None,
        "job_state": "RUNNING",
        "job_went_on": False,
    }
    assert format_drill(report).splitlines() == [
        "experiment EXP1 (template TPL1): failed (stop condition alarm drill-stop is in ALARM)",
        "job job-1: RUNNING; went on: no",
        "targets: none",
        "notice: no node logged a spot interruption notice",
        "steps redone: unknown (no step lines)",
    ]
