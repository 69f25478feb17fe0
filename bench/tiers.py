"""LMCache's L1 and L2 tiers in the emulated worker, as LMCache 0.5.x does them.

Why: the tiered cache is half of what the project promises, and on real vLLM the configuration
we rendered made everything slower (bench/data/h100_vllm_0_24.json): each
prefill queued its whole KV to L2 over one socket per worker at ~0.5 GB/s, the next lookup
waited behind those writes until `lookup_timeout_ms`, and each timeout stalled the engine
~1.2 s. A model that cannot reproduce that cannot judge a new configuration either.

What is modelled (LMCache 0.5.x code: `lmcache/v1/cache_engine.py`, `storage_backend/`,
`lookup_client/`, `health_monitor/`):
- Chunks of `chunk_size` tokens, keyed by a hash chained over the prefix (the same key on every
  worker, as `PYTHONHASHSEED=0` makes it); only full chunks unless `save_unfull_chunk`.
- Lookup at scheduling, over the whole prompt, chunk by chunk: L1 (this worker's CPU memory),
  then L2 (shared by the endpoint), stopping at the first miss. With the synchronous lookup
  client (LMCache's default) the scheduler waits for it: the whole engine stalls; past
  `lookup_timeout_ms` the lookup returns 0 and the ZMQ socket is recreated (measured: ~1.2 s
  stall at 1,000 ms). `enable_async_loading`: the request waits, the engine does not.
- Retrieve (the tokens LMCache has beyond the GPU prefix cache): L2 chunks are fetched (a
  blocking get, bounded by `blocking_timeout_secs`) and promoted into L1, then everything is
  copied CPU->GPU before the step's forward: the step takes that long.
- Lookup cost at scheduling: hashing the prompt's chunks and one ZMQ round trip to the
  worker's lookup server, as LMCache 0.5.4's own classes took on this machine
  (bench/lmcache_rates.py: 0.16 ms at 2K, 0.25 ms at 8K, 1.2 ms at 64K tokens).
- Store on compute: every newly computed full chunk is copied GPU->CPU at the end of its step
  (`wait_for_save` calls `LMCacheEngine.store` synchronously, integration/vllm/
  vllm_v1_adapter.py: the step takes that long; measured 10.4 ms per ~2K tokens on the H100),
  or with `use_layerwise` layer by layer beside the forward, the step waiting for the last
  layer and what the compute cannot hide (`pipelined`); loads pipeline the same way. Kept in
  L1 (LRU), and queued for L2. A chunk waiting for its L2
  write is pinned in L1; when L1 holds nothing evictable, allocation fails and the rest of
  that store is dropped (LMCache logs "Failed to allocate memory block").
- The L2 connection per worker (and per TP rank; ranks move in lockstep, so one stands for
  all): `lm://` is ONE socket under one asyncio lock for puts, gets and exists, FIFO, so a
  lookup waits behind queued writes; `redis://`/`valkey://` run on a pool through a priority
  executor of 4 workers (redis_connector.py, job_executor/pq_executor.py): an EXISTS or a GET
  goes ahead of every queued PUT and waits at most for a chunk already on the wire. Rates:
  LMCache's client measured here for the chunk size of the model and TP (redis.asyncio with
  redis-py's pure-Python parser, bench/data/lmcache_rates.json), capped by the network (AWS:
  5 Gbps per flow outside a placement group; the redis executor runs 4 flows), and the L2
  server shared: a transfer gets at most the server's rate (one Valkey thread, measured, or
  its node's NIC) over every busy connection.
- The L2 itself: a real redis-server on 127.0.0.1 holds the index (one key per chunk, its value
  the chunk's size divided by `SCALE`, `maxmemory` the cache's bound divided by `SCALE`), so
  Valkey's own LRU evicts and a drill can kill it. LMCache's own server (`lm://`) has no
  eviction: it grows until its pod's memory limit, then is OOM-killed and comes back empty.
- LMCache's health monitor: a ping every `ping_interval`; `get_blocking_failed_threshold` failed
  gets in an interval take L2 out for `waiting_time_for_recovery`. `fallback_policy:
  local_cpu` bypasses L2 and keeps L1 (the gauge `lmcache:lmcache_is_healthy` stays 1, as in
  LMCache); `recompute` marks LMCache unhealthy (0) and skips every LMCache operation.
"""
from __future__ import annotations

import collections
import functools
import heapq
import json
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Sequence

from bench.fake_worker import _Histogram

GIB = 1024 ** 3
SCALE = 1024           # L2 index value bytes = chunk bytes / SCALE
REMOTE_MS_BUCKETS = (1, 5, 10, 20, 40, 60, 80, 100, 250, 500, 750, 1000, 2500, 5000, 7500,
                     10000)   # lmcache/observability.py, remote_time_to_get/put
PER_FLOW_GBS = 5 / 8   # AWS: 5 Gbps per TCP flow between instances outside a placement group

# Measured figures the tiers rest on (bench/data/h100_vllm_0_24.json, "lmcache" section, and
# bench/data/lmcache_rates.json, measured here by bench/lmcache_rates.py).
LM_SERVER_PUT_GBS = 0.5        # lm:// puts per socket (remote_time_to_put: 67 ms per 33.5 MB)
LM_SERVER_GET_GBS = 2.9        # lm:// gets (15.1 GB read in 55 gets of 95.6 ms)
RATES_FILE = Path(__file__).parent / "data" / "lmcache_rates.json"
RTT_S = 0.0005                 # one in-VPC round trip (+ a small command)
SOCKET_RECREATE_S = 0.2        # a timed-out lookup stalled ~1.2 s at lookup_timeout_ms 1000
# LMCache's CPU<->GPU copy rates: per release, from the profile (bench.emulator
# LMCACHE_RELEASES, GpuProfile.lmcache_release)
REFUSED_S = 0.001              # an op against a dead L2 (its Service has no endpoint: refused)
L2_RESTART_S = 20.0            # an OOM-killed lmcache_server pod back (container restart)


@functools.lru_cache(maxsize=1)
def measured_rates() -> dict:
    return json.loads(RATES_FILE.read_text())


