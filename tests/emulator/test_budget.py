"""Team budgets on the emulated cloud: the deployed budget, its alerts, the scheduled guard, trainctl's view.

AWS billing does not exist here, so the test stands in for it: it re-creates the budget with a ``CalculatedSpend``
(what AWS Budgets would report), through the Budgets API. Everything else is the deployed stack's own.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import boto3
import pytest
import yaml

from bootstrap_scripts.spot_training.job_spec import DRAIN_HOOK
from budget_guard.handler import guard, handler
from emulator import EmulatedCloud
from emulator.demo import EXAMPLE_DIR
from emulator.deploy import bootstrap, deploy
from team_config.naming import TEAM_TAG, budget_name
from tests.emulator.user_environment import use_emulator_exports
from trainctl import jobs
from trainctl.cli import main as trainctl_main

pytestmark = pytest.mark.slow

CLUSTERS = ("main", "stuck", "side", "late")  # the guard judges them in this order
TEAM, LIMIT, WARN, EVERY = "capped", 50.0, 70, 10  # EVERY under force_stop_after_minutes: the schedule's rate
NAME = budget_name(TEAM, ["leads@example.com"], WARN)


@pytest.fixture(scope="module")
def cloud(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmulatedCloud]:
    teams = tmp_path_factory.mktemp("teams")
    team = {
        "budget": {
            "usd_per_month": LIMIT,
            "warn_at_percent": WARN,
            "notify": ["leads@example.com"],
            "check_every_minutes": EVERY,
        },
        "clusters": [{"name": name, "instance_types": ["g5.xlarge", "g6.xlarge"], "max_nodes": 2} for name in CLUSTERS],
    }
    (teams / f"{TEAM}.yaml").write_text(yaml.safe_dump(team))
    with EmulatedCloud(run_dir=tmp_path_factory.mktemp("budget")) as c:
        bootstrap(c)
        deploy(c, f"TrainingStack-{TEAM}", context={"teams_dir": str(teams), "team": TEAM})
        yield c


@pytest.fixture(autouse=True)
def _no_agent_drains(cloud: EmulatedCloud) -> Iterator[None]:
    """No node agent runs in these tests. After each, do an agent's last step for every instance a group of the team
    holds in Terminating:Wait (the drain hook, after a stop scaled it to 0): complete the hook, so the next test
    finds the cluster idle instead of busy for the hook's 300 s heartbeat."""
    yield
    asg = cloud.client("autoscaling")
    for name in CLUSTERS:
        ref = jobs.find_cluster(cloud.client, TEAM, name)
        for instance in jobs.group(cloud.client, ref)["Instances"]:
            if instance["LifecycleState"] == "Terminating:Wait":
                asg.complete_lifecycle_action(
                    AutoScalingGroupName=ref.group,
                    LifecycleHookName=DRAIN_HOOK,
                    InstanceId=instance["InstanceId"],
                    LifecycleActionResult="CONTINUE",
                )


def _guard_function(cloud: EmulatedCloud) -> dict[str, Any]:
    functions = cloud.client("lambda").list_functions()["Functions"]
    found = [f for f in functions if f.get("Environment", {}).get("Variables", {}).get("TEAM") == TEAM]
    assert len(found) == 1
    return dict(found[0])


def _set_spend(cloud: EmulatedCloud, usd: float) -> None:
    """Stand-in for AWS billing: the budget as AWS Budgets would report it after ``usd`` of spend."""
    budgets, name = cloud.client("budgets"), NAME
    budget = budgets.describe_budget(AccountId=cloud.account_id, BudgetName=name)["Budget"]
    budgets.delete_budget(AccountId=cloud.account_id, BudgetName=name)
    budget["CalculatedSpend"] = {"ActualSpend": {"Amount": str(usd), "Unit": "USD"}}
    budgets.create_budget(AccountId=cloud.account_id, Budget=budget)


