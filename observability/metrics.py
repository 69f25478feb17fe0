"""The metrics the pinned images really export, and the labels the collector adds.

Dashboards and rules may only name metrics listed here (a test parses every query and checks).
Names were read from the sources of the pinned versions, not from docs:

- vLLM 0.27.1 (in lmcache/vllm-openai:v0.5.4): `vllm/v1/metrics/loggers.py` of the 0.27.1
  wheel. The `vllm:gpu_*` names and `vllm:time_per_output_token_seconds` are gone there (renamed
  `vllm:kv_cache_usage_perc`, `vllm:prefix_cache_*`, `vllm:inter_token_latency_seconds`).
- LMCache 0.5.4 and 0.5.6 (same names in both): `lmcache/observability.py`; its metrics share
  the worker's `/metrics` (prometheus_client multiprocess mode, `PROMETHEUS_MULTIPROC_DIR`).
- vllm-router 0.1.17: `src/metrics.rs` of the sdist, and the real binary's `/metrics` on a
  loopback run. In regular (non-PD) mode request latency is `vllm_router_generate_duration_seconds`;
  `vllm_router_request_duration_seconds` is only recorded by the PD router.
- sglang-router 0.3.2 (its Rust core calls itself "smg"): the real binary's `/metrics` on a
  loopback run (tests/e2e/test_routing.py checks every `smg_` name below is exported).
- DCGM exporter 4.5.3-4.8.2: `etc/default-counters.csv` baked into the image (no `_total`
  suffix on its counters).
- kube-state-metrics v2.20.0, node-exporter v1.12.1, and Prometheus's own `up`.

prometheus_client counters are exposed with `_total`; histograms as `_bucket`, `_sum`, `_count`.
"""
from __future__ import annotations

from dataclasses import dataclass

from config.images import IMAGES

COUNTER, GAUGE, HISTOGRAM = "counter", "gauge", "histogram"

# Who exports a metric: a catalogue image key (config/images.py), the router image the project
# builds from the pinned vllm-router wheel, or Prometheus itself (synthetic series).
ROUTER_SOURCE = "vllm-router"
SGLANG_ROUTER_SOURCE = "sglang-router"
PROMETHEUS_SOURCE = "prometheus"
BUILT_SOURCES = frozenset({ROUTER_SOURCE, SGLANG_ROUTER_SOURCE})

# Labels the scrape configs add to every kvcache target (k8s/monitoring.py sets them), so
# dashboards and rules group the same way in both variants. `endpoint` is avoided on purpose:
# the Prometheus Operator already sets it to the port name.
ENDPOINT_LABEL = "kvcache_endpoint"
COMPONENT_LABEL = "kvcache_component"

# Scrape job names (the `job` label)
WORKERS_JOB = "kvcache-workers"
ROUTERS_JOB = "kvcache-routers"
DCGM_JOB = "kvcache-dcgm"
VALKEY_JOB = "kvcache-valkey"     # redis_exporter beside the self-hosted Valkey


@dataclass(frozen=True)
class Metric:
    name: str       # as exposed: counters with `_total`, histograms without a suffix
    type: str       # COUNTER, GAUGE or HISTOGRAM
    source: str     # catalogue image key, ROUTER_SOURCE or PROMETHEUS_SOURCE
    help: str

    @property
    def series(self) -> tuple[str, ...]:
        """The series names a scrape really produces."""
        if self.type == HISTOGRAM:
            return tuple(f"{self.name}{s}" for s in ("_bucket", "_sum", "_count"))
        return (self.name,)


_V, _R, _S, _D = "vllm-lmcache", ROUTER_SOURCE, SGLANG_ROUTER_SOURCE, "dcgm-exporter"
_KSM, _NODE = "kube-state-metrics", "node-exporter"
_RX = "redis-exporter"