def lookup_seconds(tokens: int) -> float:
    """LMCache's scheduler-side lookup of a prompt (hash its chunks, one ZMQ round trip to the
    worker's lookup server): the line through what bench/lmcache_rates.py measured with
    LMCache 0.5.4's own classes."""
    cells = sorted(measured_rates()["clients"]["lookup"]["cells"].values(),
                   key=lambda c: c["prompt_tokens"])
    (n0, t0), (n1, t1) = [(c["prompt_tokens"], c["lookup_ms_median"] / 1e3)
                          for c in (cells[0], cells[-1])]
    slope = (t1 - t0) / (n1 - n0)
    return t0 + slope * (tokens - n0)


# LMCache config keys and what the model does with them. A key in neither set is an error:
# a configuration the model cannot judge must not be judged.
MODELLED = {"chunk_size", "local_cpu", "max_local_cpu_size", "remote_url", "save_unfull_chunk",
            "save_decode_cache", "blocking_timeout_secs", "lookup_timeout_ms",
            "enable_async_loading", "extra_config", "min_retrieve_tokens", "local_disk",
            "max_local_disk_size", "cache_policy", "use_layerwise"}
NO_TIMING_EFFECT = {"remote_serde", "lmcache_instance_id", "py_enable_gc", "numa_mode",
                    "pre_caching_hash_algorithm", "local_cpu_use_hugepages",
                    "reserve_local_cpu_size", "internal_api_server_enabled",
                    "enable_controller", "enable_kv_events", "enable_lazy_memory_allocator"}
EXTRA_MODELLED = {"fallback_policy", "ping_interval", "ping_timeout",
                  "get_blocking_failed_threshold", "waiting_time_for_recovery",
                  "lookup_backoff_time",
                  # the connector's: its rates come with the L2 verdict (k8s/l2.py)
                  "resp_num_threads", "valkey_num_workers", "save_chunk_meta", "tls_enable",
                  "valkey_mode"}


class L2Down(Exception):
    """The L2 store did not answer (connection refused or reset)."""


@dataclass(frozen=True)
class TierConfig:
    """What the emulated LMCache does: read from the LMCache config we render
    (`from_lmcache`), the L2 we deploy, and the measured rates above."""

    chunk_size: int = 256
    l1_gib: float = 0.0                  # per TP rank (LMCache allocates it per rank)
    l2: str | None = None                # "lm", "redis" or None
    l2_capacity_gib: float | None = None     # eviction bound (Valkey maxmemory); None: none
    l2_memory_limit_gib: float | None = None  # the L2 pod's memory limit (OOM kill)
    lookup_timeout_s: float = 3.0        # LMCache default lookup_timeout_ms 3000
    blocking_timeout_s: float = 10.0
    async_lookup: bool = False
    save_unfull_chunk: bool = False
    save_decode_cache: bool = False
    min_retrieve_tokens: int = 0
    fallback: str = "recompute"
    ping_interval_s: float = 30.0
    ping_timeout_s: float = 5.0
    get_failed_threshold: int = 10
    recovery_wait_s: float = 300.0
    put_gbs: float = 0.0                 # per connection, network cap included
    get_gbs: float = 0.0
    server_gbs: float = 0.0              # the L2 server's own bound, shared by every connection
    layerwise: bool = False              # use_layerwise: per-layer stores and loads, pipelined
    batched: bool = False                # one batched_get per retrieve: the timeout bounds it
    scheme: str = ""                     # remote_url's scheme (redis, rediss, resp, valkey, lm)
    cpu_to_gpu_gbs: float | None = None  # None: the profile's LMCache release's rate
    label: str = ""

    @property
    def enabled(self) -> bool:
        return self.l1_gib > 0 or self.l2 is not None

    @classmethod
    def from_lmcache(cls, cfg: dict, *, l2_capacity_gib: float | None = None,
                     l2_memory_limit_gib: float | None = None, l2_url: str | None = None,
                     network_gbs: float | None = None, label: str = "",
                     rank_chunk_bytes: int = 256 * 131072, verdict: Any = None
                     ) -> "TierConfig":
        """From LMCache's config keys (the ConfigMap `k8s/workers.py` renders). `l2_url`: where
        the URL is only known at pod start (a secret appended to it). `rank_chunk_bytes`: what
        one rank stores per chunk (the model's KV per token x chunk / TP), which picks the
        measured client rates (default: Llama-3.1-8B on one GPU)."""
        unknown = sorted(set(cfg) - MODELLED - NO_TIMING_EFFECT)
        if unknown:
            raise ValueError(f"LMCache config key(s) the emulator does not model: "
                             f"{', '.join(unknown)} (bench/tiers.py MODELLED)")
        extra = dict(cfg.get("extra_config") or {})
        unknown = sorted(set(extra) - EXTRA_MODELLED)
        if unknown:
            raise ValueError(f"LMCache extra_config key(s) the emulator does not model: "
                             f"{', '.join(unknown)}")
        for key, ok in (("local_disk", lambda v: not v), ("max_local_disk_size", lambda v: not v),
                        ("cache_policy", lambda v: v in (None, "LRU"))):
            if key in cfg and not ok(cfg[key]):
                raise ValueError(f"LMCache {key} = {cfg[key]!r} is not modelled")
        url = cfg.get("remote_url") or l2_url
        kind = None
        if url:
            scheme = url.split("://", 1)[0]
            kind = {"lm": "lm", "redis": "redis", "rediss": "redis", "resp": "redis",
                    "valkey": "redis"}.get(scheme)
            if kind is None:
                raise ValueError(f"LMCache remote_url scheme {scheme!r} is not modelled")
        net = network_gbs if network_gbs is not None else PER_FLOW_GBS
        layerwise = bool(cfg.get("use_layerwise", False))
        if layerwise and kind:
            # 0.3.7 retrieve_layer reads L1 only (storage_manager.layerwise_batched_get:
            # location None -> LocalCPUBackend); 0.5.4 asserts that every chunk of a layerwise
            # retrieve comes from one location (cache_engine.py retrieve_layer). k8s/workers.py
            # renders use_layerwise only without an L2.
            raise ValueError("LMCache use_layerwise with an L2 is not modelled (LMCache "
                             "retrieves layerwise from one location only)")
        server = 0.0
        batched = False
        if kind == "lm":     # one socket: one flow
            put, get = min(LM_SERVER_PUT_GBS, net), min(LM_SERVER_GET_GBS, net)
        elif verdict is not None and kind:
            # the connector, flows and NIC per rank, and the whole L2 shared by every busy
            # rank: the terms of the synth-time verdict (k8s/l2.py), from the same rates
            put = get = verdict.client_side_gbs
            server = verdict.server_total_gbs or 0.0
            batched = verdict.connector.batched
        elif kind:
            # no verdict at hand (a configuration judged alone): the connector's measured
            # client rate over its flows, and no bound of the server's
            from k8s.l2 import CONNECTORS

            c = CONNECTORS[{"redis": "redis", "rediss": "rediss", "resp": "resp",
                            "valkey": "valkey"}[scheme]]
            put = get = min(c.client_gbs(4.0), c.connections * net)
            batched = c.batched
        l1 = float(cfg.get("max_local_cpu_size", 5.0)) if cfg.get("local_cpu", True) else 0.0
        return cls(
            chunk_size=int(cfg.get("chunk_size", 256)), l1_gib=l1, l2=kind,
            l2_capacity_gib=l2_capacity_gib if kind == "redis" else None,
            l2_memory_limit_gib=l2_memory_limit_gib,
            lookup_timeout_s=float(cfg.get("lookup_timeout_ms", 3000)) / 1000,
            blocking_timeout_s=float(cfg.get("blocking_timeout_secs", 10)),
            async_lookup=bool(cfg.get("enable_async_loading", False)),
            save_unfull_chunk=bool(cfg.get("save_unfull_chunk", False)),
            save_decode_cache=bool(cfg.get("save_decode_cache", False)),
            min_retrieve_tokens=int(cfg.get("min_retrieve_tokens", 0) or 0),
            fallback=str(extra.get("fallback_policy", "recompute")),
            ping_interval_s=float(extra.get("ping_interval", 30.0)),
            ping_timeout_s=float(extra.get("ping_timeout", 5.0)),
            get_failed_threshold=int(extra.get("get_blocking_failed_threshold", 10)),
            recovery_wait_s=float(extra.get("waiting_time_for_recovery", 300.0)),
            put_gbs=put if kind else 0.0, get_gbs=get if kind else 0.0,
            server_gbs=server if kind else 0.0, layerwise=layerwise, batched=batched,
            scheme=scheme if kind else "", label=label)


