"""What every duty of the agent shares: the instance's identity, its AWS clients, IMDS, the log, the settings, the
group it runs in and the agent's own SIGTERM."""

from __future__ import annotations

import threading
from typing import Any, Optional

import boto3

from spot_training.agent.aws_config import client_config
from spot_training.agent.instance_signals import Imds
from spot_training.agent.log_shipping import Log
from spot_training.agent.settings import AgentSettings


class Node:
    """One node's shared context. Duties read its fields at each use, so a test swaps one (``log``, ``imds``,
    ``settings``, a client) for all of them at once."""

    def __init__(
        self,
        instance_id: str,
        region: str,
        settings: AgentSettings,
        endpoint: Optional[str] = None,
        asg_name: str = "",
        availability_zone: str = "",
        imds: Optional[Any] = None,
    ) -> None:
        self.instance_id = instance_id
        self.log = Log(instance_id)
        session = boto3.session.Session(region_name=region)
        self.ssm, self.s3, self.asg, self.ec2, self.logs, self.secretsmanager = (
            session.client(name, endpoint_url=endpoint, config=client_config(instance_id))
            for name in ("ssm", "s3", "autoscaling", "ec2", "logs", "secretsmanager")
        )
        self.imds: Any = imds if imds is not None else Imds()
        self.settings = settings
        self.asg_name = asg_name  # ``--asg-name`` (the instance's aws:autoscaling:groupName tag), or ""
        self.group = ""  # the Auto Scaling group's name, once the agent found it at boot
        self.availability_zone = availability_zone
        self.stop_signal = threading.Event()  # the agent's own SIGTERM

    @property
    def poll_s(self) -> float:
        return self.settings.poll_s

    def flush_log(self) -> None:
        """Send what the log holds to CloudWatch Logs now (before the instance may go)."""
        if self.log.shipper is not None:
            self.log.shipper.flush()