def test_the_stack_creates_the_budget_its_alerts_and_a_scheduled_guard(cloud: EmulatedCloud) -> None:
    budgets = cloud.client("budgets")
    budget = budgets.describe_budget(AccountId=cloud.account_id, BudgetName=NAME)["Budget"]
    assert float(budget["BudgetLimit"]["Amount"]) == LIMIT and budget["BudgetLimit"]["Unit"] == "USD"
    assert (budget["BudgetType"], budget["TimeUnit"]) == ("COST", "MONTHLY")
    assert budget["CostFilters"] == {"TagKeyValue": [f"user:{TEAM_TAG}${TEAM}"]}
    notes = budgets.describe_notifications_for_budget(AccountId=cloud.account_id, BudgetName=NAME)
    assert sorted(n["Threshold"] for n in notes["Notifications"]) == [WARN, 100]
    for note in notes["Notifications"]:  # (moto has no DescribeSubscribersForNotification: the emails are
        # asserted on the template, tests/test_constructs.py)
        assert note["NotificationType"] == "ACTUAL" and note["ComparisonOperator"] == "GREATER_THAN"

    function = _guard_function(cloud)
    env = function["Environment"]["Variables"]
    assert env["BUDGET_NAME"] == NAME
    assert env["JOB_SPEC_PARAMETERS"] == ",".join(f"/spot-training/{TEAM}/{name}/job-spec" for name in CLUSTERS)
    assert function["Runtime"].startswith("python3.")
    events = cloud.client("events")
    rules = [
        r
        for r in events.list_rules()["Rules"]
        if any(t["Arn"] == function["FunctionArn"] for t in events.list_targets_by_rule(Rule=r["Name"])["Targets"])
    ]
    assert [r["ScheduleExpression"] for r in rules] == [f"rate({EVERY} minutes)"]


