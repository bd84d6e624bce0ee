"""trainctl cost's arithmetic on inputs built here: price averaging, redone work, the price file; and a job's
instances and price warnings read back from AWS (moto in-process: no server, no network)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import boto3
import pytest
from moto import mock_aws

from trainctl import cost, jobs
from trainctl.cost import NodeCost, _dt, job_cost, redone_work
from trainctl.prices import ON_DEMAND, PriceError, average_price, load_prices


def test_average_price_weights_each_price_by_the_time_it_was_in_effect() -> None:
    history = [(0.0, 1.0), (100.0, 3.0), (300.0, 2.0)]
    assert average_price(history, 50.0, 150.0) == pytest.approx((50 * 1.0 + 50 * 3.0) / 100)
    assert average_price(history, 100.0, 400.0) == pytest.approx((200 * 3.0 + 100 * 2.0) / 300)
    assert average_price(history, 500.0, 600.0) == 2.0  # the last price stays in effect
    assert average_price(history, 20.0, 20.0) == 1.0  # an instant: the price in effect then
    assert average_price([], 0.0, 10.0) is None


def _node(instance: str, start: float, end: float, price: float, itype: str = "g5.xlarge") -> NodeCost:
    return NodeCost(instance, itype, "spot", "us-east-1a", start, end, "group activity", price, ON_DEMAND[itype][0])


def test_redone_work_counts_steps_between_the_checkpoint_and_the_furthest_step_times_the_nodes() -> None:
    # two nodes train steps 10..50 (one line per 10 steps, 10 s apart); no notice: the job resumes from step 30
    events = [(10.0 * k, "job/i-a", f"step {10 * k} epoch 0 loss 0.5") for k in range(1, 6)]
    events += [(60.0, "job/i-c", "resume step: 30")]
    events += [(70.0, "job/i-c", "step 40 epoch 0 loss 0.5")]
    nodes = [_node("i-a", 0.0, 55.0, 0.4), _node("i-b", 0.0, 55.0, 0.4), _node("i-c", 58.0, 100.0, 0.4)]
    redone = redone_work(events, nodes, load_prices())
    assert redone.steps == 50 - 30
    # steps 31..50 first ran from the line of step 30 (t=30) to the line of step 50 (t=50), on i-a and i-b
    assert redone.node_hours == pytest.approx(2 * 20.0 / 3600)
    assert redone.gpu_hours == pytest.approx(2 * 20.0 * ON_DEMAND["g5.xlarge"][1] / 3600)
    assert redone.usd == pytest.approx(2 * 20.0 / 3600 * 0.4)


def test_a_resume_from_the_emergency_checkpoint_redoes_nothing() -> None:
    events = [
        (10.0, "job/i-a", "step 10 epoch 0 loss 0.5"),
        (14.0, "job/i-a", "interrupted: checkpoint 14 saved, exiting"),
        (30.0, "job/i-b", "resume step: 14"),
    ]
    redone = redone_work(events, [_node("i-a", 0.0, 20.0, 0.4)], load_prices())
    assert (redone.steps, redone.node_hours, redone.usd) == (0, 0.0, 0.0)


def test_gpu_hours_are_unknown_for_a_type_without_a_gpu_count() -> None:
    events = [
        (10.0, "j/i-a", "step 10 epoch 0 loss 1.0"),
        (20.0, "j/i-a", "step 20 epoch 0 loss 1.0"),
        (30.0, "j/i-b", "resume step: 10"),
    ]
    redone = redone_work(events, [_node("i-a", 0.0, 25.0, 0.1, itype="g5.xlarge")], load_prices())
    assert redone.gpu_hours == pytest.approx(10.0 / 3600)
    table = load_prices()
    node = NodeCost("i-a", "c7i.xlarge", "spot", "us-east-1a", 0.0, 25.0, "node logs", 0.1, 0.2)
    assert redone_work(events, [node], table).gpu_hours is None


def test_a_price_file_adds_types_and_bad_ones_say_what_to_fix(tmp_path: Path) -> None:
    good = tmp_path / "prices.yaml"
    good.write_text("c7i.xlarge: 0.1785\ng5.xlarge: 1.1\n")
    table = load_prices(good)
    assert table.on_demand_price("c7i.xlarge") == 0.1785 and table.on_demand_price("g5.xlarge") == 1.1
    assert table.on_demand_price("g4dn.xlarge") == ON_DEMAND["g4dn.xlarge"][0]
    with pytest.raises(PriceError) as missing:
        load_prices().on_demand_price("x9.huge")
    assert str(missing.value).startswith("no on-demand price for x9.huge (source: https://aws.amazon.com/ec2/pricing")
    assert str(missing.value).endswith("pass --prices FILE with a line '<type>: <USD per hour>'")
    for text, message in (
        ("g5.xlarge: -1\n", f"{tmp_path}/bad.yaml: g5.xlarge: price must be a positive number of USD per hour, got -1"),
        (
            "- g5.xlarge\n",
            f"{tmp_path}/bad.yaml: expected a mapping of instance type to USD per hour, e.g. 'g5.xlarge: 1.006'",
        ),
        ("g5.xlarge: [1\n", f"{tmp_path}/bad.yaml: cannot read prices (ParserError: while parsing a flow sequence)"),
        # accepted, it would leave the built-in price of g5.xlarge in use without a word
        ("G5.xlarge: 1.0\n", f"{tmp_path}/bad.yaml: G5.xlarge: not an EC2 instance type; did you mean g5.xlarge?"),
        (  # refused, not the last one silently winning
            "g5.xlarge: 1.0\ng5.xlarge: 2.0\n",
            f"{tmp_path}/bad.yaml: line 2: key 'g5.xlarge' appears twice in one mapping (first at line 1); keep one",
        ),
    ):
        (tmp_path / "bad.yaml").write_text(text)
        with pytest.raises(PriceError) as bad:
            load_prices(tmp_path / "bad.yaml")
        assert str(bad.value) == message
    with pytest.raises(PriceError, match=r"nope.yaml: cannot read prices \(FileNotFoundError"):
        load_prices(tmp_path / "nope.yaml")


def test_a_restart_logged_by_every_node_is_counted_once() -> None:
    events = [(10.0 * k, "job/i-a", f"step {10 * k} epoch 0 loss 0.5") for k in range(1, 6)]
    events += [(60.0, "job/i-c", "resume step: 30"), (60.5, "job/i-b", "resume step: 30")]
    nodes = [_node("i-a", 0.0, 55.0, 0.4), _node("i-b", 0.0, 80.0, 0.4), _node("i-c", 58.0, 80.0, 0.4)]
    redone = redone_work(events, nodes, load_prices())
    assert redone.steps == 50 - 30
    assert redone.node_hours == pytest.approx(2 * 20.0 / 3600)  # i-a and i-b ran steps 31..50 (t=30..50)


def _run(steps: range, start: float, stream: str = "job/i-a") -> list[tuple[float, str, str]]:
    """A trainer run's step lines, one per step, 1 s apart from ``start``."""
    return [(start + k, stream, f"step {step} epoch 0 loss 0.5") for k, step in enumerate(steps)]