def no_tiers() -> TierConfig:
    return TierConfig(label="no L1/L2")


# --------------------------------------------------------------------------- rendered config


@dataclass(frozen=True)
class RenderedTiers:
    """The tier configuration one endpoint's workers get, as the charts render it."""

    lmcache: dict                      # the ConfigMap's lmcache.yaml
    l2_url: str | None
    l2_capacity_gib: float | None      # Valkey maxmemory (self-hosted) or node memory x 0.75
    l2_memory_limit_gib: float | None  # the cache pod's memory limit
    source: str
    warnings: tuple[str, ...] = ()
    verdict: Any = None                # k8s/l2.py L2Verdict on the L2 asked for, if any


def bench_endpoint(backend: str, *, env: str = "dev", instance_type: str | None = None,
                   gpus: int | None = None, replicas: int | None = None,
                   force_l2: bool = False, prefix_tokens: int | None = None,
                   model: str | None = None, working_set_tokens: int | None = None
                   ) -> tuple[Any, Any]:
    """(environment, endpoint spec) for the seed file (tests/fixtures/endpoint-seed.yaml) with
    L1 and L2 `backend`, served on `instance_type` with `gpus` GPUs (tensor parallel) per
    worker, `replicas` of them (all reading at once), as `cdk synth` reads it."""
    import copy

    import yaml

    from config import resolve_environment
    from config.context import ROOT, repository_context
    from config.endpoint_spec import parse_endpoint

    ctx = repository_context(ROOT)
    ctx["env"] = env
    cfg = resolve_environment(ctx)
    raw = yaml.safe_load((ROOT / "tests" / "fixtures" / "endpoint-seed.yaml").read_text())
    raw = copy.deepcopy(raw)
    if instance_type:
        raw["spec"]["instanceType"] = f"ml.{instance_type}"
        if cfg.gpu_group_for(instance_type) is None:
            group = replace(cfg.gpu_node_groups[0], name="bench",
                            instance_types=(instance_type,))
            cfg = replace(cfg, gpu_node_groups=(*cfg.gpu_node_groups, group))
    if gpus:
        w = raw["spec"]["worker"]
        w["args"] = [a for a in w["args"] if not a.startswith("--tensor-parallel-size")] + [
            f"--tensor-parallel-size={gpus}"]
        for part in ("limits", "requests"):
            w["resources"][part]["nvidia.com/gpu"] = gpus
    if replicas:
        raw["spec"]["replicas"] = replicas
        # the fleet the verdict counts: exactly these replicas, all reading at once
        raw["spec"]["autoScalingSpec"] = {"minReplicaCount": replicas,
                                          "maxReplicaCount": replicas}
    kv = raw["spec"].setdefault("kvCacheSpec", {})
    kv["enableL1Cache"] = True
    if backend == "none":
        kv["enableL2Cache"] = False
    else:
        kv["enableL2Cache"] = True
        kv.setdefault("l2CacheSpec", {})["l2CacheBackend"] = backend
        kv["forceL2Cache"] = force_l2      # the seed forces it; the bench asks
        if working_set_tokens:
            kv["workingSetTokens"] = working_set_tokens
    if prefix_tokens:
        kv["prefixTokens"] = prefix_tokens
    if model:
        raw["spec"]["modelName"] = model
    spec = parse_endpoint(cfg.name, "endpoints/bench.yaml", raw,
                          node_instance_types=tuple(
                              t for g in cfg.gpu_node_groups for t in g.instance_types))
    return cfg, spec


