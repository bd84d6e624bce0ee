"""Shared fixtures for the on-instance bootstrap tests: moto on 127.0.0.1, IMDS mocks on 127.0.0.x, clusters.

Everything listens on and talks to loopback only. Emulated instances get 10.x private IPs from moto: those are
labels; ``Cluster.address_map`` maps each one to the node's loopback address (SPOT_TRAINING_PEER_ADDRESS_MAP).
"""

from __future__ import annotations

import contextlib
import functools
import io
import json
import os
import queue
import re
import signal
import socket
import subprocess
import sys
import tarfile
import threading
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, Optional

import boto3
import pytest

from emulator import http_serving
from emulator.imds import ImdsMock
from emulator.request_counts import RequestCounts
from team_config.naming import CLUSTER_TAG, TEAM_TAG

REPO = Path(__file__).resolve().parents[2]
BOOTSTRAP = REPO / "bootstrap_scripts"
EXAMPLE = REPO / "examples" / "digits" / "train.py"
EXAMPLE_FILES = {f.name: f.read_bytes() for f in EXAMPLE.parent.iterdir() if f.is_file()}  # train.py, digits.npz
REGION = "us-east-1"
TEAM = "team-a"
FAKE_CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SESSION_TOKEN": "testing",
    "AWS_DEFAULT_REGION": REGION,
}
sys.path.insert(0, str(BOOTSTRAP))  # node_agent and spot_training, as on the node


