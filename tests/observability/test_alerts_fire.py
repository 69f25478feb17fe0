"""The failure alerts fire on the series a failure produces (promtool's rule unit tests).

Issue 6's failure cases: L2 unreachable (LMCache reports itself unhealthy), L2 slow, a worker
the router marks unhealthy, a router down, a queue that keeps growing.
"""
from __future__ import annotations

import shutil
import subprocess

import yaml

from config.contracts import SERVING_NAMESPACE, SHARED_CACHE_NAME
from observability.metrics import ENDPOINT_LABEL, ROUTERS_JOB, WORKERS_JOB
from observability.rules import L2_GET_P90_SLOW_MS, render

EP = "llama"
W = f'{{job="{WORKERS_JOB}",{ENDPOINT_LABEL}="{EP}",pod="llama-workers-0"}}'
R = f'{{job="{ROUTERS_JOB}",{ENDPOINT_LABEL}="{EP}",pod="llama-router-0"'
W0, W1 = "http://10.0.3.10:8000", "http://10.0.3.11:8000"   # two worker pods' URLs


def _pod(name: str, ip: str, values: str = "1x30") -> dict:
    """kube-state-metrics' series of a pod that exists (at those steps) with that IP."""
    return {"series": f'kube_pod_info{{job="kube-state-metrics",namespace="{SERVING_NAMESPACE}",'
                      f'pod="{name}",pod_ip="{ip}",node="n1"}}', "values": values}


LIVE_WORKERS = [_pod("llama-workers-5d8f9-a1b2c", "10.0.3.10"),
                _pod("llama-workers-5d8f9-d3e4f", "10.0.3.11")]


def _fires(alert: str, at: str, labels: dict) -> dict:
    return {"eval_time": at, "alertname": alert,
            "exp_alerts": [{"exp_labels": {"severity": labels.pop("severity"), **labels}}]}


def _silent(alert: str, at: str) -> dict:
    return {"eval_time": at, "alertname": alert, "exp_alerts": []}


def _rules_without_annotations(dev, tmp_path) -> str:
    """The shipped rules with annotations dropped, written beside the tests; the promtool path.
    promtool compares annotations verbatim, and what is under test here is when each alert
    fires (expr, for, labels)."""
    promtool = shutil.which("promtool")
    assert promtool, "promtool not found: install Debian's `prometheus` package (`make tools` does)"
    rules = yaml.safe_load(render(dev.cfg))
    for group in rules["groups"]:
        for rule in group["rules"]:
            rule.pop("annotations")
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(rules))
    return promtool