CATALOGUE: dict[str, Metric] = {m.name: m for m in (
    # vLLM 0.27.1 (labels: model_name, engine)
    Metric("vllm:time_to_first_token_seconds", HISTOGRAM, _V, "time to first token"),
    Metric("vllm:e2e_request_latency_seconds", HISTOGRAM, _V, "end-to-end request latency"),
    Metric("vllm:inter_token_latency_seconds", HISTOGRAM, _V, "inter-token latency"),
    Metric("vllm:request_queue_time_seconds", HISTOGRAM, _V, "time waiting in the queue"),
    Metric("vllm:num_requests_running", GAUGE, _V, "requests in the running batch"),
    Metric("vllm:num_requests_waiting", GAUGE, _V, "requests waiting"),
    Metric("vllm:kv_cache_usage_perc", GAUGE, _V, "GPU KV-cache usage, 1 = full"),
    Metric("vllm:prefix_cache_queries_total", COUNTER, _V, "GPU prefix-cache queried tokens"),
    Metric("vllm:prefix_cache_hits_total", COUNTER, _V, "GPU prefix-cache hit tokens"),
    Metric("vllm:external_prefix_cache_queries_total", COUNTER, _V,
           "KV connector (LMCache) queried tokens"),
    Metric("vllm:external_prefix_cache_hits_total", COUNTER, _V,
           "KV connector (LMCache) hit tokens"),
    Metric("vllm:prompt_tokens_total", COUNTER, _V, "prefill tokens processed"),
    Metric("vllm:generation_tokens_total", COUNTER, _V, "generated tokens"),
    Metric("vllm:request_success_total", COUNTER, _V, "finished requests by finished_reason"),
    Metric("vllm:num_preemptions_total", COUNTER, _V, "preemptions"),
    # LMCache 0.5.x (labels: model_name, worker_id, role, served_model_name)
    Metric("lmcache:num_requested_tokens_total", COUNTER, _V, "tokens requested from LMCache"),
    Metric("lmcache:num_hit_tokens_total", COUNTER, _V, "tokens served by LMCache (L1 + L2)"),
    Metric("lmcache:num_stored_tokens_total", COUNTER, _V, "tokens stored in LMCache"),
    Metric("lmcache:num_lookup_tokens_total", COUNTER, _V, "tokens looked up"),
    Metric("lmcache:num_lookup_hits_total", COUNTER, _V, "tokens found on lookup"),
    Metric("lmcache:retrieve_hit_rate", GAUGE, _V, "retrieve hit rate since the last log"),
    Metric("lmcache:lookup_hit_rate", GAUGE, _V, "lookup hit rate since the last log"),
    Metric("lmcache:local_cache_usage", GAUGE, _V, "L1 (local CPU) usage, bytes"),
    Metric("lmcache:remote_cache_usage", GAUGE, _V, "L2 (remote) usage, bytes"),
    Metric("lmcache:num_remote_read_requests_total", COUNTER, _V, "L2 reads that returned KV"),
    Metric("lmcache:num_remote_read_bytes_total", COUNTER, _V, "bytes read from L2"),
    Metric("lmcache:num_remote_write_requests_total", COUNTER, _V, "L2 writes"),
    Metric("lmcache:num_remote_write_bytes_total", COUNTER, _V, "bytes written to L2"),
    Metric("lmcache:remote_time_to_get", HISTOGRAM, _V, "L2 get latency, milliseconds"),
    Metric("lmcache:remote_time_to_put", HISTOGRAM, _V, "L2 put latency, milliseconds"),
    Metric("lmcache:lmcache_is_healthy", GAUGE, _V, "1 healthy, 0 unhealthy (L2 failing)"),
    Metric("lmcache:get_blocking_failed_count", GAUGE, _V, "failed blocking L2 gets"),
    Metric("lmcache:put_failed_count", GAUGE, _V, "failed L2 puts"),
    # vllm-router 0.1.17
    Metric("vllm_router_requests_total", COUNTER, _R, "requests by route"),
    Metric("vllm_router_request_errors_total", COUNTER, _R, "errors by route and error_type"),
    Metric("vllm_router_generate_duration_seconds", HISTOGRAM, _R, "proxied request duration"),
    Metric("vllm_router_processed_requests_total", COUNTER, _R, "requests sent to each worker"),
    Metric("vllm_router_policy_decisions_total", COUNTER, _R, "decisions by policy and worker"),
    Metric("vllm_router_prefix_routing_decisions_total", COUNTER, _R,
           "cache_aware/kv_aware decisions by policy, stage and outcome"),
    Metric("vllm_router_kv_placement_lookups_total", COUNTER, _R, "kv_aware lookups by result"),
    Metric("vllm_router_kv_routing_inputs_total", COUNTER, _R,
           "token preparation (render/tokenize) by transport and result"),
    Metric("vllm_router_worker_health", GAUGE, _R, "1 healthy, 0 unhealthy, per worker"),
    Metric("vllm_router_active_workers", GAUGE, _R, "workers the router can use"),
    Metric("vllm_router_running_requests", GAUGE, _R, "in-flight requests per worker"),
    Metric("vllm_router_cb_state", GAUGE, _R, "circuit breaker: 0 closed, 1 open, 2 half-open"),
    Metric("vllm_router_cb_outcomes_total", COUNTER, _R,
           "requests to each worker by circuit-breaker outcome"),
    Metric("vllm_router_retries_total", COUNTER, _R, "retries by route"),
    # sglang-router 0.3.2 (prefixaware's router)
    Metric("smg_router_requests_total", COUNTER, _S, "requests by route"),
    Metric("smg_router_request_duration_seconds", HISTOGRAM, _S, "proxied request duration"),
    Metric("smg_router_upstream_responses_total", COUNTER, _S,
           "worker responses by status_code"),
    Metric("smg_worker_selection_total", COUNTER, _S, "routing decisions by policy"),
    Metric("smg_worker_cb_outcomes_total", COUNTER, _S,
           "requests to each worker by circuit-breaker outcome"),
    Metric("smg_worker_health", GAUGE, _S, "1 healthy, 0 unhealthy, per worker"),
    Metric("smg_worker_requests_active", GAUGE, _S, "in-flight requests per worker"),
    Metric("smg_worker_cb_state", GAUGE, _S, "circuit breaker: 0 closed, 1 open, 2 half-open"),
    Metric("smg_worker_retries_total", COUNTER, _S, "retries (only once one happened)"),
    # NVIDIA DCGM exporter (default counters)
    Metric("DCGM_FI_DEV_GPU_UTIL", GAUGE, _D, "GPU utilisation, percent"),
    Metric("DCGM_FI_DEV_MEM_COPY_UTIL", GAUGE, _D, "memory bandwidth utilisation, percent"),
    Metric("DCGM_FI_DEV_FB_USED", GAUGE, _D, "framebuffer memory used, MiB"),
    Metric("DCGM_FI_DEV_FB_FREE", GAUGE, _D, "framebuffer memory free, MiB"),
    Metric("DCGM_FI_DEV_GPU_TEMP", GAUGE, _D, "GPU temperature, C"),
    Metric("DCGM_FI_DEV_POWER_USAGE", GAUGE, _D, "power draw, W"),
    Metric("DCGM_FI_DEV_XID_ERRORS", GAUGE, _D, "last XID error"),
    # redis_exporter v1.89.0 on the self-hosted Valkey (`exporter/exporter.go` metric maps,
    # namespace `redis`; Valkey answers INFO with the same fields)
    Metric("redis_up", GAUGE, _RX, "1 if the exporter could talk to Valkey"),
    Metric("redis_memory_used_bytes", GAUGE, _RX, "used_memory"),
    Metric("redis_memory_max_bytes", GAUGE, _RX, "maxmemory (0 = unlimited)"),
    Metric("redis_evicted_keys_total", COUNTER, _RX, "keys evicted by maxmemory-policy"),
    Metric("redis_keyspace_hits_total", COUNTER, _RX, "GETs that found a key"),
    Metric("redis_keyspace_misses_total", COUNTER, _RX, "GETs that found nothing"),
    Metric("redis_connected_clients", GAUGE, _RX, "client connections"),
    Metric("redis_rejected_connections_total", COUNTER, _RX, "connections refused (maxclients)"),
    Metric("redis_commands_processed_total", COUNTER, _RX, "commands processed"),
    Metric("redis_net_input_bytes_total", COUNTER, _RX, "bytes received"),
    Metric("redis_net_output_bytes_total", COUNTER, _RX, "bytes sent"),
    # kube-state-metrics, node-exporter, Prometheus
    Metric("kube_pod_status_ready", GAUGE, _KSM, "pod readiness by condition"),
    Metric("kube_pod_info", GAUGE, _KSM, "one series per pod: its IP (pod_ip), node, owner"),
    Metric("kube_pod_deletion_timestamp", GAUGE, _KSM, "when a pod being deleted was asked to go"),
    Metric("kube_pod_container_status_restarts_total", COUNTER, _KSM, "container restarts"),
    Metric("kube_deployment_status_replicas_available", GAUGE, _KSM, "available replicas"),
    Metric("kube_statefulset_status_replicas_ready", GAUGE, _KSM, "ready replicas"),
    Metric("node_memory_MemAvailable_bytes", GAUGE, _NODE, "node memory available"),
    Metric("up", GAUGE, PROMETHEUS_SOURCE, "1 if the last scrape of the target succeeded"),
)}

