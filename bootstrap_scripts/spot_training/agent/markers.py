"""The job's S3 markers: ``DONE``, ``FAILED``, ``STOPPED``, ``STOP`` and each node's ``nodes/<instance-id>/<name>``
(JSON with the writer's ``time``), written and read for one node (``Markers``)."""

from __future__ import annotations

import json
import time
from typing import Any, Dict, Optional, Set

from botocore.exceptions import ClientError

from spot_training.agent.errors import AWS_ERRORS, IMDS_ERRORS
from spot_training.agent.job import Job
from spot_training.agent.node import Node
from spot_training.agent.s3_objects import answered_at, key_listed

# a node's markers written when its trainer stopped, or it leaves: after them, its ``training`` marker is stale
END_OF_TRAINING = ("synced", "leaving", "done")
PROGRESS_MARKER = "progress"  # nodes/<id>/progress: the stall watchdog's job-wide progress
READY_MARKER = "ready"  # nodes/<id>/ready: at an elastic job's first attempt, restored and about to start torchrun
MEMBERSHIP_MARKER = "membership"  # nodes/<host>/membership: the group's instances, published by the rendezvous host


def stamp(marker: Dict[str, Any]) -> float:
    """When a marker was written (``put_marker``'s ``time``, the writer's clock); 0 if it says not."""
    return float(marker.get("time", 0))


class Markers:
    """This node's reads and writes of the job's markers."""

    def __init__(self, node: Node) -> None:
        self.node = node

    def put_marker(self, job: Job, name: str, body: Dict[str, Any]) -> None:
        body = dict(body, job_id=job.job_id, instance_id=self.node.instance_id, time=time.time())
        self.node.s3.put_object(Bucket=job.bucket, Key=job.job_prefix + name, Body=json.dumps(body).encode())

    def put_own(self, job: Job, name: str, body: Dict[str, Any]) -> None:
        """This node's marker ``nodes/<instance-id>/<name>``."""
        self.put_marker(job, f"nodes/{self.node.instance_id}/{name}", body)

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
                facts[key] = self.node.imds.get(path)
            except IMDS_ERRORS as exc:
                self.node.log(f"IMDS {path} unreadable ({exc}); the boot marker goes without it")
        self.put_own(job, "boot", facts)

    def marker(self, job: Job, name: str) -> Optional[Dict[str, Any]]:
        """The job's marker ``name`` (JSON; ``{}`` if it is not a JSON object), or None. Listed before it is read
        (``key_listed``)."""
        key = job.job_prefix + name
        s3 = self.node.s3
        if not key_listed(s3, job.bucket, key):
            return None
        try:
            body = s3.get_object(Bucket=job.bucket, Key=key)["Body"].read()
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
            self.node.log(f"could not read the {name} marker ({exc})")
            return False

    def node_markers(
        self,
        job: Job,
        progress: Optional[Dict[str, float]] = None,
        published: Optional[Dict[str, float]] = None,
    ) -> Dict[str, Dict[str, str]]:
        """The job's per-node markers: {instance id: {marker name: ETag}} (``nodes/<id>/<name>``), one listing.
        ``progress`` and ``published``, if given, get {instance id: seconds since its progress (membership) marker
        was written}, by S3's clock (its LastModified against the answer's Date: the nodes' clocks do not come
        into it)."""
        prefix = job.job_prefix + "nodes/"
        found: Dict[str, Dict[str, str]] = {}
        ages = {PROGRESS_MARKER: progress, MEMBERSHIP_MARKER: published}
        for page in self.node.s3.get_paginator("list_objects_v2").paginate(Bucket=job.bucket, Prefix=prefix):
            now = answered_at(page)
            for obj in page.get("Contents", []):
                instance_id, _, name = obj["Key"][len(prefix) :].partition("/")
                found.setdefault(instance_id, {})[name] = obj["ETag"]
                age_of = ages.get(name)
                if age_of is not None:
                    age_of[instance_id] = max(0.0, (now - obj["LastModified"]).total_seconds())
        return found

    def leaving_nodes(self, job: Job) -> Set[str]:
        """Instances of this job that announced they are going (``nodes/<id>/leaving``)."""
        return {i for i, names in self.node_markers(job).items() if "leaving" in names}
