"""Network and cache-node facts the L2 verdict counts (k8s/l2.py): what an instance's NIC
sustains, what one TCP flow gets, and what each ElastiCache node type holds and moves.

Sustained, not burst: a node's "up to" figure is spent from network I/O credits and ends when
they do, so a cache read all day long gets the baseline.
- One TCP flow between instances is capped at 5 Gbps outside a cluster placement group, and an
  instance's bandwidth applies to inbound and outbound traffic each (AWS EC2 user guide,
  "Amazon EC2 instance network bandwidth").
- EC2 baselines: the EC2 user guide's network specifications tables (baseline bandwidth for
  "up to" sizes; the stated figure otherwise), docs.aws.amazon.com/ec2/latest/instancetypes/
  ac.html (accelerated computing), gp.html, mo.html, co.html. Every figure here equals
  Karpenter's scrape of those tables (aws/karpenter-provider-aws,
  pkg/providers/instancetype/zz_generated.bandwidth.go, August 2026).
- A pod's TCP is not the instance's bandwidth where the type has more than one network card
  (pod_nic_gbps): the figure above is then every card's, mostly EFA's RDMA, and the Amazon VPC
  CNI puts pods on network card 0 (amazon-vpc-cni-k8s: "The CNI plugin by default only
  manages network card 0", README, ENABLE_MULTI_NIC; v1.20.0 manages the others only with
  ENABLE_MULTI_NIC and a pod annotated `k8s.amazonaws.com/nicConfig: multi-nic-attachment`,
  neither of which this project renders: constructs/gpu_cluster.py VPC_CNI_CONFIGURATION,
  tests/k8s/test_charts.py; scripts/gen_vpc_ip_limits.go sizes a node's ENIs from the default
  card alone). So the verdict's worker NIC term is card 0's.
- ElastiCache: the "Supported node types" tables of the ElastiCache user guide (baseline and
  burst bandwidth) and the node types' memory (ElastiCache pricing / node type pages).
- What the in-cluster Valkey's node costs: Amazon EC2 On-Demand pricing (aws.amazon.com/ec2/
  pricing/on-demand, Linux, US East (N. Virginia)); an environment's `instanceHourlyUsd`
  states its own (another region, a discount).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

PER_FLOW_GBPS = 5.0

# Sustained Gbps of the EC2 types this project sizes: GPU workers and in-cluster cache nodes.
EC2_BASELINE_GBPS: dict[str, float] = {
    # GPU, every type config/instances.py GPU_SHAPES sizes (g4dn/g5/g6/gr6/g6e "up to" sizes at
    # their baseline)
    "g4dn.xlarge": 5.0, "g4dn.2xlarge": 10.0, "g4dn.4xlarge": 20.0, "g4dn.8xlarge": 50.0,
    "g4dn.12xlarge": 50.0, "g4dn.16xlarge": 50.0, "g4dn.metal": 100.0,
    "g5.xlarge": 2.5, "g5.2xlarge": 5.0, "g5.4xlarge": 10.0, "g5.8xlarge": 25.0,
    "g5.12xlarge": 40.0, "g5.16xlarge": 25.0, "g5.24xlarge": 50.0, "g5.48xlarge": 100.0,
    "g6.xlarge": 2.5, "g6.2xlarge": 5.0, "g6.4xlarge": 10.0, "g6.8xlarge": 25.0,
    "g6.12xlarge": 40.0, "g6.16xlarge": 25.0, "g6.24xlarge": 50.0, "g6.48xlarge": 100.0,
    "g6e.xlarge": 2.5, "g6e.2xlarge": 5.0, "g6e.4xlarge": 20.0, "g6e.8xlarge": 25.0,
    "g6e.12xlarge": 100.0, "g6e.16xlarge": 35.0, "g6e.24xlarge": 200.0, "g6e.48xlarge": 400.0,
    "p3.2xlarge": 2.5, "p3.8xlarge": 10.0, "p3.16xlarge": 25.0,
    "gr6.4xlarge": 10.0, "gr6.8xlarge": 25.0,
    "p3dn.24xlarge": 100.0, "p4d.24xlarge": 400.0, "p4de.24xlarge": 400.0,
    "p5.4xlarge": 100.0, "p5.48xlarge": 3200.0, "p5e.48xlarge": 3200.0, "p5en.48xlarge": 3200.0,
    "p6-b200.48xlarge": 3200.0, "p6-b300.48xlarge": 6400.0,
    # general purpose and memory optimized (system and cache nodes)
    "m6i.large": 0.781, "m6i.xlarge": 1.562, "m6i.2xlarge": 3.125, "m6i.4xlarge": 6.25,
    "m6i.8xlarge": 12.5, "m6i.12xlarge": 18.75, "m6i.16xlarge": 25.0, "m6i.24xlarge": 37.5,
    "m6i.32xlarge": 50.0,
    "r6i.large": 0.781, "r6i.xlarge": 1.562, "r6i.2xlarge": 3.125, "r6i.4xlarge": 6.25,
    "r6i.8xlarge": 12.5, "r6i.12xlarge": 18.75, "r6i.16xlarge": 25.0, "r6i.24xlarge": 37.5,
    "r6i.32xlarge": 50.0,
    "c6in.8xlarge": 50.0, "c6in.12xlarge": 75.0, "c6in.16xlarge": 100.0,
    "c6in.24xlarge": 150.0, "c6in.32xlarge": 200.0,
    "m6in.8xlarge": 50.0, "m6in.12xlarge": 75.0, "m6in.16xlarge": 100.0,
    "r6in.8xlarge": 50.0, "r6in.12xlarge": 75.0, "r6in.16xlarge": 100.0,
    "x2idn.16xlarge": 50.0, "x2idn.24xlarge": 75.0, "x2idn.32xlarge": 100.0,
    "x2iedn.24xlarge": 75.0, "x2iedn.32xlarge": 100.0,
}


class Card0(NamedTuple):
    """A type with more than one network card, and the sustained Gbps of card 0."""

    cards: int
    gbps: float


# Every type in EC2_BASELINE_GBPS with more than one network card: its card count from
# amazon-vpc-cni-k8s pkg/vpc/vpc_ip_resource_limit.go (generated from DescribeInstanceTypes;
# August 2026), which lists one card for every other type here. Card 0 at 100 Gbps for each,
# a bound rather than a published card figure where there is none:
# - c6in.32xlarge, g6e.24xlarge/48xlarge, p4d/p4de, p5/p5e: the instance's figure shared by its
#   cards, 100 Gbps each (200/2, 200/2, 400/4, 400/4, 3200/32; EC2 user guide "Maximize network
#   bandwidth on accelerated instances with EFA": P5/P5e up to 32 network cards and 3,200
#   Gbps, G6e up to 4 and 400), and an ENA interface "supports network speeds of up to 100
#   Gbps" (EC2 user guide, "Enhanced networking on Amazon EC2 instances").
# - p5en (3200 over 16 cards), p6-b200 (3200 over 8), p6-b300 (6400 over 17): no card-0 figure
#   we could read; the ENA interface's documented 100 Gbps, the same as p5's card 0, so the
#   verdict never counts more than one ENA interface is documented to carry (an L2 it then
#   refuses may still pay: kvCacheSpec.forceL2Cache).
MULTI_CARD: dict[str, Card0] = {
    "c6in.32xlarge": Card0(2, 100.0),
    "g6e.24xlarge": Card0(2, 100.0), "g6e.48xlarge": Card0(4, 100.0),
    "p4d.24xlarge": Card0(4, 100.0), "p4de.24xlarge": Card0(4, 100.0),
    "p5.48xlarge": Card0(32, 100.0), "p5e.48xlarge": Card0(32, 100.0),
    "p5en.48xlarge": Card0(16, 100.0),
    "p6-b200.48xlarge": Card0(8, 100.0), "p6-b300.48xlarge": Card0(17, 100.0),
}


class CacheHost(NamedTuple):
    """An EC2 type the in-cluster Valkey may have to itself."""

    type: str
    vcpus: int
    gib: int
    hourly_usd: float        # on demand, us-east-1 (module docstring)


# Nodes the in-cluster Valkey may get, cheapest first: k8s/l2.py takes the first offered in the
# region on which the L2 pays and holds what it must. x2iedn.16xlarge is left out: it costs
# what x2idn.32xlarge does for the same memory and half its network.
IN_CLUSTER_NODE_TYPES = (
    CacheHost("c6in.8xlarge", 32, 64, 1.8144), CacheHost("r6i.8xlarge", 32, 256, 2.016),
    CacheHost("r6i.16xlarge", 64, 512, 4.032), CacheHost("x2idn.16xlarge", 64, 1024, 6.669),
    CacheHost("r6i.32xlarge", 128, 1024, 8.064), CacheHost("x2idn.24xlarge", 96, 1536, 10.0035),
    CacheHost("x2idn.32xlarge", 128, 2048, 13.338),
    CacheHost("x2iedn.24xlarge", 96, 3072, 20.007),
    CacheHost("x2iedn.32xlarge", 128, 4096, 26.676))


def nic_gbps(instance_type: str) -> float:
    """A type this project sizes (a GPU worker, an in-cluster cache node) missing here is a
    gap in this table, not bad input (the files' types are checked against GPU_SHAPES and
    IN_CLUSTER_NODE_TYPES first): fail naming it rather than judge without its NIC."""
    try:
        return EC2_BASELINE_GBPS[instance_type]
    except KeyError:
        raise LookupError(f"{instance_type}: no sustained network bandwidth in "
                          "config/bandwidth.py EC2_BASELINE_GBPS, which the L2 verdict "
                          "(k8s/l2.py) needs for every type it sizes") from None


def pod_nic_gbps(instance_type: str) -> float:
    """What a pod's TCP on this type gets (module docstring): network card 0's where the type
    has more than one card (the VPC CNI puts pods there), the instance's otherwise."""
    total = nic_gbps(instance_type)
    card0 = MULTI_CARD.get(instance_type)
    return min(total, card0.gbps) if card0 else total


