"""Metrics collection in the cluster, for both variants.

- `scrape_configs`: plain Prometheus scrape jobs for the workers (vLLM + LMCache share one
  `/metrics`), the routers and the DCGM exporter. The same jobs go into the collector in both
  variants, so every series carries the same `job`, `kvcache_endpoint` and `kvcache_component`
  labels and one set of dashboards and rules fits both.
- `kube_prometheus_stack_values`: kube-prometheus-stack (pinned in config/images.py CHARTS),
  every image from the catalogue. Global: Prometheus in agent mode remote-writing to AMP with
  SigV4 (credentials from EKS Pod Identity). China: Prometheus server + Alertmanager + Grafana on
  EBS, Grafana internal only, its admin password fetched from Secrets Manager at pod start.
- cdk8s charts: the namespace (and gp3 StorageClass), the DCGM exporter DaemonSet on GPU nodes,
  the PrometheusRule and the dashboard ConfigMaps the Grafana sidecar loads (China).

The kube-state-metrics and node-exporter that come with the chart cover node/cluster basics and
the readiness of a self-hosted cache; Valkey's own metrics come from its redis_exporter sidecar
(port REDIS_EXPORTER_PORT, job `kvcache-valkey`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from cdk8s import ApiObject, App, Chart
from constructs import Construct

from config import EnvironmentConfig
from config.contracts import (
    GPU_TAINT_KEY, LABEL_INSTANCE, LABEL_NAME, MONITORING_NAMESPACE, MONITORING_RELEASE,
    NODE_ROLE_GPU, NODE_ROLE_LABEL, NODE_ROLE_SYSTEM, SERVING_NAMESPACE,
)
from config.images import IMAGES, ImageResolver
from config.endpoint_spec import EndpointSpec
from k8s.placeholders import token
from k8s.flows import PROMETHEUS, Flow, Peer, monitoring_stack_flows
from k8s.network_policies import NetworkPoliciesChart, NetworkPoliciesProps
from k8s.secret_fetch import fetch_secret_container
from k8s.objects import (
    hardened, k8s_object, pod_security_labels, selector_labels, standard_labels,
)
from k8s.router import COMPONENT as ROUTER_COMPONENT
from k8s.workers import COMPONENT as WORKER_COMPONENT
from observability.dashboards import build_dashboards, dumps
from k8s.cache import VALKEY
from observability.metrics import (
    CATALOGUE, COMPONENT_LABEL, DCGM_JOB, ENDPOINT_LABEL, ROUTERS_JOB, VALKEY_JOB, WORKERS_JOB,
)
from observability.alerting import alertmanager_config
from observability.rules import rule_file

CHART_KEY = "kube-prometheus-stack"
RELEASE = MONITORING_RELEASE     # fullnameOverride: Services kvcache-prometheus, kvcache-grafana...
PROMETHEUS_SERVICE_ACCOUNT = f"{RELEASE}-prometheus"
GRAFANA_SERVICE_ACCOUNT = f"{RELEASE}-grafana"
ALERTMANAGER_SERVICE_ACCOUNT = f"{RELEASE}-alertmanager"   # publishes to SNS (Pod Identity)
GRAFANA_ADMIN_USER = "admin"
GRAFANA_ADMIN_DIR = "/etc/grafana-admin"
GRAFANA_ADMIN_FILE = f"{GRAFANA_ADMIN_DIR}/password"
DASHBOARD_LABEL, DASHBOARD_LABEL_VALUE = "grafana_dashboard", "1"   # the chart's sidecar default
STORAGE_CLASS = "kvcache-gp3"
DCGM_COMPONENT = "dcgm-exporter"
DCGM_PORT = 9400
SCRAPE_INTERVAL = "15s"
WORKER_METRICS_PATH = "/metrics"   # vLLM's, with LMCache's metrics on the same page

_SYSTEM = {NODE_ROLE_LABEL: NODE_ROLE_SYSTEM}
_GPU_TOLERATION = {"key": GPU_TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"}


def _meta(label: str) -> str:
    """Prometheus's name for a Kubernetes label: `app.kubernetes.io/name` ->
    `app_kubernetes_io_name`."""
    return "".join(c if c.isalnum() else "_" for c in label)


def scrape_configs(*, endpoints: tuple[str, ...], serving_namespace: str = SERVING_NAMESPACE,
                   monitoring_namespace: str = MONITORING_NAMESPACE,
                   intervals: Mapping[str, int] | None = None) -> list[dict]:
    """Scrape jobs for `endpoints` (names whose metrics are enabled). `intervals`: an
    endpoint's own scrape interval in seconds (metrics.metricsScrapeIntervalSeconds), where it
    is not SCRAPE_INTERVAL: its workers and router get jobs of their own at that interval,
    whose series carry the usual job label (queries and alerts read them alike)."""
    svc_name = f"__meta_kubernetes_service_label_{_meta(LABEL_NAME)}"
    svc_instance = f"__meta_kubernetes_service_label_{_meta(LABEL_INSTANCE)}"
    common_targets = [
        {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
        {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
        {"source_labels": ["__meta_kubernetes_pod_node_name"], "target_label": "node"},
    ]

    def service_job(job: str, component: str, port_name: str, path: str,
                    names: tuple[str, ...] = endpoints, every: int | None = None) -> dict:
        keep = [{"source_labels": [svc_name, "__meta_kubernetes_endpointslice_port_name"],
                 "regex": f"{component};{port_name}", "action": "keep"}]
        if names:
            keep.append({"source_labels": [svc_instance], "action": "keep",
                         "regex": "|".join(names)})
        if every is not None:   # its own job, read as the usual one
            keep.append({"target_label": "job", "replacement": job})
        return {
            "job_name": job if every is None else f"{job}-{every}s", "metrics_path": path,
            "scrape_interval": SCRAPE_INTERVAL if every is None else f"{every}s",
            "scrape_timeout": "10s" if every is None else f"{min(every, 10)}s",
            "kubernetes_sd_configs": [{"role": "endpointslice",
                                       "namespaces": {"names": [serving_namespace]}}],
            "relabel_configs": keep + [
                {"source_labels": [svc_instance], "target_label": ENDPOINT_LABEL},
                {"source_labels": [svc_name], "target_label": COMPONENT_LABEL},
                *common_targets],
        }

    own = {n: i for n, i in (intervals or {}).items()
           if n in endpoints and f"{i}s" != SCRAPE_INTERVAL}
    usual = tuple(n for n in endpoints if n not in own)
    jobs = [service_job(WORKERS_JOB, WORKER_COMPONENT, "http", WORKER_METRICS_PATH, usual),
            service_job(ROUTERS_JOB, ROUTER_COMPONENT, "metrics", "/metrics", usual)]
    if endpoints and not usual:   # every endpoint has its own interval: the usual jobs idle
        endpoints = ()
    for every in sorted(set(own.values())):
        names = tuple(n for n, i in own.items() if i == every)
        jobs += [service_job(WORKERS_JOB, WORKER_COMPONENT, "http", WORKER_METRICS_PATH,
                             names, every),
                 service_job(ROUTERS_JOB, ROUTER_COMPONENT, "metrics", "/metrics", names, every)]
    if not endpoints:  # nothing to scrape but the GPUs: keep the jobs, match nothing
        for job in jobs[:2]:
            job["relabel_configs"].insert(0, {"source_labels": [svc_instance],
                                              "regex": "^$", "action": "keep"})
    # The self-hosted Valkey (shared by every endpoint: no endpoint label), through the
    # redis_exporter sidecar's `metrics` port. Matches nothing where there is no such cache.
    jobs.append({
        "job_name": VALKEY_JOB, "scrape_interval": SCRAPE_INTERVAL, "scrape_timeout": "10s",
        "kubernetes_sd_configs": [{"role": "endpointslice",
                                   "namespaces": {"names": [serving_namespace]}}],
        "relabel_configs": [
            {"source_labels": [svc_name, "__meta_kubernetes_endpointslice_port_name"],
             "regex": f"{VALKEY};metrics", "action": "keep"},
            {"target_label": COMPONENT_LABEL, "replacement": VALKEY},
            *common_targets],
    })
    jobs.append({
        "job_name": DCGM_JOB, "scrape_interval": SCRAPE_INTERVAL, "scrape_timeout": "10s",
        # The exporter labels each GPU with the pod holding it: keep its pod/namespace labels.
        "honor_labels": True,
        "kubernetes_sd_configs": [{"role": "pod",
                                   "namespaces": {"names": [monitoring_namespace]}}],
        "relabel_configs": [
            {"source_labels": [f"__meta_kubernetes_pod_label_{_meta(LABEL_NAME)}",
                               "__meta_kubernetes_pod_container_port_name"],
             "regex": f"{DCGM_COMPONENT};metrics", "action": "keep"},
            {"source_labels": ["__meta_kubernetes_pod_node_name"], "target_label": "node"},
            {"target_label": COMPONENT_LABEL, "replacement": DCGM_COMPONENT}],
        # GPUs held by a worker pod (`<endpoint>-workers-...`) get that endpoint's label.
        "metric_relabel_configs": [
            {"source_labels": ["pod"], "regex": "(.+)-workers-.+",
             "target_label": ENDPOINT_LABEL, "replacement": "$1"}],
    })
    return jobs


def scraped_endpoints(specs: tuple[EndpointSpec, ...]) -> tuple[str, ...]:
    """Endpoints whose files keep `metrics.enabled` (the HyperPod default)."""
    return tuple(s.name for s in specs if s.metrics_enabled)


def scrape_intervals(specs: tuple[EndpointSpec, ...]) -> dict[str, int]:
    """Each endpoint's scrape interval in seconds (metrics.metricsScrapeIntervalSeconds)."""
    return {s.name: s.scrape_interval_s for s in specs}