def _restart(at: float, step: int) -> list[tuple[float, str, str]]:
    """The same restart as both nodes' agents log it."""
    return [(at, "job/i-a", f"resume step: {step}"), (at + 0.5, "job/i-b", f"resume step: {step}")]


@pytest.mark.parametrize(
    ("second_resume", "steps", "seconds"),
    [
        # run 2 (81..90, t=200..209) resumes from 85 (t=204): 100-80 + 90-85 redone, not 100-85
        pytest.param(85, 20 + 5, 20 + 5, id="from-a-checkpoint-of-run-2"),
        # run 2 resumes from 80 again: 100-80 + 90-80; the second restart counts on its own, not as the first one
        pytest.param(80, 20 + 10, 20 + 9, id="from-the-same-checkpoint-again"),
    ],
)
def test_each_restart_is_measured_against_the_run_before_it(second_resume: int, steps: int, seconds: float) -> None:
    # run 1: steps 1..100 at t=100..199, resumed from 80; run 2: steps 81..90 at t=200..209; run 3: 1 step
    events = _run(range(1, 101), 100.0) + _restart(199.5, 80) + _run(range(81, 91), 200.0)
    events += _restart(209.5, second_resume) + _run(range(second_resume + 1, second_resume + 2), 210.0)
    nodes = [_node("i-a", 0.0, 300.0, 0.4), _node("i-b", 0.0, 300.0, 0.4)]
    redone = redone_work(events, nodes, load_prices())
    assert redone.steps == steps
    # restart 1: steps 81..100 ran from step 80's line (t=179) to step 100's (t=199); restart 2: run 2's own lines
    # (from step 85's line at t=204, or from its first line at t=200 when it resumed from before it) to t=209
    assert redone.node_hours == pytest.approx(2 * seconds / 3600)
    assert redone.usd == pytest.approx(2 * seconds / 3600 * 0.4)


