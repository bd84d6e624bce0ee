"""One real job with moto's IAM enforcement on from submit to the group at 0, every node calling AWS as its
instance role: what the node agent (and the user data, and the AWS CLI in it) really calls in a job must be
allowed by the role the stack gives the instances, not only the calls tests/emulator/test_isolation.py lists.

The real CDK CLI deploys TrainingStack (enforcement off: the deploy uses the emulator's fake root key). Then an IAM
user allowed everything becomes the harness's identity (``EmulatedCloud.use_admin_user``: submitting, polling the
group, booting and reclaiming nodes, reading S3 and the logs) and enforcement goes on. The nodes run with
``NodeLauncher(instance_credentials=True)``: no AWS keys in their environment; their metadata mock serves the
credentials of the instance profile's role (assumed by the launcher, session name the instance id) under
``iam/security-credentials/<role>``, where botocore and the AWS CLI find them, as on an instance.

The job: the example trainer on 2 nodes, one of which gets a spot interruption notice once a checkpoint is
durable (emergency checkpoint, ``leaving`` marker, hand-back through Auto Scaling, a replacement that restores).
It must end ``DONE`` with the group at 0 and no node having logged an access-denied error.

With the same node credentials afterwards, S3 refuses a put or delete of the job's code archive and a delete of
its markers (only checkpoints are deletable by the nodes).

The negative check proves the harness can fail: the same cluster with ``s3:PutObject`` taken out of the role's
policy (one action of one statement): the node's agent gets ``AccessDenied`` on its boot marker, logs it,
leaves the group, and the job never reaches ``DONE``.

What moto evaluates and what it does not (condition keys, the second resource of a request, ...): see
emulator/iam_resources.py and test_isolation.py; those limits hold here too.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError

from emulator import EmulatedCloud
from emulator.demo import CLUSTER, EXAMPLE_DIR, NODE_ENV, STACK, TEAM, JobRun, interrupt_once
from emulator.deploy import bootstrap, deploy
from emulator.iam_resources import Refusal, refusals
from emulator.nodes import Node, NodeLauncher
from trainctl import jobs

pytestmark = pytest.mark.slow

EPOCHS = 3
DENIED = ("AccessDenied", "UnauthorizedOperation")
TIMEOUT_S = 480.0


@dataclass
class Finished:
    ref: jobs.ClusterRef
    job_id: str
    nodes: list[Node]
    role_name: str
    refused: list[Refusal]  # what enforcement refused during the job (then one call outside the role, on purpose)
    environments: dict[str, dict[str, str]]  # instance id -> its node agent's environment, read while it ran
    denied_outside_role: ClientError  # that call outside the role, made with a node's credentials at the job's end


@pytest.fixture(scope="module")
def cloud(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmulatedCloud]:
    with EmulatedCloud(run_dir=tmp_path_factory.mktemp("iam-job"), iam_enforcement=True) as c:
        bootstrap(c)
        deploy(c, STACK)
        c.use_admin_user()
        yield c


def instance_role(cloud: EmulatedCloud, ref: jobs.ClusterRef) -> str:
    """The role of the instance profile in the group's launch template (what the nodes must be running as)."""
    [group] = cloud.client("autoscaling").describe_auto_scaling_groups(AutoScalingGroupNames=[ref.group])[
        "AutoScalingGroups"
    ]
    spec = group["MixedInstancesPolicy"]["LaunchTemplate"]["LaunchTemplateSpecification"]
    [version] = cloud.client("ec2").describe_launch_template_versions(
        LaunchTemplateId=spec["LaunchTemplateId"], Versions=[spec["Version"]]
    )["LaunchTemplateVersions"]
    profile = version["LaunchTemplateData"]["IamInstanceProfile"]["Arn"].rsplit("/", 1)[-1]
    [role] = cloud.client("iam").get_instance_profile(InstanceProfileName=profile)["InstanceProfile"]["Roles"]
    return str(role["RoleName"])


