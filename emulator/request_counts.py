"""How many AWS requests the emulated cloud answered, by service, action and caller: ``requests.json``.

The control-plane load of a cluster (issue 42: Describe calls that must not grow with the node count) is measured
here, where every AWS call of every node, of ``trainctl`` and of the deploys arrives. A request is classified the
way AWS bills and throttles it:

- the service from the SigV4 credential scope (``Authorization`` header, or ``X-Amz-Credential`` of a presigned URL);
- the action from the ``Action`` parameter (query protocols: EC2, Auto Scaling, IAM, STS, CloudFormation), the
  ``X-Amz-Target`` header (JSON protocols: SSM, CloudWatch Logs, FIS), or, for S3's REST API, the method, the path
  and the sub-resource (``GetObject``, ``PutObject``, ``ListObjectsV2``, ...);
- the caller from the ``spot-training-node/<instance-id>`` token the node agent adds to its User-Agent
  (``agent/aws_config.py``); any other client counts as ``other``.

The file is rewritten at most every ``flush_every_s`` seconds while requests arrive, and once when the server stops.
"""

from __future__ import annotations

import io
import json
import os
import re
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

WsgiApp = Callable[[dict[str, Any], Any], Iterable[bytes]]

NODE_AGENT_TOKEN = re.compile(r"spot-training-node/(\S+)")
_CREDENTIAL_SCOPE = re.compile(r"Credential=[^/]+/\d{8}/[^/]+/([^/]+)/aws4_request")
OTHER_CALLER = "other"

# S3 sub-resources (query parameters) that name the operation on a bucket or an object, by HTTP method
_S3_SUBRESOURCES = {
    "POST": (
        ("delete", "DeleteObjects"),
        ("uploads", "CreateMultipartUpload"),
        ("uploadId", "CompleteMultipartUpload"),
    ),
    "PUT": (("uploadId", "UploadPart"), ("tagging", "PutObjectTagging"), ("versioning", "PutBucketVersioning")),
    "GET": (("uploadId", "ListParts"), ("versions", "ListObjectVersions"), ("list-type", "ListObjectsV2")),
    "DELETE": (("uploadId", "AbortMultipartUpload"),),
}
_S3_OBJECT_ACTIONS = {"GET": "GetObject", "PUT": "PutObject", "HEAD": "HeadObject", "DELETE": "DeleteObject"}
_S3_BUCKET_ACTIONS = {"GET": "ListObjects", "PUT": "CreateBucket", "HEAD": "HeadBucket", "DELETE": "DeleteBucket"}


def service_of(environ: dict[str, Any]) -> str:
    """The signing name of the service a request is for (``autoscaling``, ``s3``, ``ec2``...), or ``unsigned``."""
    authorization = environ.get("HTTP_AUTHORIZATION", "")
    found = _CREDENTIAL_SCOPE.search(authorization)
    if found is None:
        credential = parse_qs(environ.get("QUERY_STRING", "")).get("X-Amz-Credential", [""])[0]
        found = _CREDENTIAL_SCOPE.search(f"Credential={credential}")
    return found.group(1) if found else "unsigned"


def s3_action(method: str, path: str, query: dict[str, list[str]]) -> str:
    """S3's operation name for a path-style REST request (``/bucket`` or ``/bucket/key``)."""
    for parameter, action in _S3_SUBRESOURCES.get(method, ()):
        if parameter in query:
            return action
    is_object = len(path.lstrip("/").split("/", 1)) == 2
    if method == "PUT" and is_object:
        return "PutObject"
    return (_S3_OBJECT_ACTIONS if is_object else _S3_BUCKET_ACTIONS).get(method, method)


def action_of(environ: dict[str, Any], service: str, body: bytes) -> str:
    """The API action of a request (see the module's docstring for the protocols)."""
    target = environ.get("HTTP_X_AMZ_TARGET", "")
    if target:
        return target.rsplit(".", 1)[-1]
    query = parse_qs(environ.get("QUERY_STRING", ""), keep_blank_values=True)
    if "Action" in query:
        return query["Action"][0]
    if environ.get("CONTENT_TYPE", "").startswith("application/x-www-form-urlencoded"):
        form = parse_qs(body.decode("utf-8", "replace"))
        if "Action" in form:
            return form["Action"][0]
    method = environ.get("REQUEST_METHOD", "GET")
    if service == "s3":
        return s3_action(method, environ.get("PATH_INFO", "/"), query)
    return f"{method} {environ.get('PATH_INFO', '/')}"


def caller_of(environ: dict[str, Any]) -> str:
    """The instance id a node agent names in its User-Agent, or ``other``."""
    found = NODE_AGENT_TOKEN.search(environ.get("HTTP_USER_AGENT", ""))
    return found.group(1) if found else OTHER_CALLER


class RequestCounts:
    """Thread-safe counts of (caller, service, action), written to ``path`` as JSON."""

    def __init__(self, path: Path, *, flush_every_s: float = 2.0) -> None:
        self.path = path
        self.flush_every_s = flush_every_s
        self.started = time.time()
        self._counts: Counter[tuple[str, str, str]] = Counter()
        self._lock = threading.Lock()
        self._changed = threading.Event()
        self._stopping = threading.Event()
        self._flusher: threading.Thread | None = None

    def count(self, caller: str, service: str, action: str) -> None:
        with self._lock:
            self._counts[(caller, service, action)] += 1
        self._changed.set()

    def snapshot(self) -> dict[str, Any]:
        """The counts as ``requests.json`` holds them: totals by ``service:action`` and the same per caller."""
        with self._lock:
            counts = dict(self._counts)
        by_action: Counter[str] = Counter()
        by_caller: dict[str, Counter[str]] = {}
        for (caller, service, action), n in counts.items():
            by_action[f"{service}:{action}"] += n
            by_caller.setdefault(caller, Counter())[f"{service}:{action}"] += n
        return {
            "started": self.started,
            "written": time.time(),
            "total": sum(by_action.values()),
            "by_action": dict(sorted(by_action.items())),
            "by_caller": {caller: dict(sorted(c.items())) for caller, c in sorted(by_caller.items())},
        }

    def write(self) -> None:
        """Replace the file atomically (a reader never sees half of it)."""
        partial = self.path.with_name(f".{self.path.name}.{os.getpid()}")
        partial.write_text(json.dumps(self.snapshot(), indent=1) + "\n")
        os.replace(partial, self.path)

    def start(self) -> None:
        """Write the (empty) file now, then every ``flush_every_s`` seconds while requests arrive."""
        self.write()
        self._flusher = threading.Thread(target=self._flush_while_running, daemon=True, name="request-counts")
        self._flusher.start()

    def stop(self) -> None:
        self._stopping.set()
        if self._flusher is not None:
            self._flusher.join(timeout=10)
        self.write()

    def _flush_while_running(self) -> None:
        while not self._stopping.wait(self.flush_every_s):
            if self._changed.is_set():
                self._changed.clear()
                self.write()


def counting(app: WsgiApp, counts: RequestCounts) -> WsgiApp:
    """WSGI wrapper: count each request in ``counts``. Runs inside ``http_serving.read_bodies_whole``, so the body is
    a BytesIO that is read here and rewound for ``app``."""

    def wrapped(environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        stream = environ["wsgi.input"]
        body = b""
        if isinstance(stream, io.BytesIO):
            body = stream.read()
            stream.seek(0)
        service = service_of(environ)
        counts.count(caller_of(environ), service, action_of(environ, service, body))
        return app(environ, start_response)

    return wrapped