# Renamed or removed in the pinned vLLM; a query naming one would silently return nothing.
DEPRECATED = frozenset({
    "vllm:gpu_cache_usage_perc", "vllm:gpu_prefix_cache_queries_total",
    "vllm:gpu_prefix_cache_hits_total", "vllm:gpu_prefix_cache_hit_rate",
    "vllm:time_per_output_token_seconds", "vllm:cpu_cache_usage_perc",
})


def series_names() -> frozenset[str]:
    """Every series name a catalogue metric produces (`_bucket` and friends included)."""
    return frozenset(s for m in CATALOGUE.values() for s in m.series)


def metric_of(series: str) -> Metric | None:
    """The catalogue metric a series name belongs to, or None."""
    for metric in CATALOGUE.values():
        if series in metric.series:
            return metric
    return None


def known_sources() -> frozenset[str]:
    return frozenset(IMAGES) | BUILT_SOURCES | {PROMETHEUS_SOURCE}


# One meaning under each router's own name, vllm-router's first: a dashboard panel or an alert
# queries both, so it works whichever router an endpoint runs.
ROUTER_METRICS = {
    "requests": ("vllm_router_requests_total", "smg_router_requests_total"),
    "duration": ("vllm_router_generate_duration_seconds", "smg_router_request_duration_seconds"),
    "worker_health": ("vllm_router_worker_health", "smg_worker_health"),
    "worker_outcomes": ("vllm_router_cb_outcomes_total", "smg_worker_cb_outcomes_total"),
    "retries": ("vllm_router_retries_total", "smg_worker_retries_total"),
}
ROUTER_METRIC_PREFIX = {ROUTER_SOURCE: "vllm_router_", SGLANG_ROUTER_SOURCE: "smg_"}


def router_metric(meaning: str, implementation: str) -> str:
    """`implementation`'s name for a ROUTER_METRICS meaning."""
    vllm, sglang = ROUTER_METRICS[meaning]
    return sglang if implementation == SGLANG_ROUTER_SOURCE else vllm