def node_client(cloud: EmulatedCloud, node: Node, service: str) -> Any:
    """A client with the credentials the node's metadata served (the role's, assumed for this instance)."""
    assert node.imds.role_credentials is not None
    creds = node.imds.role_credentials
    return boto3.session.Session().client(
        service,
        endpoint_url=cloud.endpoint_url,
        region_name=cloud.region,
        verify=str(cloud.ca_bundle),
        aws_access_key_id=creds["AccessKeyId"],
        aws_secret_access_key=creds["SecretAccessKey"],
        aws_session_token=creds["Token"],
    )


def environment(pid: int) -> dict[str, str]:
    """A running process's environment ({} once it exited)."""
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except (FileNotFoundError, ProcessLookupError):
        return {}
    pairs = (item.decode(errors="replace").partition("=") for item in raw.split(b"\0") if item)
    return {key: value for key, _, value in pairs}


def wait_until(predicate: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(0.5)


@pytest.fixture(scope="module")
def finished(cloud: EmulatedCloud) -> Finished:
    assert cloud.run_dir is not None
    client = cloud.client
    ref = jobs.find_cluster(client, TEAM, CLUSTER)
    role_name = instance_role(cloud, ref)
    try:
        # the launcher assumes the role when it starts, before enforcement (see emulator/nodes.py)
        with NodeLauncher(
            cloud, cloud.run_dir / "nodes", groups=[ref.group], node_env=NODE_ENV, instance_credentials=True
        ) as launcher:
            offset = cloud.server_log.stat().st_size
            cloud.enforce_iam(True)
            try:
                job_id = jobs.submit(
                    client,
                    ref,
                    EXAMPLE_DIR,
                    command=f"python train.py --epochs {EPOCHS} --seed 0 --step-sleep-s 0.15",
                    nodes=2,
                    python=sys.executable,
                    min_nodes=2,
                    max_nodes=2,
                    checkpoint_interval_s=2.0,
                )
                run = JobRun(client, ref, job_id, launcher, time.monotonic() + TIMEOUT_S, lambda _: None)
                interrupt_once(10)(run)
                # the survivor and the replacement train on: their processes (user data exec'd the agent) are up
                # (not the interrupted node: it may still be handing its instance back)
                environments = {i: environment(launcher.node(i).proc.pid) for i in run.running()}
                run.wait_for(
                    lambda: any(jobs.marker(client, ref, job_id, m) for m in ("DONE", "FAILED")), "the job's end"
                )
                run.wait_for(
                    lambda: jobs.desired_capacity(client, ref) == 0 and not launcher.running(), "the group at 0"
                )
            except BaseException:
                client("autoscaling").set_desired_capacity(AutoScalingGroupName=ref.group, DesiredCapacity=0)
                raise
            nodes = launcher.all_nodes()
        # still enforced: the credentials a node was given are limited to its role
        with pytest.raises(ClientError) as denied:
            node_client(cloud, nodes[0], "s3").list_buckets()
        refused = refusals(cloud.server_log, offset)
        return Finished(ref, job_id, nodes, role_name, refused, environments, denied.value)
    finally:
        cloud.enforce_iam(False)


def test_job_is_done_under_enforcement_and_the_group_is_at_zero(cloud: EmulatedCloud, finished: Finished) -> None:
    ref, job_id = finished.ref, finished.job_id
    assert jobs.marker(cloud.client, ref, job_id, "DONE") is not None
    assert jobs.marker(cloud.client, ref, job_id, "FAILED") is None
    [group] = cloud.client("autoscaling").describe_auto_scaling_groups(AutoScalingGroupNames=[ref.group])[
        "AutoScalingGroups"
    ]
    assert (group["DesiredCapacity"], group["Instances"]) == (0, [])
    assert len(finished.nodes) == 3  # two, and the replacement of the interrupted one
    assert jobs.leaving_nodes(cloud.client, ref, job_id)  # the interruption's path ran too


def test_nothing_was_refused_but_the_one_call_outside_the_role(finished: Finished) -> None:
    """Enforcement was on, and the role allowed every call of every node (and the harness's admin user all of its):
    moto refused exactly one request in the whole job, the check made afterwards with a node's credentials.
    Read from the server's log, so a refusal the agent tolerated (a failed log upload, say) counts too."""
    [node_key] = {n.imds.role_credentials["AccessKeyId"] for n in finished.nodes if n.imds.role_credentials}
    assert finished.denied_outside_role.response["Error"]["Code"] in DENIED
    assert [(r.action, r.access_key_id) for r in finished.refused] == [("s3:ListAllMyBuckets", node_key)]


def test_every_node_called_aws_as_its_instance_role(finished: Finished) -> None:
    """Credentials from the metadata mock, none in the environment, and no denial in any node's console."""
    path = f"GET /latest/meta-data/iam/security-credentials/{finished.role_name}"
    for node in finished.nodes:
        assert node.imds.role_name == finished.role_name
        assert path in node.imds.requests, node.imds.requests
        console = node.console.read_text(errors="replace")
        assert not [line for line in console.splitlines() if any(code in line for code in DENIED)], node.console
    read = {i: env for i, env in finished.environments.items() if env}
    assert len(read) == 2, finished.environments.keys()
    for env in read.values():
        assert env["SPOT_TRAINING_NODE_ROOT"]  # a node's process
        assert not {k for k in env if k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")}
        assert "AWS_EC2_METADATA_DISABLED" not in env
        assert env["AWS_EC2_METADATA_SERVICE_ENDPOINT"].startswith("http://127.")


def test_every_node_shipped_its_log_under_enforcement(cloud: EmulatedCloud, finished: Finished) -> None:
    streams = jobs.stream_events(cloud.client, finished.ref, finished.job_id)
    shipped = {name.rsplit("/", 1)[-1] for name, events in streams.items() if events}
    assert shipped == {n.instance_id for n in finished.nodes}


def test_the_node_role_cannot_touch_the_code_archives_or_delete_markers(
    cloud: EmulatedCloud, finished: Finished
) -> None:
    """The training code runs with the node's credentials: it may read the code archives (that is how the job
    ran) but not overwrite or delete them (other jobs run them), nor delete a job's markers. Only checkpoints are
    deletable (the agent prunes them). Checked on the finished job's own keys, enforcement on again."""
    ref, job_id = finished.ref, finished.job_id
    node = finished.nodes[0]
    assert node.imds.role_credentials is not None
    s3 = node_client(cloud, node, "s3")
    code_key = f"{ref.code_prefix}{job_id}.tar.gz"
    done_key = f"{ref.job_prefix(job_id)}DONE"
    boot_key = f"{ref.job_prefix(job_id)}nodes/{node.instance_id}/boot"
    # matches the checkpoint Allow (<cluster>/*/ckpt/*: S3's * crosses '/'), so only the Deny on the code folder
    # refuses it
    shadow_key = f"{ref.code_prefix}x/ckpt/y"
    attempts = [
        ("s3:PutObject", code_key, lambda: s3.put_object(Bucket=ref.bucket, Key=code_key, Body=b"planted")),
        ("s3:PutObject", shadow_key, lambda: s3.put_object(Bucket=ref.bucket, Key=shadow_key, Body=b"planted")),
        ("s3:DeleteObject", code_key, lambda: s3.delete_object(Bucket=ref.bucket, Key=code_key)),
        ("s3:DeleteObject", done_key, lambda: s3.delete_object(Bucket=ref.bucket, Key=done_key)),
        ("s3:DeleteObject", boot_key, lambda: s3.delete_object(Bucket=ref.bucket, Key=boot_key)),
    ]
    offset = cloud.server_log.stat().st_size
    cloud.enforce_iam(True)
    try:
        archive = s3.get_object(Bucket=ref.bucket, Key=code_key)["Body"].read()
        for _, _, call in attempts:
            with pytest.raises(ClientError) as denied:
                call()
            assert denied.value.response["Error"]["Code"] in DENIED
    finally:
        cloud.enforce_iam(False)
    refused = [(r.action, r.access_key_id, r.resource) for r in refusals(cloud.server_log, offset)]
    key_id = node.imds.role_credentials["AccessKeyId"]
    assert refused == [(action, key_id, f"arn:aws:s3:::{ref.bucket}/{key}") for action, key, _ in attempts]
    admin = cloud.client("s3")
    assert admin.get_object(Bucket=ref.bucket, Key=code_key)["Body"].read() == archive
    assert jobs.marker(cloud.client, ref, job_id, "DONE") is not None


# ---------------------------------------------------------------------------------------------------- negative
def without_action(document: dict[str, Any], action: str) -> dict[str, Any]:
    """The policy document with ``action`` taken out of every statement that allows it (dropped if it was alone)."""
    statements = document["Statement"] if isinstance(document["Statement"], list) else [document["Statement"]]
    kept = []
    for statement in statements:
        actions = statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]]
        if statement["Effect"] == "Allow" and action in actions:
            actions = [a for a in actions if a != action]
            if not actions:
                continue
            statement = {**statement, "Action": actions}
        kept.append(statement)
    return {**document, "Statement": kept}


