"""The shared L2: whether it can pay, which of LMCache's connectors reaches it, and how big the
server behind it must be; decided at synth time from the model, the GPU and the network.

An L2 hit moves a token's KV from the L2 server instead of recomputing it, so it pays only
where the read is faster. Per GPU (every tensor-parallel rank reads its own shard of the KV and
computes its share of the FLOPs, so the balance does not depend on TP), recomputing runs at

    need = KV bytes per token x GPU TFLOPS x MFU / prefill FLOPs per token at the prefix length

bytes per second (config/models.py; MFU 0.6, what our H100 run measured; the prefix length is
the endpoint's `kvCacheSpec.prefixTokens`, default 8K). What an L2 delivers to one GPU is the
least of five terms:
- LMCache's client: its connections (native threads or GLIDE workers; redis.asyncio keeps one
  event loop) x the GET rate one connection moved here, and its GB per CPU-second x the cores
  it has (bench/lmcache_rates.py, bench/data/lmcache_rates.json);
- its TCP flows x 5 Gbps (one EC2 flow outside a placement group);
- the worker node's sustained NIC over its GPUs, all reading at once;
- the L2's sustained network (ElastiCache node baseline, or the in-cluster Valkey node's)
  x shards over every GPU of the endpoint's largest fleet, all reading at once;
- the L2 server's CPU: Valkey's GB per CPU-second for GET and SET x its threads x shards, every
  byte read having been written once, over the same GPUs.
An L2 is deployed only where that least term is at least MARGIN x need. It is sized for KV
too: it holds at least what the fleet's L1s hold together (an L2 smaller than them holds little
they do not). ElastiCache in cluster mode is given the shards that take; the in-cluster Valkey
the smallest node type that does.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from config.instances import gpu_model, gpu_shape
from config.models import ModelShape
from config.bandwidth import (
    CACHE_NODES, ELASTICACHE_DATA_SHARE, IN_CLUSTER_NODE_TYPES, PER_FLOW_GBPS, ec2_baseline_gbps,
)

LMCacheVersion = tuple[int, int, int]
MFU = 0.6
MARGIN = 2.0
DEFAULT_PREFIX_TOKENS = 8192
MIN_BLOCKING_TIMEOUT_S = 2


@dataclass(frozen=True)
class Connector:
    """One of LMCache's L2 connectors, with the rates measured for it (GET, the chunks of a
    tensor-parallel rank, against Valkey 9: bench/data/lmcache_rates.json)."""

    name: str
    scheme: str
    since: LMCacheVersion          # first LMCache release that has it (of those we read)
    connections: int               # per rank: native threads, GLIDE workers, executor slots
    client_threads: int            # threads that can burn CPU for it at once
    gbs_per_connection: float      # GB/s one connection moved (wall, loopback)
    client_gb_per_cpu_s: float     # GB per CPU-second of the client
    tls: bool
    cluster: bool
    batched: bool                  # one batched_get per retrieve (a timeout bounds it whole)
    needs_glide: bool = False
    measured: str = ""             # the row of bench/data/lmcache_rates.json

    def client_gbs(self, cores: float) -> float:
        return min(self.connections * self.gbs_per_connection,
                   self.client_gb_per_cpu_s * min(self.client_threads, max(cores, 1.0)))


# LMCache's connectors (read in LMCache 0.3.7 and 0.5.4, storage_backend/connector/):
# - redis:// / rediss:// (redis_adapter.py RedisConnectorAdapter, both releases): redis.asyncio
#   on one event loop, a get per chunk through AsyncPQExecutor's 4 workers, two keys per chunk
#   (kv_bytes, metadata); TLS with rediss://; no cluster.
# - resp:// (RESPConnectorAdapter, lmcache.lmcache_redis C++ client; not in 0.3.7): one key per
#   chunk read straight into the chunk's buffer on `resp_num_threads` (8) native threads, one
#   batched_get per retrieve; AUTH (extra_config password or LMCACHE_RESP_PASSWORD), no TLS,
#   one host:port (no cluster).
# - valkey:// (valkey_adapter.py, GLIDE sync: `valkey_num_workers` (8) threads each with its
#   own client; standalone or `valkey_mode: cluster`, `tls_enable`, `valkey_password`): needs
#   the `valkey-glide-sync` package, which the published images do not carry.
# Rates: the 8 MiB chunks of a rank of Llama-3.1-8B at TP 4, against Valkey 9, medians of 3
# (tests/k8s/test_tier_choice.py holds these to the rows named). One connection's GET where
# the row ran one; redis.asyncio's loop is one thread whatever its connections, so its row's
# rate is the loop's; over TLS the loop's CPU rate (the wall rate here was Redis 7's own TLS,
# 0.08 GB/s: its server CPU bound it).
REDIS = Connector("redis", "redis://", (0, 3, 7), 4, 1, 0.16, 1.06, tls=False, cluster=False,
                  batched=False, measured="redis@0.5.4/valkey/4c")
REDISS = Connector("rediss", "rediss://", (0, 3, 7), 4, 1, 0.16, 0.63, tls=True,
                   cluster=False, batched=False, measured="rediss@0.5.4/redis/4c")
RESP = Connector("resp", "resp://", (0, 3, 15), 8, 8, 1.94, 4.7, tls=False, cluster=False,
                 batched=True, measured="resp@0.5.4/valkey/1c")
VALKEY = Connector("valkey", "valkey://", (0, 4, 7), 8, 8, 1.04, 1.56, tls=True, cluster=True,
                   batched=True, needs_glide=True, measured="valkey@0.5.4/valkey/1c")
CONNECTORS = {c.name: c for c in (REDIS, REDISS, RESP, VALKEY)}

# Valkey 9's own cost per byte (GB per CPU-second, the same chunks): the median over every
# connector's run. A GET is served from the stored value without a copy; a SET is not.
SERVER_GET_GB_PER_CPU_S = 6.71
SERVER_SET_GB_PER_CPU_S = 1.68

IN_CLUSTER = "in-cluster"
ELASTICACHE = "elasticache"
OWN = "own"            # the endpoint's own l2CacheLocalUrl: a server we know nothing of


def connector_for(target: str, lmcache: LMCacheVersion | None, glide: bool) -> Connector:
    """The fastest connector the image's LMCache has for the L2 it reaches. An image whose
    LMCache release no record pins gets what every release we know has (redis://)."""
    version = lmcache or REDIS.since
    if target == IN_CLUSTER and version >= RESP.since:
        return RESP          # plain TCP inside the cluster, confined by NetworkPolicy
    if target == ELASTICACHE:
        if glide and version >= VALKEY.since:
            return VALKEY    # TLS + AUTH + cluster mode
        return REDISS        # TLS + AUTH, one shard (redis.asyncio cannot follow MOVED)
    return REDIS


@dataclass(frozen=True)
class L2Server:
    """What serves the L2: its node type, the sustained network and the threads of one node,
    and how many shards it may have."""

    target: str
    node_type: str
    gbps: float
    threads: int
    memory_gib: float              # per node, for KV
    max_shards: int = 1


VALKEY_IO_THREADS = 16  # at most: Valkey's io-threads on its own node, half its vCPUs


# Of a node's memory, what holds KV: the in-cluster Valkey's container (k8s/cache.py: all but
# 12% and 2 GiB) x maxmemory's 3/4; ElastiCache's reserved-memory-percent leaves 3/4.
IN_CLUSTER_DATA_SHARE = 0.88 * 0.75


def in_cluster_server(node_type: str, vcpus: int, gib: float) -> L2Server:
    return L2Server(IN_CLUSTER, node_type, ec2_baseline_gbps(node_type) or 0.0,
                    min(VALKEY_IO_THREADS, vcpus // 2), (gib - 2) * IN_CLUSTER_DATA_SHARE)


def elasticache_server(node_type: str, max_shards: int) -> L2Server:
    node = CACHE_NODES[node_type]
    return L2Server(ELASTICACHE, node_type, node.baseline_gbps, node.vcpus,
                    node.memory_gib * ELASTICACHE_DATA_SHARE, max_shards)


@dataclass(frozen=True)
class Term:
    what: str
    gbs: float           # per GPU


@dataclass(frozen=True)
class L2Verdict:
    instance_type: str
    gpu: str | None
    model: ModelShape
    model_assumed: bool
    prefix_tokens: int
    ranks: int
    replicas: int
    connector: Connector
    server: L2Server | None
    need_gbs: float | None          # per GPU: the read rate that only breaks even
    terms: tuple[Term, ...]
    capacity_gib: float = 0.0       # what the L2 must hold: the fleet's L1s together
    shards: int = 1
    client_side_gbs: float = 0.0    # per GPU: the least of the terms on the worker's side
    server_total_gbs: float | None = None   # the whole L2 (every shard), reads and writes

    @property
    def gpus_reading(self) -> int:
        return self.replicas * self.ranks

    @property
    def deliver_gbs(self) -> float:
        return min(t.gbs for t in self.terms)

    @property
    def binding(self) -> Term:
        return min(self.terms, key=lambda t: t.gbs)

    @property
    def holds(self) -> bool:
        return self.server is None or self.server.memory_gib * self.shards >= self.capacity_gib

    @property
    def pays(self) -> bool:
        """Unknown GPUs keep what the file asks (nothing to judge with)."""
        return self.need_gbs is None or self.deliver_gbs >= MARGIN * self.need_gbs

    @property
    def deploys(self) -> bool:
        """Fast enough, and big enough."""
        return self.pays and self.holds

    @property
    def blocking_timeout_s(self) -> int:
        """LMCache's `blocking_timeout_secs`: with a batched connector it bounds a whole
        retrieve, so it must outlast reading the prefix at the rate delivered (x MARGIN)."""
        if not self.connector.batched:
            return MIN_BLOCKING_TIMEOUT_S
        rank_bytes = self.prefix_tokens * self.model.kv_bytes_per_token / self.ranks
        return max(MIN_BLOCKING_TIMEOUT_S,
                   math.ceil(MARGIN * rank_bytes / (self.deliver_gbs * 1e9)))

    def explain(self) -> str:
        """Every term, the least marked, in one line (and the size, where it falls short)."""
        parts = []
        for t in self.terms:
            mark = " (the least)" if t is self.binding else ""
            parts.append(f"{t.what}: {t.gbs:.2f} GB/s{mark}")
        if not self.holds:
            parts.append(f"and it holds {self.server.memory_gib * self.shards:.0f} GiB of KV, "
                         f"less than the fleet's L1s ({self.capacity_gib:.0f} GiB)")
        return "; ".join(parts)


def break_even_gbs(model: ModelShape, tflops: float, prefix_tokens: int) -> float:
    """GB/s per GPU at which reading KV costs what recomputing it does."""
    tokens_s = tflops * 1e12 * MFU / model.prefill_flops_per_token(prefix_tokens)
    return model.kv_bytes_per_token * tokens_s / 1e9


def server_gbs(server: L2Server, shards: int) -> tuple[float, float]:
    """(network, CPU) GB/s of the whole L2: the nodes' sustained network, and what their
    threads move when each byte read was written once."""
    return (server.gbps / 8 * shards,
            server.threads * shards / (1 / SERVER_GET_GB_PER_CPU_S + 1 / SERVER_SET_GB_PER_CPU_S))


def _server_terms(server: L2Server, shards: int, gpus: int) -> list[Term]:
    """The L2 side, per GPU, with `gpus` reading at once."""
    net, cpu = (x / gpus for x in server_gbs(server, shards))
    return [Term(f"the L2's sustained network ({server.node_type}, {server.gbps:g} Gbps x "
                 f"{shards} shard{'s' if shards > 1 else ''}) over {gpus} GPUs", net),
            Term(f"the L2 server's CPU ({server.threads} threads x {shards} shard"
                 f"{'s' if shards > 1 else ''}, Valkey's GET {SERVER_GET_GB_PER_CPU_S:g} / SET "
                 f"{SERVER_SET_GB_PER_CPU_S:g} GB per CPU-second, each byte read written "
                 f"once) over {gpus} GPUs", cpu)]


def l2_verdict(*, instance_type: str, model: ModelShape, ranks: int, replicas: int,
               connector: Connector, server: L2Server | None,
               prefix_tokens: int = DEFAULT_PREFIX_TOKENS, cpu_per_rank: float = 4.0,
               model_assumed: bool = False, capacity_gib: float = 0.0) -> L2Verdict:
    """Whether reading a token's KV from the L2 beats recomputing it with MARGIN to spare, for
    `replicas` replicas of `ranks` GPU processes reading at once (module docstring). With a
    server that may shard, the fewest shards that let it pay (or all of them)."""
    known = gpu_model(instance_type)
    need = break_even_gbs(model, known[1], prefix_tokens) if known else None
    shape = gpu_shape(instance_type)
    gpus_per_node = shape.gpus if shape else ranks
    nic = ec2_baseline_gbps(instance_type)
    gpus = replicas * ranks
    flows = connector.connections
    client = [Term(f"LMCache's {connector.scheme} client ({connector.connections} connections "
                   f"x {connector.gbs_per_connection:g} GB/s, {connector.client_gb_per_cpu_s:g}"
                   f" GB per CPU-second)", connector.client_gbs(cpu_per_rank / 2))]
    if nic:
        client.append(Term(f"the worker's NIC ({instance_type}, {nic:g} Gbps) over its "
                           f"{gpus_per_node} GPUs", nic / 8 / gpus_per_node))
    verdict = None
    max_shards = server.max_shards if server and connector.cluster else 1
    for shards in range(1, max_shards + 1):
        terms = client + [Term(f"{flows * (shards if connector.cluster else 1)} TCP flows x "
                               f"{PER_FLOW_GBPS:g} Gbps",
                               flows * (shards if connector.cluster else 1) * PER_FLOW_GBPS / 8)]
        client_side = min(t.gbs for t in terms)
        total = None
        if server is not None:
            terms += _server_terms(server, shards, gpus)
            total = min(server_gbs(server, shards))
        verdict = L2Verdict(instance_type, known[0] if known else None, model, model_assumed,
                            prefix_tokens, ranks, replicas, connector, server, need,
                            tuple(terms), capacity_gib, shards, client_side, total)
        if verdict.pays and verdict.holds:
            break
    assert verdict is not None
    return verdict


def choose_in_cluster(offered: frozenset[str], pinned: str | None, **verdict_args: Any
                      ) -> L2Verdict:
    """The in-cluster Valkey on the smallest node type (offered in the region) that lets the
    L2 pay, or on the largest where none does; `pinned`: the environment's choice."""
    candidates = [n for n in IN_CLUSTER_NODE_TYPES if n[0] in offered and (not pinned
                                                                      or n[0] == pinned)]
    if pinned and not candidates:
        raise ValueError(pinned)
    verdict = None
    for node_type, vcpus, gib in candidates:
        verdict = l2_verdict(server=in_cluster_server(node_type, vcpus, gib), **verdict_args)
        if verdict.pays and verdict.holds:
            return verdict
    if verdict is None:   # nothing offered: judge the client side alone, on a node of 0 Gbps
        verdict = l2_verdict(server=L2Server(IN_CLUSTER, "none offered", 0.0, 1, 0.0),
                             **verdict_args)
    return verdict


def with_server(v: L2Verdict, server: L2Server) -> L2Verdict:
    return replace(v, server=server)
