"""Prometheus alerting rules, one standard rule file for both variants.

The same `groups:` document goes to AMP's rule groups namespace (global regions) and into a
PrometheusRule the in-cluster Prometheus loads (China). Every series is grouped by the
`kvcache_endpoint` label the scrape configs add, so each endpoint alerts on its own.
"""
from __future__ import annotations

from dataclasses import dataclass

import yaml

from config import EnvironmentConfig
from config.contracts import SERVING_NAMESPACE, SHARED_CACHE_NAME
from observability.metrics import (
    DCGM_JOB, ENDPOINT_LABEL, ROUTER_METRICS, ROUTERS_JOB, VALKEY_JOB, WORKERS_JOB,
)

# TTFT P90 objective. 2.5 s rather than 2 s: vLLM 0.27.1's TTFT histogram has buckets at 1.0 and
# 2.5 s and none at 2, so at 2.5 the quantile is exact instead of a straight-line guess between
# buckets. An environment may override it (`ttftObjectiveSeconds` in its environment file).
TTFT_P90_OBJECTIVE_SECONDS = 2.5
# L2 get latency (P90) above which fetching KV from L2 stops paying off (LMCache buckets, ms).
L2_GET_P90_SLOW_MS = 500
# LMCache's health monitor takes L2 out after this many failed gets in one check interval
# (k8s/workers.py TIER_POLICY extra_config get_blocking_failed_threshold).
L2_GETS_FAILED_TO_BYPASS = 5
# Hit rate collapse: the last 30 minutes fall below this share of the day's hit rate.
HIT_RATE_COLLAPSE_RATIO = 0.5
# Below this many queried prompt tokens/s per endpoint a hit rate says nothing.
MIN_QUERIED_TOKENS_PER_S = 50
QUEUE_WAITING_THRESHOLD = 10      # waiting requests per endpoint before "queue growing" counts
KV_CACHE_USAGE_PRESSURE = 0.95    # vllm:kv_cache_usage_perc (1 = full)
GPU_FB_FREE_RATIO_MIN = 0.02      # framebuffer free / total on one GPU
WORKER_STARTUP_BUDGET = "40m"     # workers may take 30 min to stage and load weights
# A worker with requests running and no token produced for this long has a stalled engine
# (its /health still answers 200). The liveness probe restarts it after k8s/workers.py STALL_S
# plus 6 probes (4 minutes); the alert fires where that did not help (a stall again after the
# restart, or an image whose python we do not know, which gets the HTTP probe alone).
ENGINE_STALL_WINDOW = "5m"
# Self-hosted Valkey (an LRU cache: full memory and some eviction are its steady state).
VALKEY_OVER_MAXMEMORY = 1.05      # used / maxmemory: eviction is not keeping up
VALKEY_HIT_RATIO_MIN = 0.2        # keyspace hits / lookups while evicting: cache too small

_BY = f"sum by ({ENDPOINT_LABEL})"
_W = f'job="{WORKERS_JOB}"'
_R = f'job="{ROUTERS_JOB}"'
_V = f'job="{VALKEY_JOB}"'
_POD = "by (namespace, pod)"


@dataclass(frozen=True)
class Alert:
    name: str
    expr: str
    for_: str
    severity: str
    summary: str
    description: str

    def rule(self) -> dict:
        return {"alert": self.name, "expr": self.expr, "for": self.for_,
                "labels": {"severity": self.severity},
                "annotations": {"summary": self.summary, "description": self.description}}


def ttft_objective(cfg: EnvironmentConfig) -> float:
    return cfg.ttft_objective_seconds or TTFT_P90_OBJECTIVE_SECONDS


def _ratio(hits: str, queries: str, window: str, selector: str = _W) -> str:
    return (f"{_BY} (rate({hits}{{{selector}}}[{window}])) / "
            f"{_BY} (rate({queries}{{{selector}}}[{window}]))")


# A router's worker label is its URL: a pod IP (discovery; IPv6 in brackets) or a StatefulSet
# pod's DNS name (kvaware's static list, k8s/workers.py worker_urls). RE2, anchored.
_WORKER_IP = r"https?://[[]?([0-9A-Fa-f.:]+?)]?:[0-9]+/?"
_WORKER_DNS = r"https?://([a-z0-9-]+)[.][^:/]+[.]svc[.]cluster[.]local:[0-9]+/?"