def test_a_role_without_s3_put_object_is_denied_and_the_job_never_finishes(
    cloud: EmulatedCloud, finished: Finished
) -> None:
    assert cloud.run_dir is not None
    client, ref, role = cloud.client, finished.ref, finished.role_name
    iam = client("iam")
    originals = {
        name: iam.get_role_policy(RoleName=role, PolicyName=name)["PolicyDocument"]
        for name in iam.list_role_policies(RoleName=role)["PolicyNames"]
    }
    changed = {
        name: reduced
        for name, document in originals.items()
        if (reduced := without_action(document, "s3:PutObject")) != document
    }
    assert len(changed) == 1, originals  # exactly one statement of the role grants it
    for name, document in changed.items():
        iam.put_role_policy(RoleName=role, PolicyName=name, PolicyDocument=json.dumps(document))
    offset = cloud.server_log.stat().st_size
    try:
        with NodeLauncher(
            cloud, cloud.run_dir / "nodes-denied", groups=[ref.group], node_env=NODE_ENV, instance_credentials=True
        ) as launcher:
            cloud.enforce_iam(True)
            try:
                job_id = jobs.submit(
                    client, ref, EXAMPLE_DIR, command="python train.py --epochs 1", nodes=1, python=sys.executable
                )
                wait_until(lambda: launcher.all_nodes(), TIMEOUT_S, "the node to boot")
                wait_until(
                    lambda: jobs.desired_capacity(client, ref) == 0 and not launcher.running(),
                    TIMEOUT_S,
                    "the denied node to leave the group",
                )
            finally:
                client("autoscaling").set_desired_capacity(AutoScalingGroupName=ref.group, DesiredCapacity=0)
            [node] = launcher.all_nodes()
        console = node.console.read_text(errors="replace")
        assert "AccessDenied" in console and "PutObject" in console, console[-2000:]
        assert jobs.marker(client, ref, job_id, "DONE") is None
        assert node.imds.role_credentials is not None
        refused = [(r.action, r.access_key_id, r.resource) for r in refusals(cloud.server_log, offset)]
        boot_marker = f"arn:aws:s3:::{ref.bucket}/{ref.job_prefix(job_id)}nodes/{node.instance_id}/boot"
        assert refused == [("s3:PutObject", node.imds.role_credentials["AccessKeyId"], boot_marker)]
    finally:
        cloud.enforce_iam(False)
        for name, document in originals.items():
            iam.put_role_policy(RoleName=role, PolicyName=name, PolicyDocument=json.dumps(document))
