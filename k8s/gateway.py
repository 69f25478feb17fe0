"""The Kubernetes inference gateway path, beside our router: per endpoint that asks, an
InferencePool (inference.networking.k8s.io/v1) naming exactly its worker pods, the Gateway API
Inference Extension's endpoint picker (EPP) for the pool, and an HTTPRoute from the Gateway the
environment names (`inferenceGateway.gateway`) to the pool. A conformant gateway (Istio,
agentgateway, NGINX Gateway Fabric) asks the EPP, over Envoy's ext-proc, which pod serves each
request. Our router pod, its front and its NLB are unchanged: both paths reach the same workers.

Pinned to one upstream release, GAIE v1.5.0: the CRD installed here (k8s/crds/), the EPP image
(config/images.py `epp`) and the plugin names and parameters its EndpointPickerConfig uses
(tests/fixtures/gateway/epp-v1.5.0.json, read from that release's source). v1.6.0 moved the
EPP to llm-d (`llm-d.ai`), whose config kinds differ.

- The pool targets WorkerProps.gateway_port: the request-limit sidecar's gateway port where
  `worker.requestLimits` is set (it answers a full worker with the file's overflowStatusCode
  itself, where the routers' port answers what the router pod's front translates), since vLLM
  then listens on loopback only and the limit is HyperPod's per-worker figure whichever path a
  request takes; vLLM's port otherwise. The EPP scrapes /metrics on the same port (the sidecar
  passes /metrics without a slot, k8s/request_limits.py).
- Strategy -> EPP scheduling (STRATEGY_PROFILES): prefixaware and kvaware get the release's
  default profile (queue 2, KV-cache utilization 2, prefix-cache 3, max-score picker). kvaware's
  precise prefix (KV events) is llm-d's `precise-prefix-cache-scorer`, not in this release: the
  gateway path predicts cache hits from its own routing history, the router path keeps the
  KV events. `session` and `roundrobin` have no scorer here and are refused in one line;
  pdSpec too (this EPP has no prefill/decode profile).
- Failure mode (`inferenceGateway.failureMode`, FailOpen by default as upstream's chart): one
  EPP replica (upstream's advice: its prefix index is in memory) rolls out with Recreate, so
  FailClose would fail every gateway request while it restarts. FailOpen: the gateway picks a
  pool pod itself meanwhile (cache-blind, still admitted by the workers' request limits);
  FailClose: the gateway answers an error (Envoy's 5xx) until the EPP is back. docs/gateway.md.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

import yaml
from cdk8s import Chart
from constructs import Construct

from config import ConfigError, EnvironmentConfig
from config.contracts import NODE_ROLE_LABEL, NODE_ROLE_SYSTEM
from config.endpoint_spec import EndpointSpec
from config.environment import InferenceGatewayConfig
from k8s.flows import Flow, Peer
from k8s.objects import (
    account_role, hardened, k8s_object, pod_security, selector_labels, standard_labels,
)

COMPONENT = "endpoint-picker"
POOL_GROUP = "inference.networking.k8s.io"
POOL_API = f"{POOL_GROUP}/v1"
ROUTE_GROUP = "gateway.networking.k8s.io"
ROUTE_API = f"{ROUTE_GROUP}/v1"
ISTIO_API = "networking.istio.io/v1"   # Istio 1.28+, which InferencePool v1 needs anyway
# API groups whose CRDs the team's own gateway installs (Gateway API: its controller's chart or
# the standard CRDs), before any of our deploys: nothing of ours provides or waits for them.
TEAM_CRD_GROUPS = frozenset({ROUTE_GROUP, ISTIO_API.split("/")[0]})
CRD_FILE = Path(__file__).with_name("crds") / "inference.networking.k8s.io_inferencepools.yaml"
EPP_CONFIG_API = "inference.networking.x-k8s.io/v1alpha1"
EPP_GRPC_PORT, EPP_HEALTH_PORT, EPP_METRICS_PORT = 9002, 9003, 9090   # the EPP's defaults
EPP_CONFIG_DIR, EPP_CONFIG_FILE = "/config", "epp.yaml"
# The release's default profile (its inferencepool chart's default-plugins.yaml).
DEFAULT_PROFILE = (("queue-scorer", 2), ("kv-cache-utilization-scorer", 2),
                   ("prefix-cache-scorer", 3))
STRATEGY_PROFILES: dict[str, tuple[tuple[str, int], ...]] = {
    "prefixaware": DEFAULT_PROFILE,
    "kvaware": DEFAULT_PROFILE,
}
REFUSED = {
    "roundrobin": "the endpoint picker has no round-robin scorer (it scores queue, KV-cache "
                  "use and prefix); use prefixaware, or point a plain HTTPRoute at the "
                  "router's Service (docs/gateway.md)",
    "session": "the pinned endpoint picker (GAIE v1.5.0) has no session-affinity scorer; use "
               "prefixaware (a session's turns share their prefix), or a plain HTTPRoute to the "
               "router's Service (docs/gateway.md)",
}


def pool_name(endpoint: str) -> str:
    return f"{endpoint}-pool"


def epp_name(endpoint: str) -> str:
    return f"{endpoint}-epp"


def joins_gateway(cfg: EnvironmentConfig, s: EndpointSpec) -> bool:
    g = cfg.inference_gateway
    return g is not None and (g.all_endpoints or s.inference_gateway)


def gateway_check(cfg: EnvironmentConfig, s: EndpointSpec) -> None:
    """One line before deploy for an endpoint that asks for the gateway path and cannot have
    it: no Gateway named, a strategy the EPP has no scheduling for, or P/D."""
    field = (f"{s.source_file}: spec.inferenceGateway.enabled" if s.inference_gateway
             else "inferenceGateway.allEndpoints")
    if s.inference_gateway and cfg.inference_gateway is None:
        raise ConfigError(cfg.name, field, True, "false, or an environment "
                          "`inferenceGateway: {gateway: {name, namespace}}` naming the Gateway "
                          "API gateway the endpoint joins (docs/gateway.md)")
    if not joins_gateway(cfg, s):
        return
    if s.routing_strategy in REFUSED:
        raise ConfigError(cfg.name, field, f"{s.name} (routingStrategy {s.routing_strategy})",
                          REFUSED[s.routing_strategy])
    if s.pd is not None:
        raise ConfigError(cfg.name, field, f"{s.name} (pdSpec)", "an endpoint without pdSpec: "
                          "the pinned endpoint picker has no prefill/decode scheduling")


MODEL_HEADER = "X-Gateway-Model-Name"   # v1.5.0 BBR's body-field-to-header default


def route_match(g: InferenceGatewayConfig, model: str) -> dict:
    """What of a request sends it to this endpoint's pool: every path under `/`, and with
    `routeBy: model` the header the team's body-based router (the extension's BBR, installed
    on the Gateway) sets from the request body's `model`, equal to the served name."""
    match: dict = {"path": {"type": "PathPrefix", "value": "/"}}
    if g.route_by == "model":
        match["headers"] = [{"type": "Exact", "name": MODEL_HEADER, "value": model}]
    return match


