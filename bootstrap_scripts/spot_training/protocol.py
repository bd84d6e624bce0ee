"""The S3 contract of a cluster's jobs: where every object is (the key builders), the markers' names and how they are
read, the checkpoint manifest and when a checkpoint is intact. The node agent writes what is here; ``trainctl``, the
budget guard and the stack (the node role's write patterns) read and grant it by the same names.

Under ``<cluster prefix>``: ``code/<job>.tar.gz`` (a job's code archive), ``queue/<job>.json`` (a queued job) and,
under ``<job>/``, the job's markers (``STOP``: a stop was asked; ``DONE``, ``FAILED``, ``STOPPED``: the job ended;
``NEXT``: the queued job that follows it), ``nodes/<instance>/<name>`` (a node
agent's markers, JSON with the writer's ``time``) and ``ckpt/<step>/`` (a checkpoint; its :data:`MANIFEST`, written
last, lists every object of it). Markers are found by listing, not by a read: S3 answers a GetObject of a missing key
with 403, not 404, to a caller whose ListBucket is limited to a prefix (the node role's, the budget guard's, an
operator's). Standard library only: the node's Python 3.8 reads it, and the budget guard's Lambda package holds it.
"""

from __future__ import annotations

import json
from typing import Any, Dict, Optional, Tuple

CODE_FOLDER = "code"  # <cluster>/code/<job>.tar.gz: not a job id (a job's objects are under <cluster>/<job>/)
CODE_SUFFIX = ".tar.gz"
QUEUE_FOLDER = "queue"  # <cluster>/queue/<job>.json: a queued job (not a job id either)
QUEUE_SUFFIX = ".json"
CHECKPOINT_FOLDER = "ckpt"  # <cluster>/<job>/ckpt/<step>/<files>: the job's checkpoints, the manifest last
NODES_FOLDER = "nodes"  # <job>/nodes/<instance>/<name>: a node agent's markers
MANIFEST = "spot-training-manifest.json"  # ckpt/<step>/<MANIFEST>: the checkpoint's objects; written last

# The job's markers, <cluster>/<job>/<name>
STOP = "STOP"  # a stop was asked (trainctl stop, the budget guard); S3's LastModified times it
DONE, FAILED, STOPPED = "DONE", "FAILED", "STOPPED"
END_MARKERS = (DONE, FAILED, STOPPED)  # the job has ended
# The job that follows this one on the cluster, taken from the queue (JSON, the queued job); created only if absent
# (S3's conditional write, ``IfNoneMatch="*"``): whoever creates it decides, exactly once (spot_training/job_queue.py)
NEXT = "NEXT"

# A node agent's markers, <cluster>/<job>/nodes/<instance>/<name>
BOOT_MARKER = "boot"  # what the node is (type, spot or on-demand, AZ), for trainctl cost and status
TRAINING_MARKER = "training"  # written just before each torchrun attempt (its rendezvous round)
READY_MARKER = "ready"  # at an elastic job's first attempt, restored and about to start torchrun
PROGRESS_MARKER = "progress"  # the stall watchdog's job-wide progress
MEMBERSHIP_MARKER = "membership"  # the group's instances, published by the rendezvous host
SAVE_REQUEST_MARKER = "save-request"  # a rebalance recommendation: every trainer saves
SYNCED_MARKER = "synced"  # the node's final checkpoint sync of an attempt is over
LEAVING_MARKER = "leaving"  # the node leaves the job (its body names a spot notice, if one)
NODE_DONE_MARKER = "done"  # the node finished (the barrier before the job's DONE)
# the node agent's lifecycle state (JSON: state, previous, since, reason; see spot_training/agent/lifecycle.py),
# rewritten at each transition
NODE_STATE = "state"
NODE_MARKERS = (
    BOOT_MARKER,
    TRAINING_MARKER,
    READY_MARKER,
    PROGRESS_MARKER,
    MEMBERSHIP_MARKER,
    SAVE_REQUEST_MARKER,
    SYNCED_MARKER,
    LEAVING_MARKER,
    NODE_DONE_MARKER,
    NODE_STATE,
)
# How a node's ``leaving`` marker (its ``notice``) names a spot interruption notice (its other reasons: the group ends
# the instance, a SIGTERM); trainctl counts interruptions by it.
SPOT_NOTICE = "spot interruption notice"
# Written when a node's trainer stopped, or it leaves: after them, its ``training`` marker is stale.
END_OF_TRAINING = (SYNCED_MARKER, LEAVING_MARKER, NODE_DONE_MARKER)
# Written when a training attempt starts or ends (a boot, each torchrun attempt, a notice): a checkpoint before one of
# them and one after are of different runs.
RUN_MARKERS = (BOOT_MARKER, TRAINING_MARKER, LEAVING_MARKER)

MANIFEST_VERSION = 1
# <cluster>/capacity.json: the capacity watcher's record (the group's market, spot or on-demand, since when and why);
# no job id ends in .json, and the nodes may read it but not write it
CAPACITY_RECORD = "capacity.json"


def cluster_prefix(cluster: str) -> str:
    """``<cluster>/``: everything of one cluster (no leading slash, a trailing one)."""
    return f"{cluster}/"


def job_prefix(cluster_prefix: str, job_id: str) -> str:
    """``<cluster>/<job>/``: everything of one job but its code archive."""
    return f"{cluster_prefix}{job_id}/"


def code_prefix(cluster_prefix: str) -> str:
    """``<cluster>/code/``: the code archives of the cluster's jobs."""
    return f"{cluster_prefix}{CODE_FOLDER}/"


