"""Collection in the cluster: manifests valid at the cluster version, scrape jobs that really
select the serving charts' Services, DCGM on GPU nodes only, kube-prometheus-stack values with
pinned images (China: from the China ECR only) and no Grafana password anywhere."""
from __future__ import annotations

import json
import re

import cdk8s
import kubernetes_validate
import pytest
import yaml

from config.contracts import (
    GPU_TAINT_KEY, IN_CLUSTER_PROMETHEUS_URL, LABEL_INSTANCE, LABEL_NAME, MONITORING_NAMESPACE,
    NODE_ROLE_GPU, NODE_ROLE_LABEL, PROMETHEUS_PORT, ROUTER_METRICS_PORT, SERVING_NAMESPACE,
)
from config.images import CHARTS, ImageResolver
from k8s.monitoring import (
    CHART_KEY, DCGM_COMPONENT, GRAFANA_ADMIN_FILE, RELEASE, GrafanaProps,
    MonitoringValuesProps, RemoteWrite, build_monitoring_charts, chart_images,
    kube_prometheus_stack_values, scrape_configs, scraped_endpoints,
)
from k8s.serving import load_endpoints
from observability.alerting import alertmanager_config
from observability.metrics import DCGM_JOB, ENDPOINT_LABEL, ROUTERS_JOB, VALKEY_JOB, WORKERS_JOB
from observability.rules import rule_file
from tests.conftest import ENVIRONMENTS, ROOT, Lazy, normalise

_DURATION = re.compile(r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?"
                       r"(([0-9]+)s)?(([0-9]+)ms)?)$")   # the PrometheusRule CRD's pattern


@pytest.fixture(scope="module")
def rendered(synths):
    return Lazy(lambda name: _render(synths[name].cfg))


def _render(cfg):
    """One environment's monitoring charts, scrape jobs and collector values."""
    specs = load_endpoints(cfg, ROOT)
    charts = build_monitoring_charts(cdk8s.App(), cfg, specs)
    images = cfg.images
    jobs = scrape_configs(endpoints=scraped_endpoints(specs))
    mode = (dict(remote_write=RemoteWrite(
                "https://aps-workspaces.us-west-2.amazonaws.com/workspaces/ws-1/api/v1/"
                "remote_write", cfg.region)) if cfg.observability == "managed" else
            dict(grafana=GrafanaProps(
                f"arn:{cfg.facts.partition}:secretsmanager:{cfg.region}:{cfg.account}:"
                "secret:grafana-admin", cfg.region, images.uri("aws-cli")),
                alertmanager_config=alertmanager_config(
                    topic_arn=f"arn:{cfg.facts.partition}:sns:{cfg.region}:{cfg.account}:"
                    "alerts", region=cfg.region, in_cluster=True)))
    values = kube_prometheus_stack_values(MonitoringValuesProps(
        images=images, scrape_configs=jobs, **mode))
    return (cfg, [d for c in charts.all() for d in c.to_json()], jobs, values)


def _kind(docs, kind):
    return [d for d in docs if d["kind"] == kind]


def _validate_prometheus_rule(doc: dict) -> None:
    """The PrometheusRule CRD is not in kubernetes-validate's schemas: its shape is checked
    here against the CRD's required fields; `promtool check rules` (tests/observability)
    checks the same groups as a rule file."""
    assert doc["apiVersion"] == "monitoring.coreos.com/v1" and set(doc) == {
        "apiVersion", "kind", "metadata", "spec"}
    assert re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", doc["metadata"]["name"])
    assert set(doc["spec"]) == {"groups"}
    names = [g["name"] for g in doc["spec"]["groups"]]
    assert len(names) == len(set(names))
    for group in doc["spec"]["groups"]:
        assert set(group) == {"name", "rules"} and group["rules"]
        for rule in group["rules"]:
            assert set(rule) <= {"alert", "record", "expr", "for", "labels", "annotations"}
            assert ("alert" in rule) != ("record" in rule) and isinstance(rule["expr"], str)
            assert _DURATION.match(rule.get("for", "0"))
            for key in ("labels", "annotations"):
                assert all(isinstance(v, str) for v in rule.get(key, {}).values())


@pytest.mark.parametrize("name", ENVIRONMENTS)
def test_every_manifest_is_valid_at_the_cluster_version(rendered, name):
    cfg, docs, _, _ = rendered[name]
    for doc in docs:
        if doc["kind"] == "PrometheusRule":
            _validate_prometheus_rule(doc)
        else:
            kubernetes_validate.validate(doc, cfg.kubernetes_version + ".0", strict=True)


