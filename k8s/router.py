"""The router chart: one endpoint's router in front of its workers: sgl-project's sglang-router
for prefixaware (the measured winner, docs/benchmarks.md), vllm-project/router for the rest.
Both binaries are in the one router image (images/router).

Command and args are built here and nowhere else, so the loopback tests start the real binary
with exactly what the Deployment carries (discovery swapped for local URLs).
"""
from __future__ import annotations

from dataclasses import dataclass

from cdk8s import Chart
from constructs import Construct

from config.contracts import (
    KV_EVENTS_PORT, NODE_ROLE_LABEL, NODE_ROLE_SYSTEM, NODE_START_MINUTES, ROUTER_METRICS_PORT,
    ROUTER_PORT, ROUTER_STRATEGIES, WORKER_PORT,
)
from k8s.endpoint_spec import ROUTING_POLICIES
from k8s.flows import LOAD_BALANCER, PROMETHEUS, Flow, Peer
from k8s.objects import (
    hardened, k8s_object, pdb, pod_security, selector_labels, standard_labels, zone_spread,
)
from k8s.workers import MetricsSource
from k8s.secret_fetch import (
    API_KEY_FILE, API_KEY_VOLUMES, SECRETS_DIR, ApiKey, fetch_api_key_container,
)

COMPONENT = "vllm-router"
# vllm-router 0.1.17 with static --worker-urls (kvaware) listens only once one listed worker
# answers its health check, probing every --worker-startup-check-interval (default 30 s), and
# exits 1 when none has after --worker-startup-timeout-secs (default 600 s); measured with the
# pinned binary on loopback (tests/e2e/test_router_startup.py, docs/runbook.md). It waits as
# long as a worker may take to start: a node (NODE_START_MINUTES) and the workers' own
# startupProbe window (k8s/workers.py: 180 x 10 s), checking every 5 s.
WORKER_STARTUP_WINDOW_S = 1800
WORKER_STARTUP_TIMEOUT_S = NODE_START_MINUTES * 60 + WORKER_STARTUP_WINDOW_S
WORKER_STARTUP_CHECK_S = 5
# The startupProbe outlasts that wait, so the router's own exit says why, not a kill by the
# kubelet; routers with service discovery listen at once and pass it on the first probe.
PROBE_PERIOD_S = 10
STARTUP_PROBE_FAILURES = -(-(WORKER_STARTUP_TIMEOUT_S + WORKER_STARTUP_CHECK_S) // PROBE_PERIOD_S) + 1
# Rollouts drop nothing behind the NLB: the load balancer controller's readiness gate keeps an
# old pod until its successor is a healthy target (namespace label, k8s/serving.py); on
# termination the pod keeps serving while the NLB stops sending it new connections, then gets
# SIGTERM and finishes what it has.
POD_READINESS_GATE_LABEL = "elbv2.k8s.aws/pod-readiness-gate-inject"
PRE_STOP_SLEEP_S = 30
TERMINATION_GRACE_S = PRE_STOP_SLEEP_S + 90
# TLS 1.3/1.2 only (the controller's default policy still offers TLS 1.0).
TLS_POLICY = "ELBSecurityPolicy-TLS13-1-2-2021-06"
_LB = "service.beta.kubernetes.io/aws-load-balancer-"


def router_command(implementation: str, api_key: bool) -> list[str]:
    """The container command: the implementation's binary. Both routers take the key only as
    an argument, so it is appended at exec time from the fetched file, never in the manifest.
    With it, vllm-router 0.1.17 sends it on its own render/tokenize calls and passes the
    client's Authorization through (vLLM checks it); sglang-router 0.3.2 also checks the
    client's key itself, then sends its own to the worker (both measured on loopback)."""
    if not api_key:
        return [implementation]
    return ["/bin/sh", "-c", f'exec {implementation} "$@" --api-key "$(cat {API_KEY_FILE})"',
            implementation]


@dataclass(frozen=True)
class RouterProps:
    endpoint: str
    namespace: str
    image: str
    policy: str                                  # vllm-router --policy
    worker_selector: dict[str, str]              # labels of this endpoint's worker pods
    worker_port: int = WORKER_PORT               # where the workers' vLLM listens
    health_check_path: str = "/health"
    replicas: int = 2
    max_replicas: int = 6             # KEDA on the router's own CPU (RouterScaling)
    cpu_target_percent: int = 70
    metrics: MetricsSource | None = None   # where KEDA reads it; None: a fixed replica count
    public_listener: bool = False
    # kv_aware: static worker URLs and their ZMQ event endpoints (discovery cannot carry them)
    static_workers: tuple[str, ...] = ()
    kv_event_sources: tuple[tuple[str, str], ...] = ()
    kv_event_block_size: int = 16
    model_name: str = ""
    cpu: str = "1"
    memory: str = "1Gi"
    api_key: ApiKey | None = None
    tls_certificate_arn: str | None = None       # ACM: the NLB listener terminates TLS
    source_ranges: tuple[str, ...] = ()          # client CIDRs the NLB accepts
    load_balancer_subnets: str | None = None     # comma-separated ids: the public subnets
    # "vllm-router" (vllm-project/router) or "sglang-router" (sgl-project's Rust router): its
    # cache_aware keeps the prefix tree in the router and calls no worker per request. The
    # environment decides (EnvironmentConfig.router_implementation).
    implementation: str = "vllm-router"


ROUTER_IMPLEMENTATIONS = tuple(ROUTER_STRATEGIES)
# The router policies of the strategies sglang-router offers (contracts.ROUTER_STRATEGIES)
SGLANG_POLICIES = tuple(ROUTING_POLICIES[s] for s in ROUTER_STRATEGIES["sglang-router"])


def router_name(endpoint: str) -> str:
    """The router's Deployment, Service and service account (Pod Identity binds the last)."""
    return f"{endpoint}-router"


def router_args(p: RouterProps) -> list[str]:
    if p.implementation == "sglang-router":
        return sglang_router_args(p)
    if p.implementation != "vllm-router":
        raise ValueError(f"router implementation {p.implementation!r}: one of "
                         f"{', '.join(ROUTER_IMPLEMENTATIONS)}")
    args = _common_args(p)
    for worker, endpoint in p.kv_event_sources:
        args += ["--kv-event-source", f"{worker}={endpoint}"]
    if p.kv_event_sources:
        args += ["--kv-event-block-size", str(p.kv_event_block_size),
                 "--kv-event-model", p.model_name]
    return args


def sglang_router_args(p: RouterProps) -> list[str]:
    """sglang-router 0.3.2 takes the same flags for what both routers do; it has no KV event
    index (kvaware) and no session-key hashing (session)."""
    if p.policy not in SGLANG_POLICIES or p.kv_event_sources:
        raise ValueError(f"sglang-router has no policy {p.policy!r}"
                         f"{' with KV events' if p.kv_event_sources else ''}; it offers "
                         f"{', '.join(SGLANG_POLICIES)}")
    return ["launch", *_common_args(p)]


def _common_args(p: RouterProps) -> list[str]:
    args = ["--host", "0.0.0.0", "--port", str(ROUTER_PORT), "--policy", p.policy,
            "--prometheus-host", "0.0.0.0", "--prometheus-port", str(ROUTER_METRICS_PORT),
            "--health-check-endpoint", p.health_check_path,
            "--health-check-interval-secs", "10", "--health-failure-threshold", "2",
            # Open the circuit after 3 consecutive failures, below the 5 attempts a request
            # may make, so a dead worker stops drawing retries before a client sees a 500
            # (measured on loopback); retry it after 15 s, not the default 60.
            "--cb-failure-threshold", "3", "--cb-timeout-duration-secs", "15",
            "--log-level", "info"]
    if p.static_workers:
        args += ["--worker-startup-timeout-secs", str(WORKER_STARTUP_TIMEOUT_S),
                 "--worker-startup-check-interval", str(WORKER_STARTUP_CHECK_S),
                 "--worker-urls", *p.static_workers]
    else:
        args += ["--service-discovery", "--selector",
                 *[f"{k}={v}" for k, v in sorted(p.worker_selector.items())],
                 "--service-discovery-namespace", p.namespace,
                 "--service-discovery-port", str(p.worker_port)]
    return args


class RouterChart(Chart):
    def __init__(self, scope: Construct, id: str, *, props: RouterProps) -> None:
        super().__init__(scope, id, namespace=props.namespace)
        name = router_name(props.endpoint)
        sel = selector_labels(COMPONENT, props.endpoint)
        labels = standard_labels(COMPONENT, props.endpoint)
        ns = props.namespace
        discovery = not props.static_workers
        router = Peer(name, ns, sel)
        workers = Peer(f"{props.endpoint}-workers", ns, dict(props.worker_selector))
        self.flows = (Flow(LOAD_BALANCER, router, ROUTER_PORT, "clients, through the NLB"),
                      Flow(PROMETHEUS, router, ROUTER_METRICS_PORT, "router metrics"),
                      Flow(router, workers, props.worker_port, "requests, health, render/tokenize"))
        if props.kv_event_sources:
            self.flows += (Flow(router, workers, KV_EVENTS_PORT, "KV events (ZMQ SUB)"),)
        k8s_object(self, "ServiceAccount", api_version="v1", kind="ServiceAccount", name=name,
                   namespace=ns, labels=labels, body={"automountServiceAccountToken": discovery})
        if discovery:  # least privilege: read pods in this namespace, nothing else
            k8s_object(self, "Role", api_version="rbac.authorization.k8s.io/v1", kind="Role",
                       name=name, namespace=ns, labels=labels, body={"rules": [{
                           "apiGroups": [""], "resources": ["pods"],
                           "verbs": ["get", "list", "watch"]}]})
            k8s_object(self, "RoleBinding", api_version="rbac.authorization.k8s.io/v1",
                       kind="RoleBinding", name=name, namespace=ns, labels=labels, body={
                           "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                       "name": name},
                           "subjects": [{"kind": "ServiceAccount", "name": name,
                                         "namespace": ns}]})
        key_pod, key_container = {}, {}
        if props.api_key:
            key_pod = {"initContainers": [fetch_api_key_container(props.api_key, 65532)],
                       "volumes": API_KEY_VOLUMES}
            key_container = {"volumeMounts": [
                {"name": "api-key", "mountPath": SECRETS_DIR, "readOnly": True}]}
        probe = {"httpGet": {"path": "/health", "port": "http"}, "periodSeconds": PROBE_PERIOD_S,
                 "timeoutSeconds": 3}
        k8s_object(self, "Deployment", api_version="apps/v1", kind="Deployment", name=name,
                   namespace=ns, labels=labels, body={"spec": {
                       "replicas": props.replicas,
                       "selector": {"matchLabels": sel},
                       "strategy": {"type": "RollingUpdate",
                                    "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}},
                       "template": {
                           "metadata": {"labels": labels},
                           "spec": {
                               "serviceAccountName": name,
                               "automountServiceAccountToken": discovery,
                               "nodeSelector": {NODE_ROLE_LABEL: NODE_ROLE_SYSTEM},
                               "topologySpreadConstraints": zone_spread(sel),
                               "securityContext": pod_security(),
                               "terminationGracePeriodSeconds": TERMINATION_GRACE_S,
                               **key_pod,
                               "containers": [{
                                   "name": "router", "image": props.image,
                                   "imagePullPolicy": "IfNotPresent",
                                   "command": router_command(props.implementation,
                                                             props.api_key is not None),
                                   **key_container,
                                   "args": router_args(props),
                                   "ports": [{"name": "http", "containerPort": ROUTER_PORT},
                                             {"name": "metrics",
                                              "containerPort": ROUTER_METRICS_PORT}],
                                   "startupProbe": {**probe, "httpGet": {
                                       "path": "/liveness", "port": "http"},
                                       "failureThreshold": STARTUP_PROBE_FAILURES},
                                   "readinessProbe": {**probe, "httpGet": {
                                       "path": "/readiness", "port": "http"}},
                                   "livenessProbe": {**probe, "httpGet": {
                                       "path": "/liveness", "port": "http"},
                                       "failureThreshold": 6},
                                   "resources": {
                                       "requests": {"cpu": props.cpu, "memory": props.memory},
                                       "limits": {"cpu": props.cpu, "memory": props.memory}},
                                   "lifecycle": {"preStop": {
                                       "sleep": {"seconds": PRE_STOP_SLEEP_S}}},
                                   "securityContext": hardened(),
                               }],
                           }}}})
        pdb(self, name=name, namespace=ns, labels=labels, selector=sel)
        if props.metrics is not None:
            self._scaled_object(name, labels, props)
        scheme = "internet-facing" if props.public_listener else "internal"
        annotations = {}
        if props.policy in ("cache_aware", "kv_aware"):
            # cache_aware replicas learn prefixes only from the requests they see, so two
            # replicas disagree about a conversation; a kv_aware replica that starts late
            # (HPA, rollout) has an empty index. Both measured on loopback: keep a client on
            # one replica. session hashes the same key to the same worker on every replica.
            annotations["service.beta.kubernetes.io/aws-load-balancer-target-group-attributes"] = (
                "stickiness.enabled=true,stickiness.type=source_ip")
        if props.tls_certificate_arn:
            annotations.update({f"{_LB}ssl-cert": props.tls_certificate_arn,
                                f"{_LB}ssl-ports": str(ROUTER_PORT),
                                f"{_LB}ssl-negotiation-policy": TLS_POLICY})
        if props.load_balancer_subnets:
            # internal or not, the NLB's nodes live in the public subnets (LOAD_BALANCER_CIDR)
            annotations[f"{_LB}subnets"] = props.load_balancer_subnets
        lb_spec = ({"loadBalancerSourceRanges": list(props.source_ranges)}
                   if props.source_ranges else {})
        k8s_object(self, "Service", api_version="v1", kind="Service", name=name, namespace=ns,
                   labels=labels, annotations={**annotations,
                       # AWS Load Balancer Controller: an NLB straight to pod IPs
                       "service.beta.kubernetes.io/aws-load-balancer-type": "external",
                       "service.beta.kubernetes.io/aws-load-balancer-nlb-target-type": "ip",
                       "service.beta.kubernetes.io/aws-load-balancer-scheme": scheme,
                       "service.beta.kubernetes.io/aws-load-balancer-healthcheck-path":
                           "/readiness",
                       "service.beta.kubernetes.io/aws-load-balancer-healthcheck-port":
                           str(ROUTER_PORT),
                       "service.beta.kubernetes.io/aws-load-balancer-healthcheck-protocol":
                           "HTTP",
                   }, body={"spec": {
                       "type": "LoadBalancer", "loadBalancerClass": "service.k8s.aws/nlb",
                       **lb_spec, "selector": sel,
                       "ports": [{"name": "http", "port": ROUTER_PORT, "targetPort": "http"}]}})
        k8s_object(self, "MetricsService", api_version="v1", kind="Service",
                   name=f"{name}-metrics", namespace=ns, labels=labels, body={"spec": {
                       "type": "ClusterIP", "selector": sel,
                       "ports": [{"name": "metrics", "port": ROUTER_METRICS_PORT,
                                  "targetPort": "metrics"}]}})

    def _scaled_object(self, name: str, labels: dict, p: RouterProps) -> None:
        """KEDA scales the router on its own CPU, read from the kubelet's cAdvisor metrics in
        the Prometheus/AMP the workers' scaling already queries: EKS installs no
        metrics-server, so a CPU HorizontalPodAutoscaler would read <unknown> and never act."""
        src, ns = p.metrics, p.namespace
        cores = quantity_cores(p.cpu) * p.cpu_target_percent / 100
        meta = {"serverAddress": src.server_address, "threshold": f"{cores:g}",
                "query": (f'sum(rate(container_cpu_usage_seconds_total{{namespace="{ns}",'
                          f'container="router",pod=~"{name}-[a-z0-9]+-[a-z0-9]+"}}[2m]))'),
                "ignoreNullValues": "true"}
        trigger = {"type": "prometheus", "name": "router-cpu", "metricType": "AverageValue",
                   "metadata": meta}
        if src.aws_region:   # AMP: SigV4 as the KEDA operator's Pod Identity
            auth = f"{name}-aws"
            k8s_object(self, "TriggerAuthentication", api_version="keda.sh/v1alpha1",
                       kind="TriggerAuthentication", name=auth, namespace=ns, labels=labels,
                       body={"spec": {"podIdentity": {"provider": "aws",
                                                      "identityOwner": "keda"}}})
            meta["awsRegion"] = src.aws_region
            trigger["authenticationRef"] = {"name": auth}
        k8s_object(self, "ScaledObject", api_version="keda.sh/v1alpha1", kind="ScaledObject",
                   name=name, namespace=ns, labels=labels, body={"spec": {
                       "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment",
                                          "name": name},
                       "minReplicaCount": p.replicas, "maxReplicaCount": p.max_replicas,
                       "advanced": {"horizontalPodAutoscalerConfig": {"behavior": {
                           "scaleDown": {"stabilizationWindowSeconds": 300}}}},
                       "triggers": [trigger]}})


def quantity_cores(cpu: str) -> float:
    return float(cpu[:-1]) / 1000 if cpu.endswith("m") else float(cpu)
