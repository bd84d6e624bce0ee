"""The AMI a cluster's nodes boot: a fixed AMI id, or the one an SSM parameter names at each deploy."""

from __future__ import annotations

import jsii
from aws_cdk import aws_ec2 as ec2
from constructs import Construct

from team_config.model import DEFAULT_AMI_PARAMETER, ClusterConfig


@jsii.implements(ec2.IMachineImage)
class FixedImage:
    """An AMI id used as given, whatever the stack's region (ec2.MachineImage.generic_linux needs a region map)."""

    def __init__(self, image_id: str) -> None:
        self.image_id = image_id

    def get_image(self, scope: Construct) -> ec2.MachineImageConfig:
        return ec2.MachineImageConfig(
            image_id=self.image_id, os_type=ec2.OperatingSystemType.LINUX, user_data=ec2.UserData.for_linux()
        )


def node_image(spec: ClusterConfig) -> ec2.IMachineImage:
    """The cluster's fixed AMI (``spec.image_id``), else ``ami.ssm_parameter``'s, else the architecture's DLAMI."""
    if spec.image_id:
        return FixedImage(spec.image_id)
    parameter = spec.ami.ssm_parameter or DEFAULT_AMI_PARAMETER[spec.architecture]
    return ec2.MachineImage.from_ssm_parameter(parameter, os=ec2.OperatingSystemType.LINUX)