def route_hostnames(g: InferenceGatewayConfig, endpoint: str) -> dict:
    """`routeBy: hostname`: the endpoint answers at <endpoint>.<domain> only."""
    return {"hostnames": [f"{endpoint}.{g.domain}"]} if g.route_by == "hostname" else {}


def routes_check(cfg: EnvironmentConfig, specs: tuple[EndpointSpec, ...]) -> None:
    """One line before deploy where two endpoints on the one Gateway would take each other's
    requests: by Gateway API's rules two routes that match alike go to the oldest route, so
    one model would be unreachable. `routeBy` tells them apart; under `model` two endpoints
    serving the same name cannot be told apart either."""
    joining = [s for s in specs if joins_gateway(cfg, s)]
    g = cfg.inference_gateway
    if len(joining) < 2:
        return
    names = ", ".join(s.name for s in joining)
    if g.route_by == "none":
        raise ConfigError(cfg.name, "inferenceGateway.routeBy", "none", f"model or hostname: "
                          f"{names} join Gateway {g.namespace}/{g.name}, and routes that match "
                          "alike send every request to one of them (docs/gateway.md)")
    if g.route_by == "model":
        seen: dict[str, str] = {}
        for s in joining:
            if s.model_name in seen:
                raise ConfigError(cfg.name, f"{s.source_file}: spec.modelName", s.model_name,
                                  f"a served name other than {seen[s.model_name]}'s: both join "
                                  "Gateway by model (inferenceGateway.routeBy: hostname tells "
                                  "them apart by name instead)")
            seen[s.model_name] = s.name


