"""The workers chart: vLLM + LMCache pods for one endpoint, on the GPU node group.

Weights are staged from the model bucket by an init container (Pod Identity, read-only to the
model prefix), Hugging Face stays offline. LMCache reads one YAML file; where the L2 needs a
secret, an init container fetches it from Secrets Manager into a memory-backed volume at pod
start, so no manifest or template ever carries it.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any, Mapping

import yaml
from cdk8s import Chart
from constructs import Construct

from config.images import IMAGES, IMAGES_LOCK, ImageFamily, catalogue_release, image_release
from config.contracts import (
    EFA_RESOURCE, NIXL_SIDE_CHANNEL_PORT, PD_ROLE_LABEL, GPU_RESOURCE, GPU_TAINT_KEY,
    KV_EVENTS_PORT, LONGEST_REQUEST_S, NODE_GROUP_LABEL, NODE_ROLE_GPU, NODE_ROLE_LABEL,
    WORKER_LIMITS_GATEWAY_PORT, WORKER_LIMITS_PORT, WORKER_PORT,
)
from config.endpoint_spec import AutoScaling, HubModel, RequestLimits, arg_value, named_model
from k8s.flows import PROMETHEUS, Flow, Peer
from k8s.lmcache_server import (
    LMCACHE_MP_SINCE, SERVER_CPU, SERVER_OVERHEAD_GIB, mp_kv_transfer_config, mp_refusal,
    server_args, server_container,
)
from k8s.request_limits import (
    LIMITS_CONFIG, LIMITS_CPU, LIMITS_MEMORY, LIMITS_MEMORY_MIB, limits_config,
    limits_container,
)
from k8s.objects import (
    hardened, k8s_object, pdb, pod_security, selector_labels, standard_labels, zone_spread,
)
from k8s.secret_fetch import (
    API_KEY_FILE, API_KEY_VOLUMES, SECRETS_DIR, ApiKey, fetch_api_key_container,
    fetch_secret_container,
)

COMPONENT = "vllm-worker"
MODELS_DIR = "/models"
KV_BLOCK_SIZE = 16  # vLLM --block-size == vllm-router --kv-event-block-size
LMCACHE_DIR = "/etc/lmcache"
# lmcache/vllm-openai sets no USER and runs `/opt/venv/bin/vllm serve` (LMCache's
# docker/Dockerfile): nothing in it needs root. vLLM, torch, triton and numba write their
# caches under $HOME and /tmp, which are emptyDirs; the root filesystem stays read-only.
WORKER_UID = 10001   # any UID works: the image bakes none in; high, off the host range
WORKER_HOME = "/home/vllm"
SCRATCH_ENV = [{"name": "HOME", "value": WORKER_HOME}, {"name": "USER", "value": "vllm"}]


@dataclass(frozen=True)
class L2Connection:
    """How LMCache reaches L2 (k8s/l2.py chooses the connector). `secret_arn` set: the
    password is fetched at pod start, into the URL (redis://) or into `password_key` of
    extra_config (valkey://, resp://: k8s/l2.py `Connector.password_key`)."""

    url: str                          # without credentials
    secret_arn: str | None = None
    extra: tuple[tuple[str, Any], ...] = ()   # the connector's extra_config keys
    password_key: str | None = None
    blocking_timeout_s: int | None = None     # None: TIER_POLICY's


@dataclass(frozen=True)
class MetricsSource:
    """Where KEDA reads worker metrics: AMP (SigV4 as the KEDA operator's Pod Identity) or the
    in-cluster Prometheus."""

    server_address: str
    aws_region: str | None = None


@dataclass(frozen=True)
class WorkerScaling:
    spec: AutoScaling
    source: MetricsSource


@dataclass(frozen=True)
class WorkerProps:
    endpoint: str
    namespace: str
    service_account: str              # bound to the worker role by Pod Identity (CDK side)
    image: str
    staging_image: str                # aws-cli: copies weights, fetches the L2 secret
    region: str
    model_bucket: str
    model_location: str
    model_name: str
    replicas: int
    gpus: int
    cpu: str
    memory: str
    node_group: str
    l1_enabled: bool
    l1_size_gib: int                  # per rank: LMCache's max_local_cpu_size (see l1_budget)
    l2: L2Connection | None
    publish_kv_events: bool
    health_check_path: str
    model_mount_path: str
    extra_args: tuple[str, ...] = ()
    extra_env: tuple[Mapping[str, Any], ...] = ()   # Kubernetes EnvVar objects, as written
    port: int = WORKER_PORT           # where vLLM listens (modelInvocationPort.containerPort)
    command: tuple[str, ...] = ()     # the file's command; empty: chosen by `vllm_command`
    working_dir: str | None = None
    family: ImageFamily | None = None  # where the image keeps vLLM (config/images.py)
    lmcache: tuple[int, int, int] | None = None   # the LMCache release the image carries
    vllm: tuple[int, int, int] | None = None      # the vLLM release the image carries
    ranks: int = 1                    # GPU processes: one LMCache engine (and L1) each
    shm_gib: int = 1
    stateful: bool = False            # kv_aware: stable pod DNS names for static sources
    scaling: WorkerScaling | None = None
    api_key: ApiKey | None = None     # vLLM checks it on /v1 routes (VLLM_API_KEY)
    # The file's pod-level fields (config/pod_fields.py), already checked and resolved:
    tolerations: tuple[Mapping[str, Any], ...] = ()     # beside ours
    node_affinity: Mapping[str, Any] | None = None      # beside our node selector
    pod_annotations: tuple[tuple[str, str], ...] = ()
    extra_init: tuple[Mapping[str, Any], ...] = ()      # after ours; images resolved
    extra_volumes: tuple[Mapping[str, Any], ...] = ()
    startup_budget_s: int = 1800      # the startup probe's window (maxDeployTimeInSeconds)
    hub: HubModel | None = None       # staged from the Hugging Face Hub instead of the bucket
    hub_token_arn: str | None = None  # Secrets Manager secret holding the Hub token
    pd: PDWorker | None = None        # one role of a disaggregated endpoint (k8s/pd.py)
    node_gpus: int = 8                # GPUs on the node type (the EFA share follows them)
    owns_service_account: bool = True  # P/D: the prefill chart renders the shared one

    request_limits: RequestLimits | None = None   # HyperPod worker.requestLimits
    sidecar_image: str | None = None  # the router image: its HAProxy runs the request limits
    lmcache_mode: str = "InProcess"   # HyperPod lmcache.mode (k8s/lmcache_server.py)

    @property
    def multi_process(self) -> bool:
        return self.lmcache_mode == "MultiProcess"

    @property
    def l1_total_gib(self) -> int:
        return self.l1_size_gib * self.ranks if self.l1_enabled else 0

    @property
    def router_port(self) -> int:
        """Where the router reaches the worker: the request-limit sidecar, or vLLM itself."""
        return WORKER_LIMITS_PORT if self.request_limits else self.port

    @property
    def gateway_port(self) -> int:
        """Where the team's inference gateway reaches it: the sidecar's own port for it (a full
        worker answered with the file's status), or vLLM itself."""
        return WORKER_LIMITS_GATEWAY_PORT if self.request_limits else self.port


@dataclass(frozen=True)
class PDWorker:
    """One role of a disaggregated endpoint (k8s/pd.py): vLLM's NixlConnector over EFA, its
    side channel, the type's EFA interfaces, the role's node selector, and the zone it must
    share with the other role."""

    role: str                                  # "prefill" or "decode"
    efa_interfaces: int
    backend: str = "LIBFABRIC"                 # NIXL's backend: libfabric's EFA provider
    node_selector: tuple[tuple[str, str], ...] = ()
    same_zone_as: str | None = None            # the other role: required zone affinity to it


def pd_selector(endpoint: str, role: str) -> dict[str, str]:
    """The pods of one role: the workers' selector and the role label."""
    return {**selector_labels(COMPONENT, endpoint), PD_ROLE_LABEL: role}


def pd_transfer_config(role: str, l1: bool) -> dict:
    """`--kv-transfer-config` of a P/D worker: NixlConnector on the LIBFABRIC backend (EFA;
    `kv_connector_extra_config.backends`, vLLM's nixl_connector default ["UCX"]), `kv_role`
    kv_both (NixlConnector does not tell roles apart: the router decides who prefills), and
    kv_load_failure_policy fail (as for the L2: a KV read that failed ends the request with an
    error, never text computed on blocks that never arrived). A prefill worker with L1 keeps
    LMCache beside it through vLLM's MultiConnector (NIXL first: it is the one whose blocks
    the decode worker reads)."""
    nixl = {"kv_connector": "NixlConnector", "kv_role": "kv_both",
            "kv_connector_extra_config": {"backends": ["LIBFABRIC"]}}
    if role == "prefill" and l1:
        return {"kv_connector": "MultiConnector", "kv_role": "kv_both",
                "kv_load_failure_policy": KV_LOAD_FAILURE_POLICY,
                "kv_connector_extra_config": {"connectors": [
                    nixl, {"kv_connector": "LMCacheConnectorV1", "kv_role": "kv_both"}]}}
    return {**nixl, "kv_load_failure_policy": KV_LOAD_FAILURE_POLICY}


# ---------------------------------------------------------------------------------------------
# The tier configuration (issue 17, item 0), in one place, as data the emulator can import.
# Read from LMCache's own code for the releases our images carry (0.3.7 in lmcache/vllm-openai
# v0.3.7, 0.5.4 in v0.5.4; `lmcache/v1/config.py` `_CONFIG_DEFINITIONS` of each, and the files
# named below). What went wrong when LMCache ran as we used to configure it (real vLLM 0.24 +
# LMCache 0.5.0 on an H100, bench/data/h100_vllm_0_24.json): every prefill queued
# its whole KV to an `lm://` LMCache server over one socket per worker (~0.5 GB/s), lookups
# waited behind those writes until `lookup_timeout_ms` (each timeout stalled the engine
# ~1.2 s), the server grew to 55.6 GiB (it has no eviction), and L1 filled.
LMCacheVersion = tuple[int, int, int]
OLDEST_KNOWN_LMCACHE: LMCacheVersion = (0, 3, 7)


@dataclass(frozen=True)
class TierSetting:
    key: str
    value: Any
    since: LMCacheVersion      # first LMCache release (of those we read) that acts on it
    why: str
    l2_only: bool = False      # rendered only where an L2 is configured
    l1_only: bool = False      # rendered only where there is none


TIER_POLICY: tuple[TierSetting, ...] = (
    TierSetting("chunk_size", 256, OLDEST_KNOWN_LMCACHE,
                "LMCache's default and the unit of every lookup; the router's prefix keys "
                "and the emulator's tiers use the same 256 tokens"),
    TierSetting("local_cpu", True, OLDEST_KNOWN_LMCACHE,
                "L1 in pinned CPU memory: lookups are local dict checks that never wait on the "
                "network; a 32K request with 61% of its KV loaded from CPU took 129-134 ms "
                "against 1,242 ms cold on the H100 (bench/data/h100_vllm_0_24.json)"),
    TierSetting("use_layerwise", True, OLDEST_KNOWN_LMCACHE,
                "takes the store off the engine's critical path: by default LMCache copies a "
                "step's new KV GPU->CPU in wait_for_save and the step waits for all of it "
                "(vllm_v1_adapter.py wait_for_save -> LMCacheEngine.store -> "
                "VLLMPagedMemGPUConnectorV2.from_gpu, store_stream.synchronize(); 10.4 ms per "
                "~2K tokens on the H100, +19% on a cold 8B prefill); layerwise, each layer's "
                "KV is copied on a side stream while the next layer computes and the step "
                "waits for the last layer only (cache_engine.py store_layer, "
                "VLLMPagedMemLayerwiseGPUConnector.batched_from_gpu); loads pipeline the "
                "same way (retrieve_layer). Not with an L2: 0.3.7 retrieves layerwise from L1 "
                "only (storage_manager.layerwise_batched_get) and 0.5.4 asserts a retrieve "
                "comes from one location, so a prefix split between L1 and L2 cannot load. "
                "Only with LAYERWISE_GUARD (layerwise_guard below)",
                l1_only=True),
    TierSetting("save_unfull_chunk", False, OLDEST_KNOWN_LMCACHE,
                "only whole 256-token chunks are stored: a partial tail is never looked up "
                "again by a longer prompt, so writing it is pure cost"),
    TierSetting("save_decode_cache", False, OLDEST_KNOWN_LMCACHE,
                "decode tokens are not stored (LMCache's default, written down): they double "
                "the write traffic for a reuse only the next turn of the same chat has, "
                "and that turn's prefix is in the GPU cache of the worker the router keeps"),
    TierSetting("remote_serde", "naive", OLDEST_KNOWN_LMCACHE,
                "no compression pass on the engine's critical path (cachegen costs GPU time)",
                l2_only=True),
    TierSetting("lookup_timeout_ms", 200, OLDEST_KNOWN_LMCACHE,
                "bounds what a lookup may cost the scheduler: a Valkey EXISTS per chunk is "
                "well under 1 ms on the node's network, so 200 ms is only reached when L2 is "
                "sick; 1,000 ms (as we had) stalled the engine ~1.2 s per timeout "
                "(lmcache/v1/lookup_client/lmcache_lookup_client.py; the async client in 0.5.x)",
                l2_only=True),
    TierSetting("blocking_timeout_secs", 2, OLDEST_KNOWN_LMCACHE,
                "a remote read that has not arrived in 2 s is dropped and recomputed "
                "(remote_backend.py get_blocking: future.result(blocking_timeout_secs))",
                l2_only=True),
    # LMCache 0.5.x's health monitor (lmcache/v1/health_monitor/, absent in 0.3.x): after
    # repeated failures the remote backend is taken out and L1 keeps serving; the default
    # fallback `recompute` would switch L1 off too.
    TierSetting("extra_config", {"fallback_policy": "local_cpu", "ping_interval": 10.0,
                                 "ping_timeout": 2.0, "get_blocking_failed_threshold": 5,
                                 "waiting_time_for_recovery": 60.0}, (0, 5, 0),
                "a dead L2 costs misses, never L1", l2_only=True),
)

CHUNK_TOKENS = next(t.value for t in TIER_POLICY if t.key == "chunk_size")

# The L2 we run or connect to speaks Redis (Valkey in the cluster, ElastiCache managed), never
# LMCache's own `lm://` server. LMCache's lm connector (storage_backend/connector/lm_connector.py,
# 0.3.7 and 0.5.4) sends every put and every EXISTS over one socket under one asyncio lock, so a
# lookup waits behind all queued writes; its server (v1/server/storage_backend/local_backend.py,
# "TODO: please add evictor") grows without bound. The redis connector (redis_connector.py, both
# releases) uses a pool of up to 150 connections and an AsyncPQExecutor of 4 workers in which an
# EXISTS (PEEK) goes ahead of every queued PUT: a lookup waits for at most the chunks already on
# the wire. Writes stay asynchronous (RemoteBackend.batched_submit_put_task never waits); what
# bounds them is L1: a chunk being written to L2 is held in L1 until its write completes, so a
# slow L2 costs L1 allocations (stores skipped), not engine time. Every L2 evicts and has a size:
# Valkey `maxmemory` + `allkeys-lru` (k8s/cache.py), ElastiCache the same through its parameter
# group (constructs/kv_cache.py); LMCache sets no TTL on its keys, so a `volatile-*` policy (the
# ElastiCache default) would evict nothing and refuse writes once full.
L2_SCHEMES = ("redis://", "rediss://", "resp://", "valkey://")
REDIS_SCHEMES = ("redis://", "rediss://")

REDIS_SOCKET_TIMEOUTS = "socket_timeout=1&socket_connect_timeout=1"


def tier_settings(lmcache: LMCacheVersion | None, l2: bool) -> dict[str, Any]:
    """The policy's settings the image's LMCache reads; an unknown release gets what the oldest
    release we know reads (LMCache ignores unknown keys with a warning, so less is safer)."""
    version = lmcache or OLDEST_KNOWN_LMCACHE
    return {t.key: t.value for t in TIER_POLICY
            if version >= t.since and (l2 or not t.l2_only) and not (l2 and t.l1_only)}


# L1 against the container's memory. LMCache runs one engine per GPU process (tensor x
# pipeline parallel ranks) and each pins its whole `max_local_cpu_size` at start
# (LocalCPUBackend's allocator), so the pod needs ranks x L1 beside vLLM's own host memory and
# /dev/shm (a memory-backed emptyDir, charged to the pod). vLLM's host memory is an allowance,
# not a measurement (no RSS was recorded on the H100): the API server and engine core with
# tokenizer and detokenizer (4 GiB), and per rank the worker process (torch, CUDA context, NCCL,
# 2 GiB). AWS's own TP-4 sample asks 30Gi in all, which these allowances still fit (3 GiB of L1
# per rank).
VLLM_HOST_GIB_BASE = 4
VLLM_HOST_GIB_PER_RANK = 2
SHM_GIB_PER_RANK = 1    # vLLM's shared-memory broadcast and NCCL's intra-node buffers


@dataclass(frozen=True)
class MemoryBudget:
    limit_gib: float
    ranks: int
    l1_per_rank_gib: int
    vllm_host_gib: int
    shm_gib: int

    @property
    def total_gib(self) -> float:
        return self.ranks * self.l1_per_rank_gib + self.vllm_host_gib + self.shm_gib

    @property
    def fits(self) -> bool:
        return self.total_gib <= self.limit_gib


def parallel_ranks(args: tuple[str, ...] | list[str]) -> int:
    """GPU processes vLLM starts: tensor x pipeline parallel size, as the args give them."""
    def size(*flags: str) -> int:
        for flag in flags:
            value = arg_value(args, flag)
            if value is not None and value.isdigit():
                return int(value)
        return 1
    return (size("--tensor-parallel-size", "--tensor_parallel_size", "-tp")
            * size("--pipeline-parallel-size", "--pipeline_parallel_size", "-pp"))


def l1_budget(limit_gib: float, ranks: int, l1_total_gib: int = 0) -> MemoryBudget:
    """What each rank's L1 may be: the file's `l1CacheSizeGiB` split over the ranks, or (0)
    all the container's memory that vLLM and /dev/shm leave, split over the ranks."""
    host = VLLM_HOST_GIB_BASE + VLLM_HOST_GIB_PER_RANK * ranks
    shm = SHM_GIB_PER_RANK * ranks
    free = int(limit_gib - host - shm)
    per_rank = l1_total_gib // ranks if l1_total_gib else max(free, 0) // ranks
    return MemoryBudget(limit_gib, ranks, per_rank, host, shm)


# LMCache 0.5.x takes a redis:// or rediss:// password only inside `remote_url` (its `resp://`
# client reads LMCACHE_RESP_PASSWORD but has no TLS, which ElastiCache AUTH requires), and it
# logs that URL at INFO in five places (config dump, connector creation, connection). With a
# secret in the URL, LMCache logs at WARNING: none of its warnings carry the URL
# (tests/k8s/test_lmcache_config.py runs its code with a fake token to prove it).
LMCACHE_QUIET = ("LMCACHE_LOG_LEVEL", "WARNING")
# Workers call no outside host: vLLM's and LMCache's usage reports off (both send them unless
# told; in China the hosts are out of reach anyway). Not overridable by a file.
NO_TELEMETRY = (("VLLM_NO_USAGE_STATS", "1"), ("DO_NOT_TRACK", "1"),
                ("LMCACHE_TRACK_USAGE", "false"))
# vLLM's multiprocess metrics live in files; a restarted container must not read the last
# run's (vLLM warns about stale files): their own emptyDir, emptied by the start-up shell.
PROMETHEUS_DIR = "/run/prometheus"
# The container starts in a shell that empties the metrics directory and, where the endpoints
# have an API key, reads it into VLLM_API_KEY (an --api-key argument would be in vLLM's args
# log), then execs vLLM as chosen below.
CLEAR_METRICS = ('[ -n "$PROMETHEUS_MULTIPROC_DIR" ] && '
                 'rm -rf "$PROMETHEUS_MULTIPROC_DIR"/* 2>/dev/null; ')
READ_API_KEY = f'export VLLM_API_KEY="$(cat {API_KEY_FILE})"; '


def with_socket_timeouts(url: str) -> str:
    if not url.startswith(REDIS_SCHEMES):
        return url
    return f"{url}{'&' if '?' in url else '?'}{REDIS_SOCKET_TIMEOUTS}"


# Layerwise needs every forward step to run the per-layer hooks (save_kv_layer, and
# wait_for_layer_load before a layer reads loaded KV). Two kinds of step skip them:
# - a full CUDA graph replay (vLLM's default cudagraph_mode is FULL_AND_PIECEWISE from 0.11.0,
#   PIECEWISE in 0.10.2: config/__init__.py of each release): the graph replays only the GPU
#   work. LMCache 0.3.7's wait_for_save then calls next() on the last step's exhausted store
#   generators (they are reset only in save_kv_layer at layer 0): StopIteration, the engine
#   dies (LMCache/LMCache#2453). 0.5.4 keeps one generator per request and skips requests
#   without one (vllm_v1_adapter.py wait_for_save), but a request whose whole prompt but its
#   last token was a hit runs in a one-token decode graph without waiting for its layers to
#   load: attention reads KV still in flight (vllm-project/vllm#29608), in any release.
# - async scheduling (default on from vLLM 0.14.0: SchedulerConfig.async_scheduling None ->
#   True in config/vllm.py): the same StopIteration in LMCache 0.3.x (LMCache/LMCache#1844),
#   and no LMCache release we read accounts for its placeholder tokens.
# vLLM's own remedy (vllm-project/vllm#31057, in 0.27.1 not 0.14.0) forces PIECEWISE only when
# `kv_connector_extra_config.use_layerwise` is set, which LMCache does not read (it takes
# `lmcache.`-prefixed keys there, and our setting from its config file): it never fires for us.
# So layerwise is rendered only with the same guard written out, in the flags vLLM reads from
# 0.10.2 to 0.27.1 (compilation.py validate_cudagraph_mode_before takes the mode's name;
# --async-scheduling is a BooleanOptionalAction in arg_utils.py), and only for an image whose
# vLLM we know takes them; where the file sets graphs or scheduling itself, layerwise is off.
LAYERWISE_GUARD = ("--compilation-config", '{"cudagraph_mode":"PIECEWISE"}',
                   "--no-async-scheduling")
LAYERWISE_GUARD_SINCE = (0, 10, 2)   # the oldest vLLM whose parser we read for these flags
_STEP_FLAGS = ("--compilation-config", "-O", "-cc", "--async-scheduling", "--no-async-scheduling",
               "--enforce-eager", "--no-enforce-eager")


def layerwise_guard(vllm: tuple[int, int, int] | None, args: tuple[str, ...]) -> bool:
    """Can the worker run LMCache layerwise: a vLLM that takes LAYERWISE_GUARD, and args that
    do not choose CUDA graphs or scheduling themselves?"""
    if vllm is None or vllm < LAYERWISE_GUARD_SINCE:
        return False
    return not any(a.split("=", 1)[0].split(".", 1)[0].replace("_", "-") in _STEP_FLAGS
                   or (a.startswith("-O") and not a.startswith("--")) for a in args)


# A failed L2 read (server gone, a timeout) must never leave vLLM computing on KV that was not
# loaded. A synchronous load is counted as computed before it runs, and its blocks enter
# vLLM's prefix cache, so three things must hold: LMCache reports the blocks it failed to load
# (vllm_v1_adapter.py get_block_ids_with_load_errors, 0.3.9.post1 on), vLLM acts on them
# (scheduler.py _handle_invalid_blocks, 0.11.1 on), and LMCache survives vLLM's rollback (the
# request tracker truncated, 0.4.1 on; 0.3.9.post1 to 0.3.15 under vLLM 0.11.1+ die on an
# assert, LMCache issue #2294). LMCache 0.3.7 in lmcache/vllm-openai v0.3.7 catches the error
# (remote_backend.py get_blocking / batched_get_blocking return None and drop the connection),
# logs "This should not happen!" and vLLM 0.10.2 runs on the unloaded blocks: wrong text with
# HTTP 200. So only a known pair past both floors gets an L2.
L2_SAFE_VLLM: tuple[int, int, int] = (0, 11, 1)
L2_SAFE_LMCACHE: LMCacheVersion = (0, 4, 1)
# What vLLM does with the reported blocks: `kv_load_failure_policy` (KVTransferConfig, from
# 0.13.0; default "recompute" to 0.16, "fail" from 0.17.0). "recompute" rewinds the request, but
# in 0.27.1 the default Model Runner V2 rewinds only its CPU mirror of num_computed_tokens and
# builds positions from the GPU copy (gpu/model_runner.py update_requests, prepare_pos_seq_lens),
# and under async scheduling the in-flight placeholders are not rolled back
# (_update_requests_with_invalid_blocks): wrong output again (vllm-project/vllm#49250, open).
# "fail" ends the request with an error (HTTP 500) and evicts the blocks, so a retry
# recomputes: rendered explicitly wherever the key exists, whatever the release's default.
KV_LOAD_FAILURE_POLICY = "fail"
KV_LOAD_FAILURE_POLICY_SINCE: tuple[int, int, int] = (0, 13, 0)


def _release(version: tuple[int, ...]) -> str:
    return ".".join(map(str, version))


_SHIPPED = catalogue_release(IMAGES["vllm-lmcache"])   # not the team's record: read at import
# The images that may have an L2, as a refusal names them.
L2_IMAGES = (f"{IMAGES['vllm-lmcache'].source.split('/', 1)[1]}:{IMAGES['vllm-lmcache'].tag} "
             f"(vLLM {_release(_SHIPPED.vllm)} + LMCache {_release(_SHIPPED.lmcache)}), or "
             f"another image carrying a known LMCache {_release(L2_SAFE_LMCACHE)} or later "
             f"with a known vLLM {_release(L2_SAFE_VLLM)} or later")


def l2_refusal(vllm: tuple[int, int, int] | None, lmcache: LMCacheVersion | None) -> str | None:
    """Why an image with this vLLM and LMCache gets no L2 (above); None where it may."""
    if vllm is None or lmcache is None:
        carries = ("vLLM and LMCache releases" if vllm is None and lmcache is None else
                   f"LMCache release beside its vLLM {_release(vllm)}" if vllm else
                   f"vLLM release beside its LMCache {_release(lmcache)}")
        return (f"no public record pins the {carries} (config/images.py image_release), so "
                "nothing says a failed L2 read reaches vLLM rather than leaving it to compute "
                "on KV that never loaded; `python -m tools mirror --env <env>` reads them from "
                f"the image's layers into {IMAGES_LOCK.name}, which the next synth uses")
    if vllm >= L2_SAFE_VLLM and lmcache >= L2_SAFE_LMCACHE:
        return None
    v, lmc = _release(vllm), _release(lmcache)
    if lmcache < L2_SAFE_LMCACHE and vllm >= L2_SAFE_VLLM and lmcache >= (0, 3, 9):
        why = (f"LMCache {lmc} either does not report a failed L2 read or (0.3.9.post1 to "
               f"0.3.15) dies on an assert when vLLM {v} rolls the load back")
    else:
        why = " and ".join(
            ([f"LMCache {lmc} does not report a failed L2 read to vLLM"]
             if lmcache < L2_SAFE_LMCACHE else []) +
            ([f"vLLM {v} does not act on a load reported failed"]
             if vllm < L2_SAFE_VLLM else []))
        why += ", so a request reads KV that never loaded (wrong text, HTTP 200)"
    return (f"it carries vLLM {v} + LMCache {lmc}: {why}; an L2 takes LMCache "
            f"{_release(L2_SAFE_LMCACHE)} and vLLM {_release(L2_SAFE_VLLM)} or later")


def kv_transfer_config(vllm: tuple[int, int, int] | None, l2: bool) -> dict[str, str]:
    """The `--kv-transfer-config` we add where the file has none: LMCache's connector, and with
    an L2 the load-failure policy where the image's vLLM has the key (above)."""
    config = {"kv_connector": "LMCacheConnectorV1", "kv_role": "kv_both"}
    if l2 and vllm is not None and vllm >= KV_LOAD_FAILURE_POLICY_SINCE:
        config["kv_load_failure_policy"] = KV_LOAD_FAILURE_POLICY
    return config


def layerwise(p: WorkerProps) -> bool:
    """Does this worker's LMCache store layer by layer (TIER_POLICY, with its guard)?"""
    return (p.pd is None   # not on P/D workers until a GPU run shows it beside NIXL
            and not p.multi_process
            and tier_settings(p.lmcache, p.l2 is not None).get("use_layerwise") is True
            and layerwise_guard(p.vllm, (*p.command, *p.extra_args)))


def lmcache_config(p: WorkerProps) -> dict:
    """LMCache engine settings for the LMCache the worker image carries: TIER_POLICY, L1 per
    rank, and the L2 URL (appended at pod start where it carries a secret)."""
    cfg = tier_settings(p.lmcache, p.l2 is not None)
    if not layerwise(p):
        cfg.pop("use_layerwise", None)   # LMCache's default: the store waits in wait_for_save
    cfg.update(local_cpu=p.l1_enabled,
               max_local_cpu_size=float(p.l1_size_gib if p.l1_enabled else 0))
    if p.l2:
        if p.l2.extra:
            cfg["extra_config"] = {**cfg.get("extra_config", {}), **dict(p.l2.extra)}
        if p.l2.blocking_timeout_s is not None:
            cfg["blocking_timeout_secs"] = p.l2.blocking_timeout_s
        # with a secret in the URL, the URL is appended at pod start
        if not p.l2.secret_arn or p.l2.password_key:
            cfg["remote_url"] = with_socket_timeouts(p.l2.url)
    return cfg


# Termination. The router drops a pod once it is not ready (its discovery watches pods), so the
# preStop hook first waits WORKER_PRE_STOP_S; vLLM then gets no new request, and the hook waits
# until the requests it holds (vllm:num_requests_running + waiting, from its own /metrics) are
# done (and a second more, for their last bytes), at most WORKER_DRAIN_S, the longest request
# the router lets run. Only then does the
# kubelet send SIGTERM, to which vLLM before 0.18.0 answers by aborting whatever it still runs
# (the fault drill: a worker rollout cut 2 of 584 streams; 0 of 634 with a drain). vLLM 0.18.0 on
# also drains itself with `--shutdown-timeout` (EngineArgs.shutdown_timeout; vllm-project/vllm
# #34730, reverted and re-applied by #36666 on 2026-03-10; 0, the default, aborts): rendered too
# where the image's vLLM has it, for a request that slips in late; an image whose vLLM lacks it,
# or is unknown, never gets it (vLLM refuses an unknown flag). The hook runs with the image's own
# python (standard library only), found in an image of no family we know (FIND_PYTHON).
WORKER_PRE_STOP_S = 15
SHUTDOWN_TIMEOUT_SINCE: tuple[int, int, int] = (0, 18, 0)
WORKER_DRAIN_S = LONGEST_REQUEST_S
# After the drain: the engine's own exit (vLLM gives its engine core 5 s) and the kubelet's slack.
WORKER_EXIT_S = 30
# The worker's own counters as the drain hook and the stall probe (below) both read them from its
# /metrics (standard library only), so the two share one rule for progress: either token
# counter, each moved every engine step, has grown.
READ_COUNTERS = """\
COUNTERS = {"vllm:num_requests_running": "running", "vllm:num_requests_waiting": "waiting",
            "vllm:generation_tokens_total": "tokens", "vllm:prompt_tokens_total": "tokens"}
def counters(text):
    got = dict.fromkeys(COUNTERS.values(), 0.0)
    for line in text.decode().splitlines():
        key = COUNTERS.get(line.split("{", 1)[0].split(" ", 1)[0])
        if key:
            got[key] += float(line.rsplit(" ", 1)[1])
    return got
"""
# A stalled engine (requests running, neither token counter moving: the liveness probe's rule,
# below) never drains: the hook gives up once it has seen no progress for STALL_S, counted from
# the last progress the liveness probe recorded (its state file, shared through /tmp), so a
# kill that the probe's failures started passes the hook at once and a rollout of a stalled
# engine waits STALL_S at most, not WORKER_DRAIN_S (the fault drill: 615 s, the restart at 868 s).
DRAIN_HOOK = """\
import json, sys, time, urllib.request
""" + READ_COUNTERS + """\
port, least, most, stall_s, state = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), \\
    float(sys.argv[4]), sys.argv[5]
start = time.time()
try:
    with open(state) as f:
        seen = json.load(f)
    tokens, since = seen["tokens"], seen["since"]
except (OSError, ValueError, KeyError, TypeError):
    tokens, since = None, start
time.sleep(least)
while time.time() - start < most:
    try:
        got = counters(urllib.request.urlopen("http://127.0.0.1:" + port + "/metrics",
                                              timeout=2).read())
    except OSError:
        break
    busy = got["running"] + got["waiting"]
    if busy == 0:
        break
    now = time.time()
    if got["tokens"] != tokens:
        tokens, since = got["tokens"], now
    elif now - since > stall_s:
        sys.exit(f"drain: engine stalled, {busy:g} requests held, no token for "
                 f"{now - since:.0f} s: left to the kill")
    time.sleep(1)
time.sleep(min(1.0, least))
"""


# An image of no family we know still runs vLLM, a Python program: the drain hook and the
# stall probe (standard library only) run with the first python3 found where vLLM's own is
# (beside the `vllm` on PATH, LMCache's /opt/venv) or on PATH. Called `sh -c FIND_PYTHON
# find-python SECONDS -c SCRIPT ARGS...`; where the image has no python at all, it waits
# SECONDS and succeeds (the drain's plain wait, a probe that cannot judge: 0).
FIND_PYTHON = (
    'wait_s=$1; shift; v=$(command -v vllm 2>/dev/null); '
    'for py in "${v%/*}/python3" "${v%/*}/python" /opt/venv/bin/python3 '
    '"$(command -v python3 2>/dev/null)" /usr/bin/python3; do '
    'if [ -x "$py" ]; then exec "$py" "$@"; fi; done; '
    'echo "no python3 in the image: nothing to run the check with" >&2; sleep "$wait_s"')


def image_python(p: "WorkerProps", wait_s: int = 0) -> list[str]:
    """The command that starts the image's python: the family's, else FIND_PYTHON's."""
    if p.family is not None:
        return [p.family.python]
    return ["/bin/sh", "-c", FIND_PYTHON, "find-python", str(wait_s)]


def drains(p: "WorkerProps") -> bool:
    """Does this worker's vLLM take `--shutdown-timeout` (above)?"""
    return p.vllm is not None and p.vllm >= SHUTDOWN_TIMEOUT_SINCE


def pre_stop(p: "WorkerProps") -> dict:
    """The vLLM container's preStop hook (above): the drain with the image's python (found,
    where the image is of no family we know), or the plain wait where it has none."""
    return {"exec": {"command": [*image_python(p, WORKER_PRE_STOP_S), "-c", DRAIN_HOOK,
                                 str(p.port),
                                 str(WORKER_PRE_STOP_S),
                                 str(WORKER_PRE_STOP_S + WORKER_DRAIN_S), str(STALL_S),
                                 LIVENESS_STATE]}}


def termination_grace_s(p: "WorkerProps") -> int:
    """terminationGracePeriodSeconds: the preStop hook's longest wait, or the drain the args
    carry (the file's own `--shutdown-timeout` if it sets one), and the exit."""
    value = arg_value(vllm_args(p), "--shutdown-timeout")
    try:
        drain = int(value) if value else 0
    except ValueError:
        raise ValueError(f"endpoint {p.endpoint}: worker args --shutdown-timeout {value!r}: "
                         "whole seconds") from None
    # the hook's drain, whatever the image (FIND_PYTHON runs it in one of no family we know)
    return WORKER_PRE_STOP_S + max(drain, WORKER_DRAIN_S) + WORKER_EXIT_S


# Liveness. vLLM's /health asks only whether the engine process is alive: an engine that stops
# producing tokens (a stuck collective, a hung kernel) keeps answering 200, holds the streams on
# it and keeps receiving new requests (the fault drill: never taken out, first tokens 38 s late).
# So the liveness probe also reads the worker's own metrics: requests running while neither
# token counter (vllm:generation_tokens_total, vllm:prompt_tokens_total, both counted per engine
# step) has moved for STALL_S fails it, and the kubelet restarts the container: its connections
# close (clients see a cut stream, never a success). The readiness probe runs the same rule, so
# the pod leaves the routers' discovery before the kill (and /health, still 200, cannot keep
# it in). STALL_S outlasts the longest step that moves neither counter, a whole
# 128K-token prefill on the slowest prefill we know (~2,200 tokens/s on 2 x A10G, 60 s), three
# times over. Exec probe with the image's own python (standard library only); an image of no
# family we know keeps the HTTP check alone.
STALL_S = 180
LIVENESS_STATE = "/tmp/kvcache-liveness.json"
READINESS_STATE = "/tmp/kvcache-readiness.json"
PROBE_PERIOD_S, PROBE_TIMEOUT_S = 10, 5
# The stall window is the patience; the failures after it only ride out one slow answer. The
# stalled engine's clients are told (its connections close) at most LIVENESS_FAILURES x
# PROBE_PERIOD_S + LIVENESS_GRACE_S = 50 s after the probe first fails (the drill: 678 s later,
# the restart at 868 s: the pod's 645 s grace and a drain that waited for requests that never end).
LIVENESS_FAILURES, READINESS_FAILURES = 3, 2
LIVENESS_GRACE_S = 20
STALL_PROBE = """\
import json, sys, time, urllib.request
""" + READ_COUNTERS + """\
port, stall_s, state, path = sys.argv[1], float(sys.argv[2]), sys.argv[3], sys.argv[4]
base, timeout = "http://127.0.0.1:" + port, float(sys.argv[5])
urllib.request.urlopen(base + path, timeout=timeout).read()
got = counters(urllib.request.urlopen(base + "/metrics", timeout=timeout).read())
running, tokens = got["running"], got["tokens"]
now = time.time()
try:
    with open(state) as f:
        last = json.load(f)
except (OSError, ValueError):
    last = None
if last is None or running == 0 or tokens != last["tokens"]:
    with open(state, "w") as f:
        json.dump({"tokens": tokens, "since": now}, f)
elif now - last["since"] > stall_s:
    sys.exit(f"engine stalled: {running:g} requests running, no token for "
             f"{now - last['since']:.0f} s")
"""


STARTUP_PERIOD_S = 10
HUB_TOKEN_FILE = "/run/hub-token/token"
# (fetch-tmp is the aws CLI's scratch, shared with the API key's fetch where both run)
HUB_TOKEN_VOLUMES = [{"name": "hub-token", "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}}]
# huggingface_hub's own download (the worker image carries it beside vLLM): resumable, checks
# what it fetched, reads the token from the file only.
HUB_DOWNLOAD = (
    "import os\n"
    "from huggingface_hub import snapshot_download\n"
    "path = os.environ.get('HUB_TOKEN_FILE', '')\n"
    "token = open(path).read().strip() if path and os.path.exists(path) else None\n"
    "snapshot_download(repo_id=os.environ['HUB_MODEL_ID'],\n"
    "                  revision=os.environ.get('HUB_REVISION') or None,\n"
    "                  local_dir=os.environ['TARGET'], token=token or False)\n")


def hub_stage_container(p: "WorkerProps", model_dir: str) -> dict:
    """huggingFaceModel (global regions): the model from the Hub into the model volume, with
    the worker image's own python and huggingface_hub, before vLLM starts."""
    assert p.hub is not None
    python = p.family.python if p.family else "python3"
    env = [{"name": "HUB_MODEL_ID", "value": p.hub.model_id},
           {"name": "TARGET", "value": model_dir},
           {"name": "HF_HOME", "value": "/tmp/hf"},
           {"name": "HF_HUB_DISABLE_TELEMETRY", "value": "1"}, *SCRATCH_ENV]
    if p.hub.revision:
        env.append({"name": "HUB_REVISION", "value": p.hub.revision})
    mounts = [{"name": "model-weights", "mountPath": MODELS_DIR},
              {"name": "home", "mountPath": WORKER_HOME}, {"name": "tmp", "mountPath": "/tmp"}]
    if p.hub_token_arn:
        env.append({"name": "HUB_TOKEN_FILE", "value": HUB_TOKEN_FILE})
        mounts.append({"name": "hub-token", "mountPath": HUB_TOKEN_FILE.rsplit("/", 1)[0],
                       "readOnly": True})
    return {"name": "stage-model", "image": p.image, "imagePullPolicy": "IfNotPresent",
            "command": [python, "-c", HUB_DOWNLOAD], "env": env, "volumeMounts": mounts,
            "resources": {"requests": {"cpu": "2", "memory": "2Gi"},
                          "limits": {"cpu": "4", "memory": "4Gi"}},
            "securityContext": hardened(run_as_user=WORKER_UID)}


def startup_failures(p: "WorkerProps") -> int:
    """Startup probe failures allowed: the startup budget in probe periods, rounded up."""
    return -(-p.startup_budget_s // STARTUP_PERIOD_S)


def file_init_container(c: Mapping[str, Any]) -> dict:
    """A file's init container under our hardening: its securityContext may only narrow ours
    (config/pod_fields.py refused the rest), and it gets bounded resources where it names
    none."""
    out = dict(c)
    out["securityContext"] = {**hardened(run_as_user=WORKER_UID), **c.get("securityContext", {})}
    out.setdefault("imagePullPolicy", "IfNotPresent")
    out.setdefault("resources", {"requests": {"cpu": "500m", "memory": "512Mi"},
                                 "limits": {"cpu": "2", "memory": "2Gi"}})
    return out


def liveness_probe(p: "WorkerProps") -> dict:
    """The vLLM container's livenessProbe: the stall check (above), with the image's python
    (found by FIND_PYTHON in an image of no family we know); LIVENESS_FAILURES failures
    PROBE_PERIOD_S apart restart it,
    with a grace period of its own (the kubelet's ProbeTerminationGracePeriod, GA in
    Kubernetes 1.28), so the restart comes within LIVENESS_GRACE_S of the kill whatever the
    drain hook or vLLM's own `--shutdown-timeout` would wait for on a stalled engine."""
    probe = {"periodSeconds": PROBE_PERIOD_S, "timeoutSeconds": PROBE_TIMEOUT_S,
             "failureThreshold": LIVENESS_FAILURES,
             "terminationGracePeriodSeconds": LIVENESS_GRACE_S}
    return {"exec": {"command": stall_check(p, LIVENESS_STATE)}, **probe}


def readiness_probe(p: "WorkerProps") -> dict:
    """The vLLM container's readinessProbe: the liveness rule with its own state file, so a
    stalled engine turns not ready (the routers' discovery drops it: no new request, no later
    turn of its sessions) READINESS_FAILURES periods after its stall window, before the
    liveness probe's kill."""
    probe = {"periodSeconds": PROBE_PERIOD_S, "timeoutSeconds": PROBE_TIMEOUT_S}
    return {"exec": {"command": stall_check(p, READINESS_STATE)}, **probe,
            "failureThreshold": READINESS_FAILURES}


def stall_check(p: "WorkerProps", state: str) -> list[str]:
    """The stall probe's command, each HTTP call within half the probe's timeout (what the
    kubelet allows the whole command)."""
    return [*image_python(p), "-c", STALL_PROBE, str(p.port), str(STALL_S), state,
            p.health_check_path, str(PROBE_TIMEOUT_S / 2)]


# vLLM's OpenAI server module: accepts `--model` in every vLLM version, where `vllm serve`
# takes the model as a positional argument and warns about (later refuses) `--model`.
API_SERVER_MODULE = "vllm.entrypoints.openai.api_server"
# An image we know nothing about: the first vLLM found on PATH or in LMCache's /opt/venv.
PROBE = ('for v in "$(command -v vllm)" /opt/venv/bin/vllm; do '
         'if [ -x "$v" ]; then exec "$v" serve "$@"; fi; done; '
         'echo "no vllm executable on PATH or in /opt/venv/bin" >&2; exit 127')


def _flags(args: tuple[str, ...] | list[str]) -> set[str]:
    """Flag names given, as vLLM reads them (`--served_model_name=x` is --served-model-name)."""
    return {a.split("=", 1)[0].replace("_", "-") for a in args if a.startswith("--")}


def vllm_command(p: WorkerProps) -> list[str]:
    """How the image's vLLM starts: the file's command (a bare `vllm`/`python3` that the image's
    PATH does not lead to vLLM replaced by the family's own binary), else the family's `vllm
    serve`, or its python with the API server module for args written with `--model`
    (HyperPod's published `--model /opt/ml/model` files). Empty for an unknown image: the
    start-up shell probes for vLLM."""
    f = p.family
    if p.command:
        head, *rest = p.command
        if f and head in ("vllm", "python", "python3") and head not in f.on_path:
            head = f.vllm if head == "vllm" else f.python
        return [head, *rest]
    if f is None:
        return []
    if "--model" in _flags(p.extra_args):
        return [f.python, "-m", API_SERVER_MODULE]
    return [f.vllm, "serve"]


def container_command(p: WorkerProps) -> list[str]:
    """The worker container's command: the start-up shell, then vLLM (see vllm_command)."""
    script = CLEAR_METRICS + (READ_API_KEY if p.api_key else "")
    command = vllm_command(p)
    script += 'exec "$@"' if command else PROBE
    return ["/bin/sh", "-c", script, "vllm", *command]


def vllm_args(p: WorkerProps) -> list[str]:
    """The file's args as written, then only what they lack: the model path (where the weights
    are mounted), where to listen, the served name, LMCache's connector and KV events."""
    given = _flags(p.extra_args)
    args = [] if p.command or named_model(p.extra_args) else [p.model_mount_path]
    args += list(p.extra_args)
    transfer = (pd_transfer_config(p.pd.role, p.l1_enabled) if p.pd else
                kv_transfer_config(p.vllm, p.l2 is not None))
    if p.multi_process:
        transfer = {**mp_kv_transfer_config(), **{k: v for k, v in transfer.items()
                                                  if k == "kv_load_failure_policy"}}
    # with request limits vLLM listens on loopback: the sidecar is the pod's only way in
    # (routers, the gateway, Prometheus and the kubelet's startup probe all come through it)
    host = "127.0.0.1" if p.request_limits else "0.0.0.0"
    own = {"--served-model-name": p.model_name, "--host": host, "--port": str(p.port),
           "--kv-transfer-config": json.dumps(transfer, separators=(",", ":"))}
    for flag, value in own.items():
        if flag not in given:
            args += [flag, value]
    if drains(p) and "--shutdown-timeout" not in given:
        args += ["--shutdown-timeout", str(WORKER_DRAIN_S)]
    if layerwise(p):
        args += LAYERWISE_GUARD
    if p.publish_kv_events:
        args += ["--kv-events-config", json.dumps({
            "enable_kv_cache_events": True, "publisher": "zmq",
            # vllm-router 0.1.17 subscribes to topic "" only; its block size must match.
            "endpoint": f"tcp://*:{KV_EVENTS_PORT}", "topic": "", "buffer_steps": 10000,
            "hwm": 100000}, separators=(",", ":")), "--block-size", str(KV_BLOCK_SIZE)]
    return args


def served_model_names(p: WorkerProps) -> tuple[str, ...]:
    """The names vLLM serves the model under, as its `/v1/models` lists them: every value of
    `--served-model-name` in the rendered args (the flag takes one or more)."""
    args = vllm_args(p)
    for i, tok in enumerate(args):
        flag, eq, value = tok.partition("=")
        if flag.replace("_", "-") != "--served-model-name":
            continue
        if eq:
            return (value,)
        names = []
        for t in args[i + 1:]:
            if t.startswith("-"):
                break
            names.append(t)
        return tuple(names)
    return (p.model_name,)


def worker_urls(p: WorkerProps) -> tuple[str, ...]:
    """Stable DNS names of StatefulSet workers, for the router's static lists."""
    svc = f"{p.endpoint}-workers"
    return tuple(f"http://{svc}-{i}.{svc}.{p.namespace}.svc.cluster.local:{p.router_port}"
                 for i in range(p.replicas))


def kv_event_endpoints(p: WorkerProps) -> tuple[str, ...]:
    svc = f"{p.endpoint}-workers"
    return tuple(f"tcp://{svc}-{i}.{svc}.{p.namespace}.svc.cluster.local:{KV_EVENTS_PORT}"
                 for i in range(p.replicas))


class WorkersChart(Chart):
    def __init__(self, scope: Construct, id: str, *, props: WorkerProps) -> None:
        super().__init__(scope, id, namespace=props.namespace)
        p = props
        name = f"{p.endpoint}-{p.pd.role}" if p.pd else f"{p.endpoint}-workers"
        sel = pd_selector(p.endpoint, p.pd.role) if p.pd else selector_labels(COMPONENT,
                                                                               p.endpoint)
        labels = {**standard_labels(COMPONENT, p.endpoint), **sel}
        self.selector = sel
        self.flows = (Flow(PROMETHEUS, Peer(name, p.namespace, sel), p.router_port,
                           "vLLM and LMCache metrics"),)
        if p.owns_service_account:
            k8s_object(self, "ServiceAccount", api_version="v1", kind="ServiceAccount",
                       name=p.service_account, namespace=p.namespace,
                       labels=standard_labels(COMPONENT, p.endpoint),
                       body={"automountServiceAccountToken": False})
        k8s_object(self, "LmcacheConfig", api_version="v1", kind="ConfigMap",
                   name=f"{name}-lmcache", namespace=p.namespace, labels=labels,
                   body={"data": {"lmcache.yaml": yaml.safe_dump(lmcache_config(p),
                                                                 sort_keys=True)}})
        model_dir = f"{MODELS_DIR}/{p.endpoint}"
        stage = {
            "name": "stage-model", "image": p.staging_image, "imagePullPolicy": "IfNotPresent",
            "command": ["aws", "s3", "sync", "--only-show-errors", "--no-progress",
                        f"s3://{p.model_bucket}/{p.model_location}/", model_dir],
            "env": [{"name": "AWS_REGION", "value": p.region}, *SCRATCH_ENV],
            "volumeMounts": [{"name": "model-weights", "mountPath": MODELS_DIR},
                             {"name": "home", "mountPath": WORKER_HOME},
                             {"name": "tmp", "mountPath": "/tmp"}],
            "resources": {"requests": {"cpu": "2", "memory": "2Gi"},
                          "limits": {"cpu": "4", "memory": "4Gi"}},
            "securityContext": hardened(run_as_user=WORKER_UID),
        }
        if p.hub:
            stage = hub_stage_container(p, model_dir)
        init = [stage]
        if p.hub and p.hub_token_arn:   # the token only ever in this pod's memory volume
            init.insert(0, fetch_secret_container(
                name="fetch-hub-token", image=p.staging_image, region=p.region,
                secret_arn=p.hub_token_arn, out_file=HUB_TOKEN_FILE, volume="hub-token",
                run_as_user=WORKER_UID))
        config_file = f"{LMCACHE_DIR}/lmcache.yaml"
        if p.l2 and p.l2.secret_arn:
            # The password never leaves Secrets Manager except into this pod's memory volume.
            script = ("set -eu; TOKEN=$(aws secretsmanager get-secret-value --secret-id "
                      "\"$SECRET_ARN\" --query SecretString --output text); "
                      "cp /config/lmcache.yaml \"$OUT\"; "
                      + (  # valkey://: the password is an extra_config key (an alphanumeric
                         # token: nothing in it needs quoting in YAML or sed)
                         "sed -i \"s/^extra_config:$/extra_config:\\n  $PASSWORD_KEY: "
                         "\\\"${TOKEN}\\\"/\" \"$OUT\"" if p.l2.password_key else
                         "printf 'remote_url: \"%s\"\\n' "
                         "\"$(echo \"$L2_URL\" | sed \"s#://#://:${TOKEN}@#\")\" >> \"$OUT\""))
            init.append({
                "name": "fetch-l2-secret", "image": p.staging_image,
                "imagePullPolicy": "IfNotPresent", "command": ["/bin/sh", "-c", script],
                "env": [{"name": "AWS_REGION", "value": p.region},
                        {"name": "SECRET_ARN", "value": p.l2.secret_arn},
                        {"name": "L2_URL", "value": with_socket_timeouts(p.l2.url)},
                        *([{"name": "PASSWORD_KEY", "value": p.l2.password_key}]
                          if p.l2.password_key else []),
                        {"name": "OUT", "value": "/run/lmcache/lmcache.yaml"}, *SCRATCH_ENV],
                "volumeMounts": [{"name": "lmcache-base", "mountPath": "/config"},
                                 {"name": "lmcache-runtime", "mountPath": "/run/lmcache"},
                                 {"name": "home", "mountPath": WORKER_HOME},
                                 {"name": "tmp", "mountPath": "/tmp"}],
                "resources": {"requests": {"cpu": "100m", "memory": "128Mi"},
                              "limits": {"cpu": "500m", "memory": "256Mi"}},
                "securityContext": hardened(run_as_user=WORKER_UID),
            })
            config_file = "/run/lmcache/lmcache.yaml"
        if p.api_key:
            init.append(fetch_api_key_container(p.api_key, run_as_user=WORKER_UID))
        init += [file_init_container(c) for c in p.extra_init]
        pod_annotations: dict[str, str] = dict(p.pod_annotations)   # ours win below
        extra_volumes: list[dict] = [*map(dict, p.extra_volumes)]
        # the pod's sidecars come out of the worker's share, so the pod still fits its node
        vllm_cpu_m, vllm_mib = _millicores(p.cpu), _memory_gib(p.memory) * 1024
        shm_gib = p.shm_gib
        if p.multi_process:
            # L1 moves from vLLM's container into the server's, in the shared /dev/shm
            why = mp_refusal(p.endpoint, p.l2.url if p.l2 else None,
                             bool(p.l2 and p.l2.secret_arn))
            if p.family is None or p.lmcache is None or p.lmcache < LMCACHE_MP_SINCE:
                why = (f"endpoint {p.endpoint}: spec.lmcache.mode MultiProcess needs LMCache "
                       "0.5.0 or newer in a worker image we know")
            if not p.l1_total_gib:
                why = (f"endpoint {p.endpoint}: spec.lmcache.mode MultiProcess keeps KV in the "
                       "server's L1: kvCacheSpec.enableL1Cache false leaves it none")
            if p.pd is not None:   # NIXL's connector is the engine's; the server's would replace it
                why = (f"endpoint {p.endpoint}: spec.lmcache.mode MultiProcess with pdSpec is "
                       "not rendered: use InProcess on a disaggregated endpoint")
            if why:
                raise ValueError(why)
            server_gib = p.l1_total_gib + SERVER_OVERHEAD_GIB
            vllm_mib -= server_gib * 1024
            vllm_cpu_m -= _millicores(SERVER_CPU)
            shm_gib += p.l1_total_gib
            init.append(server_container(
                image=p.image, python=p.family.python,
                args=server_args(p.l1_total_gib, CHUNK_TOKENS,
                                 p.l2.url if p.l2 else None),
                memory_gib=server_gib, security_context=hardened(run_as_user=WORKER_UID),
                mounts=[{"name": "dshm", "mountPath": "/dev/shm"},
                        {"name": "home", "mountPath": WORKER_HOME},
                        {"name": "tmp", "mountPath": "/tmp"}],
                env=[*SCRATCH_ENV]))
        if p.request_limits:
            if not p.sidecar_image:
                raise ValueError(f"endpoint {p.endpoint}: request limits need the sidecar image")
            text = limits_config(p.request_limits)
            k8s_object(self, "LimitsConfig", api_version="v1", kind="ConfigMap",
                       name=f"{name}-limits", namespace=p.namespace, labels=labels,
                       body={"data": {LIMITS_CONFIG: text}})
            init.append(limits_container(p.sidecar_image, "limits-config", p.port))
            vllm_cpu_m -= _millicores(LIMITS_CPU)
            vllm_mib -= LIMITS_MEMORY_MIB
            extra_volumes.append({"name": "limits-config",
                                  "configMap": {"name": f"{name}-limits"}})
            pod_annotations["kvcache.io/limits-config"] = hashlib.sha256(
                text.encode()).hexdigest()[:16]
        health = {"httpGet": {"path": p.health_check_path,
                              "port": WORKER_LIMITS_PORT if p.request_limits else "http"},
                  "periodSeconds": 10, "timeoutSeconds": 5}
        env = [{"name": "HF_HUB_OFFLINE", "value": "1"},
               {"name": "TRANSFORMERS_OFFLINE", "value": "1"},
               {"name": "LMCACHE_CONFIG_FILE", "value": config_file},
               {"name": "PROMETHEUS_MULTIPROC_DIR", "value": PROMETHEUS_DIR}, *SCRATCH_ENV]
        # The file's variables as written; one it shares with ours replaces ours, except the
        # config file, the telemetry switches and the metrics directory (the start-up shell
        # empties it: a file's `/tmp` would lose vLLM's compile caches).
        ours_only = {"LMCACHE_CONFIG_FILE", "PROMETHEUS_MULTIPROC_DIR",
                     *(k for k, _ in NO_TELEMETRY)}
        theirs = {e["name"] for e in p.extra_env}
        env = [e for e in env if e["name"] not in theirs or e["name"] in ours_only]
        env += [dict(e) for e in p.extra_env if e["name"] not in ours_only]
        env += [{"name": k, "value": v} for k, v in NO_TELEMETRY]
        if p.l2 and p.l2.secret_arn:
            env.append({"name": LMCACHE_QUIET[0], "value": LMCACHE_QUIET[1]})
        if "PYTHONHASHSEED" not in theirs:
            env.append({"name": "PYTHONHASHSEED", "value": "0"})  # same hashes on every worker
        ports = [{"name": "http", "containerPort": p.port}]
        if p.pd:
            # NIXL's side channel (the decode worker reads the prefill's block metadata there,
            # then the blocks over EFA); libfabric kept to EFA, never a silent TCP fallback
            env += [{"name": "VLLM_NIXL_SIDE_CHANNEL_HOST",
                     "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                    {"name": "VLLM_NIXL_SIDE_CHANNEL_PORT", "value": str(NIXL_SIDE_CHANNEL_PORT)},
                    {"name": "FI_PROVIDER", "value": "efa"}]
            ports.append({"name": "nixl", "containerPort": NIXL_SIDE_CHANNEL_PORT})
            self.flows += (Flow(Peer(f"{p.endpoint}-decode", p.namespace,
                                     pd_selector(p.endpoint, "decode")),
                                Peer(name, p.namespace, sel), NIXL_SIDE_CHANNEL_PORT,
                                "NIXL side channel: KV block metadata (the blocks go over EFA)"),
                           ) if p.pd.role == "prefill" else ()
        if p.publish_kv_events:
            ports.append({"name": "kv-events", "containerPort": KV_EVENTS_PORT})
        vllm_cpu = p.cpu if vllm_cpu_m == _millicores(p.cpu) else f"{vllm_cpu_m}m"
        vllm_memory = p.memory if vllm_mib == _memory_gib(p.memory) * 1024 else f"{vllm_mib}Mi"
        if (vllm_cpu, vllm_memory) != (p.cpu, p.memory) and (vllm_cpu_m < VLLM_MIN_CPU_M
                                                            or vllm_mib < VLLM_MIN_MIB):
            raise ValueError(f"endpoint {p.endpoint}: worker resources cpu {p.cpu}, memory "
                             f"{p.memory} leave vLLM {vllm_cpu_m}m, {vllm_mib}Mi beside its "
                             "sidecars; allowed: more (spec.worker.resources.requests)")
        worker = {
            "name": "vllm", "image": p.image, "imagePullPolicy": "IfNotPresent",
            "command": container_command(p),
            "args": vllm_args(p), "env": env, "ports": ports,
            "resources": {
                "requests": {"cpu": vllm_cpu, "memory": vllm_memory, GPU_RESOURCE: str(p.gpus),
                             **efa_resources(p)},
                "limits": {"memory": vllm_memory, GPU_RESOURCE: str(p.gpus),
                           **efa_resources(p)}},
            # the startup budget (default 30 min) to load weights and start
            "startupProbe": {**health, "failureThreshold": startup_failures(p)},
            "readinessProbe": readiness_probe(p),
            "livenessProbe": liveness_probe(p),
            "lifecycle": {"preStop": pre_stop(p)},
            "volumeMounts": [
                {"name": "model-weights", "mountPath": p.model_mount_path,
                 "subPath": p.endpoint, "readOnly": True},
                {"name": "dshm", "mountPath": "/dev/shm"},
                {"name": "home", "mountPath": WORKER_HOME},
                {"name": "tmp", "mountPath": "/tmp"},
                {"name": "prometheus", "mountPath": PROMETHEUS_DIR},
                {"name": "lmcache-base", "mountPath": LMCACHE_DIR, "readOnly": True},
                {"name": "lmcache-runtime", "mountPath": "/run/lmcache", "readOnly": True},
                *([{"name": "api-key", "mountPath": SECRETS_DIR, "readOnly": True}]
                  if p.api_key else [])],
            "securityContext": pd_security(hardened(run_as_user=WORKER_UID), p),
        }
        if p.working_dir:
            worker["workingDir"] = p.working_dir
        pod = {
            "metadata": {"labels": labels,
                         **({"annotations": pod_annotations} if pod_annotations else {})},
            "spec": {
                "serviceAccountName": p.service_account,
                "automountServiceAccountToken": False,
                "securityContext": pod_security(WORKER_UID),
                "nodeSelector": {NODE_ROLE_LABEL: NODE_ROLE_GPU, NODE_GROUP_LABEL: p.node_group,
                                 **dict(p.pd.node_selector if p.pd else ())},
                **zone_affinity(p),
                "tolerations": [{"key": GPU_TAINT_KEY, "operator": "Exists",
                                 "effect": "NoSchedule"}, *map(dict, p.tolerations)],
                **({"affinity": {"nodeAffinity": dict(p.node_affinity)}}
                   if p.node_affinity else {}),
                "topologySpreadConstraints": zone_spread(sel),
                "terminationGracePeriodSeconds": termination_grace_s(p),
                "initContainers": init, "containers": [worker],
                "volumes": [
                    {"name": "model-weights", "emptyDir": {}},
                    {"name": "dshm", "emptyDir": {"medium": "Memory",
                                                  "sizeLimit": f"{shm_gib}Gi"}},
                    {"name": "home", "emptyDir": {"sizeLimit": "20Gi"}},   # compile caches
                    {"name": "tmp", "emptyDir": {"sizeLimit": "4Gi"}},
                    {"name": "prometheus", "emptyDir": {"sizeLimit": "1Gi"}},
                    {"name": "lmcache-base", "configMap": {"name": f"{name}-lmcache"}},
                    {"name": "lmcache-runtime", "emptyDir": {"medium": "Memory",
                                                             "sizeLimit": "1Mi"}},
                    *(API_KEY_VOLUMES if p.api_key else []),
                    *(HUB_TOKEN_VOLUMES if p.hub and p.hub_token_arn else []),
                    *(API_KEY_VOLUMES[1:] if p.hub and p.hub_token_arn and not p.api_key
                      else []),
                    *extra_volumes],
            }}
        spec = {"replicas": p.replicas, "selector": {"matchLabels": sel}, "template": pod}
        if p.stateful:
            spec.update(serviceName=name, podManagementPolicy="Parallel")
            kind = "StatefulSet"
        else:
            spec["strategy"] = {"type": "RollingUpdate",
                                "rollingUpdate": {"maxUnavailable": 1, "maxSurge": 0}}
            kind = "Deployment"
        k8s_object(self, "Workload", api_version="apps/v1", kind=kind, name=name,
                   namespace=p.namespace, labels=labels, body={"spec": spec})
        pdb(self, name=name, namespace=p.namespace, labels=labels, selector=sel)
        # Prometheus scrapes the `http` port: vLLM, or with request limits the sidecar (its
        # open backend passes /metrics without a slot) where vLLM listens on loopback
        svc_ports = [{"name": "http", "port": p.port,
                      "targetPort": "limited" if p.request_limits else "http"}]
        if p.request_limits:
            svc_ports.append({"name": "limited", "port": WORKER_LIMITS_PORT,
                              "targetPort": "limited"})
        if p.publish_kv_events:
            svc_ports.append({"name": "kv-events", "port": KV_EVENTS_PORT,
                              "targetPort": "kv-events"})
        if p.scaling:
            self._scaled_object(name, kind, labels, p.scaling, p.region)
        # Headless: stable per-pod DNS (StatefulSet) and a scrape target list for Prometheus.
        k8s_object(self, "Service", api_version="v1", kind="Service", name=name,
                   namespace=p.namespace, labels=labels, body={"spec": {
                       "clusterIP": "None", "selector": sel, "ports": svc_ports,
                       "publishNotReadyAddresses": False}})

    def _scaled_object(self, name: str, kind: str, labels: dict, scaling: WorkerScaling,
                       region: str) -> None:
        s, src, ns = scaling.spec, scaling.source, self.namespace
        auth = None
        if src.aws_region or s.cloudwatch:
            auth = f"{name}-aws"
            k8s_object(self, "TriggerAuthentication", api_version="keda.sh/v1alpha1",
                       kind="TriggerAuthentication", name=auth, namespace=ns, labels=labels,
                       body={"spec": {"podIdentity": {"provider": "aws",
                                                      "identityOwner": "keda"}}})
        triggers = []
        for t in s.triggers:
            meta = {"serverAddress": src.server_address, "query": t.query,
                    "threshold": _num(t.target_value),
                    "activationThreshold": _num(t.activation_target_value),
                    "ignoreNullValues": "true"}
            trigger = {"type": "prometheus", "name": t.name, "metricType": t.metric_type,
                       "metadata": meta}
            if auth:
                meta["awsRegion"] = src.aws_region
                trigger["authenticationRef"] = {"name": auth}
            triggers.append(trigger)
        for c in s.cloudwatch:   # as the KEDA operator's Pod Identity (cloudwatch:GetMetricData)
            meta = {"namespace": c.namespace, "metricName": c.metric_name,
                    "targetMetricValue": _num(c.target_value),
                    "activationTargetMetricValue": _num(c.activation_target_value),
                    "minMetricValue": _num(c.min_value), "metricStat": c.metric_stat,
                    "metricStatPeriod": str(c.period_s), "metricCollectionTime": str(c.start_s),
                    "awsRegion": region}
            if c.dimensions:
                meta["dimensionName"] = ";".join(n for n, _ in c.dimensions)
                meta["dimensionValue"] = ";".join(v for _, v in c.dimensions)
            triggers.append({"type": "aws-cloudwatch", "name": c.name,
                             "metricType": c.metric_type, "useCachedMetrics": c.use_cached,
                             "metadata": meta, "authenticationRef": {"name": auth}})
        k8s_object(self, "ScaledObject", api_version="keda.sh/v1alpha1", kind="ScaledObject",
                   name=name, namespace=ns, labels=labels, body={"spec": {
                       "scaleTargetRef": {"apiVersion": "apps/v1", "kind": kind, "name": name},
                       "minReplicaCount": s.min_replicas, "maxReplicaCount": s.max_replicas,
                       "pollingInterval": s.polling_interval,
                       "cooldownPeriod": s.cooldown_period,
                       "initialCooldownPeriod": s.initial_cooldown_period,
                       "advanced": {"horizontalPodAutoscalerConfig": {"behavior": {
                           "scaleUp": {"stabilizationWindowSeconds": s.scale_up_stabilization},
                           "scaleDown": {
                               "stabilizationWindowSeconds": s.scale_down_stabilization}}}},
                       "triggers": triggers}})


def efa_resources(p: WorkerProps) -> dict:
    """A P/D worker's EFA interfaces: the EFA device plugin's resource, as many as its share of
    the node's (each GPU reaches the EFA cards next to it; the plugin gives each device to one
    pod). Requests equal limits: an extended resource."""
    if not p.pd or not p.pd.efa_interfaces:
        return {}
    return {EFA_RESOURCE: str(max(1, p.pd.efa_interfaces * p.gpus // max(p.node_gpus, 1)))}


def pd_security(context: dict, p: WorkerProps) -> dict:
    """IPC_LOCK on P/D workers, the only capability added (docs/security.md): NIXL registers
    the KV cache with EFA, which pins (mlocks) it past the container's memlock limit (8 MiB:
    the EKS AMI's runtime spec sets none). A capability reaches only a root process: the CRI
    gives a non-root UID no ambient set, so its execve drops what the pod added
    (kubernetes#56374; tests/k8s/test_pd_memlock.py runs it). So the P/D worker runs as UID 0,
    with every other capability dropped, no privilege escalation and a read-only root."""
    if not p.pd:
        return context
    return {**context, "runAsUser": 0, "runAsNonRoot": False,
            "capabilities": {**context["capabilities"], "add": ["IPC_LOCK"]}}


def zone_affinity(p: WorkerProps) -> dict:
    """pdSpec.topologySpec.sameAZ: prefill pods only in a zone where a decode pod of the
    endpoint runs (EFA does not cross zones)."""
    if not p.pd or not p.pd.same_zone_as:
        return {}
    return {"affinity": {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{
        "labelSelector": {"matchLabels": pd_selector(p.endpoint, p.pd.same_zone_as)},
        "topologyKey": "topology.kubernetes.io/zone"}]}}}


# What vLLM keeps at least where sidecars come out of the worker's request (fit_endpoint says
# so in one line before the render would refuse)
VLLM_MIN_CPU_M, VLLM_MIN_MIB = 1000, 8 * 1024


def limits_share_refusal(cpu: str, memory: str) -> tuple[str, str] | None:
    """(the field, what it must be) where the request-limit sidecar's share of the worker's
    `cpu` and `memory` leaves vLLM less than VLLM_MIN_CPU_M / VLLM_MIN_MIB; None where not."""
    sidecar_m, sidecar_mib = _millicores(LIMITS_CPU), LIMITS_MEMORY_MIB
    why = (f": the request-limit sidecar takes {LIMITS_CPU} CPU and {LIMITS_MEMORY} of the "
           f"worker's request, and vLLM keeps at least {VLLM_MIN_CPU_M}m and "
           f"{VLLM_MIN_MIB // 1024}Gi")
    if _millicores(cpu) - sidecar_m < VLLM_MIN_CPU_M:
        return "cpu", f"at least {VLLM_MIN_CPU_M + sidecar_m}m" + why
    if _memory_gib(memory) * 1024 - sidecar_mib < VLLM_MIN_MIB:
        return "memory", f"at least {-(-(VLLM_MIN_MIB + sidecar_mib) // 1024)}Gi" + why
    return None


def _millicores(quantity: str) -> int:
    return int(quantity[:-1]) if quantity.endswith("m") else int(float(quantity) * 1000)


def _memory_gib(quantity: str) -> int:
    """Whole GiB of a worker's memory quantity (`96Gi`, `98304Mi`, bytes)."""
    units = {"Ti": 1024, "Gi": 1, "Mi": 1 / 1024, "Ki": 1 / 1024 ** 2}
    for unit, scale in units.items():
        if quantity.endswith(unit):
            return int(float(quantity[:-2]) * scale)
    return int(float(quantity) / 2 ** 30)


def _num(value: float) -> str:
    """KEDA thresholds are strings; keep `4` rather than `4.0`."""
    return f"{value:g}"
