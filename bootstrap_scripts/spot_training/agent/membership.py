"""Which instances the group holds while the trainers run, asked of Auto Scaling by one node per cluster.

Each poll of a running trainer, every node checks whether a peer of its rendezvous left the group
(``Rendezvous.lost_peer``). Asked by every node, that is one DescribeAutoScalingGroups per node per poll: 12 a minute
a node at the 5 s poll, 200 a second for a cluster of 1,000 nodes, against an account-wide API rate. Instead the
rendezvous host (element 0 of the peers) asks Auto Scaling and writes what it saw to ``nodes/<host>/membership``
each poll: the same bytes (so the same ETag) while the group does not change, and a new ``LastModified`` each time.
The other nodes read it from the listing of ``nodes/`` they make each poll anyway: a new ETag is a new membership to
GET; a ``LastModified`` older than ``STALE_POLLS`` polls by S3's clock (the host is gone, or cannot write) makes a
node ask Auto Scaling itself, until the host publishes again or the trainers restart with new peers.
"""

from __future__ import annotations

import json
from typing import Dict, Optional, Set, Tuple

from spot_training.agent.errors import AWS_ERRORS, one_line
from spot_training.agent.job import Job
from spot_training.agent.markers import Markers
from spot_training.agent.node import Node
from spot_training.agent.peers import group_states
from spot_training.protocol import MEMBERSHIP_MARKER, node_marker

STALE_POLLS = 3  # a membership older than this many polls (plus LAST_MODIFIED_SLACK_S) is not used
LAST_MODIFIED_SLACK_S = 2.0  # S3's LastModified counts whole seconds


class Membership:
    """The lifecycle states of the group's instances ({instance id: state}), for one node."""

    def __init__(self, node: Node, markers: Markers) -> None:
        self.node, self.markers = node, markers
        self.read: Dict[str, Tuple[str, Dict[str, str]]] = {}  # publisher -> (ETag, states) last read
        self.stale_said: Optional[str] = None  # the publisher whose stale membership was logged

    def states(
        self,
        job: Job,
        publisher: str,
        markers: Optional[Dict[str, Dict[str, str]]] = None,
        ages: Optional[Dict[str, float]] = None,
    ) -> Dict[str, str]:
        """The group's instances and their lifecycle states: asked of Auto Scaling and published when this node is
        ``publisher``, else read from ``publisher``'s membership marker (``markers`` and ``ages``: this poll's
        listing of ``nodes/``, from ``Markers.node_markers``), or asked of Auto Scaling when that is missing or
        stale."""
        if publisher == self.node.instance_id:
            return self.publish(job)
        etag = (markers or {}).get(publisher, {}).get(MEMBERSHIP_MARKER)
        age = (ages or {}).get(publisher)
        if etag is None or age is None or age > STALE_POLLS * self.node.poll_s + LAST_MODIFIED_SLACK_S:
            if etag is not None and age is not None and self.stale_said != publisher:
                self.stale_said = publisher
                self.node.log(f"membership from {publisher} is {age:.0f} s old: asking Auto Scaling")
            return group_states(self.node.asg, self.node.group)
        if self.read.get(publisher, ("", {}))[0] != etag:
            body = self.markers.marker(job, node_marker(publisher, MEMBERSHIP_MARKER)) or {}
            self.read[publisher] = (etag, {str(k): str(v) for k, v in dict(body.get("instances", {})).items()})
        return self.read[publisher][1]

    def present(
        self,
        job: Job,
        publisher: str,
        markers: Optional[Dict[str, Dict[str, str]]],
        ages: Optional[Dict[str, float]],
        states: Tuple[str, ...],
    ) -> Set[str]:
        """The instances in one of the lifecycle ``states`` (see :meth:`states` for the other arguments)."""
        return {i for i, state in self.states(job, publisher, markers, ages).items() if state in states}

    def publish(self, job: Job) -> Dict[str, str]:
        """Ask Auto Scaling and write what it says to this node's membership marker (a failed write is logged: the
        other nodes then ask Auto Scaling themselves once it is stale)."""
        states = group_states(self.node.asg, self.node.group)
        body = json.dumps({"instances": states}, sort_keys=True).encode()  # no time: an unchanged group keeps its ETag
        key = job.job_prefix + node_marker(self.node.instance_id, MEMBERSHIP_MARKER)
        try:
            self.node.s3.put_object(Bucket=job.bucket, Key=key, Body=body)
        except AWS_ERRORS as exc:
            self.node.log(f"could not publish the group's membership ({one_line(exc)}); peers ask Auto Scaling")
        return states
