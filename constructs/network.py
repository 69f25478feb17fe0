"""The VPC GPU nodes live in: private subnets with NAT, and endpoints for what nodes pull."""
from __future__ import annotations

from dataclasses import dataclass

from aws_cdk import RemovalPolicy, aws_ec2 as ec2, aws_logs as logs
from constructs import Construct

from config.network import NetworkConfig
from constructs.nag import acknowledge
from constructs.naming import logical_id


@dataclass(frozen=True)
class NetworkProps:
    availability_zones: tuple[str, ...]
    nat_gateways: int
    flow_log_retention: logs.RetentionDays
    removal_policy: RemovalPolicy
    cidr: str
    public_subnet_mask: int       # config/network.py lays the VPC out
    private_subnet_mask: int
    # Interface endpoints keep image pulls, STS and logs off the NAT. EKS and EKS Auth are not
    # offered as endpoints in every partition, so the region facts choose the list.
    interface_endpoints: tuple[str, ...] = ()  # InterfaceVpcEndpointAwsService constant names


class Network(Construct):
    """VPC across the environment's zones; nodes only in private subnets."""

    def __init__(self, scope: Construct, id: str, *, props: NetworkProps) -> None:
        super().__init__(scope, id)
        self.vpc = ec2.Vpc(
            self, "Vpc",
            ip_addresses=ec2.IpAddresses.cidr(props.cidr),
            availability_zones=list(props.availability_zones),
            nat_gateways=props.nat_gateways,
            subnet_configuration=[
                ec2.SubnetConfiguration(name="public", subnet_type=ec2.SubnetType.PUBLIC,
                                        cidr_mask=props.public_subnet_mask),
                # Pods take VPC addresses (VPC CNI): give the private tier room.
                ec2.SubnetConfiguration(name="private",
                                        subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS,
                                        cidr_mask=props.private_subnet_mask),
            ],
            restrict_default_security_group=True,
        )
        log_group = logs.LogGroup(self, "FlowLogs", retention=props.flow_log_retention,
                                  removal_policy=props.removal_policy)
        self.vpc.add_flow_log("FlowLog",
                              destination=ec2.FlowLogDestination.to_cloud_watch_logs(log_group))
        self.vpc.add_gateway_endpoint("S3", service=ec2.GatewayVpcEndpointAwsService.S3)
        for name in props.interface_endpoints:
            self.vpc.add_interface_endpoint(
                logical_id(name), service=getattr(ec2.InterfaceVpcEndpointAwsService, name),
                private_dns_enabled=True,
                subnets=ec2.SubnetSelection(subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS),
            )
        acknowledge(self.vpc, {
            "AwsSolutions::AwsSolutions-EC23": "Interface endpoint security groups admit the "
            "VPC CIDR (a token cdk-nag cannot evaluate), not 0.0.0.0/0.",
            "CloudFormation-Validate::W3010": "Zones are named in config on purpose: synth "
            "makes no lookups, and node groups, subnets and the cache agree on them.",
        })


def existing_vpc(scope: Construct, id: str, *, network: NetworkConfig) -> ec2.IVpc:
    """An existing VPC as its environment file describes it (config/network.py), without a
    lookup: its private subnets only, the ones nodes, the cache and the kubectl handler use.
    Nothing is created in it."""
    private = network.private_subnets
    return ec2.Vpc.from_vpc_attributes(
        scope, id, vpc_id=network.vpc_id, vpc_cidr_block=network.vpc_cidr,
        availability_zones=[s.zone for s in private],
        private_subnet_ids=[s.subnet_id for s in private],
        private_subnet_route_table_ids=[s.route_table_id for s in private],
        private_subnet_ipv4_cidr_blocks=[s.cidr for s in private])
