"""``trainctl submit`` refuses, before it uploads or scales anything, a job the node agent would refuse.

The agent checks the job when a node boots; a job it refuses would leave the group scaled up with every node
idle (and billed). AWS is moto in-process here: no server, no network.
"""

from __future__ import annotations

import json
import random
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Optional

import boto3
import pytest
from boto3.s3.transfer import TransferConfig
from botocore.exceptions import ClientError

from team_config.model import JobConfig
from team_config.naming import CLUSTER_TAG, TEAM_TAG, budget_name, parameter_path
from trainctl import cli, jobs
from trainctl.cli import _client_factory as client_factory
from trainctl.cli import main as trainctl_main

TEAM, CLUSTER, BUCKET, GROUP = "default", "main", "checkpoints", "main-group"
CURRENT = f"{parameter_path(TEAM, CLUSTER)}/current-job"


@pytest.fixture
def aws(mocked_aws: None) -> Iterator[None]:
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
        "nproc_per_node": 1,  # the stack writes the types' GPU count when the team file leaves it unset
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
        (("--checkpoint-interval-s", "-5"), "checkpoint_interval_s must be a number of at least 1 or null, got -5.0"),
        (("--checkpoint-interval-s", "inf"), "checkpoint_interval_s must be a number of at least 1 or null, got inf"),
        (
            ("--checkpoint-interval-s", "1e-300"),
            "checkpoint_interval_s must be a number of at least 1 or null, got 1e-300",
        ),  # else: submitted, a save at every step
        (("--job-id", "code"), "job_id 'code' is reserved: the code archives are under '<cluster>/code/'"),
        (("--job-id", "queue"), "job_id 'queue' is reserved: the queued jobs are under '<cluster>/queue/'"),
        (("--python", "python3"), "python must be an absolute path, got 'python3'"),
        (("--command", ""), "command must be a non-empty string, got ''"),  # else: the cluster's command, silently
    ],
)
def test_a_job_the_agent_would_refuse_is_refused_before_anything_starts(
    aws: None, capsys: pytest.CaptureFixture[str], tmp_path: Path, extra: tuple[str, ...], reason: str
) -> None:
    rc, err = submit(capsys, tmp_path, *extra)
    assert (rc, err) == (2, f"trainctl: error: the node agent would refuse this job: {reason}\n")
    assert state() == {"desired": 0, "objects": 0, "current job written": False}