def rendered_tiers(backend: str, *, env: str = "dev", l1_gib: int | None = None,
                   instance_type: str | None = None, gpus: int | None = None,
                   replicas: int | None = None, force_l2: bool = False,
                   prefix_tokens: int | None = None, model: str | None = None
                   ) -> RenderedTiers:
    """Render the serving charts for a HyperPod endpoint file with L1 and L2 `backend`
    (`valkey`, `lmcache-server`, `redis` = the environment's managed cache, or `none`) and
    read back what the workers and the cache get. `instance_type`/`gpus`: the seed file served
    on that type with that many GPUs (tensor parallel) per worker, through the same checks as
    `cdk synth` (k8s/serving.py fit_endpoint: where an L2 read cannot beat recompute on that
    GPU for `replicas` sharing it, no L2, unless `force_l2` = the file's
    kvCacheSpec.forceL2Cache). Imports cdk8s:
    seconds, once per run."""
    import cdk8s
    import yaml

    from k8s.serving import build_charts, fit_endpoint, l2_plan, placeholder_facts

    cfg, spec = bench_endpoint(backend, env=env, instance_type=instance_type, gpus=gpus,
                               replicas=replicas, force_l2=force_l2,
                               prefix_tokens=prefix_tokens, model=model)
    plan = l2_plan(cfg, spec)     # the verdict, also where it leaves the L2 out
    spec = fit_endpoint(cfg, spec)
    if l1_gib is not None:
        spec = replace(spec, l1_size_gib=l1_gib)
    docs = [d for chart in build_charts(cdk8s.App(), cfg, (spec,),
                                        placeholder_facts(cfg, (spec,)))
            for d in chart.to_json()]
    cm = next(d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith(
        "-lmcache"))
    lmc = yaml.safe_load(cm["data"]["lmcache.yaml"])
    url = lmc.get("remote_url")
    cap = limit = None
    caches = [d for d in docs if d["kind"] == "StatefulSet"
              and d["metadata"]["name"].startswith("kvcache-")]
    for sts in caches:
        c = sts["spec"]["template"]["spec"]["containers"][0]
        limit = _gib(c["resources"]["limits"]["memory"])
        args = c.get("args", [])
        if "--maxmemory" in args:
            cap = _mib(args[args.index("--maxmemory") + 1]) / 1024
    if backend != "none" and url is None and any(   # managed ElastiCache: URL at pod start
            c["name"] == "fetch-l2-secret" for d in docs
            if d["kind"] in ("Deployment", "StatefulSet")
            for c in d["spec"]["template"]["spec"].get("initContainers", [])):
        init = [c for d in docs if d["kind"] in ("Deployment", "StatefulSet")
                for c in d["spec"]["template"]["spec"].get("initContainers", [])
                if c["name"] == "fetch-l2-secret"]
        url = next((e["value"] for c in init for e in c["env"] if e["name"] == "L2_URL"), None)
        from config.bandwidth import ELASTICACHE_DATA_SHARE, cache_node

        node = cache_node(cfg.cache.node_type)
        shards = plan.verdict.shards if plan else 1
        cap = node.memory_gib * ELASTICACHE_DATA_SHARE * shards if node else None
        limit = node.memory_gib * shards if node else None
    return RenderedTiers(lmcache=lmc, l2_url=url, l2_capacity_gib=cap,
                         l2_memory_limit_gib=limit,
                         source=f"k8s/serving.py charts, environment {env}, "
                                f"tests/fixtures/endpoint-seed.yaml with l2CacheBackend "
                                f"{backend}" + (f" on {instance_type}" if instance_type else ""),
                         warnings=spec.warnings, verdict=plan.verdict if plan else None)


def _gib(quantity: str) -> float:
    units = {"Gi": 1.0, "Mi": 1 / 1024, "G": 1e9 / GIB, "M": 1e6 / GIB}
    for suffix, f in units.items():
        if quantity.endswith(suffix):
            return float(quantity[: -len(suffix)]) * f
    return float(quantity) / GIB


def _mib(value: str) -> float:
    v = value.lower()
    return float(v[:-2]) * (1024 if v.endswith("gb") else 1) if v[-2:] in ("mb", "gb") \
        else float(v) / 2 ** 20


