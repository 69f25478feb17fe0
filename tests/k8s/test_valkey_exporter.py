"""The self-hosted Valkey's redis_exporter sidecar: pinned from the catalogue (so mirrored to
China's ECR), on REDIS_EXPORTER_PORT, reachable only from the monitoring namespace, selected by
the `kvcache-valkey` scrape job, with panels and alerts that fire (promtool)."""
from __future__ import annotations

import copy
import os
import re
import shutil
import socket
import subprocess
import time
import urllib.request

import cdk8s
import kubernetes_validate
import pytest
import yaml

from config import resolve_environment
from config.contracts import MONITORING_NAMESPACE, REDIS_EXPORTER_PORT
from config.images import IMAGES
from k8s.cache import VALKEY
from k8s.monitoring import scrape_configs
from k8s.serving import build_charts, load_endpoints, placeholder_facts
from observability.dashboards import build_dashboards, panel_queries
from observability.metrics import CATALOGUE, VALKEY_JOB, metric_of
from observability.promql import metric_names
from observability.rules import VALKEY_OVER_MAXMEMORY, alert_groups, render
from tests.conftest import ROOT, context_for
from tests.k8s.test_monitoring import _relabel_keep, _service_targets


def _self_hosted(env: str):
    ctx = copy.deepcopy(context_for(env=env))
    ctx["environments"][env]["cache"] = {"kind": "self-hosted"}
    # Our seed asks for the environment's L2 (the shipped published file is L1 only).
    ctx["environments"][env]["endpoints"] = ["tests/fixtures/endpoint-seed.yaml"]
    cfg = resolve_environment(ctx)
    specs = load_endpoints(cfg, ROOT)
    assert any(s.l2_enabled for s in specs)
    docs = [d for c in build_charts(cdk8s.App(), cfg, specs, placeholder_facts(cfg, specs))
            for d in c.to_json()]
    return cfg, specs, docs


@pytest.fixture(scope="module", params=["dev", "china"])
def valkey(request, sound_l2_client):
    return _self_hosted(request.param)


def _named(docs, kind, name):
    (doc,) = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    return doc


def test_sidecar_is_pinned_hardened_and_valid(valkey):
    cfg, _, docs = valkey
    sts = _named(docs, "StatefulSet", f"kvcache-{VALKEY}")
    kubernetes_validate.validate(sts, cfg.kubernetes_version + ".0", strict=True)
    containers = {c["name"]: c for c in sts["spec"]["template"]["spec"]["containers"]}
    exporter = containers["redis-exporter"]
    assert exporter["image"] == cfg.images.uri("redis-exporter")
    assert exporter["image"].endswith(f":{IMAGES['redis-exporter'].tag}@"
                                      f"{IMAGES['redis-exporter'].digest}")
    if cfg.facts.china:
        assert exporter["image"].startswith(f"{cfg.account}.dkr.ecr.{cfg.region}.amazonaws.com.cn/")
    assert exporter["ports"] == [{"name": "metrics", "containerPort": REDIS_EXPORTER_PORT}]
    cache_port = containers["valkey"]["ports"][0]["containerPort"]
    assert f"--redis.addr=redis://127.0.0.1:{cache_port}" in exporter["args"]
    assert exporter["securityContext"]["runAsNonRoot"] is True
    assert exporter["securityContext"]["readOnlyRootFilesystem"] is True
    assert exporter["resources"]["limits"]["memory"]


def test_metrics_port_is_open_to_monitoring_only(valkey):
    cfg, _, docs = valkey
    name = f"kvcache-{VALKEY}"
    svc = _named(docs, "Service", name)
    assert {"name": "metrics", "port": REDIS_EXPORTER_PORT, "targetPort": "metrics"} in \
        svc["spec"]["ports"]
    # The serving namespace denies by default; one policy admits exactly the declared flows.
    policy = _named(docs, "NetworkPolicy", f"allow-to-{name}")
    kubernetes_validate.validate(policy, cfg.kubernetes_version + ".0", strict=True)
    (rule,) = [r for r in policy["spec"]["ingress"]
               if r["ports"] == [{"protocol": "TCP", "port": REDIS_EXPORTER_PORT}]]
    (peer,) = rule["from"]
    assert peer["namespaceSelector"] == {"matchLabels": {
        "kubernetes.io/metadata.name": MONITORING_NAMESPACE}}
    assert peer["podSelector"]["matchLabels"]     # Prometheus only, not the whole namespace