def test_a_restart_from_scratch_redoes_every_step_of_the_run_before() -> None:
    """No checkpoint yet: the agent logs ``resume step: none (fresh start)`` and the new run starts over."""
    events = [*_run(range(1, 11), 100.0), (111.0, "job/i-a", "resume step: none (fresh start)")]
    events += _run(range(1, 4), 120.0)
    redone = redone_work(events, [_node("i-a", 0.0, 200.0, 0.4)], load_prices())
    assert (redone.steps, redone.node_hours) == (10, pytest.approx(9.0 / 3600))  # steps 1..10 ran t=100..109


@pytest.mark.parametrize(("workers_restarted", "steps"), [(False, 0), (True, 50)])
def test_a_node_joining_a_running_training_is_no_restart_unless_the_steps_go_back(
    workers_restarted: bool, steps: int
) -> None:
    """With min_nodes < max_nodes a node joins the running training; its agent logs ``resume step: 200`` too, while
    the training is at 250. That line alone is no restart: counted as one, it would give 50 steps redone though none
    were. Where torch restarted the workers for the new node, they go back to the checkpoint, and the 50 steps are
    redone."""
    events = [*_run(range(190, 251), 100.0), (161.0, "job/i-b", "resume step: 200")]
    events += _run(range(201, 260) if workers_restarted else range(251, 260), 170.0)
    nodes = [_node("i-a", 0.0, 300.0, 0.4), _node("i-b", 150.0, 300.0, 0.4)]
    redone = redone_work(events, nodes, load_prices())
    assert redone.steps == steps and ((redone.node_hours or 0) > 0) is workers_restarted


def test_a_restart_from_a_flat_checkpoint_is_not_counted_as_steps() -> None:
    """A flat checkpoint (the script's own files) is numbered 1, 2, 3 ... by the agent, which cannot tell the step
    its files hold: the agent says it does not know, and so does the cost. Were the agent to log ``resume step: 2``
    for the second, a run that had reached step 3000 would count 2998 redone steps."""
    events = [*_run(range(2990, 3001), 100.0), (111.0, "job/i-a", "resume step: unknown (flat checkpoint 2)")]
    events += _run(range(2001, 2010), 120.0)
    redone = redone_work(events, [_node("i-a", 0.0, 200.0, 0.4)], load_prices())
    assert (redone.steps, redone.node_hours, redone.usd) == (None, None, None)
    assert cost.redone_text(asdict(redone)) == cost.REDONE_UNKNOWN


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"g5.xlarge: .nan\n", "g5.xlarge: price must be a finite number of USD per hour, got nan"),
        (b"g5.xlarge: .inf\n", "g5.xlarge: price must be a finite number of USD per hour, got inf"),
        (b"# caf\xe9\ng5.xlarge: 1.0\n", "not UTF-8 text (byte 0xe9 at offset 5); save it as UTF-8"),
    ],
)
def test_a_price_that_is_not_a_number_or_a_file_that_is_not_utf8_is_one_line(
    tmp_path: Path, content: bytes, message: str
) -> None:
    (tmp_path / "prices.yaml").write_bytes(content)
    with pytest.raises(PriceError) as bad:
        load_prices(tmp_path / "prices.yaml")
    assert str(bad.value) == f"{tmp_path}/prices.yaml: {message}"