def epp_config(strategy: str) -> dict:
    """The EPP's EndpointPickerConfig for a routing strategy (names from the pinned release)."""
    profile = STRATEGY_PROFILES[strategy]
    return {
        "apiVersion": EPP_CONFIG_API, "kind": "EndpointPickerConfig",
        "plugins": [*({"type": t} for t, _ in profile),
                    {"type": "max-score-picker"}, {"type": "single-profile-handler"},
                    {"type": "metrics-data-source",
                     "parameters": {"scheme": "http", "path": "/metrics",
                                    "insecureSkipVerify": True}},
                    {"type": "core-metrics-extractor"}],
        "schedulingProfiles": [{"name": "default", "plugins": [
            *({"pluginRef": t, "weight": w} for t, w in profile),
            {"pluginRef": "max-score-picker"}]}],
    }


def crd() -> dict:
    """The pinned InferencePool CRD as the API server takes it (no status, no timestamp)."""
    doc = yaml.safe_load(CRD_FILE.read_text())
    doc.pop("status", None)
    doc["metadata"].pop("creationTimestamp", None)
    return doc


class InferencePoolCrdChart(Chart):
    """Applied before any endpoint's chart (k8s/serving.py), so no pool precedes its kind."""

    def __init__(self, scope: Construct, id: str) -> None:
        super().__init__(scope, id)
        doc = crd()
        k8s_object(self, "Crd", api_version=doc["apiVersion"], kind=doc["kind"],
                   name=doc["metadata"]["name"], namespace=None,
                   labels=standard_labels("crd", "inference-extension"),
                   annotations=doc["metadata"]["annotations"], body={"spec": doc["spec"]})


@dataclass(frozen=True)
class GatewayProps:
    endpoint: str
    namespace: str
    strategy: str
    worker_selector: Mapping[str, str]
    worker_port: int             # WorkerProps.router_port: the sidecar's where limits are set
    image: str
    gateway: InferenceGatewayConfig
    longest_request_s: int
    model: str = ""              # the served model name (vLLM's --served-model-name)


