"""The team file's ``network`` section: a new VPC or an existing one."""

from __future__ import annotations

import ipaddress
from typing import Annotated, Any, Optional

from pydantic import BeforeValidator, Field, model_validator

from team_config.model.base import AzName, RouteTableId, Strict, SubnetId, VpcId, empty_section

# Ranges no VPC's hosts can use (RFC 6890): their addresses mean something else on every host.
NOT_FOR_HOSTS = {
    ipaddress.IPv4Network("0.0.0.0/8"): '"this network"',
    ipaddress.IPv4Network("127.0.0.0/8"): "the loopback range",
    ipaddress.IPv4Network("169.254.0.0/16"): "the link-local range (the instance metadata service and Amazon DNS)",
    ipaddress.IPv4Network("224.0.0.0/4"): "the multicast range",
    ipaddress.IPv4Network("240.0.0.0/4"): "a reserved range",
}


class NewVpcConfig(Strict):
    cidr: str = Field(
        "10.0.0.0/16",
        description="IPv4 range of the new VPC, /16 to /24, not in 0/8, 127/8, 169.254/16, 224/4 or 240/4.",
    )
    az_count: int = Field(1, ge=1, le=3, description="Availability zones the VPC spans.")
    availability_zones: Optional[list[AzName]] = Field(
        None,
        min_length=1,
        max_length=3,
        description="The zones by name, in the region the stack deploys to (where the instance types have spot "
        "capacity); unset: the region's first az_count zones.",
    )
    nat_gateways: int = Field(
        1, ge=0, le=3, description="NAT gateways for egress, 1 to az_count (the nodes reach AWS APIs through them)."
    )

    @model_validator(mode="before")
    @classmethod
    def _count_the_zones(cls, data: Any) -> Any:
        """``availability_zones`` alone sets ``az_count``."""
        zones = data.get("availability_zones") if isinstance(data, dict) else None
        if isinstance(zones, list) and 1 <= len(zones) <= 3 and "az_count" not in data:  # else: its own error
            return {**data, "az_count": len(zones)}
        return data

    @model_validator(mode="after")
    def _cidr(self) -> NewVpcConfig:
        try:
            net = ipaddress.IPv4Network(self.cidr)
        except ValueError as exc:
            raise ValueError(f"cidr {self.cidr!r} is not an IPv4 network ({exc}); use e.g. 10.0.0.0/16") from None
        if not 16 <= net.prefixlen <= 24:
            raise ValueError(f"cidr {self.cidr!r} has prefix /{net.prefixlen}; use a /16 to /24 range")
        for special, what in NOT_FOR_HOSTS.items():
            if net.overlaps(special):
                raise ValueError(f"cidr {self.cidr!r} is in {special}, {what}; use a private range such as 10.0.0.0/16")
        zones = self.availability_zones
        if zones is None and self.az_count > 2:
            raise ValueError(
                f"az_count {self.az_count} needs availability_zones: a region-agnostic stack knows only 2 zones "
                "(list the zones by name, e.g. [us-east-1a, us-east-1b, us-east-1c])"
            )
        if zones is not None:
            if len(set(zones)) != len(zones):
                raise ValueError(f"availability_zones {zones} names a zone twice; list each zone once")
            one_region("availability_zones", zones)
            if self.az_count != len(zones):
                raise ValueError(
                    f"az_count {self.az_count} but availability_zones lists {len(zones)}; drop az_count "
                    "(the list sets it)"
                )
        if self.nat_gateways == 0:
            raise ValueError(
                "nat_gateways 0 leaves the nodes no way to SSM, Auto Scaling, EC2 or CloudWatch Logs (the stack adds "
                "only an S3 endpoint), so they could not even leave the group; use 1, or an existing_vpc with its own "
                "endpoints"
            )
        if self.nat_gateways > self.az_count:
            raise ValueError(
                f"nat_gateways ({self.nat_gateways}) exceeds az_count ({self.az_count}); use at most one per AZ"
            )
        return self


def one_region(field: str, zones: list[str]) -> None:
    """Zones of one region (a zone name is its region's name and a letter)."""
    if len({z[:-1] for z in zones}) > 1:
        raise ValueError(f"{field} {zones} are in different regions; list zones of one region")


class SubnetConfig(Strict):
    subnet_id: SubnetId = Field(description="The subnet (subnet-...).")
    availability_zone: AzName = Field(description="The subnet's zone, such as us-east-1a.")
    route_table_id: Optional[RouteTableId] = Field(None, description="Route table for the S3 gateway endpoint.")


class ExistingVpcConfig(Strict):
    vpc_id: VpcId = Field(description="The VPC (vpc-...).")
    subnets: list[SubnetConfig] = Field(min_length=1, description="Subnets the clusters launch into, one per AZ.")
    create_s3_endpoint: bool = Field(True, description="Add an S3 gateway endpoint on the subnets' route tables.")

    @model_validator(mode="after")
    def _subnets(self) -> ExistingVpcConfig:
        ids = [s.subnet_id for s in self.subnets]
        twice = sorted({i for i in ids if ids.count(i) > 1})
        if twice:
            raise ValueError(f"subnets: {twice[0]} is listed twice; list each subnet once")
        azs = [s.availability_zone for s in self.subnets]
        if len(set(azs)) != len(azs):
            raise ValueError("subnets: two subnets in one availability zone; list one subnet per AZ")
        one_region("subnets: availability zones", azs)
        if self.create_s3_endpoint and any(s.route_table_id is None for s in self.subnets):
            raise ValueError("subnets: route_table_id is required on every subnet when create_s3_endpoint is true")
        with_table = [i for i, s in enumerate(self.subnets) if s.route_table_id is not None]
        if with_table and len(with_table) != len(self.subnets):
            without = next(i for i in range(len(self.subnets)) if i not in with_table)
            raise ValueError(
                f"subnets: route_table_id is given on subnets[{with_table[0]}] but not on subnets[{without}]; "
                "give it on every subnet or on none"
            )
        return self


class NetworkConfig(Strict):
    new_vpc: Annotated[
        Optional[NewVpcConfig], BeforeValidator(empty_section("write new_vpc: {} for the defaults, or remove the line"))
    ] = Field(None, description="A new VPC made by the stack (the default when neither key is set).")
    existing_vpc: Annotated[
        Optional[ExistingVpcConfig],
        BeforeValidator(empty_section("give its keys (vpc_id: ..., subnets: ...) or remove the line")),
    ] = Field(None, description="A VPC the team already has; not together with new_vpc.")

    @model_validator(mode="after")
    def _one(self) -> NetworkConfig:
        if self.new_vpc is not None and self.existing_vpc is not None:
            raise ValueError("set either new_vpc or existing_vpc, not both")
        return self

    @property
    def az_count(self) -> int:
        if self.existing_vpc is not None:
            return len(self.existing_vpc.subnets)
        return (self.new_vpc or NewVpcConfig()).az_count

    @property
    def zone_names(self) -> Optional[list[str]]:
        """The network's zones by name; None when the team file does not name them (a region-agnostic new VPC)."""
        if self.existing_vpc is not None:
            return [s.availability_zone for s in self.existing_vpc.subnets]
        return (self.new_vpc or NewVpcConfig()).availability_zones
