#!/usr/bin/env python3
"""Node agent: runs one training job on one spot instance and loses nothing when the instance goes.

Started by ``user_data.sh`` (which reads the instance identity from IMDSv2). Python 3.8+, stdlib + boto3 only.

What it does, in order: read and validate the job (SSM job-spec parameter merged with the per-job
``current-job`` parameter); claim a pre-warmed volume of the pool (if any); download and safely
unpack the code; restore the newest *complete* checkpoint from S3; find the peers (InService instances of
the Auto Scaling group; the oldest launch hosts the rendezvous); run torchrun; meanwhile poll IMDS for spot
interruption notices and rebalance recommendations, sync the checkpoint directory to S3 and ship logs to
CloudWatch Logs; finally write ``DONE`` (and scale the group to 0) or ``FAILED`` (and scale to 0), or leave
the group (one node fewer) when a peer is still finishing: the last node writes ``DONE``.

S3 layout, under ``s3://<bucket>/<cluster>/<job>/``:
  ckpt/<step>/<files...>                 one checkpoint; ``ckpt/<step>/spot-training-manifest.json`` is
                                         written last (size, sha256 and the sha256 of every part of every file).
                                         No manifest: it does not exist.
  nodes/<instance-id>/done               a node finished (barrier before the job's DONE)
  nodes/<instance-id>/leaving            a node got a notice and will not join another rendezvous; "trainer": false
                                         if it came before its trainer started (no trainer of its stops the peers':
                                         they restart without it as soon as it leaves the group)
  nodes/<instance-id>/synced             a node's final checkpoint sync of a training attempt is over (nodes leaving on
                                         a notice or a stop wait for their peers' before they go)
  nodes/<instance-id>/save-request       a node got a rebalance recommendation; every agent asks its trainer for a
                                         checkpoint (rank 0, which decides, may run on another node)
  nodes/<instance-id>/progress           with the stall watchdog on: the node's trainer printed or wrote a checkpoint
                                         (rewritten at most every stall_timeout_s / 4); its S3 time is progress for
                                         every node of the job
  DONE, FAILED, STOPPED                  job markers (JSON); STOP: a stop request (trainctl stop)
Logs: log group from the job spec, stream ``<job>/<instance-id>``.

Local checkpoint directory (``checkpoint_dir`` of the spec):
  <step>/                                a complete checkpoint (a directory named by an integer appears atomically:
                                         written elsewhere, then renamed; the helper spot_training.checkpoint does so)
  any other files (no integer dirs)      "flat" layout of an unmodified script: snapshotted when unchanged for one poll
  .spot-training/                        agent state (sync-state.json, save-request); dot entries are never synced

Environment given to the trainer (besides torchrun's RANK, LOCAL_RANK, WORLD_SIZE, GROUP_RANK, ...):
  SPOT_TRAINING_JOB_ID, SPOT_TRAINING_CHECKPOINT_DIR, SPOT_TRAINING_RESUME_STEP (step restored, "" if none or flat),
  SPOT_TRAINING_RESUMED ("1"/"0"), SPOT_TRAINING_CHECKPOINT_INTERVAL_S ("" = Young/Daly), SPOT_TRAINING_MTBI_S,
  SPOT_TRAINING_INSTANCE_ID, SPOT_TRAINING_NODE_INDEX (position among the peers in launch order; 0 = rendezvous host),
  SPOT_TRAINING_NUM_PEERS, SPOT_TRAINING_ATTEMPT (0, 1, ... per restart), PYTHONPATH (+ this directory),
  PYTHONUNBUFFERED=1 (unless set: through a pipe Python's output is block-buffered, and a trainer printing a line a
  minute would reach the log, and the stall watchdog, once an hour or so).

Environment read by the agent:
  AWS_EC2_METADATA_SERVICE_ENDPOINT   IMDS base URL (default http://169.254.169.254), as botocore reads it
  AWS_ENDPOINT_URL                    AWS endpoint for every client (an emulator)
  SPOT_TRAINING_PEER_ADDRESS_MAP      path of a JSON file {private_ip: address}; peers' private IPs are mapped
                                      through it (default identity). For single-machine emulation map every
                                      private IP to a loopback address; the agent then also sets
                                      GLOO_SOCKET_IFNAME/NCCL_SOCKET_IFNAME/TP_SOCKET_IFNAME=lo (unless set).
  SPOT_TRAINING_NODE_ROOT             prefix for the node's local paths (checkpoint_dir, work dir), so several
                                      emulated nodes can share one machine (default: none, i.e. "/")
  SPOT_TRAINING_WORK_DIR              where code is unpacked (default <node root>/opt/spot-training/work)
  SPOT_TRAINING_POLL_INTERVAL_S       IMDS / sync poll interval (default 5)
  SPOT_TRAINING_RDZV_JOIN_TIMEOUT_S   peer discovery and rendezvous join timeout (default 600)
  SPOT_TRAINING_DONE_BARRIER_S        how long a finished node waits for its peers' done markers (default 120)
  SPOT_TRAINING_KEEP_CHECKPOINTS      complete checkpoints kept in S3 (default 2; the newest is never deleted)
  SPOT_TRAINING_TEST_UPLOAD_DELAY_S   tests only (default 0): hold every checkpoint upload this long after its
                                      objects are in S3 and before its manifest, so an interruption can land
                                      while an upload is in flight
  SPOT_TRAINING_TEST_RESTORE_DELAY_S  tests only (default 0): wait this long after "restoring checkpoint N" and
                                      before downloading it, so an interruption can land while a node restores
  SPOT_TRAINING_TEST_STALL_TIMEOUT_S  tests only (default: the job's stall_timeout_s): end a trainer that made no
                                      progress for this long (seconds, below the job's 300 s minimum)
  SPOT_TRAINING_TEST_RDZV_LAST_CALL_S tests only (default: torch's 30 s): how long a rendezvous round that has
                                      min_nodes waits for more nodes before it starts (torchrun's last_call_timeout)

Exit codes: 0 job done or instance interrupted cleanly; 1 job failed (FAILED written); 2 bad input, or no job
spec, S3 or Auto Scaling answer at boot (the node left its group, one fewer); one line each.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import logging
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Set, Tuple

import boto3
from botocore.exceptions import ClientError
from spot_training import warm_volume
from spot_training.agent.aws_config import client_config
from spot_training.agent.checkpoint_store import CheckpointStore
from spot_training.agent.checkpoint_sync import Syncer
from spot_training.agent.code_fetch import download_code, inside
from spot_training.agent.drain import DrainHold
from spot_training.agent.errors import (
    AWS_ERRORS,
    IMDS_ERRORS,
    AgentError,
    JobFailed,
    JobRefused,
    LeavingBeforeTraining,
    StopBeforeTraining,
    one_line,
)
from spot_training.agent.instance_signals import Imds, lifecycle_of
from spot_training.agent.job import Job, load_job
from spot_training.agent.local_checkpoints import local_steps, remove_partial_writes
from spot_training.agent.log_shipping import Log, LogShipper, Timed, output_lines
from spot_training.agent.markers import END_OF_TRAINING, PROGRESS_MARKER, READY_MARKER, stamp
from spot_training.agent.peers import Peers, discover_peers, load_address_map
from spot_training.agent.s3_objects import answered_at, key_listed
from spot_training.agent.settings import AgentSettings
from spot_training.agent.stall import StallWatch
from spot_training.job_spec import (
    CHECKPOINT_FOLDER,
    DRAIN_HEARTBEAT_S,
    DRAIN_HOOK,
    END_MARKERS,
    SPOT_NOTICE,
)
from spot_training.proctree import kill_all, process_tree
from spot_training.sync_state import STATE_DIR

HERE = os.path.dirname(os.path.abspath(__file__))
WARM_MOUNT = "/mnt/spot-training-warm"
EXIT_FAILED, EXIT_BAD_INPUT = 1, 2


# After the agent let the instance go (left its group, scaled it to 0), how long it waits for the group to start
# ending it before it exits without completing the drain hook (the hook's heartbeat then bounds the wait).
DRAIN_WAIT_S = 60.0
# An instance the agent cannot hand back to its group (Auto Scaling refuses, after botocore's retries) idles billed:
# it tries again, the pause doubling from the first value to the second, for at most HAND_BACK_RETRY_S.
HAND_BACK_PAUSE_S, HAND_BACK_RETRY_S = (30.0, 600.0), 6 * 3600.0


PEER_LOST_WAIT_S = 10.0  # a trainer whose peer vanished gets this long to exit on SIGTERM before it is killed


# ----------------------------------------------------------------------------------------------- agent
class Agent:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.instance_id: str = args.instance_id
        self.log = Log(self.instance_id)
        session = boto3.session.Session(region_name=args.region)
        endpoint = os.environ.get("AWS_ENDPOINT_URL") or None
        self.ssm, self.s3, self.asg, self.ec2, self.logs = (
            session.client(name, endpoint_url=endpoint, config=client_config(self.instance_id))
            for name in ("ssm", "s3", "autoscaling", "ec2", "logs")
        )
        self.imds = Imds()
        settings = AgentSettings.from_env()
        self.poll_s, self.join_timeout_s = settings.poll_s, settings.join_timeout_s
        # How long a ready node waits for its InService peers at an elastic job's first attempt (wait_for_ready_peers)
        self.start_wait_s, self.barrier_s, self.keep = settings.start_wait_s, settings.barrier_s, settings.keep
        self.test_stall_timeout_s, self.test_last_call_s = settings.test_stall_timeout_s, settings.test_last_call_s
        self.node_root, self.work_dir = settings.node_root, settings.work_dir
        load_address_map()  # a broken map is a bad input: say so before anything runs
        self.stop_signal = threading.Event()
        self.peers: Peers = []
        self.group = ""
        self.syncer: Optional[Syncer] = None  # of the last attempt
        # The last attempt's ``nodes/<id>/synced`` report (job, body): written again once what it said was pending
        # is durable, so peers waiting for it go on.
        self.synced_report: Optional[Tuple[Job, Dict[str, Any]]] = None
        self.trainer_started = 0.0  # time.time() the last attempt's trainer started
        self.trainer_ended = 0.0  # and ended
        self.stalled: Optional[str] = None  # why the stall watchdog ended the last attempt's trainer, if it did
        self.not_done = ""  # why the last finish() did not make the job DONE
        self.save_requests_seen: Optional[Dict[str, str]] = None  # peers' save-request markers (ETags) seen
        self.training_seen: Dict[str, Tuple[str, Dict[str, Any]]] = {}  # training markers read: id -> (ETag, body)
        self.world_file = os.path.join(self.work_dir, "rendezvous-world.json")  # see add_joined_peers
        self.notice_newest: Optional[int] = None
        self.newest_before: Optional[int] = None  # the newest durable checkpoint as the last attempt's trainer started
        self.notice_at = 0.0
        self.stop_requested = False  # trainctl stop: checkpoint, then STOPPED and scale to 0
        self.warm_volume: Optional[Tuple[str, str, Optional[str]]] = None  # (volume id, device, bound env root)
        self.terminating = False  # its group is ending this instance (target lifecycle state Terminated)
        self.released = False  # the agent let the instance go: left its group, or scaled it to 0
        self.store: Optional[CheckpointStore] = None  # the job's, once the agent runs one
        self.trainer: Optional["subprocess.Popen[bytes]"] = None  # the last attempt's torchrun
        # Started with the job's store; ``self.log`` and ``group_ending_it`` looked up at each use (tests swap them).
        self.drain_hold = DrainHold(
            self.asg,
            self.instance_id,
            lambda line: self.log(line),
            lambda: self.store.sent_bytes if self.store is not None else 0,
            lambda: not self.trainer_runs() and self.group_ending_it(),
        )

    # -- small S3 helpers
    def put_marker(self, job: Job, name: str, body: Dict[str, Any]) -> None:
        body = dict(body, job_id=job.job_id, instance_id=self.instance_id, time=time.time())
        self.s3.put_object(Bucket=job.bucket, Key=job.job_prefix + name, Body=json.dumps(body).encode())

    def put_boot_marker(self, job: Job) -> None:
        """``nodes/<id>/boot``: what the node is (type, spot or on-demand, AZ), for ``trainctl cost`` and status."""
        facts: Dict[str, Optional[str]] = {}
        paths = (
            ("instance_type", "instance-type"),
            ("lifecycle", "instance-life-cycle"),
            ("availability_zone", "placement/availability-zone"),
        )
        for key, path in paths:
            try:
                facts[key] = self.imds.get(path)
            except IMDS_ERRORS as exc:
                self.log(f"IMDS {path} unreadable ({exc}); the boot marker goes without it")
        self.put_marker(job, f"nodes/{self.instance_id}/boot", facts)

    def marker(self, job: Job, name: str) -> Optional[Dict[str, Any]]:
        """The job's marker ``name`` (JSON; ``{}`` if it is not a JSON object), or None. Listed before it is read
        (``key_listed``)."""
        key = job.job_prefix + name
        if not key_listed(self.s3, job.bucket, key):
            return None
        try:
            body = self.s3.get_object(Bucket=job.bucket, Key=key)["Body"].read()
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("NoSuchKey", "404"):  # deleted since the listing
                return None
            raise
        try:  # one not a JSON object (a STOP written by hand: `aws s3 cp /dev/null .../STOP`) is there all the same
            value = json.loads(body)
        except ValueError:
            return {}
        return value if isinstance(value, dict) else {}

    def marked(self, job: Job, name: str) -> bool:
        """Whether the job's marker ``name`` is there; an S3 error is logged and counts as not (yet) there."""
        try:
            return self.marker(job, name) is not None
        except AWS_ERRORS as exc:
            self.log(f"could not read the {name} marker ({exc})")
            return False

    def group_name(self) -> str:
        if self.args.asg_name:
            return str(self.args.asg_name)
        _, group = self.own_lifecycle()
        if not group:
            raise AgentError(f"instance {self.instance_id} is not in an Auto Scaling group")
        return str(group)

    def node_markers(self, job: Job, progress: Optional[Dict[str, float]] = None) -> Dict[str, Dict[str, str]]:
        """The job's per-node markers: {instance id: {marker name: ETag}} (``nodes/<id>/<name>``), one listing.
        ``progress``, if given, gets {instance id: seconds since its progress marker was written}, by S3's clock
        (its LastModified against the answer's Date: the nodes' clocks do not come into it)."""
        prefix = job.job_prefix + "nodes/"
        found: Dict[str, Dict[str, str]] = {}
        for page in self.s3.get_paginator("list_objects_v2").paginate(Bucket=job.bucket, Prefix=prefix):
            now = answered_at(page)
            for obj in page.get("Contents", []):
                instance_id, _, name = obj["Key"][len(prefix) :].partition("/")
                found.setdefault(instance_id, {})[name] = obj["ETag"]
                if progress is not None and name == PROGRESS_MARKER:
                    progress[instance_id] = max(0.0, (now - obj["LastModified"]).total_seconds())
        return found

    def leaving_nodes(self, job: Job) -> Set[str]:
        """Instances of this job that announced they are going (``nodes/<id>/leaving``)."""
        return {i for i, names in self.node_markers(job).items() if "leaving" in names}

    def leave_group(self, group: str, for_good: bool = False) -> None:
        """Hand the instance back now instead of idling until the reclaim: the group launches a replacement, or
        (``for_good``) its desired capacity goes down by one. Nothing to do when the group is ending it already."""
        if self.terminating:
            self.released = True
            self.log(f"leaving {group}: it is ending this instance already")
            return
        deadline, pause = time.monotonic() + HAND_BACK_RETRY_S, HAND_BACK_PAUSE_S[0]
        while True:
            try:
                self.asg.terminate_instance_in_auto_scaling_group(
                    InstanceId=self.instance_id, ShouldDecrementDesiredCapacity=for_good
                )
                self.released = True
                self.log(f"left {group}: " + ("one node fewer" if for_good else "the group launches a replacement"))
                return
            except AWS_ERRORS as exc:
                try:  # the group may be ending it already (a spot notice under capacity rebalancing does that on AWS)
                    state, _ = self.own_lifecycle()
                except AWS_ERRORS:
                    state = ""
                if state is not None and state.startswith("Terminat"):
                    self.released = True
                    self.log(f"leaving {group}: it is ending this instance already ({state})")
                    return
                denied = str(getattr(exc, "response", {}).get("Error", {}).get("Code", "")).startswith("AccessDenied")
                if state is None or denied or time.monotonic() + pause > deadline:  # None: in no group
                    self.log(f"could not leave {group} ({exc}): if {self.instance_id} still runs, terminate it by hand")
                    return
                # Idle, the instance is billed until it goes: an Auto Scaling outage is waited out, not left to people.
                self.log(f"could not leave {group} ({one_line(exc)}); trying again in {pause:g} s")
                if self.stop_signal.wait(pause):  # SIGTERM: the instance is shutting down already
                    self.log(f"not leaving {group}: this instance is shutting down")
                    return
                pause = min(pause * 2, HAND_BACK_PAUSE_S[1])

    def peers_training(self, job: Job, group: str) -> List[str]:
        """The other InService instances of the group whose trainer runs now: each one's ``training`` marker is
        newer than its last ``synced``, ``leaving`` and ``done`` (stamps of one writer: one clock)."""
        groups = self.asg.describe_auto_scaling_groups(AutoScalingGroupNames=[group])["AutoScalingGroups"]
        present = {i["InstanceId"] for g in groups for i in g["Instances"] if i.get("LifecycleState") == "InService"}
        training = []
        for instance_id, names in sorted(self.node_markers(job).items()):
            if instance_id == self.instance_id or instance_id not in present or "training" not in names:
                continue
            started = stamp(self.marker(job, f"nodes/{instance_id}/training") or {})
            ended = [stamp(self.marker(job, f"nodes/{instance_id}/{n}") or {}) for n in END_OF_TRAINING if n in names]
            if started > max(ended, default=0.0):
                training.append(instance_id)
        return training

    def give_up(self, why: str) -> None:
        """This node cannot take part (no job spec, no answer from S3 or Auto Scaling at boot): leave the group, one
        node fewer, instead of idling billed. The job is not marked FAILED: its other nodes may be fine."""
        self.log(f"error: {why}; leaving the group (one node fewer)")
        self.release_warm_volume()
        self.leave_group(self.group or self.args.asg_name or "the group", for_good=True)

    def scale_to_zero(self, group: str) -> None:
        self.release_warm_volume()  # before the group terminates this instance
        try:
            self.asg.set_desired_capacity(AutoScalingGroupName=group, DesiredCapacity=0, HonorCooldown=False)
            self.released = True
            self.log(f"set desired capacity of {group} to 0")
        except AWS_ERRORS as exc:  # at least this node goes; its peers that see DONE scale to 0 (or leave) too
            self.log(f"could not scale {group} to 0 ({exc}); leaving it instead")
            self.leave_group(group, for_good=True)

    def claim_warm_volume(self, job: Job) -> None:
        """Attach (and mount) a free pre-warmed volume of the cluster's pool; fall back to the root volume."""
        if job.warm_pool is None:
            return
        pool, device = job.warm_pool["pool"], job.warm_pool["device_name"]
        mount = os.environ.get("SPOT_TRAINING_WARM_VOLUME_MOUNT", "1") != "0"
        env_root = os.path.dirname(os.path.dirname(job.python))  # /opt/pytorch/bin/python -> /opt/pytorch
        own = [p for p in (sys.prefix, sys.base_prefix, sys.executable) if inside(p, env_root)]
        if mount and own:  # mounted over the agent's own files, the volume could not be unmounted for the next node
            self.log(
                f"not claiming a warm volume of pool {pool}: this agent runs from {own[0]}, inside {env_root} that "
                "the volume is mounted over; use an AMI whose python3 has boto3 (user_data.sh tries it first)"
            )
            return
        with Timed(self.log, "claim warm volume"):
            try:
                volume = warm_volume.claim_volume(
                    self.ec2,
                    instance_id=self.instance_id,
                    availability_zone=self.args.availability_zone,
                    tag_key=job.warm_pool["tag_key"],
                    pool=pool,
                    volume_ids=job.warm_pool.get("volumes"),
                    device=device,
                    poll_s=min(self.poll_s, 1.0),
                )
            except (*AWS_ERRORS, TimeoutError) as exc:  # best effort: a warm volume never costs the job
                self.log(f"claiming a warm volume of pool {pool} failed ({exc}); booting from the root volume")
                return
        if volume is None:
            return  # claim_volume logged the fallback
        self.warm_volume = (volume, device, None)
        if not mount:
            self.log(f"warm volume {volume} attached; mounting skipped (SPOT_TRAINING_WARM_VOLUME_MOUNT=0)")
            return
        try:
            with Timed(self.log, "mount warm volume"):
                found = warm_volume.filesystem(warm_volume.block_device(volume, device))
                if found is None:
                    raise OSError(f"no filesystem on {volume}")
                warm_volume.run(warm_volume.mount_commands(*found, WARM_MOUNT, [env_root]))
        except (OSError, TimeoutError, ValueError, subprocess.CalledProcessError) as exc:
            # A volume that cannot be mounted must not cost the job: undo what got mounted, give the volume back.
            self.log(f"mounting warm volume {volume} failed ({exc}); booting from the root volume")
            warm_volume.run(warm_volume.unmount_commands(WARM_MOUNT, [env_root]), check=False)
            self.release_warm_volume()
            return
        self.warm_volume = (volume, device, env_root)
        self.log(
            f"warm volume {volume} mounted read-only on {WARM_MOUNT} from {found[0]}; {env_root} now reads from it "
            "(writes to it stay on this node)"
        )

    def release_warm_volume(self) -> None:
        """Unmount and detach the claimed volume (idempotent), so the next node can claim it."""
        if self.warm_volume is None:
            return
        volume, device, env_root = self.warm_volume
        self.warm_volume = None
        try:
            if env_root is not None:
                warm_volume.run(warm_volume.unmount_commands(WARM_MOUNT, [env_root]))
            with Timed(self.log, "release warm volume"):
                warm_volume.release_volume(
                    self.ec2,
                    volume_id=volume,
                    instance_id=self.instance_id,
                    device=device,
                    poll_s=min(self.poll_s, 1.0),
                )
        except (*AWS_ERRORS, TimeoutError, OSError, subprocess.CalledProcessError) as exc:
            self.log(f"could not release warm volume {volume} ({exc}); it frees when the instance terminates")

    # -- peers and torchrun
    def poll_peers(
        self,
        job: Job,
        what: str,
        timeout_s: float,
        look: Callable[[], Optional[Peers]],
        at_deadline: Callable[[Optional[Exception]], Peers],
    ) -> Peers:
        """``look``'s first answer that is not None, polled every ``poll_s``; after ``timeout_s``, ``at_deadline``
        with the last poll's AWS error. Each poll first acts on a notice and on a STOP marker (no trainer here to
        stop: the peers that run one write STOPPED).

        An AWS error in a poll (after botocore's retries; DescribeInstances answers ``InvalidInstanceID.NotFound``
        for an instance launched a moment ago, which botocore does not retry) is logged and polled again until the
        deadline: it says nothing about the job."""
        deadline = time.monotonic() + timeout_s
        while True:
            self.check_notice(what)
            if self.marked(job, "STOP"):
                raise StopBeforeTraining(f"stop requested (STOP marker) during {what}")
            failed: Optional[Exception] = None
            try:
                found = look()
            except AWS_ERRORS as exc:
                failed = exc
                self.log(f"peer discovery failed ({one_line(exc)}); trying again")
            else:
                if found is not None:
                    return found
            if time.monotonic() > deadline:
                return at_deadline(failed)
            time.sleep(self.poll_s)

    def wait_for_peers(self, group: str, job: Job) -> Peers:
        """The peers of the next attempt, once at least ``min_nodes`` are InService and mapped, within the join
        timeout."""
        # What the last poll that got an answer found: a failed poll keeps it (a node found past max_nodes stays a
        # spare that leaves, even when the poll at the deadline fails)
        peers: Peers = []
        surplus = False

        def look() -> Optional[Peers]:
            nonlocal peers, surplus
            peers = discover_peers(self.asg, self.ec2, group, self.leaving_nodes(job))
            address_map = load_address_map()  # re-read: the emulator adds a node when it boots it
            unmapped = [i for i, ip in peers if address_map and ip not in address_map]
            # capacity rebalancing may go above the maximum: the nodes past it wait for a place
            surplus = self.instance_id in dict(peers) and self.instance_id not in dict(peers[: job.max_nodes])
            if unmapped:  # InService but not booted yet: its private address must never be contacted
                self.log(f"peer(s) {', '.join(unmapped)} not in the peer address map yet; waiting")
            elif len(peers) >= job.min_nodes and self.instance_id in dict(peers[: job.max_nodes]):
                return peers[: job.max_nodes]
            elif surplus:
                self.log(f"{len(peers)} InService, more than max_nodes {job.max_nodes}; waiting for a place")
            return None

        def at_deadline(failed: Optional[Exception]) -> Peers:
            if surplus:  # the job has max_nodes without this node
                raise LeavingBeforeTraining(
                    f"still past max_nodes {job.max_nodes} after {self.join_timeout_s:.0f} s "
                    f"({len(peers)} InService in {group})"
                )
            if failed is not None:
                raise AgentError(
                    f"peer discovery in {group} still failing after {self.join_timeout_s:.0f} s: {one_line(failed)}"
                )
            raise AgentError(f"fewer than {job.min_nodes} InService peers in {group} after {self.join_timeout_s:.0f} s")

        return self.poll_peers(job, "peer discovery", self.join_timeout_s, look, at_deadline)

    def wait_for_ready_peers(self, job: Job, group: str) -> Peers:
        """At an elastic job's first attempt (``min_nodes`` < ``max_nodes``): the peers, once every InService one is
        ready (its ``ready`` marker: restored, about to start torchrun), once any of them trains (its ``training``
        marker: a round runs already, which this node joins; a replacement never waits), or ``start_wait_s`` is up.

        torchrun's first round closes 30 s (its ``last_call_timeout``) after ``min_nodes`` joined. Instances of one
        launch boot minutes apart on EC2 (instance types, AMI loading), so without this wait a job started on the
        first nodes up and restarted its workers for each late one (a save, a restore, NCCL set up again). A peer that
        leaves the group is no longer waited for; at the bound, the job starts and late peers join as before."""
        try:  # best effort: without it the peers wait their bound
            self.put_marker(job, f"nodes/{self.instance_id}/{READY_MARKER}", {})
        except AWS_ERRORS as exc:
            self.log(f"could not report that this node is ready ({one_line(exc)}); its peers wait at most their bound")
        said, peers, past_max = "", self.peers, False

        def look() -> Optional[Peers]:
            nonlocal said, peers, past_max
            found = discover_peers(self.asg, self.ec2, group, self.leaving_nodes(job))[: job.max_nodes]
            markers = self.node_markers(job)
            if self.instance_id not in dict(found):  # past max_nodes now: wait for a place as before (below)
                past_max = True
                return []
            peers = found
            others = [i for i, _ in peers if i != self.instance_id]
            if any("training" in markers.get(i, {}) for i in others):  # a round runs: join it, waiting splits
                return peers
            late = [i for i in others if READY_MARKER not in markers.get(i, {})]
            if not late:
                return peers
            if ", ".join(late) != said:
                said = ", ".join(late)
                self.log(
                    f"waiting up to {self.start_wait_s:g} s for peer(s) {said} to be ready, so that the first "
                    "rendezvous round has every node"
                )
            return None

        def at_deadline(failed: Optional[Exception]) -> Peers:
            self.log(
                f"peer(s) {said or '?'} not ready after {self.start_wait_s:g} s; starting without them "
                "(torchrun restarts the workers when they join)"
            )
            return peers

        ready = self.poll_peers(job, "the wait for peers", self.start_wait_s, look, at_deadline)
        return self.wait_for_peers(group, job) if past_max else ready

    def torchrun_command(self, job: Job, peers: Peers) -> Tuple[List[str], Dict[str, str]]:
        host_id, host_ip = peers[0]
        address_map = load_address_map()  # re-read: replacement nodes join the map while we run
        host = address_map.get(host_ip, host_ip)
        own_ip = dict(peers)[self.instance_id]
        local = address_map.get(own_ip, own_ip)
        is_host = "true" if host_id == self.instance_id else "false"
        wait = int(self.join_timeout_s)
        last_call = f",last_call_timeout={self.test_last_call_s}" if self.test_last_call_s else ""
        cmd = [
            job.python,
            "-m",
            "spot_training.launch",
            f"--nnodes={job.min_nodes}:{job.max_nodes}",
            f"--nproc-per-node={job.nproc_per_node}",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint={host}:{job.rendezvous_port}",
            f"--rdzv-id={job.job_id}",
            # read_timeout: how long a node tries to reach the host's store (torch: 60 s, whatever join_timeout
            # says); a host that restores a checkpoint its peers already hold comes up later than they do.
            f"--rdzv-conf=is_host={is_host},join_timeout={wait},read_timeout={wait}{last_call}",
            f"--local-addr={local}",
            "--max-restarts=0",
            *job.argv,
        ]
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (HERE, env.get("PYTHONPATH", "")) if p)
        env["SPOT_TRAINING_STORE_BIND_ADDRESS"] = local  # see spot_training/launch.py
        env["SPOT_TRAINING_WORLD_FILE"] = self.world_file
        env["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"] = str(int(job.grace_s))
        # Through the pipe to the agent, Python block-buffers print(): a script printing ~100 bytes a minute would
        # reach the log, and the stall watchdog, every ~80 minutes. Unbuffered unless the environment says otherwise.
        env.setdefault("PYTHONUNBUFFERED", "1")
        if ipaddress.ip_address(local).is_loopback:  # emulation: keep gloo/NCCL/tensorpipe on loopback
            for name in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME", "TP_SOCKET_IFNAME"):
                env.setdefault(name, "lo")
        return cmd, env

    def run_trainer(
        self, job: Job, code_dir: str, cmd: List[str], env: Dict[str, str], syncer: Syncer
    ) -> Tuple[int, bool]:
        """Run torchrun until it exits, or a notice, a stop, a lost peer or the stall watchdog stops it; returns
        (exit code, interrupted)."""
        stall_s = self.test_stall_timeout_s or job.stall_timeout_s
        if self.test_stall_timeout_s:
            self.log(f"stall timeout {stall_s:g} s (SPOT_TRAINING_TEST_STALL_TIMEOUT_S)")
        self.stalled = None
        self.log(f"running: {shlex.join(cmd)}")
        self.trainer_started = time.time()
        watch = StallWatch(self, job, syncer, stall_s) if stall_s else None
        proc = subprocess.Popen(  # noqa: S603 - argv list built from the validated job, no shell
            cmd, cwd=code_dir, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True
        )
        self.trainer = proc
        assert proc.stdout is not None
        stdout = proc.stdout

        def pump() -> None:
            for line in output_lines(stdout):  # each CR-ended update of a tqdm bar makes a line
                if watch is not None:
                    watch.output()
                self.log.raw(f"[trainer {self.instance_id}] {line}")

        reader = threading.Thread(target=pump, name="trainer-output", daemon=True)
        reader.start()
        stop_sync = threading.Event()

        def sync_loop() -> None:
            while not stop_sync.wait(self.poll_s):
                syncer.sync()

        sync_thread = threading.Thread(target=sync_loop, name="checkpoint-sync", daemon=True)
        sync_thread.start()
        lock = threading.RLock()  # sigterm() takes it again under the stall watchdog's
        woken = threading.Event()
        stopped_by: List[Tuple[str, float, bool]] = []  # (why, grace, a notice?): the first SIGTERM's reason

        def sigterm(why: str, grace: float, is_notice: bool = True) -> bool:
            """SIGTERM the trainer once, whoever comes first (a notice, a stop request, a lost peer); True if this
            call sent it."""
            with lock:
                if stopped_by:
                    return False
                stopped_by.append((why, grace, is_notice))
                self.notice_at = time.monotonic()
                self.log(f"{why}: sending SIGTERM to the trainer, grace {grace:.0f} s")
                proc.send_signal(signal.SIGTERM)
                woken.set()
                return True

        def watch_notices() -> None:
            """The spot notice and the agent's own SIGTERM, on their own thread: a slow S3 or Auto Scaling call in
            the loop below must not hold up the trainer's SIGTERM (the notice gives two minutes in all)."""
            while not stopped_by and proc.poll() is None:
                try:
                    why = self.notice()
                except Exception as exc:  # an agent bug must not end the watch: the trainer would miss the notice
                    self.log(f"notice poll failed: {type(exc).__name__}: {one_line(exc)}")
                    why = None
                if why:
                    sigterm(why, job.grace_s)
                    return
                self.stop_signal.wait(self.poll_s)

        watcher = threading.Thread(target=watch_notices, name="notice-watch", daemon=True)
        watcher.start()
        rebalance_seen: Optional[str] = None
        notice: Optional[str] = None
        try:
            while proc.poll() is None and not stopped_by:
                try:
                    rebalance = self.imds.get("events/recommendations/rebalance")
                except IMDS_ERRORS as exc:
                    self.log(f"IMDS poll failed: {exc}")
                    rebalance = None
                peer_lost: Optional[Tuple[str, str]] = None
                try:
                    if self.marker(job, "STOP") is not None:
                        if sigterm("stop requested (trainctl stop)", job.grace_s):
                            self.stop_requested = True
                        break
                    if rebalance and rebalance != rebalance_seen:
                        rebalance_seen = rebalance
                        self.log(f"rebalance recommendation {rebalance.strip()}: asking the trainer for a checkpoint")
                        self.request_checkpoint(job)
                        # Rank 0 (which decides on saving) may run on another node: tell every node's agent.
                        self.put_marker(job, f"nodes/{self.instance_id}/save-request", {"rebalance": rebalance.strip()})
                    else:
                        ages: Dict[str, float] = {}
                        markers = self.node_markers(job, ages)
                        if watch is not None:
                            watch.peers_seen(ages, time.monotonic())
                        self.relay_save_requests(job, markers)
                        self.add_joined_peers(job, markers)
                        peer_lost = self.lost_peer(job)
                except AWS_ERRORS as exc:  # an API hiccup: next poll
                    self.log(f"job poll failed: {exc}")
                if peer_lost:
                    peer, how = peer_lost
                    self.log(f"peer {peer} {how}: restarting with the current peers")
                    sigterm(f"peer {peer} lost", min(job.grace_s, PEER_LOST_WAIT_S), is_notice=False)
                    break
                # A hung trainer (a DataLoader deadlock, a collective that never returns) would keep every node
                # billed: no progress anywhere in the job for stall_s ends it like a failed trainer.
                if watch is not None:
                    watch.mark()
                    stalled = watch.stalled()
                    if stalled:
                        with lock:  # unless a notice, a stop or a lost peer stopped it first
                            if not stopped_by:
                                self.stalled = stalled
                                self.log(f"{self.stalled}: ending it (job.stall_timeout_s)")
                                sigterm("stall watchdog", job.grace_s, is_notice=False)
                        break
                woken.wait(self.poll_s)
            if stopped_by:
                why, grace, is_notice = stopped_by[0]
                with Timed(self.log, "trainer emergency checkpoint and exit"):
                    if is_notice:
                        notice = why
                        self.announce_leaving(job, why, syncer)
                    try:
                        proc.wait(timeout=max(0.0, self.notice_at + grace - time.monotonic()))
                    except subprocess.TimeoutExpired:
                        self.log(f"trainer still running after {grace:.0f} s grace: killing it")
                        syncer.trainer_cut_off = True
                        kill_all(process_tree(proc.pid))
        finally:
            stop_sync.set()
            sync_thread.join()
            if proc.poll() is None:
                syncer.trainer_cut_off = True
                kill_all(process_tree(proc.pid))
            if proc.wait() != 0 and not stopped_by:  # failed on its own: maybe in the middle of a save
                syncer.trainer_cut_off = True
            self.trainer_ended = time.time()
            watcher.join(timeout=self.poll_s + 10)
            reader.join(timeout=10)
        if self.stalled and proc.returncode == 0:  # it handled the SIGTERM: still no finished training
            return EXIT_FAILED, False
        return proc.returncode, notice is not None

    def trainer_runs(self) -> bool:
        """Whether the last attempt's torchrun is still running (``Popen.poll`` may be called from any thread)."""
        return self.trainer is not None and self.trainer.poll() is None

    def announce_leaving(self, job: Job, notice: str, syncer: "Syncer") -> None:
        """After the SIGTERM: tell the peers this node leaves (``nodes/<id>/leaving``, not for a stop: the whole job
        ends), and note the newest durable checkpoint, to tell the emergency one from it. Best effort: S3 failing
        here must not cost the emergency checkpoint, which is already being written."""
        try:
            if not self.stop_requested:
                self.put_marker(job, f"nodes/{self.instance_id}/leaving", {"notice": notice, "trainer": True})
            self.notice_newest = syncer.store.newest_complete()
        except AWS_ERRORS as exc:
            self.log(f"could not announce leaving or list checkpoints: {exc}; the trainer stops anyway")

    def notice(self) -> Optional[str]:
        """The agent's own SIGTERM, the spot notice in IMDS or the group ending this instance (capacity rebalancing
        once the replacement runs, a scale-in: no spot notice, the drain hook holds the instance), described, or
        None (also when IMDS does not answer)."""
        if self.stop_signal.is_set():
            return "agent received SIGTERM"
        try:
            action = self.imds.get("spot/instance-action")
            if action:
                return f"{SPOT_NOTICE} {action.strip()}"
            if self.group_ending_it():
                return f"its Auto Scaling group is ending this instance (lifecycle hook {DRAIN_HOOK})"
        except IMDS_ERRORS as exc:
            self.log(f"IMDS poll failed: {exc}")
        return None

    def group_ending_it(self) -> bool:
        """True once ``autoscaling/target-lifecycle-state`` is ``Terminated`` (remembered in ``terminating``)."""
        if not self.terminating:
            state = self.imds.get("autoscaling/target-lifecycle-state")
            if state is not None and state.strip() == "Terminated":
                self.terminating = True  # only ever set: two threads read it (the notice watcher, the drain hold)
        return self.terminating

    def own_lifecycle(self) -> Tuple[Optional[str], str]:
        """(this instance's lifecycle state in its group, the group's name); (None, "") once it is in no group."""
        return lifecycle_of(self.asg, self.instance_id)

    def complete_drain(self) -> None:
        """The group's drain hook holds an instance it ends in Terminating:Wait (billed) until told. However the
        agent ends: if the group holds this instance (its group ended it, or it was ended on a notice), or once it
        does after the agent let it go (left the group, scaled it to 0; at most ``DRAIN_WAIT_S``), complete the
        hook: the instance goes now, not after the hook's heartbeat. Nothing to do once it is out of its group."""
        self.drain_hold.stop()
        deadline = time.monotonic() + DRAIN_WAIT_S
        while True:
            try:
                state, group = self.own_lifecycle()
            except AWS_ERRORS as exc:
                state, group = "unknown", ""
                self.log(f"could not read this instance's lifecycle state: {one_line(exc)}")
            if state == "Terminating:Wait":
                break
            if state in (None, "Terminating:Proceed", "Terminated"):
                return  # out of its group, or past the hook
            if state != "Terminating" and not (self.released or self.terminating):
                return  # not let go: it stays (and the agent said so where it failed)
            if time.monotonic() >= deadline:
                self.log(f"the group did not start ending this instance within {DRAIN_WAIT_S:.0f} s (state {state})")
                return
            time.sleep(1.0)  # not stop_signal.wait: after a SIGTERM it would return at once, every time
        try:
            self.asg.complete_lifecycle_action(
                AutoScalingGroupName=group,
                LifecycleHookName=DRAIN_HOOK,
                InstanceId=self.instance_id,
                LifecycleActionResult="CONTINUE",
            )
            self.log(f"completed {DRAIN_HOOK}: {group} terminates this instance now")
        except AWS_ERRORS as exc:  # a hook of another name, or it timed out meanwhile
            self.log(
                f"could not complete {DRAIN_HOOK} ({one_line(exc)}); {group} terminates this instance after the "
                f"hook's heartbeat ({DRAIN_HEARTBEAT_S} s)"
            )

    def check_notice(self, during: str) -> None:
        """Before the trainer runs: a spot notice (or the agent's SIGTERM) raises ``LeavingBeforeTraining``. A node
        that restores or looks for peers while it is being reclaimed must not join a rendezvous it cannot finish."""
        why = self.notice()
        if why:
            raise LeavingBeforeTraining(f"{why} during {during}")

    def leave_before_training(self, job: Job, group: str, why: str, stop: bool = False) -> int:
        """Announce the leave (``trainer: false``: peers that count on this node restart without it), make what an
        earlier attempt of this node saved durable (at most the grace), hand the instance back. Not the peers'
        final syncs: no trainer ran here since, so nothing of theirs waits on this node. ``stop``: the job is
        stopping: no announcement (the peers stop anyway), and the group gets no replacement."""
        self.log(f"{why}: leaving before the trainer starts")
        deadline = time.monotonic() + job.grace_s
        try:
            if not stop:
                self.put_marker(job, f"nodes/{self.instance_id}/leaving", {"notice": why, "trainer": False})
        except AWS_ERRORS as exc:
            self.log(f"could not announce leaving: {exc}")
        try:
            own = self.own_pending_until(deadline)
            if own is not None:
                self.log(f"{own} not durable in S3 within the grace; the last durable one stays")
        except (OSError, *AWS_ERRORS) as exc:
            self.log(f"could not make this node's last checkpoint durable: {exc}")
        self.hand_back(group, for_good=stop)
        return 0

    def own_pending(self) -> Optional[str]:
        """What this node's checkpoint directory holds that is not durable in S3 after one more sync (the final sync
        of the last attempt may have failed), described, or None."""
        own = self.syncer.pending() if self.syncer is not None else None
        if own is not None and self.syncer is not None:
            self.syncer.sync(final=True)
            own = self.syncer.pending()
        if own is None and self.synced_report is not None and self.synced_report[1].get("pending") is not None:
            job, body = self.synced_report
            try:
                self.put_marker(job, f"nodes/{self.instance_id}/synced", dict(body, pending=None))
                self.synced_report = job, dict(body, pending=None)  # once written: a failed PUT is tried again
                self.log(f"{body['pending']} is durable in S3 now: reported to the peers")
            except (OSError, *AWS_ERRORS) as exc:
                self.log(f"could not report this node's final sync again ({exc}); peers wait for it at most the grace")
        return own

    def own_pending_until(self, deadline: float, during: Optional[str] = None) -> Optional[str]:
        """``own_pending`` about every second until nothing is pending or ``deadline`` (``time.monotonic()``)
        passes; what is still pending then, or None. ``during``: before each try, a spot notice raises
        ``LeavingBeforeTraining`` (see ``check_notice``)."""
        while True:
            if during is not None:
                self.check_notice(during)
            own = self.own_pending()
            if own is None or time.monotonic() >= deadline:
                return own
            time.sleep(min(self.poll_s, 1.0))

    def hand_back(self, group: str, for_good: bool = False) -> None:
        """Flush the logs, free the warm volume and leave the group: the group launches a replacement now (unless
        ``for_good``: one node fewer). The logs first: the volume's detach may take up to a minute of what is left
        of a spot notice's two."""
        if self.log.shipper is not None:
            self.log.shipper.flush()
        self.release_warm_volume()
        self.leave_group(group, for_good=for_good)

    def request_checkpoint(self, job: Job) -> None:
        """Ask the trainer for a checkpoint now (``.spot-training/save-request``, read by rank 0's helper)."""
        os.makedirs(os.path.join(job.checkpoint_dir, STATE_DIR), exist_ok=True)
        open(os.path.join(job.checkpoint_dir, STATE_DIR, "save-request"), "w").close()

    def relay_save_requests(self, job: Job, markers: Dict[str, Dict[str, str]]) -> None:
        """A peer's rebalance recommendation (``nodes/<id>/save-request``) becomes a save request here too.

        Requests that existed when this agent first looked are history, not news."""
        found = {i: names["save-request"] for i, names in markers.items() if "save-request" in names}
        found.pop(self.instance_id, None)
        if self.save_requests_seen is None:
            self.save_requests_seen = found
            return
        for instance_id, etag in sorted(found.items()):
            if self.save_requests_seen.get(instance_id) != etag:
                self.log(f"peer {instance_id} got a rebalance recommendation: asking the trainer for a checkpoint")
                self.request_checkpoint(job)
        self.save_requests_seen = found

    def add_joined_peers(self, job: Job, markers: Dict[str, Dict[str, str]]) -> None:
        """Add to the attempt's peers the nodes that joined the training after it started. With ``min_nodes <
        max_nodes`` a node that boots later joins our rendezvous (torchrun restarts the workers with it) and may
        then hold rank 0. Unknown, its loss would not restart our trainer, and the done barrier, a stop or a restart
        would not wait for its final sync: the group could go to 0 under its final upload.

        torchrun writes each round's node addresses to ``world_file`` (``spot_training.launch``); an address this
        agent does not know is matched to an instance by the newest ``nodes/<id>/training`` marker giving it. A
        node whose trainer started but never joined a round (the training ended first) is not a peer."""
        try:
            with open(self.world_file) as f:
                world = set(json.load(f)["addresses"])
        except (OSError, ValueError, KeyError, TypeError):
            return  # no round recorded yet (or a torch whose rendezvous state could not be read)
        try:
            address_map = load_address_map()
        except AgentError as exc:  # the emulator rewrites it as nodes boot: next poll
            self.log(f"peer address map unreadable ({exc})")
            return
        unknown = world - {address_map.get(ip, ip) for _, ip in self.peers}
        if not unknown:
            return
        known = {i for i, _ in self.peers}
        newest: Dict[str, Tuple[float, str, str]] = {}  # address -> (time, instance id, private IP)
        for instance_id, names in sorted(markers.items()):
            etag = names.get("training")
            if instance_id in known or etag is None:
                continue
            if self.training_seen.get(instance_id, ("", {}))[0] != etag:  # read each marker once
                self.training_seen[instance_id] = (etag, self.marker(job, f"nodes/{instance_id}/training") or {})
            body = self.training_seen[instance_id][1]
            address, when = str(body.get("address", "")), stamp(body)
            if address in unknown and when > newest.get(address, (-1.0, "", ""))[0]:
                newest[address] = (when, instance_id, str(body.get("private_ip", address)))
        for _, instance_id, private_ip in newest.values():
            self.peers.append((instance_id, private_ip))
            self.log(f"peer {instance_id} joined the training")

    def lost_peer(self, job: Job) -> Optional[Tuple[str, str]]:
        """A peer of the running trainer that left the group and will not stop ours by leaving, (id, how), or None:
        one that left without announcing it (no notice: a hard termination), or one that announced it left before
        its trainer started (a notice while it restored or looked for peers). Ours would wait for it at the
        rendezvous or in a collective until a timeout."""
        groups = self.asg.describe_auto_scaling_groups(AutoScalingGroupNames=[self.group])["AutoScalingGroups"]
        # A peer its group holds in Terminating:Wait still runs: its agent saves and announces leaving like on a
        # notice, and its trainer's exit stops ours. Not gone yet: it was not powered off.
        present = {
            i["InstanceId"]
            for g in groups
            for i in g["Instances"]
            if i.get("LifecycleState") in ("InService", "Terminating:Wait")
        }
        gone = [i for i, _ in self.peers if i not in present and i != self.instance_id]
        if not gone:
            return None
        leaving = self.leaving_nodes(job)
        unannounced = [i for i in gone if i not in leaving]
        if unannounced:
            return unannounced[0], "left the group without a notice"
        for peer in gone:  # announced; its trainer stops ours when it goes, unless it never ran
            if (self.marker(job, f"nodes/{peer}/leaving") or {}).get("trainer") is False:
                return peer, "left on a notice before its trainer started"
        return None

    def attempt(self, job: Job, group: str, code_dir: str, store: CheckpointStore, attempt: int) -> Tuple[int, bool]:
        self.check_notice("code download" if attempt == 0 else "a restart")
        store.interrupt = lambda: self.check_notice("checkpoint restore")  # between parts: GBs outlast a notice
        with Timed(self.log, "restore checkpoint"):
            os.makedirs(job.checkpoint_dir, exist_ok=True)
            remove_partial_writes(job.checkpoint_dir)
            restored = store.restore_newest(job.checkpoint_dir)
        if restored is not None and restored[1] == "flat" and self.syncer is not None:
            # The last attempt's syncer, which a leave before training asks: the files the restore just rewrote
            # (new inodes and times) are no new checkpoint to it either.
            self.syncer.restored_flat()
        local = local_steps(job.checkpoint_dir)
        resume_step = max([s for s in ([restored[0]] if restored else []) + local[-1:]], default=None)
        self.check_notice("checkpoint restore")
        # What this attempt's progress is measured against: listed after the restore, which leaves out a newest
        # checkpoint that failed its check (the next save may take its number).
        self.newest_before = store.newest_complete()
        syncer = Syncer(store, job, self.log, self.keep)
        # a flat checkpoint's files hold the step: the agent cannot tell it (its number counts the snapshots)
        flat = restored[0] if restored is not None and restored[1] == "flat" else None
        if flat is not None:
            syncer.restored_flat()
            self.log(f"resume step: unknown (flat checkpoint {flat})")
        else:
            self.log(f"resume step: {resume_step if resume_step is not None else 'none (fresh start)'}")
        with Timed(self.log, "peer discovery"):
            self.peers = self.wait_for_peers(group, job)
            if attempt == 0 and job.min_nodes < job.max_nodes:
                self.peers = self.wait_for_ready_peers(job, group)
        ids = [i for i, _ in self.peers]
        self.log(f"peers: {', '.join(ids)}; rendezvous host {ids[0]}")
        cmd, env = self.torchrun_command(job, self.peers)
        env.update(
            {
                "SPOT_TRAINING_JOB_ID": job.job_id,
                "SPOT_TRAINING_CHECKPOINT_DIR": job.checkpoint_dir,
                "SPOT_TRAINING_RESUME_STEP": "" if resume_step is None or flat is not None else str(resume_step),
                "SPOT_TRAINING_RESUMED": "0" if resume_step is None else "1",
                "SPOT_TRAINING_CHECKPOINT_INTERVAL_S": ""
                if job.checkpoint_interval_s is None
                else str(job.checkpoint_interval_s),
                "SPOT_TRAINING_CHECKPOINT_WAIT_FOR_UPLOAD": "1" if job.checkpoint_wait_for_upload else "0",
                "SPOT_TRAINING_MTBI_S": str(job.mtbi_s),
                "SPOT_TRAINING_INSTANCE_ID": self.instance_id,
                "SPOT_TRAINING_NODE_INDEX": str(ids.index(self.instance_id)),
                "SPOT_TRAINING_NUM_PEERS": str(len(ids)),
                "SPOT_TRAINING_ATTEMPT": str(attempt),
            }
        )
        self.check_notice("peer discovery")
        if os.path.exists(self.world_file):
            os.remove(self.world_file)  # the last attempt's rounds
        try:  # for the peers already training: this node joins them (see add_joined_peers)
            self.put_marker(
                job,
                f"nodes/{self.instance_id}/training",
                {
                    "attempt": attempt,
                    "address": env["SPOT_TRAINING_STORE_BIND_ADDRESS"],
                    "private_ip": dict(self.peers)[self.instance_id],
                },
            )
        except AWS_ERRORS as exc:
            self.log(f"could not report that this node starts training ({exc}); peers that started before may miss it")
        with Timed(self.log, f"training attempt {attempt}"):
            rc, interrupted = self.run_trainer(job, code_dir, cmd, env, syncer)
        with Timed(self.log, "final checkpoint sync"):
            syncer.sync(final=True)
        self.syncer = syncer
        self.synced_report = None  # an earlier attempt's report is not to be written again for this one
        # Peers leaving on a notice (or a stop) wait for this: what this node held is in S3 (or failed to get there).
        try:
            pending = syncer.pending()
            synced = {"attempt": attempt, "pending": pending, "rc": rc, "interrupted": interrupted}
            self.synced_report = job, synced
            self.put_marker(job, f"nodes/{self.instance_id}/synced", synced)
        except (OSError, *AWS_ERRORS) as exc:  # the notice, stop or restart that follows must still happen
            self.log(f"could not report this node's final sync ({exc}); peers wait for it at most the grace")
        return rc, interrupted

    def wait_durable(self, job: Job, store: CheckpointStore, before: Optional[int], deadline: float) -> None:
        """After a notice or a stop (the trainer has exited): wait, until the grace ends, for what the job saved to be
        durable in S3: this node's own newest checkpoint (if it holds one: the node of rank 0), and each peer's
        final sync of the attempt that just ended (its ``nodes/<id>/synced`` marker; a peer that left the group has
        nothing more to give).

        Not "a checkpoint newer than ``before``" (the newest durable one at the notice): when a peer's notice
        stopped the training first, the emergency checkpoint may already be durable by then, and nothing newer
        ever comes."""
        try:
            self._wait_durable(job, store, before, deadline)
        except (OSError, *AWS_ERRORS) as exc:  # what comes next (hand back, STOPPED) must still run
            self.log(f"could not check that the last checkpoint is durable: {exc}")

    def _wait_durable(self, job: Job, store: CheckpointStore, before: Optional[int], deadline: float) -> None:
        while True:
            own = self.own_pending()
            waiting = [] if own is not None else self.unsynced_peers(job)
            if own is None and not waiting:
                newest = store.newest_complete()
                if newest is not None and (before is None or newest > before):
                    self.log(f"emergency checkpoint {newest} is durable in S3")
                else:
                    self.log(f"nothing newer than checkpoint {before} to save; it stays the newest durable one")
                return
            if time.monotonic() >= deadline:
                what = own if own is not None else f"the final sync of {', '.join(waiting)}"
                self.log(f"{what} not durable in S3 within the grace; the last durable one stays")
                return
            time.sleep(min(self.poll_s, 1.0))

    def wait_for_final_syncs(self, job: Job) -> None:
        """Before a restart: wait, at most the grace, for the final sync (``nodes/<id>/synced``) of each peer of the
        attempt that just ended that is still in the group. The node of rank 0 may still be uploading the attempt's
        newest checkpoint (the emergency one, when it leaves on a notice). Restoring before its final sync would
        resume from the checkpoint before (with fewer nodes than the maximum, nobody would bring the newer one back),
        and judging progress before it would count a restart without progress that made some."""
        deadline = time.monotonic() + job.grace_s
        waited: List[str] = []
        while True:
            self.check_notice("a restart")
            waiting: Optional[List[str]] = None
            try:
                waiting = self.unsynced_peers(job)
            except AWS_ERRORS as exc:  # an API hiccup: poll again, within the deadline
                self.log(f"peers' final sync poll failed: {exc}")
            if waiting == []:
                if waited:
                    self.log(f"peer(s) {', '.join(waited)} synced their final checkpoints")
                return
            if waiting and not waited:
                self.log(f"waiting for the final checkpoint sync of peer(s) {', '.join(waiting)}")
                waited = waiting
            if time.monotonic() >= deadline:
                who = ", ".join(waiting or waited)
                what = f"no final sync from peer(s) {who}" if who else "no answer from S3 about the peers' final syncs"
                self.log(f"{what} within {job.grace_s:.0f} s; restarting from what S3 holds")
                return
            time.sleep(min(self.poll_s, 1.0))

    def unsynced_peers(self, job: Job) -> List[str]:
        """Peers of the last attempt still in the group that owe the final sync of a trainer (``owes_final_sync``)."""
        others = [i for i, _ in self.peers if i != self.instance_id]
        if not others:
            return []
        in_group = self.group_members()
        return [peer for peer in others if peer in in_group and self.owes_final_sync(job, peer)]

    def trainer_markers(self, job: Job, peer: str) -> Tuple[Optional[Dict[str, Any]], Optional[Dict[str, Any]]]:
        """``peer``'s newest ``nodes/<id>/training`` (written just before its torchrun) and ``nodes/<id>/synced``
        (its report of a trainer's final sync) markers, each None if absent."""
        return self.marker(job, f"nodes/{peer}/training"), self.marker(job, f"nodes/{peer}/synced")

    def owes_final_sync(self, job: Job, peer: str) -> bool:
        """Whether ``peer``'s newest trainer started before ours ended and has no final sync reported (a ``synced``
        written after it); see ``owes``."""
        return self.owes(*self.trainer_markers(job, peer))

    def owes(self, training: Optional[Dict[str, Any]], synced: Optional[Dict[str, Any]]) -> bool:
        """``owes_final_sync`` of a peer's two markers.

        A peer that started no trainer after its last report (still restoring a checkpoint, or looking for peers,
        when our trainer ended) has nothing of the attempt to give: waiting for it would hold a restart for the
        whole grace. One whose newest trainer started after ours ended synced the one before it first. A peer's
        two markers are compared on its own clock, not against our trainer's start: a ``synced`` of its previous
        trainer written after ours started is not the sync of the trainer it ran with ours."""
        if training is None or stamp(training) > self.trainer_ended:
            return False
        # A report with a pending checkpoint: its final sync failed, and its agent retries it (``own_pending``)
        # and reports again once it is durable.
        return synced is None or stamp(synced) < stamp(training) or synced.get("pending") is not None

    def restarting(self, job: Job, peer: str) -> bool:
        """Whether ``peer`` trains again after this attempt instead of finishing: its trainer failed where ours
        finished (its final sync reports an exit code other than 0, without a notice), and it restores, looks for
        its peers or already runs a trainer started after ours ended. A trainer it started before ours ended (it
        failed mid-run and rejoined our training) finishes with ours: not a restart."""
        training, synced = self.trainer_markers(job, peer)
        synced = self.fresh(synced)
        if synced is None:
            return False
        started = stamp(training) if training is not None else 0.0
        if started > stamp(synced):
            return started > self.trainer_ended
        return synced.get("rc", 0) != 0 and not synced.get("interrupted", False)

    def group_members(self) -> Set[str]:
        """The instances in this node's group, in any lifecycle state."""
        groups = self.asg.describe_auto_scaling_groups(AutoScalingGroupNames=[self.group])["AutoScalingGroups"]
        return {i["InstanceId"] for g in groups for i in g["Instances"]}

    def synced_durably(self, job: Job, peer: str, *, finished: bool = False) -> bool:
        """Whether ``peer`` reported the final sync of the last attempt with nothing left pending; with ``finished``,
        also that its trainer exited 0. A peer that left on a spot notice or a failure did not finish, even where
        this node's trainer did (a script that ends its loop when the helper says stop, and exits 0)."""
        training, synced = self.trainer_markers(job, peer)
        synced = self.fresh(synced)
        if synced is None or synced.get("pending") is not None or self.owes(training, synced):
            return False
        return not finished or synced.get("rc", 0) == 0

    def reported(self, job: Job, peer: str, name: str) -> Optional[Dict[str, Any]]:
        """``peer``'s marker ``nodes/<peer>/<name>`` (``synced``, ``done``) if ``fresh``, else None."""
        return self.fresh(self.marker(job, f"nodes/{peer}/{name}"))

    def fresh(self, body: Optional[Dict[str, Any]]) -> Optional[Dict[str, Any]]:
        """A marker ``body`` if written since the last attempt's trainer started (one written for an earlier attempt
        does not count), else None."""
        return body if body is not None and stamp(body) >= self.trainer_started else None

    def finish(self, job: Job, group: str) -> bool:
        """Barrier over S3: wait (bounded) for every peer's done marker, then write DONE and scale to 0.

        False (not DONE) when a peer left the group before it reported its final sync complete (``synced`` without
        pending files): it may have held rank 0's final checkpoint, which DONE would then leave out of S3. The
        caller trains again from the newest durable checkpoint, and that attempt makes the final one again. Also
        False when this node's own final checkpoint is still not in S3 when the barrier's time is up, and when a
        peer trains again (``restarting``): it waits for this node at its rendezvous. ``not_done`` says why."""
        deadline = time.monotonic() + self.barrier_s
        own = self.own_pending_until(deadline)  # its final sync failed: try again, within the barrier's time
        if own is not None:
            self.not_done = f"{own} of this node not durable in S3 within {self.barrier_s:.0f} s"
            self.log(f"{own} not durable in S3 within {self.barrier_s:.0f} s: not reporting done; training again")
            return False
        self.put_marker(job, f"nodes/{self.instance_id}/done", {})
        waiting = [i for i, _ in self.peers if i != self.instance_id]
        while waiting:
            if self.marker(job, "DONE") is not None:  # scaled to 0 by that peer; again here, in case it could not
                self.log(f"job {job.job_id} is DONE (a peer finished it)")
                self.scale_to_zero(group)
                return True
            if time.monotonic() >= deadline:  # one may still upload the final checkpoint: the last one writes DONE
                self.log(
                    f"peers {', '.join(waiting)} did not report done within {self.barrier_s:.0f} s; leaving the job "
                    "to them (the last node to finish writes DONE and scales the group to 0)"
                )
                self.release_warm_volume()
                self.leave_group(group, for_good=True)
                return True
            waiting = [i for i in waiting if self.reported(job, i, "done") is None]
            if waiting:  # a peer that left the group (interrupted, powered off) will never report
                in_group = self.group_members()
                gone = [i for i in waiting if i not in in_group]
                lost = [i for i in gone if not self.synced_durably(job, i, finished=True)]
                if lost:
                    self.not_done = f"peer(s) {', '.join(lost)} left before they finished with a durable checkpoint"
                    self.log(
                        f"peer(s) {', '.join(lost)} left the group before they finished training with their final "
                        "checkpoint durable: the job is not DONE; training again from the newest durable checkpoint "
                        "to make the final one again"
                    )
                    return False
                if gone:
                    self.log(f"peers {', '.join(gone)} left the group after their final sync; not waiting for them")
                    waiting = [i for i in waiting if i in in_group]
                again = [i for i in waiting if self.restarting(job, i)]
                if again:  # it waits for this node at its rendezvous: leaving would leave it short of min_nodes
                    self.not_done = f"peer(s) {', '.join(again)} trained again instead of finishing"
                    self.log(
                        f"peer(s) {', '.join(again)} train again (their trainer failed where this one finished): "
                        "training again with them from the final checkpoint"
                    )
                    return False
            if waiting:
                time.sleep(min(self.poll_s, 1.0))
        self.put_marker(job, "DONE", {"peers": [i for i, _ in self.peers]})
        self.log(f"job {job.job_id} DONE: s3://{job.bucket}/{job.job_prefix}DONE")
        self.scale_to_zero(group)
        return True

    def finish_failed(self, job: Job, group: str, exc: Exception) -> None:
        """S3 or Auto Scaling failed in the done barrier after a good training. Once ``DONE`` is written, scale
        to 0 again (peers that saw it have exited and leave the scaling to this node); before, leave the group
        (one fewer): a peer still in its barrier writes ``DONE``."""
        try:
            done = self.marker(job, "DONE") is not None
        except AWS_ERRORS as again:  # in doubt, never cut off a peer's final upload
            self.log(f"reading DONE failed too ({again})")
            done = False
        if done:
            self.log(f"done barrier failed after DONE ({exc}); scaling {group} to 0 again")
            self.scale_to_zero(group)
            return
        self.log(f"done barrier failed ({exc}); leaving the job to the peers (the last one writes DONE)")
        self.release_warm_volume()
        self.leave_group(group, for_good=True)

    def stopped(self, job: Job, group: str, store: CheckpointStore) -> int:
        """``trainctl stop``: the final checkpoint is durable (or the last one stays); mark STOPPED, scale to 0. A stop
        is no failure: when S3 or Auto Scaling fails here, this node leaves the group (one fewer), and a peer that
        reaches this point writes STOPPED and scales to 0."""
        try:
            if self.marker(job, "STOPPED") is None:
                self.put_marker(job, "STOPPED", {"last_checkpoint": store.newest_complete()})
            self.log(f"job {job.job_id} STOPPED on request")
            self.scale_to_zero(group)
        except AWS_ERRORS as exc:
            self.log(f"the stop failed to finish ({exc}); leaving {group}")
            self.release_warm_volume()
            self.leave_group(group, for_good=True)
        return 0

    def fail(self, job: Job, group: str, reason: str) -> int:
        self.put_marker(job, "FAILED", {"reason": reason})
        self.log(f"job {job.job_id} FAILED: {reason}")
        self.scale_to_zero(group)
        return EXIT_FAILED

    def run(self) -> int:
        signal.signal(signal.SIGTERM, lambda *_: self.stop_signal.set())
        try:
            return self.load_and_run()
        finally:
            if self.log.shipper is not None:
                self.log.shipper.flush()  # before the instance may go
            self.complete_drain()  # however the agent ends: the drain hook must not hold the instance billed
            if self.log.shipper is not None:
                self.log.shipper.close()

    def load_and_run(self) -> int:
        try:
            job = load_job(self.ssm, self.args.job_spec_parameter)
            for key, expected in (("team", self.args.team), ("cluster", self.args.cluster)):
                if job.spec.get(key) != expected:
                    raise JobRefused(
                        f"job spec {key} {job.spec.get(key)!r} does not match --{key} {expected!r}",
                        (job.bucket, f"{job.spec['cluster']}/{job.job_id}/FAILED"),
                    )
        except JobRefused as exc:
            self.refuse_job(exc)
            raise
        except (AgentError, *AWS_ERRORS) as exc:  # SSM unreadable: no job to run on this node
            self.give_up(str(exc))
            raise AgentError(str(exc)) from None
        job.checkpoint_dir = self.node_root + job.checkpoint_dir
        self.log.shipper = LogShipper(self.logs, job.log_group, f"{job.job_id}/{self.instance_id}")
        handler = logging.Handler()
        handler.emit = lambda record: self.log(record.getMessage())  # type: ignore[method-assign]
        logging.getLogger("spot_training").addHandler(handler)
        logging.getLogger("spot_training").setLevel(logging.INFO)
        try:
            return self._run(job)
        except AgentError as exc:
            self.log(f"error: {exc}")
            raise
        finally:
            self.release_warm_volume()

    def refuse_job(self, refused: JobRefused) -> None:
        """Every node of the group would refuse this job: mark it FAILED (when its spec says where) and scale the
        group to 0, instead of leaving the nodes idle and billed. ``trainctl status`` then shows the reason."""
        self.log(f"error: {refused}")
        if refused.failed_at is not None:
            bucket, key = refused.failed_at
            body = {"reason": f"the node agent refused the job: {refused}", "instance_id": self.instance_id}
            try:
                self.s3.put_object(Bucket=bucket, Key=key, Body=json.dumps(dict(body, time=time.time())))
                self.log(f"job FAILED: s3://{bucket}/{key}")
            except AWS_ERRORS as exc:
                self.log(f"could not mark the job FAILED ({exc})")
        try:
            self.scale_to_zero(self.group_name())
        except (AgentError, *AWS_ERRORS) as exc:
            self.log(f"could not find this instance's group to scale it to 0 ({exc}); scale it to 0 by hand")
            self.leave_group("its group", for_good=True)

    def _run(self, job: Job) -> int:
        self.log(
            f"job {job.job_id}: code s3://{job.bucket}/{job.code_key}, command {job.spec['command']!r}, "
            f"nodes {job.min_nodes}:{job.max_nodes} x {job.nproc_per_node}"
        )
        try:
            group = self.group = self.group_name()
            self.put_boot_marker(job)
            ended = [name for name in END_MARKERS if self.marker(job, name) is not None]
        except (AgentError, *AWS_ERRORS) as exc:
            self.give_up(f"before training: {exc}")
            raise AgentError(f"before training: {exc}") from None
        if ended:
            self.log(f"job {job.job_id} is already {ended[0]}; nothing to run")
            self.scale_to_zero(group)
            return EXIT_FAILED if ended[0] == "FAILED" else 0
        store = self.store = CheckpointStore(
            self.s3, job.bucket, f"{job.job_prefix}{CHECKPOINT_FOLDER}/", job.job_id, self.log
        )
        self.drain_hold.start()  # a final upload may outlast the drain hook's heartbeat
        try:
            self.check_notice("boot")
            self.claim_warm_volume(job)
            os.makedirs(self.work_dir, exist_ok=True)
            with Timed(self.log, "download code"):
                code_dir = download_code(self.s3, job, self.work_dir)
            return self.attempts(job, group, code_dir, store)
        except LeavingBeforeTraining as exc:
            return self.leave_before_training(job, group, str(exc), stop=isinstance(exc, StopBeforeTraining))
        except Exception as exc:
            # No code, no readable checkpoint, peers that never came, an agent bug: this node cannot go on, and
            # exiting would leave it idle in the group (billed). FAILED with the reason, and the group to 0.
            if isinstance(exc, AgentError):
                reason = str(exc)
            elif isinstance(exc, AWS_ERRORS):
                reason = f"AWS did not answer after the retries: {exc}"
            else:
                reason = f"node agent error: {type(exc).__name__}: {exc}"
            training = self.training_without_this_node(job, group, reason)
            if training:  # a replacement that could not join: the job goes on without it
                self.give_up(f"{reason} (peers {', '.join(training)} train on without this node)")
                if isinstance(exc, (AgentError, *AWS_ERRORS)):
                    raise AgentError(f"before training: {reason}") from None
                raise  # an agent bug: its traceback goes to the node's console too
            try:
                self.fail(job, group, reason)
            except AWS_ERRORS as failed:
                self.log(f"could not mark the job FAILED ({failed})")
                self.scale_to_zero(group)
            if isinstance(exc, (AgentError, *AWS_ERRORS)):  # one line: S3 or Auto Scaling did not answer
                raise JobFailed(reason) from None
            raise  # an agent bug: its traceback goes to the node's console too

    def training_without_this_node(self, job: Job, group: str, reason: str) -> List[str]:
        """On an error before this node's trainer ever started (a replacement's boot: code download, restore,
        peers): the peers that train now, who can go on without it (at least ``min_nodes`` of them). Empty if its
        trainer ran, if no peer trains (the error is then the job's: every node would meet it), if fewer than
        ``min_nodes`` do (they wait for this node at their rendezvous), or if that cannot be told."""
        if self.trainer_started:
            return []
        try:
            training = self.peers_training(job, group)
        except AWS_ERRORS as exc:
            self.log(f"could not tell whether peers train on ({exc}); failing the job for: {reason}")
            return []
        return training if len(training) >= job.min_nodes else []

    def attempts(self, job: Job, group: str, code_dir: str, store: CheckpointStore) -> int:
        """Training attempts until the job is done, stopped or failed, or this node is interrupted."""
        failures, attempt, unfinished = 0, 0, 0
        while True:
            rc, interrupted = self.attempt(job, group, code_dir, store, attempt)
            before = self.newest_before
            if rc == 0:
                if interrupted:
                    self.log("the trainer finished before the notice took effect: finishing the job")
                try:
                    if self.finish(job, group):
                        return 0
                except AWS_ERRORS as exc:  # the training ended well: not a FAILED job
                    self.finish_failed(job, group, exc)
                    return 0
                if interrupted and not self.stop_requested:  # being reclaimed: its peers train again without it
                    self.wait_durable(job, store, self.notice_newest, self.notice_at + job.grace_s)
                    self.hand_back(group)
                    return 0
                unfinished += 1  # bounded: an S3 that keeps refusing the final checkpoint would loop forever
                if not interrupted and unfinished > job.max_restarts + 1:
                    return self.fail(
                        job,
                        group,
                        f"the training finished {unfinished} times without the job becoming DONE: {self.not_done}",
                    )
            if interrupted and self.stop_requested:
                self.wait_durable(job, store, self.notice_newest, self.notice_at + job.grace_s)
                return self.stopped(job, group, store)
            if rc != 0 and self.marked(job, "STOP"):  # a peer's trainer stopped ours collectively
                # Rank 0's node may still be uploading the final checkpoint: scaling to 0 now would cut it off.
                self.wait_durable(job, store, before, time.monotonic() + job.grace_s)
                return self.stopped(job, group, store)
            if interrupted:
                self.wait_durable(job, store, self.notice_newest, self.notice_at + job.grace_s)
                self.log("interrupted: exiting cleanly; the group replaces this instance")
                self.hand_back(group)
                return 0
            # This node's own final sync may have failed: the restore of a flat checkpoint would write S3's older
            # copy over the newer files, and peers wait for this node's report.
            try:
                own = self.own_pending_until(time.monotonic() + job.grace_s, during="a restart")
                if own is not None:
                    self.log(f"{own} not durable in S3 within {job.grace_s:.0f} s; restarting from what S3 holds")
            except (OSError, *AWS_ERRORS) as exc:  # S3 does not say: restart from what it holds
                self.log(f"could not make this node's last checkpoint durable ({exc}); restarting from what S3 holds")
            self.wait_for_final_syncs(job)
            try:
                after = store.newest_complete()
            except AWS_ERRORS as exc:  # S3 does not say: no progress seen (bounded by max_restarts)
                self.log(f"could not list the checkpoints after the attempt ({exc})")
                after = None
            progressed = after is not None and (before is None or after > before)
            # Trained to the end, but the final checkpoint was lost (finish() said so): the next attempt makes it
            # again. Not a restart without progress, or max_restarts 0 would fail a finished job.
            failures = 0 if progressed or rc == 0 else failures + 1
            # A trainer the stall watchdog ended counts as a failed one.
            ended = f"{self.stalled} (job.stall_timeout_s)" if self.stalled else f"trainer exited with code {rc}"
            self.log(
                f"{ended}; {'progress was made' if progressed else 'no new checkpoint'}; "
                f"restarts without progress: {failures}/{job.max_restarts}"
            )
            if failures > job.max_restarts:
                return self.fail(job, group, f"{ended} after {failures - 1} restart(s) without a new checkpoint")
            attempt += 1
            time.sleep(min(self.poll_s, 5.0))


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="Spot training node agent (started by user_data.sh).")
    p.add_argument("--region", required=True)
    p.add_argument("--team", required=True)
    p.add_argument("--cluster", required=True)
    p.add_argument("--job-spec-parameter", required=True)
    p.add_argument("--instance-id", required=True)
    p.add_argument("--availability-zone", default="")
    p.add_argument("--launch-index", default="0")
    p.add_argument("--asg-name", default="", help="aws:autoscaling:groupName tag (looked up when empty)")
    return p.parse_args(argv)


def main(argv: Optional[List[str]] = None) -> int:
    args = parse_args(argv)
    try:
        return Agent(args).run()
    except AgentError as exc:
        print(f"node-agent: error: {exc}", file=sys.stderr, flush=True)
        return EXIT_FAILED if isinstance(exc, JobFailed) else EXIT_BAD_INPUT


if __name__ == "__main__":
    sys.exit(main())
