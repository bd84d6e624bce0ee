"""Peers: the group's InService, running instances in launch order (element 0 hosts the rendezvous), and the map of
their private addresses to reachable ones (``SPOT_TRAINING_PEER_ADDRESS_MAP``)."""

from __future__ import annotations

import ipaddress
import json
import os
from typing import Any, Dict, List, Optional, Set, Tuple

from spot_training.agent.errors import AgentError
from spot_training.peers import launch_order

Peers = List[Tuple[str, str]]  # (instance id, private address), in launch order


def load_address_map() -> Dict[str, str]:
    path = os.environ.get("SPOT_TRAINING_PEER_ADDRESS_MAP")
    if not path:
        return {}
    try:
        with open(path) as f:
            data = json.load(f)
        assert isinstance(data, dict)
        for key, value in data.items():
            ipaddress.ip_address(key)
            ipaddress.ip_address(value)
    except (OSError, ValueError, AssertionError) as exc:
        raise AgentError(f"SPOT_TRAINING_PEER_ADDRESS_MAP {path}: not a JSON object of IP -> IP ({exc})") from None
    return {str(k): str(v) for k, v in data.items()}


def discover_peers(asg: Any, ec2: Any, group: str, leaving: Optional[Set[str]] = None) -> Peers:
    """(instance id, private IP) of the group's InService instances in launch order (``spot_training.peers``):
    element 0 hosts the rendezvous.

    Instances in ``leaving`` (they announced an interruption notice) are left out: they are still InService
    until the group replaces them, but will not join another rendezvous.
    """
    groups = asg.describe_auto_scaling_groups(AutoScalingGroupNames=[group])["AutoScalingGroups"]
    if not groups:
        raise AgentError(f"Auto Scaling group {group} does not exist")
    ids = sorted(
        i["InstanceId"]
        for i in groups[0]["Instances"]
        if i.get("LifecycleState") == "InService" and i["InstanceId"] not in (leaving or set())
    )
    if not ids:
        return []
    found: List[Dict[str, Any]] = []
    for page in ec2.get_paginator("describe_instances").paginate(InstanceIds=ids):
        for reservation in page["Reservations"]:
            # Running only: a node EC2 took hard (no notice seen) stays InService until the group's next health
            # check, and as the oldest launch it would be elected host again, every peer's torchrun failing on it.
            found.extend(
                inst
                for inst in reservation["Instances"]
                if inst.get("PrivateIpAddress") and inst.get("State", {}).get("Name") == "running"
            )
    ips = {inst["InstanceId"]: inst["PrivateIpAddress"] for inst in found}
    return [(i, ips[i]) for i in launch_order(found)]


def group_states(asg: Any, group: str) -> Dict[str, str]:
    """The instances of Auto Scaling group ``group`` and their lifecycle states (``InService``, ...)."""
    groups = asg.describe_auto_scaling_groups(AutoScalingGroupNames=[group])["AutoScalingGroups"]
    return {str(i["InstanceId"]): str(i.get("LifecycleState", "")) for g in groups for i in g["Instances"]}


def group_instances(asg: Any, group: str, *states: str) -> Set[str]:
    """The instances of Auto Scaling group ``group`` (in one of the lifecycle ``states``, if given)."""
    return {i for i, state in group_states(asg, group).items() if not states or state in states}