def test_redone_work_is_unknown_when_the_trainer_logs_no_step_lines() -> None:
    """A trainer that logs its progress in another form: redone work is unknown, not "0 step(s) redone" printed as a
    fact."""
    events = [(10.0 * k, "job/i-a", f"iteration {10 * k}: loss 0.5") for k in range(1, 6)]
    events += [(60.0, "job/i-b", "resume step: 30"), (70.0, "job/i-b", "iteration 40: loss 0.5")]
    redone = redone_work(events, [_node("i-a", 0.0, 55.0, 0.4), _node("i-b", 58.0, 80.0, 0.4)], load_prices())
    assert (redone.steps, redone.node_hours, redone.gpu_hours, redone.usd) == (None, None, None, None)
    assert cost.redone_text(asdict(redone)) == (
        "redone: unknown (the trainer logs no 'step N ...' lines, or resumed from a flat checkpoint: its step is the "
        "script's)"
    )
    # with step lines, the figures (as `trainctl cost` prints them)
    known = redone_work(_run(range(1, 11), 100.0) + _restart(111.0, 5), [_node("i-a", 0.0, 200.0, 0.4)], load_prices())
    assert cost.redone_text(asdict(known)) == (
        f"redone after restarts: 5 step(s), {5 / 3600:.3f} node-hours ({5 / 3600:.3f} GPU-hours), "
        f"{5 / 3600 * 0.4:.4f} USD"
    )


REGION, BUCKET, GROUP, JOB = "eu-west-1", "checkpoints", "main-group", "job-1"


@pytest.fixture
def aws(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[jobs.ClusterRef, dict[str, Any]]]:
    """A job of one on-demand p4d.24xlarge in eu-west-1 whose boot marker lacks its AZ (IMDS did not answer),
    one log line; the group no longer holds it and has no activity for it (timed by the marker and its log)."""
    for key, value in {"AWS_ACCESS_KEY_ID": "x", "AWS_SECRET_ACCESS_KEY": "x", "AWS_DEFAULT_REGION": REGION}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    with mock_aws():
        ec2 = boto3.client("ec2")
        ec2.create_launch_template(
            LaunchTemplateName="nodes", LaunchTemplateData={"ImageId": "ami-12345678", "InstanceType": "p4d.24xlarge"}
        )
        boto3.client("autoscaling").create_auto_scaling_group(
            AutoScalingGroupName=GROUP, MinSize=0, MaxSize=1, DesiredCapacity=0,
            LaunchTemplate={"LaunchTemplateName": "nodes"}, AvailabilityZones=[f"{REGION}b"],
        )  # fmt: skip
        [instance] = ec2.run_instances(
            ImageId="ami-12345678", InstanceType="p4d.24xlarge", MinCount=1, MaxCount=1,
            Placement={"AvailabilityZone": f"{REGION}b"},
        )["Instances"]  # fmt: skip
        ref = jobs.ClusterRef(
            "default",
            "main",
            {
                "bucket": BUCKET,
                "prefix": "main/",
                "log_group": "/g",
                "current_job_parameter": "/spot-training/default/main/current-job",
            },
            GROUP,
        )
        s3 = boto3.client("s3")
        s3.create_bucket(Bucket=BUCKET, CreateBucketConfiguration={"LocationConstraint": REGION})
        booted = time.time() - 3600
        marker = {"instance_type": "p4d.24xlarge", "lifecycle": "on-demand", "time": booted}  # no availability_zone
        key = f"{ref.job_prefix(JOB)}nodes/{instance['InstanceId']}/boot"
        s3.put_object(Bucket=BUCKET, Key=key, Body=json.dumps(marker).encode())
        logs, stream = boto3.client("logs"), f"{JOB}/{instance['InstanceId']}"
        logs.create_log_group(logGroupName="/g")
        logs.create_log_stream(logGroupName="/g", logStreamName=stream)
        line = {"timestamp": int((booted + 1800) * 1000), "message": "step 1 epoch 0 loss 0.5"}
        logs.put_log_events(logGroupName="/g", logStreamName=stream, logEvents=[line])
        yield ref, instance


def _client(service: str) -> Any:
    return boto3.client(service)