def test_in_cluster_pieces_only_where_there_is_no_amp(rendered):
    kinds = {name: sorted({d["kind"] for d in rendered[name][1]})
             for name in ("dev", "china", "dev-cn")}
    assert kinds["dev"] == ["ConfigMap", "DaemonSet", "Namespace", "NetworkPolicy"]
    for name in ("china", "dev-cn"):
        assert kinds[name] == ["ConfigMap", "DaemonSet", "Namespace", "NetworkPolicy",
                               "PrometheusRule", "StorageClass"]
        _, docs, _, _ = rendered[name]
        (rule,) = _kind(docs, "PrometheusRule")
        assert rule["spec"] == rule_file(rendered[name][0])
        (sc,) = _kind(docs, "StorageClass")
        assert sc["provisioner"] == "ebs.csi.aws.com" and sc["parameters"]["type"] == "gp3"
        (dashboard,) = [d for d in _kind(docs, "ConfigMap")
                        if "grafana_dashboard" in d["metadata"]["labels"]]
        assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
        assert json.loads(next(iter(dashboard["data"].values())))["uid"] == "kvcache-serving"


def _relabel_keep(job: dict, meta: dict[str, str]) -> bool:
    """Apply a job's `keep` relabel rules to one target's meta labels."""
    for rule in job["relabel_configs"]:
        if rule.get("action") == "keep":
            value = ";".join(meta.get(s, "") for s in rule["source_labels"])
            if not re.fullmatch(rule["regex"], value):
                return False
    return True


def _service_targets(docs) -> list[tuple[str, dict]]:
    out = []
    for svc in _kind(docs, "Service"):
        labels = svc["metadata"]["labels"]
        for port in svc["spec"]["ports"]:
            out.append((f"{svc['metadata']['name']}:{port['name']}", {
                f"__meta_kubernetes_service_label_{k}": labels.get(v, "") for k, v in (
                    ("app_kubernetes_io_name", LABEL_NAME),
                    ("app_kubernetes_io_instance", LABEL_INSTANCE))} | {
                "__meta_kubernetes_endpointslice_port_name": port["name"]}))
    return out


@pytest.mark.parametrize("name", ["dev", "china"])
def test_scrape_jobs_select_exactly_the_serving_services(synths, rendered, name):
    """Relabeling run on the Services the serving stack really applies."""
    _, _, jobs, _ = rendered[name]
    by_job = {j["job_name"]: j for j in jobs}
    assert set(by_job) == {WORKERS_JOB, ROUTERS_JOB, DCGM_JOB, VALKEY_JOB}
    serving = [d for c in synths[name].stacks.serving.charts for d in c.to_json()]
    kept = {job: sorted(t for t, meta in _service_targets(serving)
                        if _relabel_keep(by_job[job], meta))
            for job in (WORKERS_JOB, ROUTERS_JOB, VALKEY_JOB)}
    (spec,) = load_endpoints(synths[name].cfg, ROOT)
    assert kept == {WORKERS_JOB: [f"{spec.name}-workers:http"],
                    ROUTERS_JOB: [f"{spec.name}-router-metrics:metrics"],
                    VALKEY_JOB: []}     # ElastiCache here: no in-cluster Valkey to scrape
    router_svc = next(s for s in _kind(serving, "Service")
                      if s["metadata"]["name"].endswith("-router-metrics"))
    assert router_svc["spec"]["ports"][0]["port"] == ROUTER_METRICS_PORT
    for job in (WORKERS_JOB, ROUTERS_JOB):
        sd = by_job[job]["kubernetes_sd_configs"][0]
        assert sd == {"role": "endpointslice", "namespaces": {"names": [SERVING_NAMESPACE]}}
        targets = {r.get("target_label") for r in by_job[job]["relabel_configs"]}
        assert ENDPOINT_LABEL in targets


def test_scrape_jobs_are_well_formed(rendered):
    _, docs, jobs, _ = rendered["china"]
    for job in jobs:
        assert set(job) <= {"job_name", "metrics_path", "scrape_interval", "scrape_timeout",
                            "honor_labels", "kubernetes_sd_configs", "relabel_configs",
                            "metric_relabel_configs"}
        for rule in job["relabel_configs"] + job.get("metric_relabel_configs", []):
            re.compile(rule.get("regex", "(.*)"))   # RE2 syntax is a subset of this
            assert rule.get("action", "replace") in ("keep", "replace")
    dcgm = next(j for j in jobs if j["job_name"] == DCGM_JOB)
    (ds,) = _kind(docs, "DaemonSet")
    pod_labels = ds["spec"]["template"]["metadata"]["labels"]
    port = ds["spec"]["template"]["spec"]["containers"][0]["ports"][0]["name"]
    assert _relabel_keep(dcgm, {"__meta_kubernetes_pod_label_app_kubernetes_io_name":
                                pod_labels[LABEL_NAME],
                                "__meta_kubernetes_pod_container_port_name": port})
    (mr,) = dcgm["metric_relabel_configs"]
    assert re.fullmatch(mr["regex"], "llama-3-1-8b-instruct-workers-7d9f8-x2x").group(1) == \
        "llama-3-1-8b-instruct"


