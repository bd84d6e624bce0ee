"""ClusterNetwork: the VPC the training nodes live in (new or imported) and its S3 endpoint."""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from typing import Optional

from aws_cdk import Annotations, RemovalPolicy
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_logs as logs
from constructs import Construct

from compliance.checkov import skip_checkov
from training_constructs.training_logs import LOG_GROUP_KMS_SKIP


class ClusterNetwork(Construct):
    """A VPC fit for multi-node training.

    New VPC (default): ``az_count`` AZs (1 by default, because a cluster placement group lives in
    one AZ), private subnets with NAT egress, VPC flow logs, an S3 gateway endpoint so checkpoint
    traffic stays off the NAT. Imported VPC: the given subnets, plus the S3 endpoint on their
    route tables when asked. No SSH anywhere: access is SSM Session Manager.
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        cidr: str = "10.0.0.0/16",
        az_count: int = 1,
        availability_zones: Sequence[str] = (),
        nat_gateways: int = 1,
        flow_log_retention: logs.RetentionDays = logs.RetentionDays.ONE_MONTH,
        existing_vpc_id: Optional[str] = None,
        existing_subnet_ids: Sequence[str] = (),
        existing_availability_zones: Sequence[str] = (),
        existing_route_table_ids: Sequence[str] = (),
        create_s3_endpoint: bool = True,
    ) -> None:
        super().__init__(scope, construct_id)
        self.vpc: ec2.IVpc
        if existing_vpc_id:
            if not existing_subnet_ids or len(existing_subnet_ids) != len(existing_availability_zones):
                raise ValueError("ClusterNetwork: give one availability zone per existing subnet id")
            self.vpc = self._imported_vpc(
                existing_vpc_id, existing_subnet_ids, existing_availability_zones, existing_route_table_ids
            )
        else:
            self.vpc = self._new_vpc(cidr, az_count, availability_zones, nat_gateways, flow_log_retention)
        private = ec2.SubnetType.PRIVATE_WITH_EGRESS if nat_gateways else ec2.SubnetType.PRIVATE_ISOLATED
        # Imported subnets are registered as private; a new VPC's training subnets are private too.
        self.training_subnets = ec2.SubnetSelection(subnet_type=None if existing_vpc_id else private)
        if create_s3_endpoint:
            self.s3_endpoint = self.vpc.add_gateway_endpoint(
                "S3Endpoint",
                service=ec2.GatewayVpcEndpointAwsService.S3,
                subnets=[self.training_subnets],
            )

    def _imported_vpc(
        self,
        vpc_id: str,
        subnet_ids: Sequence[str],
        availability_zones: Sequence[str],
        route_table_ids: Sequence[str],
    ) -> ec2.IVpc:
        """The team's VPC, its subnets registered as private ones."""
        vpc = ec2.Vpc.from_vpc_attributes(
            self,
            "Vpc",
            vpc_id=vpc_id,
            availability_zones=list(availability_zones),
            private_subnet_ids=list(subnet_ids),
            private_subnet_route_table_ids=list(route_table_ids) or None,
        )
        if not route_table_ids:  # the team config requires them for the S3 endpoint, their one reader
            Annotations.of(vpc).acknowledge_warning(
                "@aws-cdk/aws-ec2:noSubnetRouteTableId", "no S3 endpoint here: nothing reads the route tables"
            )
        return vpc

    def _new_vpc(
        self,
        cidr: str,
        az_count: int,
        availability_zones: Sequence[str],
        nat_gateways: int,
        flow_log_retention: logs.RetentionDays,
    ) -> ec2.Vpc:
        """Per AZ: a small public subnet (NAT only) and a large training subnet (3 AZs fit); flow logs on."""
        prefix = ipaddress.IPv4Network(cidr).prefixlen
        vpc = ec2.Vpc(
            self,
            "Vpc",
            ip_addresses=ec2.IpAddresses.cidr(cidr),
            # the zones by name when given (where the instance types have spot capacity), else the first ones
            availability_zones=list(availability_zones) or None,
            max_azs=None if availability_zones else az_count,
            nat_gateways=nat_gateways,
            # The default-SG lockdown is a Lambda custom resource; nothing here uses the default SG.
            restrict_default_security_group=False,
            subnet_configuration=[
                ec2.SubnetConfiguration(name="Public", subnet_type=ec2.SubnetType.PUBLIC, cidr_mask=prefix + 4),
                ec2.SubnetConfiguration(
                    name="Training",
                    subnet_type=(
                        ec2.SubnetType.PRIVATE_WITH_EGRESS if nat_gateways else ec2.SubnetType.PRIVATE_ISOLATED
                    ),
                    cidr_mask=prefix + 2,
                ),
            ],
        )
        flow_logs = logs.LogGroup(self, "FlowLogs", retention=flow_log_retention, removal_policy=RemovalPolicy.DESTROY)
        skip_checkov(flow_logs, *LOG_GROUP_KMS_SKIP)
        vpc.add_flow_log("FlowLog", destination=ec2.FlowLogDestination.to_cloud_watch_logs(flow_logs))
        return vpc
