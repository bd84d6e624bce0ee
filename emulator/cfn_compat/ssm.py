"""SSM (items 5 and 7 of :mod:`emulator.cfn_compat`): public AMI parameters, and parameters with tags.

5. Public SSM parameters: the launch template's ``ImageId`` comes from an SSM-typed CloudFormation
   parameter whose default is a public ``/aws/service/deeplearning/...`` path; moto only knows its
   own ``ami-amazon-linux-latest`` tree and refuses ``PutParameter`` on ``/aws/`` names (as AWS
   does). -> :func:`seed_public_ami_parameters` writes such parameters into the SSM backend of the
   server process, each set to an AMI id moto's EC2 knows (``describe_images``) for the path's
   architecture.
7. ``AWS::SSM::Parameter``: moto passes ``Tags`` on unchanged, but CloudFormation gives them as a
   map (``{"key": "value"}``) and moto's ``put_parameter`` wants a list, so the create fails (and
   moto needs ``Name``, which CloudFormation makes optional). -> A model that converts the map,
   gives an unnamed parameter a generated name, as CloudFormation does, and then uses moto's own ``put_parameter``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from moto.core.common_models import CloudFormationModel
from moto.ec2.models import ec2_backends
from moto.ssm.models import Parameter, ssm_backends

from emulator.cfn_compat.base import CompatModel

# --- 5. Public SSM parameters ----------------------------------------------------------------------


def emulated_ami(account_id: str, region_name: str, architecture: str) -> str:
    """An AMI id moto's EC2 knows for ``architecture``: a Deep Learning AMI on Amazon Linux if there is one."""
    images = [
        i
        for i in ec2_backends[account_id][region_name].describe_images()
        if i.architecture == architecture and i.platform != "windows"
    ]
    if not images:
        raise RuntimeError(f"moto knows no {architecture} AMI in {region_name}")

    def rank(image: Any) -> tuple[int, int, str]:
        name = (image.name or "").lower()
        return (
            0 if "deep learning" in name and "amazon linux" in name else 1,
            0 if image.root_device_name == "/dev/xvda" else 1,
            image.id,
        )

    return min(images, key=rank).id


def seed_public_ami_parameters(account_id: str, region_name: str, names: list[str]) -> dict[str, str]:
    """Give each public ``/aws/service/.../ami-id`` parameter an AMI moto knows; returns name -> AMI id."""
    from moto.core.utils import utcnow

    params = ssm_backends[account_id][region_name]._parameters
    seeded = {}
    for name in names:
        architecture = "arm64" if "/arm64/" in name else "x86_64"
        ami = emulated_ami(account_id, region_name, architecture)
        params[name].append(
            Parameter(  # type: ignore[abstract]
                account_id=account_id,
                name=name,
                value=ami,
                parameter_type="String",
                description=None,
                allowed_pattern=None,
                keyid=None,
                last_modified_date=utcnow(),
                version=len(params[name]) + 1,
                data_type="aws:ec2:image",
            )
        )
        seeded[name] = ami
    return seeded


# --- 7. SSM parameters with tags -------------------------------------------------------------------


class SsmParameter(CompatModel, CloudFormationModel):
    """``AWS::SSM::Parameter`` with CloudFormation's map-shaped ``Tags`` (returns moto's Parameter)."""

    CFN_TYPE = "AWS::SSM::Parameter"
    NAME_PROPERTY = "Name"
    ATTRIBUTES: ClassVar[Mapping[str, str]] = {"Type": "parameter_type", "Value": "value"}

    @classmethod
    def create(cls, name: str, props: Any, account_id: str, region_name: str) -> Any:
        raw_tags = props.get("Tags") or {}
        tags: list[dict[str, str]] = (
            [{"Key": k, "Value": v} for k, v in raw_tags.items()] if isinstance(raw_tags, dict) else list(raw_tags)
        )
        return ssm_backends[account_id][region_name].put_parameter(
            name=props.get("Name") or name,
            description=props.get("Description"),
            value=props.get("Value"),
            parameter_type=props.get("Type"),
            allowed_pattern=props.get("AllowedPattern"),
            keyid=props.get("KeyId"),
            overwrite=False,
            tags=tags,
            data_type=props.get("DataType", "text"),
            tier=props.get("Tier"),
            policies=props.get("Policies"),
        )

    @classmethod
    def remove(cls, name: str, props: Any, account_id: str, region_name: str) -> None:
        ssm_backends[account_id][region_name].delete_parameter(name or props.get("Name"))