@pytest.mark.parametrize("name", ENVIRONMENTS)
def test_dcgm_exporter_runs_on_gpu_nodes_only(rendered, name):
    cfg, docs, _, _ = rendered[name]
    (ds,) = _kind(docs, "DaemonSet")
    pod = ds["spec"]["template"]["spec"]
    assert ds["metadata"]["namespace"] == MONITORING_NAMESPACE
    assert pod["nodeSelector"] == {NODE_ROLE_LABEL: NODE_ROLE_GPU}
    assert pod["tolerations"] == [{"key": GPU_TAINT_KEY, "operator": "Exists",
                                   "effect": "NoSchedule"}]
    (container,) = pod["containers"]
    assert container["image"] == cfg.images.uri(DCGM_COMPONENT)
    assert "nvidia.com/gpu" not in json.dumps(container["resources"])   # it takes no GPU
    # no capability: device fields only, from our counters file, no profiling field
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    counters = next(d for d in _kind(docs, "ConfigMap")
                    if d["metadata"]["name"] == "dcgm-exporter-counters")["data"]["counters.csv"]
    fields = [line.split(",")[0] for line in counters.splitlines() if not line.startswith("#")]
    assert fields and all(f.startswith("DCGM_FI_DEV_") for f in fields)
    assert all(len(line.split(",")) == 3 for line in counters.splitlines()
               if not line.startswith("#"))
    assert container["args"] == ["-f", "/etc/kvcache-dcgm/counters.csv"]
    (ns,) = _kind(docs, "Namespace")
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "privileged"
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/warn"] == "baseline"


@pytest.mark.parametrize("name", ENVIRONMENTS)
def test_chart_values_pin_every_image_of_the_catalogue_entry(rendered, name):
    cfg, _, _, values = rendered[name]
    images = cfg.images
    used = set(chart_images(values))
    keys = set(CHARTS[CHART_KEY].images)
    if cfg.observability == "managed":        # agent: no Grafana, no Alertmanager
        keys -= {"grafana", "k8s-sidecar", "alertmanager"}
    else:
        keys |= {"aws-cli"}                   # Grafana's admin password fetch
    assert used == {images.uri(k) for k in keys}
    if cfg.facts.china:
        registry = f"{cfg.account}.dkr.ecr.{cfg.region}.amazonaws.com.cn/"
        assert all(i.startswith(registry) and "@sha256:" in i for i in used), used


def test_global_collector_is_an_agent_writing_to_amp(rendered):
    _, _, _, values = rendered["dev"]
    prom = values["prometheus"]
    assert prom["agentMode"] is True
    (rw,) = prom["prometheusSpec"]["remoteWrite"]
    assert rw["sigv4"] == {"region": "us-west-2"} and rw["url"].endswith("/api/v1/remote_write")
    assert values["grafana"] == {"enabled": False}
    assert values["alertmanager"] == {"enabled": False}


@pytest.mark.parametrize("name", ["china", "dev-cn"])
def test_china_stack_is_self_hosted_internal_and_password_free(rendered, name):
    _, _, _, values = rendered[name]
    assert values["prometheus"]["agentMode"] is False
    spec = values["prometheus"]["prometheusSpec"]
    assert spec["storageSpec"]["volumeClaimTemplate"]["spec"]["storageClassName"] == "kvcache-gp3"
    assert "remoteWrite" not in spec
    grafana = values["grafana"]
    assert grafana["service"] == {"type": "ClusterIP"}
    assert grafana["persistence"]["enabled"] is True
    assert grafana["env"]["GF_SECURITY_ADMIN_PASSWORD__FILE"] == GRAFANA_ADMIN_FILE
    assert "GF_SECURITY_ADMIN_PASSWORD" not in grafana["env"]
    assert "adminPassword" not in grafana and grafana.get("admin") is None
    for sidecar in ("dashboards", "datasources"):
        assert grafana["sidecar"][sidecar]["env"]["REQ_PASSWORD_FILE"] == GRAFANA_ADMIN_FILE
    (fetch,) = grafana["extraInitContainers"]
    assert "secretsmanager get-secret-value" in fetch["command"][-1]
    assert {"name": "admin-credentials", "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}} \
        in grafana["extraVolumes"]
    # The chart runs extraInitContainers and additionalScrapeConfigs through `tpl`.
    assert "{{" not in json.dumps(grafana["extraInitContainers"])
    assert "{{" not in json.dumps(spec["additionalScrapeConfigs"])


def test_keda_reads_the_in_cluster_prometheus_service_the_chart_creates():
    assert IN_CLUSTER_PROMETHEUS_URL == (
        f"http://{RELEASE}-prometheus.{MONITORING_NAMESPACE}.svc.cluster.local:{PROMETHEUS_PORT}")


def test_values_props_want_exactly_one_mode():
    images = ImageResolver(False, "111111111111", None)
    with pytest.raises(ValueError):
        MonitoringValuesProps(images=images, scrape_configs=[])


@pytest.mark.parametrize("name", ENVIRONMENTS)
def test_monitoring_manifests_and_values_snapshot(rendered, name, environment_snapshot):
    _, docs, jobs, values = rendered[name]
    text = yaml.safe_dump_all([*docs, {"scrape_configs": jobs}, values], sort_keys=True)
    assert normalise(text) == environment_snapshot