# ---------------------------------------------------------------- kube-prometheus-stack values

def _split(images: ImageResolver, key: str) -> tuple[str, str, str, str]:
    """(registry, repository, tag, digest) of a catalogue image as this environment pulls it."""
    registry, _, repository = images.repository_of(key).partition("/")
    image = IMAGES[key]
    if not image.digest:
        raise ValueError(f"image {key} has no pinned digest")
    return registry, repository, image.tag, image.digest


def _image_sha_hex(images: ImageResolver, key: str) -> dict:
    """The operator/Prometheus/Alertmanager/Grafana templates: `sha` without `sha256:`."""
    registry, repository, tag, digest = _split(images, key)
    return {"registry": registry, "repository": repository, "tag": tag,
            "sha": digest.removeprefix("sha256:"), "pullPolicy": "IfNotPresent"}


def _image_sha_full(images: ImageResolver, key: str) -> dict:
    """kube-state-metrics's template appends `@<sha>` as given."""
    registry, repository, tag, digest = _split(images, key)
    return {"registry": registry, "repository": repository, "tag": tag, "sha": digest,
            "pullPolicy": "IfNotPresent"}


def _image_node_exporter(images: ImageResolver, key: str) -> dict:
    """node-exporter's template takes `digest` (with `sha256:`) and would append `-distroless`
    to the tag itself; the catalogue tag already names the distroless variant."""
    registry, repository, tag, digest = _split(images, key)
    return {"registry": registry, "repository": repository, "tag": tag, "digest": digest,
            "distroless": False, "pullPolicy": "IfNotPresent"}


