"""Emulated instances: every instance an emulated Auto Scaling group launches becomes a local node.

    with EmulatedCloud() as cloud, NodeLauncher(cloud, work_dir) as nodes:
        ...                                  # scale a group up: its instances boot as nodes
        nodes.interrupt(instance_id)         # a spot interruption notice, as AWS delivers it

A node is a process tree running that instance's actual user data, with its own metadata mock, loopback address,
root directory and environment (:mod:`emulator.node_boot` says what it boots with; :mod:`emulator.node_process` how
its processes start and end).

The launcher polls the groups (every ``poll_s``) and mirrors what EC2 would do:
- an InService instance with no node boots one (once per instance, like a real boot);
- an instance its group is ending (``Terminating:Wait``: the group's terminating lifecycle hook holds it, see
  ``emulator/lifecycle.py``) keeps its node running, and its metadata's ``autoscaling/target-lifecycle-state``
  turns ``Terminated``, as on EC2: the node's agent saves and completes the hook;
- an instance that left the group (terminated: scaled in, handed back, its hook completed or timed out, or
  :meth:`terminate` with ``hard``) loses its node: SIGTERM to the process tree (the shutdown), SIGKILL after
  ``SHUTDOWN_GRACE_S`` (``terminate(id, hard=True)``: SIGKILL at once, a power cut);
- a node that got a notice is reclaimed (terminated in EC2, which no lifecycle hook holds) once its process
  exited while its instance is still in the group, or at the latest when the notice's time is up: then its process
  tree is SIGKILLed first, as EC2 takes the instance whatever it is still doing.
An instance terminated in EC2, or taken out of its group without decrementing, makes moto launch a replacement,
which boots as a new node.

An instance that fails to boot is reported (``on_event``, ``errors``) and not tried again; a poll round that
fails is reported, and becomes an error after ``FAILED_ROUNDS_FATAL`` failed rounds in a row.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import re
import secrets
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any, Optional

from emulator.cloud import EmulatedCloud, EmulatorError
from emulator.imds import ImdsMock
from emulator.node_boot import (
    Node,
    RoleCredentials,
    instance_role_credentials,
    metadata_mock,
    read_instance,
    user_data_environment,
)
from emulator.node_process import SHUTDOWN_GRACE_S, end_process_tree, exit_status, start_user_data

__all__ = ["FAILED_ROUNDS_FATAL", "SHUTDOWN_GRACE_S", "Node", "NodeLauncher"]

FAILED_ROUNDS_FATAL = 5  # poll rounds failing in a row before wait_for gives up (one failed round is a hiccup)
FIRST_HOST = ipaddress.ip_address("127.0.0.10")  # plus a random 127.X.Y.0 per launcher, see NodeLauncher
_OPT_PATH = re.compile(r"(?<![\w./-])/opt/")


class NodeLauncher:
    """Boots, interrupts and reaps emulated nodes for the groups of an :class:`EmulatedCloud`. See the module doc."""

    def __init__(
        self,
        cloud: EmulatedCloud,
        work_dir: Path,
        *,
        groups: Optional[list[str]] = None,
        poll_s: float = 0.5,
        node_env: Optional[dict[str, str]] = None,
        on_event: Optional[Callable[[str], None]] = None,
        instance_credentials: bool = False,
    ) -> None:
        """``groups``: Auto Scaling group names to watch (default: all). ``node_env``: extra environment.
        ``instance_credentials``: nodes call AWS with their instance role's credentials, from their metadata mock
        (default: the emulator's fake root credentials); see the module docstring."""
        self.cloud = cloud
        self.work_dir = work_dir.resolve()  # the node's script and paths must not depend on its working directory
        self.groups = groups
        self.poll_s = poll_s
        self.node_env = dict(node_env or {})
        self.on_event = on_event
        self.nodes: dict[str, Node] = {}
        self.address_map_file = self.work_dir / "address-map.json"
        self.errors: list[str] = []
        self.failed_boots: dict[str, str] = {}  # instance id -> why it did not boot (not tried again)
        # Every node's rendezvous listens on the job's fixed port: a /24 of 127.0.0.0/8 of its own per launcher
        # keeps runs of other users (or tests) on this machine apart.
        self._next_host = FIRST_HOST + (secrets.randbelow(254 * 256) + 256) * 256
        self._group_type: dict[str, str] = {}
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self.instance_credentials = instance_credentials
        self._asg = cloud.client("autoscaling")
        self._ec2 = cloud.client("ec2")
        self._role_credentials: dict[str, RoleCredentials] = {}  # watched group -> its instance role

    # -- public API --------------------------------------------------------------------------------

    def start(self) -> NodeLauncher:
        self.work_dir.mkdir(parents=True, exist_ok=True)
        if self.instance_credentials:
            groups = self.groups or [
                g["AutoScalingGroupName"]
                for page in self._asg.get_paginator("describe_auto_scaling_groups").paginate()
                for g in page["AutoScalingGroups"]
            ]
            for group in groups:
                self._role_credentials[group] = instance_role_credentials(
                    cloud=self.cloud, asg=self._asg, ec2=self._ec2, group=group
                )
        self._write_address_map()
        self._thread = threading.Thread(target=self._loop, name="node-launcher", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop watching and end every node's process tree and metadata mock. Idempotent.

        Anything that cuts it short (a second Ctrl-C, also while the poll thread is joined; a closed terminal) ends
        the nodes not yet stopped at once: they run in sessions of their own, out of the terminal's reach."""
        try:
            self._stop.set()
            if self._thread is not None:
                self._thread.join(timeout=30)
                self._thread = None
            with self._lock:
                nodes = list(self.nodes.values())
                running = [n for n in nodes if n.running]
                if running:
                    self._report(f"stopping {len(running)} node(s) (up to {SHUTDOWN_GRACE_S:.0f} s each)")
                for node in nodes:
                    self._shutdown(node)  # nothing for a node already shut down
        except BaseException:
            for node in list(self.nodes.values()):  # not under the lock: a poll round may hold it for a while
                self._shutdown(node, hard=True)
            raise

    def all_nodes(self) -> list[Node]:
        """Every node booted so far (a copy: the poll thread adds nodes)."""
        with self._lock:
            return list(self.nodes.values())

    def __enter__(self) -> NodeLauncher:
        return self.start()

    def __exit__(
        self, exc_type: Optional[type[BaseException]], exc: Optional[BaseException], tb: Optional[TracebackType]
    ) -> None:
        self.stop()

    def running(self, group: Optional[str] = None) -> list[Node]:
        with self._lock:
            return [n for n in self.nodes.values() if n.running and (group is None or n.group == group)]

    def node(self, instance_id: str) -> Node:
        with self._lock:
            if instance_id not in self.nodes:
                raise EmulatorError(f"no emulated node for instance {instance_id}")
            return self.nodes[instance_id]

    def interrupt(self, instance_id: str, *, in_s: int = 120) -> Node:
        """Deliver a spot interruption notice through the node's metadata (``spot/instance-action``); after
        ``in_s`` the instance is taken (process tree SIGKILLed, instance terminated) if it is still there."""
        node = self.node(instance_id)
        node.imds.interrupt(in_s=in_s)
        with self._lock:
            node.notice_at = time.time()
            deadline = time.monotonic() + in_s
            node.notice_deadline = min(deadline, node.notice_deadline or deadline)
        self._event(node, f"spot interruption notice delivered (termination in {in_s} s)")
        return node

    def recommend_rebalance(self, instance_id: str) -> Node:
        """Deliver a rebalance recommendation (``events/recommendations/rebalance``)."""
        node = self.node(instance_id)
        node.imds.recommend_rebalance()
        node.rebalance_at = time.time()
        self._event(node, "rebalance recommendation delivered")
        return node

    def terminate(self, instance_id: str, *, hard: bool = False) -> Node:
        """Take the instance away with no spot notice; the group launches a replacement.

        Default: its group ends it (``TerminateInstanceInAutoScalingGroup`` without decrementing, as capacity
        rebalancing does once the replacement runs): with the group's drain hook the instance waits in
        ``Terminating:Wait`` and its node sees ``autoscaling/target-lifecycle-state`` ``Terminated``; without one, the
        node is shut down (SIGTERM, SIGKILL after ``SHUTDOWN_GRACE_S``). ``hard``: a power cut: the node's whole
        process tree is SIGKILLed first (no handler runs, nothing is flushed: unshipped log lines and unsynced local
        checkpoints are lost), then the instance is terminated in EC2 (no hook holds that; moto takes it out of its
        group, which launches a replacement).
        """
        node = self.node(instance_id)
        with self._lock:
            if hard:
                self._shutdown(node, hard=True)
                self._ec2.terminate_instances(InstanceIds=[instance_id])  # moto: out of the group, a replacement
            else:
                self._asg.terminate_instance_in_auto_scaling_group(
                    InstanceId=instance_id, ShouldDecrementDesiredCapacity=False
                )
            self._event(node, "powered off with no notice" if hard else "ended by its group with no spot notice")
            self.poll()
        return node

    def wait_for(self, predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
        """Poll ``predicate`` (with the launcher running) until true; EmulatorError after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while not predicate():
            if self.errors:
                raise EmulatorError(f"node launcher failed: {self.errors[-1]}")
            failed = [
                n for n in self.all_nodes() if n.exit_code not in (None, 0) and n.notice_at is None and not n.shut_down
            ]
            if failed:
                tail = failed[0].console.read_text(errors="replace").strip().splitlines()[-1:]
                raise EmulatorError(
                    f"node {failed[0].instance_id} failed (user data exit code {failed[0].exit_code}) while waiting "
                    f"for {what}: {' '.join(tail)} (console: {failed[0].console})"
                )
            if time.monotonic() > deadline:
                raise EmulatorError(f"timed out after {timeout_s:.0f} s waiting for {what}")
            time.sleep(0.2)

    # -- reconcile ---------------------------------------------------------------------------------

    def _loop(self) -> None:
        failed_rounds = 0
        while not self._stop.wait(self.poll_s):
            try:
                self.poll()
                failed_rounds = 0
            except Exception as exc:  # reported; an error for wait_for only if it persists; the loop goes on
                failed_rounds += 1
                message = f"{type(exc).__name__}: {exc}"
                self._report(f"poll round failed ({failed_rounds} in a row): {message}")
                if failed_rounds == FAILED_ROUNDS_FATAL:
                    self.errors.append(message)

    def poll(self) -> None:
        """One reconcile round: boot new instances, shut down gone ones, reclaim interrupted ones."""
        with self._lock:
            in_service, draining = self._in_service()
            for instance_id, group in sorted(in_service.items()):
                if instance_id in self.nodes or instance_id in self.failed_boots or self._stop.is_set():
                    continue
                try:
                    self._boot(instance_id, group)
                except Exception as exc:  # this instance stays without a node (once, like a real boot)
                    message = f"instance {instance_id} of {group} did not boot: {type(exc).__name__}: {exc}"
                    self.failed_boots[instance_id] = message
                    self.errors.append(message)
                    self._report(message)
            for node in self.nodes.values():
                if node.exit_code is None and not node.running:
                    node.exit_code, node.exited_at = exit_status(node.proc), time.time()
                    self._event(node, f"user data exited with code {node.exit_code}")
                if node.instance_id in draining and node.draining_at is None and node.terminated_at is None:
                    node.draining_at = time.time()
                    node.imds.terminating()
                    self._event(node, "its group is ending it (Terminating:Wait): target lifecycle state Terminated")
                if node.instance_id not in in_service and node.instance_id not in draining:
                    if node.terminated_at is None:
                        node.terminated_at = time.time()
                        self._event(node, "instance left the group: shutting the node down")
                        self._shutdown(node)
                elif node.notice_deadline is not None and node.terminated_at is None:
                    if node.exit_code is None and time.monotonic() >= node.notice_deadline:
                        self._event(node, "the interruption notice's time is up: EC2 takes the instance")
                        self._shutdown(node, hard=True)
                    if node.exit_code is not None:
                        self._reclaim(node)
                        node.terminated_at = time.time()
                        self._event(node, "reclaimed by EC2 after the interruption notice")
                        self._shutdown(node)

    def _reclaim(self, node: Node) -> None:
        """EC2 takes the instance: terminated in EC2 (no lifecycle hook holds that). moto then takes it out of its
        group, which launches a replacement (one that was already leaving it leaves no gap to fill)."""
        self._ec2.terminate_instances(InstanceIds=[node.instance_id])

    def _in_service(self) -> tuple[dict[str, str], set[str]]:
        """The watched groups' InService instances (id -> group) and the ids of those in ``Terminating:Wait``."""
        kwargs: dict[str, Any] = {"AutoScalingGroupNames": self.groups} if self.groups else {}
        found: dict[str, str] = {}
        draining: set[str] = set()
        for page in self._asg.get_paginator("describe_auto_scaling_groups").paginate(**kwargs):
            for group in page["AutoScalingGroups"]:
                overrides = group.get("MixedInstancesPolicy", {}).get("LaunchTemplate", {}).get("Overrides", [])
                if overrides:  # moto launches mixed-instances groups without an instance type
                    self._group_type[group["AutoScalingGroupName"]] = overrides[0].get("InstanceType", "")
                for inst in group["Instances"]:
                    if inst["LifecycleState"] == "InService":
                        found[inst["InstanceId"]] = group["AutoScalingGroupName"]
                    elif inst["LifecycleState"] == "Terminating:Wait":
                        draining.add(inst["InstanceId"])
        return found, draining

    def _boot(self, instance_id: str, group: str) -> None:
        inst, user_data = read_instance(self._ec2, instance_id, group)
        host = str(self._next_host)
        self._next_host += 1
        node_dir = self.work_dir / instance_id
        root = node_dir / "root"
        root.mkdir(parents=True, exist_ok=True)
        script = node_dir / "user-data.sh"
        script.write_text(_OPT_PATH.sub(f"{root}/opt/", user_data))
        instance_type = inst.get("InstanceType") or self._group_type.get(group, "")
        console = node_dir / "console.log"
        imds = metadata_mock(host, self.cloud.region, inst, instance_type)
        if self.instance_credentials:
            if group not in self._role_credentials:
                raise EmulatorError(
                    f"no instance role credentials for {group}: it did not exist when the launcher started"
                )
            role = self._role_credentials[group]
            imds.set_role_credentials(
                role.role_name, role.credentials, role.profile["Arn"], role.profile["InstanceProfileId"]
            )
        imds.start()
        try:
            proc = self._start_user_data(script, root, console, imds)
        except BaseException:
            imds.stop()
            raise
        node = Node(
            instance_id, group, inst["PrivateIpAddress"], host, root, console, imds, imds.url, proc, time.time()
        )
        self.nodes[instance_id] = node
        self._write_address_map()
        self._event(node, f"booted on {host} (private {node.private_ip}, {instance_type})")

    def _start_user_data(self, script: Path, root: Path, console: Path, imds: ImdsMock) -> subprocess.Popen[bytes]:
        env = user_data_environment(
            self.cloud.client_env(),
            imds_url=imds.url,
            address_map=self.address_map_file,
            root=root,
            instance_credentials=self.instance_credentials,
        )
        return start_user_data(script, root, console, {**env, **self.node_env})

    def _write_address_map(self) -> None:
        mapping = {n.private_ip: n.host for n in self.nodes.values()}
        tmp = self.address_map_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(mapping, indent=1))
        os.replace(tmp, self.address_map_file)

    def _shutdown(self, node: Node, *, hard: bool = False) -> None:
        """End the node's process tree (SIGTERM, SIGKILL after ``SHUTDOWN_GRACE_S``; ``hard``: SIGKILL at once, a
        power cut), reap the user data's process and stop the metadata mock. Once per node: later calls do nothing."""
        if node.cleaned_up:
            return
        node.cleaned_up = True

        def mark_shut_down() -> None:
            node.shut_down = True

        end_process_tree(node.proc, hard=hard, on_running=mark_shut_down)
        if node.exit_code is None:
            node.exit_code, node.exited_at = node.proc.returncode, time.time()
        node.imds.stop()

    def _event(self, node: Node, message: str) -> None:
        node.events.append(f"{time.time():.3f} {message}")
        self._report(f"{node.instance_id} {message}")

    def _report(self, line: str) -> None:
        if self.on_event is not None:
            with contextlib.suppress(OSError):  # a terminal that hung up: the nodes must still be stopped
                self.on_event(line)
