from __future__ import annotations

from aws_cdk import CfnOutput, Fn, Stack
from constructs import Construct

from config import EnvironmentConfig
from config.regions import interface_endpoints
from constructs.network import Network, NetworkProps
from stacks.common import log_retention, removal_policy


class NetworkStack(Stack):
    """The VPC this app creates (`vpcCidr`); an environment with `existingVpc` has none."""

    def __init__(self, scope: Construct, id: str, *, cfg: EnvironmentConfig, **kwargs) -> None:
        super().__init__(scope, id, **kwargs)
        self._zones = list(cfg.availability_zones)
        self.vpc = Network(self, "Network", props=NetworkProps(
            availability_zones=cfg.availability_zones, nat_gateways=cfg.nat_gateways,
            flow_log_retention=log_retention(cfg), removal_policy=removal_policy(cfg),
            interface_endpoints=interface_endpoints(cfg.facts), cidr=cfg.network.vpc_cidr,
            public_subnet_mask=cfg.network.public_subnet_mask,
            private_subnet_mask=cfg.network.private_subnet_mask,
        )).vpc
        # The router NLBs' subnets (${LB_SUBNETS} in the GitOps YAML): the public ones.
        CfnOutput(self, "LoadBalancerSubnets",
                  value=Fn.join(",", [s.subnet_id for s in self.vpc.public_subnets]))

    @property
    def availability_zones(self) -> list[str]:
        """The zones come from config: synth makes no AZ lookup and stays deterministic."""
        return self._zones
