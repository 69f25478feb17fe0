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
- the worker pod's sustained NIC over the node's GPUs, all reading at once: network card 0's
  where the type has several, since the VPC CNI puts pods there (config/bandwidth.py
  pod_nic_gbps);
- the L2's sustained network (ElastiCache node baseline, or the in-cluster Valkey node's)
  x shards over every GPU of the endpoint's largest fleet, all reading at once;
- the L2 server's CPU: Valkey's GB per CPU-second for GET and SET x its threads x shards, every
  byte read having been written once, over the same GPUs.
An L2 is deployed only where that least term is at least MARGIN x need.

How much it must hold follows from what it is for: KV the fleet's GPUs and L1s do not hold.
- It is inclusive. LMCache writes every chunk it computes to every tier and reads the L2 only
  after the GPU's prefix cache and its L1 missed, so the L2 holds a copy of what the fleet
  holds, and a hit upstairs never touches the L2's LRU order (LMCache sets no TTL; Valkey
  evicts `allkeys-lru`). Under prefix-aware routing each document lives in one replica's GPU
  + L1, so the fleet holds up to F = replicas x (GPU KV + L1) of distinct KV, and an L2 no
  larger than F adds next to nothing: what it adds is what it holds beyond F.
- A reused chunk survives in an LRU as long as less than its capacity of other chunks was
  written or read since it was last touched. A chunk of the working set W (the distinct
  prefixes clients come back to) is touched in the L2 when it is computed or read from it; it
  then serves from a replica's GPU + L1, unseen by the L2, until that replica has moved up to
  its own GPU + L1 of other KV through; meanwhile the fleet writes what it computes (up to F,
  one-time prompts included) to the L2. So the L2 keeps W across that stretch when it holds
  W + F. The rule: capacity = W + F, where W is the endpoint's `kvCacheSpec.workingSetTokens`
  (x the model's KV per token) or, unstated, F: the smallest working set for which an L2 adds
  anything under prefix-aware routing. An L2 twice the fleet's GPU + L1 by default.
- In Valkey's terms: `used_memory`, which `maxmemory` bounds, counts jemalloc's size class of
  each value, and a chunk's value is a power of two for most models (256 tokens x KV per token
  / TP: 8 MiB for Llama-3.1-8B at TP 4), so it takes the next class: 10 MiB, 1.25x
  (`valkey_value_bytes`; measured on Redis 7 and jemalloc 5.3, which Valkey 9 builds with too:
  tests/k8s/test_tier_choice.py).
ElastiCache in cluster mode is given the fewest shards that pay and hold that; the in-cluster
Valkey the cheapest node type that does (config/bandwidth.py IN_CLUSTER_NODE_TYPES).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from config.instances import gpu_model, gpu_shape
from config.models import ModelShape
from k8s.cache import container_gib, maxmemory_mib
from config.bandwidth import (
    CACHE_NODES, ELASTICACHE_DATA_SHARE, IN_CLUSTER_NODE_TYPES, PER_FLOW_GBPS, CacheHost,
    nic_gbps, pod_nic_gbps,
)

LMCacheVersion = tuple[int, int, int]
MFU = 0.6
MARGIN = 2.0
DEFAULT_PREFIX_TOKENS = 8192
MIN_BLOCKING_TIMEOUT_S = 2
GIB = 1024 ** 3
GPU_MEMORY_UTILIZATION = 0.9   # vLLM's default --gpu-memory-utilization
SDS_OVERHEAD = 10              # a value's sds header (sdshdr32: len, alloc, flags) and its NUL


