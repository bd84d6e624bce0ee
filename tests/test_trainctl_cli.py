"""``trainctl`` status, stop, logs and review against moto in-process (no server, no network)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError

from tests.test_trainctl_submit import CLUSTER, CURRENT, LOG_GROUP, TEAM, ship, submit, trainctl
from tests.test_trainctl_submit import aws as aws  # the fixture: moto with a deployed cluster
from trainctl import assembly, jobs, review
from trainctl.cli import _client_factory as client_factory
from trainctl.cli import main as trainctl_main

REPO = Path(__file__).resolve().parents[1]


def now_ms() -> int:
    return int(time.time() * 1000)  # CloudWatch refuses lines older than 14 days


def started(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> jobs.ClusterRef:
    """Job run-1 submitted (moto launches its nodes at once: RUNNING), the log group there."""
    assert submit(capsys, tmp_path, "--job-id", "run-1") == (0, "")
    boto3.client("logs").create_log_group(logGroupName=LOG_GROUP)
    return jobs.find_cluster(client_factory("us-east-1"), TEAM, CLUSTER)


def json_status(capsys: pytest.CaptureFixture[str], job: str = "run-1") -> dict[str, Any]:
    assert trainctl_main(["--json", "status", "--team", TEAM, "--cluster", CLUSTER, job]) == 0
    return dict(json.loads(capsys.readouterr().out))


def test_status_shows_why_a_job_failed(aws: None, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """The node agent writes FAILED with a reason and its docs promise ``trainctl status`` shows it."""
    ref = started(capsys, tmp_path)
    rc, out, _ = trainctl(capsys, "status", "run-1")
    assert rc == 0 and "reason" not in out  # only a FAILED job has one
    failed = f"{ref.job_prefix('run-1')}FAILED"
    boto3.client("s3").put_object(Bucket=ref.bucket, Key=failed, Body=b"<html>")  # not JSON: FAILED all the same
    assert (json_status(capsys)["state"], json_status(capsys)["reason"]) == (
        "FAILED",
        "(the FAILED marker gives no reason)",
    )
    body = {"reason": "restore: S3 did not answer 3 times", "time": 1.0}
    boto3.client("s3").put_object(Bucket=ref.bucket, Key=failed, Body=json.dumps(body))
    rc, out, err = trainctl(capsys, "status", "run-1")
    assert (rc, err) == (0, "") and "\nstate: FAILED\nreason: restore: S3 did not answer 3 times\n" in out
    info = json_status(capsys)
    assert (info["state"], info["reason"]) == ("FAILED", "restore: S3 did not answer 3 times")


def test_eta_counts_only_checkpoints_of_the_current_run(
    aws: None, capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A replacement booted between the last two checkpoints: their pace holds the restart, not training (at that
    pace, a job 60 s from its end would show 10045 s left)."""
    ref = started(capsys, tmp_path)
    ship("i-a", (now_ms() - 60_000, "plan: 200 steps"))
    s3, boot = boto3.client("s3"), f"{ref.job_prefix('run-1')}nodes/i-b/boot"
    s3.put_object(Bucket=ref.bucket, Key=boot, Body=b"{}")
    booted = s3.head_object(Bucket=ref.bucket, Key=boot)["LastModified"].timestamp()
    done = [jobs.Checkpoint(100, 1, 1, booted - 600), jobs.Checkpoint(110, 1, 1, booted - 500)]  # pre-boot: 10 s/step
    done.append(jobs.Checkpoint(111, 1, 1, booted + 5))  # the replacement's first: 505 s after the one before
    monkeypatch.setattr("trainctl.status.checkpoints", lambda *_: list(done))
    info = json_status(capsys)
    assert (info["state"], info["planned_steps"], info["eta_s"]) == ("RUNNING", 200, None)
    rc, out, _ = trainctl(capsys, "status", "run-1")
    assert rc == 0
    assert "\neta_s: unknown (fewer than 2 checkpoints since the last node boot, restart or interruption)\n" in out
    done.append(jobs.Checkpoint(121, 1, 1, booted + 25))  # 2 s/step since the boot
    assert json_status(capsys)["eta_s"] == (200 - 121) * 2


