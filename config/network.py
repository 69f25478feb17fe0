"""The environment's VPC: one this app creates from `vpcCidr`, or an existing one (`existingVpc`)
whose subnets CDK looked up, as facts the stacks and the charts share.

The router's Network Load Balancer sits in subnets where no node runs, so no pod has an address
there (the VPC CNI gives pods their node's subnet addresses): the NetworkPolicy ipBlocks that
admit the load balancer (`load_balancer_cidrs`) admit no pod. A created VPC is cut into 8 equal
blocks: the first holds one public subnet per zone (up to 6, 1/8 of the block each), blocks 1-6
one private subnet per zone. For a /16 that is the layout CDK allocated before it was
configurable: public /22s inside 10.64.0.0/19, private /19s.

An existing VPC is read from CDK's lookup cache (`cdk.context.json`): `cdk synth` with
credentials of the account looks it up once (`Vpc.from_lookup`'s context provider), the file
is committed, and every synth after it needs no credentials.
"""
from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from typing import Any, Mapping

from .errors import ConfigError

DEFAULT_VPC_CIDR = "10.64.0.0/16"
VPC_PREFIXES = (16, 20)   # AWS allows /16 at most; private /23 per zone at the smallest
PRIVATE_RANGES = tuple(ipaddress.IPv4Network(n) for n in (
    "10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16"))              # RFC 1918
# EKS gives Services addresses from one of these when the cluster names none
# (KubernetesNetworkConfigRequest.serviceIpv4Cidr); pods take VPC addresses (VPC CNI).
EKS_SERVICE_RANGES = tuple(ipaddress.IPv4Network(n) for n in ("10.100.0.0/16", "172.20.0.0/16"))
VPC_PROVIDER = "vpc-provider"
_VPC_ID = re.compile(r"vpc-[0-9a-f]{8}(?:[0-9a-f]{9})?", re.A)
_SUBNET_ID = re.compile(r"subnet-[0-9a-f]{8}(?:[0-9a-f]{9})?", re.A)


@dataclass(frozen=True)
class Subnet:
    subnet_id: str
    zone: str
    cidr: str
    route_table_id: str


@dataclass(frozen=True)
class NetworkConfig:
    vpc_cidr: str
    # Where the router NLBs' nodes live: the NetworkPolicy ipBlocks that admit them, and the
    # sources a proxy in the router pod may trust for the client address.
    load_balancer_cidrs: tuple[str, ...]
    public_subnet_mask: int | None = None    # a created VPC's layout
    private_subnet_mask: int | None = None
    vpc_id: str | None = None                # an existing VPC, as CDK looked it up
    private_subnets: tuple[Subnet, ...] = ()     # nodes, the cache, the kubectl handler
    load_balancer_subnets: tuple[Subnet, ...] = ()

    @property
    def existing(self) -> bool:
        return self.vpc_id is not None


def created_network(env: str, field: str, cidr: Any) -> NetworkConfig:
    """A VPC this app creates: `cidr` validated and laid out (module docstring)."""
    try:
        if not isinstance(cidr, str) or not re.fullmatch(r"[0-9.]+/[0-9]{1,2}", cidr):
            raise ValueError(cidr)
        net = ipaddress.IPv4Network(cidr)
    except ValueError:
        raise ConfigError(env, field, cidr, "an IPv4 CIDR a.b.c.d/n without host bits, e.g. "
                          "10.64.0.0/16") from None
    lo, hi = VPC_PREFIXES
    if not lo <= net.prefixlen <= hi:
        raise ConfigError(env, field, cidr, f"a /{lo} to /{hi} (a VPC is /{lo} at most; "
                          f"below /{hi} a zone's private subnet holds too few pod addresses)")
    if not any(net.subnet_of(r) for r in PRIVATE_RANGES):
        raise ConfigError(env, field, cidr, "a private range (RFC 1918): inside 10.0.0.0/8, "
                          "172.16.0.0/12 or 192.168.0.0/16")
    clash = next((r for r in EKS_SERVICE_RANGES if net.overlaps(r)), None)
    if clash is not None:
        raise ConfigError(env, field, cidr, f"a range clear of {EKS_SERVICE_RANGES[0]} and "
                          f"{EKS_SERVICE_RANGES[1]}, where EKS puts Kubernetes Services (this "
                          f"one overlaps {clash})")
    blocks = list(net.subnets(new_prefix=net.prefixlen + 3))
    return NetworkConfig(vpc_cidr=str(net), load_balancer_cidrs=(str(blocks[0]),),
                         public_subnet_mask=net.prefixlen + 6,
                         private_subnet_mask=net.prefixlen + 3)


def vpc_lookup_key(account: str, region: str, vpc_id: str) -> str:
    """The context key under which CDK's `Vpc.from_lookup(vpc_id=...)` caches its lookup
    (tests/config check it against the key CDK itself reports missing)."""
    return (f"{VPC_PROVIDER}:account={account}:filter.vpc-id={vpc_id}:region={region}"
            ":returnAsymmetricSubnets=true")