def test_a_job_too_large_for_its_parameter_is_refused_before_anything_starts(
    aws: None, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """Refused before the code goes up: SSM would refuse the current-job parameter (4,096 bytes at most) after it."""
    command = "python train.py " + " ".join(f"--option-{i} {i}" for i in range(400))
    size = len(json.dumps({"job_id": "big", "code_key": "", "command": command}).encode())
    assert size > 4096
    rc, err = submit(capsys, tmp_path, "--command", command, "--job-id", "big")
    assert rc == 2
    assert err.startswith("trainctl: error: the job takes ") and err.endswith(
        " bytes as JSON, above the 4,096 of its SSM parameter: shorten --command (long arguments go in a file of "
        "your code)\n"
    )
    assert state() == {"desired": 0, "objects": 0, "current job written": False}


def test_a_good_job_is_submitted(aws: None, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    rc, err = submit(capsys, tmp_path, "--command", "python train.py --epochs 3", "--job-id", "run-1")
    assert (rc, err) == (0, "")
    assert state() == {"desired": 2, "objects": 1, "current job written": True}
    current = json.loads(boto3.client("ssm").get_parameter(Name=CURRENT)["Parameter"]["Value"])
    assert (current["job_id"], current["command"], current["nodes"]) == ("run-1", "python train.py --epochs 3", 2)
    assert suspended() == ["AZRebalance"]  # no zone rebalancing that would end a training node without notice


def suspended() -> list[str]:
    group = boto3.client("autoscaling").describe_auto_scaling_groups(AutoScalingGroupNames=[GROUP])
    return sorted(p["ProcessName"] for p in group["AutoScalingGroups"][0]["SuspendedProcesses"])


class NoSuspend:
    """The real clients, but Auto Scaling refuses SuspendProcesses (an operator without that permission)."""

    def __init__(self, region: Any = None) -> None:
        self.real = client_factory("us-east-1")

    def __call__(self, service: str) -> Any:
        client = self.real(service)
        if service == "autoscaling":

            def denied(**_: Any) -> Any:
                error = {"Code": "AccessDenied", "Message": "not authorized to perform autoscaling:SuspendProcesses"}
                raise ClientError({"Error": error}, "SuspendProcesses")

            client.suspend_processes = denied
        return client


def test_an_operator_who_may_not_suspend_processes_is_told_and_the_job_goes_on(
    aws: None, capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("trainctl.cli._client_factory", NoSuspend)
    rc, err = submit(capsys, tmp_path, "--job-id", "run-1")
    assert (rc, err) == (
        0,
        f"could not suspend AZRebalance on {GROUP} (AccessDenied): across several zones Auto Scaling may end a node "
        "to even them out, with no spot notice; allow autoscaling:SuspendProcesses on the group\n",
    )
    assert state()["desired"] == 2 and suspended() == []


def trainctl(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = trainctl_main([argv[0], "--team", TEAM, "--cluster", CLUSTER, *argv[1:]])
    captured = capsys.readouterr()
    return rc, captured.out, captured.err


def test_a_job_submitted_over_a_running_one_waits_in_the_queue(
    aws: None, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """Nodes read the job when they boot: a second job would share the group with the first, and the first to end
    would scale the group to 0 under the other. It is queued instead, its code uploaded under its own id."""
    assert submit(capsys, tmp_path, "--job-id", "run-1") == (0, "")
    assert trainctl(capsys, "list")[1].split()[3:5] == ["run-1", "RUNNING"]
    rc, err = submit(capsys, tmp_path, "--job-id", "run-2")
    assert (rc, err) == (
        0,
        f"job run-2 queued at position 1: cluster {TEAM}/{CLUSTER} is busy (its group is at 2 with 2 node(s) for "
        f"job run-1 (RUNNING)); it starts when the jobs before it have ended (trainctl queue --team {TEAM} "
        f"--cluster {CLUSTER})\n",
    )
    assert state() == {"desired": 2, "objects": 3, "current job written": True}  # 2 archives, 1 queue entry
    assert current_job()["job_id"] == "run-1"
    rc, out, _ = trainctl(capsys, "queue")
    assert (rc, out.split()[:4], out.split()[4:7]) == (
        0,
        ["POSITION", "JOB_ID", "NODES", "SUBMITTED"],
        ["1", "run-2", "2"],
    )
    # Its nodes went without a marker (the group set to 0 by hand): nothing will end run-1, so the next submit,
    # which queues behind run-2, starts the queue's head itself.
    boto3.client("autoscaling").set_desired_capacity(AutoScalingGroupName=GROUP, DesiredCapacity=0)
    rc, err = submit(capsys, tmp_path, "--job-id", "run-3", "--nodes", "1")
    assert (rc, err.split(":")[0]) == (0, "job run-3 queued at position 1")
    listed = [line.split()[:2] for line in trainctl(capsys, "list")[1].splitlines()[1:]]
    assert listed == [["run-1", "UNFINISHED"], ["run-2", "RUNNING"], ["run-3", "QUEUED"]]
    assert current_job()["job_id"] == "run-2"
    assert (
        trainctl(capsys, "stop", "run-1")[1]
        == "job run-1 is not running (UNFINISHED: no node runs it); nothing to stop\nqueue: 1 job(s) stay queued; "
        "the next, run-3, starts once this job has stopped (trainctl stop --clear-queue also empties the queue)\n"
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
    for user in ("trainctl.job_state", "trainctl.stop"):  # moto launches at once
        monkeypatch.setattr(f"{user}.group", lambda c, r: dict(real_group(c, r), Instances=[]))
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

    def between_polls(_: float) -> None:
        polls.append("slept")
        if len(polls) == 1:  # i-b ships a line of an earlier time than i-a's last, i-a one more
            ship("i-b", (t0 + 2500, "b: step 2.5"))
            ship("i-a", (t0 + 4000, "a: step 4"))
        else:  # the agent's last flush, after its DONE marker
            ship("i-a", (t0 + 5000, "a: job DONE"))

    monkeypatch.setattr("trainctl.job_logs.time.sleep", between_polls)
    states = iter(["RUNNING", "DONE"])
    monkeypatch.setattr("trainctl.job_logs.job_state", lambda *_: next(states))
    fetched: list[int] = []  # events each GetLogEvents answered
    real = cli._client_factory

    def counting(region: Any) -> Any:
        factory = real(region)
        factory("logs").meta.events.register(
            "after-call.logs.GetLogEvents", lambda parsed, **_: fetched.append(len(parsed["events"]))
        )
        return factory

    monkeypatch.setattr(cli, "_client_factory", counting)
    rc, out, err = trainctl(capsys, "logs", "run-1", "--follow")
    assert (rc, err, polls) == (0, "", ["slept", "slept"])
    assert sum(fetched) == 6  # each line read once: a poll reads on from where the one before stopped
    printed = [line.split(" ", 1)[1] for line in out.splitlines()]  # without the time of day
    assert printed == [
        "i-a a: step 1", "i-b b: step 2", "i-a a: step 3",  # first poll
        "i-b b: step 2.5", "i-a a: step 4",  # second poll: only the new lines
        "i-a a: job DONE",  # once the job ended, one more read (for the lines shipped with the end)
    ]  # fmt: skip


def test_a_quiet_stretch_in_a_log_stream_does_not_end_its_reading(aws: None) -> None:
    """CloudWatch pages GetLogEvents by time: a quiet stretch of a stream (a data download, a replacement booting
    later) is a page without events and with a new token, and lines come after it; only the token coming back
    ends the stream (as moto answers at the end). Ended at the first empty page, `logs`, `--follow` and `cost`
    would lose every line after the gap."""
    boto3.client("logs").create_log_group(logGroupName=LOG_GROUP)
    t0 = int(time.time() * 1000) - 600_000  # ms
    ship("i-a", (t0, "before the gap"), (t0 + 1, "after the gap"))
    client = client_factory("us-east-1")
    ref = jobs.find_cluster(client, TEAM, CLUSTER)
    logs = client("logs")
    real, tokens = logs.get_log_events, dict[str, str]()

    def with_a_gap(**kwargs: Any) -> Any:  # a line a page; after the first, a page for the quiet stretch
        token = kwargs.pop("nextToken", None)
        if token == "quiet":
            return {"events": [], "nextForwardToken": "gap"}
        page = real(**kwargs, limit=1, **({"nextToken": tokens.get(token, token)} if token else {}))
        if token is None:
            tokens["gap"], page["nextForwardToken"] = page["nextForwardToken"], "quiet"
        return page

    logs.get_log_events = with_a_gap
    lines = jobs.stream_events(lambda service: logs if service == "logs" else client(service), ref, "run-1")
    assert [message for _, message in lines["run-1/i-a"]] == ["before the gap", "after the gap"]


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


def test_of_two_racing_submits_one_wins_and_the_other_takes_itself_back_into_the_queue(
    aws: None, capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both find the group idle; another submit writes the current-job parameter (and scales the group) between
    this one's check and its write. This one does not write it: were both to, the parameter would name the last
    writer, the first job's nodes would boot into the second job, and the first job would never run. It goes into
    the queue behind the winner instead: neither job is lost."""
    assert submit(capsys, tmp_path, "--job-id", "run-0") == (0, "")  # a parameter with a version history
    boto3.client("autoscaling").set_desired_capacity(AutoScalingGroupName=GROUP, DesiredCapacity=0)
    client = client_factory("us-east-1")
    ref = jobs.find_cluster(client, TEAM, CLUSTER)
    real, raced = jobs.job_exists, list[str]()

    def other_submit_meanwhile(c: Any, r: Any, job_id: str) -> bool:  # after the idle check, before the writes
        if job_id == "loser" and not raced:
            raced.append(jobs.submit(client, ref, tmp_path, command="python train.py", nodes=1, job_id="winner"))
        return real(c, r, job_id)

    monkeypatch.setattr("trainctl.submit.job_exists", other_submit_meanwhile)
    rc, err = submit(capsys, tmp_path, "--job-id", "loser")
    assert raced == ["winner"]
    assert (rc, err) == (
        0,
        f"job loser queued at position 1: cluster {TEAM}/{CLUSTER} is busy (another submit started job winner "
        f"first); it starts when the jobs before it have ended (trainctl queue --team {TEAM} --cluster {CLUSTER})\n",
    )
    assert current_job()["job_id"] == "winner"
    # the loser saw the winner's write before its own and wrote nothing: a node booting into the winner's job
    # never read the loser's
    history = boto3.client("ssm").get_parameter_history(Name=CURRENT)["Parameters"]
    assert [json.loads(h["Value"])["job_id"] for h in history] == ["run-0", "winner"]
    assert state()["desired"] == 1  # the winner's --nodes 1, not the loser's 2
    keys = [o["Key"] for o in boto3.client("s3").list_objects_v2(Bucket=BUCKET)["Contents"]]
    assert keys == [
        f"{CLUSTER}/code/loser.tar.gz",
        f"{CLUSTER}/code/run-0.tar.gz",
        f"{CLUSTER}/code/winner.tar.gz",
        f"{CLUSTER}/queue/loser.json",
    ]


def test_of_two_submits_of_the_same_job_id_the_loser_leaves_the_winners_objects(
    aws: None, capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A retried CI step submits job "same" twice at once; both pass the job-id check before either writes. The
    loser's clean-up leaves the code archive under the shared key: deleted, the winner's nodes would boot, billed,
    into a job without code, and status would say the job does not exist."""
    client = client_factory("us-east-1")
    ref = jobs.find_cluster(client, TEAM, CLUSTER)
    real, raced = jobs.upload, list[str]()

    def other_submit_meanwhile(*args: Any, **kwargs: Any) -> None:  # the loser's upload: the winner is done first
        if not raced:
            raced.append("racing")  # the winner's own upload goes straight through
            raced[0] = jobs.submit(client, ref, tmp_path, command="python train.py", nodes=1, job_id="same")
        real(*args, **kwargs)

    monkeypatch.setattr("trainctl.submit.upload", other_submit_meanwhile)
    rc, err = submit(capsys, tmp_path, "--job-id", "same")
    assert raced == ["same"]
    assert (rc, err) == (
        2,
        f"trainctl: error: another submit of job same to {TEAM}/{CLUSTER} got there first; the objects under that id "
        "are left as they are (the same keys as its: its code archive is whichever upload came last, and checkpoints "
        f"this one copied with --resume-from stay) (trainctl status --team {TEAM} --cluster {CLUSTER})\n",
    )
    assert current_job()["job_id"] == "same"
    keys = [o["Key"] for o in boto3.client("s3").list_objects_v2(Bucket=BUCKET)["Contents"]]
    assert keys == [f"{CLUSTER}/code/same.tar.gz"]
    assert state()["desired"] == 1


def test_of_two_submits_writing_at_once_the_later_write_is_taken_back_and_the_first_stays(
    aws: None, capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The other submit writes the parameter after this one's last read and before its own write: SSM's version
    numbers tell which write came first. The later one puts back the first one's value and goes into the queue; a
    submit that was not beaten is not touched (its nodes may be booting into it)."""
    assert submit(capsys, tmp_path, "--job-id", "run-0") == (0, "")
    boto3.client("autoscaling").set_desired_capacity(AutoScalingGroupName=GROUP, DesiredCapacity=0)
    real, writes = jobs.set_current_job, list[str]()

    def first_write_elsewhere(c: Any, r: Any, value: Optional[str]) -> Optional[int]:
        if value is not None and json.loads(value)["job_id"] == "loser" and not writes:
            winner = dict(json.loads(value), job_id="winner")
            writes.append(str(real(c, r, json.dumps(winner))))  # the other submit's write lands first
        return real(c, r, value)

    monkeypatch.setattr("trainctl.submit.set_current_job", first_write_elsewhere)
    rc, err = submit(capsys, tmp_path, "--job-id", "loser")
    assert writes and rc == 0
    assert err.startswith("job loser queued at position 1: cluster default/main is busy (another submit started job ")
    assert current_job()["job_id"] == "winner"  # the winner wrote its value again over the loser's later write
    history = boto3.client("ssm").get_parameter_history(Name=CURRENT)["Parameters"]
    assert [json.loads(h["Value"])["job_id"] for h in history][-3:] == ["winner", "loser", "winner"]
    assert state()["desired"] == 0  # the loser scaled nothing
    rc, out, _ = trainctl(capsys, "queue")
    assert (rc, [line.split()[:3] for line in out.splitlines()[1:]]) == (0, [["1", "loser", "2"]])


@pytest.mark.parametrize("case", ["typo", "symlink", "ignored"])
def test_a_command_whose_script_is_not_in_the_archive_is_refused_before_anything_starts(
    aws: None, capsys: pytest.CaptureFixture[str], tmp_path: Path, case: str
) -> None:
    """A billed node would boot, unpack the code and fail at once."""
    code, elsewhere = tmp_path / "code", tmp_path / "elsewhere"
    code.mkdir()
    elsewhere.mkdir()
    script = "nothere.py" if case == "typo" else "train.py"
    (code / "helper.py").write_text("X = 1\n")
    if case == "symlink":  # pack_code leaves symbolic links out
        (elsewhere / "train.py").write_text("print('training')\n")
        (code / "train.py").symlink_to(elsewhere / "train.py")
    elif case == "ignored":
        (code / "train.py").write_text("print('training')\n")
        (code / ".gitignore").write_text("*.py\n")
    argv = ["submit", "--team", TEAM, "--cluster", CLUSTER, "--code", str(code), "--command", f"python ./{script}"]
    rc = trainctl_main(argv)
    assert (rc, capsys.readouterr().err) == (
        2,
        f"trainctl: error: the command's script ./{script} is not in the code archive of {code} (not there, left "
        "out by .gitignore or always skipped, or a symbolic link: links are left out)\n",
    )
    assert state() == {"desired": 0, "objects": 0, "current job written": False}


def test_a_module_command_and_a_script_in_a_folder_are_accepted(
    aws: None, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "train.py").write_text("print('training')\n")
    argv = ["submit", "--team", TEAM, "--cluster", CLUSTER, "--code", str(tmp_path), "--nodes", "1", "--command"]
    assert trainctl_main([*argv, "python src/train.py --epochs 1", "--job-id", "run-1"]) == 0
    boto3.client("autoscaling").set_desired_capacity(AutoScalingGroupName=GROUP, DesiredCapacity=0)
    assert trainctl_main([*argv, "python -m src.train", "--job-id", "run-2"]) == 0  # a module is not looked for
    assert capsys.readouterr().err == ""


def test_the_code_goes_up_from_a_temporary_file_in_parts_and_a_large_one_is_warned_about(
    aws: None, capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The archive is built on disk, not in memory, and sent in parts (one PutObject takes at most 5 GB)."""
    code, temp = tmp_path / "code", tmp_path / "temp"
    code.mkdir()
    temp.mkdir()
    (code / "weights.bin").write_bytes(random.Random(0).randbytes(6 << 20))  # does not compress
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    parts = TransferConfig(multipart_threshold=5 << 20, multipart_chunksize=5 << 20)
    monkeypatch.setattr("trainctl.submit.TRANSFER", parts)
    monkeypatch.setattr("trainctl.submit.LARGE_CODE_BYTES", 1 << 20)
    rc, err = submit(capsys, code, "--job-id", "run-1")
    assert (rc, err) == (
        0,
        f"the code archive of {code} is 6 MiB (above 1 MiB): data belongs in S3 (the job reads it from there), not "
        "in --code\n",
    )
    uploaded = boto3.client("s3").head_object(Bucket=BUCKET, Key=f"{CLUSTER}/code/run-1.tar.gz")
    assert uploaded["ETag"].endswith('-2"')  # two parts: a multipart upload
    assert list(temp.iterdir()) == []  # the archive's temporary folder is gone


class DeniedBudgets:
    """The real clients, but AWS Budgets answers AccessDenied (an operator without budgets:ViewBudget)."""

    def __init__(self, region: Any = None) -> None:
        self.real = client_factory("us-east-1")

    def __call__(self, service: str) -> Any:
        client = self.real(service)
        if service == "budgets":

            def denied(model: Any, **_: Any) -> Any:  # every Budgets call, as the API answers it
                error = {"Code": "AccessDeniedException", "Message": "not authorized to perform budgets:ViewBudget"}
                raise ClientError({"Error": error}, model.name)

            client.meta.events.register("before-call.budgets", denied)
        return client


def test_without_budgets_view_budget_the_budget_is_unknown_and_the_job_goes_on(
    aws: None, capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("trainctl.cli._client_factory", DeniedBudgets)
    rc, err = submit(capsys, tmp_path, "--job-id", "run-1")
    assert (rc, err) == (0, f"budget of team {TEAM}: unknown (no budgets:ViewBudget); not checked\n")
    boto3.client("logs").create_log_group(logGroupName=LOG_GROUP)
    rc, out, err = trainctl(capsys, "status", "run-1")
    assert (rc, err) == (0, "") and "\nbudget: unknown (no budgets:ViewBudget)\n" in out
    rc = trainctl_main(["--json", "status", "--team", TEAM, "--cluster", CLUSTER, "run-1"])
    assert (rc, json.loads(capsys.readouterr().out)["budget"]) == (0, "unknown (no budgets:ViewBudget)")


def test_a_readable_spent_budget_still_refuses_a_job(
    aws: None, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    account = boto3.client("sts").get_caller_identity()["Account"]
    boto3.client("budgets").create_budget(
        AccountId=account,
        Budget={
            "BudgetName": budget_name(TEAM, [], 80),
            "BudgetLimit": {"Amount": "100", "Unit": "USD"},
            "TimeUnit": "MONTHLY",
            "BudgetType": "COST",
            "CalculatedSpend": {"ActualSpend": {"Amount": "120", "Unit": "USD"}},
        },
    )
    rc, err = submit(capsys, tmp_path)
    assert (rc, err) == (
        2,
        f"trainctl: error: team {TEAM} has spent 120.00 of its 100.00 USD budget this month "
        f"({budget_name(TEAM, [], 80)}); raise budget.usd_per_month in its team file or wait for the next month\n",
    )
    assert state() == {"desired": 0, "objects": 0, "current job written": False}


class SlowCodeUpload(FailingScale):
    """The real clients, but S3 answers SlowDown to the code archive's PutObject."""

    def __init__(self, region: Any = None) -> None:
        self.real = client_factory("us-east-1")

    def __call__(self, service: str) -> Any:
        client = self.real(service)
        if service == "s3" and not hasattr(client, "real_put_object"):
            client.real_put_object = client.put_object

            def put_object(**kwargs: Any) -> Any:
                if "/code/" in kwargs["Key"]:
                    error = {"Code": "SlowDown", "Message": "Please reduce your request rate."}
                    raise ClientError({"Error": error}, "PutObject")
                return client.real_put_object(**kwargs)

            client.put_object = put_object
        return client


def test_a_code_upload_s3_refuses_is_one_line_and_leaves_nothing_behind(
    aws: None, capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """boto3's upload_file wraps S3's answer in S3UploadFailedError (no ClientError): it must still be one line."""
    monkeypatch.setattr("trainctl.cli._client_factory", SlowCodeUpload)
    rc, err = submit(capsys, tmp_path, "--job-id", "run-1")
    assert (rc, err) == (
        3,
        "trainctl: error: AWS call failed: An error occurred (SlowDown) when calling the PutObject operation: "
        "Please reduce your request rate.\n",
    )
    assert state() == {"desired": 0, "objects": 0, "current job written": False}


def test_a_checkpoint_interval_above_half_the_stall_timeout_is_refused_before_anything_starts(
    aws: None, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """The team file refuses stall_timeout_s < 2 x checkpoint_interval_s; an override at submit must not get round
    it (the watchdog would end, as hung, a node whose only progress is its checkpoints)."""
    ssm, name = boto3.client("ssm"), f"{parameter_path(TEAM, CLUSTER)}/job-spec"
    spec = json.loads(ssm.get_parameter(Name=name)["Parameter"]["Value"])
    ssm.put_parameter(Name=name, Value=json.dumps({**spec, "stall_timeout_s": 600}), Type="String", Overwrite=True)
    rc, err = submit(capsys, tmp_path, "--job-id", "run-1", "--checkpoint-interval-s", "400")
    assert (rc, err) == (
        2,
        "trainctl: error: --checkpoint-interval-s 400 is more than half the cluster's job.stall_timeout_s 600: a "
        "node whose only sign of progress is its checkpoints would be ended as hung between two; use at most 300\n",
    )
    assert state() == {"desired": 0, "objects": 0, "current job written": False}
    assert submit(capsys, tmp_path, "--job-id", "run-2", "--checkpoint-interval-s", "300") == (0, "")