def test_a_boot_marker_missing_a_fact_is_completed_from_ec2(aws: tuple[jobs.ClusterRef, dict[str, Any]]) -> None:
    """Every instance is described, not only markerless ones: otherwise this one would fail with "no boot marker and
    EC2 no longer describes it"."""
    ref, instance = aws
    info = job_cost(_client, ref, JOB, load_prices())
    [node] = info["nodes"]
    assert (node["instance"], node["type"], node["market"]) == (instance["InstanceId"], "p4d.24xlarge", "on-demand")
    assert node["az"] == instance["Placement"]["AvailabilityZone"]
    assert node["hours"] == pytest.approx(0.5) and node["timed_by"] == "node logs"
    # EC2 forgets terminated instances: the missing fact is named
    ghost = {"instance_type": "g5.xlarge", "time": time.time()}
    key = f"{ref.job_prefix('job-2')}nodes/i-0123456789abcdef0/boot"
    boto3.client("s3").put_object(Bucket=BUCKET, Key=key, Body=json.dumps(ghost).encode())
    with pytest.raises(PriceError) as unknown:
        job_cost(_client, ref, "job-2", load_prices())
    assert str(unknown.value) == (
        "instance i-0123456789abcdef0 of job job-2: its boot marker lacks lifecycle, availability_zone; EC2 no "
        "longer describes it"
    )


def test_table_prices_outside_us_east_1_and_before_the_p_family_cut_are_flagged(
    aws: tuple[jobs.ClusterRef, dict[str, Any]], tmp_path: Path
) -> None:
    """The job ran in eu-west-1 and was priced with us-east-1 list prices, P-family ones from before the June 2025
    cut, and nothing said so."""
    ref, instance = aws
    key = f"{ref.job_prefix(JOB)}nodes/{instance['InstanceId']}/boot"  # a complete marker, this time
    marker = {"instance_type": "p4d.24xlarge", "lifecycle": "on-demand", "availability_zone": f"{REGION}b"}
    boto3.client("s3").put_object(Bucket=BUCKET, Key=key, Body=json.dumps(marker).encode())
    info = job_cost(_client, ref, JOB, load_prices())
    assert info["warnings"] == [
        f"on-demand prices of p4d.24xlarge are us-east-1 list prices, but the job ran in {REGION}: pass --prices "
        f"FILE with {REGION}'s prices",
        "p4d.24xlarge: list price before the June 2025 cut; pass --prices FILE with current prices",
    ]
    prices = tmp_path / "prices.yaml"
    prices.write_text("p4d.24xlarge: 23.5\n")
    info = job_cost(_client, ref, JOB, load_prices(prices))
    assert info["warnings"] == [] and info["nodes"][0]["usd_per_hour"] == 23.5