def _trainctl(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = trainctl_main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_the_guard_stops_the_job_once_the_budget_is_spent_and_trainctl_shows_it(
    cloud: EmulatedCloud, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    client = cloud.client
    ref = jobs.find_cluster(client, TEAM, "main")
    env = _guard_function(cloud)["Environment"]["Variables"]
    job_id = jobs.submit(client, ref, EXAMPLE_DIR, command="python train.py", nodes=1)
    assert jobs.desired_capacity(client, ref) == 1
    assert jobs.group(client, ref)["Instances"]  # an instance runs (no node agent here: nothing answers the stop)

    report = guard(client, env, cloud.account_id, now=1000.0)
    assert (report["spent_usd"], report["limit_usd"], report["actions"]) == (0.0, LIMIT, [])
    assert jobs.marker(client, ref, job_id, "STOP") is None

    _set_spend(cloud, LIMIT + 10)
    report = guard(client, env, cloud.account_id, now=time.time())
    assert report["actions"] == [f"main: asked job {job_id} to stop"]
    stop = jobs.marker(client, ref, job_id, "STOP")
    assert stop is not None and stop["by"] == "budget guard"
    assert jobs.desired_capacity(client, ref) == 1  # the nodes get their time to save a final checkpoint

    # the same run through the Lambda entry point, with the function's own environment
    use_emulator_exports(cloud, monkeypatch)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    arn = _guard_function(cloud)["FunctionArn"]
    report = handler({}, SimpleNamespace(invoked_function_arn=arn))
    assert report["actions"] == []  # asked already, not yet overdue
    assert json.loads(capsys.readouterr().out) == report  # its report goes to the function's log

    code, out, _ = _trainctl(capsys, "--json", "status", "--team", TEAM, "--cluster", "main", job_id)
    assert code == 0
    assert json.loads(out)["budget"] == {"name": NAME, "limit_usd": LIMIT, "spent_usd": LIMIT + 10}
    code, out, _ = _trainctl(capsys, "status", "--team", TEAM, "--cluster", "main", job_id)
    assert f"budget: spent {LIMIT + 10:.2f} of {LIMIT:.2f} USD this month ({NAME})" in out
    code, _, err = _trainctl(
        capsys, "submit", "--team", TEAM, "--cluster", "main", "--code", str(tmp_path), "--nodes", "1"
    )
    assert code == 2
    assert err == (
        f"trainctl: error: team {TEAM} has spent {LIMIT + 10:.2f} of its {LIMIT:.2f} USD budget this month "
        f"({NAME}); raise budget.usd_per_month in its team file or wait for the next month\n"
    )

    # timed as the guard times it: from when S3 stored the STOP (whole seconds in moto), not from the call
    asked_at = jobs.object_time(client, ref, ref.job_prefix(job_id) + "STOP")
    assert asked_at is not None
    overdue = asked_at + float(env["FORCE_AFTER_S"]) + 1
    report = guard(client, env, cloud.account_id, now=overdue)
    assert report["actions"] == [f"main: group {ref.group} set to 0"]
    assert jobs.desired_capacity(client, ref) == 0


def test_a_cluster_the_guard_cannot_judge_does_not_keep_it_from_the_others(cloud: EmulatedCloud) -> None:
    """Parameters and objects anyone who may write the cluster's prefix or parameters could have spoiled: stuck's
    job spec is not JSON (the run fails naming it, so the function's errors show it, and goes on with the others);
    side's current-job parameter is not JSON (no job to ask: its group is set to 0); late's STOP is not JSON (a stop
    request all the same, timed by S3: its group is set to 0 once it is overdue)."""
    client = cloud.client
    _set_spend(cloud, 0.0)
    stuck, side, late = (jobs.find_cluster(client, TEAM, name) for name in ("stuck", "side", "late"))
    spec_parameter = f"/spot-training/{TEAM}/stuck/job-spec"
    spec = client("ssm").get_parameter(Name=spec_parameter)["Parameter"]["Value"]
    try:
        for ref in (stuck, side, late):
            job_id = jobs.submit(client, ref, EXAMPLE_DIR, command="python train.py", nodes=1)
        client("ssm").put_parameter(Name=spec_parameter, Value="{not json", Overwrite=True)
        client("ssm").put_parameter(Name=str(side.spec["current_job_parameter"]), Value="{not json", Overwrite=True)
        client("s3").put_object(Bucket=late.bucket, Key=late.job_prefix(job_id) + "STOP", Body=b"<html>")
        _set_spend(cloud, LIMIT + 1)
        env = _guard_function(cloud)["Environment"]["Variables"]

        for now, late_capacity in ((time.time(), 1), (time.time() + float(env["FORCE_AFTER_S"]) + 1, 0)):
            with pytest.raises(RuntimeError) as failed:
                guard(client, env, cloud.account_id, now=now)
            assert str(failed.value).startswith(f"budget guard could not judge: {spec_parameter}: JSONDecodeError: ")
            assert "side" not in str(failed.value) and "late" not in str(failed.value)
            assert jobs.desired_capacity(client, stuck) == 1  # nothing the guard could judge, nothing it did
            assert jobs.desired_capacity(client, side) == 0
            assert jobs.desired_capacity(client, late) == late_capacity
    finally:
        client("ssm").put_parameter(Name=spec_parameter, Value=spec, Overwrite=True)
        _set_spend(cloud, 0.0)


def test_the_guard_tells_a_finished_job_by_listing_alone(cloud: EmulatedCloud) -> None:
    """The guard's role may read no object (tests/test_constructs.py): it must learn that a job ended from the
    listing. Any GetObject of the run is refused and recorded; an end marker that is not JSON counts all the same."""
    ref = jobs.find_cluster(cloud.client, TEAM, "main")
    job_id = jobs.submit(cloud.client, ref, EXAMPLE_DIR, command="python train.py", nodes=1)
    cloud.client("s3").put_object(Bucket=ref.bucket, Key=ref.job_prefix(job_id) + "DONE", Body=b"<html>")
    assert jobs.desired_capacity(cloud.client, ref) == 1
    reads: list[str] = []

    def refuse(params: Any, **_: Any) -> None:
        reads.append(params["Key"])
        raise PermissionError(f"the budget guard read {params['Key']}")

    def listing_only(service: str) -> Any:
        client = boto3.session.Session().client(service, **cloud.boto3_kwargs())  # not the shared, cached ones
        client.meta.events.register("before-parameter-build.s3.GetObject", refuse)
        return client

    _set_spend(cloud, LIMIT + 1)
    try:
        env = _guard_function(cloud)["Environment"]["Variables"]
        try:
            report = guard(listing_only, env, cloud.account_id, now=time.time())["actions"]
        except RuntimeError as exc:  # another cluster of the module's may not be judged; main must be
            report = [str(exc)]
    finally:
        _set_spend(cloud, 0.0)
    assert reads == []
    assert f"main: group {ref.group} set to 0" in report
    assert jobs.desired_capacity(cloud.client, ref) == 0  # DONE is there: nothing to ask, the group goes to 0


def test_under_the_budget_the_guard_sets_a_group_its_ended_job_left_up_to_zero(cloud: EmulatedCloud) -> None:
    """Under the limit the guard sets to 0 a group still above 0 after its job ended (its agents could not scale it
    down: an Auto Scaling outage past their retries, an agent that died); left alone, the group would bill idle nodes
    until the month's budget was spent. A cluster whose group it cannot find fails the guard with its name: skipped
    without a word, it would never be stopped."""
    client = cloud.client
    _set_spend(cloud, 0.0)
    ref = jobs.find_cluster(client, TEAM, "main")
    job_id = jobs.submit(client, ref, EXAMPLE_DIR, command="python train.py", nodes=1)
    env = _guard_function(cloud)["Environment"]["Variables"]
    assert guard(client, env, cloud.account_id, now=time.time())["actions"] == []  # it runs: left alone
    assert jobs.desired_capacity(client, ref) == 1
    client("s3").put_object(Bucket=ref.bucket, Key=ref.job_prefix(job_id) + "STOPPED", Body=b"{}")
    # a submit between the guard's first look and its scale-down (the current job changed): the group is left alone
    current = str(ref.spec["current_job_parameter"])
    reads: list[str] = []

    def submitted_meanwhile(service: str) -> Any:
        real = client(service)
        if service != "ssm":
            return real

        def get_parameter(Name: str) -> Any:
            answer = real.get_parameter(Name=Name)
            if Name == current:
                reads.append(Name)
                if len(reads) > 1:
                    answer["Parameter"]["Value"] = json.dumps({"job_id": "job-submitted-meanwhile"})
            return answer

        return SimpleNamespace(get_parameter=get_parameter, exceptions=real.exceptions)

    assert guard(submitted_meanwhile, env, cloud.account_id, now=time.time())["actions"] == []
    assert len(reads) == 2 and jobs.desired_capacity(client, ref) == 1
    report = guard(client, env, cloud.account_id, now=time.time())
    assert report["actions"] == [f"main: job {job_id} is STOPPED: group {ref.group} set to 0"]
    assert jobs.desired_capacity(client, ref) == 0

    ghost = f"/spot-training/{TEAM}/ghost/job-spec"  # a cluster whose group lost the team's tags
    client("ssm").put_parameter(Name=ghost, Value=json.dumps({**ref.spec, "cluster": "ghost"}), Type="String")
    try:
        with pytest.raises(RuntimeError) as failed:
            guard(client, {**env, "JOB_SPEC_PARAMETERS": f"{env['JOB_SPEC_PARAMETERS']},{ghost}"}, cloud.account_id, 0)
    finally:
        client("ssm").delete_parameter(Name=ghost)
    assert str(failed.value) == (
        f"budget guard could not judge: {ghost}: LookupError: no Auto Scaling group with the team's tags for "
        "cluster 'ghost'"
    )
