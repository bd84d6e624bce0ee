"""Items 4 and 5 of ``make bench``: the real node agent, from a spot notice to a durable checkpoint, and a
replacement node's boot to its first training step, against moto and an IMDSv2 mock on loopback.

Per run: a one-node cluster in moto (bucket, log group, job spec, launch template, Auto Scaling group, a warm
volume pool); node 1 runs its real user data (``user_data.sh`` -> ``node_agent.py`` -> ``torchrun`` -> a trainer
whose state is ``size`` MiB, saved by the shipped checkpoint helper); once it trains, its metadata mock delivers
the notice; the agent SIGTERMs the trainer, which saves, and makes the checkpoint durable in S3, then leaves the
group; moto launches a replacement, which boots as node 2, claims the pool volume, fetches the code, restores the
checkpoint, rendezvouses and trains. Every time is read from the nodes' CloudWatch Logs events (the agent ships
each line with its own millisecond timestamp), as ``emulator/demo.py`` and ``trainctl logs`` read them.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import boto3

from benchmarks import BOOTSTRAP
from emulator.imds import ImdsMock
from team_config.naming import POOL_TAG
from tests.bootstrap.conftest import code_archive, free_port  # the agent harness the bootstrap tests use

REGION = "us-east-1"
TEAM = "bench"
POLL_S = 1.0  # the agent's metadata poll here (the demo's); 5 s on a real node (SPOT_TRAINING_POLL_INTERVAL_S)
CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "bench",
    "AWS_SECRET_ACCESS_KEY": "bench",
    "AWS_SESSION_TOKEN": "bench",
    "AWS_DEFAULT_REGION": REGION,
}
# The trainer: state of SIZE MiB (one tensor) saved by the shipped helper; a fresh run trains until the notice, a
# resumed one trains a few steps and exits (no save: nothing new to upload, the agent writes DONE).
TRAINER = """
import sys, time
import torch
from spot_training.checkpoint import EXIT_INTERRUPTED, Checkpointer

