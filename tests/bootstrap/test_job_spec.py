"""Bad job specs, bad arguments and missing code fail with one line a user can act on; nothing runs."""

from __future__ import annotations

import ast
import json
from pathlib import Path
from typing import Any

import pytest
from spot_training.agent.errors import AgentError, JobRefused
from spot_training.agent.job import load_job
from spot_training.job_spec import JOB_KEYS, JOB_SETTINGS, SPEC_KEYS, JobSpec, JobSpecError, WarmPoolSpec, check_job

from .conftest import BOOTSTRAP, Cluster, address_map, states
from .test_agent_notice import agent_for, raising

ALLOWED = ", ".join(sorted(JOB_KEYS))
STALL = "stall_timeout_s must be an integer from 300 to 86400 (seconds), or null or 0 (off),"


def job_error(cluster: Cluster, current: Any) -> str:
    cluster.aws.ssm.put_parameter(
        Name=cluster.current_parameter,
        Value=current if isinstance(current, str) else json.dumps(current),
        Type="String",
        Overwrite=True,
    )
    with pytest.raises(AgentError) as info:
        load_job(cluster.aws.ssm, cluster.spec_parameter)
    message = str(info.value)
    assert "\n" not in message
    return message


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        (
            {"command": "python train.py; rm -rf /"},
            "command contains shell syntax ';': it runs without a shell; put the logic in a script",
        ),
        (
            {"command": "python train.py $(curl evil)"},
            "command contains shell syntax '$()': it runs without a shell; put the logic in a script",
        ),
        (
            {"command": "bash -c 'python train.py'"},
            "command must be 'python SCRIPT [ARGS]' or 'python -m MODULE [ARGS]', got \"bash -c 'python train.py'\"",
        ),
        (
            {"command": "python ../../etc/evil.py"},
            "command: the script must be a path inside the code archive, got '../../etc/evil.py'",
        ),
        (
            {"command": "python 'unterminated"},
            'command cannot be parsed (No closing quotation): "python \'unterminated"',
        ),
        ({"job_id": "My_Job"}, "job_id must be a DNS label (lowercase letters, digits, '-', at most 63), got 'My_Job'"),
        (
            {"job_id": "x;reboot"},
            "job_id must be a DNS label (lowercase letters, digits, '-', at most 63), got 'x;reboot'",
        ),
        ({"nproc_per_node": 0}, "nproc_per_node must be an integer from 1 to 64, got 0"),
        ({"min_nodes": 3, "max_nodes": 2}, "max_nodes must be an integer from 3 to 1000, got 2"),
        ({"interruption_grace_s": "90"}, "interruption_grace_s must be a number above 0 and below 120, got '90'"),
        ({"interruption_grace_s": 120}, "interruption_grace_s must be a number above 0 and below 120, got 120"),
        (
            {"checkpoint_interval_s": float("inf")},
            "checkpoint_interval_s must be a number of at least 1 or null, got inf",
        ),
        ({"checkpoint_interval_s": 0.5}, "checkpoint_interval_s must be a number of at least 1 or null, got 0.5"),
        (
            {"mean_time_between_interruptions_s": None},
            "mean_time_between_interruptions_s must be a positive number of at most 3.1536e+08, got None",
        ),
        ({"job_id": "code"}, "job_id 'code' is reserved: the code archives are under '<cluster>/code/'"),
        ({"python": "python3"}, "python must be an absolute path, got 'python3'"),
        ({"checkpoint_wait_for_upload": "yes"}, "checkpoint_wait_for_upload must be true or false, got 'yes'"),
        ({"stall_timeout_s": 299}, f"{STALL} got 299"),
        ({"stall_timeout_s": 86401}, f"{STALL} got 86401"),
        ({"stall_timeout_s": 600.0}, f"{STALL} got 600.0"),
        ({"stall_timeout_s": False}, f"{STALL} got False"),
        ({"stall_timeout_s": "3600"}, f"{STALL} got '3600'"),
        ({"gpus": 8}, f"/spot-training/team-a/CLUSTER/current-job has unknown key(s): gpus (allowed: {ALLOWED})"),
    ],
)
def test_bad_job_gives_one_line_error(make_cluster: Any, override: dict[str, Any], expected: str) -> None:
    cluster: Cluster = make_cluster()
    current = {"job_id": "job-1", "code_key": f"{cluster.name}/code/job-1.tar.gz", **override}
    assert job_error(cluster, current) == expected.replace("CLUSTER", cluster.name)