def valkey_value_bytes(value: int) -> int:
    """What Valkey's `used_memory` counts for a value of `value` bytes: jemalloc's size class
    of the value and its sds header. Up to 64 bytes classes are 16 apart; past that jemalloc
    has four per doubling (2^k x 1.25, 1.5, 1.75, 2), so a value of exactly 2^k bytes (and
    its header) takes 1.25 x 2^k."""
    size = value + SDS_OVERHEAD
    if size <= 64:
        return -(-size // 16) * 16
    step = 1 << ((size - 1).bit_length() - 3)
    return -(-size // step) * step


def gpu_kv_gib(instance_type: str, model: ModelShape, ranks: int,
               utilization: float = GPU_MEMORY_UTILIZATION) -> float:
    """KV one replica's GPUs hold: vLLM's share of their memory less the weights (activations
    left out: a little more KV than vLLM logs, so the L2 is sized no smaller)."""
    shape = gpu_shape(instance_type)
    if shape is None:
        return 0.0
    return max(0.0, ranks * shape.gpu_memory_gib * utilization
               - model.weight_bytes / GIB)


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
    # the extra_config key its adapter reads a password from (None: the URL carries it)
    password_key: str | None = None

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
                 batched=True, measured="resp@0.5.4/valkey/1c", password_key="password")
VALKEY = Connector("valkey", "valkey://", (0, 4, 7), 8, 8, 1.04, 1.56, tls=True, cluster=True,
                   batched=True, needs_glide=True, measured="valkey@0.5.4/valkey/1c",
                   password_key="valkey_password")
CONNECTORS = {c.name: c for c in (REDIS, REDISS, RESP, VALKEY)}

# Valkey 9's own cost per byte (GB per CPU-second, the same chunks): the median over every
# connector's run. A GET is served from the stored value without a copy; a SET is not.
SERVER_GET_GB_PER_CPU_S = 6.71
SERVER_SET_GB_PER_CPU_S = 1.68

IN_CLUSTER = "in-cluster"
ELASTICACHE = "elasticache"
OWN = "own"            # the endpoint's own l2CacheLocalUrl: a server we know nothing of


# What the L2 client's fault drill found (tests/k8s/l2_client_drill.py: LMCache's own
# RemoteBackend, built from the lmcache.yaml we render, against a Redis server that evicts,
# stops and starts again; tests/k8s/test_l2_client_faults.py holds this table to what the drill
# finds for every release an image with an L2 carries). A connector listed for a release reads
# no in-cluster L2 for it; the reasons are the upstream reports' (docs/upstream.md).
CLIENT_FAULTS: dict[tuple[str, LMCacheVersion], str] = {
    ("resp", (0, 5, 4)): (
        "resp:// returns a chunk whose read failed (the server gone after the lookup) as a "
        "hit holding its buffer's old bytes (wrong text, HTTP 200), waits forever on a chunk "
        "evicted after the lookup, and never reconnects"),
    ("redis", (0, 5, 4)): (
        "redis:// loses its executor's workers to a read cut short (the server gone, or "
        "slower than blocking_timeout_secs), after which its lookups never return"),
}


def in_cluster_candidates(lmcache: LMCacheVersion | None) -> list[Connector]:
    """The connectors the image's LMCache has for the in-cluster Valkey, fastest first."""
    version = lmcache or REDIS.since
    return [c for c in (RESP, REDIS) if version >= c.since]


def in_cluster_refusal(lmcache: LMCacheVersion | None) -> str | None:
    """Why the image's LMCache may not read the in-cluster Valkey: every connector it has for
    it fails the fault drill (CLIENT_FAULTS); None where one passes or the release is unknown
    (an unknown release gets no L2 anyway: k8s/workers.py l2_refusal)."""
    if lmcache is None:
        return None
    faults = [CLIENT_FAULTS.get((c.name, lmcache)) for c in in_cluster_candidates(lmcache)]
    if all(faults):
        return "; ".join(f for f in faults if f)
    return None


def connector_for(target: str, lmcache: LMCacheVersion | None, glide: bool) -> Connector:
    """The fastest connector the image's LMCache has for the L2 it reaches. An image whose
    LMCache release no record pins gets what every release we know has (redis://). In the
    cluster, the fastest that passes the fault drill (CLIENT_FAULTS); where none does (synth
    then deploys no in-cluster L2: in_cluster_refusal), the fastest, for the verdict's rates."""
    if target == IN_CLUSTER:
        candidates = in_cluster_candidates(lmcache)
        sound = [c for c in candidates if lmcache is None
                 or (c.name, lmcache) not in CLIENT_FAULTS]
        return (sound or candidates)[0]   # plain TCP inside the cluster, confined by NetworkPolicy
    version = lmcache or REDIS.since
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


def in_cluster_server(node_type: str, vcpus: int, gib: float) -> L2Server:
    """The in-cluster Valkey on a node of its own, with the maxmemory k8s/cache.py renders
    (ElastiCache's reserved-memory-percent leaves 3/4 of its nodes: ELASTICACHE_DATA_SHARE),
    and what its pod's NIC carries (a pod, so network card 0's: config/bandwidth.py)."""
    return L2Server(IN_CLUSTER, node_type, pod_nic_gbps(node_type),
                    min(VALKEY_IO_THREADS, vcpus // 2), maxmemory_mib(container_gib(gib)) / 1024)


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
    prefix_tokens: int
    ranks: int
    replicas: int
    connector: Connector
    server: L2Server | None
    need_gbs: float | None          # per GPU: the read rate that only breaks even
    terms: tuple[Term, ...]
    fleet_gib: float = 0.0          # F: the fleet's GPU KV and L1s together
    working_set_gib: float | None = None    # W: kvCacheSpec.workingSetTokens x KV per token
    value_overhead: float = 1.0     # Valkey's used_memory per byte of a chunk's value
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
    def capacity_gib(self) -> float:
        """KV the L2 must hold (module docstring): the working set, F where unstated, plus F."""
        return (self.fleet_gib if self.working_set_gib is None else self.working_set_gib) \
            + self.fleet_gib

    @property
    def kv_gib(self) -> float:
        """KV the server holds: its maxmemory over what Valkey counts per byte of a chunk."""
        if self.server is None:
            return math.inf
        return self.server.memory_gib * self.shards / self.value_overhead

    @property
    def holds(self) -> bool:
        return self.kv_gib >= self.capacity_gib

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
            parts.append(f"and it holds {self.kv_gib:.0f} GiB of KV, less than it must: "
                         f"{self.size_reason()}")
        return "; ".join(parts)

    def size_reason(self) -> str:
        w = (f"the working set {self.working_set_gib:,.0f} GiB (kvCacheSpec.workingSetTokens)"
             if self.working_set_gib is not None else
             "unstated (kvCacheSpec.workingSetTokens), taken as F")
        return (f"{self.capacity_gib:,.0f} GiB = {w} + F, the fleet's GPU KV and L1s "
                f"({self.fleet_gib:,.0f} GiB), Valkey counting {self.value_overhead:.2f}x per "
                "chunk")


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
               fleet_gib: float = 0.0,
               working_set_gib: float | None = None, chunk_tokens: int = 256) -> L2Verdict:
    """Whether reading a token's KV from the L2 beats recomputing it with MARGIN to spare, for
    `replicas` replicas of `ranks` GPU processes reading at once, and whether the L2 holds
    what it must (module docstring). With a server that may shard, the fewest shards that let
    it pay and hold (or all of them)."""
    value = chunk_tokens * model.kv_bytes_per_token // ranks
    overhead = valkey_value_bytes(value) / value
    known = gpu_model(instance_type)
    need = break_even_gbs(model, known[1], prefix_tokens) if known else None
    shape = gpu_shape(instance_type)
    gpus_per_node = shape.gpus if shape else ranks
    # every type we judge has a NIC (config/bandwidth.py raises naming one that has not);
    # only a type we neither size nor judge, whose verdict keeps what the file asks, has none
    nic = pod_nic_gbps(instance_type) if shape or known else None
    gpus = replicas * ranks
    client = [Term(f"LMCache's {connector.scheme} client ({connector.connections} connections "
                   f"x {connector.gbs_per_connection:g} GB/s, {connector.client_gb_per_cpu_s:g}"
                   f" GB per CPU-second)", connector.client_gbs(cpu_per_rank / 2))]
    if nic is not None:
        total = nic_gbps(instance_type)
        card = f": network card 0 of its {total:g}" if nic < total else ""
        client.append(Term(f"the worker's NIC ({instance_type}, {nic:g} Gbps{card}) over its "
                           f"{gpus_per_node} GPUs", nic / 8 / gpus_per_node))
    verdict = None
    max_shards = server.max_shards if server and connector.cluster else 1
    for shards in range(1, max_shards + 1):
        flows = connector.connections * shards   # a shard only where the connector clusters
        terms = client + [Term(f"{flows} TCP flows x {PER_FLOW_GBPS:g} Gbps",
                               flows * PER_FLOW_GBPS / 8)]
        client_side = min(t.gbs for t in terms)
        total = None
        if server is not None:
            terms += _server_terms(server, shards, gpus)
            total = min(server_gbs(server, shards))
        verdict = L2Verdict(instance_type, known[0] if known else None, model,
                            prefix_tokens, ranks, replicas, connector, server, need,
                            tuple(terms), fleet_gib, working_set_gib, overhead, shards,
                            client_side, total)
        if verdict.pays and verdict.holds:
            break
    assert verdict is not None
    return verdict


def choose_in_cluster(offered: frozenset[str], pinned: str | None, **verdict_args: Any
                      ) -> L2Verdict:
    """The in-cluster Valkey on the cheapest node type (offered in the region) on which the L2
    pays and holds what it must; where none does, the one that reads fastest of those that
    hold it (what kvCacheSpec.forceL2Cache gets), or the largest; `pinned`: the environment's
    choice."""
    candidates = [n for n in IN_CLUSTER_NODE_TYPES if n.type in offered and (not pinned
                                                                        or n.type == pinned)]
    if pinned and not candidates:
        raise ValueError(pinned)
    verdicts = []
    for node in candidates:
        verdict = l2_verdict(server=in_cluster_server(node.type, node.vcpus, node.gib),
                             **verdict_args)
        if verdict.pays and verdict.holds:
            return verdict
        verdicts.append(verdict)
    if not verdicts:   # nothing offered: judge the client side alone, on a node of 0 Gbps
        return l2_verdict(server=L2Server(IN_CLUSTER, "none offered", 0.0, 1, 0.0),
                          **verdict_args)
    holding = [v for v in verdicts if v.holds]
    return max(holding, key=lambda v: v.deliver_gbs) if holding else verdicts[-1]


def in_cluster_host(node_type: str) -> CacheHost | None:
    """The in-cluster node type's row of config/bandwidth.py IN_CLUSTER_NODE_TYPES."""
    return next((n for n in IN_CLUSTER_NODE_TYPES if n.type == node_type), None)


def node_hourly_usd(node_type: str) -> float | None:
    """The in-cluster node's published on-demand price (config/bandwidth.py)."""
    host = in_cluster_host(node_type)
    return host.hourly_usd if host else None
