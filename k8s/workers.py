"""The workers chart: vLLM + LMCache pods for one endpoint, on the GPU node group.

Weights are staged from the model bucket by an init container (Pod Identity, read-only to the
model prefix), Hugging Face stays offline. LMCache reads one YAML file; where the L2 needs a
secret, an init container fetches it from Secrets Manager into a memory-backed volume at pod
start, so no manifest or template ever carries it.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Mapping

import yaml
from cdk8s import Chart
from constructs import Construct

from config.contracts import (
    GPU_RESOURCE, GPU_TAINT_KEY, KV_EVENTS_PORT, NODE_GROUP_LABEL, NODE_ROLE_GPU,
    NODE_ROLE_LABEL, WORKER_PORT,
)
from k8s.endpoint_spec import AutoScaling, named_model
from k8s.flows import PROMETHEUS, Flow, Peer
from k8s.objects import (
    hardened, k8s_object, pdb, pod_security, selector_labels, standard_labels, zone_spread,
)
from k8s.secret_fetch import (
    API_KEY_FILE, API_KEY_VOLUMES, SECRETS_DIR, ApiKey, fetch_api_key_container,
)

COMPONENT = "vllm-worker"
MODELS_DIR = "/models"
KV_BLOCK_SIZE = 16  # vLLM --block-size == vllm-router --kv-event-block-size
LMCACHE_DIR = "/etc/lmcache"
# lmcache/vllm-openai sets no USER and runs `/opt/venv/bin/vllm serve` (LMCache's
# docker/Dockerfile): nothing in it needs root. vLLM, torch, triton and numba write their
# caches under $HOME and /tmp, which are emptyDirs; the root filesystem stays read-only.
WORKER_UID = 10001   # any UID works: the image bakes none in; high, off the host range
WORKER_HOME = "/home/vllm"
SCRATCH_ENV = [{"name": "HOME", "value": WORKER_HOME}, {"name": "USER", "value": "vllm"}]


@dataclass(frozen=True)
class L2Connection:
    """How LMCache reaches L2. `secret_arn` set: the password is fetched at pod start."""

    url: str                          # without credentials
    secret_arn: str | None = None


@dataclass(frozen=True)
class MetricsSource:
    """Where KEDA reads worker metrics: AMP (SigV4 as the KEDA operator's Pod Identity) or the
    in-cluster Prometheus."""

    server_address: str
    aws_region: str | None = None


@dataclass(frozen=True)
class WorkerScaling:
    spec: AutoScaling
    source: MetricsSource


@dataclass(frozen=True)
class WorkerProps:
    endpoint: str
    namespace: str
    service_account: str              # bound to the worker role by Pod Identity (CDK side)
    image: str
    staging_image: str                # aws-cli: copies weights, fetches the L2 secret
    region: str
    model_bucket: str
    model_location: str
    model_name: str
    replicas: int
    gpus: int
    cpu: str
    memory: str
    node_group: str
    l1_enabled: bool
    l1_size_gib: int
    l2: L2Connection | None
    publish_kv_events: bool
    health_check_path: str
    model_mount_path: str
    extra_args: tuple[str, ...] = ()
    extra_env: tuple[Mapping[str, Any], ...] = ()   # Kubernetes EnvVar objects, as written
    port: int = WORKER_PORT           # where vLLM listens (modelInvocationPort.containerPort)
    command: tuple[str, ...] = ()     # the file's command; empty: chosen by `vllm_command`
    working_dir: str | None = None
    shm_size: str = "16Gi"
    stateful: bool = False            # kv_aware: stable pod DNS names for static sources
    scaling: WorkerScaling | None = None
    api_key: ApiKey | None = None     # vLLM checks it on /v1 routes (VLLM_API_KEY)


# A slow or dead L2 must cost a miss, not a stall: LMCache 0.5.6 bounds blocking remote reads
# with `blocking_timeout_secs`, lookups with `lookup_timeout_ms`, and its health monitor
# (extra_config) takes the remote out after repeated failures. `fallback_policy: local_cpu`
# keeps L1 serving meanwhile (the default `recompute` would switch L1 off too). The redis
# client's own socket timeouts bound the existence checks LMCache does not time out itself.
L2_TIMEOUTS = {"blocking_timeout_secs": 2, "lookup_timeout_ms": 1000}
L2_HEALTH = {"fallback_policy": "local_cpu", "ping_interval": 10.0, "ping_timeout": 2.0,
             "get_blocking_failed_threshold": 5, "waiting_time_for_recovery": 60.0}
REDIS_SOCKET_TIMEOUTS = "socket_timeout=1&socket_connect_timeout=1"
# LMCache 0.5.x takes a redis:// or rediss:// password only inside `remote_url` (its `resp://`
# client reads LMCACHE_RESP_PASSWORD but has no TLS, which ElastiCache AUTH requires), and it
# logs that URL at INFO in five places (config dump, connector creation, connection). With a
# secret in the URL, LMCache logs at WARNING: none of its warnings carry the URL
# (tests/k8s/test_lmcache_config.py runs its code with a fake token to prove it).
LMCACHE_QUIET = ("LMCACHE_LOG_LEVEL", "WARNING")
# vLLM reads its key from the environment (an --api-key argument would be in its args log):
# a shell reads the fetched key into VLLM_API_KEY, then execs the command as chosen.
API_KEY_WRAPPER = ["/bin/sh", "-c", f'export VLLM_API_KEY="$(cat {API_KEY_FILE})"; exec "$@"',
                   "vllm"]


def with_socket_timeouts(url: str) -> str:
    if not url.startswith(("redis://", "rediss://")):
        return url
    return f"{url}{'&' if '?' in url else '?'}{REDIS_SOCKET_TIMEOUTS}"


def lmcache_config(p: WorkerProps) -> dict:
    """LMCache engine settings (keys of LMCacheEngineConfig, see ../shared/FACTS.md)."""
    cfg: dict = {"chunk_size": 256, "local_cpu": p.l1_enabled,
                 "max_local_cpu_size": float(p.l1_size_gib if p.l1_enabled else 0),
                 "save_unfull_chunk": False}
    if p.l2:
        cfg.update(remote_serde="naive", **L2_TIMEOUTS, extra_config=dict(L2_HEALTH))
        if not p.l2.secret_arn:  # with a secret, the URL is appended at pod start
            cfg["remote_url"] = with_socket_timeouts(p.l2.url)
    return cfg


# vLLM's OpenAI server module: accepts `--model` in every vLLM version, where `vllm serve`
# takes the model as a positional argument and warns about (later refuses) `--model`.
API_SERVER = ("python3", "-m", "vllm.entrypoints.openai.api_server")


def _flags(args: tuple[str, ...] | list[str]) -> set[str]:
    """Flag names given, as vLLM reads them (`--served_model_name=x` is --served-model-name)."""
    return {a.split("=", 1)[0].replace("_", "-") for a in args if a.startswith("--")}


def vllm_command(p: WorkerProps) -> list[str]:
    """The file's command as written; else `vllm serve`, or the API server module for args
    written with `--model` (HyperPod's published `--model /opt/ml/model` files)."""
    if p.command:
        return list(p.command)
    if "--model" in _flags(p.extra_args):
        return list(API_SERVER)
    return ["vllm", "serve"]


def vllm_args(p: WorkerProps) -> list[str]:
    """The file's args as written, then only what they lack: the model path (where the weights
    are mounted), where to listen, the served name, LMCache's connector and KV events."""
    given = _flags(p.extra_args)
    args = [] if p.command or named_model(p.extra_args) else [p.model_mount_path]
    args += list(p.extra_args)
    own = {"--served-model-name": p.model_name, "--host": "0.0.0.0", "--port": str(p.port),
           "--kv-transfer-config": json.dumps(
               {"kv_connector": "LMCacheConnectorV1", "kv_role": "kv_both"},
               separators=(",", ":"))}
    for flag, value in own.items():
        if flag not in given:
            args += [flag, value]
    if p.publish_kv_events:
        args += ["--kv-events-config", json.dumps({
            "enable_kv_cache_events": True, "publisher": "zmq",
            # vllm-router 0.1.17 subscribes to topic "" only; its block size must match.
            "endpoint": f"tcp://*:{KV_EVENTS_PORT}", "topic": "", "buffer_steps": 10000,
            "hwm": 100000}, separators=(",", ":")), "--block-size", str(KV_BLOCK_SIZE)]
    return args


def worker_urls(p: WorkerProps) -> tuple[str, ...]:
    """Stable DNS names of StatefulSet workers, for the router's static lists."""
    svc = f"{p.endpoint}-workers"
    return tuple(f"http://{svc}-{i}.{svc}.{p.namespace}.svc.cluster.local:{p.port}"
                 for i in range(p.replicas))


def kv_event_endpoints(p: WorkerProps) -> tuple[str, ...]:
    svc = f"{p.endpoint}-workers"
    return tuple(f"tcp://{svc}-{i}.{svc}.{p.namespace}.svc.cluster.local:{KV_EVENTS_PORT}"
                 for i in range(p.replicas))


class WorkersChart(Chart):
    def __init__(self, scope: Construct, id: str, *, props: WorkerProps) -> None:
        super().__init__(scope, id, namespace=props.namespace)
        p = props
        name = f"{p.endpoint}-workers"
        sel = selector_labels(COMPONENT, p.endpoint)
        labels = standard_labels(COMPONENT, p.endpoint)
        self.selector = sel
        self.flows = (Flow(PROMETHEUS, Peer(name, p.namespace, sel), p.port,
                           "vLLM and LMCache metrics"),)
        k8s_object(self, "ServiceAccount", api_version="v1", kind="ServiceAccount",
                   name=p.service_account, namespace=p.namespace, labels=labels,
                   body={"automountServiceAccountToken": False})
        k8s_object(self, "LmcacheConfig", api_version="v1", kind="ConfigMap",
                   name=f"{name}-lmcache", namespace=p.namespace, labels=labels,
                   body={"data": {"lmcache.yaml": yaml.safe_dump(lmcache_config(p),
                                                                 sort_keys=True)}})
        model_dir = f"{MODELS_DIR}/{p.endpoint}"
        stage = {
            "name": "stage-model", "image": p.staging_image, "imagePullPolicy": "IfNotPresent",
            "command": ["aws", "s3", "sync", "--only-show-errors", "--no-progress",
                        f"s3://{p.model_bucket}/{p.model_location}/", model_dir],
            "env": [{"name": "AWS_REGION", "value": p.region}, *SCRATCH_ENV],
            "volumeMounts": [{"name": "model-weights", "mountPath": MODELS_DIR},
                             {"name": "home", "mountPath": WORKER_HOME},
                             {"name": "tmp", "mountPath": "/tmp"}],
            "resources": {"requests": {"cpu": "2", "memory": "2Gi"},
                          "limits": {"cpu": "4", "memory": "4Gi"}},
            "securityContext": hardened(run_as_user=WORKER_UID),
        }
        init = [stage]
        config_file = f"{LMCACHE_DIR}/lmcache.yaml"
        if p.l2 and p.l2.secret_arn:
            # The password never leaves Secrets Manager except into this pod's memory volume.
            script = ("set -eu; TOKEN=$(aws secretsmanager get-secret-value --secret-id "
                      "\"$SECRET_ARN\" --query SecretString --output text); "
                      "cp /config/lmcache.yaml \"$OUT\"; "
                      "printf 'remote_url: \"%s\"\\n' "
                      "\"$(echo \"$L2_URL\" | sed \"s#://#://:${TOKEN}@#\")\" >> \"$OUT\"")
            init.append({
                "name": "fetch-l2-secret", "image": p.staging_image,
                "imagePullPolicy": "IfNotPresent", "command": ["/bin/sh", "-c", script],
                "env": [{"name": "AWS_REGION", "value": p.region},
                        {"name": "SECRET_ARN", "value": p.l2.secret_arn},
                        {"name": "L2_URL", "value": with_socket_timeouts(p.l2.url)},
                        {"name": "OUT", "value": "/run/lmcache/lmcache.yaml"}, *SCRATCH_ENV],
                "volumeMounts": [{"name": "lmcache-base", "mountPath": "/config"},
                                 {"name": "lmcache-runtime", "mountPath": "/run/lmcache"},
                                 {"name": "home", "mountPath": WORKER_HOME},
                                 {"name": "tmp", "mountPath": "/tmp"}],
                "resources": {"requests": {"cpu": "100m", "memory": "128Mi"},
                              "limits": {"cpu": "500m", "memory": "256Mi"}},
                "securityContext": hardened(run_as_user=WORKER_UID),
            })
            config_file = "/run/lmcache/lmcache.yaml"
        if p.api_key:
            init.append(fetch_api_key_container(p.api_key, run_as_user=WORKER_UID))
        health = {"httpGet": {"path": p.health_check_path, "port": "http"},
                  "periodSeconds": 10, "timeoutSeconds": 5}
        env = [{"name": "HF_HUB_OFFLINE", "value": "1"},
               {"name": "TRANSFORMERS_OFFLINE", "value": "1"},
               {"name": "LMCACHE_CONFIG_FILE", "value": config_file},
               {"name": "PROMETHEUS_MULTIPROC_DIR", "value": "/tmp"}, *SCRATCH_ENV]
        # The file's variables as written; one it shares with ours replaces ours.
        theirs = {e["name"] for e in p.extra_env}
        env = [e for e in env if e["name"] not in theirs or e["name"] == "LMCACHE_CONFIG_FILE"]
        env += [dict(e) for e in p.extra_env if e["name"] != "LMCACHE_CONFIG_FILE"]
        if p.l2 and p.l2.secret_arn:
            env.append({"name": LMCACHE_QUIET[0], "value": LMCACHE_QUIET[1]})
        if "PYTHONHASHSEED" not in theirs:
            env.append({"name": "PYTHONHASHSEED", "value": "0"})  # same hashes on every worker
        ports = [{"name": "http", "containerPort": p.port}]
        if p.publish_kv_events:
            ports.append({"name": "kv-events", "containerPort": KV_EVENTS_PORT})
        worker = {
            "name": "vllm", "image": p.image, "imagePullPolicy": "IfNotPresent",
            "command": [*API_KEY_WRAPPER, *vllm_command(p)] if p.api_key else vllm_command(p),
            "args": vllm_args(p), "env": env, "ports": ports,
            "resources": {
                "requests": {"cpu": p.cpu, "memory": p.memory, GPU_RESOURCE: str(p.gpus)},
                "limits": {"memory": p.memory, GPU_RESOURCE: str(p.gpus)}},
            "startupProbe": {**health, "failureThreshold": 180},   # up to 30 min to load
            "readinessProbe": {**health, "failureThreshold": 3},
            "livenessProbe": {**health, "failureThreshold": 6},
            "lifecycle": {"preStop": {"sleep": {"seconds": 15}}},  # leave the router first
            "volumeMounts": [
                {"name": "model-weights", "mountPath": p.model_mount_path,
                 "subPath": p.endpoint, "readOnly": True},
                {"name": "dshm", "mountPath": "/dev/shm"},
                {"name": "home", "mountPath": WORKER_HOME},
                {"name": "tmp", "mountPath": "/tmp"},
                {"name": "lmcache-base", "mountPath": LMCACHE_DIR, "readOnly": True},
                {"name": "lmcache-runtime", "mountPath": "/run/lmcache", "readOnly": True},
                *([{"name": "api-key", "mountPath": SECRETS_DIR, "readOnly": True}]
                  if p.api_key else [])],
            "securityContext": hardened(run_as_user=WORKER_UID),
        }
        if p.working_dir:
            worker["workingDir"] = p.working_dir
        pod = {
            "metadata": {"labels": labels},
            "spec": {
                "serviceAccountName": p.service_account,
                "automountServiceAccountToken": False,
                "securityContext": pod_security(WORKER_UID),
                "nodeSelector": {NODE_ROLE_LABEL: NODE_ROLE_GPU, NODE_GROUP_LABEL: p.node_group},
                "tolerations": [{"key": GPU_TAINT_KEY, "operator": "Exists",
                                 "effect": "NoSchedule"}],
                "topologySpreadConstraints": zone_spread(sel),
                "terminationGracePeriodSeconds": 120,
                "initContainers": init, "containers": [worker],
                "volumes": [
                    {"name": "model-weights", "emptyDir": {}},
                    {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": p.shm_size}},
                    {"name": "home", "emptyDir": {"sizeLimit": "20Gi"}},   # compile caches
                    {"name": "tmp", "emptyDir": {"sizeLimit": "4Gi"}},
                    {"name": "lmcache-base", "configMap": {"name": f"{name}-lmcache"}},
                    {"name": "lmcache-runtime", "emptyDir": {"medium": "Memory",
                                                             "sizeLimit": "1Mi"}},
                    *(API_KEY_VOLUMES if p.api_key else [])],
            }}
        spec = {"replicas": p.replicas, "selector": {"matchLabels": sel}, "template": pod}
        if p.stateful:
            spec.update(serviceName=name, podManagementPolicy="Parallel")
            kind = "StatefulSet"
        else:
            spec["strategy"] = {"type": "RollingUpdate",
                                "rollingUpdate": {"maxUnavailable": 1, "maxSurge": 0}}
            kind = "Deployment"
        k8s_object(self, "Workload", api_version="apps/v1", kind=kind, name=name,
                   namespace=p.namespace, labels=labels, body={"spec": spec})
        pdb(self, name=name, namespace=p.namespace, labels=labels, selector=sel)
        svc_ports = [{"name": "http", "port": p.port, "targetPort": "http"}]
        if p.publish_kv_events:
            svc_ports.append({"name": "kv-events", "port": KV_EVENTS_PORT,
                              "targetPort": "kv-events"})
        if p.scaling:
            self._scaled_object(name, kind, labels, p.scaling)
        # Headless: stable per-pod DNS (StatefulSet) and a scrape target list for Prometheus.
        k8s_object(self, "Service", api_version="v1", kind="Service", name=name,
                   namespace=p.namespace, labels=labels, body={"spec": {
                       "clusterIP": "None", "selector": sel, "ports": svc_ports,
                       "publishNotReadyAddresses": False}})

    def _scaled_object(self, name: str, kind: str, labels: dict, scaling: WorkerScaling) -> None:
        s, src, ns = scaling.spec, scaling.source, self.namespace
        auth = None
        if src.aws_region:
            auth = f"{name}-aws"
            k8s_object(self, "TriggerAuthentication", api_version="keda.sh/v1alpha1",
                       kind="TriggerAuthentication", name=auth, namespace=ns, labels=labels,
                       body={"spec": {"podIdentity": {"provider": "aws",
                                                      "identityOwner": "keda"}}})
        triggers = []
        for t in s.triggers:
            meta = {"serverAddress": src.server_address, "query": t.query,
                    "threshold": _num(t.target_value),
                    "activationThreshold": _num(t.activation_target_value),
                    "ignoreNullValues": "true"}
            trigger = {"type": "prometheus", "name": t.name, "metricType": t.metric_type,
                       "metadata": meta}
            if auth:
                meta["awsRegion"] = src.aws_region
                trigger["authenticationRef"] = {"name": auth}
            triggers.append(trigger)
        k8s_object(self, "ScaledObject", api_version="keda.sh/v1alpha1", kind="ScaledObject",
                   name=name, namespace=ns, labels=labels, body={"spec": {
                       "scaleTargetRef": {"apiVersion": "apps/v1", "kind": kind, "name": name},
                       "minReplicaCount": s.min_replicas, "maxReplicaCount": s.max_replicas,
                       "pollingInterval": s.polling_interval,
                       "cooldownPeriod": s.cooldown_period,
                       "initialCooldownPeriod": s.initial_cooldown_period,
                       "advanced": {"horizontalPodAutoscalerConfig": {"behavior": {
                           "scaleUp": {"stabilizationWindowSeconds": s.scale_up_stabilization},
                           "scaleDown": {
                               "stabilizationWindowSeconds": s.scale_down_stabilization}}}},
                       "triggers": triggers}})


def _num(value: float) -> str:
    """KEDA thresholds are strings; keep `4` rather than `4.0`."""
    return f"{value:g}"