def test_scrape_job_selects_exactly_the_exporter_port(valkey):
    _, specs, docs = valkey
    (job,) = [j for j in scrape_configs(endpoints=tuple(s.name for s in specs))
              if j["job_name"] == VALKEY_JOB]
    kept = [t for t, meta in _service_targets(docs) if _relabel_keep(job, meta)]
    assert kept == [f"kvcache-{VALKEY}:metrics"]


def test_dashboard_gets_valkey_panels_from_catalogue_metrics(valkey):
    cfg, specs, _ = valkey
    (dashboard,) = build_dashboards(cfg, specs).values()
    queries = [(t, q) for t, q in panel_queries(dashboard) if t.startswith("Valkey")]
    assert len({t for t, _ in queries}) == 5
    for title, query in queries:
        names = metric_names(query)
        assert names and all(metric_of(n) and metric_of(n).source == "redis-exporter"
                             for n in names), (title, names)
        assert f'job="{VALKEY_JOB}"' in query


def test_valkey_alerts_fire_on_the_failures_and_not_when_healthy(valkey, tmp_path):
    cfg, _, _ = valkey
    promtool = shutil.which("promtool")
    assert promtool, "promtool not found: `make tools` installs Debian's prometheus"
    rules = yaml.safe_load(render(cfg))
    for group in rules["groups"]:
        for rule in group["rules"]:
            rule.pop("annotations")
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(rules))
    names = {a.name for a in alert_groups(cfg)["kvcache.valkey"]}
    assert names == {"KvcacheValkeyExporterDown", "KvcacheValkeyOverMemoryLimit",
                     "KvcacheValkeyEvicting", "KvcacheValkeyRejectingConnections"}
    j = f'job="{VALKEY_JOB}",namespace="kvcache-serving"'
    sick, well = f'{{{j},pod="kvcache-valkey-0"}}', f'{{{j},pod="kvcache-valkey-1"}}'
    gib = 1024 ** 3
    over = int(gib * (VALKEY_OVER_MAXMEMORY + 0.05))
    series = [
        {"series": f"up{sick}", "values": "0x60"}, {"series": f"up{well}", "values": "1x60"},
        {"series": f"redis_up{well}", "values": "1x60"},
        {"series": f"redis_memory_max_bytes{sick}", "values": f"{gib}x60"},
        {"series": f"redis_memory_used_bytes{sick}", "values": f"{over}x60"},
        {"series": f"redis_memory_max_bytes{well}", "values": f"{gib}x60"},
        {"series": f"redis_memory_used_bytes{well}", "values": f"{gib}x60"},
        # sick: evicting and 10% hits; well: evicting (an LRU cache at capacity) and 90% hits
        {"series": f"redis_evicted_keys_total{sick}", "values": "0+100x60"},
        {"series": f"redis_keyspace_hits_total{sick}", "values": "0+10x60"},
        {"series": f"redis_keyspace_misses_total{sick}", "values": "0+90x60"},
        {"series": f"redis_evicted_keys_total{well}", "values": "0+100x60"},
        {"series": f"redis_keyspace_hits_total{well}", "values": "0+90x60"},
        {"series": f"redis_keyspace_misses_total{well}", "values": "0+10x60"},
        {"series": f"redis_rejected_connections_total{sick}", "values": "0+5x60"},
        {"series": f"redis_rejected_connections_total{well}", "values": "0x60"},
    ]
    sick_labels = {"namespace": "kvcache-serving", "pod": "kvcache-valkey-0",
                   "severity": "warning"}
    cases = [{"eval_time": "59m", "alertname": n, "exp_alerts": [{"exp_labels": sick_labels}]}
             for n in sorted(names)]
    cases += [{"eval_time": "3m", "alertname": n, "exp_alerts": []} for n in sorted(names)]
    (tmp_path / "tests.yaml").write_text(yaml.safe_dump({
        "rule_files": ["rules.yaml"], "evaluation_interval": "1m",
        "tests": [{"interval": "1m", "input_series": series, "alert_rule_test": cases}]}))
    proc = subprocess.run([promtool, "test", "rules", "tests.yaml"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_http(url: str, proc: subprocess.Popen) -> str:
    deadline = time.monotonic() + 20
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                return resp.read().decode()
        except OSError:
            assert proc.poll() is None and time.monotonic() < deadline, url
            time.sleep(0.1)


def test_a_real_redis_exporter_exports_every_metric_we_query(tmp_path):
    """Debian's redis-server and prometheus-redis-exporter (older than the pinned v1.89.0, same
    metric maps) on 127.0.0.1: every catalogue metric of the redis-exporter source appears."""
    server, exporter = shutil.which("redis-server"), shutil.which("prometheus-redis-exporter")
    assert server and exporter, "`make tools` installs redis-server and prometheus-redis-exporter"
    cache_port, metrics_port = _free_port(), _free_port()
    procs = [subprocess.Popen(
        [server, "--port", str(cache_port), "--bind", "127.0.0.1", "--save", "",
         "--appendonly", "no", "--maxmemory", "64mb", "--maxmemory-policy", "allkeys-lru",
         "--dir", str(tmp_path)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
    try:
        procs.append(subprocess.Popen(
            [exporter, f"--redis.addr=redis://127.0.0.1:{cache_port}",
             f"--web.listen-address=127.0.0.1:{metrics_port}"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        url = f"http://127.0.0.1:{metrics_port}/metrics"
        deadline = time.monotonic() + 20
        while "redis_up 1" not in (text := _wait_http(url, procs[1])):
            assert time.monotonic() < deadline, text[-2000:]
            time.sleep(0.2)
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(timeout=10)
    exported = {line.split("{")[0].split(" ")[0] for line in text.splitlines()
                if line and not line.startswith("#")}
    ours = {s for m in CATALOGUE.values() if m.source == "redis-exporter" for s in m.series}
    assert len(ours) >= 10 and ours <= exported, sorted(ours - exported)
    assert re.search(r"^redis_memory_max_bytes 6\.7108864e\+07$", text, re.M)


def test_the_valkey_container_serves_as_its_uid_writing_nothing(valkey, tmp_path):
    """The rendered container's own arguments, as its UID (not the image's 999: checkov
    CKV_K8S_40) in a working directory it cannot write (the image's /data is 999's, the root
    filesystem read-only): Debian's redis-server, which takes Valkey's flags, stores and
    serves a value. Its CPU limit is its request (no throttling below its node share)."""
    if os.geteuid() != 0:
        pytest.skip("setpriv needs root to take the container's UID (CI runs as root)")
    cfg, _, docs = valkey
    spec = _named(docs, "StatefulSet", f"kvcache-{VALKEY}")["spec"]["template"]["spec"]
    container = next(c for c in spec["containers"] if c["name"] == "valkey")
    ctx = container["securityContext"]
    uid, gid = ctx["runAsUser"], ctx["runAsGroup"]
    assert uid >= 10000 and spec["securityContext"]["runAsUser"] == uid
    assert container["resources"]["limits"]["cpu"] == container["resources"]["requests"]["cpu"]
    server = shutil.which("redis-server")
    assert server, "`make tools` installs redis-server"
    args = list(container["args"])
    assert args[0] == "valkey-server"
    port = _free_port()
    args[args.index("--port") + 1] = str(port)
    tmp_path.chmod(0o755)   # root's: the container's user cannot write its working directory
    proc = subprocess.Popen(
        ["setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups", server, *args[1:],
         "--bind", "127.0.0.1"], cwd=tmp_path, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=2) as s:
                    s.sendall(b"SET k v\r\nGET k\r\n")
                    time.sleep(0.2)
                    answer = s.recv(4096)
                break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read()
                time.sleep(0.1)
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=10)
    assert answer.startswith(b"+OK\r\n$1\r\nv\r\n"), (answer, out)
    assert list(tmp_path.iterdir()) == [], out   # nothing written