class InferenceGatewayChart(Chart):
    def __init__(self, scope: Construct, id: str, *, props: GatewayProps) -> None:
        super().__init__(scope, id, namespace=props.namespace)
        p, g = props, props.gateway
        ns, name, pool = p.namespace, epp_name(p.endpoint), pool_name(p.endpoint)
        sel = selector_labels(COMPONENT, p.endpoint)
        labels = standard_labels(COMPONENT, p.endpoint)
        proxy = Peer("gateway-proxy", g.proxy_namespace, dict(g.proxy_labels))
        epp = Peer(name, ns, sel)
        workers = Peer(f"{p.endpoint}-workers", ns, dict(p.worker_selector))
        self.flows = (
            Flow(proxy, workers, p.worker_port, "requests through the team's gateway"),
            Flow(epp, workers, p.worker_port, "the endpoint picker scrapes /metrics"),
            Flow(proxy, epp, EPP_GRPC_PORT, "ext-proc: the gateway asks which pod"))
        k8s_object(self, "Pool", api_version=POOL_API, kind="InferencePool", name=pool,
                   namespace=ns, labels=labels, body={"spec": {
                       "selector": {"matchLabels": dict(p.worker_selector)},
                       "targetPorts": [{"number": p.worker_port}],
                       "endpointPickerRef": {"name": name, "kind": "Service",
                                             "port": {"number": EPP_GRPC_PORT},
                                             "failureMode": g.failure_mode}}})
        k8s_object(self, "Route", api_version=ROUTE_API, kind="HTTPRoute", name=p.endpoint,
                   namespace=ns, labels=labels, body={"spec": {
                       "parentRefs": [{"group": ROUTE_GROUP, "kind": "Gateway",
                                       "name": g.name, "namespace": g.namespace}],
                       **route_hostnames(g, p.endpoint),
                       "rules": [{
                           "matches": [route_match(g, p.model)],
                           "backendRefs": [{"group": POOL_GROUP, "kind": "InferencePool",
                                            "name": pool}],
                           "timeouts": {"request": f"{p.longest_request_s}s"}}]}})
        if g.implementation == "istio":
            # The picker serves TLS with a certificate of its own (v1.5.0 SecureServing); Envoy
            # reaches it over TLS only where a DestinationRule says so (upstream's chart
            # renders this one for provider istio). Without it every ext-proc call fails.
            k8s_object(self, "DestinationRule", api_version=ISTIO_API, kind="DestinationRule",
                       name=name, namespace=ns, labels=labels, body={"spec": {
                           "host": f"{name}.{ns}.svc.cluster.local",
                           "trafficPolicy": {"tls": {"mode": "SIMPLE",
                                                     "insecureSkipVerify": True}}}})
        k8s_object(self, "ServiceAccount", api_version="v1", kind="ServiceAccount", name=name,
                   namespace=ns, labels=labels, body={"automountServiceAccountToken": True})
        # least privilege: read its pool and the pods, in this namespace only
        account_role(self, "", name=name, namespace=ns, labels=labels, rules=[
            {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]},
            {"apiGroups": [POOL_GROUP], "resources": ["inferencepools"],
             "verbs": ["get", "list", "watch"]},
            {"apiGroups": ["inference.networking.x-k8s.io"],
             "resources": ["inferenceobjectives", "inferencemodelrewrites"],
             "verbs": ["get", "list", "watch"]}])
        config_text = yaml.safe_dump(epp_config(p.strategy), sort_keys=False)
        k8s_object(self, "Config", api_version="v1", kind="ConfigMap", name=name, namespace=ns,
                   labels=labels, body={"data": {EPP_CONFIG_FILE: config_text}})
        probe = {"grpc": {"port": EPP_HEALTH_PORT, "service": "inference-extension"}}
        k8s_object(self, "Service", api_version="v1", kind="Service", name=name, namespace=ns,
                   labels=labels, body={"spec": {
                       "type": "ClusterIP", "selector": sel,
                       "ports": [{"name": "grpc-ext-proc", "port": EPP_GRPC_PORT,
                                  "targetPort": EPP_GRPC_PORT, "protocol": "TCP"}]}})
        k8s_object(self, "Deployment", api_version="apps/v1", kind="Deployment", name=name,
                   namespace=ns, labels=labels, body={"spec": {
                       "replicas": 1,
                       # one active picker (its prefix index is its memory); Recreate as upstream
                       "strategy": {"type": "Recreate"},
                       "selector": {"matchLabels": sel},
                       "template": {
                           "metadata": {"labels": labels, "annotations": {
                               "kvcache.io/epp-config": hash_text(config_text)}},
                           "spec": {
                               "serviceAccountName": name,
                               "nodeSelector": {NODE_ROLE_LABEL: NODE_ROLE_SYSTEM},
                               "securityContext": pod_security(),
                               "terminationGracePeriodSeconds": 130,
                               "containers": [{
                                   "name": "epp", "image": p.image,
                                   "imagePullPolicy": "IfNotPresent",
                                   "args": ["--pool-name", pool, "--pool-namespace", ns,
                                            "--pool-group", POOL_GROUP,
                                            "--config-file",
                                            f"{EPP_CONFIG_DIR}/{EPP_CONFIG_FILE}",
                                            "--grpc-port", str(EPP_GRPC_PORT),
                                            "--grpc-health-port", str(EPP_HEALTH_PORT),
                                            "--metrics-port", str(EPP_METRICS_PORT),
                                            "--zap-encoder", "json", "--tracing=false",
                                            "--v", "1"],
                                   "env": [{"name": "NAMESPACE", "valueFrom": {"fieldRef": {
                                               "fieldPath": "metadata.namespace"}}},
                                           {"name": "POD_NAME", "valueFrom": {"fieldRef": {
                                               "fieldPath": "metadata.name"}}}],
                                   "ports": [{"name": "grpc", "containerPort": EPP_GRPC_PORT},
                                             {"name": "grpc-health",
                                              "containerPort": EPP_HEALTH_PORT}],
                                   "livenessProbe": {**probe, "initialDelaySeconds": 5,
                                                     "periodSeconds": 10},
                                   "readinessProbe": {**probe, "periodSeconds": 2},
                                   "resources": picker_resources(g),
                                   "volumeMounts": [{"name": "config",
                                                     "mountPath": EPP_CONFIG_DIR,
                                                     "readOnly": True}],
                                   "securityContext": hardened()}],
                               "volumes": [{"name": "config",
                                            "configMap": {"name": name}}]}}}})


def picker_resources(g: InferenceGatewayConfig) -> dict:
    """`inferenceGateway.picker`, upstream's chart's by default (v1.5.0 inferencepool
    values.yaml: 4 CPU, 8Gi, limit 16Gi): its prefix index is its memory, its per-request
    scoring its CPU; the memory limit twice the request, as upstream's."""
    return {"requests": {"cpu": str(g.picker_cpu), "memory": f"{g.picker_memory_gib}Gi"},
            "limits": {"memory": f"{2 * g.picker_memory_gib}Gi"}}


def hash_text(text: str) -> str:
    """Rolls the picker when its config changes (a ConfigMap edit alone would not)."""
    return hashlib.sha256(text.encode()).hexdigest()[:16]
