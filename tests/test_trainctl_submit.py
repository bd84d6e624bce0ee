"""``trainctl submit`` refuses, before it uploads or scales anything, a job the node agent would refuse.

The agent checks the job when a node boots; a job it refuses used to leave the group scaled up with every node
idle (and billed). AWS is moto in-process here: no server, no network.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError
from moto import mock_aws

from team_config.model import JobConfig
from team_config.naming import CLUSTER_TAG, TEAM_TAG, parameter_path
from trainctl import jobs
from trainctl.cli import _client_factory as client_factory
from trainctl.cli import main as trainctl_main

TEAM, CLUSTER, BUCKET, GROUP = "default", "main", "checkpoints", "main-group"
CURRENT = f"{parameter_path(TEAM, CLUSTER)}/current-job"


@pytest.fixture
def aws(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for key, value in {
        "AWS_ACCESS_KEY_ID": "x",
        "AWS_SECRET_ACCESS_KEY": "x",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    with mock_aws():
        ec2 = boto3.client("ec2")
        ec2.create_launch_template(
            LaunchTemplateName="nodes", LaunchTemplateData={"ImageId": "ami-12345678", "InstanceType": "g5.xlarge"}
        )
        boto3.client("autoscaling").create_auto_scaling_group(
            AutoScalingGroupName=GROUP,
            MinSize=0,
            MaxSize=2,
            DesiredCapacity=0,
            LaunchTemplate={"LaunchTemplateName": "nodes"},
            AvailabilityZones=["us-east-1a"],
            Tags=[{"Key": TEAM_TAG, "Value": TEAM}, {"Key": CLUSTER_TAG, "Value": CLUSTER}],
        )
        boto3.client("s3").create_bucket(Bucket=BUCKET)
        job = JobConfig()  # the team file's defaults, as the stack writes them into the job spec
        spec = {
            "version": 1,
            "team": TEAM,
            "cluster": CLUSTER,
            "region": "us-east-1",
            "bucket": BUCKET,
            "prefix": f"{CLUSTER}/",
            "log_group": "/spot-training/default/main",
            "current_job_parameter": CURRENT,
            **job.model_dump(),
            "min_nodes": 1,
            "desired_nodes": 1,
            "max_nodes": 2,
            "warm_pool": None,
        }
        boto3.client("ssm").put_parameter(
            Name=f"{parameter_path(TEAM, CLUSTER)}/job-spec", Value=json.dumps(spec), Type="String"
        )
        yield


def submit(capsys: pytest.CaptureFixture[str], code: Path, *extra: str) -> tuple[int, str]:
    (code / "train.py").write_text("print('training')\n")
    rc = trainctl_main(["submit", "--team", TEAM, "--cluster", CLUSTER, "--code", str(code), "--nodes", "2", *extra])
    return rc, capsys.readouterr().err


def state() -> dict[str, Any]:
    group = boto3.client("autoscaling").describe_auto_scaling_groups(AutoScalingGroupNames=[GROUP])
    objects = boto3.client("s3").list_objects_v2(Bucket=BUCKET).get("Contents", [])
    names = [p["Name"] for p in boto3.client("ssm").describe_parameters()["Parameters"]]
    return {
        "desired": group["AutoScalingGroups"][0]["DesiredCapacity"],
        "objects": len(objects),
        "current job written": CURRENT in names,
    }


@pytest.mark.parametrize(
    ("extra", "reason"),
    [
        (
            ("--command", "python train.py > out.log"),
            "command contains shell syntax '>': it runs without a shell; put the logic in a script",
        ),
        (
            ("--command", "torchrun train.py"),
            "command must be 'python SCRIPT [ARGS]' or 'python -m MODULE [ARGS]', got 'torchrun train.py'",
        ),
        (
            ("--job-id", "My_Job.v2"),
            "job_id must be a DNS label (lowercase letters, digits, '-', at most 63), got 'My_Job.v2'",
        ),
        (("--checkpoint-interval-s", "-5"), "checkpoint_interval_s must be a positive number or null, got -5.0"),
        (("--checkpoint-interval-s", "inf"), "checkpoint_interval_s must be a positive number or null, got inf"),
        (("--job-id", "code"), "job_id 'code' is reserved: the code archives are under '<cluster>/code/'"),
        (("--python", "python3"), "python must be an absolute path, got 'python3'"),
    ],
)
def test_a_job_the_agent_would_refuse_is_refused_before_anything_starts(
    aws: None, capsys: pytest.CaptureFixture[str], tmp_path: Path, extra: tuple[str, ...], reason: str
) -> None:
    rc, err = submit(capsys, tmp_path, *extra)
    assert (rc, err) == (2, f"trainctl: error: the node agent would refuse this job: {reason}\n")
    assert state() == {"desired": 0, "objects": 0, "current job written": False}


def test_a_good_job_is_submitted(aws: None, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    rc, err = submit(capsys, tmp_path, "--command", "python train.py --epochs 3", "--job-id", "run-1")
    assert (rc, err) == (0, "")
    assert state() == {"desired": 2, "objects": 1, "current job written": True}
    current = json.loads(boto3.client("ssm").get_parameter(Name=CURRENT)["Parameter"]["Value"])
    assert (current["job_id"], current["command"], current["nodes"]) == ("run-1", "python train.py --epochs 3", 2)


def trainctl(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = trainctl_main([argv[0], "--team", TEAM, "--cluster", CLUSTER, *argv[1:]])
    captured = capsys.readouterr()
    return rc, captured.out, captured.err


def test_a_job_is_not_submitted_over_a_running_one(
    aws: None, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """Nodes read the job when they boot: a second job would share the group with the first, and the first to end
    would scale the group to 0 under the other."""
    assert submit(capsys, tmp_path, "--job-id", "run-1") == (0, "")
    assert trainctl(capsys, "list")[1].split()[3:5] == ["run-1", "RUNNING"]
    rc, err = submit(capsys, tmp_path, "--job-id", "run-2")
    assert (rc, err) == (
        2,
        f"trainctl: error: cluster {TEAM}/{CLUSTER} is busy: its group is at 2 with 2 node(s) for job run-1 "
        f"(RUNNING); stop it first (trainctl stop --team {TEAM} --cluster {CLUSTER} run-1) or wait until it ends, "
        "then submit when the group is at 0 with no node\n",
    )
    assert state() == {"desired": 2, "objects": 1, "current job written": True}
    assert json.loads(boto3.client("ssm").get_parameter(Name=CURRENT)["Parameter"]["Value"])["job_id"] == "run-1"
    # Its nodes went without a marker (the group set to 0 by hand): nothing runs it, a new job may start.
    boto3.client("autoscaling").set_desired_capacity(AutoScalingGroupName=GROUP, DesiredCapacity=0)
    assert submit(capsys, tmp_path, "--job-id", "run-2") == (0, "")
    listed = [line.split()[:2] for line in trainctl(capsys, "list")[1].splitlines()[1:]]
    assert listed == [["run-1", "UNFINISHED"], ["run-2", "RUNNING"]]
    assert (
        trainctl(capsys, "stop", "run-1")[1]
        == "job run-1 is not running (UNFINISHED: no node runs it); nothing to stop\n"
    )
    assert state()["desired"] == 2  # the current job's group is left alone


class FailingScale:
    """The real clients, but Auto Scaling refuses SetDesiredCapacity (say the operator's role may not call it)."""

    def __init__(self) -> None:
        self.real = client_factory("us-east-1")

    def __call__(self, service: str) -> Any:
        client = self.real(service)
        if service == "autoscaling":

            def refused(**_: Any) -> Any:
                raise ClientError({"Error": {"Code": "AccessDenied", "Message": "not allowed"}}, "SetDesiredCapacity")

            client.set_desired_capacity = refused
        return client


def test_a_submit_that_cannot_scale_the_group_leaves_nothing_behind(aws: None, tmp_path: Path) -> None:
    client = FailingScale()
    ref = jobs.find_cluster(client, TEAM, CLUSTER)
    (tmp_path / "train.py").write_text("print('training')\n")
    with pytest.raises(ClientError, match="AccessDenied"):
        jobs.submit(client, ref, tmp_path, command="python train.py", nodes=1, job_id="run-1")
    assert state() == {"desired": 0, "objects": 0, "current job written": False}
    assert not jobs.job_exists(client, ref, "run-1")  # the job id stays free


def test_stopping_a_job_that_waits_for_capacity_stops_it_here(
    aws: None, capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No node has come yet (no spot capacity): no node agent would ever write STOPPED."""
    assert submit(capsys, tmp_path, "--job-id", "run-1") == (0, "")
    real_group = jobs.group
    monkeypatch.setattr(jobs, "group", lambda c, r: dict(real_group(c, r), Instances=[]))  # moto launches at once
    client = client_factory("us-east-1")
    ref = jobs.find_cluster(client, TEAM, CLUSTER)
    assert jobs.job_state(client, ref, "run-1") == "WAITING"
    rc, out, _ = trainctl(capsys, "stop", "run-1")
    assert (rc, out) == (0, "job run-1: no node running; STOPPED, group set to 0\n")
    assert jobs.job_state(client, ref, "run-1") == "STOPPED"
    stopped = jobs.marker(client, ref, "run-1", "STOPPED")
    assert stopped is not None and (stopped["by"], stopped["last_checkpoint"]) == ("trainctl stop", None)
    assert state()["desired"] == 0


def test_unreadable_code_and_a_missing_review_folder_are_one_line(
    aws: None, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    (tmp_path / ".gitignore").write_bytes(b"caf\xe9\n")
    rc, err = submit(capsys, tmp_path)
    assert (rc, err) == (
        2,
        f"trainctl: error: {tmp_path / '.gitignore'}: not UTF-8 text (invalid continuation byte at byte 3)\n",
    )
    assert state() == {"desired": 0, "objects": 0, "current job written": False}
    rc = trainctl_main(["review", "--out", str(tmp_path / "missing" / "review.md")])
    assert (rc, capsys.readouterr().err) == (
        2,
        f"trainctl: error: --out {tmp_path / 'missing' / 'review.md'}: folder {tmp_path / 'missing'} does not exist\n",
    )


def set_spec(**values: int) -> None:
    """Change the cluster's job spec (as a redeploy of another team file would)."""
    ssm, name = boto3.client("ssm"), f"{parameter_path(TEAM, CLUSTER)}/job-spec"
    spec = json.loads(ssm.get_parameter(Name=name)["Parameter"]["Value"])
    ssm.put_parameter(Name=name, Value=json.dumps({**spec, **values}), Type="String", Overwrite=True)


def current_job() -> dict[str, Any]:
    return dict(json.loads(boto3.client("ssm").get_parameter(Name=CURRENT)["Parameter"]["Value"]))


def test_without_nodes_a_job_asks_for_the_clusters_desired_nodes(
    aws: None, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    set_spec(desired_nodes=2)
    (tmp_path / "train.py").write_text("print('training')\n")
    rc = trainctl_main(["submit", "--team", TEAM, "--cluster", CLUSTER, "--code", str(tmp_path), "--job-id", "run-1"])
    assert (rc, capsys.readouterr().err) == (0, "")
    assert state()["desired"] == 2
    assert (current_job()["nodes"], current_job()["min_nodes"]) == (2, 1)


def test_nodes_below_the_clusters_min_nodes_lower_the_jobs_min_nodes_and_say_so(
    aws: None, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    set_spec(min_nodes=2, desired_nodes=2)
    (tmp_path / "train.py").write_text("print('training')\n")
    argv = ["submit", "--team", TEAM, "--cluster", CLUSTER, "--code", str(tmp_path), "--job-id", "run-1", "--nodes"]
    rc = trainctl_main([*argv, "1"])
    assert (rc, capsys.readouterr().err) == (0, "job run-1: min_nodes lowered from the cluster's 2 to 1 (--nodes 1)\n")
    assert (state()["desired"], current_job()["nodes"], current_job()["min_nodes"]) == (1, 1, 1)


def test_status_of_an_earlier_job_does_not_show_the_current_jobs_nodes(
    aws: None, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    assert submit(capsys, tmp_path, "--job-id", "run-1") == (0, "")
    boto3.client("autoscaling").set_desired_capacity(AutoScalingGroupName=GROUP, DesiredCapacity=0)
    assert submit(capsys, tmp_path, "--job-id", "run-2") == (0, "")  # the group now runs run-2 on 2 nodes
    boto3.client("logs").create_log_group(logGroupName=LOG_GROUP)
    rc, out, err = trainctl(capsys, "status", "run-1")
    assert (rc, err) == (0, "") and "\ndesired_capacity: -\n" in out
    assert out.endswith("\n\nno nodes: the group belongs to the current job run-2\n")
    rc = trainctl_main(["--json", "status", "--team", TEAM, "--cluster", CLUSTER, "run-1"])
    info = json.loads(capsys.readouterr().out)
    assert (rc, info["desired_capacity"], info["nodes"], info["group_job"]) == (0, None, [], "run-2")
    rc, out, _ = trainctl(capsys, "status", "run-2")
    assert rc == 0 and "\ndesired_capacity: 2\n" in out and len(out.split("\n\n")[1].splitlines()) == 1 + 2


LOG_GROUP = "/spot-training/default/main"


def ship(stream: str, *lines: tuple[int, str]) -> None:
    """Lines (milliseconds, message) as a node's agent ships them to its stream ``run-1/<instance>``."""
    logs = boto3.client("logs")
    if not logs.describe_log_streams(logGroupName=LOG_GROUP, logStreamNamePrefix=f"run-1/{stream}")["logStreams"]:
        logs.create_log_stream(logGroupName=LOG_GROUP, logStreamName=f"run-1/{stream}")
    events = [{"timestamp": ms, "message": message} for ms, message in lines]
    logs.put_log_events(logGroupName=LOG_GROUP, logStreamName=f"run-1/{stream}", logEvents=events)


def test_logs_follow_prints_a_line_another_node_shipped_late_once_and_nothing_twice(
    aws: None, capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert submit(capsys, tmp_path, "--job-id", "run-1") == (0, "")
    boto3.client("logs").create_log_group(logGroupName=LOG_GROUP)
    t0 = int(time.time() * 1000) - 600_000  # ms; CloudWatch refuses lines older than 14 days
    ship("i-a", (t0 + 1000, "a: step 1"), (t0 + 3000, "a: step 3"))
    ship("i-b", (t0 + 2000, "b: step 2"))
    polls: list[str] = []

    def between_polls(_: float) -> None:  # i-b ships a line of an earlier time than i-a's last, i-a one more
        polls.append("slept")
        ship("i-b", (t0 + 2500, "b: step 2.5"))
        ship("i-a", (t0 + 4000, "a: step 4"))

    monkeypatch.setattr("trainctl.cli.time.sleep", between_polls)
    states = iter(["RUNNING", "DONE"])
    monkeypatch.setattr("trainctl.cli.job_state", lambda *_: next(states))
    rc, out, err = trainctl(capsys, "logs", "run-1", "--follow")
    assert (rc, err, polls) == (0, "", ["slept"])
    printed = [line.split(" ", 1)[1] for line in out.splitlines()]  # without the time of day
    assert printed == [
        "i-a a: step 1", "i-b b: step 2", "i-a a: step 3",  # first poll
        "i-b b: step 2.5", "i-a a: step 4",  # second poll: only the new lines
    ]  # fmt: skip


def test_every_log_stream_is_read_past_the_first_page(aws: None) -> None:
    """DescribeLogStreams answers 50 streams a page: the others are on later pages."""
    boto3.client("logs").create_log_group(logGroupName=LOG_GROUP)
    t0 = int(time.time() * 1000) - 600_000  # ms; CloudWatch refuses lines older than 14 days
    for n in range(60):
        ship(f"i-{n:03d}", (t0 + n, f"line of node {n}"))
    client = client_factory("us-east-1")
    ref = jobs.find_cluster(client, TEAM, CLUSTER)
    assert sorted(message for _, _, message in jobs.log_events(client, ref, "run-1")) == sorted(
        f"line of node {n}" for n in range(60)
    )


def test_the_newest_plan_line_is_read_past_the_first_page(aws: None) -> None:
    """FilterLogEvents answers up to 10,000 events a page: the newest plan line is on the second."""
    boto3.client("logs").create_log_group(logGroupName=LOG_GROUP)
    client = client_factory("us-east-1")
    ref = jobs.find_cluster(client, TEAM, CLUSTER)
    t0 = int(time.time() * 1000) - 600_000  # ms
    plans = [(t0 + k, "plan: 100 steps") for k in range(10_000)] + [(t0 + 20_000, "plan: 250 steps")]
    ship("i-000", *plans[:5000])
    ship("i-000", *plans[5000:])
    assert jobs.planned_steps(client, ref, "run-1") == 250  # the newest plan, on the second page