def test_code_key_outside_the_cluster_prefix_is_rejected(make_cluster: Any) -> None:
    cluster: Cluster = make_cluster()
    message = job_error(cluster, {"job_id": "job-1", "code_key": "other-cluster/code.tar.gz"})
    assert message == (
        f"code_key must be an S3 key under '{cluster.name}/' (the cluster's prefix), got 'other-cluster/code.tar.gz'"
    )


def test_spec_version_and_missing_or_broken_current_job(make_cluster: Any) -> None:
    cluster: Cluster = make_cluster()
    with pytest.raises(AgentError, match=r"^no job submitted: SSM parameter .*/current-job does not exist"):
        load_job(cluster.aws.ssm, cluster.spec_parameter)
    assert job_error(cluster, "{not json").startswith(f"SSM parameter {cluster.current_parameter} is not valid JSON:")
    cluster.spec["version"] = 2
    cluster.put_spec()
    assert job_error(cluster, {"job_id": "j"}) == "job spec version 2 is not supported (expected 1)"


def test_valid_job_merges_overrides(make_cluster: Any) -> None:
    cluster: Cluster = make_cluster()
    assert "checkpoint_wait_for_upload" not in cluster.spec  # a job spec without the option: off
    cluster.submit("job-6", {"train.py": ""}, "python train.py")
    assert load_job(cluster.aws.ssm, cluster.spec_parameter).checkpoint_wait_for_upload is False
    cluster.submit(
        "job-7", {"train.py": ""}, "python -m pkg.train --lr '0.1 0.2'", nproc_per_node=2,
        checkpoint_wait_for_upload=True,
    )  # fmt: skip
    job = load_job(cluster.aws.ssm, cluster.spec_parameter)
    assert (job.job_id, job.nproc_per_node, job.argv) == ("job-7", 2, ["-m", "pkg.train", "--lr", "0.1 0.2"])
    assert job.checkpoint_wait_for_upload is True
    assert job.job_prefix == f"{cluster.name}/job-7/"


def test_the_stall_timeout_is_off_when_missing_null_or_0(make_cluster: Any) -> None:
    cluster: Cluster = make_cluster()
    assert "stall_timeout_s" not in cluster.spec  # a job spec without the key: off, as by default
    found = []
    for submitted in ({}, {"stall_timeout_s": None}, {"stall_timeout_s": 300}):
        cluster.submit("job-1", {"train.py": ""}, "python train.py", **submitted)
        found.append(load_job(cluster.aws.ssm, cluster.spec_parameter).stall_timeout_s)
    assert found == [None, None, 300]
    found = []
    for spec_value in (0, 86400):  # 0: the stack's job spec for a team file's null (CDK leaves null out)
        cluster.spec["stall_timeout_s"] = spec_value
        cluster.put_spec()
        for submitted in ({}, {"stall_timeout_s": 600}):  # a submitted job overrides it
            cluster.submit("job-1", {"train.py": ""}, "python train.py", **submitted)
            found.append(load_job(cluster.aws.ssm, cluster.spec_parameter).stall_timeout_s)
    assert found == [None, 600, 86400, 600]


def last_line(text: str) -> str:
    return text.strip().splitlines()[-1]


def test_user_data_rejects_a_bad_spec_before_running_anything(
    make_cluster: Any, make_nodes: Any, tmp_path: Path
) -> None:
    cluster: Cluster = make_cluster()
    marker = tmp_path / "pwned"
    cluster.submit("job-1", {"train.py": ""}, f"python train.py && touch {marker}")
    (node,) = make_nodes(cluster)
    assert node.start(address_map([node])).wait() == 2
    assert last_line(node.text) == (
        "node-agent: error: command contains shell syntax '&': it runs without a shell; put the logic in a script"
    )
    assert not marker.exists()
    root = node.dir / "root"  # nothing downloaded, nothing started: only user data's hand-back scripts are there
    files = sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())
    assert files == ["opt/spot-training/work/hand-back.sh", "var/lib/cloud/scripts/per-boot/spot-training-reboot.sh"]
    # No node of the group could run it: the job is FAILED with the reason, and the group no longer bills.
    assert cluster.desired_capacity() == 0
    failed = cluster.marker("job-1", "FAILED")
    assert failed is not None
    assert failed["reason"] == (
        "the node agent refused the job: command contains shell syntax '&': it runs without a shell; put the logic "
        "in a script"
    )


