"""The rendezvous: the peers of each training attempt (InService instances of the group, launch order; element 0
hosts the rendezvous), the wait for them, the nodes that join or are lost while a trainer runs, and torchrun's
command line and environment."""

from __future__ import annotations

import ipaddress
import json
import os
import time
from typing import Any, Callable, Dict, List, Optional, Set, Tuple

from spot_training.agent.errors import AWS_ERRORS, AgentError, LeavingBeforeTraining, StopBeforeTraining, one_line
from spot_training.agent.job import Job
from spot_training.agent.markers import Markers, stamp
from spot_training.agent.membership import Membership
from spot_training.agent.node import Node
from spot_training.agent.notices import Notices
from spot_training.agent.peers import Peers, discover_peers, group_instances, load_address_map
from spot_training.protocol import END_OF_TRAINING, LEAVING_MARKER, READY_MARKER, STOP, TRAINING_MARKER, node_marker

# bootstrap_scripts/, on the trainer's PYTHONPATH (spot_training.launch, the checkpoint helper)
BOOTSTRAP_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class Rendezvous:
    """The peers of this node's attempts (``peers``: (instance id, private IP) in launch order)."""

    def __init__(self, node: Node, markers: Markers, notices: Notices) -> None:
        self.node, self.markers, self.notices = node, markers, notices
        self.peers: Peers = []
        self.training_seen: Dict[str, Tuple[str, Dict[str, Any]]] = {}  # training markers read: id -> (ETag, body)
        self.world_file = os.path.join(node.settings.work_dir, "rendezvous-world.json")  # see add_joined_peers
        self.membership = Membership(node, markers)

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
            self.notices.check_notice(what)
            if self.markers.marked(job, STOP):
                raise StopBeforeTraining(f"stop requested (STOP marker) during {what}")
            failed: Optional[Exception] = None
            try:
                found = look()
            except AWS_ERRORS as exc:
                failed = exc
                self.node.log(f"peer discovery failed ({one_line(exc)}); trying again")
            else:
                if found is not None:
                    return found
            if time.monotonic() > deadline:
                return at_deadline(failed)
            time.sleep(self.node.poll_s)

    def discover(self, job: Job, group: str) -> Peers:
        """The group's InService, running instances in launch order, without those that announced leaving."""
        node = self.node
        return discover_peers(node.asg, node.ec2, group, self.markers.leaving_nodes(job))

    def wait_for_peers(self, group: str, job: Job) -> Peers:
        """The peers of the next attempt, once at least ``min_nodes`` are InService and mapped, within the join
        timeout."""
        # What the last poll that got an answer found: a failed poll keeps it (a node found past max_nodes stays a
        # spare that leaves, even when the poll at the deadline fails)
        peers: Peers = []
        surplus = False
        me, join_timeout_s = self.node.instance_id, self.node.settings.join_timeout_s

        def look() -> Optional[Peers]:
            nonlocal peers, surplus
            peers = self.discover(job, group)
            address_map = load_address_map()  # re-read: the emulator adds a node when it boots it
            unmapped = [i for i, ip in peers if address_map and ip not in address_map]
            # capacity rebalancing may go above the maximum: the nodes past it wait for a place
            surplus = me in dict(peers) and me not in dict(peers[: job.max_nodes])
            if unmapped:  # InService but not booted yet: its private address must never be contacted
                self.node.log(f"peer(s) {', '.join(unmapped)} not in the peer address map yet; waiting")
            elif len(peers) >= job.min_nodes and me in dict(peers[: job.max_nodes]):
                return peers[: job.max_nodes]
            elif surplus:
                self.node.log(f"{len(peers)} InService, more than max_nodes {job.max_nodes}; waiting for a place")
            return None

        def at_deadline(failed: Optional[Exception]) -> Peers:
            if surplus:  # the job has max_nodes without this node
                raise LeavingBeforeTraining(
                    f"still past max_nodes {job.max_nodes} after {join_timeout_s:.0f} s ({len(peers)} InService in "
                    f"{group})"
                )
            if failed is not None:
                raise AgentError(
                    f"peer discovery in {group} still failing after {join_timeout_s:.0f} s: {one_line(failed)}"
                )
            raise AgentError(f"fewer than {job.min_nodes} InService peers in {group} after {join_timeout_s:.0f} s")

        return self.poll_peers(job, "peer discovery", join_timeout_s, look, at_deadline)

    def wait_for_ready_peers(self, job: Job, group: str) -> Peers:
        """At an elastic job's first attempt (``min_nodes`` < ``max_nodes``): the peers, once every InService one is
        ready (its ``ready`` marker: restored, about to start torchrun), once any of them trains (its ``training``
        marker: a round runs already, which this node joins; a replacement never waits), or ``start_wait_s`` is up.

        torchrun's first round closes 30 s (its ``last_call_timeout``) after ``min_nodes`` joined. Instances of one
        launch boot minutes apart on EC2 (instance types, AMI loading), so without this wait a job would start on the
        first nodes up and restart its workers for each late one (a save, a restore, NCCL set up again). A peer that
        leaves the group is not waited for; at the bound, the job starts and late peers join the running training
        (torchrun restarts the workers)."""
        try:  # best effort: without it the peers wait their bound
            self.markers.put_own(job, READY_MARKER, {})
        except AWS_ERRORS as exc:
            self.node.log(
                f"could not report that this node is ready ({one_line(exc)}); its peers wait at most their bound"
            )
        said, peers, past_max = "", self.peers, False
        me, start_wait_s = self.node.instance_id, self.node.settings.start_wait_s

        def look() -> Optional[Peers]:
            nonlocal said, peers, past_max
            found = self.discover(job, group)[: job.max_nodes]
            markers = self.markers.node_markers(job)
            if me not in dict(found):  # past max_nodes now: wait for a place (below)
                past_max = True
                return []
            peers = found
            others = [i for i, _ in peers if i != me]
            if any(TRAINING_MARKER in markers.get(i, {}) for i in others):  # a round runs: join it, waiting splits
                return peers
            late = [i for i in others if READY_MARKER not in markers.get(i, {})]
            if not late:
                return peers
            if ", ".join(late) != said:
                said = ", ".join(late)
                self.node.log(
                    f"waiting up to {start_wait_s:g} s for peer(s) {said} to be ready, so that the first "
                    "rendezvous round has every node"
                )
            return None

        def at_deadline(failed: Optional[Exception]) -> Peers:
            self.node.log(
                f"peer(s) {said or '?'} not ready after {start_wait_s:g} s; starting without them "
                "(torchrun restarts the workers when they join)"
            )
            return peers

        ready = self.poll_peers(job, "the wait for peers", start_wait_s, look, at_deadline)
        return self.wait_for_peers(group, job) if past_max else ready

    def torchrun_command(self, job: Job, peers: Peers) -> Tuple[List[str], Dict[str, str]]:
        host_id, host_ip = peers[0]
        address_map = load_address_map()  # re-read: replacement nodes join the map while we run
        host = address_map.get(host_ip, host_ip)
        own_ip = dict(peers)[self.node.instance_id]
        local = address_map.get(own_ip, own_ip)
        is_host = "true" if host_id == self.node.instance_id else "false"
        wait = int(self.node.settings.join_timeout_s)
        last_call_s = self.node.settings.test_last_call_s
        last_call = f",last_call_timeout={last_call_s}" if last_call_s else ""
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
        return cmd, self.torchrun_env(job, local)

    def torchrun_env(self, job: Job, local: str) -> Dict[str, str]:
        """torchrun's environment: the agent's, with this directory on PYTHONPATH, the store's bind address
        ``local``, the world file and the shutdown timeout."""
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (BOOTSTRAP_DIR, env.get("PYTHONPATH", "")) if p)
        env["SPOT_TRAINING_STORE_BIND_ADDRESS"] = local  # see spot_training/launch.py
        env["SPOT_TRAINING_WORLD_FILE"] = self.world_file
        env["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"] = str(int(job.grace_s))
        # Through the pipe to the agent, Python block-buffers print(): a script printing ~100 bytes a minute would
        # reach the log, and the stall watchdog, every ~80 minutes. Unbuffered unless the environment says otherwise.
        env.setdefault("PYTHONUNBUFFERED", "1")
        if ipaddress.ip_address(local).is_loopback:  # emulation: keep gloo/NCCL/tensorpipe on loopback
            for name in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME", "TP_SOCKET_IFNAME"):
                env.setdefault(name, "lo")
        return env

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
            self.node.log(f"peer address map unreadable ({exc})")
            return
        unknown = world - {address_map.get(ip, ip) for _, ip in self.peers}
        if not unknown:
            return
        for _, instance_id, private_ip in self.newest_training(job, markers, unknown).values():
            self.peers.append((instance_id, private_ip))
            self.node.log(f"peer {instance_id} joined the training")

    def newest_training(
        self, job: Job, markers: Dict[str, Dict[str, str]], addresses: Set[str]
    ) -> Dict[str, Tuple[float, str, str]]:
        """{address: (time, instance id, private IP)} of the newest ``training`` marker of a node not among the peers
        that gives each of ``addresses``. Each marker is read once (by its ETag)."""
        known = {i for i, _ in self.peers}
        newest: Dict[str, Tuple[float, str, str]] = {}
        for instance_id, names in sorted(markers.items()):
            etag = names.get(TRAINING_MARKER)
            if instance_id in known or etag is None:
                continue
            if self.training_seen.get(instance_id, ("", {}))[0] != etag:
                body = self.markers.marker(job, node_marker(instance_id, TRAINING_MARKER)) or {}
                self.training_seen[instance_id] = (etag, body)
            body = self.training_seen[instance_id][1]
            address, when = str(body.get("address", "")), stamp(body)
            if address in addresses and when > newest.get(address, (-1.0, "", ""))[0]:
                newest[address] = (when, instance_id, str(body.get("private_ip", address)))
        return newest

    def lost_peer(
        self,
        job: Job,
        markers: Optional[Dict[str, Dict[str, str]]] = None,
        published: Optional[Dict[str, float]] = None,
    ) -> Optional[Tuple[str, str]]:
        """A peer of the running trainer that left the group and will not stop ours by leaving, (id, how), or None:
        one that left without announcing it (no notice: a hard termination), or one that announced it left before
        its trainer started (a notice while it restored or looked for peers). Ours would wait for it at the
        rendezvous or in a collective until a timeout. The group's instances come from the rendezvous host's
        published membership (``membership.py``; ``markers`` and ``published``: this poll's listing of ``nodes/``).
        """
        # A peer its group holds in Terminating:Wait still runs: its agent saves and announces leaving like on a
        # notice, and its trainer's exit stops ours. Not gone yet: it was not powered off.
        host = self.peers[0][0] if self.peers else self.node.instance_id
        present = self.membership.present(job, host, markers, published, ("InService", "Terminating:Wait"))
        gone = [i for i, _ in self.peers if i not in present and i != self.node.instance_id]
        if not gone:
            return None
        leaving = self.markers.leaving_nodes(job)
        unannounced = [i for i in gone if i not in leaving]
        if unannounced:
            return unannounced[0], "left the group without a notice"
        for peer in gone:  # announced; its trainer stops ours when it goes, unless it never ran
            if (self.markers.marker(job, node_marker(peer, LEAVING_MARKER)) or {}).get("trainer") is False:
                return peer, "left on a notice before its trainer started"
        return None

    def group_members(self) -> Set[str]:
        """The instances in this node's group, in any lifecycle state."""
        return group_instances(self.node.asg, self.node.group)

    def peers_training(self, job: Job, group: str) -> List[str]:
        """The other InService instances of the group whose trainer runs now: each one's ``training`` marker is
        newer than its last ``synced``, ``leaving`` and ``done`` (stamps of one writer: one clock)."""
        present = group_instances(self.node.asg, group, "InService")
        training = []
        for instance_id, names in sorted(self.markers.node_markers(job).items()):
            if instance_id == self.node.instance_id or instance_id not in present or TRAINING_MARKER not in names:
                continue
            started = stamp(self.markers.marker(job, node_marker(instance_id, TRAINING_MARKER)) or {})
            ended = [
                stamp(self.markers.marker(job, node_marker(instance_id, n)) or {})
                for n in END_OF_TRAINING
                if n in names
            ]
            if started > max(ended, default=0.0):
                training.append(instance_id)
        return training

    def report_training(self, job: Job, attempt: int, address: str, peers: Peers) -> None:
        """``nodes/<id>/training``, for the peers already training: this node joins them (see
        :meth:`add_joined_peers`). The last attempt's rounds leave the world file."""
        if os.path.exists(self.world_file):
            os.remove(self.world_file)
        body = {"attempt": attempt, "address": address, "private_ip": dict(peers)[self.node.instance_id]}
        try:
            self.markers.put_own(job, TRAINING_MARKER, body)
        except AWS_ERRORS as exc:
            self.node.log(
                f"could not report that this node starts training ({exc}); peers that started before may miss it"
            )
