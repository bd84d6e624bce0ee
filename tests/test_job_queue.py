"""The cluster's job queue: FIFO entries in S3, and the hand-over from an ended job to the next one, which exactly one
party makes whatever the order of a submit and the job's last node. AWS is moto in-process; each race is set up
with a hook that runs the other party at a chosen point (no sleeps)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Optional

import boto3
import pytest

from bootstrap_scripts.spot_training import job_queue
from bootstrap_scripts.spot_training.protocol import DONE, NEXT
from budget_guard.handler import guard
from team_config.naming import TEAM_TAG, budget_name, parameter_path
from tests.test_trainctl_submit import BUCKET, CLUSTER, CURRENT, GROUP, TEAM, aws, current_job, state, submit
from trainctl import jobs
from trainctl.cli import _client_factory as client_factory
from trainctl.cli import main as trainctl_main
from trainctl.job_queue import queue_of

__all__ = ["aws"]  # the fixture, shared with the submit tests


def trainctl(capsys: pytest.CaptureFixture[str], *argv: str, cluster: str = CLUSTER) -> tuple[int, str, str]:
    rc = trainctl_main([argv[0], "--team", TEAM, "--cluster", cluster, *argv[1:]])
    captured = capsys.readouterr()
    return rc, captured.out, captured.err


def cluster() -> job_queue.Cluster:
    client = client_factory("us-east-1")
    return queue_of(client, jobs.find_cluster(client, TEAM, CLUSTER))


def queued_ids() -> list[str]:
    return [entry["job_id"] for entry in job_queue.queued(cluster())]


def end(job_id: str) -> None:
    """The job's last node writes its end marker (what comes before the hand-over)."""
    boto3.client("s3").put_object(Bucket=BUCKET, Key=f"{CLUSTER}/{job_id}/{DONE}", Body=b"{}")


def scale_to_zero() -> None:
    boto3.client("autoscaling").set_desired_capacity(AutoScalingGroupName=GROUP, DesiredCapacity=0)


def ender(before_let_go: Callable[[], None] = lambda: None) -> tuple[Optional[dict[str, Any]], bool]:
    """The node agent's half (``Handover.after_end``): run-1 DONE, then the queue's head or the group to 0."""
    end("run-1")

    def let_go() -> None:
        before_let_go()
        scale_to_zero()

    return job_queue.after_end(cluster(), "run-1", let_go)