def tier_config(backend: str, *, env: str = "dev", l1_gib: int | None = None,
                network_gbs: float | None = None, label: str = "", gpu: Any = None,
                replicas: int | None = None, force_l2: bool = False,
                prefix_tokens: int | None = None, model: str | None = None) -> TierConfig:
    """What the emulated LMCache does with the configuration the charts render for the seed
    file on `gpu`'s instance type and tensor parallel size (a `bench.emulator.GpuProfile`)."""
    r = rendered_tiers(backend, env=env, l1_gib=l1_gib,
                       instance_type=gpu.instance_type if gpu else None,
                       gpus=gpu.gpus if gpu else None, replicas=replicas,
                       force_l2=force_l2, prefix_tokens=prefix_tokens, model=model)
    chunk = {} if gpu is None else {
        "rank_chunk_bytes": int(r.lmcache.get("chunk_size", 256))
        * gpu.model.kv_bytes_per_token // gpu.gpus}
    return TierConfig.from_lmcache(r.lmcache, l2_capacity_gib=r.l2_capacity_gib,
                                   l2_memory_limit_gib=r.l2_memory_limit_gib, l2_url=r.l2_url,
                                   network_gbs=network_gbs, label=label or backend,
                                   verdict=r.verdict, **chunk)


# --------------------------------------------------------------------------- the L2 store


class ValkeyServer:
    """A redis-server on 127.0.0.1 for the L2 index (Debian's `redis-server`, which the suite
    installs; Valkey speaks the same protocol). `stop()`/`start()` for drills."""

    def __init__(self, port: int | None = None, maxmemory_bytes: int = 0,
                 evict: bool = True) -> None:
        from bench.loopback import free_port

        self.binary = shutil.which("valkey-server") or shutil.which("redis-server")
        if not self.binary:
            raise RuntimeError("redis-server not found: `make tools` installs it")
        self.port = port or free_port()
        self.maxmemory_bytes = maxmemory_bytes
        self.evict = evict
        self.proc: subprocess.Popen | None = None
        self._dir = tempfile.TemporaryDirectory(prefix="l2-valkey-")

    def start(self) -> "ValkeyServer":
        import valkey

        args = [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                "--appendonly", "no", "--dir", self._dir.name,
                "--maxmemory-policy", "allkeys-lru" if self.evict else "noeviction"]
        if self.maxmemory_bytes:
            args += ["--maxmemory", str(self.maxmemory_bytes)]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while True:
            try:
                valkey.Valkey(port=self.port, socket_timeout=1).ping()
                return self
            except valkey.exceptions.ConnectionError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise RuntimeError(f"redis-server on {self.port} did not start") from None
                time.sleep(0.02)

    def stop(self) -> None:
        from bench.loopback import stop_process

        if self.proc is not None:
            stop_process(self.proc)
        self.proc = None

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def __enter__(self) -> "ValkeyServer":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()
        self._dir.cleanup()


class L2Store:
    """The endpoint's shared L2: its index in a real redis-server (eviction by Valkey's own
    LRU), the bytes it holds, and whether it is reachable. One key per chunk of every rank, its
    value the chunk's bytes / SCALE: jemalloc rounds it up as it rounds a rank's real chunk in
    the deployed Valkey (8 MiB -> 10 MiB there, 32 KiB -> 40 KiB here), so `maxmemory` /
    SCALE holds what the real one does (tests/bench/test_tiers.py)."""

    def __init__(self, server: ValkeyServer, chunk_bytes: int, cfg: TierConfig) -> None:
        import valkey

        self.server, self.cfg = server, cfg
        self.chunk_bytes = chunk_bytes
        self.value = b"\0" * max(1, chunk_bytes // SCALE)
        self.client = valkey.Valkey(port=server.port, socket_timeout=2, socket_connect_timeout=1)
        self._errors = (valkey.exceptions.ConnectionError, valkey.exceptions.TimeoutError,
                        valkey.exceptions.ResponseError)
        self.run_id = self._run_id()
        base = int(self.client.info("memory")["used_memory"])
        if cfg.l2_capacity_gib:   # also what a restart starts with (the pod's args)
            server.maxmemory_bytes = base + int(cfg.l2_capacity_gib * GIB / SCALE)
            self.client.config_set("maxmemory", server.maxmemory_bytes)
        self.oom_kills = 0
        self.down_until = 0.0          # an OOM-killed lm server restarting (virtual time)
        self.puts = self.failed_puts = 0
        self.links: list[_Link] = []   # every worker's connection (the server is shared)
        self._pending: list[tuple[float, int]] = []   # (lands at, key)

    def _run_id(self) -> str:
        try:
            return str(self.client.info("server")["run_id"])
        except self._errors as exc:
            raise L2Down(str(exc)) from None

    def _check(self, now: float) -> None:
        if now < self.down_until:
            raise L2Down("restarting after OOM kill")

    def contains(self, keys: Sequence[int], now: float) -> list[bool]:
        """Which of `keys` are stored (a pipelined EXISTS)."""
        self.flush(now)
        self._check(now)
        if not keys:
            return []
        try:
            pipe = self.client.pipeline(transaction=False)
            for k in keys:
                pipe.exists(f"c{k}")
            return [bool(g) for g in pipe.execute()]
        except self._errors as exc:
            raise L2Down(str(exc)) from None

    def contains_prefix(self, keys: Sequence[int], now: float) -> int:
        got = self.contains(keys, now)
        return got.index(False) if False in got else len(got)

    def kill(self, now: float) -> None:
        """Stop the store at `now` (a drill): writes landed by then are in it."""
        self.flush(now)
        self.server.stop()

    def put(self, keys: Sequence[int], done_at: Sequence[float], now: float) -> None:
        """Writes queued now, each landing in the store when its transfer is done (a chunk
        is not in L2 for anyone until then)."""
        self._check(now)
        for k, t in zip(keys, done_at):
            heapq.heappush(self._pending, (t, k))
        self.flush(now)

    def flush(self, now: float) -> int:
        """Land the writes finished by `now`; returns how many failed (L2 down)."""
        done = []
        while self._pending and self._pending[0][0] <= now:
            done.append(heapq.heappop(self._pending)[1])
        if not done:
            return 0
        try:
            self._check(now)
            pipe = self.client.pipeline(transaction=False)
            for k in done:
                pipe.set(f"c{k}", self.value)
            pipe.execute()
        except (L2Down, *self._errors):
            self.failed_puts += len(done)
            return len(done)
        self.puts += len(done)
        if self.cfg.l2_memory_limit_gib and self.cfg.l2 == "lm":
            if self.used_bytes() > self.cfg.l2_memory_limit_gib * GIB:  # the pod's OOM kill
                self.oom_kills += 1
                self.client.flushall()
                self._pending.clear()
                self.down_until = now + L2_RESTART_S
        return 0

    def ping(self, now: float) -> bool:
        if now < self.down_until:
            return False
        try:
            self.client.ping()
            rid = self._run_id()
        except (L2Down, *self._errors):
            return False
        if rid != self.run_id:   # restarted: no persistence, it came back empty
            self.run_id = rid
        return True

    def used_bytes(self) -> float:
        try:
            n = int(self.client.dbsize())
        except self._errors:
            return 0.0
        return n * self.chunk_bytes

    def clear(self) -> None:
        try:
            self.client.flushall()
        except self._errors:
            pass


# --------------------------------------------------------------------------- per worker


class _Link:
    """One worker's (one rank's) connection to L2. `lm`: one FIFO socket for everything;
    `redis`: a pool, so reads and lookups do not wait behind writes.

    The L2 server is shared: a transfer that starts while other workers' links are busy gets
    its share of the server's own rate (`server_gbs`, one Valkey thread, or the node's NIC),
    counted over every rank's connection (`ranks`; ranks move in lockstep)."""

    def __init__(self, cfg: TierConfig, chunk_bytes: int, l2: "L2Store | None" = None,
                 ranks: int = 1) -> None:
        self.cfg, self.chunk_bytes = cfg, chunk_bytes
        self.fifo = cfg.l2 == "lm"
        self.tail = 0.0               # when the last queued write finishes
        self.busy_until = 0.0         # when its last transfer (read or write) finishes
        self.l2, self.ranks = l2, ranks
        if l2 is not None:
            l2.links.append(self)

    def _rate(self, now: float, own_gbs: float) -> float:
        """GB/s a transfer started at `now` moves at: its connection's rate, or its share of
        the server where that is less."""
        if not self.cfg.server_gbs or self.l2 is None:
            return own_gbs
        busy = 1 + sum(1 for x in self.l2.links
                       if x is not self and max(x.tail, x.busy_until) > now)
        return min(own_gbs, self.cfg.server_gbs / (busy * self.ranks))

    def put_at(self, now: float) -> float:
        return RTT_S + self.chunk_bytes / (self._rate(now, self.cfg.put_gbs) * 1e9)

    def get_at(self, now: float) -> float:
        return RTT_S + self.chunk_bytes / (self._rate(now, self.cfg.get_gbs) * 1e9)

    @property
    def put_s(self) -> float:
        return RTT_S + self.chunk_bytes / (self.cfg.put_gbs * 1e9)

    @property
    def get_s(self) -> float:
        return RTT_S + self.chunk_bytes / (self.cfg.get_gbs * 1e9)

    def backlog(self, now: float) -> float:
        return max(0.0, self.tail - now)

    def enqueue_puts(self, now: float, n: int) -> list[float]:
        """Completion times of `n` chunk writes queued now."""
        out, t = [], max(now, self.tail)
        for _ in range(n):
            t += self.put_at(t)
            out.append(t)
        self.tail = t
        return out

    def lookup_s(self, now: float, keys: int) -> float:
        """A lookup of `keys` chunks: lm:// asks one key at a time, each behind the write
        the socket is busy with (the lock is FIFO and writes keep coming); the redis executor
        asks ahead of queued writes, after a chunk already on the wire."""
        backlog = self.backlog(now)
        if not self.fifo:
            return RTT_S + (self.put_s if backlog > 0 else 0.0)
        if backlog <= 0:
            return keys * RTT_S
        return backlog + (keys - 1) * self.put_s + keys * RTT_S

    def get_time(self, now: float, chunks: int) -> float:
        if self.fifo:
            backlog = self.backlog(now)
            per = self.get_at(now) + (self.put_s if backlog > 0 else 0.0)
            took = backlog + chunks * per
        else:
            took = (self.put_s if self.backlog(now) > 0 else 0.0) + chunks * self.get_at(now)
        self.busy_until = max(self.busy_until, now + took)
        return took


@dataclass
class LookupResult:
    gpu_hit: int = 0
    l1_tokens: int = 0        # loaded from L1
    l2_tokens: int = 0        # loaded from L2 (promoted into L1)
    stall_s: float = 0.0      # the scheduler blocked (synchronous lookup)
    wait_s: float = 0.0       # the request waits (asynchronous lookup), the engine does not
    load_s: float = 0.0       # the step's forward waits for the KV copy (and L2 gets)
    copy_s: float = 0.0       # of which the CPU->GPU copy (pipelined with use_layerwise)
    timed_out: bool = False
    lmcache_hit: int = 0      # tokens LMCache said it has (what it will not store again)

    @property
    def cached(self) -> int:
        return self.gpu_hit + self.l1_tokens + self.l2_tokens


@dataclass
class TierCounters:
    requested_tokens: int = 0
    lookup_requests: int = 0
    lookup_tokens: int = 0
    lookup_hits: int = 0
    hit_tokens: int = 0
    l1_hit_tokens: int = 0
    l2_hit_tokens: int = 0
    stored_tokens: int = 0
    retrieve_requests: int = 0
    remote_read_requests: int = 0
    remote_read_bytes: float = 0.0
    remote_write_requests: int = 0
    remote_write_bytes: float = 0.0
    lookup_timeouts: int = 0
    stall_s: float = 0.0
    l1_alloc_failures: int = 0
    l1_evictions: int = 0
    get_blocking_failed: int = 0
    put_failed: int = 0
    ping_errors: int = 0
    ping_successes: int = 0
    ping_error_code: int = 0
    get_ms: _Histogram = field(default_factory=lambda: _Histogram(REMOTE_MS_BUCKETS))
    put_ms: _Histogram = field(default_factory=lambda: _Histogram(REMOTE_MS_BUCKETS))


def pipelined(transfer_s: float, compute_s: float, layers: int) -> float:
    """What a KV transfer adds to a step when it runs layer by layer beside the forward, as
    LMCache's `use_layerwise` does (0.3.7 and 0.5.4): store_layer copies layer i out on a side
    CUDA stream after layer i's attention and waits for it only when layer i+1 saves
    (gpu_connector VLLMPagedMemLayerwiseGPUConnector.batched_from_gpu, store_stream), and
    wait_for_save waits for the last layer; retrieve_layer loads layer i+1 while layer i
    computes. With per-layer transfer d and compute c over L layers the step takes
    L max(c, d) + d instead of L c: one layer's transfer, plus what the compute cannot hide."""
    return transfer_s / layers + max(0.0, transfer_s - compute_s)


def chunk_keys(ids: Sequence[int], chunk: int, upto: int | None = None,
               unfull: bool = False) -> list[int]:
    """LMCache's chunk keys of `ids[:upto]`: each hash chained on the previous chunk's."""
    n = len(ids) if upto is None else min(upto, len(ids))
    keys, parent = [], 0
    end = n if unfull else n - n % chunk
    for start in range(0, end, chunk):
        parent = hash((parent, tuple(ids[start:start + chunk])))
        keys.append(parent & 0xFFFF_FFFF_FFFF)
    return keys


class LMCacheWorker:
    """One worker's LMCache: its L1, its connection to the shared L2, its health monitor and
    counters. Every method takes the virtual time `now`."""

    def __init__(self, cfg: TierConfig, gpu: Any, l2: L2Store | None = None) -> None:
        self.cfg, self.gpu = cfg, gpu
        ranks = gpu.gpus
        self.rank_chunk_bytes = cfg.chunk_size * gpu.model.kv_bytes_per_token // ranks
        self.chunk_bytes = cfg.chunk_size * gpu.model.kv_bytes_per_token
        self.l1_capacity = int(cfg.l1_gib * GIB // self.rank_chunk_bytes) if cfg.l1_gib else 0
        self.l1: "collections.OrderedDict[int, float]" = collections.OrderedDict()
        self.l2 = l2
        self.link = _Link(cfg, self.rank_chunk_bytes, l2, ranks) if cfg.l2 else None
        self.counters = TierCounters()
        self.bypass_l2 = False          # local_cpu fallback applied
        self.unhealthy = False          # recompute fallback: LMCache skips everything
        self.failure_time: float | None = None
        self._failed_at_last_check = 0
        self.next_ping = cfg.ping_interval_s
        self.saved: dict[int, int] = {}  # request -> tokens already stored

    # -- health

    @property
    def l2_usable(self) -> bool:
        return self.l2 is not None and not self.bypass_l2 and not self.unhealthy

    @property
    def healthy_gauge(self) -> int:
        return 0 if self.unhealthy else 1

    def tick(self, now: float) -> None:
        """LMCache's health monitor, run at its ping interval (virtual time)."""
        if self.l2 is None:
            return
        while now >= self.next_ping:
            self._check(self.next_ping)
            self.next_ping += self.cfg.ping_interval_s

    def _check(self, now: float) -> None:
        ok = True
        if self.failure_time is not None:
            # recovery: a test put and get (_put_and_get_check), after the waiting time
            if now - self.failure_time > self.cfg.recovery_wait_s and self.l2.ping(now):
                self.failure_time = None
            else:
                ok = False
        if ok:
            # RemoteBackendHealthCheck.check (health_monitor/checks/remote_backend_check.py):
            # failed blocking gets in the interval, then a ping only where the connector
            # supports one, which redis:// and lm:// do not (base_connector.support_ping: False;
            # only s3, bigtable, hfbucket and sagemaker-hyperpod ping): so an L2 that is down
            # is noticed only through gets, and a get happens only after a lookup found the
            # chunk, which a down L2 never answers
            failed = self.counters.get_blocking_failed - self._failed_at_last_check
            self._failed_at_last_check = self.counters.get_blocking_failed
            if failed >= self.cfg.get_failed_threshold:
                self.failure_time, ok = now, False
        if self.cfg.fallback == "local_cpu":
            self.bypass_l2 = not ok
        else:
            self.unhealthy = not ok

    # -- L1

    def _l1_insert(self, keys: Sequence[int], now: float, pinned_until: Sequence[float] | None
                   ) -> int:
        """Allocate and keep `keys` in L1; returns how many fitted (LMCache stops a store at
        the first failed allocation). A chunk pinned until its L2 write is done cannot be
        evicted."""
        if not self.l1_capacity:
            return 0
        stored = 0
        for i, k in enumerate(keys):
            pin = pinned_until[i] if pinned_until else 0.0
            if k in self.l1:
                self.l1[k] = max(self.l1[k], pin)
                self.l1.move_to_end(k)
                stored += 1
                continue
            if len(self.l1) >= self.l1_capacity and not self._evict_one(now):
                self.counters.l1_alloc_failures += 1
                break
            self.l1[k] = pin
            stored += 1
        return stored

    def _evict_one(self, now: float) -> bool:
        for k, pin in self.l1.items():
            if pin <= now:
                del self.l1[k]
                self.counters.l1_evictions += 1
                return True
        return False

    # -- lookup and retrieve (at scheduling)

    def lookup(self, ids: Sequence[int], gpu_hit: int, now: float) -> LookupResult:
        cfg, c = self.cfg, self.counters
        res = LookupResult(gpu_hit=gpu_hit)
        if not cfg.enabled or self.unhealthy:
            return res
        self.tick(now)
        keys = chunk_keys(ids, cfg.chunk_size, unfull=cfg.save_unfull_chunk)
        c.lookup_requests += 1
        c.lookup_tokens += len(ids)
        c.requested_tokens += len(ids)
        in_l1 = [k in self.l1 for k in keys]
        first_miss = in_l1.index(False) if False in in_l1 else len(keys)
        in_l2: list[bool] = [False] * len(keys)
        lookup_s, timed_out = 0.0, False
        if first_miss < len(keys) and self.l2_usable:
            rest = [k for k, here in zip(keys[first_miss:], in_l1[first_miss:]) if not here]
            lookup_s = self.link.lookup_s(now, len(rest))
            if lookup_s > cfg.lookup_timeout_s:
                timed_out = True
            else:
                try:
                    found = self.l2.contains(rest, now)
                except L2Down:
                    lookup_s, found = REFUSED_S, [False] * len(rest)
                it = iter(found)
                for i in range(first_miss, len(keys)):
                    if not in_l1[i]:
                        in_l2[i] = next(it)
        if timed_out:
            c.lookup_timeouts += 1
            res.timed_out = True
            block = cfg.lookup_timeout_s + (0.0 if cfg.async_lookup else SOCKET_RECREATE_S)
            if cfg.async_lookup:
                res.wait_s += block
            else:
                res.stall_s += block
                c.stall_s += block
            return res           # the lookup answers 0: recompute (the GPU hit stays)
        if cfg.async_lookup:
            res.wait_s += lookup_s
        else:
            res.stall_s += lookup_s
            c.stall_s += lookup_s
        chunks = 0                       # the prefix found in L1 or L2, chunk by chunk
        while chunks < len(keys) and (in_l1[chunks] or in_l2[chunks]):
            chunks += 1
        hit = min(chunks * cfg.chunk_size, len(ids) - 1)
        c.lookup_hits += chunks * cfg.chunk_size
        res.lmcache_hit = hit
        if hit <= gpu_hit or hit - gpu_hit < cfg.min_retrieve_tokens:
            return res
        # retrieve what the GPU lacks: L1 chunks copied, L2 chunks fetched (and promoted)
        first = gpu_hit // cfg.chunk_size
        need = range(first, chunks)
        from_l2 = [keys[i] for i in need if not in_l1[i]]
        c.retrieve_requests += 1
        load = 0.0
        ok = chunks
        # this retrieve's L1 chunks are in use (LMCache holds them while it loads): touched
        # first, so promoting its L2 chunks evicts others before them
        for i in need:
            if in_l1[i] and keys[i] in self.l1:
                self.l1.move_to_end(keys[i])
        if from_l2:
            get_s = self.link.get_time(now, len(from_l2))
            if self._get_times_out(now, get_s):
                load += cfg.blocking_timeout_s
                c.get_blocking_failed += 1
                ok = next(i for i in need if not in_l1[i])   # up to the first L2 chunk
            else:
                load += get_s
                c.remote_read_requests += len(from_l2)
                c.remote_read_bytes += len(from_l2) * self.chunk_bytes
                c.get_ms.observe(get_s * 1e3)
                self._l1_insert(from_l2, now, None)       # promotion
        for i in range(first, ok):
            if in_l1[i] and keys[i] in self.l1:
                self.l1.move_to_end(keys[i])
        loaded_tokens = min(hit, ok * cfg.chunk_size) - gpu_hit
        if loaded_tokens <= 0:
            res.load_s = load
            return res
        l1_chunks = sum(1 for i in range(first, ok) if in_l1[i])
        res.l1_tokens = min(loaded_tokens, l1_chunks * cfg.chunk_size - (
            gpu_hit % cfg.chunk_size if in_l1[first] else 0))
        res.l2_tokens = loaded_tokens - res.l1_tokens
        res.copy_s = loaded_tokens * self.gpu.model.kv_bytes_per_token / (
            self.gpu.gpus * (cfg.cpu_to_gpu_gbs or self.gpu.lmcache_rates.to_gpu_gbs) * 1e9)
        res.load_s = load + res.copy_s
        c.hit_tokens += loaded_tokens
        c.l1_hit_tokens += res.l1_tokens
        c.l2_hit_tokens += res.l2_tokens
        return res

    def _get_times_out(self, now: float, get_s: float) -> bool:
        """`blocking_timeout_secs` bounds each chunk's future, waited for one after the other
        (remote_backend.batched_get_blocking for connectors without a batched get, which
        lm:// and redis:// are): a fetch fails when one chunk takes longer, which behind an
        lm:// socket's queued writes the first one does. resp:// and valkey:// fetch the
        whole retrieve in one batched_get, which the timeout bounds whole."""
        if self.cfg.batched:
            return get_s > self.cfg.blocking_timeout_s
        wait = self.link.backlog(now) if self.link.fifo else \
            (self.link.put_s if self.link.backlog(now) > 0 else 0.0)
        return wait + self.link.get_s > self.cfg.blocking_timeout_s

    # -- store (on compute)

    def store(self, request: int, ids: Sequence[int], computed: int, now: float,
              first_saved: int) -> float:
        """Chunks of `ids` computed up to `computed` and not stored yet for this request:
        copy them GPU->CPU (the returned seconds, which the step waits), keep them in L1 and
        queue them for L2. `first_saved`: tokens LMCache already had when it was scheduled."""
        cfg, c = self.cfg, self.counters
        if not cfg.enabled or self.unhealthy:
            return 0.0
        done = self.saved.get(request, first_saved - first_saved % cfg.chunk_size)
        unfull = cfg.save_unfull_chunk and computed >= len(ids)
        keys = chunk_keys(ids, cfg.chunk_size, upto=computed, unfull=unfull)
        start = done // cfg.chunk_size
        new = keys[start:]
        if not new:
            return 0.0
        pins = None
        tail = self.link.tail if self.link else 0.0
        if self.l2_usable:
            pins = self.link.enqueue_puts(now, len(new))
        stored = self._l1_insert(new, now, pins) if self.l1_capacity else len(new)
        if stored < len(new) and pins is not None:   # the dropped tail is not written either
            self.link.tail = pins[stored - 1] if stored else tail
            pins = pins[:stored]
        self.saved[request] = (start + stored) * cfg.chunk_size
        if not stored:
            return 0.0
        c.stored_tokens += stored * cfg.chunk_size
        if pins is not None:
            try:
                self.l2.put(new[:stored], pins, now)
                c.remote_write_requests += stored
                c.remote_write_bytes += stored * self.chunk_bytes
                for p in pins:
                    c.put_ms.observe((p - now) * 1e3)
            except L2Down:
                # LMCache 0.5.4 counts a failed batch as written and not as failed: the redis
                # connector puts in batches (support_batched_put), InstrumentedRemoteConnector
                # .batched_put swallows the error and still records the bytes, and
                # RemoteBackend.batched_put_callback never looks at the result (put_failed_count
                # grows only on the one-by-one path, remote_backend.py put_callback)
                c.remote_write_requests += stored
                c.remote_write_bytes += stored * self.chunk_bytes
                c.put_ms.observe(REFUSED_S * 1e3)
                self.link.tail = tail
                for k in new[:stored]:   # unpinned: the write failed
                    if k in self.l1:
                        self.l1[k] = 0.0
        return stored * cfg.chunk_size * self.gpu.model.kv_bytes_per_token / (
            self.gpu.gpus * self.gpu.lmcache_rates.to_cpu_gbs * 1e9)

    def finish(self, request: int) -> None:
        self.saved.pop(request, None)

    def clear_l1(self) -> None:
        self.l1.clear()

    # -- metrics (the names observability/metrics.py lists)

    def metrics_lines(self, labels: str) -> list[str]:
        c = self.counters
        counters = [
            ("lmcache:num_requested_tokens_total", c.requested_tokens),
            ("lmcache:num_hit_tokens_total", c.hit_tokens),
            ("lmcache:num_stored_tokens_total", c.stored_tokens),
            ("lmcache:num_lookup_tokens_total", c.lookup_tokens),
            ("lmcache:num_lookup_hits_total", c.lookup_hits),
            ("lmcache:num_remote_read_requests_total", c.remote_read_requests),
            ("lmcache:num_remote_read_bytes_total", c.remote_read_bytes),
            ("lmcache:num_remote_write_requests_total", c.remote_write_requests),
            ("lmcache:num_remote_write_bytes_total", c.remote_write_bytes),
            ("lmcache:remote_ping_errors_total", c.ping_errors),
            ("lmcache:remote_ping_successes_total", c.ping_successes),
        ]
        gauges = [
            ("lmcache:local_cache_usage", len(self.l1) * self.chunk_bytes),
            ("lmcache:remote_cache_usage", self.l2.used_bytes() if self.l2 else 0.0),
            ("lmcache:lmcache_is_healthy", self.healthy_gauge),
            ("lmcache:get_blocking_failed_count", c.get_blocking_failed),
            ("lmcache:put_failed_count", c.put_failed),
            ("lmcache:remote_ping_error_code", c.ping_error_code),
            ("lmcache:retrieve_hit_rate",
             c.hit_tokens / c.requested_tokens if c.requested_tokens else 0.0),
            ("lmcache:lookup_hit_rate",
             c.lookup_hits / c.lookup_tokens if c.lookup_tokens else 0.0),
        ]
        lines = []
        for name, value in counters:
            lines += [f"# TYPE {name} counter", f"{name}{{{labels}}} {float(value)!r}"]
        for name, value in gauges:
            lines += [f"# TYPE {name} gauge", f"{name}{{{labels}}} {float(value)!r}"]
        for name, hist in (("lmcache:remote_time_to_get", c.get_ms),
                           ("lmcache:remote_time_to_put", c.put_ms)):
            lines += [f"# TYPE {name} histogram"] + hist.lines(name, labels)
        return lines


def describe(cfg: TierConfig) -> str:
    if not cfg.enabled:
        return "no L1/L2"
    parts = [(f"L1 {cfg.l1_gib:g} GiB/rank" + (", layerwise" if cfg.layerwise else ""))
             if cfg.l1_gib else "no L1"]
    if cfg.l2:
        cap = f"{cfg.l2_capacity_gib:.1f} GiB LRU" if cfg.l2_capacity_gib else "no eviction"
        server = (f", the server {cfg.server_gbs:.2f} GB/s shared"
                  if cfg.server_gbs else "")
        parts.append(f"L2 {cfg.scheme or cfg.l2}:// ({cap}, put {cfg.put_gbs:.2f} GB/s, get "
                     f"{cfg.get_gbs:.2f} GB/s per {'rank' if cfg.batched else 'connection'}"
                     f"{server})")
        parts.append(f"{'async' if cfg.async_lookup else 'sync'} lookup, timeout "
                     f"{cfg.lookup_timeout_s * 1000:.0f} ms")
    return ", ".join(parts)
