"""Capacity fallback: the team file's ``capacity`` section, the watcher's template and permissions, its decision."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from aws_cdk.assertions import Template

from capacity_watcher.decision import ON_DEMAND, SPOT, Failure, capacity_failures, decide
from emulator.group_updates import merged_policy
from emulator.spot_capacity import NO_CAPACITY_MESSAGE
from team_config import load_team
from tests.synth import CLUSTER, joined, resources, synth, team_config
from tests.test_config import cluster, error_for, write
from trainctl import review
from trainctl.assembly import load_assembly
from trainctl.prices import load_prices

AFTER_S = 300.0


# ---- the team file ------------------------------------------------------------------------------------------


def test_fallback_with_no_spot_to_fall_back_from_is_refused_in_one_line(tmp_path: Path) -> None:
    message = error_for(
        tmp_path, cluster(on_demand_percentage_above_base=100, capacity={"on_demand_after_minutes": 10})
    )
    assert "clusters[0]" in message and "capacity.on_demand_after_minutes" in message
    assert "on_demand_percentage_above_base: 100" in message
    assert message.endswith("remove the capacity section, or lower on_demand_percentage_above_base")


def test_a_fallback_that_comes_after_the_agents_join_timeout_is_refused(tmp_path: Path) -> None:
    """With min_nodes 2, a spot node that came waits for its peer at most 10 minutes (JOIN_TIMEOUT_S), then fails
    the job: the fallback (its minutes, the watcher's period, 2 minutes to boot) must come within that."""
    late = {"on_demand_after_minutes": 7.5, "check_every_minutes": 1}
    message = error_for(tmp_path, cluster(min_nodes=2, desired_nodes=2, capacity=late))
    assert "capacity.on_demand_after_minutes (7.5) plus check_every_minutes (1)" in message
    assert message.endswith("set on_demand_after_minutes to at most 7, or min_nodes: 1")
    in_time = {"on_demand_after_minutes": 7, "check_every_minutes": 1}
    write(tmp_path, cluster(min_nodes=2, desired_nodes=2, capacity=in_time))
    assert load_team(tmp_path / "team-a.yaml").config.clusters[0].capacity is not None
    write(tmp_path, cluster(capacity={"on_demand_after_minutes": 60}))  # min_nodes 1: any node starts the job
    assert load_team(tmp_path / "team-a.yaml").config.clusters[0].capacity is not None


def test_an_empty_capacity_section_is_refused_with_its_fix(tmp_path: Path) -> None:
    message = error_for(tmp_path, "clusters:\n- name: main\n  instance_types: [g5.xlarge, g5.2xlarge]\n"
                        "  max_nodes: 2\n  capacity:\n")  # fmt: skip
    assert "clusters[0].capacity" in message and "on_demand_after_minutes" in message


# ---- the template -------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def watched() -> Template:
    capacity = {"on_demand_after_minutes": 7.5, "check_every_minutes": 2}
    return synth(team_config(clusters=[{**CLUSTER, "capacity": capacity}]))[1]


def _watcher_statements(template: Template) -> dict[str, dict[str, Any]]:
    [function] = resources(template, "AWS::Lambda::Function")
    role = {"Ref": function["Properties"]["Role"]["Fn::GetAtt"][0]}
    return {
        s["Sid"]: s
        for p in resources(template, "AWS::IAM::Policy")
        if role in p["Properties"]["Roles"]
        for s in p["Properties"]["PolicyDocument"]["Statement"]
        if "Sid" in s
    }


def test_no_watcher_without_a_capacity_section() -> None:
    template = synth(team_config())[1]
    assert resources(template, "AWS::Lambda::Function") == resources(template, "AWS::Events::Rule") == []


def test_the_watcher_runs_on_its_schedule_told_the_group_record_and_minutes(watched: Template) -> None:
    [function] = resources(watched, "AWS::Lambda::Function")
    env = function["Properties"]["Environment"]["Variables"]
    [group_id] = watched.find_resources("AWS::AutoScaling::AutoScalingGroup").keys()
    assert env["GROUP_NAME"] == {"Ref": group_id}
    assert (env["RECORD_KEY"], env["ON_DEMAND_AFTER_S"], env["SPOT_PERCENTAGE"]) == ("main/capacity.json", "450.0", "0")
    assert function["Properties"]["Handler"] == "handler.handler"
    [function_id] = watched.find_resources("AWS::Lambda::Function").keys()
    rules = resources(watched, "AWS::Events::Rule")
    assert all(r["Properties"]["Targets"][0]["Arn"] == {"Fn::GetAtt": [function_id, "Arn"]} for r in rules)
    [schedule] = [r for r in rules if "ScheduleExpression" in r["Properties"]]
    assert schedule["Properties"]["ScheduleExpression"] == "rate(2 minutes)"
    [failed] = [r for r in rules if "EventPattern" in r["Properties"]]
    assert failed["Properties"]["EventPattern"] == {
        "source": ["aws.autoscaling"],
        "detail-type": ["EC2 Instance Launch Unsuccessful"],
        "detail": {"AutoScalingGroupName": [{"Ref": group_id}]},
    }


def test_the_watcher_may_change_only_its_group_and_write_only_its_record(watched: Template) -> None:
    statements = _watcher_statements(watched)
    [group_id] = watched.find_resources("AWS::AutoScaling::AutoScalingGroup").keys()
    update = statements["UpdateOwnGroup"]
    assert update["Action"] == "autoscaling:UpdateAutoScalingGroup"
    assert f'autoScalingGroupName/", {{"Ref": "{group_id}"}}' in joined(update["Resource"])
    record = statements["ReadWriteRecord"]
    assert sorted(record["Action"]) == ["s3:GetObject", "s3:PutObject"]
    assert joined(record["Resource"]).endswith('"/main/capacity.json"]]}')
    assert statements["ListRecord"]["Condition"] == {"StringEquals": {"s3:prefix": ["main/capacity.json"]}}
    assert set(statements) == {"ReadGroups", "UpdateOwnGroup", "ListRecord", "ReadWriteRecord"}
    # no mutating action on "*": only the two Describe calls, which AWS authorizes on "*" only
    for sid, statement in statements.items():
        actions = [statement["Action"]] if isinstance(statement["Action"], str) else statement["Action"]
        on_everything = statement["Resource"] == "*" or "*" in statement["Resource"]
        if on_everything:
            assert sid == "ReadGroups" and all(a.split(":")[1].startswith("Describe") for a in actions), sid


# ---- the decision -------------------------------------------------------------------------------------------


def test_capacity_failures_are_the_failed_spot_launches_oldest_first() -> None:
    at = datetime(2026, 1, 1, tzinfo=UTC)
    activities = [
        {"StatusCode": "Failed", "StatusMessage": NO_CAPACITY_MESSAGE, "StartTime": at.replace(minute=5)},
        {"StatusCode": "Successful", "Description": "Launching a new EC2 instance: i-1", "StartTime": at},
        {"StatusCode": "Failed", "StatusMessage": "Could not launch On-Demand Instances. VcpuLimitExceeded",
         "StartTime": at},
        {"StatusCode": "Failed", "StatusMessage": NO_CAPACITY_MESSAGE, "StartTime": at.replace(minute=1)},
    ]  # fmt: skip
    found = capacity_failures(activities)
    assert [f.at for f in found] == [at.replace(minute=1).timestamp(), at.replace(minute=5).timestamp()]
    assert {f.message for f in found} == {NO_CAPACITY_MESSAGE}


def test_a_group_short_of_spot_nodes_waits_and_then_goes_on_demand() -> None:
    failures = [Failure(1000.0, NO_CAPACITY_MESSAGE), Failure(1100.0, NO_CAPACITY_MESSAGE)]
    record = {"market": SPOT, "settled_at": 900.0}
    waiting = decide(desired=2, launched=0, failures=failures, record=record, now=1000.0 + AFTER_S - 1, after_s=AFTER_S)
    assert waiting.action is None
    assert (waiting.record["waiting_since"], waiting.record["waiting_reason"]) == (1000.0, NO_CAPACITY_MESSAGE)
    switched = decide(desired=2, launched=0, failures=failures, record=record, now=1000.0 + AFTER_S, after_s=AFTER_S)
    assert switched.action == ON_DEMAND
    assert (switched.record["market"], switched.record["switched_at"]) == (ON_DEMAND, 1000.0 + AFTER_S)
    assert (
        switched.reason.startswith("spot launched 0 of 2 node(s) in 5.0 min") and NO_CAPACITY_MESSAGE in switched.reason
    )
    again = decide(desired=2, launched=0, failures=failures, record=switched.record, now=2000.0, after_s=AFTER_S)
    assert again.action is None  # already on on-demand


def test_failures_before_the_group_last_settled_do_not_count() -> None:
    old = [Failure(100.0, NO_CAPACITY_MESSAGE)]
    decision = decide(desired=1, launched=0, failures=old, record={"settled_at": 500.0}, now=5000.0, after_s=AFTER_S)
    assert decision.action is None and decision.record["waiting_since"] is None


def test_a_filled_group_settles_and_a_group_at_zero_goes_back_to_spot() -> None:
    failures = [Failure(1000.0, NO_CAPACITY_MESSAGE)]
    on_demand = {"market": ON_DEMAND, "settled_at": 900.0, "switched_at": 1400.0}
    filled = decide(desired=2, launched=2, failures=failures, record=on_demand, now=1500.0, after_s=AFTER_S)
    assert filled.action is None and filled.record["market"] == ON_DEMAND and filled.record["settled_at"] == 1500.0
    ended = decide(desired=0, launched=0, failures=failures, record=filled.record, now=1600.0, after_s=AFTER_S)
    assert ended.action == SPOT and ended.record["market"] == SPOT and ended.record["settled_at"] == 1600.0
    idle = decide(desired=0, launched=0, failures=failures, record=ended.record, now=1700.0, after_s=AFTER_S)
    assert idle.action is None and idle.record["market"] == SPOT


def test_the_watcher_package_imports_its_decision_alone(tmp_path: Path) -> None:
    """The Lambda package holds the handler and its decision at the path the handler imports it by."""
    out = tmp_path / "cdk.out"
    synth(team_config(clusters=[{**CLUSTER, "capacity": {"on_demand_after_minutes": 5}}]), outdir=str(out))
    template = json.loads((out / "TrainingStack-team-a.template.json").read_text())
    [function] = [r for r in template["Resources"].values() if r["Type"] == "AWS::Lambda::Function"]
    package = out / f"asset.{function['Properties']['Code']['S3Key'].removesuffix('.zip')}"
    files = sorted(str(p.relative_to(package)) for p in package.rglob("*") if p.is_file())
    assert files == [
        "bootstrap_scripts/spot_training/protocol.py",
        "capacity_watcher/__init__.py",
        "capacity_watcher/decision.py",
        "handler.py",
    ]
    code = "import handler; print(handler.decide.__module__, handler.read_marker.__module__)"
    imported = subprocess.run([sys.executable, "-E", "-s", "-c", code], cwd=package, capture_output=True, text=True)
    assert imported.stdout == "capacity_watcher.decision bootstrap_scripts.spot_training.protocol\n", imported.stderr


# ---- trainctl review ----------------------------------------------------------------------------------------


def test_review_shows_the_fallback_and_its_worst_case_on_demand(tmp_path: Path) -> None:
    out = tmp_path / "cdk.out"
    synth(team_config(clusters=[{**CLUSTER, "capacity": {"on_demand_after_minutes": 7.5}}]), outdir=str(out))
    prices = load_prices()
    text = review.summary(load_assembly(out), prices, spot={"g5.xlarge": 0.25, "g5.2xlarge": 0.5})
    worst = 2 * prices.on_demand_price(max(CLUSTER["instance_types"], key=prices.on_demand_price))
    assert (
        f"| team-a | main | g5.xlarge, g5.2xlarge | 2 | 0 + 0% above; all after 7.5 min without spot | off | "
        f"{worst:.2f} | {2 * 0.5:.2f} ({worst:.2f} after the fallback) |"
    ) in text


def test_the_emulated_group_update_keeps_the_policy_parts_a_request_does_not_name() -> None:
    """As EC2 Auto Scaling: an update naming only InstancesDistribution keeps the launch templates, one naming no
    MixedInstancesPolicy keeps the whole policy (moto would drop it)."""
    current = {
        "LaunchTemplate": {
            "LaunchTemplateSpecification": {"LaunchTemplateId": "lt-1"},
            "Overrides": [{"InstanceType": "g5.xlarge"}],
        },
        "InstancesDistribution": {"OnDemandBaseCapacity": 1, "OnDemandPercentageAboveBaseCapacity": 0},
    }
    update = {"InstancesDistribution": {"OnDemandPercentageAboveBaseCapacity": 100}}
    assert merged_policy(current, update) == {
        "LaunchTemplate": current["LaunchTemplate"],
        "InstancesDistribution": {"OnDemandBaseCapacity": 1, "OnDemandPercentageAboveBaseCapacity": 100},
    }
    assert merged_policy(current, None) == current
    assert merged_policy(None, update) == update