@dataclass(frozen=True)
class CacheNode:
    vcpus: int
    memory_gib: float
    baseline_gbps: float
    burst_gbps: float | None = None


_SIZES = ("large", "xlarge", "2xlarge", "4xlarge", "8xlarge", "12xlarge", "16xlarge")
_VCPUS = (2, 4, 8, 16, 32, 48, 64)
_R_GIB = (13.07, 26.32, 52.82, 105.81, 209.55, 317.77, 419.09)
_M_GIB = (6.38, 12.93, 26.04, 52.26, 103.68, 157.12, 209.55)
_G7_GBPS = ((0.937, 12.5), (1.876, 12.5), (3.75, 15.0), (7.5, 15.0), (15.0, None),
            (22.5, None), (30.0, None))
_G6_GBPS = ((0.75, 10.0), (1.25, 10.0), (2.5, 10.0), (5.0, 10.0), (12.0, None), (20.0, None),
            (25.0, None))


def _family(name: str, gib: tuple, gbps: tuple) -> dict[str, CacheNode]:
    return {f"cache.{name}.{size}": CacheNode(cpus, mem, base, burst)
            for size, cpus, mem, (base, burst) in zip(_SIZES, _VCPUS, gib, gbps)}


# Non-burstable ElastiCache node types with published sustained bandwidth. The t-families are
# left out on purpose: their CPU and network are credits, not capacity.
CACHE_NODES: dict[str, CacheNode] = {
    **_family("r7g", _R_GIB, _G7_GBPS), **_family("m7g", _M_GIB, _G7_GBPS),
    **_family("r6g", _R_GIB, _G6_GBPS), **_family("m6g", _M_GIB, _G6_GBPS),
}
# ElastiCache keeps 25% of a node's memory back by default (reserved-memory-percent).
ELASTICACHE_DATA_SHARE = 0.75


def cache_node(node_type: str) -> CacheNode | None:
    return CACHE_NODES.get(node_type)
