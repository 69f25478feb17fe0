"""Grafana dashboards as code (grafana-foundation-sdk), written as JSON at synth.

One dashboard per environment: latency, throughput, KV cache tiers, routing, GPUs and cost.
The same JSON is provisioned to Amazon Managed Grafana (global) and to the in-cluster Grafana
(China); a `datasource` variable picks the Prometheus data source in either.

Queries name only catalogue metrics (observability/metrics.py) and the labels the scrape
configs add; `$endpoint` filters by endpoint, `$__rate_interval` is Grafana's rate window.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Iterable

from grafana_foundation_sdk.builders import common as cb
from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.builders import prometheus, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common as cm
from grafana_foundation_sdk.models import dashboard as dm

from config import EnvironmentConfig
from config.instances import gpu_shape
from config.endpoint_spec import EndpointSpec
from observability.metrics import (
    DCGM_JOB, ENDPOINT_LABEL, ROUTER_METRICS, ROUTERS_JOB, VALKEY_JOB, WORKERS_JOB,
)
from observability.rules import ttft_objective

SERVING_UID = "kvcache-serving"
FOLDER = "kvcache"
RATE = "$__rate_interval"
_DS = dm.DataSourceRef(type_val="prometheus", uid="${datasource}")
_EP = ENDPOINT_LABEL
W = f'job="{WORKERS_JOB}",{_EP}=~"$endpoint"'
R = f'job="{ROUTERS_JOB}",{_EP}=~"$endpoint"'
G = f'job="{DCGM_JOB}",{_EP}=~"$endpoint"'
V = f'job="{VALKEY_JOB}"'    # the shared self-hosted cache: no endpoint label
QUANTILES = (0.5, 0.9, 0.99)


@dataclass(frozen=True)
class EndpointCost:
    """What one worker pod costs: the instance's hourly price shared by the pods on it."""

    endpoint: str
    instance_type: str
    per_pod_hour: float     # in the environment's currency (EnvironmentConfig.prices)


