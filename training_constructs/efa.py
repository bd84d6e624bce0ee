"""Elastic Fabric Adapter (EFA) interfaces in a launch template: what NCCL's all-reduce runs over between nodes.

A node of an EFA cluster gets one interface of type ``efa`` per network card its type allows
(``InstanceFacts.efa_layout``): the first the primary (network card 0, device index 0), each other one device index 1
on network card 1, 2, ... (the layout EC2's user guide gives for instances with several network cards). The
security group moves from the launch template onto each interface (EC2 takes it in one place only), and no interface
asks for a public IP: the nodes live in private subnets, and EC2 gives no public IP to an instance launched with
several interfaces anyway.
"""

from __future__ import annotations

import typing
from typing import Any

from aws_cdk import aws_ec2 as ec2


def efa_interfaces(count: int, security_group_id: str) -> list[dict[str, Any]]:
    """``LaunchTemplateData.NetworkInterfaces`` for ``count`` EFA interfaces, the first the primary."""
    interfaces: list[dict[str, Any]] = []
    for card in range(count):
        interface: dict[str, Any] = {
            "DeviceIndex": 0 if card == 0 else 1,
            "NetworkCardIndex": card,
            "InterfaceType": "efa",
            "Groups": [security_group_id],
            "DeleteOnTermination": True,
        }
        if count == 1:  # EC2 refuses the key on a launch with several interfaces
            interface["AssociatePublicIpAddress"] = False
        interfaces.append(interface)
    return interfaces


def add_efa_interfaces(launch_template: ec2.LaunchTemplate, count: int, security_group: ec2.ISecurityGroup) -> None:
    """Give ``launch_template`` ``count`` EFA interfaces in ``security_group`` (instead of its own security groups)."""
    cfn = typing.cast(ec2.CfnLaunchTemplate, launch_template.node.default_child)
    cfn.add_property_deletion_override("LaunchTemplateData.SecurityGroupIds")
    cfn.add_property_override(
        "LaunchTemplateData.NetworkInterfaces", efa_interfaces(count, security_group.security_group_id)
    )