def test_an_instance_launched_for_the_job_that_never_told_is_counted_or_named(
    aws: tuple[jobs.ClusterRef, dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The group's activities launched two more instances for the job between its submit and its end; neither wrote
    a boot marker or a log line (their user data failed early), one after the job ended. Neither is left out
    without a word. One EC2 still describes: counted, timed by its activities. One it forgot: named in a
    warning, not a silent zero and not an error that hides the rest."""
    ref, instance = aws
    s3 = boto3.client("s3")
    s3.put_object(Bucket=BUCKET, Key=f"{ref.code_prefix}{JOB}.tar.gz", Body=b"code")
    submitted = jobs.object_time(_client, ref, f"{ref.code_prefix}{JOB}.tar.gz")
    assert submitted is not None
    ec2 = boto3.client("ec2")
    [silent] = ec2.run_instances(
        ImageId="ami-12345678", InstanceType="p4d.24xlarge", MinCount=1, MaxCount=1,
        Placement={"AvailabilityZone": f"{REGION}b"},
    )["Instances"]  # fmt: skip
    forgotten, later = "i-0fedcba9876543210", "i-0aaaaaaaaaaaaaaaa"
    activities = {  # moto records no scaling activities: what Auto Scaling would list
        silent["InstanceId"]: {"launch": submitted + 10, "end": submitted + 1810},
        forgotten: {"launch": submitted + 20, "end": submitted + 30},
        later: {"launch": submitted + 10**6},  # after the job (now): another job's
    }
    monkeypatch.setattr(cost, "instance_activities", lambda *_: activities)
    info = job_cost(_client, ref, JOB, load_prices(), now=submitted + 10**5)  # no end marker: it runs until now
    nodes = {n["instance"]: n for n in info["nodes"]}
    assert set(nodes) == {instance["InstanceId"], silent["InstanceId"]}
    assert nodes[silent["InstanceId"]]["hours"] == pytest.approx(0.5)
    assert nodes[silent["InstanceId"]]["timed_by"] == "group activity"
    assert (
        f"instance {forgotten}, launched for job {JOB}, wrote no boot marker and no log line, and EC2 no longer "
        "describes it: its cost is not counted"
    ) in info["warnings"]


def test_a_later_jobs_instances_are_not_an_older_jobs(
    aws: tuple[jobs.ClusterRef, dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An older job without an end marker (UNFINISHED, or stopped with no agent left to write STOPPED) is not the
    cluster's current one: its instances are those launched before the next job's submit, not every instance
    since (a review of the change before this test counted a later job's 10 h for it)."""
    ref, instance = aws
    s3, ec2 = boto3.client("s3"), boto3.client("ec2")
    s3.put_object(Bucket=BUCKET, Key=f"{ref.code_prefix}{JOB}.tar.gz", Body=b"code")
    time.sleep(1.1)  # S3 times are whole seconds: the next submit comes later
    s3.put_object(Bucket=BUCKET, Key=f"{ref.code_prefix}job-2.tar.gz", Body=b"code")
    first, second = (jobs.object_time(_client, ref, f"{ref.code_prefix}{j}.tar.gz") for j in (JOB, "job-2"))
    assert first is not None and second is not None and first < second
    ours, theirs = (
        ec2.run_instances(
            ImageId="ami-12345678", InstanceType="p4d.24xlarge", MinCount=1, MaxCount=1,
            Placement={"AvailabilityZone": f"{REGION}b"},
        )["Instances"][0]["InstanceId"]
        for _ in range(2)
    )  # fmt: skip
    activities = {
        ours: {"launch": first + 0.5, "end": first + 3600},
        theirs: {"launch": second + 1, "end": second + 36000},
    }
    monkeypatch.setattr(cost, "instance_activities", lambda *_: activities)
    info = job_cost(_client, ref, JOB, load_prices(), now=second + 10**5)
    assert {n["instance"] for n in info["nodes"]} == {instance["InstanceId"], ours}


def test_a_termination_in_progress_is_billed_until_now() -> None:
    """The group holds a node it ends in Terminating:Wait (the drain hook, up to 300 s) while its agent saves: the
    termination activity has a start and no end yet. The node's time runs on; ending it at that activity's start
    would leave the wait unbilled."""
    launched, ending = 1_000_000.0, 1_003_600.0
    pages = [
        {
            "Activities": [
                {"Description": "Terminating EC2 instance: i-0123456789abcdef0", "StartTime": _dt(ending)},
                {
                    "Description": "Launching a new EC2 instance: i-0123456789abcdef0",
                    "StartTime": _dt(launched),
                    "EndTime": _dt(launched + 30),
                },
            ]
        }
    ]
    paginator = SimpleNamespace(paginate=lambda **_: iter(pages))
    autoscaling = SimpleNamespace(get_paginator=lambda name: paginator)
    times = cost.instance_activities(lambda service: autoscaling, GROUP)
    assert times == {"i-0123456789abcdef0": {"launch": launched}}  # no end: the node is billed until now


def test_a_node_with_nothing_left_to_time_it_is_named_not_a_silent_zero(
    aws: tuple[jobs.ClusterRef, dict[str, Any]],
) -> None:
    """A job older than the log group's retention and Auto Scaling's six weeks of activities: its node has a boot
    marker and nothing else. Its 0 hours come with a warning that names it; without one, it would cost 0 hours,
    timed by "node logs", and nothing would say so."""
    ref, instance = aws
    boto3.client("logs").delete_log_group(logGroupName="/g")  # retention ran out
    boto3.client("logs").create_log_group(logGroupName="/g")
    info = job_cost(_client, ref, JOB, load_prices())
    [node] = info["nodes"]
    assert node["hours"] == 0
    assert (
        f"instance {instance['InstanceId']} of job {JOB}: no Auto Scaling activity (kept six weeks) and no log line "
        "(kept for the log group's retention) is left to time it: its hours are not counted"
    ) in info["warnings"]