@dataclass(frozen=True)
class RemoteWrite:
    """Agent mode: everything scraped goes to this AMP workspace, signed with SigV4."""

    url: str            # <workspace prometheus endpoint>api/v1/remote_write
    region: str


@dataclass(frozen=True)
class GrafanaProps:
    admin_secret_arn: str      # Secrets Manager; fetched at pod start, never in a manifest
    region: str
    fetch_image: str           # aws-cli, as the worker chart's secret fetch
    storage: str = "10Gi"


@dataclass(frozen=True)
class MonitoringValuesProps:
    images: ImageResolver
    scrape_configs: list[dict]
    remote_write: RemoteWrite | None = None     # set: agent mode (global)
    grafana: GrafanaProps | None = None         # set: server + Grafana (China)
    alertmanager_config: Mapping[str, Any] | None = None   # observability/alerting.py (server)
    storage_class: str = STORAGE_CLASS
    prometheus_storage: str = "50Gi"
    retention: str = "15d"
    retention_size: str = "45GB"
    alertmanager_storage: str = "2Gi"

    def __post_init__(self) -> None:
        if (self.remote_write is None) == (self.grafana is None):
            raise ValueError("exactly one of remote_write (agent mode) and grafana (server)")
        if (self.alertmanager_config is None) != (self.grafana is None):
            raise ValueError("an in-cluster Alertmanager needs its routing config, and only it")


