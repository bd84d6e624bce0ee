"""A small EC2 instance-metadata (IMDSv2) mock for one instance, on a loopback address.

Reusable by the emulator: ``ImdsMock(host="127.0.0.5", instance_id=..., tags={...}).start()``, then point the
instance's processes at it with ``AWS_EC2_METADATA_SERVICE_ENDPOINT=mock.url``. Interruptions are injected
the way AWS delivers them: ``mock.interrupt()`` makes ``spot/instance-action`` answer (404 before), and
``mock.recommend_rebalance()`` does the same for ``events/recommendations/rebalance``, and ``mock.terminating()``
turns ``autoscaling/target-lifecycle-state`` from ``InService`` to ``Terminated`` (its Auto Scaling group is ending it).

Served: PUT /latest/api/token (needs X-aws-ec2-metadata-token-ttl-seconds), and with a valid
X-aws-ec2-metadata-token header (else 401): /latest/meta-data/ instance-id, placement/availability-zone,
placement/region, ami-launch-index, local-ipv4, instance-type, tags/instance (key list),
tags/instance/<key>, spot/instance-action, events/recommendations/rebalance, autoscaling/target-lifecycle-state;
and, once
:meth:`ImdsMock.set_role_credentials` gave it an instance profile's role and credentials, iam/info and
iam/security-credentials/ (the role's name) and iam/security-credentials/<role> (the credentials, as the JSON
document EC2 serves): botocore and the AWS CLI then take their credentials from here, as on an instance.
"""

from __future__ import annotations

import ipaddress
import json
import secrets
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Optional, Union
from urllib.parse import unquote


class ImdsMock:
    def __init__(
        self,
        *,
        instance_id: str,
        host: str = "127.0.0.1",
        region: str = "us-east-1",
        availability_zone: str = "us-east-1a",
        launch_index: int = 0,
        local_ipv4: str = "10.0.0.10",
        instance_type: str = "g5.xlarge",
        lifecycle: str = "spot",
        tags: Optional[dict[str, str]] = None,
        port: int = 0,
    ) -> None:
        if not ipaddress.ip_address(host).is_loopback:
            raise ValueError(f"ImdsMock listens on loopback addresses only, not {host}")
        self.host = host
        self.port = port  # 0: any free one
        self.instance_id = instance_id
        self.tags = dict(tags or {})
        self.tokens: set[str] = set()
        self.requests: list[str] = []
        self.instance_action: Optional[dict[str, str]] = None
        self.rebalance: Optional[dict[str, str]] = None
        self.role_name: Optional[str] = None
        self.role_credentials: Optional[dict[str, str]] = None
        self.instance_profile: Optional[dict[str, str]] = None
        # path -> answer; bytes are served as they are (a test's answer that is not UTF-8)
        self.values: dict[str, Union[str, bytes]] = {
            "instance-id": instance_id,
            "placement/availability-zone": availability_zone,
            "placement/region": region,
            "ami-launch-index": str(launch_index),
            "local-ipv4": local_ipv4,
            "instance-type": instance_type,
            "instance-life-cycle": lifecycle,
            "autoscaling/target-lifecycle-state": "InService",
        }
        self._server: Optional[ThreadingHTTPServer] = None
        self._thread: Optional[threading.Thread] = None

    @property
    def url(self) -> str:
        assert self._server is not None, "start() the mock first"
        return f"http://{self.host}:{self._server.server_address[1]}"

    def interrupt(self, action: str = "terminate", in_s: int = 120) -> None:
        """Deliver a spot interruption notice (as ``spot/instance-action``)."""
        when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + in_s))
        self.instance_action = {"action": action, "time": when}

    def recommend_rebalance(self) -> None:
        self.rebalance = {"noticeTime": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}

    def terminating(self) -> None:
        """Its Auto Scaling group is ending the instance (``autoscaling/target-lifecycle-state`` ``Terminated``)."""
        self.values["autoscaling/target-lifecycle-state"] = "Terminated"

    def set_role_credentials(
        self, role_name: str, credentials: dict[str, Any], instance_profile_arn: str, instance_profile_id: str
    ) -> None:
        """Serve ``credentials`` (an ``sts:AssumeRole`` answer's ``Credentials``, ``Expiration`` a datetime) as the
        instance profile role ``role_name``'s, the way EC2 does under ``iam/security-credentials/``."""
        updated = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        self.role_name = role_name
        self.role_credentials = {
            "Code": "Success",
            "LastUpdated": updated,
            "Type": "AWS-HMAC",
            "AccessKeyId": str(credentials["AccessKeyId"]),
            "SecretAccessKey": str(credentials["SecretAccessKey"]),
            "Token": str(credentials["SessionToken"]),
            "Expiration": credentials["Expiration"].strftime("%Y-%m-%dT%H:%M:%SZ"),
        }
        self.instance_profile = {
            "Code": "Success",
            "LastUpdated": updated,
            "InstanceProfileArn": instance_profile_arn,
            "InstanceProfileId": instance_profile_id,
        }

    def _answer(self, path: str) -> Optional[Union[str, bytes]]:
        if path in self.values:
            return self.values[path]
        if path == "tags/instance":
            return "\n".join(sorted(self.tags)) if self.tags else None
        if path.startswith("tags/instance/"):
            return self.tags.get(unquote(path[len("tags/instance/") :]))
        if path == "spot/instance-action" and self.instance_action:
            return json.dumps(self.instance_action)
        if path == "events/recommendations/rebalance" and self.rebalance:
            return json.dumps(self.rebalance)
        if path == "iam/info" and self.instance_profile:
            return json.dumps(self.instance_profile)
        if path == "iam/security-credentials" and self.role_name:
            return self.role_name
        if path == f"iam/security-credentials/{self.role_name}" and self.role_credentials:
            return json.dumps(self.role_credentials)
        return None

    def start(self) -> ImdsMock:
        mock = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: object) -> None:
                pass

            def _send(self, code: int, body: Union[str, bytes] = "") -> None:
                data = body if isinstance(body, bytes) else body.encode()
                self.send_response(code)
                self.send_header("Content-Type", "text/plain")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_PUT(self) -> None:
                mock.requests.append(f"PUT {self.path}")
                if self.path != "/latest/api/token":
                    return self._send(404)
                if not self.headers.get("X-aws-ec2-metadata-token-ttl-seconds"):
                    return self._send(400, "missing X-aws-ec2-metadata-token-ttl-seconds")
                token = secrets.token_hex(16)
                mock.tokens.add(token)
                self._send(200, token)

            def do_GET(self) -> None:
                mock.requests.append(f"GET {self.path}")
                if self.headers.get("X-aws-ec2-metadata-token") not in mock.tokens:
                    return self._send(401)
                prefix = "/latest/meta-data/"
                answer = mock._answer(self.path[len(prefix) :].rstrip("/")) if self.path.startswith(prefix) else None
                if answer is None:
                    return self._send(404)
                self._send(200, answer)

        self._server = ThreadingHTTPServer((self.host, self.port), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name=f"imds-{self.host}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> ImdsMock:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