def worker_unhealthy() -> str:
    """Workers the router marks unhealthy, among the pods of its endpoint's workers that exist
    and are not being deleted (kube-state-metrics' kube_pod_info, pod `<endpoint>-workers-*`,
    joined by IP or DNS name). A worker a router keeps after its pod is gone (sglang-router
    0.3.2, docs/upstream.md; the worker reaper removes it) is not a worker to page about."""
    health = (f"min by ({ENDPOINT_LABEL}, worker) ("
              + " or ".join(f"{n}{{{_R}}}" for n in ROUTER_METRICS["worker_health"]) + ") == 0")
    live = (f'label_replace(kube_pod_info{{namespace="{SERVING_NAMESPACE}"}} unless on '
            f'(namespace, pod) kube_pod_deletion_timestamp, "{ENDPOINT_LABEL}", "$1", "pod", '
            f'"(.+)-workers-.+")')
    by_ip = (f'label_replace({health}, "pod_ip", "$1", "worker", "{_WORKER_IP}") '
             f"and on ({ENDPOINT_LABEL}, pod_ip) {live}")
    by_name = (f'label_replace({health}, "pod", "$1", "worker", "{_WORKER_DNS}") '
               f"and on ({ENDPOINT_LABEL}, pod) {live}")
    return f"min by ({ENDPOINT_LABEL}, worker) (({by_ip}) or ({by_name}))"