size_mib = int(sys.argv[1])
model = torch.nn.Module()
model.weights = torch.nn.Parameter(torch.zeros(size_mib * 2**20 // 4), requires_grad=False)
ckpt = Checkpointer(model)
restored = ckpt.restore()
step = 0 if restored is None else restored.step
print(f"resumed from step {step}" if restored is not None else "starting fresh", flush=True)
first = step + 1
while True:
    time.sleep(0.02)
    step += 1
    if step == first or step % 50 == 0:
        print(f"step {step} epoch 0 loss 0.0", flush=True)
    if ckpt.step(step, extra={}):
        print(f"interrupted: checkpoint {step} saved, exiting", flush=True)
        sys.exit(EXIT_INTERRUPTED)
    if restored is not None and step >= first + 3:
        ckpt.close()
        sys.exit(0)
"""
STEP = re.compile(r"\bstep (\d+) epoch \d+ loss")


@dataclass
class NoticeTimes:
    size_mib: int
    detect_s: float  # notice delivered -> agent SIGTERMs the trainer (metadata poll)
    save_s: float  # SIGTERM -> the trainer's emergency checkpoint is on disk (snapshot + write + fsync)
    upload_s: float  # on disk -> objects and manifest in S3 (agent: sha256, multipart upload, manifest)

    @property
    def total_s(self) -> float:
        return self.detect_s + self.save_s + self.upload_s


@dataclass
class BootPhases:
    size_mib: int
    phases: dict[str, float]  # in boot order

    @property
    def total_s(self) -> float:
        return sum(self.phases.values())


PHASES = ("metadata", "volume claim", "code fetch", "checkpoint restore", "rendezvous", "first step")


class Emulated:
    """One moto endpoint and its clients, shared by the runs."""

    def __init__(self, endpoint: str, root: Path) -> None:
        self.endpoint, self.root = endpoint, root
        session = boto3.session.Session(
            region_name=REGION,
            aws_access_key_id=CREDENTIALS["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
        )
        self.s3 = session.client("s3", endpoint_url=endpoint)
        self.ssm = session.client("ssm", endpoint_url=endpoint)
        self.asg = session.client("autoscaling", endpoint_url=endpoint)
        self.ec2 = session.client("ec2", endpoint_url=endpoint)
        self.logs = session.client("logs", endpoint_url=endpoint)
        self.hosts = iter(range(100, 250))
        self.runs = 0


class Node:
    """An emulated instance: its IMDSv2 mock on its own loopback address and its user-data process tree."""

    def __init__(self, cloud: Emulated, cluster: str, instance_id: str, private_ip: str) -> None:
        self.cloud, self.instance_id = cloud, instance_id
        self.host = f"127.0.0.{next(cloud.hosts)}"
        self.dir = cloud.root / instance_id
        self.dir.mkdir(parents=True)
        tags = {"spot-training:team": TEAM, "spot-training:cluster": cluster, "aws:autoscaling:groupName": cluster}
        self.imds = ImdsMock(host=self.host, instance_id=instance_id, local_ipv4=private_ip, tags=tags).start()
        (self.dir / "address-map.json").write_text(json.dumps({private_ip: self.host}))
        env = {
            **os.environ,
            **CREDENTIALS,
            "AWS_ENDPOINT_URL": cloud.endpoint,
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
            "AWS_EC2_METADATA_SERVICE_ENDPOINT": self.imds.url,
            "SPOT_TRAINING_PEER_ADDRESS_MAP": str(self.dir / "address-map.json"),
            "SPOT_TRAINING_NODE_ROOT": str(self.dir / "root"),
            "SPOT_TRAINING_POLL_INTERVAL_S": str(POLL_S),
            "SPOT_TRAINING_WARM_VOLUME_MOUNT": "0",  # attach only: mounting needs a real block device
            # the user data's reboot hook goes here, never into the host's cloud-init directory
            "SPOT_TRAINING_PER_BOOT_DIR": str(self.dir / "root" / "var" / "lib" / "cloud" / "scripts" / "per-boot"),
            "SPOT_TRAINING_RDZV_JOIN_TIMEOUT_S": "60",
            "SPOT_TRAINING_DONE_BARRIER_S": "10",
        }
        argv = ["bash", str(BOOTSTRAP / "user_data.sh"), "--region", REGION, "--team", TEAM, "--cluster", cluster]
        self.booted_at = time.time()
        self.proc = subprocess.Popen(  # noqa: S603 - our argv
            [*argv, "--job-spec-parameter", f"/spot-training/{TEAM}/{cluster}/job-spec"],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
        )  # fmt: skip
        self.output: list[str] = []

    def lines(self) -> Iterator[str]:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.output.append(line.rstrip("\n"))
            yield line

    def wait(self, timeout: float = 600) -> int:
        for _ in self.lines():
            pass
        code = self.proc.wait(timeout=timeout)
        self.imds.stop()
        return code

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self.imds.stop()


def _events(cloud: Emulated, group: str, stream: str) -> list[tuple[float, str]]:
    """(seconds since the epoch, message) of a log stream, oldest first."""
    out, token = [], None
    while True:
        kwargs: dict[str, Any] = {"logGroupName": group, "logStreamName": stream, "startFromHead": True}
        if token:
            kwargs["nextToken"] = token
        page = cloud.logs.get_log_events(**kwargs)
        out += [(e["timestamp"] / 1000.0, e["message"]) for e in page["events"]]
        if not page["events"] or page.get("nextForwardToken") == token:
            return out
        token = page.get("nextForwardToken")


def _at(events: list[tuple[float, str]], pattern: str, after: float = 0.0) -> float:
    for at, message in events:
        if at >= after and re.search(pattern, message):
            return at
    raise AssertionError(f"no log line matching {pattern!r}:\n" + "\n".join(m for _, m in events[-40:]))


@dataclass
class Cluster:
    """One run's cluster in moto: its names and the job its nodes run."""

    name: str
    bucket: str
    log_group: str
    job: str

    def in_service(self, cloud: Emulated) -> list[tuple[str, str]]:
        """(instance id, private IP) of the group's InService instances."""
        groups = cloud.asg.describe_auto_scaling_groups(AutoScalingGroupNames=[self.name])["AutoScalingGroups"]
        ids = sorted(i["InstanceId"] for i in groups[0]["Instances"] if i["LifecycleState"] == "InService")
        found = cloud.ec2.describe_instances(InstanceIds=ids)["Reservations"] if ids else []
        ips = {i["InstanceId"]: i["PrivateIpAddress"] for r in found for i in r["Instances"]}
        return [(i, ips[i]) for i in ids]

    def events(self, cloud: Emulated, instance_id: str) -> list[tuple[float, str]]:
        return _events(cloud, self.log_group, f"{self.job}/{instance_id}")


def _job_spec(cluster: Cluster, parameter: str) -> dict[str, Any]:
    name = cluster.name
    return {
        "version": 1, "team": TEAM, "cluster": name, "region": REGION, "bucket": cluster.bucket, "prefix": f"{name}/",
        "log_group": cluster.log_group, "current_job_parameter": f"{parameter}/current-job",
        "command": "python train.py", "python": sys.executable, "nproc_per_node": 1, "min_nodes": 1,
        "desired_nodes": 1, "max_nodes": 1,
        "checkpoint_dir": "/opt/ml/checkpoints", "checkpoint_interval_s": 1e6,  # only the emergency checkpoint
        "mean_time_between_interruptions_s": 3600, "max_restarts": 1, "interruption_grace_s": 110,
        "rendezvous_port": free_port("127.0.0.1"),
        "warm_pool": {"tag_key": POOL_TAG, "pool": name, "device_name": "/dev/sdf"},
    }  # fmt: skip


def _create_cluster(cloud: Emulated, size_mib: int) -> Cluster:
    """A one-node cluster in moto: bucket, log group, job spec and current job, a warm pool volume, launch
    template and Auto Scaling group."""
    cloud.runs += 1
    name = f"c{cloud.runs}-{size_mib}"
    cluster = Cluster(name, f"bench-{name}", f"/spot-training/{TEAM}/{name}", f"job-{name}")
    parameter = f"/spot-training/{TEAM}/{name}"
    cloud.s3.create_bucket(Bucket=cluster.bucket)
    cloud.logs.create_log_group(logGroupName=cluster.log_group)
    spec = _job_spec(cluster, parameter)
    cloud.ssm.put_parameter(Name=f"{parameter}/job-spec", Value=json.dumps(spec), Type="String", Overwrite=True)
    code_key = f"{name}/code/{cluster.job}.tar.gz"
    cloud.s3.put_object(Bucket=cluster.bucket, Key=code_key, Body=code_archive({"train.py": TRAINER}))
    current = {"job_id": cluster.job, "code_key": code_key, "command": f"python train.py {size_mib}"}
    cloud.ssm.put_parameter(Name=spec["current_job_parameter"], Value=json.dumps(current), Type="String")
    az = f"{REGION}a"
    tags = [{"ResourceType": "volume", "Tags": [{"Key": POOL_TAG, "Value": name}]}]
    cloud.ec2.create_volume(AvailabilityZone=az, Size=8, TagSpecifications=tags)
    image = cloud.ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
    template = {"ImageId": image, "InstanceType": "g5.xlarge"}
    cloud.ec2.create_launch_template(LaunchTemplateName=f"lt-{name}", LaunchTemplateData=template)
    cloud.asg.create_auto_scaling_group(
        AutoScalingGroupName=name, LaunchTemplate={"LaunchTemplateName": f"lt-{name}"},
        MinSize=0, MaxSize=2, DesiredCapacity=1, AvailabilityZones=[az],
    )  # fmt: skip
    return cluster


def _interrupt(cloud: Emulated, cluster: Cluster, nodes: list[Node], size_mib: int) -> tuple[NoticeTimes, str]:
    """Boot the group's node, deliver the notice once it trains; the notice's times and the checkpoint's step."""
    ((instance_id, private_ip),) = cluster.in_service(cloud)
    node = Node(cloud, cluster.name, instance_id, private_ip)
    nodes.append(node)
    noticed_at: Optional[float] = None
    for line in node.lines():
        if noticed_at is None and STEP.search(line):
            noticed_at = time.time()
            node.imds.interrupt()
    assert node.wait() == 0 and noticed_at is not None, "\n".join(node.output[-40:])
    events = cluster.events(cloud, instance_id)
    sigterm = _at(events, r"sending SIGTERM to the trainer", noticed_at)
    saved_match = next(m for _, msg in events if (m := re.search(r"interrupted: checkpoint (\d+) saved", msg)))
    step = saved_match.group(1)
    saved = _at(events, rf"interrupted: checkpoint {step} saved", sigterm)
    durable = _at(events, rf"checkpoint {step} durable in s3://", saved)
    manifest = f"{cluster.name}/{cluster.job}/ckpt/{step}/spot-training-manifest.json"
    cloud.s3.head_object(Bucket=cluster.bucket, Key=manifest)  # the manifest is in S3
    return NoticeTimes(size_mib, sigterm - noticed_at, saved - sigterm, durable - saved), step


def _replace(cloud: Emulated, cluster: Cluster, nodes: list[Node], size_mib: int, step: str) -> BootPhases:
    """Boot the group's replacement until its trainer resumes from ``step`` and exits; its boot phases."""
    ((instance_id, private_ip),) = cluster.in_service(cloud)
    node = Node(cloud, cluster.name, instance_id, private_ip)
    nodes.append(node)
    assert node.wait() == 0, "\n".join(node.output[-40:])
    events = cluster.events(cloud, instance_id)
    marks = [
        node.booted_at,
        events[0][0],  # the agent's first line: user data read IMDSv2, the agent started, read the job spec
        _at(events, r"step 'claim warm volume' took"),
        _at(events, r"step 'download code' took"),
        _at(events, r"step 'restore checkpoint' took"),
        _at(events, rf"resumed from step {step}\b"),
    ]
    marks.append(_at(events, STEP.pattern, marks[-1]))
    phases = {p: b - a for p, a, b in zip(PHASES, marks[:-1], marks[1:], strict=True)}
    return BootPhases(size_mib, phases)


def run(cloud: Emulated, size_mib: int) -> tuple[NoticeTimes, BootPhases]:
    """One notice -> durable -> replacement -> first step run with a ``size_mib`` MiB checkpoint."""
    cluster = _create_cluster(cloud, size_mib)
    nodes: list[Node] = []
    try:
        notice, step = _interrupt(cloud, cluster, nodes, size_mib)
        return notice, _replace(cloud, cluster, nodes, size_mib, step)
    finally:
        for node in nodes:
            node.kill()
        for page in cloud.s3.get_paginator("list_objects_v2").paginate(Bucket=cluster.bucket):
            for obj in page.get("Contents", []):
                cloud.s3.delete_object(Bucket=cluster.bucket, Key=obj["Key"])


def projected_upload_s(size_mib: int, part_mib: int, concurrency: int, per_connection_mb_s: float) -> float:
    """Upload time on a real instance if each connection moves ``per_connection_mb_s`` MB/s: the file in parts of
    ``part_mib`` MiB (one request below that size), ``concurrency`` parts in flight."""
    size = size_mib * 2**20
    part = part_mib * 2**20
    if size <= part:
        return size / (per_connection_mb_s * 1e6)
    parts = -(-size // part)
    waves = -(-parts // concurrency)
    return waves * part / (per_connection_mb_s * 1e6)
