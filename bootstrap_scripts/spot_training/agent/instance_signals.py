"""Instance signals: the instance metadata service (IMDSv2: spot notice, rebalance recommendation, target lifecycle
state) and the instance's lifecycle state in its Auto Scaling group."""

from __future__ import annotations

import os
import urllib.error
import urllib.request
from typing import Any, Optional, Tuple

from spot_training.agent.errors import AgentError


class Imds:
    """IMDSv2 client; the endpoint comes from AWS_EC2_METADATA_SERVICE_ENDPOINT like botocore's."""

    def __init__(self, endpoint: Optional[str] = None, timeout_s: float = 2.0) -> None:
        default = os.environ.get("AWS_EC2_METADATA_SERVICE_ENDPOINT") or "http://169.254.169.254"
        self.endpoint = (endpoint or default).rstrip("/")
        if not self.endpoint.startswith(("http://", "https://")):
            raise AgentError(f"IMDS endpoint must be http(s)://, got {self.endpoint!r}")
        self.timeout_s = timeout_s
        self.token: Optional[str] = None

    def _token(self) -> str:
        request = urllib.request.Request(  # noqa: S310 - scheme checked in __init__
            f"{self.endpoint}/latest/api/token", method="PUT", headers={"X-aws-ec2-metadata-token-ttl-seconds": "21600"}
        )
        with urllib.request.urlopen(request, timeout=self.timeout_s) as resp:  # noqa: S310 - fixed http(s) URL
            return resp.read().decode()

    def get(self, path: str) -> Optional[str]:
        """``latest/meta-data/<path>``; None when IMDS answers 404 (e.g. no interruption notice)."""
        token = self.token  # one read: another thread may drop the shared one meanwhile
        for attempt in range(2):
            if token is None:
                token = self.token = self._token()
            request = urllib.request.Request(  # noqa: S310 - scheme checked in __init__
                f"{self.endpoint}/latest/meta-data/{path}", headers={"X-aws-ec2-metadata-token": token}
            )
            try:
                with urllib.request.urlopen(request, timeout=self.timeout_s) as resp:  # noqa: S310
                    return resp.read().decode()
            except urllib.error.HTTPError as exc:
                if exc.code == 404:
                    return None
                if exc.code == 401 and attempt == 0:
                    token = self.token = None
                    continue
                raise
        return None


def lifecycle_of(asg: Any, instance_id: str) -> Tuple[Optional[str], str]:
    """(the instance's lifecycle state in its group, the group's name); (None, "") once it is in no group."""
    found = asg.describe_auto_scaling_instances(InstanceIds=[instance_id])["AutoScalingInstances"]
    return (found[0]["LifecycleState"], found[0]["AutoScalingGroupName"]) if found else (None, "")