def test_a_refused_job_still_hands_the_node_back_when_its_group_cannot_be_found(make_cluster: Any) -> None:
    """Refusing a job scales the group to 0; when Auto Scaling does not say which group this is, the node still
    leaves (one node fewer) instead of idling billed, and the job is FAILED with the reason."""
    cluster: Cluster = make_cluster(nodes=2)
    cluster.submit("job-1", {"train.py": ""}, "python train.py")
    (a, _), (b, _) = cluster.instances()
    agent, job, lines = agent_for(cluster, b)
    agent.node.asg.describe_auto_scaling_instances = raising("DescribeAutoScalingInstances")
    agent.endings.refuse_job(JobRefused("job spec team 'x' does not match --team 'y'", (job.bucket, "c/job-1/F")))
    assert [i for i, _ in cluster.instances()] == [a] and cluster.desired_capacity() == 1
    failed = json.loads(cluster.aws.s3.get_object(Bucket=job.bucket, Key="c/job-1/F")["Body"].read())
    assert failed["reason"] == "the node agent refused the job: job spec team 'x' does not match --team 'y'"
    assert lines[0] == "error: job spec team 'x' does not match --team 'y'"
    assert states(lines) == ["BOOT", "REFUSED"]
    assert any(
        line.startswith("could not find this instance's group to scale it to 0 (")
        and line.endswith("); scale it to 0 by hand")
        for line in lines
    ), lines


def test_a_group_scaled_up_without_a_job_goes_back_to_zero(make_cluster: Any, make_nodes: Any) -> None:
    cluster: Cluster = make_cluster()
    (node,) = make_nodes(cluster)
    assert node.start(address_map([node])).wait() == 2
    assert last_line(node.text) == (
        f"node-agent: error: no job submitted: SSM parameter {cluster.current_parameter} does not exist "
        "(submit a job first)"
    )
    assert cluster.desired_capacity() == 0


def test_missing_code_object(make_cluster: Any, make_nodes: Any) -> None:
    cluster: Cluster = make_cluster()
    cluster.submit("job-1", {"train.py": ""}, "python train.py")
    cluster.aws.s3.delete_object(Bucket=cluster.bucket, Key=f"{cluster.name}/code/job-1.tar.gz")
    (node,) = make_nodes(cluster)
    assert node.start(address_map([node])).wait() == 1  # the job is FAILED, not a bad argument
    assert cluster.marker("job-1", "FAILED") is not None
    assert last_line(node.text) == (
        f"node-agent: error: code object s3://{cluster.bucket}/{cluster.name}/code/job-1.tar.gz does not exist"
    )


def test_user_data_checks_its_arguments_and_identity(make_cluster: Any, make_nodes: Any) -> None:
    cluster: Cluster = make_cluster()
    (node,) = make_nodes(cluster)
    node.imds.tags["spot-training:cluster"] = "someone-else"
    assert cluster.desired_capacity() == 1
    assert node.start({}).wait() == 2
    assert last_line(node.text) == (
        f"user-data: error: instance tag spot-training:cluster=someone-else does not match --cluster {cluster.name}"
    )
    assert "PUT /latest/api/token" in node.imds.requests  # IMDSv2: a token first
    # no agent runs to hand the node back: user data does, so a refused node is not billed idle
    assert f"instance {node.instance_id} leaves group {cluster.group} (one fewer desired)" in node.text
    assert cluster.desired_capacity() == 0