def _pvc(storage_class: str, size: str) -> dict:
    return {"volumeClaimTemplate": {"spec": {
        "storageClassName": storage_class, "accessModes": ["ReadWriteOnce"],
        "resources": {"requests": {"storage": size}}}}}


def _resources(cpu: str, memory: str, memory_limit: str | None = None) -> dict:
    return {"requests": {"cpu": cpu, "memory": memory},
            "limits": {"memory": memory_limit or memory}}


def _grafana_values(p: MonitoringValuesProps, g: GrafanaProps) -> dict:
    creds = {"name": "admin-credentials", "mountPath": GRAFANA_ADMIN_DIR, "readOnly": True}
    sidecar_auth = {"REQ_USERNAME": GRAFANA_ADMIN_USER, "REQ_PASSWORD_FILE": GRAFANA_ADMIN_FILE}
    # Same pattern as the workers' L2 secret: the value goes from Secrets Manager into a memory
    # volume of this pod only. Grafana reads it through GF_SECURITY_ADMIN_PASSWORD__FILE and the
    # sidecars through REQ_PASSWORD_FILE, so the chart renders no admin Secret at all.
    fetch = fetch_secret_container(
        name="fetch-admin-password", image=g.fetch_image, region=g.region,
        secret_arn=g.admin_secret_arn, out_file=GRAFANA_ADMIN_FILE, volume="admin-credentials",
        run_as_user=472)
    return {
        "enabled": True,
        "image": _image_sha_hex(p.images, "grafana"),
        "serviceAccount": {"create": True, "name": GRAFANA_SERVICE_ACCOUNT},
        "nodeSelector": _SYSTEM,
        "service": {"type": "ClusterIP"},          # internal only: port-forward or VPN
        "persistence": {"enabled": True, "type": "pvc", "storageClassName": p.storage_class,
                        "size": g.storage},
        "deploymentStrategy": {"type": "Recreate"},  # one ReadWriteOnce volume
        "initChownData": {"enabled": False},         # fsGroup 472 owns the volume already
        "testFramework": {"enabled": False},
        "defaultDashboardsTimezone": "browser",
        "env": {"GF_SECURITY_ADMIN_USER": GRAFANA_ADMIN_USER,
                "GF_SECURITY_ADMIN_PASSWORD__FILE": GRAFANA_ADMIN_FILE},
        "extraInitContainers": [fetch],
        "extraVolumes": [
            {"name": "admin-credentials", "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}},
            {"name": "fetch-tmp", "emptyDir": {"medium": "Memory", "sizeLimit": "16Mi"}}],
        "extraVolumeMounts": [creds],
        "sidecar": {
            "image": _image_sha_hex(p.images, "k8s-sidecar"),
            "dashboards": {"env": sidecar_auth, "extraMounts": [creds],
                           "label": DASHBOARD_LABEL, "labelValue": DASHBOARD_LABEL_VALUE},
            "datasources": {"env": sidecar_auth, "extraMounts": [creds]},
        },
        # Nothing phones home: grafana.com is not reachable from China.
        "grafana.ini": {"analytics": {"reporting_enabled": False, "check_for_updates": False,
                                      "check_for_plugin_updates": False},
                        "news": {"news_feed_enabled": False}},
        "resources": _resources("100m", "256Mi", "1Gi"),
    }


def kube_prometheus_stack_values(p: MonitoringValuesProps) -> dict:
    """Values for the pinned kube-prometheus-stack chart (88.5.2)."""
    agent = p.remote_write is not None
    spec: dict[str, Any] = {
        "image": _image_sha_hex(p.images, "prometheus"),
        "nodeSelector": _SYSTEM,
        "additionalScrapeConfigs": p.scrape_configs,
        "scrapeInterval": "30s",
        # Select every ServiceMonitor/PodMonitor/rule in the cluster, not only the release's.
        "serviceMonitorSelectorNilUsesHelmValues": False,
        "podMonitorSelectorNilUsesHelmValues": False,
        "probeSelectorNilUsesHelmValues": False,
        "scrapeConfigSelectorNilUsesHelmValues": False,
        "resources": _resources("500m", "2Gi", "6Gi"),
    }
    if agent:
        spec["remoteWrite"] = [{
            "url": p.remote_write.url, "sigv4": {"region": p.remote_write.region},
            "queueConfig": {"maxSamplesPerSend": 1000, "maxShards": 200, "capacity": 2500}}]
    else:
        spec.update({
            "ruleSelectorNilUsesHelmValues": False,
            "retention": p.retention, "retentionSize": p.retention_size,
            "storageSpec": _pvc(p.storage_class, p.prometheus_storage),
        })
    values: dict[str, Any] = {
        "fullnameOverride": RELEASE,
        "crds": {"enabled": True},
        # EKS runs these control-plane parts out of reach: no targets, no rules for them.
        "kubeControllerManager": {"enabled": False}, "kubeEtcd": {"enabled": False},
        "kubeScheduler": {"enabled": False}, "kubeProxy": {"enabled": False},
        "prometheusOperator": {
            "image": _image_sha_hex(p.images, "prometheus-operator"),
            "prometheusConfigReloader": {
                "image": _image_sha_hex(p.images, "prometheus-config-reloader")},
            # No admission webhook: no certgen hook Job (and no extra image to mirror).
            "admissionWebhooks": {"enabled": False, "patch": {"enabled": False}},
            "tls": {"enabled": False},
            "nodeSelector": _SYSTEM,
            "resources": _resources("100m", "128Mi", "512Mi"),
        },
        "prometheus": {
            "agentMode": agent,
            "serviceAccount": {"create": True, "name": PROMETHEUS_SERVICE_ACCOUNT},
            "prometheusSpec": spec,
        },
        "kube-state-metrics": {"image": _image_sha_full(p.images, "kube-state-metrics"),
                               "nodeSelector": _SYSTEM,
                               "resources": _resources("50m", "128Mi", "512Mi")},
        "prometheus-node-exporter": {
            "image": _image_node_exporter(p.images, "node-exporter"),
            "tolerations": [_GPU_TOLERATION],
            "resources": _resources("20m", "32Mi", "128Mi")},
    }
    if agent:
        # AMP evaluates the rules; AMG is the Grafana. Nothing to alert or draw in-cluster.
        values.update({"defaultRules": {"create": False}, "alertmanager": {"enabled": False},
                       "grafana": {"enabled": False}})
    else:
        values.update({
            "defaultRules": {"create": True, "rules": {
                "etcd": False, "kubeControllerManager": False, "kubeSchedulerAlerting": False,
                "kubeSchedulerRecording": False, "kubeProxy": False, "windows": False}},
            "alertmanager": {
                # Replaces the chart's route/receivers/inhibit_rules (Helm merges maps: the
                # chart's `global` and `templates` stay).
                "config": dict(p.alertmanager_config),
                "serviceAccount": {"create": True, "name": ALERTMANAGER_SERVICE_ACCOUNT},
                "alertmanagerSpec": {
                    "image": _image_sha_hex(p.images, "alertmanager"), "nodeSelector": _SYSTEM,
                    "storage": _pvc(p.storage_class, p.alertmanager_storage),
                    "resources": _resources("20m", "64Mi", "256Mi")}},
            "grafana": _grafana_values(p, p.grafana),
        })
    return values


def chart_images(values: Mapping[str, Any]) -> list[str]:
    """Every image reference the values set, composed as the chart's templates compose them."""
    out = []

    def walk(node: Any) -> None:
        if isinstance(node, Mapping):
            if {"registry", "repository", "tag"} <= set(node):
                sha = node.get("sha") or ""
                digest = node.get("digest") or (
                    sha if sha.startswith("sha256:") else f"sha256:{sha}" if sha else "")
                out.append(f"{node['registry']}/{node['repository']}:{node['tag']}"
                           + (f"@{digest}" if digest else ""))
            for v in node.values():
                walk(v)
            if isinstance(node.get("image"), str):
                out.append(node["image"])
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(values)
    return out


# ---------------------------------------------------------------------------- cdk8s charts

@dataclass(frozen=True)
class MonitoringBaseProps:
    namespace: str
    storage_class: str | None      # set: create the gp3 StorageClass the PVCs use
    kubernetes_version: str
    retain_volumes: bool = True


class MonitoringBaseChart(Chart):
    """The monitoring namespace and, where Prometheus/Grafana keep data, a gp3 StorageClass
    (EBS CSI add-on; encrypted, bound where the pod lands)."""

    def __init__(self, scope: Construct, id: str, *, props: MonitoringBaseProps) -> None:
        super().__init__(scope, id)
        labels = standard_labels("monitoring", "cluster")
        # node-exporter (host network, PID and paths) and the DCGM exporter (the kubelet's
        # pod-resources socket) need `privileged`; everything stricter is audited and warned.
        ApiObject(self, "Namespace", api_version="v1", kind="Namespace",
                  metadata={"name": props.namespace, "labels": {
                      **labels, **pod_security_labels("privileged", props.kubernetes_version,
                                                       audit="baseline")}})
        if props.storage_class:
            k8s_object(self, "StorageClass", api_version="storage.k8s.io/v1",
                       kind="StorageClass", name=props.storage_class, namespace=None,
                       labels=labels, body={
                           "provisioner": "ebs.csi.aws.com",
                           "parameters": {"type": "gp3", "encrypted": "true", "fsType": "ext4"},
                           "reclaimPolicy": "Retain" if props.retain_volumes else "Delete",
                           "volumeBindingMode": "WaitForFirstConsumer",
                           "allowVolumeExpansion": True})


@dataclass(frozen=True)
class DcgmExporterProps:
    namespace: str
    image: str
    port: int = DCGM_PORT


DCGM_COUNTERS_DIR = "/etc/kvcache-dcgm"
DCGM_IMAGE = "dcgm-exporter"      # catalogue key, and the metrics catalogue's source


def dcgm_counters_csv() -> str:
    """The exporter's counters file: exactly the DCGM_FI_DEV_* fields the dashboards and rules
    name (observability/metrics.py), no DCGM_FI_PROF_* profiling field, so no SYS_ADMIN."""
    rows = [f"{m.name}, {m.type}, {m.help.replace(',', ' -')}" for m in CATALOGUE.values()
            if m.source == DCGM_IMAGE]
    return "# field, prometheus type, help\n" + "\n".join(rows) + "\n"


class DcgmExporterChart(Chart):
    """NVIDIA DCGM exporter on every GPU node (pod spec after NVIDIA's chart 4.8.2), with our
    counters file (device fields only: no SYS_ADMIN, no capability at all) and the kubelet
    pod-resources socket to label GPUs by pod."""

    def __init__(self, scope: Construct, id: str, *, props: DcgmExporterProps) -> None:
        super().__init__(scope, id, namespace=props.namespace)
        sel = selector_labels(DCGM_COMPONENT, "cluster")
        labels = standard_labels(DCGM_COMPONENT, "cluster")
        self.flows = (Flow(PROMETHEUS, Peer(DCGM_COMPONENT, props.namespace, sel), props.port,
                           "GPU metrics"),)
        probe = {"httpGet": {"path": "/health", "port": "metrics"},
                 "initialDelaySeconds": 45, "periodSeconds": 10}
        k8s_object(self, "Counters", api_version="v1", kind="ConfigMap",
                   name=f"{DCGM_COMPONENT}-counters", namespace=props.namespace, labels=labels,
                   body={"data": {"counters.csv": dcgm_counters_csv()}})
        k8s_object(self, "DaemonSet", api_version="apps/v1", kind="DaemonSet",
                   name=DCGM_COMPONENT, namespace=props.namespace, labels=labels, body={"spec": {
                       "selector": {"matchLabels": sel},
                       "updateStrategy": {"type": "RollingUpdate",
                                          "rollingUpdate": {"maxUnavailable": 1}},
                       "template": {"metadata": {"labels": labels}, "spec": {
                           "priorityClassName": "system-node-critical",
                           "automountServiceAccountToken": False,
                           "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
                           "nodeSelector": {NODE_ROLE_LABEL: NODE_ROLE_GPU},
                           "tolerations": [_GPU_TOLERATION],
                           "containers": [{
                               "name": "exporter", "image": props.image,
                               "imagePullPolicy": "IfNotPresent",
                               "args": ["-f", f"{DCGM_COUNTERS_DIR}/counters.csv"],
                               "env": [{"name": "DCGM_EXPORTER_KUBERNETES", "value": "true"},
                                       {"name": "DCGM_EXPORTER_LISTEN",
                                        "value": f":{props.port}"},
                                       {"name": "NODE_NAME", "valueFrom": {"fieldRef": {
                                           "fieldPath": "spec.nodeName"}}}],
                               "ports": [{"name": "metrics", "containerPort": props.port}],
                               # root (the image's embedded hostengine may write its state and
                               # log under the root filesystem), without any capability
                               "securityContext": hardened(read_only_root=False,
                                                           run_as_user=None),
                               "readinessProbe": probe,
                               "livenessProbe": {**probe, "failureThreshold": 6},
                               "resources": _resources("100m", "128Mi", "512Mi"),
                               "volumeMounts": [{"name": "pod-gpu-resources", "readOnly": True,
                                                 "mountPath": "/var/lib/kubelet/pod-resources"},
                                                {"name": "counters", "readOnly": True,
                                                 "mountPath": DCGM_COUNTERS_DIR},
                                                {"name": "tmp", "mountPath": "/tmp"}],
                           }],
                           "volumes": [{"name": "pod-gpu-resources", "hostPath": {
                               "path": "/var/lib/kubelet/pod-resources",
                               "type": "Directory"}},
                               {"name": "counters",
                                "configMap": {"name": f"{DCGM_COMPONENT}-counters"}},
                               {"name": "tmp", "emptyDir": {"sizeLimit": "64Mi"}}],
                       }}}})


@dataclass(frozen=True)
class AlertRulesProps:
    namespace: str
    rules: Mapping[str, Any]        # a Prometheus rule file: {"groups": [...]}
    name: str = "kvcache-alerts"


class AlertRulesChart(Chart):
    """The rule file as a PrometheusRule (Prometheus Operator CRD) for the in-cluster
    Prometheus; its `spec` is the same document AMP receives."""

    def __init__(self, scope: Construct, id: str, *, props: AlertRulesProps) -> None:
        super().__init__(scope, id, namespace=props.namespace)
        k8s_object(self, "PrometheusRule", api_version="monitoring.coreos.com/v1",
                   kind="PrometheusRule", name=props.name, namespace=props.namespace,
                   labels=standard_labels("alerts", "kvcache"),
                   body={"spec": {"groups": list(props.rules["groups"])}})


@dataclass(frozen=True)
class DashboardsProps:
    namespace: str
    dashboards: Mapping[str, dict]      # uid -> dashboard JSON
    folder: str = "kvcache"


class DashboardsChart(Chart):
    """One ConfigMap per dashboard, labelled for the Grafana dashboards sidecar."""

    def __init__(self, scope: Construct, id: str, *, props: DashboardsProps) -> None:
        super().__init__(scope, id, namespace=props.namespace)
        for uid, dashboard in sorted(props.dashboards.items()):
            k8s_object(self, f"Dashboard-{uid}", api_version="v1", kind="ConfigMap",
                       name=f"dashboard-{uid}", namespace=props.namespace,
                       labels={**standard_labels("dashboards", "kvcache"),
                               DASHBOARD_LABEL: DASHBOARD_LABEL_VALUE},
                       body={"data": {f"{uid}.json": dumps(dashboard)}})


@dataclass
class MonitoringCharts:
    base: MonitoringBaseChart
    dcgm: DcgmExporterChart
    rules: AlertRulesChart | None           # in-cluster Prometheus only (China)
    dashboards: DashboardsChart | None      # in-cluster Grafana only (China)
    network_policies: NetworkPoliciesChart

    def all(self) -> list[Chart]:
        return [c for c in (self.base, self.dcgm, self.rules, self.dashboards,
                            self.network_policies) if c]


def build_monitoring_charts(app: App, cfg: EnvironmentConfig,
                            specs: tuple[EndpointSpec, ...]) -> MonitoringCharts:
    images = cfg.images
    in_cluster = cfg.observability == "self-hosted"
    base = MonitoringBaseChart(app, "monitoring-base", props=MonitoringBaseProps(
        namespace=MONITORING_NAMESPACE, storage_class=STORAGE_CLASS if in_cluster else None,
        kubernetes_version=cfg.kubernetes_version, retain_volumes=cfg.retain_data))
    dcgm = DcgmExporterChart(app, "dcgm-exporter", props=DcgmExporterProps(
        namespace=MONITORING_NAMESPACE, image=images.uri(DCGM_IMAGE)))
    dcgm.add_dependency(base)
    rules = dashboards = None
    if in_cluster:
        rules = AlertRulesChart(app, "alert-rules", props=AlertRulesProps(
            namespace=MONITORING_NAMESPACE, rules=rule_file(cfg)))
        dashboards = DashboardsChart(app, "dashboards", props=DashboardsProps(
            namespace=MONITORING_NAMESPACE, dashboards=build_dashboards(cfg, specs)))
        for chart in (rules, dashboards):
            chart.add_dependency(base)
    policies = NetworkPoliciesChart(app, "monitoring-network-policies", props=NetworkPoliciesProps(
        namespace=MONITORING_NAMESPACE,
        flows=dcgm.flows + monitoring_stack_flows(in_cluster)))
    policies.add_dependency(base)
    return MonitoringCharts(base, dcgm, rules, dashboards, policies)


# Values AWS assigns at deploy time, in the GitOps copy (dist/<env>/helm/): the stacks' outputs.
PLACEHOLDERS = {
    "remote_write": token("AMP_REMOTE_WRITE_URL"),     # <workspace endpoint>api/v1/remote_write
    "grafana_admin_secret": token("GRAFANA_ADMIN_SECRET_ARN"),
    "alert_topic": token("ALERT_TOPIC_ARN"),
}


def placeholder_values(cfg: EnvironmentConfig, specs: tuple[EndpointSpec, ...]) -> dict:
    """The kube-prometheus-stack values the Monitoring stack installs, with placeholders where the
    stack passes a deploy-time value (same function, so the two cannot drift)."""
    images = cfg.images
    if cfg.observability == "managed":
        mode: dict[str, Any] = dict(remote_write=RemoteWrite(PLACEHOLDERS["remote_write"],
                                                             cfg.region))
    else:
        mode = dict(
            grafana=GrafanaProps(PLACEHOLDERS["grafana_admin_secret"], cfg.region,
                                 images.uri("aws-cli")),
            alertmanager_config=alertmanager_config(
                topic_arn=PLACEHOLDERS["alert_topic"], region=cfg.region, in_cluster=True))
    return kube_prometheus_stack_values(MonitoringValuesProps(
        images=images, scrape_configs=scrape_configs(endpoints=scraped_endpoints(specs),
                                                    intervals=scrape_intervals(specs)),
        **mode))