class Clients:
    def __init__(self, endpoint: str) -> None:
        session = boto3.session.Session(region_name=REGION)
        self.endpoint = endpoint
        self.s3 = session.client("s3", endpoint_url=endpoint)
        self.ssm = session.client("ssm", endpoint_url=endpoint)
        self.asg = session.client("autoscaling", endpoint_url=endpoint)
        self.ec2 = session.client("ec2", endpoint_url=endpoint)
        self.logs = session.client("logs", endpoint_url=endpoint)

    @functools.cached_property
    def image_id(self) -> str:
        """An AMI of moto's: looked up once per session (moto lists its 1,300 AMIs in about 2 s)."""
        return str(self.ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"])


@contextlib.contextmanager
def moto_with_fake_credentials(counts: Optional[RequestCounts] = None) -> Iterator[str]:
    """moto served on 127.0.0.1 (free port, requests counted in ``counts``), its endpoint and fake credentials in
    the environment while the block runs (the node agents started in it inherit them); yields the endpoint."""
    saved = {k: os.environ.get(k) for k in [*FAKE_CREDENTIALS, "AWS_ENDPOINT_URL"]}
    os.environ.update(FAKE_CREDENTIALS)
    try:
        with http_serving.moto_in_thread(counts=counts) as endpoint:
            os.environ["AWS_ENDPOINT_URL"] = endpoint
            yield endpoint
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@pytest.fixture(scope="session")
def aws() -> Iterator[Clients]:
    """moto server on 127.0.0.1 (free port) with fake credentials in the environment for the whole session."""
    with moto_with_fake_credentials() as endpoint:
        yield Clients(endpoint)


def loopback(last: int) -> str:
    """A node's loopback address, 127.0.<worker>.<last>: each pytest-xdist worker (gw0, gw1, ...) has a /24 of its
    own, so that nodes of tests running at the same time never share an address and port. The emulator's launchers
    take /24s from 127.1.0.0 up (emulator/nodes.py)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    return f"127.0.{int(worker.removeprefix('gw'))}.{last}"


def free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def code_archive(files: Mapping[str, str | bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, text in files.items():
            data = text.encode() if isinstance(text, str) else text
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


class Cluster:
    """One emulated cluster in moto: bucket, log group, job-spec parameter, launch template and ASG."""

    def __init__(self, aws: Clients, root: Path, nodes: int = 1, **spec: Any) -> None:
        self.aws, self.root = aws, root
        self.name = "c" + uuid.uuid4().hex[:8]
        self.bucket = f"ckpt-{self.name}"
        self.log_group = f"/spot-training/{TEAM}/{self.name}"
        self.spec_parameter = f"/spot-training/{TEAM}/{self.name}/job-spec"
        self.current_parameter = f"/spot-training/{TEAM}/{self.name}/current-job"
        self.group = f"asg-{self.name}"
        aws.s3.create_bucket(Bucket=self.bucket)
        aws.logs.create_log_group(logGroupName=self.log_group)
        self.spec: dict[str, Any] = {
            "version": 1,
            "team": TEAM,
            "cluster": self.name,
            "region": REGION,
            "bucket": self.bucket,
            "prefix": f"{self.name}/",
            "log_group": self.log_group,
            "current_job_parameter": self.current_parameter,
            "command": "python train.py",
            "python": sys.executable,
            "nproc_per_node": 1,
            "min_nodes": nodes,
            "desired_nodes": nodes,
            "max_nodes": nodes,
            "checkpoint_dir": "/opt/ml/checkpoints",
            "checkpoint_interval_s": None,
            "mean_time_between_interruptions_s": 3600,
            "max_restarts": 1,
            "interruption_grace_s": 60,
            "rendezvous_port": free_port("127.0.0.1"),
            "warm_pool": None,
        }
        self.spec.update(spec)
        self.put_spec()
        aws.ec2.create_launch_template(
            LaunchTemplateName=f"lt-{self.name}",
            LaunchTemplateData={"ImageId": aws.image_id, "InstanceType": "t3.micro"},
        )
        aws.asg.create_auto_scaling_group(
            AutoScalingGroupName=self.group,
            LaunchTemplate={"LaunchTemplateName": f"lt-{self.name}"},
            MinSize=0,
            MaxSize=max(nodes, 2),
            DesiredCapacity=nodes,
            AvailabilityZones=[f"{REGION}a"],
            Tags=[{"Key": TEAM_TAG, "Value": TEAM}, {"Key": CLUSTER_TAG, "Value": self.name}],  # trainctl finds it
        )

    def put_spec(self) -> None:
        self.aws.ssm.put_parameter(Name=self.spec_parameter, Value=json.dumps(self.spec), Type="String", Overwrite=True)

    def submit(self, job_id: str, files: Mapping[str, str | bytes], command: str, **overrides: Any) -> dict[str, Any]:
        """What a submit tool does: upload the code tarball, write the current-job parameter."""
        key = f"{self.name}/code/{job_id}.tar.gz"
        self.aws.s3.put_object(Bucket=self.bucket, Key=key, Body=code_archive(files))
        job = {"job_id": job_id, "code_key": key, "command": command, **overrides}
        self.aws.ssm.put_parameter(Name=self.current_parameter, Value=json.dumps(job), Type="String", Overwrite=True)
        return job

    def instances(self) -> list[tuple[str, str]]:
        """(instance id, private IP) of the group's InService instances, sorted by id."""
        group = self.aws.asg.describe_auto_scaling_groups(AutoScalingGroupNames=[self.group])["AutoScalingGroups"][0]
        ids = sorted(i["InstanceId"] for i in group["Instances"] if i["LifecycleState"] == "InService")
        found = self.aws.ec2.describe_instances(InstanceIds=ids)["Reservations"]
        ips = {i["InstanceId"]: i["PrivateIpAddress"] for r in found for i in r["Instances"]}
        return [(i, ips[i]) for i in ids]

    def desired_capacity(self) -> int:
        group = self.aws.asg.describe_auto_scaling_groups(AutoScalingGroupNames=[self.group])["AutoScalingGroups"][0]
        return int(group["DesiredCapacity"])

    def marker(self, job_id: str, name: str) -> Optional[dict[str, Any]]:
        try:
            body = self.aws.s3.get_object(Bucket=self.bucket, Key=f"{self.name}/{job_id}/{name}")["Body"].read()
        except self.aws.s3.exceptions.NoSuchKey:
            return None
        return dict(json.loads(body))

    def manifests(self, job_id: str) -> list[int]:
        """Steps of the job's complete checkpoints (with a manifest), newest first."""
        found = self.aws.s3.list_objects_v2(Bucket=self.bucket, Prefix=f"{self.name}/{job_id}/ckpt/").get(
            "Contents", []
        )
        return sorted(
            (int(o["Key"].split("/")[3]) for o in found if o["Key"].endswith("/spot-training-manifest.json")),
            reverse=True,
        )

    def log_messages(self, job_id: str, instance_id: str) -> list[str]:
        events = self.aws.logs.get_log_events(logGroupName=self.log_group, logStreamName=f"{job_id}/{instance_id}")
        return [e["message"] for e in events["events"]]


class Node:
    """One emulated instance: its IMDS mock on its own loopback address and its user-data process tree."""

    def __init__(self, cluster: Cluster, instance_id: str, private_ip: str, host: str) -> None:
        self.cluster, self.instance_id, self.private_ip, self.host = cluster, instance_id, private_ip, host
        self.dir = cluster.root / instance_id
        self.dir.mkdir(parents=True, exist_ok=True)
        self.checkpoint_dir = self.dir / "root" / "opt" / "ml" / "checkpoints"  # spec's checkpoint_dir under the root
        self.per_boot_dir = self.dir / "root" / "var" / "lib" / "cloud" / "scripts" / "per-boot"
        self.imds = ImdsMock(
            host=host,
            instance_id=instance_id,
            local_ipv4=private_ip,
            tags={
                "spot-training:team": TEAM,
                "spot-training:cluster": cluster.name,
                "aws:autoscaling:groupName": cluster.group,
            },
        ).start()
        self.proc: Optional[subprocess.Popen[str]] = None
        self.output: list[str] = []
        self._lines: queue.Queue[Optional[str]] = queue.Queue()
        self._reader: Optional[threading.Thread] = None

    def start(self, address_map: dict[str, str], **env: str) -> Node:
        map_file = self.dir / "address-map.json"
        map_file.write_text(json.dumps(address_map))
        full_env = {
            **os.environ,
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
            "AWS_EC2_METADATA_SERVICE_ENDPOINT": self.imds.url,
            "SPOT_TRAINING_PEER_ADDRESS_MAP": str(map_file),
            "SPOT_TRAINING_NODE_ROOT": str(self.dir / "root"),
            "SPOT_TRAINING_POLL_INTERVAL_S": "0.5",
            "SPOT_TRAINING_RDZV_JOIN_TIMEOUT_S": "60",
            "SPOT_TRAINING_DONE_BARRIER_S": "30",
            # the user data's reboot hook: into the node's own directory, never the host's /var/lib/cloud
            "SPOT_TRAINING_PER_BOOT_DIR": str(self.per_boot_dir),
            **env,
        }
        self.proc = subprocess.Popen(
            [
                "bash",
                str(BOOTSTRAP / "user_data.sh"),
                "--region",
                REGION,
                "--team",
                TEAM,
                "--cluster",
                self.cluster.name,
                "--job-spec-parameter",
                self.cluster.spec_parameter,
            ],
            env=full_env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        self._reader = threading.Thread(target=self._pump, daemon=True)
        self._reader.start()
        return self

    def _pump(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for line in self.proc.stdout:
            self.output.append(line.rstrip("\n"))
            self._lines.put(line)
        self._lines.put(None)

    def lines(self, timeout: float = 150, total: float = 300, most: int = 100_000) -> Iterator[str]:
        """The node's output line by line as it comes, until it exits. Bounded for a caller that waits for a line
        that never comes: fails after ``timeout`` s without a line, ``total`` s in all, or ``most`` lines."""
        deadline = time.monotonic() + total
        overdue = f"{self.instance_id} still running after {total} s without the line awaited"
        for _ in range(most):
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"{overdue}:\n{self.text}")
            try:
                line = self._lines.get(timeout=min(timeout, left))
            except queue.Empty:
                if left <= timeout:
                    raise AssertionError(f"{overdue}:\n{self.text}") from None
                raise AssertionError(f"no output from {self.instance_id} for {timeout} s:\n{self.text}") from None
            if line is None:
                self._lines.put(None)
                return
            yield line
        raise AssertionError(f"{self.instance_id} printed {most} lines without the line awaited:\n{self.text}")

    def wait(self, timeout: float = 150) -> int:
        assert self.proc is not None
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise AssertionError(f"{self.instance_id} still running after {timeout} s:\n{self.text}") from None
        if self._reader is not None:
            self._reader.join(timeout=10)
        return code

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)  # the whole process tree: agent, torchrun, workers
            self.proc.wait()
        self.imds.stop()

    @property
    def text(self) -> str:
        return "\n".join(self.output)


@pytest.fixture
def make_cluster(aws: Clients, tmp_path: Path) -> Any:
    def make(nodes: int = 1, **spec: Any) -> Cluster:
        return Cluster(aws, tmp_path, nodes, **spec)

    return make


@pytest.fixture
def make_nodes() -> Iterator[Any]:
    """Nodes for the cluster's current InService instances, on ``loopback(20)``, ``loopback(21)``, ..."""
    started: list[Node] = []
    counter = iter(range(20, 250))

    def make(cluster: Cluster) -> list[Node]:
        nodes = [Node(cluster, iid, ip, loopback(next(counter))) for iid, ip in cluster.instances()]
        started.extend(nodes)
        return nodes

    yield make
    for node in started:
        node.stop()


def address_map(nodes: list[Node]) -> dict[str, str]:
    return {n.private_ip: n.host for n in nodes}


# One transition as the node agent logs it (in-process: the message alone; on a node: after its time and id)
STATE_LINE = re.compile(r"(?:^| node-agent \S+ )state ([A-Z_]+) -> ([A-Z_]+): ")


def states(lines: Iterable[str]) -> list[str]:
    """The node's lifecycle states in the order its agent logged the transitions (``state A -> B: reason``), from the
    first one's A; each transition must start where the one before ended."""
    path: list[str] = []
    for line in lines:
        found = STATE_LINE.search(line)
        if found is None:
            continue
        source, target = found.groups()
        assert not path or path[-1] == source, f"{line!r} after the states {path}"
        path += [target] if path else [source, target]
    return path