def test_a_refused_node_whose_group_tag_is_unread_still_leaves_its_group(make_cluster: Any, make_nodes: Any) -> None:
    """Tags come from the instance metadata, read once (curl's two retries): a tag read that fails leaves the group's
    name empty. The user data then hands the node back all the same (Auto Scaling names the group), or the refused
    node would idle in its group, billed."""
    cluster: Cluster = make_cluster()
    (node,) = make_nodes(cluster)
    del node.imds.tags["aws:autoscaling:groupName"]
    node.imds.tags["spot-training:cluster"] = "someone-else"
    assert node.start({}).wait() == 2
    assert f"instance {node.instance_id} leaves group {cluster.group} (one fewer desired)" in node.text
    assert cluster.desired_capacity() == 0


@pytest.mark.parametrize("path", sorted(str(p.relative_to(BOOTSTRAP)) for p in BOOTSTRAP.rglob("*.py")))
def test_on_node_code_parses_as_python_38(path: str) -> None:
    """The node's Python may be 3.8: no 3.9+ grammar (a syntax-level check; runtime APIs are kept 3.8 by review)."""
    source = (BOOTSTRAP / path).read_text()
    ast.parse(source, feature_version=(3, 8))
    if "def " in source:  # so list[str]-style annotations are never evaluated
        assert "from __future__ import annotations" in source


def a_job_spec(**changes: Any) -> JobSpec:
    """A job spec as the stack writes one, with ``changes``."""
    fields: dict[str, Any] = dict(
        team="t", cluster="main", region="us-east-1", bucket="bucket", prefix="main/", log_group="logs",
        current_job_parameter="/spot-training/t/main/current-job", command="python train.py",
        python="/opt/pytorch/bin/python", nproc_per_node=1, min_nodes=1, desired_nodes=1, max_nodes=2,
        checkpoint_dir="/opt/ml/checkpoints", checkpoint_interval_s=None, checkpoint_wait_for_upload=False,
        mean_time_between_interruptions_s=3600, max_restarts=3, interruption_grace_s=90, rendezvous_port=29400,
        stall_timeout_s=0, warm_pool=None,
    )  # fmt: skip
    return JobSpec(**{**fields, **changes})


def test_the_job_spec_the_stack_writes_passes_the_agents_check() -> None:
    """The stack writes a JobSpec's as_dict() (training_constructs/job_spec_parameter.py): as JSON, the agent's
    check_job takes it by the same field names, a submitted job's settings among them."""
    pool = WarmPoolSpec(tag_key="spot-training:warm-pool", pool="t-main", device_name="/dev/sdf", volumes=["vol-1"])
    spec = a_job_spec(warm_pool=pool)
    written = json.loads(json.dumps(spec.as_dict()))
    assert set(written) == SPEC_KEYS and JOB_SETTINGS <= SPEC_KEYS
    merged = check_job(written, {"job_id": "j1", "code_key": "main/code/j1.tar.gz", "max_restarts": 5}, "current")
    assert (merged["argv"], merged["max_restarts"], merged["stall_timeout_s"]) == (["train.py"], 5, None)
    assert merged["warm_pool"] == {
        "tag_key": pool.tag_key,
        "pool": "t-main",
        "device_name": "/dev/sdf",
        "volumes": ["vol-1"],
        "min_free_percent": 20,
    }
    written.pop("bucket")
    with pytest.raises(JobSpecError, match=r"^bucket must be a non-empty string, got None$"):
        check_job(written, {"job_id": "j1", "code_key": "main/code/j1.tar.gz"}, "current")


@pytest.mark.parametrize("free", [-1, 91, 20.5, True, "20"])
def test_a_warm_pool_min_free_percent_out_of_bounds_is_refused_in_one_line(free: Any) -> None:
    pool = {"tag_key": "spot-training:warm-pool", "pool": "t-main", "device_name": "/dev/sdf", "volumes": ["vol-1"]}
    spec = {**a_job_spec().as_dict(), "warm_pool": {**pool, "min_free_percent": free}}
    current = {"job_id": "j1", "code_key": "main/code/j1.tar.gz"}
    with pytest.raises(JobSpecError) as raised:
        check_job(spec, current, "current")
    assert str(raised.value) == f"warm_pool.min_free_percent must be an integer from 0 to 90, got {free!r}"
    del spec["warm_pool"]["min_free_percent"]  # a job spec without the key passes: the agent keeps its default
    assert check_job(spec, current, "current")["warm_pool"] == pool