def endpoint_costs(cfg: EnvironmentConfig,
                   endpoints: Iterable[EndpointSpec]) -> tuple[tuple[EndpointCost, ...],
                                                               tuple[str, ...]]:
    """Costs for endpoints whose instance type has a price, and the names of those without."""
    costs, unpriced = [], []
    prices = cfg.prices()
    for spec in endpoints:
        price = prices.get(spec.instance_type)
        shape = gpu_shape(spec.instance_type)
        if price is None or shape is None:
            unpriced.append(spec.name)
            continue
        pods_per_node = max(1, shape.gpus // spec.gpus)
        costs.append(EndpointCost(spec.name, spec.instance_type, price / pods_per_node))
    return tuple(costs), tuple(unpriced)


def _q(expr: str, legend: str, ref: str) -> prometheus.Dataquery:
    return prometheus.Dataquery().expr(expr).legend_format(legend).ref_id(ref).range()


def _refs(n: int) -> list[str]:
    return [chr(ord("A") + i) for i in range(n)]


def _ts(title: str, unit: str, queries: list[tuple[str, str]], description: str,
        width: int = 12, height: int = 8, lo: float | None = None,
        hi: float | None = None) -> timeseries.Panel:
    panel = (timeseries.Panel().title(title).description(description).datasource(_DS)
             .unit(unit).span(width).height(height).line_width(1).fill_opacity(10)
             .legend(cb.VizLegendOptions().display_mode(cm.LegendDisplayMode.LIST)
                     .placement(cm.LegendPlacement.BOTTOM).show_legend(True))
             .tooltip(cb.VizTooltipOptions().mode(cm.TooltipDisplayMode.MULTI)
                      .sort(cm.SortOrder.DESCENDING)))
    if lo is not None:
        panel = panel.min(lo)
    if hi is not None:
        panel = panel.max(hi)
    for (expr, legend), ref in zip(queries, _refs(len(queries))):
        panel = panel.with_target(_q(expr, legend, ref))
    return panel


def _quantiles(metric: str, selector: str, scale: str = "") -> list[tuple[str, str]]:
    return [(f"histogram_quantile({q:g}, sum by ({_EP}, le) "
             f"(rate({metric}_bucket{{{selector}}}[{RATE}]))){scale}",
             f"{{{{{_EP}}}}} P{int(q * 100)}") for q in QUANTILES]


def _latency(title: str, metric: str, selector: str, description: str,
             width: int = 8) -> timeseries.Panel:
    return _ts(f"{title} P50 / P90 / P99", "s", _quantiles(metric, selector), description,
               width=width)


def _rate(metric: str, selector: str, by: str = _EP) -> str:
    return f"sum by ({by}) (rate({metric}{{{selector}}}[{RATE}]))"


def _ratio(hits: str, queries: str) -> str:
    return f"{_rate(hits, W)} / {_rate(queries, W)}"


def serving_dashboard(cfg: EnvironmentConfig,
                      endpoints: tuple[EndpointSpec, ...]) -> dm.Dashboard:
    objective = ttft_objective(cfg)
    costs, unpriced = endpoint_costs(cfg, endpoints)
    ep = f"{{{{{_EP}}}}}"

    ttft = (_latency("Time to first token", "vllm:time_to_first_token_seconds", W,
                     f"vLLM TTFT per endpoint. Red line: the P90 objective ({objective:g} s) "
                     "the KvcacheTtftP90AboveObjective alert uses.")
            .thresholds(db.ThresholdsConfig().mode(dm.ThresholdsMode.ABSOLUTE).steps([
                dm.Threshold(value=None, color="green"), dm.Threshold(value=objective,
                                                                      color="red")]))
            .thresholds_style(cb.GraphThresholdsStyleConfig().mode(
                cm.GraphTresholdsStyleMode.LINE)))
    latency = [
        ttft,
        _latency("End-to-end latency", "vllm:e2e_request_latency_seconds", W,
                 "Request latency inside vLLM, queueing included."),
        _latency("Inter-token latency", "vllm:inter_token_latency_seconds", W,
                 "Time between generated tokens (vLLM 0.27 name; time_per_output_token is "
                 "gone)."),
    ]
    throughput = [
        _ts("Prompt and generation tokens/s", "short", [
            (_rate("vllm:prompt_tokens_total", W), f"{ep} prompt"),
            (_rate("vllm:generation_tokens_total", W), f"{ep} generated")],
            "Tokens processed per second, summed over the endpoint's workers."),
        _ts("Requests running and waiting", "short", [
            (f"sum by ({_EP}) (vllm:num_requests_running{{{W}}})", f"{ep} running"),
            (f"sum by ({_EP}) (vllm:num_requests_waiting{{{W}}})", f"{ep} waiting")],
            "vLLM scheduler state. A growing waiting count means too few workers."),
    ]
    lmcache_total = _ratio("lmcache:num_hit_tokens_total", "lmcache:num_requested_tokens_total")
    # LMCache counts hits over both tiers. L2's share is estimated from bytes: bytes read from
    # L2 over the bytes per token LMCache writes to L2 (write bytes / stored tokens, last hour).
    bytes_per_token = (f"(sum by ({_EP}) (increase(lmcache:num_remote_write_bytes_total{{{W}}}"
                       f"[1h])) / sum by ({_EP}) (increase(lmcache:num_stored_tokens_total"
                       f"{{{W}}}[1h])))")
    l2_rate = (f"({_rate('lmcache:num_remote_read_bytes_total', W)} / {bytes_per_token}) / "
               f"{_rate('lmcache:num_requested_tokens_total', W)}")
    kv = [
        _ts("GPU KV-cache usage", "percentunit", [
            (f"max by ({_EP}, pod) (vllm:kv_cache_usage_perc{{{W}}})", "{{pod}}")],
            "vLLM's GPU KV-cache blocks in use (1 = full: requests queue or get preempted).",
            width=8, lo=0, hi=1),
        _ts("GPU prefix-cache hit rate", "percentunit", [
            (_ratio("vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total"), ep)],
            "Share of prompt tokens found in vLLM's GPU prefix cache.", width=8, lo=0, hi=1),
        _ts("L1 and L2 hit rates (LMCache)", "percentunit", [
            (lmcache_total, f"{ep} L1 + L2"),
            (l2_rate, f"{ep} L2 (estimated)"),
            (f"{lmcache_total} - ({l2_rate} or {lmcache_total} * 0)", f"{ep} L1 (estimated)")],
            "Tokens LMCache served over tokens asked of it. LMCache counts hits over both "
            "tiers; the L2 share is estimated from bytes read from L2 divided by the bytes per "
            "token it writes there, and L1 is the rest.", width=8, lo=0, hi=1),
        _ts("L2 read and write volume", "Bps", [
            (_rate("lmcache:num_remote_read_bytes_total", W), f"{ep} read"),
            (_rate("lmcache:num_remote_write_bytes_total", W), f"{ep} written")],
            "Bytes per second between the workers' LMCache and the L2 cache.", width=8),
        _ts("L2 get and put latency P50 / P90", "ms", [
            (f"histogram_quantile(0.5, sum by ({_EP}, le) (rate("
             f"lmcache:remote_time_to_get_bucket{{{W}}}[{RATE}])))", f"{ep} get P50"),
            (f"histogram_quantile(0.9, sum by ({_EP}, le) (rate("
             f"lmcache:remote_time_to_get_bucket{{{W}}}[{RATE}])))", f"{ep} get P90"),
            (f"histogram_quantile(0.9, sum by ({_EP}, le) (rate("
             f"lmcache:remote_time_to_put_bucket{{{W}}}[{RATE}])))", f"{ep} put P90")],
            "LMCache's timing of L2 gets and puts (milliseconds).", width=8),
        _ts("L1 and L2 usage", "bytes", [
            (f"sum by ({_EP}) (lmcache:local_cache_usage{{{W}}})", f"{ep} L1 (CPU)"),
            (f"sum by ({_EP}) (lmcache:remote_cache_usage{{{W}}})", f"{ep} L2")],
            "Bytes LMCache holds in worker memory (L1) and in the L2 cache.", width=8),
    ]
    routing = [
        _ts("Router decisions per worker", "reqps", [
            (_rate("vllm_router_policy_decisions_total", R, f"{_EP}, worker"),
             f"{ep} {{{{worker}}}}"),
            (_rate("smg_worker_cb_outcomes_total", R, f"{_EP}, worker"),
             f"{ep} {{{{worker}}}} (sglang-router)")],
            "Requests the router sent to each worker: an even spread with cache_aware means "
            "prefixes are spread; one hot worker means one prefix dominates.", width=8),
        _ts("Router decisions per policy", "reqps", [
            (_rate("vllm_router_policy_decisions_total", R, f"{_EP}, policy"),
             f"{ep} {{{{policy}}}}"),
            (_rate("vllm_router_prefix_routing_decisions_total", R, f"{_EP}, policy, outcome"),
             f"{ep} {{{{policy}}}} {{{{outcome}}}}"),
            (_rate("smg_worker_selection_total", R, f"{_EP}, policy"),
             f"{ep} {{{{policy}}}} (sglang-router)")],
            "Decisions by policy, and prefix routing outcomes (prefix_hit, prefix_miss, "
            "missing_tokens = the worker did not tokenize for the router).", width=8),
        _ts("Worker health", "short", [
            (f"min by ({_EP}, worker) (vllm_router_worker_health{{{R}}})",
             f"{ep} {{{{worker}}}} (router)"),
            # a removed worker stays at -1 (sglang-router 0.3.2): not drawn
            (f"min by ({_EP}, worker) (smg_worker_health{{{R}}} >= 0)",
             f"{ep} {{{{worker}}}} (sglang-router)"),
            (f"min by ({_EP}, pod) (up{{{W}}})", f"{ep} {{{{pod}}}} (scrape)")],
            "1 = healthy. The router's own health checks per worker, and whether Prometheus "
            "can scrape each worker pod.", width=8, lo=0, hi=1),
        _ts("Router requests and errors", "reqps", [
            (_rate("vllm_router_requests_total", R), f"{ep} requests"),
            (_rate("vllm_router_request_errors_total", R, f"{_EP}, error_type"),
             f"{ep} {{{{error_type}}}}"),
            (_rate("smg_router_requests_total", R), f"{ep} requests (sglang-router)"),
            (_rate("smg_router_upstream_responses_total",
                   f'{R},status_code!~"2..|3.."', f"{_EP}, status_code"),
             f"{ep} worker {{{{status_code}}}} (sglang-router)")],
            "Requests the router received and the errors it returned.", width=12),
        _ts("Router latency P50 / P90 / P99", "s",
            [q for name in ROUTER_METRICS["duration"] for q in _quantiles(name, R)],
            "Proxied request duration measured by the router (router hop included): "
            "vllm-router's or sglang-router's, whichever the endpoint runs.", width=12),
    ]
    gpu = [
        _ts("GPU utilisation", "percent", [
            (f"avg by ({_EP}, Hostname, gpu) (DCGM_FI_DEV_GPU_UTIL{{{G}}})",
             "{{Hostname}} GPU {{gpu}}")],
            "DCGM GPU utilisation of the GPUs the endpoint's workers hold.", lo=0, hi=100),
        _ts("GPU memory", "decmbytes", [
            (f"sum by ({_EP}, Hostname) (DCGM_FI_DEV_FB_USED{{{G}}})", "{{Hostname}} used"),
            (f"sum by ({_EP}, Hostname) (DCGM_FI_DEV_FB_FREE{{{G}}})", "{{Hostname}} free")],
            "Framebuffer memory (MiB). vLLM reserves most of it for weights and KV cache "
            "up front, so 'used' sits near --gpu-memory-utilization."),
    ]
    cost_queries, hourly_queries = [], []
    for c in costs:
        workers = f'count(up{{job="{WORKERS_JOB}",{_EP}="{c.endpoint}"}} == 1)'
        tokens = " + ".join(
            f'sum(rate({m}{{job="{WORKERS_JOB}",{_EP}="{c.endpoint}"}}[{RATE}]))'
            for m in ("vllm:prompt_tokens_total", "vllm:generation_tokens_total"))
        per_s = f"{workers} * {c.per_pod_hour:g} / 3600"
        cost_queries.append((f"({per_s}) / (({tokens}) > 0) * 1000",
                             f"{c.endpoint} ({c.instance_type})"))
        hourly_queries.append((f"{workers} * {c.per_pod_hour:g}", c.endpoint))
    currency = cfg.prices().currency
    note = (f" No {currency} price for: {', '.join(unpriced)} (instancePrices in the "
            "environment file, or `python -m tools prices`)." if unpriced else "")
    unit = "currencyUSD" if currency == "USD" else f"prefix:{currency} "
    cost = [
        _ts("Cost per 1K tokens", unit, cost_queries,
            f"Running worker pods x the instance's hourly {currency} price (the region's table "
            "under the environment's instancePrices, as the synth plan counts it; shared by "
            "the pods on one instance) / live prompt + generated tokens per second x 1000. "
            "Empty while idle." + note),
        _ts("Worker cost per hour", unit, hourly_queries,
            "Running worker pods x their share of the instance's hourly price." + note),
    ]
    rows = [("Latency", latency), ("Throughput and queue", throughput), ("KV cache", kv),
            ("Routing", routing), ("GPUs", gpu), ("Cost", cost)]
    if cfg.cache.kind == "self-hosted":
        rows.insert(3, ("L2 cache (self-hosted Valkey)", valkey_panels()))

    builder = (db.Dashboard(f"kvcache: KV cache and routing ({cfg.name})").uid(SERVING_UID)
               .tags(["kvcache", cfg.name]).refresh("30s").time("now-3h", "now")
               .timezone("browser").editable()
               .tooltip(dm.DashboardCursorSync.CROSSHAIR)
               .description("vLLM + LMCache workers behind vllm-router: latency, tokens, KV "
                            "cache tiers, routing, GPUs and cost.")
               .with_variable(db.DatasourceVariable("datasource").label("Data source")
                              .type("prometheus"))
               .with_variable(db.QueryVariable("endpoint").label("Endpoint").datasource(_DS)
                              .query(f'label_values(up{{job="{WORKERS_JOB}"}}, {_EP})')
                              .refresh(dm.VariableRefresh.ON_TIME_RANGE_CHANGED)
                              .multi(True).include_all(True).sort(
                                  dm.VariableSort.ALPHABETICAL_ASC)))
    panel_id = 1
    for title, panels in rows:
        builder = builder.with_row(db.Row(title).id(panel_id))
        panel_id += 1
        for panel in panels:
            builder = builder.with_panel(panel.id(panel_id))
            panel_id += 1
    return builder.build()


def valkey_panels() -> list[timeseries.Panel]:
    """The in-cluster Valkey, from its redis_exporter sidecar (job kvcache-valkey)."""
    pod = "{{pod}}"
    by = "pod"
    return [
        _ts("Valkey memory used and maxmemory", "bytes", [
            (f"max by (pod) (redis_memory_used_bytes{{{V}}})", f"{pod} used"),
            (f"max by (pod) (redis_memory_max_bytes{{{V}}})", f"{pod} maxmemory")],
            "An LRU cache sits at maxmemory; above it for long, eviction is not keeping up "
            "(KvcacheValkeyOverMemoryLimit).", width=8),
        _ts("Valkey keyspace hit rate", "percentunit", [
            (f"{_rate('redis_keyspace_hits_total', V, by)} / "
             f"({_rate('redis_keyspace_hits_total', V, by)} + "
             f"{_rate('redis_keyspace_misses_total', V, by)})", pod)],
            "Share of LMCache's L2 lookups that found their chunk in Valkey.", width=8,
            lo=0, hi=1),
        _ts("Valkey evictions and rejected connections", "ops", [
            (_rate("redis_evicted_keys_total", V, by), f"{pod} evicted keys/s"),
            (_rate("redis_rejected_connections_total", V, by), f"{pod} rejected/s")],
            "Evictions with a low hit rate mean the cache is too small "
            "(KvcacheValkeyEvicting); rejections mean maxclients is reached.", width=8),
        _ts("Valkey network and commands", "Bps", [
            (_rate("redis_net_input_bytes_total", V, by), f"{pod} in"),
            (_rate("redis_net_output_bytes_total", V, by), f"{pod} out")],
            "Bytes in (KV written by workers) and out (KV read back).", width=12),
        _ts("Valkey clients and commands/s", "short", [
            (f"max by (pod) (redis_connected_clients{{{V}}})", f"{pod} clients"),
            (_rate("redis_commands_processed_total", V, by), f"{pod} commands/s")],
            "Connected clients (LMCache connections from the workers) and load.", width=12),
    ]


def build_dashboards(cfg: EnvironmentConfig,
                     endpoints: tuple[EndpointSpec, ...]) -> dict[str, dict]:
    """uid -> dashboard JSON (plain dicts, ready for json.dumps)."""
    model = serving_dashboard(cfg, endpoints)
    return {model.uid: to_json(model)}


def to_json(model: dm.Dashboard) -> dict:
    return json.loads(json.dumps(model, cls=JSONEncoder, sort_keys=True))


def dumps(dashboard: dict) -> str:
    return json.dumps(dashboard, sort_keys=True, indent=1)


def panel_queries(dashboard: dict) -> list[tuple[str, str]]:
    """(panel title, PromQL) for every target of every panel, rows included."""
    out = []
    for panel in dashboard.get("panels", []):
        for p in [panel, *panel.get("panels", [])]:
            for target in p.get("targets") or []:
                out.append((p.get("title", ""), target["expr"]))
    return out
