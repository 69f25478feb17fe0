"""The environment's VPC: one this app creates from `vpcCidr`, or an existing one (`existingVpc`)
described in the environment file, as facts the stacks and the charts share.

The router's Network Load Balancer must be admitted by address (NetworkPolicy ipBlocks, and the
front takes the PROXY header only from it) where no pod can hold that address (the VPC CNI
gives pods their node's subnet addresses). A created VPC puts it in public subnets where no
node runs: it is cut into 8 equal blocks, the first holding one public subnet per zone (up to
6, 1/8 of the block each), blocks 1-6 one private subnet per zone. For a /16 that is the layout
CDK allocated before it was configurable: public /22s inside 10.64.0.0/19, private /19s.

An existing VPC is what its network team knows: the VPC id and CIDR, and per zone a private
subnet's id, CIDR and route table (`aws ec2 describe-subnets`): synth needs no lookup and no
credentials, and preflight compares these facts with the account. Its load balancer subnets
(`loadBalancerSubnets`, where no node runs) are optional. Without them the VPC is private-only:
each router's internal NLB sits in the node subnets with fixed addresses, one per subnet in the
top /27 (`lb_block`), at a slot given by the endpoint's name (`lb_slot`), and only those /32s
are admitted: pods share the subnets, but never those addresses, which the NLB holds for its
life (AWS: an internal NLB's private addresses do not change). docs/security.md says what that
costs.
"""
from __future__ import annotations

import hashlib
import ipaddress
import itertools
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
VPC_FIELDS = ("vpcId", "cidr", "privateSubnets", "loadBalancerSubnets")
SUBNET_FIELDS = ("subnetId", "zone", "cidr", "routeTableId")
PRIVATE_PREFIX_MAX = 24   # an existing VPC's node subnets: room for pods and the NLB block
LB_BLOCK_PREFIX = 27      # the top of each node subnet, in a private-only VPC
LB_SLOTS = 2 ** (32 - LB_BLOCK_PREFIX) - 1    # the last address is AWS's
_VPC_ID = re.compile(r"vpc-[0-9a-f]{8}(?:[0-9a-f]{9})?", re.A)
_SUBNET_ID = re.compile(r"subnet-[0-9a-f]{8}(?:[0-9a-f]{9})?", re.A)
_RTB_ID = re.compile(r"rtb-[0-9a-f]{8}(?:[0-9a-f]{9})?", re.A)


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
    # sources a proxy in the router pod may trust for the client address. In a private-only VPC
    # the blocks their fixed addresses come from: each router admits only its own /32s
    # (router_load_balancer_cidrs).
    load_balancer_cidrs: tuple[str, ...]
    public_subnet_mask: int | None = None    # a created VPC's layout
    private_subnet_mask: int | None = None
    vpc_id: str | None = None                # an existing VPC, as its file describes it
    private_subnets: tuple[Subnet, ...] = ()     # nodes, the cache, the kubectl handler
    load_balancer_subnets: tuple[Subnet, ...] = ()   # none: private-only

    @property
    def existing(self) -> bool:
        return self.vpc_id is not None

    @property
    def private_only(self) -> bool:
        """An existing VPC without load balancer subnets: internal NLBs in the node subnets."""
        return self.existing and not self.load_balancer_subnets


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


