"""What an environment will run, said at the end of synth (app.py writes it to the cloud
assembly, `make synth` prints it): node groups, endpoints (replicas, GPUs, routing, L1, L2 and
why), the L2's own node or cluster, each router's load balancer and listener, and the hourly
cost at the region's on-demand prices in its currency (config/prices.py, or the environment's
own `instancePrices`). Read from the same config and verdicts the stacks are built from, so
the plan cannot say what the templates do not."""
from __future__ import annotations

from config import EnvironmentConfig
from config.contracts import ROUTER_PORT
from config.endpoint_spec import EndpointSpec, _gib
from config.notices import CHANGED, ack_id, kind_of
from config.prices import EKS_CLUSTER, NLB
from k8s.l2 import ELASTICACHE, IN_CLUSTER, OWN
from k8s.serving import (
    effective_scaling, fleet_replicas, generated_tls, idle_groups, in_cluster_node, l2_plan,
    vllm_memory_gib,
)
from k8s.workers import LIMITS_CPU, LIMITS_MEMORY, l1_budget, parallel_ranks
from stacks.app_builder import l2_needs

PLAN_FILE = "kvcache-plan.txt"   # in the cloud assembly, beside SUMMARY_FILE


def _group_line(name: str, types, lo: int, want: int, hi: int, gpus: int = 0) -> str:
    each = f", {gpus} GPU(s) each" if gpus else ""
    return f"    {name}: {', '.join(types)}, min {lo} / desired {want} / max {hi}{each}"


def _l2_line(cfg: EnvironmentConfig, s: EndpointSpec) -> str:
    plan = l2_plan(cfg, s)
    dropped = [w for w in s.warnings if kind_of(w) == CHANGED and ".kvCacheSpec." in w
               and ("no L2" in w or "no in-cluster L2" in w)]
    if plan is None:
        if dropped:
            return (f"none: dropped, {len(dropped)} change(s) to the request ("
                    + ", ".join(sorted({ack_id(w) for w in dropped})) + "; the warnings say why)")
        return "none (kvCacheSpec.enableL2Cache not set)"
    v = plan.verdict
    if plan.target == OWN:
        where = f"the endpoint's own, {s.l2_url}"
    elif plan.target == IN_CLUSTER:
        where = f"the in-cluster Valkey ({v.server.node_type if v.server else 'no node'})"
    else:
        where = f"ElastiCache ({cfg.cache.node_type})"
    need = f"{v.need_gbs:.2f}" if v.need_gbs is not None else "unknown"
    why = (f"reads {v.deliver_gbs:.2f} GB/s per GPU where recomputing a "
           f"{v.prefix_tokens}-token prefix moves {need}"
           + (", kvCacheSpec.forceL2Cache" if s.l2_forced else ""))
    return f"{where}: {why}"


def _listener(cfg: EnvironmentConfig, s: EndpointSpec) -> str:
    scheme = "internet-facing" if cfg.public_listener else "internal"
    where = ("in the node subnets at fixed addresses" if cfg.network.private_only
             else "in the load balancer subnets")
    if s.tls_certificate_arn or cfg.listener.certificate_arn:
        tls = "TLS at the load balancer (ACM certificate)"
    elif generated_tls(cfg, s):
        tls = "TCP, TLS at the router's front (a certificate made in the cluster)"
    else:
        tls = "TCP, plain HTTP (no TLS)"
    sources = ", ".join(cfg.listener.source_ranges) or (
        "anyone (no listener.sourceRanges)" if cfg.public_listener else "the VPC")
    return f"NLB {scheme} {where}, listener port {ROUTER_PORT}, {tls}; clients: {sources}"


def _replicas(cfg: EnvironmentConfig, s: EndpointSpec) -> str:
    if s.pd is not None:
        return (f"disaggregated: {s.pd.prefill.replicas} prefill x {s.pd.prefill.gpus} GPU(s), "
                f"{s.pd.decode.replicas} decode x {s.pd.decode.gpus} GPU(s)")
    scaling = effective_scaling(cfg, s)
    count, why = fleet_replicas(cfg, s)
    if scaling is None:
        return f"{count} replica(s) ({why})"
    return f"{scaling.min_replicas}-{count} replica(s) ({why})"