@pytest.fixture
def running(aws: None, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> Path:
    """run-1 runs on 2 nodes; the code directory to submit more from."""
    assert submit(capsys, tmp_path, "--job-id", "run-1") == (0, "")
    return tmp_path


def test_jobs_queue_first_in_first_out_and_the_list_shows_each_once(
    running: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for job_id, nodes in (("q-1", "1"), ("q-2", "2"), ("q-3", "1")):
        rc, err = submit(capsys, running, "--job-id", job_id, "--nodes", nodes)
        assert (rc, err.split(":")[0]) == (0, f"job {job_id} queued at position {job_id[-1]}")
    rc, out, _ = trainctl(capsys, "queue")
    rows = [line.split()[:3] for line in out.splitlines()[1:]]
    assert (rc, rows) == (0, [["1", "q-1", "1"], ["2", "q-2", "2"], ["3", "q-3", "1"]])
    # the same id again: refused before anything is written
    rc, err = submit(capsys, running, "--job-id", "q-2")
    assert rc == 2 and err.startswith("trainctl: error: job q-2 already exists on default/main")
    assert not job_queue.enqueue(cluster(), {"job_id": "q-2", "nodes": 1})  # S3 refuses a second entry
    assert queued_ids() == ["q-1", "q-2", "q-3"] and current_job()["job_id"] == "run-1"


def test_of_two_submits_racing_to_a_busy_cluster_both_are_queued_once(
    running: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The other submit queues its job while this one uploads its code: both entries stay, each once."""
    real, raced = jobs.upload, list[str]()

    def other_submit_meanwhile(*args: Any) -> None:
        if not raced:
            raced.append("racing")
            client = client_factory("us-east-1")
            ref = jobs.find_cluster(client, TEAM, CLUSTER)
            raced[0] = jobs.submit(client, ref, running, command="python train.py", nodes=1, job_id="other")
        real(*args)

    monkeypatch.setattr("trainctl.submit.upload", other_submit_meanwhile)
    assert submit(capsys, running, "--job-id", "this")[0] == 0
    assert raced == ["other"]
    assert queued_ids() == ["other", "this"]
    assert current_job()["job_id"] == "run-1"


def test_a_queued_job_the_last_node_finds_starts_on_the_running_group(
    running: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert submit(capsys, running, "--job-id", "q-1", "--nodes", "1")[0] == 0
    found, let_go = ender()
    assert (found or {}).get("job_id") == "q-1" and not let_go
    assert current_job()["job_id"] == "q-1" and queued_ids() == []
    assert state()["desired"] == 2  # kept: the surplus node leaves the group itself (one fewer)
    history = boto3.client("ssm").get_parameter_history(Name=CURRENT)["Parameters"]
    assert [json.loads(h["Value"])["job_id"] for h in history] == ["run-1", "q-1"]


def test_a_larger_queued_job_raises_the_group(aws: None, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert submit(capsys, tmp_path, "--job-id", "run-1", "--nodes", "1") == (0, "")
    assert submit(capsys, tmp_path, "--job-id", "q-big", "--nodes", "2")[0] == 0
    found, let_go = ender()
    assert ((found or {}).get("job_id"), let_go, state()["desired"]) == ("q-big", False, 2)


def test_a_submit_that_starts_its_job_before_the_last_node_scales_to_zero_is_not_undone(
    running: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The last node finds the queue empty; the submit, which saw the cluster busy, queues its job, finds run-1
    DONE and starts the job on the group at 2; then the node sets the group to 0. Its second read of the queue
    finds the hand-over and raises the group again: the job starts."""
    submitted: list[tuple[int, str]] = []
    found, let_go = ender(before_let_go=lambda: submitted.append(submit(capsys, running, "--job-id", "q-1")))
    assert submitted == [(0, "job q-1 started from the queue: the cluster's job ended as it was queued\n")]
    assert let_go and (found or {}).get("job_id") == "q-1"
    assert current_job()["job_id"] == "q-1" and queued_ids() == []
    assert state()["desired"] == 2


def test_a_submit_queued_after_the_last_node_looked_twice_starts_its_job_itself(
    running: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The submit sees the cluster busy; the last node then ends run-1, finds the queue empty twice and sets the
    group to 0, all before the submit's entry lands. The submit finds run-1 DONE and starts its job."""
    ended: list[tuple[Optional[dict[str, Any]], bool]] = []
    real = jobs.job_exists

    def last_node_meanwhile(c: Any, r: Any, job_id: str) -> bool:  # after the busy check, before the entry
        if not ended:
            ended.append(ender())
        return real(c, r, job_id)

    monkeypatch.setattr("trainctl.submit.job_exists", last_node_meanwhile)
    rc, err = submit(capsys, running, "--job-id", "q-1")
    assert ended == [(None, True)]  # nothing queued yet: the group went to 0
    assert (rc, err) == (0, "job q-1 started from the queue: the cluster's job ended as it was queued\n")
    assert current_job()["job_id"] == "q-1" and queued_ids() == [] and state()["desired"] == 2


def test_two_nodes_handing_over_at_once_start_one_job(running: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Node B hands run-1 over (to q-1) between node A's first look and its listing: A sees q-2 at the head, but
    S3 refuses A's NEXT, and A goes on to the job B chose."""
    for job_id in ("q-1", "q-2"):
        assert submit(capsys, running, "--job-id", job_id, "--nodes", "1")[0] == 0
    end("run-1")
    real, other = job_queue.queued, list[Optional[dict[str, Any]]]()

    def node_b_first(place: job_queue.Cluster) -> list[dict[str, Any]]:
        if not other:
            other.append(None)
            other[0] = job_queue.start_next(place, "run-1")
        return real(place)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(job_queue, "queued", node_b_first)
        mine = job_queue.start_next(cluster(), "run-1")
    assert [(j or {}).get("job_id") for j in (other[0], mine)] == ["q-1", "q-1"]
    assert current_job()["job_id"] == "q-1" and queued_ids() == ["q-2"]
    marker = boto3.client("s3").get_object(Bucket=BUCKET, Key=f"{CLUSTER}/run-1/{NEXT}")["Body"].read()
    assert json.loads(marker)["job"]["job_id"] == "q-1"


def test_with_an_empty_queue_the_last_node_scales_to_zero_as_ever(running: Path) -> None:
    assert ender() == (None, True)
    assert state()["desired"] == 0 and current_job()["job_id"] == "run-1"


def test_a_cancelled_job_never_starts_and_a_running_or_unknown_one_is_one_line(
    running: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for job_id in ("q-1", "q-2"):
        assert submit(capsys, running, "--job-id", job_id)[0] == 0
    assert trainctl(capsys, "cancel", "q-1") == (
        0,
        "job q-1 taken out of the queue of default/main; it never starts\n",
        "",
    )
    assert trainctl(capsys, "cancel", "run-1") == (
        2,
        "",
        "trainctl: error: job run-1 is not queued but the cluster's current job; stop it with: trainctl stop "
        "--team default --cluster main run-1\n",
    )
    assert trainctl(capsys, "cancel", "nope") == (
        2,
        "",
        "trainctl: error: job nope is not queued on default/main (see: trainctl queue --team default --cluster main)\n",
    )
    assert trainctl(capsys, "queue", cluster="nope") == (
        2,
        "",
        "trainctl: error: no cluster default/nope: SSM parameter /spot-training/default/nope/job-spec does not exist "
        "(is the stack deployed?)\n",
    )
    found, _ = ender()
    assert (found or {}).get("job_id") == "q-2"
    keys = [
        o["Key"]
        for o in boto3.client("s3").list_objects_v2(Bucket=BUCKET, Prefix=f"{CLUSTER}/q-1/").get("Contents", [])
    ]
    assert keys == []  # nothing of q-1 but its code archive, under code/
    listed = dict(line.split()[:2] for line in trainctl(capsys, "list")[1].splitlines()[1:])
    assert listed == {"run-1": "DONE", "q-1": "UNFINISHED", "q-2": "RUNNING"}


def test_over_the_budget_the_guard_clears_the_queue_and_no_queued_job_starts(
    running: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for job_id in ("q-1", "q-2"):
        assert submit(capsys, running, "--job-id", job_id)[0] == 0
    account = boto3.client("sts").get_caller_identity()["Account"]
    name = budget_name(TEAM, [], 80)
    boto3.client("budgets").create_budget(
        AccountId=account,
        Budget={
            "BudgetName": name,
            "BudgetLimit": {"Amount": "100", "Unit": "USD"},
            "TimeUnit": "MONTHLY",
            "BudgetType": "COST",
            "CalculatedSpend": {"ActualSpend": {"Amount": "120", "Unit": "USD"}},
        },
    )
    env = {
        "BUDGET_NAME": name,
        "JOB_SPEC_PARAMETERS": f"{parameter_path(TEAM, CLUSTER)}/job-spec",
        "TEAM_TAG": TEAM_TAG,
        "TEAM": TEAM,
    }
    report = guard(boto3.client, env, account, time.time())
    assert report["actions"] == [
        f"{CLUSTER}: queue cleared (q-1, q-2): they do not start over the budget",
        f"{CLUSTER}: asked job run-1 to stop",
    ]
    assert queued_ids() == []
    assert ender() == (None, True)  # the stopped job's last node finds nothing to start
    assert state()["desired"] == 0 and current_job()["job_id"] == "run-1"


def test_stop_keeps_the_queue_unless_asked_and_status_shows_it(
    running: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for job_id in ("q-1", "q-2"):
        assert submit(capsys, running, "--job-id", job_id)[0] == 0
    boto3.client("logs").create_log_group(logGroupName="/spot-training/default/main")  # the stack's; status reads it
    rc, out, _ = trainctl(capsys, "status")
    assert rc == 0 and "\nqueued: 2\nnext_job: q-1\n" in out
    assert trainctl(capsys, "stop", "q-2") == (
        0,
        "job q-2 is queued, not running; take it out of the queue with: trainctl cancel --team default --cluster "
        "main q-2\nqueue: 2 job(s) stay queued; the next, q-1, starts once this job has stopped (trainctl stop "
        "--clear-queue also empties the queue)\n",
        "",
    )
    # No node has come (no spot capacity): the stop writes STOPPED itself, and starts the queue's next job.
    real_group = jobs.group
    for user in ("trainctl.job_state", "trainctl.stop"):
        monkeypatch.setattr(f"{user}.group", lambda c, r: dict(real_group(c, r), Instances=[]))
    rc, out, _ = trainctl(capsys, "stop", "run-1")
    assert (rc, out) == (
        0,
        "job run-1: no node running; STOPPED, group set to 0\nqueue: the next job, q-1, starts now; 1 job(s) stay "
        "queued\n",
    )
    assert current_job()["job_id"] == "q-1" and state()["desired"] == 2
    rc, out, _ = trainctl(capsys, "stop", "q-1", "--clear-queue")
    assert (rc, out.splitlines()[-1]) == (0, "queue cleared: q-2 will not start")
    assert queued_ids() == []


def test_a_hand_over_a_node_could_not_make_is_made_by_stopping_the_ended_job(
    running: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """run-1's last node wrote DONE but could not reach the queue (it set the group to 0): the queue keeps q-1, and
    `trainctl stop` of the ended job makes the hand-over."""
    assert submit(capsys, running, "--job-id", "q-1")[0] == 0
    end("run-1")
    scale_to_zero()
    assert trainctl(capsys, "stop", "run-1") == (
        0,
        "job run-1 is already DONE\nqueue: the next job, q-1, starts now; 0 job(s) stay queued\n",
        "",
    )
    assert current_job()["job_id"] == "q-1" and state()["desired"] == 2