def _subnet(env: str, field: str, raw: Any, vpc: ipaddress.IPv4Network,
            zones: tuple[str, ...]) -> Subnet:
    """One subnet as the team's network team knows it: `{subnetId, zone, cidr, routeTableId}`."""
    if not isinstance(raw, Mapping):
        raise ConfigError(env, field, raw, "a JSON object {" + ", ".join(SUBNET_FIELDS) + "}")
    extra = sorted(set(raw) - set(SUBNET_FIELDS))
    if extra:
        raise ConfigError(env, f"{field}.{extra[0]}", raw[extra[0]],
                          "known fields: " + ", ".join(SUBNET_FIELDS))
    values = {k: raw.get(k) for k in SUBNET_FIELDS}
    for key, pattern, allowed in (
            ("subnetId", _SUBNET_ID, "a subnet id, subnet- and 8 or 17 hex digits"),
            ("routeTableId", _RTB_ID, "the subnet's route table id, rtb- and 8 or 17 hex "
             "digits (aws ec2 describe-route-tables; the main one when none is associated)")):
        if not isinstance(values[key], str) or not pattern.fullmatch(values[key]):
            raise ConfigError(env, f"{field}.{key}", values[key], allowed)
    if values["zone"] not in zones:
        raise ConfigError(env, f"{field}.zone", values["zone"],
                          f"one of the environment's zones ({', '.join(zones)})")
    net = _network(values["cidr"])
    if net is None or not net.subnet_of(vpc):
        raise ConfigError(env, f"{field}.cidr", values["cidr"], f"the subnet's IPv4 CIDR, "
                          f"inside the VPC's {vpc}")
    return Subnet(values["subnetId"], values["zone"], str(net), values["routeTableId"])


def _subnets(env: str, field: str, raw: Any, vpc: ipaddress.IPv4Network,
             zones: tuple[str, ...]) -> tuple[Subnet, ...]:
    if not isinstance(raw, list) or not raw:
        raise ConfigError(env, field, raw, "a non-empty list of {" + ", ".join(SUBNET_FIELDS)
                          + "}, one per zone")
    subnets = [_subnet(env, f"{field}[{i}]", s, vpc, zones) for i, s in enumerate(raw)]
    per_zone = [s.zone for s in subnets]
    if len(set(per_zone)) != len(per_zone):
        raise ConfigError(env, field, per_zone, "one subnet per zone")
    return tuple(sorted(subnets, key=lambda s: s.zone))


def existing_network(env: str, raw: Any, zones: tuple[str, ...]) -> NetworkConfig:
    """`existingVpc: {vpcId, cidr, privateSubnets, loadBalancerSubnets?}`: the VPC as its
    network team describes it (module docstring). No lookup: synth needs no credentials, and
    preflight compares these facts with the account's."""
    if not isinstance(raw, Mapping):
        raise ConfigError(env, "existingVpc", raw, "a JSON object {" + ", ".join(VPC_FIELDS)
                          + "}")
    extra = sorted(set(raw) - set(VPC_FIELDS))
    if extra:
        raise ConfigError(env, f"existingVpc.{extra[0]}", raw[extra[0]],
                          "known fields: " + ", ".join(VPC_FIELDS) + " (the subnets described, "
                          "not looked up: docs/existing-vpc.md)")
    vpc_id = raw.get("vpcId")
    if not isinstance(vpc_id, str) or not _VPC_ID.fullmatch(vpc_id):
        raise ConfigError(env, "existingVpc.vpcId", vpc_id, "a VPC id, vpc- and 8 or 17 hex "
                          "digits")
    vpc = _network(raw.get("cidr"))
    if vpc is None:
        raise ConfigError(env, "existingVpc.cidr", raw.get("cidr"), "the VPC's IPv4 CIDR "
                          "a.b.c.d/n, e.g. 10.20.0.0/16 (its primary block)")
    private = _subnets(env, "existingVpc.privateSubnets", raw.get("privateSubnets"), vpc, zones)
    if [s.zone for s in private] != sorted(zones):
        raise ConfigError(env, "existingVpc.privateSubnets", [s.zone for s in private],
                          f"one private subnet in each of the environment's zones "
                          f"({', '.join(zones)}): nodes and the cache run there")
    small = next((i for i, s in enumerate(private)
                  if ipaddress.IPv4Network(s.cidr).prefixlen > PRIVATE_PREFIX_MAX), None)
    if small is not None:
        raise ConfigError(env, f"existingVpc.privateSubnets[{small}].cidr", private[small].cidr,
                          f"a /{PRIVATE_PREFIX_MAX} or larger: pods take node-subnet addresses "
                          f"(VPC CNI), and the top /{LB_BLOCK_PREFIX} is where a router's "
                          "internal load balancer may take its addresses")
    lb: tuple[Subnet, ...] = ()
    if "loadBalancerSubnets" in raw:
        lb = _subnets(env, "existingVpc.loadBalancerSubnets", raw["loadBalancerSubnets"], vpc,
                      zones)
    for a, b in itertools.combinations((*private, *lb), 2):
        if a.subnet_id == b.subnet_id or ipaddress.IPv4Network(a.cidr).overlaps(
                ipaddress.IPv4Network(b.cidr)):
            why = (" (load balancer subnets hold no node: the NetworkPolicy admits the load "
                   "balancer by their ranges, which would admit pods there too)" if b in lb
                   else "")
            raise ConfigError(env, "existingVpc.loadBalancerSubnets" if b in lb
                              else "existingVpc.privateSubnets", b.subnet_id,
                              f"subnets apart from each other ({b.subnet_id} {b.cidr} meets "
                              f"{a.subnet_id} {a.cidr}){why}")
    if lb:
        cidrs = tuple(s.cidr for s in lb)
    else:   # private-only: each router's NLB takes fixed addresses at the top of each subnet
        cidrs = tuple(str(lb_block(s)) for s in private)
    return NetworkConfig(vpc_cidr=str(vpc), load_balancer_cidrs=cidrs, vpc_id=vpc_id,
                         private_subnets=private, load_balancer_subnets=lb)