def code_key(cluster_prefix: str, job_id: str) -> str:
    """``<cluster>/code/<job>.tar.gz``: the job's code archive."""
    return f"{code_prefix(cluster_prefix)}{job_id}{CODE_SUFFIX}"


def queue_prefix(cluster_prefix: str) -> str:
    """``<cluster>/queue/``: the cluster's queued jobs."""
    return f"{cluster_prefix}{QUEUE_FOLDER}/"


def queue_key(cluster_prefix: str, job_id: str) -> str:
    """``<cluster>/queue/<job>.json``: a queued job (the job as the current-job parameter will hold it)."""
    return f"{queue_prefix(cluster_prefix)}{job_id}{QUEUE_SUFFIX}"


def capacity_key(cluster_prefix: str) -> str:
    """``<cluster>/capacity.json``: the capacity watcher's record of the cluster's group (market, since when, why)."""
    return f"{cluster_prefix}{CAPACITY_RECORD}"


def checkpoints_prefix(job: str) -> str:
    """``<job>/ckpt/``: the checkpoints of the job at ``job`` (its :func:`job_prefix`)."""
    return f"{job}{CHECKPOINT_FOLDER}/"


def checkpoint_prefix(checkpoints: str, step: int) -> str:
    """``ckpt/<step>/``: the objects of checkpoint ``step`` under ``checkpoints`` (a :func:`checkpoints_prefix`)."""
    return f"{checkpoints}{step}/"


def manifest_key(checkpoints: str, step: int) -> str:
    """``ckpt/<step>/<MANIFEST>``: checkpoint ``step``'s manifest."""
    return checkpoint_prefix(checkpoints, step) + MANIFEST


def checkpoint_object(checkpoints: str, key: str) -> Tuple[str, str]:
    """(the step folder's name, the object's name in it) of ``key`` under ``checkpoints``; the name is empty for a
    key directly under ``checkpoints``."""
    folder, _, rel = key[len(checkpoints) :].partition("/")
    return folder, rel


def nodes_prefix(job: str) -> str:
    """``<job>/nodes/``: the node agents' markers."""
    return f"{job}{NODES_FOLDER}/"


def node_marker(instance_id: str, name: str) -> str:
    """``nodes/<instance>/<name>``: a node's marker, relative to its job's prefix (as :data:`STOP` and the end
    markers are)."""
    return f"{NODES_FOLDER}/{instance_id}/{name}"


def node_object(nodes: str, key: str) -> Tuple[str, str]:
    """(instance, marker name) of ``key`` under ``nodes`` (a :func:`nodes_prefix`)."""
    instance_id, _, name = key[len(nodes) :].partition("/")
    return instance_id, name


def new_manifest(job_id: str, step: int, layout: str, created_at: float, files: Dict[str, Any]) -> Dict[str, Any]:
    """A checkpoint's manifest: the job it belongs to (a restore takes only its own job's), its step, its layout
    (``step``: a step folder; ``flat``: a script's own files), when it was made, and ``files``: {name in the step
    folder: {``size``, ``sha256``, ``part_size``, ``part_sha256``: the sha256 of each ``part_size`` bytes}}.
    ``trainctl submit --resume-from`` adds ``resumed_from`` ({``job_id``, ``step``}) to the copies it makes."""
    return {
        "version": MANIFEST_VERSION,
        "job_id": job_id,
        "step": step,
        "layout": layout,
        "created_at": created_at,
        "files": files,
    }


def manifest_fault(files: Dict[str, Any], sizes: Dict[str, int]) -> Optional[str]:
    """Why the checkpoint whose manifest lists ``files`` is not intact, or None: every object it lists is there
    (``sizes``: {name: size}, the step folder's listing) with the listed size, under a name that stays in the step
    folder. The sha256 of the objects is checked as they are downloaded."""
    for rel, meta in files.items():
        if ".." in rel.split("/") or rel.startswith("/") or rel == MANIFEST:
            return f"manifest lists an unsafe name {rel!r}"
        size = meta.get("size") if isinstance(meta, dict) else None
        if not isinstance(size, int) or sizes.get(rel) != size:
            return f"object {rel} is missing or has the wrong size"
    return None


def listed(s3: Any, bucket: str, key: str) -> Optional[Dict[str, Any]]:
    """The listing entry of the object at ``key`` (``Key``, ``LastModified``, ...), or None if it is not there."""
    found = s3.list_objects_v2(Bucket=bucket, Prefix=key, MaxKeys=1).get("Contents", [])
    return dict(found[0]) if found and found[0]["Key"] == key else None  # a key sorts before every key it prefixes


def read_marker(s3: Any, bucket: str, key: str) -> Optional[Dict[str, Any]]:
    """The marker at ``key`` (JSON; ``{}`` if it is not a JSON object), or None. Listed before it is read (see the
    module's docstring); one deleted between the listing and the read is None as well."""
    if listed(s3, bucket, key) is None:
        return None
    try:
        body = s3.get_object(Bucket=bucket, Key=key)["Body"].read()
    except s3.exceptions.ClientError as exc:
        if exc.response.get("Error", {}).get("Code") in ("NoSuchKey", "404"):  # deleted since the listing
            return None
        raise
    try:  # one not a JSON object (a STOP written by hand: `aws s3 cp /dev/null .../STOP`) is there all the same
        value = json.loads(body)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def written_at(s3: Any, bucket: str, key: str) -> Optional[float]:
    """When the object at ``key`` was last written, by S3's clock, or None if it is not there. A stop is timed by
    this, not by the request's own ``requested_at``: that was written by whoever asked, with their clock (or a value
    that never comes due)."""
    found = listed(s3, bucket, key)
    return None if found is None else float(found["LastModified"].timestamp())