def plan_text(cfg: EnvironmentConfig, endpoints: tuple[EndpointSpec, ...]) -> str:
    prices = cfg.prices()
    lines = [f"kvcache plan: environment {cfg.name} ({cfg.region}, account {cfg.account})"]
    net = cfg.network
    lines.append("  network: " + (f"existing VPC {net.vpc_id}"
                                  + (" (private-only)" if net.private_only else "")
                                  if net.existing else f"a VPC of its own, {cfg.nat_gateways} "
                                  "NAT gateway(s)"))
    lines.append("  node groups:")
    groups = [cfg.system_nodes, *cfg.gpu_node_groups]
    low = high = 0.0
    idle = {g.name for g in idle_groups(cfg, endpoints)}
    for g in groups:
        lines.append(_group_line(g.name, g.instance_types, g.min_size, g.desired_size,
                                 g.max_size, g.gpus_per_node)
                     + (" (idle: no endpoint runs on it" + (
                         f"; {g.desired_size} node(s) billed for nothing)" if g.desired_size
                         else ")") if g.name in idle else ""))
        low += prices.cost(g.instance_types[0], g.desired_size)
        high += prices.cost(g.instance_types[0], g.max_size)
    node = in_cluster_node(cfg, endpoints)
    if node is not None:
        lines.append(_group_line("l2cache", [node.node_type], 1, 1, 1)
                     + " (the in-cluster Valkey's own node)")
        low += prices.cost(node.node_type, 1)
        high += prices.cost(node.node_type, 1)
    needs = l2_needs(cfg, endpoints)
    if needs.elasticache_shards:
        count = needs.elasticache_shards * (1 + cfg.cache.replicas)
        lines.append(f"  ElastiCache: {cfg.cache.engine} {cfg.cache.engine_version}, "
                     f"{needs.elasticache_shards} shard(s) x {1 + cfg.cache.replicas} node(s) "
                     f"of {cfg.cache.node_type}")
        low += prices.cost(cfg.cache.node_type, count)
        high += prices.cost(cfg.cache.node_type, count)
    if node is None and not needs.elasticache_shards:
        lines.append(f"  L2 node: none (cache.kind {cfg.cache.kind}: no endpoint's L2 is there)")
    for s in endpoints:
        strategy = s.routing_strategy
        budget = l1_budget(vllm_memory_gib(s), parallel_ranks(s.worker_args), s.l1_size_gib)
        l1 = f"on, {budget.l1_per_rank_gib:g} GiB per GPU process" if s.l1_enabled else "off"
        lines += [f"  endpoint {s.name} ({s.source_file}): {_replicas(cfg, s)}, {s.gpus} "
                  f"GPU(s) each on {s.instance_type}",
                  f"    routing {strategy} ({cfg.router_implementation(strategy)}); L1 {l1}",
                  *([f"    request limits: {s.request_limits.max_concurrent} at once per "
                     f"worker, {s.request_limits.max_queue} queued, then "
                     f"{s.request_limits.status}; their sidecar takes {LIMITS_CPU} "
                     f"CPU and {LIMITS_MEMORY} of the worker's request"]
                    if s.request_limits else []),
                  f"    L2: {_l2_line(cfg, s)}",
                  f"    load balancer: {_listener(cfg, s)}"]
    fixed = prices.cost(EKS_CLUSTER, 1) + prices.cost(NLB, len(endpoints))
    low, high = low + fixed, high + fixed
    cur = prices.currency
    counted = "EKS, instances, ElastiCache nodes, NLB hours; not NAT, LCUs, storage or traffic"
    if low == high == 0 and prices.unpriced:
        cost = f"  cost per hour, on demand in {cur}: unknown ({counted})"
    else:
        least = "at least " if prices.unpriced else ""
        cost = (f"  cost per hour, on demand in {cur}: {least}{low:,.2f} at the node groups' "
                f"desired sizes, {least}{high:,.2f} at their max ({counted})")
    if prices.unpriced:
        cost += (f"; no {cur} price for {', '.join(prices.unpriced)}: state them in the "
                 f"environment file's instancePrices (currency {cur}), or let `python -m "
                 "tools prices` write them from the AWS Price List Query API")
    lines.append(cost)
    lines.append("  prices: " + ("; ".join(prices.sources) if prices.sources
                                 else prices.table_source))
    return "\n".join(lines)