def _network(text: Any) -> ipaddress.IPv4Network | None:
    if not isinstance(text, str) or not re.fullmatch(r"[0-9.]+/[0-9]{1,2}", text):
        return None
    try:
        return ipaddress.IPv4Network(text)
    except ValueError:
        return None


def lb_block(subnet: Subnet) -> ipaddress.IPv4Network:
    """The top /27 of a private subnet: where a private-only VPC's router NLBs take their
    addresses (the last address is AWS's, so 31 slots)."""
    net = ipaddress.IPv4Network(subnet.cidr)
    return ipaddress.IPv4Network(f"{net.broadcast_address - LB_SLOTS}/{LB_BLOCK_PREFIX}")


def lb_slot(endpoint: str) -> int:
    """A router's slot in the block, from its endpoint's name alone: adding or removing another
    endpoint never moves an NLB (its addresses cannot change once it exists)."""
    return int.from_bytes(hashlib.sha256(endpoint.encode()).digest()[:4], "big") % LB_SLOTS


def load_balancer_addresses(network: NetworkConfig, endpoint: str) -> tuple[str, ...]:
    """The fixed private addresses of `endpoint`'s internal NLB, one per private subnet in
    their order (a private-only VPC; else none: AWS picks them in the load balancer subnets)."""
    if not network.private_only:
        return ()
    slot = lb_slot(endpoint)
    return tuple(str(ipaddress.IPv4Network(s.cidr).broadcast_address - 1 - slot)
                 for s in network.private_subnets)


def router_load_balancer_cidrs(network: NetworkConfig, endpoint: str) -> tuple[str, ...]:
    """What admits `endpoint`'s NLB (NetworkPolicy ipBlocks, the front's PROXY sources): its
    own /32s in a private-only VPC, else the load balancer subnets' ranges."""
    if network.private_only:
        return tuple(f"{a}/32" for a in load_balancer_addresses(network, endpoint))
    return network.load_balancer_cidrs


def check_load_balancer_slots(env: str, network: NetworkConfig, endpoints: list[str]) -> None:
    """Two endpoints whose NLBs would ask for the same addresses: one line naming both."""
    if not network.private_only:
        return
    seen: dict[int, str] = {}
    for name in endpoints:
        other = seen.setdefault(lb_slot(name), name)
        if other != name:
            taken = ", ".join(load_balancer_addresses(network, name))
            raise ConfigError(env, "endpoints", name, f"an endpoint name other than {name!r}: "
                              f"its router's internal load balancer would take the addresses "
                              f"of {other!r}'s ({taken}; a private-only VPC gives each a slot "
                              "by its name)")


def existing_load_balancer_subnets(network: NetworkConfig) -> str:
    """The NLBs' subnets in an existing VPC (the annotation's comma-separated ids): its load
    balancer subnets, or in a private-only VPC the node subnets."""
    return ",".join(s.subnet_id for s in network.load_balancer_subnets
                    or network.private_subnets)
