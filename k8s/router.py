"""The router chart: one endpoint's router in front of its workers: sgl-project's sglang-router
for prefixaware (the measured winner, docs/benchmarks.md), vllm-project/router for the rest.
Both binaries are in the one router image (images/router).

Command and args are built here and nowhere else, so the loopback tests start the real binary
with exactly what the Deployment carries (discovery swapped for local URLs).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Sequence

from cdk8s import Chart
from constructs import Construct

from config.contracts import (
    KV_EVENTS_PORT, LONGEST_REQUEST_S, NODE_ROLE_LABEL, NODE_ROLE_SYSTEM, NODE_START_MINUTES,
    ROUTER_BACKEND_PORT, ROUTER_METRICS_PORT, ROUTER_PORT, ROUTER_STRATEGIES, WORKER_PORT,
)
from config.endpoint_spec import ROUTING_POLICIES, arg_value
from k8s.certificate import certificate_objects, secret_name
from k8s.flows import PROMETHEUS, Flow, Peer, load_balancer
from k8s.objects import (
    account_role, hardened, k8s_object, pdb, pod_security, selector_labels, standard_labels,
    zone_spread,
)
from k8s.router_front import (
    DEREGISTER_S, DRAIN_MOUNT, DRAIN_S, DRAIN_VOLUME, FRONT_CONFIG, front_config,
    front_config_hash, front_container, router_pre_stop, router_slots, termination_grace_s,
)
from k8s.secret_fetch import (
    API_KEY_DIGEST_FILE, API_KEY_FILE, API_KEY_VOLUMES, SECRETS_DIR, ApiKey,
    fetch_api_key_container,
)
from k8s.worker_reaper import (
    HEARTBEAT_VOLUME, REAPER_SCRIPT, agent_hash, agent_text, reaper_args, reaper_container,
)
from k8s.workers import MetricsSource

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
# Rollouts behind the NLB: the load balancer controller's readiness gate keeps an old pod until
# its successor is a healthy target (namespace label, k8s/serving.py); on termination the front
# keeps serving while the NLB stops sending it new connections, then drains what it holds, up
# to the longest request (k8s/router_front.py); the router behind it stops only after the front.
# The NLB itself keeps a deregistering target's connections for the target group's
# deregistration delay (default 300 s): set to the whole drain, so it never cuts one first.
POD_READINESS_GATE_LABEL = "elbv2.k8s.aws/pod-readiness-gate-inject"


def deregistration_delay_s(deregister_s: int = DEREGISTER_S) -> int:
    return deregister_s + DRAIN_S


# TLS 1.3/1.2 only (the controller's default policy still offers TLS 1.0).
TLS_POLICY = "ELBSecurityPolicy-TLS13-1-2-2021-06"
_LB = "service.beta.kubernetes.io/aws-load-balancer-"


def router_command(implementation: str, api_key: bool, pd: bool = False) -> list[str]:
    """The container command: the implementation's binary. Both routers take the key only as
    an argument, so it is appended at exec time from the fetched file, never in the manifest.
    With it, vllm-router 0.1.17 sends it on its own render/tokenize calls and passes the
    client's Authorization through (vLLM checks it); sglang-router 0.3.2 also checks the
    client's key itself, then sends its own to the worker (both measured on loopback).
    vllm-router 0.1.17's P/D mode (`pd`) does neither: it sends `Authorization: Bearer
    $OPENAI_API_KEY`, from its own environment, to prefill and decode workers alike (an empty
    one without it, which vLLM refuses; measured, tests/e2e/test_pd.py), so the key goes there
    too."""
    if not api_key:
        return [implementation]
    export = f'OPENAI_API_KEY="$(cat {API_KEY_FILE})"; export OPENAI_API_KEY; ' if pd else ""
    return ["/bin/sh", "-c",
            f'{export}exec {implementation} "$@" --api-key "$(cat {API_KEY_FILE})"',
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
    # what the workers' /v1/models lists (k8s.workers.served_model_names)
    served_models: tuple[str, ...] = ()
    cpu: str = "1"
    memory: str = "1Gi"
    # What bounds the router's memory (router_limits): the model's context (vLLM's
    # --max-model-len) and the most workers it can route to (the autoscaling maximum).
    context_tokens: int = 131072
    max_workers: int = 2
    api_key: ApiKey | None = None
    tls_certificate_arn: str | None = None       # ACM: the NLB listener terminates TLS
    # No ACM certificate: the front serves HTTPS with one made in the cluster (k8s/certificate.py)
    generated_tls: bool = False
    tls_names: tuple[str, ...] = ()              # what the certificate names (dns_names)
    certificate_s3_uri: str | None = None        # tlsConfig.tlsCertificateOutputS3Uri
    aws_cli_image: str | None = None             # writes the certificate to S3
    region: str = ""
    source_ranges: tuple[str, ...] = ()          # client CIDRs the NLB accepts
    load_balancer_subnets: str | None = None     # comma-separated ids of the NLB's subnets
    # The NLB's own addresses (its subnets' ranges, or its /32s in a private-only VPC:
    # config/network.py router_load_balancer_cidrs): the only sources the NetworkPolicy admits
    # to the client port, and the only ones the front takes (and requires) the NLB's PROXY
    # protocol header from. Required by the chart.
    load_balancer_cidrs: tuple[str, ...] = ()
    # the front's wait for its NLB to stop sending (listener.deregistrationWaitSeconds)
    deregister_s: int = DEREGISTER_S
    # worker.requestLimits.overflowStatusCode: what the front answers for a full worker, and
    # a client address's share of the slots (router_front.fair_share)
    overflow_status: int | None = None
    per_source_requests: int | None = None
    # A private-only VPC: the internal NLB's fixed addresses, one per subnet, and the VPC's
    # range, which its security group admits when the listener names no sourceRanges.
    load_balancer_addresses: tuple[str, ...] = ()
    vpc_cidr: str | None = None
    # "vllm-router" (vllm-project/router) or "sglang-router" (sgl-project's Rust router): its
    # cache_aware keeps the prefix tree in the router and calls no worker per request. The
    # environment decides (EnvironmentConfig.router_implementation).
    implementation: str = "vllm-router"
    pd: PDRouting | None = None       # a disaggregated endpoint: vllm-router's P/D mode


@dataclass(frozen=True)
class PDRouting:
    """vllm-router's P/D mode for one endpoint (k8s/pd.py): the selectors of its prefill and
    decode pods and, for pdSpec.routingThreshold, the body size below which the front sends a
    request to a second, decode-only router (None: every request is disaggregated)."""

    prefill_selector: dict[str, str]
    decode_selector: dict[str, str]
    short_body_bytes: int | None = None
    decode_policy: str = "power_of_two"


# vllm-router 0.1.17 in P/D mode sends a request to a prefill worker (max_tokens 1, no stream,
# kv_transfer_params do_remote_decode) and then to a decode worker with what the prefill
# returned (NixlConnector's protocol, `--kv-connector nixl`, its default); prefill by the
# endpoint's policy (where the prefix lives), decode by load: power_of_two, which vllm-router
# refuses to start with fewer than 2 decode workers listed (measured with static --decode URLs),
# so round_robin where the decode role never has 2 (decode_policy).
PD_DECODE_POLICY = "power_of_two"


def decode_policy(max_decode_workers: int) -> str:
    return PD_DECODE_POLICY if max_decode_workers >= 2 else "round_robin"
DECODE_ROUTER_PORT = ROUTER_BACKEND_PORT + 1          # the decode-only router, 127.0.0.1
DECODE_ROUTER_METRICS_PORT = ROUTER_METRICS_PORT + 1


ROUTER_IMPLEMENTATIONS = tuple(ROUTER_STRATEGIES)
# The router policies of the strategies sglang-router offers (contracts.ROUTER_STRATEGIES)
SGLANG_POLICIES = tuple(ROUTING_POLICIES[s] for s in ROUTER_STRATEGIES["sglang-router"])


def router_name(endpoint: str) -> str:
    """The router's Deployment, Service and service account (Pod Identity binds the last)."""
    return f"{endpoint}-router"


def router_args(p: RouterProps) -> list[str]:
    if p.pd is not None:
        return pd_router_args(p)
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


def _discovery_swapped(args: list[str], selectors: list[str]) -> list[str]:
    """`_common_args` with its `--selector k=v ...` replaced by `selectors`."""
    i, j = args.index("--selector"), args.index("--service-discovery-namespace")
    return [*args[:i], *selectors, *args[j:]]


def pd_router_args(p: RouterProps) -> list[str]:
    """vllm-router's P/D mode: prefill and decode pods found by their role labels."""
    if p.implementation != "vllm-router" or p.static_workers or p.kv_event_sources:
        raise ValueError("P/D routing is vllm-router's, with service discovery")
    pick = lambda sel: [f"{k}={v}" for k, v in sorted(sel.items())]  # noqa: E731
    return ["--vllm-pd-disaggregation", "--kv-connector", "nixl",
            *_discovery_swapped(_common_args(p), [
                "--prefill-selector", *pick(p.pd.prefill_selector),
                "--decode-selector", *pick(p.pd.decode_selector)]),
            "--decode-policy", p.pd.decode_policy]


def decode_router_args(p: RouterProps) -> list[str]:
    """The decode-only router (pdSpec.routingThreshold): the same vllm-router, plain mode, on
    the decode pods alone, on its own ports. A decode worker given no kv_transfer_params
    prefills the prompt itself (chunked prefill), as HyperPod's decoder does below the
    threshold."""
    args = _common_args(replace(p, pd=None, worker_selector=p.pd.decode_selector))
    swap = {"--port": str(DECODE_ROUTER_PORT),
            "--prometheus-port": str(DECODE_ROUTER_METRICS_PORT)}
    return [swap.get(prev, a) if prev in swap else a
            for prev, a in zip([None, *args], args)]


def sglang_router_args(p: RouterProps) -> list[str]:
    """sglang-router 0.3.2 takes the same flags for what both routers do; it has no KV event
    index (kvaware) and no session-key hashing (session)."""
    if p.policy not in SGLANG_POLICIES or p.kv_event_sources:
        raise ValueError(f"sglang-router has no policy {p.policy!r}"
                         f"{' with KV events' if p.kv_event_sources else ''}; it offers "
                         f"{', '.join(SGLANG_POLICIES)}")
    return ["launch", *_common_args(p)]


# Router-side bounds, chosen and measured on loopback (docs/serving.md, "Router limits").
REQUEST_TIMEOUT_S = LONGEST_REQUEST_S   # the longest generation we let one request take
# A hung worker (its /health times out) is out after 2 checks 1 s apart: ~2-3 s.
HEALTH_INTERVAL_S, HEALTH_TIMEOUT_S, HEALTH_FAILURES = 1, 1, 2
# cache_aware stops sending to a worker once it holds this many more requests than the
# least-loaded one (the default, 64, let a hung worker collect 64 requests in 7 s).
BALANCE_ABS_THRESHOLD = 8
# Attempts per request (the first included) and the wait before the second: a worker that
# died is out of the router ~1.8-2.0 s after its death (the health checks above), so the second
# attempt goes to a live one; a client whose input makes a worker fail (a 500) costs the
# workers two calls, not eight (sglang-router and vllm-router both retry a 500).
RETRY_ATTEMPTS, RETRY_BACKOFF_MS = 2, 2500
EVICTION_INTERVAL_S = 10     # how long the prefix tree may outgrow its bound
TREE_MEMORY_SHARE = 0.5      # of the container's memory limit, for cache_aware's prefix tree
# Memory per tree character, the worst measured (sglang-router 0.3.2, 300-character distinct
# prompts: ~16 B; long prompts ~2 B); vllm-router 0.1.17 ~14 B per token
TREE_BYTES_PER_CHAR = 16
# Request body per context token: ~4 characters of text per token, JSON escaping of non-ASCII
# text up to 6 bytes per character; plus the request's envelope (parameters, tools).
BODY_BYTES_PER_TOKEN, BODY_ENVELOPE_BYTES = 16, 64 * 1024
# No line per request, warnings and errors kept. sglang-router takes `--log-level warn`;
# vllm-router 0.1.17's launcher offers `warning`, which its Rust side does not parse (it
# logs at INFO, the session strategy's routing key three times per request), and its
# tracing filter reads RUST_LOG before any flag (src/logging.rs, EnvFilter::try_from_default_env).
SGLANG_LOG_LEVEL = "warn"
VLLM_ROUTER_LOG_ENV = {"RUST_LOG": "warn"}
# The NLB's TCP idle timeout (default 350 s): above the front's server timeout, so the router's
# request timeout is what ends a quiet request (k8s/router_front.py)
NLB_IDLE_TIMEOUT_S = REQUEST_TIMEOUT_S + 60


def memory_bytes(quantity: str) -> int:
    """A Kubernetes memory quantity with a binary suffix (the router's own, e.g. `1Gi`)."""
    units = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30}
    number, unit = quantity[:-2], quantity[-2:]
    if unit not in units or not number.isdigit():
        raise ValueError(f"router memory {quantity!r}: an integer with Ki, Mi or Gi")
    return int(number) * units[unit]


def context_tokens(worker_args: Sequence[str]) -> dict[str, int]:
    """``{"context_tokens": N}`` from vLLM's ``--max-model-len`` (``32768``, or its
    human-readable ``32k`` = 32,000 / ``32K`` = 32,768), or nothing: the model's own length,
    unknown at synth, gets RouterProps' default (128K, Llama 3.1's)."""
    value = arg_value(worker_args, "--max-model-len") or ""
    scale = {"k": 1000, "K": 1024, "m": 10**6, "M": 2**20}.get(value[-1:], 1)
    number = value[:-1] if scale > 1 else value
    try:
        return {"context_tokens": int(float(number) * scale)} if number else {}
    except ValueError:
        return {}


def router_limits(p: RouterProps) -> dict[str, int]:
    """Sizes derived from the container and the model: the largest request body a context
    of `context_tokens` can need (a 200 MB body was accepted by default), and the per-worker
    prefix-tree budget that keeps the tree of every worker within its memory share."""
    tree = memory_bytes(p.memory) * TREE_MEMORY_SHARE / TREE_BYTES_PER_CHAR / p.max_workers
    return {"max_payload_size": p.context_tokens * BODY_BYTES_PER_TOKEN + BODY_ENVELOPE_BYTES,
            "max_tree_size": int(tree)}


def _common_args(p: RouterProps) -> list[str]:
    limits = router_limits(p)
    # Only the front (k8s.router_front) reaches the router: it keeps the control routes out.
    args = ["--host", "127.0.0.1", "--port", str(ROUTER_BACKEND_PORT), "--policy", p.policy,
            "--prometheus-host", "0.0.0.0", "--prometheus-port", str(ROUTER_METRICS_PORT),
            "--health-check-endpoint", p.health_check_path,
            "--health-check-interval-secs", str(HEALTH_INTERVAL_S),
            "--health-check-timeout-secs", str(HEALTH_TIMEOUT_S),
            "--health-failure-threshold", str(HEALTH_FAILURES),
            "--request-timeout-secs", str(REQUEST_TIMEOUT_S),
            # The second attempt comes after the health checks took a dead worker out, so it
            # goes to a live one (sglang-router's cache_aware would pick the same worker
            # while it is still listed); see RETRY_ATTEMPTS.
            "--retry-max-retries", str(RETRY_ATTEMPTS),
            "--retry-initial-backoff-ms", str(RETRY_BACKOFF_MS),
            "--retry-max-backoff-ms", str(RETRY_BACKOFF_MS), "--retry-jitter-factor", "0",
            "--max-payload-size", str(limits["max_payload_size"]),
            # A breaker counts what clients provoke: sglang-router 0.3.2 a client's 4xx (24
            # wrong-model requests failed 145 of the next 200 good ones), vllm-router 0.1.17 a
            # worker's 500 (6 inputs a worker fails on opened it for everyone: 3 of the next
            # 20 good chats got 503). The health checks above take a dead or hung worker out.
            "--disable-circuit-breaker"]
    if p.implementation == "sglang-router":
        args += ["--log-level", SGLANG_LOG_LEVEL]
    if p.policy == "cache_aware":
        args += ["--balance-abs-threshold", str(BALANCE_ABS_THRESHOLD),
                 "--max-tree-size", str(limits["max_tree_size"]),
                 "--eviction-interval-secs", str(EVICTION_INTERVAL_S)]
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
        self.flows = (Flow(load_balancer(props.load_balancer_cidrs), router, ROUTER_PORT,
                           "clients, through the NLB"),
                      Flow(PROMETHEUS, router, ROUTER_METRICS_PORT, "router metrics"),
                      Flow(router, workers, props.worker_port, "requests, health, render/tokenize"))
        if props.kv_event_sources:
            self.flows += (Flow(router, workers, KV_EVENTS_PORT, "KV events (ZMQ SUB)"),)
        k8s_object(self, "ServiceAccount", api_version="v1", kind="ServiceAccount", name=name,
                   namespace=ns, labels=labels, body={"automountServiceAccountToken": discovery})
        if discovery:  # least privilege: read pods in this namespace, nothing else
            account_role(self, "", name=name, namespace=ns, labels=labels, rules=[{
                "apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}])
        key_pod, key_container = {}, {}
        if props.api_key:
            key_pod = {"initContainers": [fetch_api_key_container(
                props.api_key, 65532, bearer_digest=True)], "volumes": API_KEY_VOLUMES}
            key_container = {"volumeMounts": [
                {"name": "api-key", "mountPath": SECRETS_DIR, "readOnly": True}]}
        key_container["volumeMounts"] = [*key_container.get("volumeMounts", []), DRAIN_MOUNT]
        # The front's config, and the front beside the router (k8s.router_front)
        if not props.load_balancer_cidrs:
            raise ValueError(f"router {name}: load_balancer_cidrs (the NLB's addresses) are "
                             "required: the front expects the NLB's PROXY header from them")
        max_body = router_limits(props)["max_payload_size"]
        front_text = front_config(REQUEST_TIMEOUT_S, max_body,
                                  router_slots(memory_bytes(props.memory), max_body),
                                  key_check=props.api_key is not None,
                                  models=front_models(props),
                                  short_body_bytes=(props.pd.short_body_bytes
                                                    if props.pd else None),
                                  overflow_status=props.overflow_status,
                                  per_source_requests=props.per_source_requests)
        k8s_object(self, "FrontConfig", api_version="v1", kind="ConfigMap", name=f"{name}-front",
                   namespace=ns, labels=labels, body={"data": {FRONT_CONFIG: front_text}})
        front_volume = {"name": "front-config", "configMap": {"name": f"{name}-front"}}
        key_pod["volumes"] = [*key_pod.get("volumes", []), front_volume, DRAIN_VOLUME]
        sidecars, annotations = reaper_parts(self, props, name, labels, key_pod,
                                             key_container)
        tls_volume = None
        if props.generated_tls:
            certificate_objects(self, router=name, endpoint=props.endpoint, namespace=ns,
                                labels=labels, image=props.image,
                                aws_cli_image=props.aws_cli_image or props.image,
                                region=props.region, names=props.tls_names,
                                s3_uri=props.certificate_s3_uri)
            tls_volume = "front-tls"
            # the pod waits for the Job's key (kubelet retries the mount until it is there)
            key_pod["volumes"].append({"name": tls_volume, "secret": {
                "secretName": secret_name(name), "defaultMode": 0o440,   # group: the fsGroup
                "items": [{"key": "front.pem", "path": "front.pem"}]}})
        # Probes reach the router through the front (the router listens on 127.0.0.1 only).
        probe = {"httpGet": {"path": "/health", "port": ROUTER_PORT,
                             **({"scheme": "HTTPS"} if props.generated_tls else {})},
                 "periodSeconds": PROBE_PERIOD_S,
                 "timeoutSeconds": 3}
        k8s_object(self, "Deployment", api_version="apps/v1", kind="Deployment", name=name,
                   namespace=ns, labels=labels, body={"spec": {
                       "replicas": props.replicas,
                       "selector": {"matchLabels": sel},
                       "strategy": {"type": "RollingUpdate",
                                    "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}},
                       "template": {
                           "metadata": {"labels": labels, "annotations": {
                               "kvcache.io/front-config": front_config_hash(front_text),
                               **annotations}},
                           "spec": {
                               "serviceAccountName": name,
                               "automountServiceAccountToken": discovery,
                               "nodeSelector": {NODE_ROLE_LABEL: NODE_ROLE_SYSTEM},
                               "topologySpreadConstraints": zone_spread(sel),
                               "securityContext": pod_security(),
                               "terminationGracePeriodSeconds": termination_grace_s(
                                   props.deregister_s),
                               **key_pod,
                               "containers": [{
                                   "name": "router", "image": props.image,
                                   "imagePullPolicy": "IfNotPresent",
                                   "command": router_command(props.implementation,
                                                             props.api_key is not None,
                                                             props.pd is not None),
                                   **key_container,
                                   **router_env(props.implementation),
                                   "args": router_args(props),
                                   "ports": [{"name": "metrics",
                                              "containerPort": ROUTER_METRICS_PORT}],
                                   "startupProbe": {**probe, "httpGet": {
                                       **probe["httpGet"], "path": "/liveness"},
                                       "failureThreshold": STARTUP_PROBE_FAILURES},
                                   "readinessProbe": {**probe, "httpGet": {
                                       **probe["httpGet"], "path": "/readiness"}},
                                   "livenessProbe": {**probe, "httpGet": {
                                       **probe["httpGet"], "path": "/liveness"},
                                       "failureThreshold": 6},
                                   "resources": {
                                       "requests": {"cpu": props.cpu, "memory": props.memory},
                                       "limits": {"cpu": props.cpu, "memory": props.memory}},
                                   "lifecycle": {"preStop": {"exec": {
                                       "command": router_pre_stop(props.deregister_s)}}},
                                   "securityContext": hardened(),
                               }, *decode_router_container(props, key_container),
                               front_container(
                                   props.image, front_volume["name"], props.load_balancer_cidrs,
                                   API_KEY_DIGEST_FILE if props.api_key else None, "api-key",
                                   decode_router=decode_router(props), tls_volume=tls_volume,
                                   deregister_s=props.deregister_s),
                                   *sidecars],
                           }}}})
        pdb(self, name=name, namespace=ns, labels=labels, selector=sel)
        if props.metrics is not None:
            self._scaled_object(name, labels, props)
        scheme = "internet-facing" if props.public_listener else "internal"
        annotations = {}
        target_group = ["deregistration_delay.timeout_seconds="
                        f"{deregistration_delay_s(props.deregister_s)}"]
        if props.policy in ("cache_aware", "kv_aware"):
            # cache_aware replicas learn prefixes only from the requests they see, so two
            # replicas disagree about a conversation; a kv_aware replica that starts late
            # (HPA, rollout) has an empty index. Both measured on loopback: keep a client on
            # one replica. session hashes the same key to the same worker on every replica.
            target_group += ["stickiness.enabled=true", "stickiness.type=source_ip"]
        annotations["service.beta.kubernetes.io/aws-load-balancer-target-group-attributes"] = (
            ",".join(target_group))
        # Proxy protocol v2: the front sees (and limits, and logs) the real client address
        # (the NLB's targets are pod IPs, where it would otherwise see the NLB's own).
        annotations[f"{_LB}proxy-protocol"] = "*"
        if props.tls_certificate_arn:
            annotations.update({f"{_LB}ssl-cert": props.tls_certificate_arn,
                                f"{_LB}ssl-ports": str(ROUTER_PORT),
                                f"{_LB}ssl-negotiation-policy": TLS_POLICY})
        else:
            # a TLS listener's idle timeout is fixed at 350 s (AWS); the front's TCP keepalives
            # keep its quiet connections open there
            annotations[f"{_LB}listener-attributes.TCP-{ROUTER_PORT}"] = (
                f"tcp.idle_timeout.seconds={NLB_IDLE_TIMEOUT_S}")
        if props.load_balancer_subnets:
            # internal or not, the NLB's nodes live in these subnets (load_balancer_cidrs)
            annotations[f"{_LB}subnets"] = props.load_balancer_subnets
        source_ranges = props.source_ranges
        if props.load_balancer_addresses:
            # private-only: in the node subnets, at addresses no pod can hold once it exists
            if props.public_listener:
                raise ValueError(f"router {name}: fixed private addresses are for an internal "
                                 "load balancer only")
            annotations[f"{_LB}private-ipv4-addresses"] = ",".join(
                props.load_balancer_addresses)
            # its security group says whom it admits (the controller's own default for an
            # internal NLB varies by release): the listener's clients, else the VPC
            source_ranges = source_ranges or ((props.vpc_cidr,) if props.vpc_cidr else ())
        lb_spec = ({"loadBalancerSourceRanges": list(source_ranges)} if source_ranges else {})
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
                           "HTTPS" if props.generated_tls else "HTTP",
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


def reaper_parts(chart: Chart, p: RouterProps, name: str, labels: dict, key_pod: dict,
                 key_container: dict) -> tuple[list[dict], dict[str, str]]:
    """sglang-router with Kubernetes discovery gets the worker reaper (k8s/worker_reaper.py):
    its ConfigMap here, its volume added to ``key_pod``'s; (its container, its pod annotation),
    or nothing for a router that needs none (vllm-router 0.1.17 keys its discovered pods by
    name, static workers have no discovery)."""
    if p.implementation != "sglang-router" or p.static_workers:
        return [], {}
    k8s_object(chart, "WorkerReaper", api_version="v1", kind="ConfigMap",
               name=f"{name}-reaper", namespace=p.namespace, labels=labels,
               body={"data": {REAPER_SCRIPT: agent_text()}})
    key_pod["volumes"] += [{"name": "worker-reaper", "configMap": {"name": f"{name}-reaper"}},
                           HEARTBEAT_VOLUME]
    mounts = key_container.get("volumeMounts") or [None]
    args = reaper_args(p.namespace, p.worker_selector, p.worker_port,
                       API_KEY_FILE if p.api_key else None)
    return ([reaper_container(p.image, "worker-reaper", args, mounts[0])],
            {"kvcache.io/worker-reaper": agent_hash()})


def front_models(p: RouterProps) -> tuple[str, ...]:
    """The model names the front lists on `GET /v1/models` itself: sglang-router 0.3.2 lists
    `unknown` for workers it did not learn a model from (every vLLM worker; models_answer in
    k8s/router_front.py), vllm-router 0.1.17 passes a worker's own list on."""
    if p.implementation != "sglang-router":
        return ()
    return p.served_models or ((p.model_name,) if p.model_name else ())


def decode_router(p: RouterProps) -> str | None:
    """Where the front reaches the decode-only router, where the endpoint has one."""
    if p.pd is None or p.pd.short_body_bytes is None:
        return None
    return f"127.0.0.1:{DECODE_ROUTER_PORT}"


def decode_router_container(p: RouterProps, key_container: dict) -> list[dict]:
    """The decode-only router beside the P/D one (decode_router_args); its health is the
    process's own: it exits when it cannot serve, and the kubelet restarts it."""
    if decode_router(p) is None:
        return []
    return [{"name": "router-decode", "image": p.image, "imagePullPolicy": "IfNotPresent",
             "command": router_command(p.implementation, p.api_key is not None),
             **key_container, **router_env(p.implementation),
             "args": decode_router_args(p),
             # it listens on 127.0.0.1 only (the front reaches it), where the kubelet's HTTP
             # probes cannot: the router image's python asks it from inside the container
             "readinessProbe": _local_probe(DECODE_ROUTER_PORT, "/readiness"),
             "livenessProbe": {**_local_probe(DECODE_ROUTER_PORT, "/liveness"),
                               "failureThreshold": 6},
             "resources": {"requests": {"cpu": p.cpu, "memory": p.memory},
                           "limits": {"cpu": p.cpu, "memory": p.memory}},
             "lifecycle": {"preStop": {"exec": {"command": router_pre_stop(p.deregister_s)}}},
             "securityContext": hardened()}]


def _local_probe(port: int, path: str) -> dict:
    return {"exec": {"command": [
        "python3", "-c", "import urllib.request; urllib.request.urlopen("
        f"'http://127.0.0.1:{port}{path}', timeout=3)"]},
        "periodSeconds": PROBE_PERIOD_S, "timeoutSeconds": 5}


def router_env(implementation: str) -> dict:
    """The router container's environment: vllm-router's log filter (see VLLM_ROUTER_LOG_ENV)."""
    if implementation != "vllm-router":
        return {}
    return {"env": [{"name": k, "value": v} for k, v in VLLM_ROUTER_LOG_ENV.items()]}


def quantity_cores(cpu: str) -> float:
    return float(cpu[:-1]) / 1000 if cpu.endswith("m") else float(cpu)