def _promtool_test(promtool: str, tmp_path, tests: dict) -> None:
    (tmp_path / "tests.yaml").write_text(yaml.safe_dump(tests, sort_keys=False))
    proc = subprocess.run([promtool, "test", "rules", "tests.yaml"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_router_alerts_fire_on_sglang_routers_series_too(dev, tmp_path):
    """prefixaware endpoints run sglang-router: its worker health drives the same alerts. A
    worker it removed keeps its series at -1 (sglang-router 0.3.2): neither a worker nor a
    debt against the others."""
    promtool = _rules_without_annotations(dev, tmp_path)
    series = [  # w1 fails at minute 5, w0 at minute 15: no worker left
        {"series": f'smg_worker_health{R},worker="{W1}"}}', "values": "1x5 0x25"},
        {"series": f'smg_worker_health{R},worker="{W0}"}}', "values": "1x15 0x15"},
        {"series": f'smg_worker_health{R},worker="http://10.0.3.9:8000"}}', "values": "-1x30"},
        *LIVE_WORKERS,
    ]
    _promtool_test(promtool, tmp_path, {
        "rule_files": ["rules.yaml"], "evaluation_interval": "1m", "tests": [{
            "interval": "1m", "input_series": series, "alert_rule_test": [
                _silent("KvcacheWorkerUnhealthy", "4m"),
                _fires("KvcacheWorkerUnhealthy", "9m", {
                    "severity": "warning", ENDPOINT_LABEL: EP, "worker": W1}),
                _silent("KvcacheEndpointNoWorkers", "20m"),
                _fires("KvcacheEndpointNoWorkers", "27m", {
                    "severity": "critical", ENDPOINT_LABEL: EP}),
            ]}]})


def test_worker_unhealthy_pages_only_for_pods_that_exist(dev, tmp_path):
    """Drill 3b: sglang-router 0.3.2 kept a deleted pod's URL, failing its health check for
    ever. The alert is for workers whose pod exists and is not being deleted, found by IP
    (IPv4, IPv6) or, for kvaware's static list, by the StatefulSet pod's DNS name; a pod of
    another endpoint holding the IP is not this endpoint's worker."""
    promtool = _rules_without_annotations(dev, tmp_path)
    dns = f"http://llama-workers-1.llama-workers.{SERVING_NAMESPACE}.svc.cluster.local:8000"
    unhealthy = {  # all unhealthy from minute 0
        "gone": "http://10.0.3.20:8000",         # no pod has the IP any more
        "deleting": "http://10.0.3.21:8000",     # its pod is being deleted
        "elsewhere": "http://10.0.3.22:8000",    # the IP now belongs to another endpoint's pod
        "v6": "http://[fd00:ec2::17]:8000",      # a pod that exists (IPv6 cluster)
        "dns": dns,                              # a StatefulSet pod that exists
        "recreated": "http://10.0.3.23:8000",    # its pod exists from minute 10
    }
    series = [{"series": f'smg_worker_health{R},worker="{url}"}}', "values": "0x30"}
              for url in unhealthy.values()] + [
        _pod("llama-workers-5d8f9-aaaaa", "10.0.3.21"),
        {"series": f'kube_pod_deletion_timestamp{{job="kube-state-metrics",'
                   f'namespace="{SERVING_NAMESPACE}",pod="llama-workers-5d8f9-aaaaa"}}',
         "values": "1700000000x30"},
        _pod("mistral-workers-7c6b5-bbbbb", "10.0.3.22"),
        _pod("llama-workers-5d8f9-ccccc", "fd00:ec2::17"),
        _pod("llama-workers-1", "10.0.3.40"),
        _pod("llama-workers-5d8f9-ddddd", "10.0.3.23", "_x10 1x20"),
    ]
    fired = [_fires("KvcacheWorkerUnhealthy", "9m", {
        "severity": "warning", ENDPOINT_LABEL: EP, "worker": unhealthy[k]}) for k in ("v6", "dns")]
    _promtool_test(promtool, tmp_path, {
        "rule_files": ["rules.yaml"], "evaluation_interval": "1m", "tests": [{
            "interval": "1m", "input_series": series, "alert_rule_test": [
                {"eval_time": "9m", "alertname": "KvcacheWorkerUnhealthy",
                 "exp_alerts": [a for f in fired for a in f["exp_alerts"]]},
                {"eval_time": "20m", "alertname": "KvcacheWorkerUnhealthy",
                 "exp_alerts": [a for f in fired for a in f["exp_alerts"]] + [
                     {"exp_labels": {"severity": "warning", ENDPOINT_LABEL: EP,
                                     "worker": unhealthy["recreated"]}}]},
            ]}]})


def test_failure_alerts_fire_and_stay_quiet_when_healthy(dev, tmp_path):
    promtool = _rules_without_annotations(dev, tmp_path)
    slow_ms = L2_GET_P90_SLOW_MS * 2
    series = [
        # L2 goes away at minute 10: LMCache's health monitor reports 0 from then on.
        {"series": f"lmcache:lmcache_is_healthy{W}", "values": "1x10 0x20"},
        # every L2 get takes twice the limit
        {"series": f'lmcache:remote_time_to_get_bucket{W[:-1]},le="{slow_ms}"}}',
         "values": "0+10x30"},
        {"series": f'lmcache:remote_time_to_get_bucket{W[:-1]},le="+Inf"}}',
         "values": "0+10x30"},
        {"series": f'lmcache:remote_time_to_get_bucket{W[:-1]},le="{L2_GET_P90_SLOW_MS}"}}',
         "values": "0x30"},
        # the router marks worker w1 unhealthy at minute 5
        {"series": f'vllm_router_worker_health{R},worker="{W1}"}}',
         "values": "1x5 0x25"},
        {"series": f'vllm_router_worker_health{R},worker="{W0}"}}',
         "values": "1x30"},
        *LIVE_WORKERS,
        # the router's scrape fails from minute 20
        {"series": f"up{R}}}", "values": "1x20 0x10"},
        # the in-cluster L2 (the StatefulSet k8s/cache.py renders) loses its replica at minute 10
        {"series": f'kube_statefulset_status_replicas_ready{{namespace="{SERVING_NAMESPACE}",'
                   f'statefulset="{SHARED_CACHE_NAME}"}}', "values": "1x10 0x20"},
    ]
    tests = {"rule_files": ["rules.yaml"], "evaluation_interval": "1m", "tests": [{
        "interval": "1m", "input_series": series,
        "alert_rule_test": [
            _silent("KvcacheL2Unhealthy", "9m"),
            _fires("KvcacheL2Unhealthy", "16m",
                   {"severity": "critical", ENDPOINT_LABEL: EP}),
            _fires("KvcacheL2Slow", "20m", {"severity": "warning", ENDPOINT_LABEL: EP}),
            _silent("KvcacheWorkerUnhealthy", "4m"),
            _fires("KvcacheWorkerUnhealthy", "9m", {"severity": "warning", ENDPOINT_LABEL: EP,
                                                    "worker": W1}),
            _silent("KvcacheSharedCacheDown", "9m"),
            _fires("KvcacheSharedCacheDown", "16m", {
                "severity": "critical", "namespace": SERVING_NAMESPACE}),
            _silent("KvcacheRouterDown", "19m"),
            _fires("KvcacheRouterDown", "26m", {
                "severity": "critical", "job": ROUTERS_JOB, ENDPOINT_LABEL: EP,
                "pod": "llama-router-0"}),
        ]}]}
    _promtool_test(promtool, tmp_path, tests)


def test_l2_outage_alerts_fire_and_clear_on_what_lmcache_and_the_cache_really_export(dev,
                                                                                     tmp_path):
    """The L2 outage drill's lesson (docs/benchmarks.md): with redis:// LMCache exports nothing
    when its L2 is down (no ping, no get without a lookup hit, failed batched puts counted as
    written), so the cache's own state pages; failed gets (a sick, not dead, L2) page from the
    workers; every alert clears once the cause is gone."""
    promtool = _rules_without_annotations(dev, tmp_path)
    V = f'{{job="kvcache-valkey",namespace="{SERVING_NAMESPACE}",pod="{SHARED_CACHE_NAME}-0"}}'
    series = [   # 15 s scrapes, as k8s/monitoring.py's
        # the Valkey container dies after minute 10 and is back after minute 20: not ready,
        # and its exporter sidecar (same pod, still scraped) reports redis_up 0
        {"series": f'kube_statefulset_status_replicas_ready{{namespace="{SERVING_NAMESPACE}",'
                   f'statefulset="{SHARED_CACHE_NAME}"}}', "values": "1x40 0x40 1x80"},
        {"series": f"redis_up{V}", "values": "1x40 0x40 1x80"},
        # LMCache stays "healthy" (local_cpu) and counts no failure throughout the outage
        {"series": f"lmcache:lmcache_is_healthy{W}", "values": "1x160"},
        # later, gets start failing (a slow L2): 6 after minute 25, then none
        {"series": f"lmcache:get_blocking_failed_count{W}", "values": "0x100 6x60"},
    ]
    down = {"severity": "critical", "namespace": SERVING_NAMESPACE}
    _promtool_test(promtool, tmp_path, {
        "rule_files": ["rules.yaml"], "evaluation_interval": "15s", "tests": [{
            "interval": "15s", "input_series": series, "alert_rule_test": [
                _silent("KvcacheSharedCacheDown", "10m"),
                _fires("KvcacheSharedCacheDown", "12m", dict(down)),
                _fires("KvcacheSharedCacheDown", "20m", dict(down)),
                _silent("KvcacheSharedCacheDown", "21m"),           # cleared after recovery
                _silent("KvcacheL2Unhealthy", "20m"),                # blind to the outage
                _silent("KvcacheL2ReadsFailing", "20m"),
                _fires("KvcacheL2Unhealthy", "26m", {"severity": "critical",
                                                     ENDPOINT_LABEL: EP}),
                _silent("KvcacheL2Unhealthy", "28m"),
                _fires("KvcacheL2ReadsFailing", "29m", {"severity": "warning",
                                                        ENDPOINT_LABEL: EP}),
                _silent("KvcacheL2ReadsFailing", "32m"),            # no new failure: clears
            ]}]})


def test_a_stalled_engine_alerts_and_a_slow_prefill_does_not(dev, tmp_path):
    """Issue 29's stalled engine: requests running, neither token counter moving, /health fine
    (nothing else alerts). A worker whose counters move, however slowly, stays quiet, and so
    does an idle one."""
    promtool = _rules_without_annotations(dev, tmp_path)
    stalled = W.replace("llama-workers-0", "llama-workers-1")
    series = [
        # llama-workers-1: 3 requests running throughout; its counters stop at minute 10
        {"series": f"vllm:num_requests_running{stalled}", "values": "3x40"},
        {"series": f"vllm:generation_tokens_total{stalled}", "values": "0+500x10 5000x30"},
        {"series": f"vllm:prompt_tokens_total{stalled}", "values": "0+900x10 9000x30"},
        # llama-workers-0: one long prefill after another, a prompt counted every 4 minutes
        {"series": f"vllm:num_requests_running{W}", "values": "1x40"},
        {"series": f"vllm:generation_tokens_total{W}", "values": "0x40"},
        {"series": f"vllm:prompt_tokens_total{W}",
         "values": " ".join(str(128000 * (m // 4)) for m in range(41))},
    ]
    _promtool_test(promtool, tmp_path, {
        "rule_files": ["rules.yaml"], "evaluation_interval": "1m", "tests": [{
            "interval": "1m", "input_series": series, "alert_rule_test": [
                _silent("KvcacheEngineStalled", "14m"),
                _fires("KvcacheEngineStalled", "20m", {
                    "severity": "critical", "pod": "llama-workers-1"}),
            ]}]})