def test_flat_checkpoints_give_no_step_and_no_time_left(
    aws: None, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """The agent numbers a flat checkpoint (the script's own files) 1, 2, 3 ...: no training step. Read as a step,
    it would give a time left of 69 days for a job 2 h from its end (10,000 steps planned, two snapshots 600 s
    apart)."""
    ref = started(capsys, tmp_path)
    ship("i-a", (now_ms() - 60_000, "plan: 10000 steps"))
    for snapshot in (1, 2):  # as the agent writes them (spot_training.agent.checkpoint_store.CheckpointStore.upload)
        manifest = {"version": 1, "step": snapshot, "layout": "flat", "files": {"model.pt": {"size": 1}}}
        key = f"{ref.job_prefix('run-1')}{jobs.CHECKPOINT_FOLDER}/{snapshot}/{jobs.MANIFEST}"
        boto3.client("s3").put_object(Bucket=ref.bucket, Key=key, Body=json.dumps(manifest))
    info = json_status(capsys)
    assert (info["planned_steps"], info["eta_s"], info["last_checkpoint_step"]) == (10000, None, None)
    assert info["last_flat_checkpoint"] == 2
    rc, out, _ = trainctl(capsys, "status", "run-1")
    assert rc == 0 and "\nlast_flat_checkpoint: 2\n" in out
    assert "\neta_s: unknown (flat checkpoints: the agent cannot tell their step)\n" in out


def test_cost_counts_the_nodes_that_never_told(aws: None, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """Nodes whose user data or agent failed early write no boot marker and ship no log line, and are billed all the
    same: here no node has a marker or a line, and the cost still counts the instances."""
    ref = started(capsys, tmp_path)
    members = sorted(m["InstanceId"] for m in jobs.group(client_factory("us-east-1"), ref)["Instances"])
    assert members
    assert trainctl_main(["--json", "cost", "--team", TEAM, "--cluster", CLUSTER, "run-1"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert sorted(n["instance"] for n in info["nodes"]) == members
    assert {n["timed_by"] for n in info["nodes"]} == {"EC2 launch time"} and info["total_usd"] > 0


def test_only_spot_notices_count_as_interruptions(
    aws: None, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """A node also writes ``leaving`` when its group ends it (capacity rebalancing, a scale-in, ``stop --force``):
    only a node that left on a spot notice counts as an interruption."""
    ref = started(capsys, tmp_path)
    s3 = boto3.client("s3")
    notices = {
        "i-a": 'spot interruption notice {"action": "terminate", "time": "2026-11-25T10:00:00Z"}',
        "i-b": "its Auto Scaling group is ending this instance (lifecycle hook spot-training-drain)",
    }
    for instance, notice in notices.items():
        body = json.dumps({"notice": notice, "trainer": True})
        s3.put_object(Bucket=ref.bucket, Key=f"{ref.job_prefix('run-1')}nodes/{instance}/leaving", Body=body)
    assert json_status(capsys)["interruptions"] == 1


def test_status_just_after_a_scale_up_shows_the_nodes(
    aws: None, capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """EC2 is eventually consistent: DescribeInstances may answer InvalidInstanceID.NotFound for an instance the group
    just launched. Status shows the node without its market, not an AWS error (exit 3)."""
    started(capsys, tmp_path)
    real = client_factory("us-east-1")

    def not_yet(service: str) -> Any:
        client = real(service)
        if service == "ec2":

            def unknown(**_: Any) -> None:
                error = {"Code": "InvalidInstanceID.NotFound", "Message": "The instance ID does not exist"}
                raise ClientError({"Error": error}, "DescribeInstances")

            client.meta.events.register("before-call.ec2.DescribeInstances", unknown)
        return client

    monkeypatch.setattr("trainctl.cli._client_factory", lambda *_: not_yet)
    info = json_status(capsys)
    assert info["state"] == "RUNNING" and info["nodes"] and all(n["instance"] for n in info["nodes"])
    # one unknown id fails the whole DescribeInstances (moto answers as EC2): the others are still described
    known = [n["instance"] for n in info["nodes"]]
    fresh = client_factory("us-east-1")  # without the stub above
    assert set(jobs.described(fresh, [*known, "i-0123456789abcdef0"])) == set(known)


def test_planned_steps_are_the_jobs_own(aws: None, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """The emulator's FilterLogEvents (moto) ignores logStreamNamePrefix: another job's newer plan line was read."""
    ref = started(capsys, tmp_path)
    t0 = now_ms() - 60_000
    ship("i-a", (t0, "plan: 100 steps"))
    logs = boto3.client("logs")
    logs.create_log_stream(logGroupName=LOG_GROUP, logStreamName="run-2/i-b")
    event = {"timestamp": t0 + 1000, "message": "plan: 999 steps"}
    logs.put_log_events(logGroupName=LOG_GROUP, logStreamName="run-2/i-b", logEvents=[event])
    assert jobs.planned_steps(client_factory("us-east-1"), ref, "run-1") == 100


def test_a_checkpoint_pruned_while_listing_is_listed_again(
    aws: None, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """The agent makes checkpoint 30 durable and prunes 10 between trainctl's listing and its read of 10's manifest.
    The listing is taken again: one listing alone would give [20], and the ETA would be unknown (fewer than 2)."""
    ref = started(capsys, tmp_path)
    s3 = boto3.client("s3")
    folder = f"{ref.job_prefix('run-1')}{jobs.CHECKPOINT_FOLDER}"

    def save(step: int) -> str:
        key = f"{folder}/{step}/{jobs.MANIFEST}"
        s3.put_object(Bucket=ref.bucket, Key=key, Body=json.dumps({"files": {"model.pt": {"size": step}}}))
        return key

    oldest = save(10)
    save(20)
    real_get = s3.get_object

    def get_object(**kwargs: Any) -> Any:
        if kwargs["Key"] == oldest and not pruned:
            save(30)
            s3.delete_object(Bucket=ref.bucket, Key=oldest)
            pruned.append(oldest)
        return real_get(**kwargs)

    pruned: list[str] = []
    s3.get_object = get_object
    found = jobs.checkpoints(lambda _: s3, ref, "run-1")
    assert pruned == [oldest]
    assert [(c.step, c.size_bytes) for c in found] == [(20, 20), (30, 30)]


def test_a_current_job_parameter_that_is_not_a_job_is_one_line(
    aws: None, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    started(capsys, tmp_path)
    boto3.client("ssm").put_parameter(Name=CURRENT, Value="<html>", Type="String", Overwrite=True)
    for argv in (("status",), ("status", "run-1"), ("list",)):
        try:
            rc, out, err = trainctl(capsys, *argv)
        except ValueError as exc:  # a JSONDecodeError would be a traceback
            rc, out, err = -1, "", repr(exc)
        assert (rc, out, err) == (
            2,
            "",
            f"trainctl: error: SSM parameter {CURRENT} is not a job trainctl submitted (a JSON object with a "
            f"job_id): '<html>'; with the group at 0, the next submit replaces it (or: aws ssm delete-parameter "
            f"--name {CURRENT})\n",
        )


def test_ctrl_c_during_logs_follow_exits_130_quietly(
    aws: None, capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    started(capsys, tmp_path)
    ship("i-a", (now_ms() - 1000, "step 1"))

    def ctrl_c(_: float) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr("trainctl.job_logs.time.sleep", ctrl_c)
    try:
        rc: Any = trainctl_main(["logs", "--team", TEAM, "--cluster", CLUSTER, "run-1", "--follow"])
    except KeyboardInterrupt:  # escaping: a traceback
        rc = "KeyboardInterrupt"
    captured = capsys.readouterr()
    assert (rc, captured.err) == (130, "")
    assert captured.out.endswith(" i-a step 1\n")


def test_a_repeated_stop_does_not_rewrite_the_request(
    aws: None, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """The budget guard forces the group to 0 once the stop, timed by S3's LastModified of STOP, is overdue: a
    rewrite would postpone it."""
    ref = started(capsys, tmp_path)
    rc, out, _ = trainctl(capsys, "stop", "run-1")
    assert (rc, out) == (0, "job run-1: stop requested; the nodes save a final checkpoint, then the group goes to 0\n")
    s3, key = boto3.client("s3"), f"{ref.job_prefix('run-1')}STOP"
    first = s3.get_object(Bucket=ref.bucket, Key=key)
    asked = first["LastModified"].strftime("%Y-%m-%d %H:%M:%S UTC")
    rc, out, err = trainctl(capsys, "stop", "run-1")
    assert (rc, out, err) == (
        0,
        f"job run-1: stop already requested at {asked}; not asked again (the nodes are saving a final checkpoint; "
        "if none answers, `trainctl stop --force` sets the group to 0 now)\n",
        "",
    )
    again = s3.get_object(Bucket=ref.bucket, Key=key)
    assert (again["ETag"], again["Body"].read()) == (first["ETag"], first["Body"].read())


def test_a_forced_stop_sets_the_group_to_0_when_no_agent_answers(
    aws: None, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """Nodes whose agents died (an OOM kill, a hang) never read STOP: ``--force`` sets the group to 0 even though
    the stop was asked already (else the group runs on, billed). The request stays as it was."""
    ref = started(capsys, tmp_path)
    trainctl(capsys, "stop", "run-1")
    s3, key = boto3.client("s3"), f"{ref.job_prefix('run-1')}STOP"
    first = s3.get_object(Bucket=ref.bucket, Key=key)
    assert jobs.desired_capacity(client_factory("us-east-1"), ref) > 0
    rc, out, err = trainctl(capsys, "stop", "run-1", "--force")
    assert (rc, err) == (0, "")
    assert out == (
        "job run-1: group set to 0 now; nodes whose agents answer save a final checkpoint as on a spot notice (at "
        "most the drain hook's 300 s), the others are terminated\n"
    )
    assert jobs.desired_capacity(client_factory("us-east-1"), ref) == 0
    assert s3.get_object(Bucket=ref.bucket, Key=key)["ETag"] == first["ETag"]  # the guard's timing is kept
    # No agent wrote STOPPED: the stop request says it, also once a later job is the cluster's current one
    # (not UNFINISHED).
    client = client_factory("us-east-1")
    boto3.client("autoscaling").update_auto_scaling_group(AutoScalingGroupName=ref.group, MinSize=0)
    for instance in jobs.group(client, ref)["Instances"]:
        boto3.client("autoscaling").terminate_instance_in_auto_scaling_group(
            InstanceId=instance["InstanceId"], ShouldDecrementDesiredCapacity=True
        )
    assert jobs.job_state(client, ref, "run-1") == "STOPPED"
    assert submit(capsys, tmp_path, "--job-id", "run-2") == (0, "")
    assert jobs.job_state(client, ref, "run-1") == "STOPPED"


def test_review_removes_the_assembly_it_synthesized(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No run leaves its cloud assembly (about 0.5 MB) in /tmp/trainctl-review-*."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    read: list[bool] = []

    def synthesize(outdir: Path, teams_dir: Any = None) -> Path:
        (outdir / "manifest.json").write_text("{}")
        return outdir

    def load_assembly(directory: Path) -> dict[str, Any]:
        read.append((directory / "manifest.json").is_file())
        return {}

    monkeypatch.setattr(assembly, "synthesize", synthesize)
    monkeypatch.setattr(assembly, "load_assembly", load_assembly)
    monkeypatch.setattr(review, "summary", lambda *_: "## summary\n")
    assert trainctl_main(["review"]) == 0
    assert (capsys.readouterr().out, read) == ("## summary\n", [True])
    assert list(tmp_path.iterdir()) == []


JSII_SILENCE = ("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "JSII_SILENCE_WARNING_DEPRECATED_NODE_VERSION")
LOAD_CDK_APP = f"""
import os
from trainctl import assembly
assembly.load_cdk_app()
print(*(os.environ[name] for name in {JSII_SILENCE}))
"""


def test_review_silences_jsiis_node_banner_unless_told_otherwise() -> None:
    """The Makefile exports both JSII_SILENCE_* variables for its own commands; trainctl runs without make too (a
    console script), so the review sets them before aws_cdk starts jsii (else every `trainctl review` prints jsii's
    Node.js end-of-life banner). A caller's values are left as they are."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("JSII_SILENCE_")}
    ran = subprocess.run(
        [sys.executable, "-c", LOAD_CDK_APP], cwd=REPO, env=clean, capture_output=True, text=True, timeout=120
    )
    assert (ran.returncode, ran.stdout, ran.stderr) == (0, "20 1\n", "")
    given = dict(clean, **dict(zip(JSII_SILENCE, ("", "0"), strict=True)))
    ran = subprocess.run(
        [sys.executable, "-c", LOAD_CDK_APP], cwd=REPO, env=given, capture_output=True, text=True, timeout=120
    )
    assert (ran.returncode, ran.stdout) == (0, " 0\n"), ran.stderr


def test_review_without_the_cdk_toolchain_is_one_line_saying_where_it_runs(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A trainctl installed with pip has no aws-cdk-lib, CDK app or cfn-lint: review says so, exit 2, no traceback.
    (tests/emulator/test_pip_install.py runs it in such an environment.)"""
    monkeypatch.setitem(sys.modules, "aws_cdk", None)  # import aws_cdk: ModuleNotFoundError, as where it is missing
    assert trainctl_main(["review", "--teams-dir", str(tmp_path)]) == 2
    assert capsys.readouterr() == (
        "",
        "trainctl: error: review needs the CDK app (or --assembly DIR, a synthesized one): run it from a clone of "
        "the ops repository after `make deps` (aws-cdk-lib, cfn-lint and Node.js); no module named 'aws_cdk' here\n",
    )


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("127.0.0.1:9", "no host"),
        ("http://127.0.0.1:99999", "Port out of range 0-65535"),
        ("http://[::1", "Invalid IPv6 URL"),
        ("ftp://127.0.0.1:9", "not an http(s) URL"),
    ],
)
def test_a_bad_endpoint_url_is_one_line_naming_the_variable(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, url: str, problem: str
) -> None:
    """Not botocore's ValueError and a traceback (at the client, or at the first request)."""
    monkeypatch.setenv("AWS_ENDPOINT_URL", url)
    assert trainctl_main(["--region", "us-east-1", "status", "--cluster", "main"]) == 2
    assert capsys.readouterr().err == (
        f"trainctl: error: AWS_ENDPOINT_URL {url!r}: {problem}; give a URL such as https://host:port\n"
    )


def test_a_region_that_is_not_one_is_bad_input(capsys: pytest.CaptureFixture[str]) -> None:
    """Exit 2, not 3: AWS did not fail."""
    assert trainctl_main(["--region", "us east 1", "status", "--cluster", "main"]) == 2
    assert capsys.readouterr().err == (
        "trainctl: error: --region / AWS_REGION 'us east 1' is not a region; use one such as us-east-1\n"
    )


def test_logs_of_a_node_without_any_is_one_line_naming_those_with_logs(
    aws: None, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """A mistyped --node is an error, not an empty output with exit 0 as if that node had logged nothing."""
    started(capsys, tmp_path)
    ship("i-0aaa", (now_ms(), "training step 1"))
    rc, out, err = trainctl(capsys, "logs", "run-1", "--node", "i-0bbb")
    assert (rc, out, err) == (2, "", "trainctl: error: no logs of node i-0bbb in job run-1; nodes with logs: i-0aaa\n")
    rc, out, err = trainctl(capsys, "logs", "run-1", "--node", "i-0aaa")
    assert (rc, err) == (0, "") and out.endswith(" i-0aaa training step 1\n")


def test_log_lines_carry_their_date(aws: None, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """A job runs for days: with only the time of day, two days' lines at 10:00 would look alike."""
    started(capsys, tmp_path)
    ms = now_ms() // 1000 * 1000
    ship("i-0aaa", (ms, "training step 1"))
    rc, out, err = trainctl(capsys, "logs", "run-1")
    when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ms / 1000))
    assert (rc, out, err) == (0, f"{when} i-0aaa training step 1\n", "")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([], "trainctl: error: the following arguments are required: action; see trainctl --help"),
        (
            ["submit", "--cluster", "main", "--code", ".", "--nodes", "abc"],
            "trainctl submit: error: argument --nodes: invalid int value: 'abc'; see trainctl submit --help",
        ),
        (
            ["--team", "research", "status", "--cluster", "main"],
            "trainctl: error: argument action: invalid choice: 'research' (choose from 'submit', 'status', 'logs', "
            "'stop', 'list', 'queue', 'cancel', 'cost', 'drill', 'review'); --team goes after the command: "
            "trainctl status --team ...; see trainctl --help",
        ),
        (
            ["--cluster", "main", "--team", "research", "stop", "job-1"],
            "trainctl: error: argument action: invalid choice: 'main' (choose from 'submit', 'status', 'logs', "
            "'stop', 'list', 'queue', 'cancel', 'cost', 'drill', 'review'); --team and --cluster go after the "
            "command: trainctl stop --team ...; see trainctl --help",
        ),
        (
            ["status", "--cluster", "main", "job-1", "--region", "us-east-1"],
            "trainctl: error: unrecognized arguments: --region us-east-1; --region goes before the command: trainctl "
            "--region ... status ...; see trainctl --help",
        ),
    ],
)
def test_a_usage_mistake_is_one_line(capsys: pytest.CaptureFixture[str], argv: list[str], message: str) -> None:
    """Not argparse's whole usage (3 to 7 lines) above the error."""
    with pytest.raises(SystemExit) as exit_:
        trainctl_main(argv)
    assert exit_.value.code == 2
    assert capsys.readouterr().err == message + "\n"


def test_the_time_left_counts_down_between_checkpoints() -> None:
    """Checkpoints at steps 400 and 700, 1800 s apart, the newest 1500 s ago, 1000 steps planned: 1800 s were left
    at the newest, 300 s are left now (not 1800 s until the next checkpoint, whatever the time)."""
    now = 1_000_000.0
    done = [
        jobs.Checkpoint(step=400, size_bytes=1, files=1, manifest_time=now - 3300),
        jobs.Checkpoint(step=700, size_bytes=1, files=1, manifest_time=now - 1500),
    ]
    assert jobs.eta_s(done, 1000, [now - 4000], now) == 300
    assert jobs.eta_s(done, 1000, [now - 4000], now + 600) == 0  # overdue: no time left, never negative
    assert jobs.eta_s(done, 1000, [now - 2000], now) is None  # one checkpoint since the last boot: no pace


def test_status_shows_each_nodes_lifecycle_state(aws: None, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """The node agent writes its lifecycle state to ``nodes/<id>/state`` at each transition; status shows it for each
    node of the group (with how long, and why), ``-`` for a node whose agent has not written one yet."""
    ref = started(capsys, tmp_path)
    members = sorted(m["InstanceId"] for m in jobs.group(client_factory("us-east-1"), ref)["Instances"])
    assert len(members) >= 2
    s3 = boto3.client("s3")
    written = {
        members[0]: {"state": "TRAIN", "previous": "WAIT_FOR_PEERS", "reason": "attempt 0 with 2 node(s)"},
        "i-gone": {"state": "LEAVING", "previous": "DRAIN", "reason": "interrupted"},  # not in the group any more
    }
    for instance, body in written.items():
        key = f"{ref.job_prefix('run-1')}nodes/{instance}/state"
        s3.put_object(Bucket=ref.bucket, Key=key, Body=json.dumps(dict(body, since=time.time())))
    s3.put_object(Bucket=ref.bucket, Key=f"{ref.job_prefix('run-1')}nodes/{members[1]}/boot", Body=b"{}")
    nodes = {n["instance"]: n for n in json_status(capsys)["nodes"]}
    assert set(nodes) == set(members)  # the group's nodes: one that left is not shown
    first = nodes[members[0]]
    assert (first["agent_state"], first["agent_reason"]) == ("TRAIN", "attempt 0 with 2 node(s)")
    assert 0 <= first["agent_state_age_s"] < 60
    assert first["state"] == "InService" and first["market"] in ("spot", "on-demand")  # the group's view stays
    assert (nodes[members[1]]["agent_state"], nodes[members[1]]["agent_reason"]) == (None, None)
    rc, out, _ = trainctl(capsys, "status", "run-1")
    header, *rows = out.split("\n\n", 1)[1].splitlines()
    assert rc == 0 and header.split() == ["INSTANCE", "STATE", "AGENT_STATE", "MARKET", "AZ", "TYPE", "AGENT_REASON"]
    row = {r.split()[0]: r for r in rows}
    assert re.search(r"\bInService\s+TRAIN \(\d+ s\)\s+.*attempt 0 with 2 node\(s\)$", row[members[0]])
    assert row[members[1]].split()[1:3] == ["InService", "-"]