def alert_groups(cfg: EnvironmentConfig) -> dict[str, tuple[Alert, ...]]:
    objective = ttft_objective(cfg)
    ep = f"{{{{ $labels.{ENDPOINT_LABEL} }}}}"
    # Any-tier reuse: tokens found in the GPU prefix cache or in LMCache (L1 + L2), over the
    # tokens vLLM looked up. An endpoint without LMCache has no external series: count 0.
    def reuse(window: str) -> str:
        gpu = f"{_BY} (rate(vllm:prefix_cache_hits_total{{{_W}}}[{window}]))"
        ext = f"{_BY} (rate(vllm:external_prefix_cache_hits_total{{{_W}}}[{window}]))"
        return (f"({gpu} + ({ext} or {gpu} * 0)) / "
                f"{_BY} (rate(vllm:prefix_cache_queries_total{{{_W}}}[{window}]))")

    return {
        "kvcache.latency": (
            Alert("KvcacheTtftP90AboveObjective",
                  f"histogram_quantile(0.9, sum by ({ENDPOINT_LABEL}, le) "
                  f"(rate(vllm:time_to_first_token_seconds_bucket{{{_W}}}[5m]))) > {objective:g}",
                  "10m", "warning", f"TTFT P90 above {objective:g} s on {ep}",
                  f"P90 time to first token on {ep} is {{{{ $value | humanizeDuration }}}} "
                  f"(objective {objective:g} s) for 10 minutes. Check queueing, cache hit "
                  "rates and GPU KV-cache usage."),
        ),
        "kvcache.cache": (
            Alert("KvcacheHitRateCollapse",
                  f"({reuse('30m')}) < {HIT_RATE_COLLAPSE_RATIO:g} * ({reuse('1d')}) and "
                  f"{_BY} (rate(vllm:prefix_cache_queries_total{{{_W}}}[30m])) > "
                  f"{MIN_QUERIED_TOKENS_PER_S}",
                  "15m", "warning", f"KV cache hit rate collapsed on {ep}",
                  f"Prefix reuse (GPU + LMCache) on {ep} is below {HIT_RATE_COLLAPSE_RATIO:.0%} "
                  "of its daily level: routing lost affinity, the cache was flushed, or the "
                  "workload changed."),
            Alert("KvcacheRouterCannotTokenize",
                  f"{_BY} (rate(vllm_router_prefix_routing_decisions_total"
                  f"{{{_R},outcome=\"missing_tokens\"}}[10m])) / "
                  f"{_BY} (rate(vllm_router_prefix_routing_decisions_total{{{_R}}}[10m])) > 0.5",
                  "10m", "warning", f"Router routes {ep} without token ids",
                  "More than half the prefix-aware decisions fell back to least-load because "
                  "workers did not answer render/tokenize: prefix affinity is lost."),
            # LMCache 0.5.x sets lmcache_is_healthy to 0 only with fallback_policy recompute;
            # with local_cpu (what k8s/workers.py renders) it bypasses L2 and stays at 1
            # (health_monitor/base.py), and it takes L2 out only after failed gets, the one
            # failure its redis:// connector reports (no ping: base_connector.support_ping).
            # So: unhealthy, or as many failed gets in a minute as make LMCache take L2 out.
            Alert("KvcacheL2Unhealthy",
                  f"min by ({ENDPOINT_LABEL}) (lmcache:lmcache_is_healthy{{{_W}}}) == 0 or "
                  f"max by ({ENDPOINT_LABEL}) (delta(lmcache:get_blocking_failed_count"
                  f"{{{_W}}}[1m])) >= {L2_GETS_FAILED_TO_BYPASS}",
                  "30s", "critical", f"LMCache took its L2 out on {ep}",
                  "LMCache's health monitor took L2 out after failed gets (or reports itself "
                  "unhealthy). Workers keep serving from L1 (fallback_policy local_cpu) and "
                  "recomputation: expect higher TTFT until its recovery probe succeeds."),
            Alert("KvcacheL2Slow",
                  f"histogram_quantile(0.9, sum by ({ENDPOINT_LABEL}, le) "
                  f"(rate(lmcache:remote_time_to_get_bucket{{{_W}}}[5m]))) > {L2_GET_P90_SLOW_MS}",
                  "10m", "warning", f"L2 reads slow on {ep}",
                  f"P90 L2 get latency on {ep} is {{{{ $value }}}} ms (limit "
                  f"{L2_GET_P90_SLOW_MS} ms): recomputing may be faster than fetching."),
            # get_blocking_failed_count is a cumulative count exported as a gauge
            # (remote_backend.py): its change over the window, so the alert clears
            Alert("KvcacheL2ReadsFailing",
                  f"max by ({ENDPOINT_LABEL}) (delta(lmcache:get_blocking_failed_count"
                  f"{{{_W}}}[5m])) > 0",
                  "2m", "warning", f"LMCache L2 gets failing on {ep}",
                  "Blocking gets from L2 failed in the last 5 minutes (timeouts or errors); "
                  "they count as misses."),
            # A dead L2 answers no lookup, so LMCache never gets, and its redis:// puts fail
            # silently (InstrumentedRemoteConnector.batched_put logs and counts them as
            # written): no worker metric sees it. The cache's own state does: the
            # StatefulSet's ready replica and the exporter sidecar's redis_up.
            Alert("KvcacheSharedCacheDown",
                  f'min by (namespace) (kube_statefulset_status_replicas_ready{{'
                  f'namespace="{SERVING_NAMESPACE}",statefulset="{SHARED_CACHE_NAME}"}}) < 1 or '
                  f'min by (namespace) (redis_up{{{_V},namespace="{SERVING_NAMESPACE}"}}) == 0',
                  "1m", "critical", "Self-hosted L2 cache down in {{ $labels.namespace }}",
                  f"The in-cluster L2 cache ({SHARED_CACHE_NAME}) has no ready replica or "
                  "does not answer its exporter: every L2 lookup misses and every write is "
                  "lost; workers serve from L1 and recompute."),
        ),
        "kvcache.valkey": (
            Alert("KvcacheValkeyExporterDown",
                  f"min {_POD} (up{{{_V}}}) == 0 or min {_POD} (redis_up{{{_V}}}) == 0",
                  "5m", "warning", "No Valkey metrics from {{ $labels.pod }}",
                  "The redis_exporter sidecar cannot be scraped or cannot reach Valkey over "
                  "loopback: the Valkey panels and alerts are blind."),
            Alert("KvcacheValkeyOverMemoryLimit",
                  f"max {_POD} (redis_memory_used_bytes{{{_V}}}) / "
                  f"max {_POD} (redis_memory_max_bytes{{{_V}}} > 0) > {VALKEY_OVER_MAXMEMORY:g}",
                  "10m", "warning", "Valkey {{ $labels.pod }} above its maxmemory",
                  "Used memory stays above maxmemory: eviction is not keeping up and the pod "
                  "nears its memory limit (OOM kill empties the whole L2)."),
            Alert("KvcacheValkeyEvicting",
                  f"sum {_POD} (rate(redis_evicted_keys_total{{{_V}}}[15m])) > 0 and "
                  f"sum {_POD} (rate(redis_keyspace_hits_total{{{_V}}}[15m])) / "
                  f"(sum {_POD} (rate(redis_keyspace_hits_total{{{_V}}}[15m])) + "
                  f"sum {_POD} (rate(redis_keyspace_misses_total{{{_V}}}[15m]))) "
                  f"< {VALKEY_HIT_RATIO_MIN:g}",
                  "30m", "warning", "Valkey {{ $labels.pod }} evicts what it is asked for",
                  f"Keys are evicted while fewer than {VALKEY_HIT_RATIO_MIN:.0%} of lookups "
                  "hit: the KV working set does not fit the cache."),
            Alert("KvcacheValkeyRejectingConnections",
                  f"sum {_POD} (rate(redis_rejected_connections_total{{{_V}}}[5m])) > 0",
                  "5m", "warning", "Valkey {{ $labels.pod }} rejects connections",
                  "Valkey refuses new clients (maxclients): those workers' L2 reads and "
                  "writes fail."),
        ),
        "kvcache.availability": (
            # sglang-router 0.3.2 sets a removed worker's smg_worker_health to -1 and keeps the
            # series (observability/metrics.rs remove_worker_metrics): counted as 0, not -1
            Alert("KvcacheEndpointNoWorkers",
                  f"(max by ({ENDPOINT_LABEL}) (vllm_router_active_workers{{{_R}}}) or "
                  f"sum by ({ENDPOINT_LABEL}) (clamp_min(smg_worker_health{{{_R}}}, 0))) == 0",
                  "10m", "critical", f"Router of {ep} has no worker",
                  "The router has no usable worker: every request fails."),
            Alert("KvcacheWorkerUnhealthy", worker_unhealthy(),
                  "3m", "warning", f"Worker {{{{ $labels.worker }}}} of {ep} unhealthy",
                  "The router's health checks fail for this worker, a pod of the endpoint "
                  "that exists and is not being deleted; it gets no traffic."),
            Alert("KvcacheEngineStalled",
                  f"max {_POD} (vllm:num_requests_running{{{_W}}}) > 0 and "
                  f"sum {_POD} (increase(vllm:generation_tokens_total{{{_W}}}"
                  f"[{ENGINE_STALL_WINDOW}]) + increase(vllm:prompt_tokens_total{{{_W}}}"
                  f"[{ENGINE_STALL_WINDOW}])) == 0",
                  "2m", "critical", "Worker {{ $labels.pod }} runs requests but produces nothing",
                  "Requests are running and no token has been produced for 5 minutes: the "
                  "engine is stalled while its /health still answers, and the clients on it "
                  "wait."),
            Alert("KvcacheWorkerNotReady",
                  f'sum by (namespace, pod) (kube_pod_status_ready{{'
                  f'namespace="{SERVING_NAMESPACE}",condition="true",pod=~".+-workers-.+"}}) == 0',
                  WORKER_STARTUP_BUDGET, "warning", "Worker pod {{ $labels.pod }} not ready",
                  "Not ready for longer than the weight staging and loading budget."),
            Alert("KvcacheRouterDown", f"up{{{_R}}} == 0", "5m", "critical",
                  f"Router {{{{ $labels.pod }}}} of {ep} down",
                  "Prometheus cannot scrape the router's metrics port."),
            Alert("KvcacheRoutersAllDown", f"{_BY} (up{{{_R}}}) == 0", "3m", "critical",
                  f"No router of {ep} is up", "The endpoint is unreachable."),
        ),
        "kvcache.capacity": (
            Alert("KvcacheQueueGrowing",
                  f"{_BY} (deriv(vllm:num_requests_waiting{{{_W}}}[10m])) > 0 and "
                  f"{_BY} (vllm:num_requests_waiting{{{_W}}}) > {QUEUE_WAITING_THRESHOLD}",
                  "10m", "warning", f"Request queue growing on {ep}",
                  f"{{{{ $value }}}} requests waiting on {ep} and rising for 10 minutes: add "
                  "workers or check preemptions."),
            Alert("KvcacheGpuKvCacheFull",
                  f"max by ({ENDPOINT_LABEL}) (vllm:kv_cache_usage_perc{{{_W}}}) > "
                  f"{KV_CACHE_USAGE_PRESSURE:g}",
                  "10m", "warning", f"GPU KV cache nearly full on {ep}",
                  "vLLM's GPU KV cache is above 95%: new requests queue and running ones may "
                  "be preempted."),
            Alert("KvcachePreemptions",
                  f"{_BY} (rate(vllm:num_preemptions_total{{{_W}}}[5m])) > 0",
                  "15m", "warning", f"Requests preempted on {ep}",
                  "vLLM keeps preempting requests for lack of GPU KV-cache blocks."),
            Alert("KvcacheGpuMemoryPressure",
                  f'min by (Hostname, gpu) (DCGM_FI_DEV_FB_FREE{{job="{DCGM_JOB}"}} / '
                  f'(DCGM_FI_DEV_FB_FREE{{job="{DCGM_JOB}"}} + '
                  f'DCGM_FI_DEV_FB_USED{{job="{DCGM_JOB}"}})) < {GPU_FB_FREE_RATIO_MIN:g}',
                  "10m", "warning", "GPU {{ $labels.gpu }} on {{ $labels.Hostname }} out of memory",
                  "Less than 2% of GPU memory is free: allocations outside vLLM's budget may "
                  "fail with CUDA out-of-memory."),
        ),
    }


def rule_file(cfg: EnvironmentConfig) -> dict:
    """The standard Prometheus rule file (`groups:`), as data."""
    return {"groups": [{"name": name, "rules": [a.rule() for a in alerts]}
                       for name, alerts in alert_groups(cfg).items()]}


def render(cfg: EnvironmentConfig) -> str:
    """YAML for AMP's RuleGroupsNamespace `data` and for `promtool check rules`."""
    return yaml.safe_dump(rule_file(cfg), sort_keys=False, width=1000)
