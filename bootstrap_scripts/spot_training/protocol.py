"""The S3 objects a job leaves for its readers (``trainctl``, the budget guard), and how they are read.

Under ``<cluster prefix><job>/``: the markers (``STOP``: a stop was asked; ``DONE``, ``FAILED``, ``STOPPED``: the job
ended), ``nodes/<instance>/<name>`` (a node agent's markers) and ``ckpt/<step>/`` (a checkpoint; its
:data:`MANIFEST`, written last, lists every object of it). Markers are found by listing, not by a read: S3 answers a
GetObject of a missing key with 403, not 404, to a caller whose ListBucket is limited to a prefix (the budget guard's,
an operator's). Standard library only (the node's Python 3.8 reads it too).
"""

from __future__ import annotations

import json
from typing import Any, Dict, Optional

MANIFEST = "spot-training-manifest.json"  # ckpt/<step>/<MANIFEST>: the checkpoint's objects; written last
STOP = "STOP"  # <job>/STOP: a stop was asked (trainctl stop, the budget guard); S3's LastModified times it
NODES_FOLDER = "nodes"  # <job>/nodes/<instance>/<name>: a node agent's markers
# Node markers written when a training attempt starts or ends (a boot, each torchrun attempt, a notice): a
# checkpoint before one of them and one after are of different runs.
RUN_MARKERS = ("boot", "training", "leaving")
LEAVING = "leaving"  # nodes/<instance>/leaving: the node leaves the job (its body names a spot notice, if one)
# nodes/<instance>/state: the node agent's lifecycle state (JSON: state, previous, since, reason; see
# spot_training/agent/lifecycle.py), rewritten at each transition
NODE_STATE = "state"


def listed(s3: Any, bucket: str, key: str) -> Optional[Dict[str, Any]]:
    """The listing entry of the object at ``key`` (``Key``, ``LastModified``, ...), or None if it is not there."""
    found = s3.list_objects_v2(Bucket=bucket, Prefix=key, MaxKeys=1).get("Contents", [])
    return dict(found[0]) if found and found[0]["Key"] == key else None  # a key sorts before every key it prefixes


def read_marker(s3: Any, bucket: str, key: str) -> Optional[Dict[str, Any]]:
    """The marker at ``key`` (JSON), or None. Listed before it is read (see the module's docstring); one deleted
    between the listing and the read is None as well."""
    if listed(s3, bucket, key) is None:
        return None
    try:
        return dict(json.loads(s3.get_object(Bucket=bucket, Key=key)["Body"].read()))
    except s3.exceptions.ClientError as exc:
        if exc.response.get("Error", {}).get("Code") in ("NoSuchKey", "404"):
            return None
        raise


def written_at(s3: Any, bucket: str, key: str) -> Optional[float]:
    """When the object at ``key`` was last written, by S3's clock, or None if it is not there. A stop is timed by
    this, not by the request's own ``requested_at``: that was written by whoever asked, with their clock (or a value
    that never comes due)."""
    found = listed(s3, bucket, key)
    return None if found is None else float(found["LastModified"].timestamp())