def existing_network(env: str, raw: Any, account: str, region: str,
                     zones: tuple[str, ...], context: Mapping[str, Any]) -> NetworkConfig:
    """`existingVpc: {vpcId, privateSubnetIds?, loadBalancerSubnetIds?}` with the subnets
    CDK's lookup found (raises `VpcLookupNeeded` when it has not run yet)."""
    if not isinstance(raw, Mapping):
        raise ConfigError(env, "existingVpc", raw, "a JSON object {vpcId, privateSubnetIds, "
                          "loadBalancerSubnetIds}")
    extra = sorted(set(raw) - {"vpcId", "privateSubnetIds", "loadBalancerSubnetIds"})
    if extra:
        raise ConfigError(env, f"existingVpc.{extra[0]}", raw[extra[0]],
                          "known fields: loadBalancerSubnetIds, privateSubnetIds, vpcId")
    vpc_id = raw.get("vpcId")
    if not isinstance(vpc_id, str) or not _VPC_ID.fullmatch(vpc_id):
        raise ConfigError(env, "existingVpc.vpcId", vpc_id, "a VPC id, vpc- and 8 or 17 hex "
                          "digits")
    wanted = {}
    for key in ("privateSubnetIds", "loadBalancerSubnetIds"):
        ids = raw.get(key)
        if ids is None:
            continue
        if not isinstance(ids, list) or not ids or not all(
                isinstance(i, str) and _SUBNET_ID.fullmatch(i) for i in ids):
            raise ConfigError(env, f"existingVpc.{key}", ids, "a non-empty list of subnet "
                              "ids (subnet- and 8 or 17 hex digits)")
        wanted[key] = ids
    key = vpc_lookup_key(account, region, vpc_id)
    found = context.get(key)
    if found is None:
        raise VpcLookupNeeded(env, vpc_id, account, region)
    try:
        groups = {s["subnetId"]: (g["type"], Subnet(s["subnetId"], s["availabilityZone"],
                                                    s["cidr"], s["routeTableId"]))
                  for g in found["subnetGroups"] for s in g["subnets"]}
        vpc_cidr = found["vpcCidrBlock"]
    except (KeyError, TypeError):
        raise ConfigError(env, f"cdk.context.json: {key}", found, "the answer of CDK's VPC "
                          "lookup: delete the entry and run cdk synth with credentials "
                          "(cdk context --reset)") from None

    def pick(field: str, kind: str) -> tuple[Subnet, ...]:
        ids = wanted.get(field) or [i for i, (t, s) in groups.items()
                                    if t == kind and s.zone in zones]
        missing = [i for i in ids if i not in groups]
        if missing:
            raise ConfigError(env, f"existingVpc.{field}", missing[0], f"a subnet of "
                              f"{vpc_id}: {', '.join(sorted(groups)) or 'it has none'}")
        subnets = tuple(sorted((groups[i][1] for i in ids), key=lambda s: s.zone))
        outside = [s.subnet_id for s in subnets if s.zone not in zones]
        if outside:
            raise ConfigError(env, f"existingVpc.{field}", outside[0], "subnets in the "
                              f"environment's zones ({', '.join(zones)})")
        per_zone = [s.zone for s in subnets]
        if len(set(per_zone)) != len(per_zone):
            raise ConfigError(env, f"existingVpc.{field}", list(ids), "one subnet per zone")
        return subnets

    private = pick("privateSubnetIds", "Private")
    if [s.zone for s in private] != sorted(zones):
        raise ConfigError(env, "existingVpc.privateSubnetIds", [s.subnet_id for s in private],
                          f"one private subnet in each of the environment's zones "
                          f"({', '.join(zones)}): nodes and the cache run there")
    lb = pick("loadBalancerSubnetIds", "Public")
    if not lb:
        raise ConfigError(env, "existingVpc.loadBalancerSubnetIds", None, "subnets for the "
                          f"router's load balancers: {vpc_id} has no public subnet in "
                          f"{', '.join(zones)}, so name them")
    shared = {s.subnet_id for s in lb} & {s.subnet_id for s in private}
    if shared:
        raise ConfigError(env, "existingVpc.loadBalancerSubnetIds", sorted(shared)[0],
                          "subnets where no node runs (the NetworkPolicy admits the load "
                          "balancer by its subnets' ranges, which would admit pods there too)")
    return NetworkConfig(vpc_cidr=vpc_cidr, load_balancer_cidrs=tuple(s.cidr for s in lb),
                         vpc_id=vpc_id, private_subnets=private, load_balancer_subnets=lb)


class VpcLookupNeeded(ConfigError):
    """An existing VPC CDK has not looked up yet: app.py lets the CLI look it up (it needs
    credentials of the account once); anywhere else this is the error line."""

    def __init__(self, env: str, vpc_id: str, account: str, region: str):
        super().__init__(env, "existingVpc.vpcId", vpc_id, f"a VPC CDK has looked up: run "
                         f"`cdk synth` for this environment once with credentials of account "
                         f"{account} in {region} (CDK records the lookup in cdk.context.json: "
                         "commit it)")
        self.vpc_id, self.account, self.region = vpc_id, account, region
