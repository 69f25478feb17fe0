"""Reads HyperPod `InferenceEndpointConfig` files (inference.sagemaker.aws.amazon.com/v1).

A HyperPod user brings the file they have. Fields we honour are parsed into `EndpointSpec`;
harmless fields we do not act on become warnings; anything else is a `ConfigError` naming the
field. Only the fields listed in ../shared/FACTS.md matter here.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import yaml

from config.errors import ConfigError
from config.instances import ec2_type, gpu_shape

API_VERSION = "inference.sagemaker.aws.amazon.com/v1"
KIND = "InferenceEndpointConfig"

# HyperPod strategy -> vllm-router policy
ROUTING_POLICIES = {
    "prefixaware": "cache_aware",
    "kvaware": "kv_aware",
    "session": "consistent_hash",
    "roundrobin": "round_robin",
}
# HyperPod L2 backends, plus our own: what each becomes is decided with the environment.
L2_BACKENDS = ("redis", "tieredstorage", "valkey", "lmcache-server")

# Accepted but not acted on: they change nothing we deploy, so a warning, not an error.
_HARMLESS = {
    "spec.tlsConfig": "TLS is the environment's listener.certificateArn (an ACM certificate on "
                      "the load balancer listener, cdk.json); tlsConfig is ignored",
    "spec.loadBalancer.routingAlgorithm": "the router, not the load balancer, picks workers",
    "spec.metrics.metricsScrapeIntervalSeconds": "scrape intervals are set by the collector",
    "spec.modelSourceConfig.prefetchEnabled": "weights are always staged before vLLM starts",
    "spec.worker.modelInvocationPort.name": "the port is named http",
    "spec.worker.modelVolumeMount.name": "the volume is named model-weights",
    "spec.modelSourceConfig.s3Storage.bucketName":
        "weights come from the environment's model bucket, not the file's bucketName",
    "spec.modelSourceConfig.s3Storage.region": "the environment's region is used",
    "metadata.namespace": "endpoints deploy to the serving namespace",
}


@dataclass(frozen=True)
class PrometheusTrigger:
    query: str
    target_value: float
    activation_target_value: float = 0.0
    metric_type: str = "AverageValue"     # KEDA: AverageValue (per worker) or Value
    name: str = "trigger"


@dataclass(frozen=True)
class AutoScaling:
    """HyperPod `autoScalingSpec` (KEDA) with its defaults; rendered as a ScaledObject."""

    min_replicas: int
    max_replicas: int
    polling_interval: int = 30
    cooldown_period: int = 300
    initial_cooldown_period: int = 300
    scale_up_stabilization: int = 0
    scale_down_stabilization: int = 300
    triggers: tuple[PrometheusTrigger, ...] = ()
    from_file: bool = True


# Default trigger when the file has none: waiting requests per worker (vLLM's own queue).
DEFAULT_WAITING_PER_WORKER = 4.0


def default_trigger(model_name: str) -> PrometheusTrigger:
    return PrometheusTrigger(
        query=f'sum(vllm:num_requests_waiting{{model_name="{model_name}"}})',
        target_value=DEFAULT_WAITING_PER_WORKER, activation_target_value=0.0,
        metric_type="AverageValue", name="waiting-requests")


@dataclass(frozen=True)
class EndpointSpec:
    name: str
    model_name: str
    instance_type: str            # EC2 type, `ml.` prefix removed
    replicas: int
    invocation_path: str
    model_location: str           # S3 key prefix in the model bucket
    l1_enabled: bool
    l1_size_gib: int
    l2_enabled: bool
    l2_backend: str | None
    routing_strategy: str
    metrics_enabled: bool
    metrics_port: int
    metrics_path: str
    health_check_path: str
    worker_image: str             # as written in the file; matched against the catalogue
    worker_args: tuple[str, ...]
    worker_env: tuple[tuple[str, str], ...]
    cpu: str
    memory: str
    gpus: int
    port: int
    model_mount_path: str
    source_file: str
    autoscaling: AutoScaling | None = None
    warnings: tuple[str, ...] = field(default=())

    @property
    def router_policy(self) -> str:
        return ROUTING_POLICIES[self.routing_strategy]


class _Doc:
    def __init__(self, env: str, file: str, data: Any, path: str):
        self.env, self.file, self.path = env, file, path
        if not isinstance(data, Mapping):
            raise self._err(path, data, "a mapping")
        self.data, self.used = data, set()

    def _err(self, path: str, value: Any, allowed: Any) -> ConfigError:
        return ConfigError(self.env, f"{self.file}: {path}", value, allowed)

    def p(self, key: str) -> str:
        return f"{self.path}.{key}" if self.path else key

    def fail(self, key: str, value: Any, allowed: Any) -> ConfigError:
        return self._err(self.p(key), value, allowed)

    def get(self, key: str, kind: Any, default: Any = ..., allowed: str = "") -> Any:
        self.used.add(key)
        if key not in self.data:
            if default is ...:
                raise self.fail(key, None, f"a required field ({allowed or kind.__name__})")
            return default
        value = self.data[key]
        if (isinstance(value, bool) and kind is int) or not isinstance(value, kind):
            raise self.fail(key, value, allowed or getattr(kind, "__name__", str(kind)))
        return value

    def child(self, key: str, default: Any = ...) -> "_Doc":
        return _Doc(self.env, self.file, self.get(key, Mapping, default, "a mapping"),
                    self.p(key))

    def done(self, warnings: list[str]) -> None:
        for key in sorted(set(self.data) - self.used):
            path = self.p(key)
            if path in _HARMLESS:
                warnings.append(f"{self.file}: {path}: {_HARMLESS[path]}")
            else:
                raise self.fail(key, self.data[key], "known fields: " + ", ".join(
                    sorted(self.used | {k.rsplit('.', 1)[1] for k in _HARMLESS
                                        if k.rsplit('.', 1)[0] == self.path})))


_QUANTITY = re.compile(r"^\d+(\.\d+)?(m|Ki|Mi|Gi|Ti|k|M|G|T)?$")


def parse_endpoint(env: str, file: str, raw: Any) -> EndpointSpec:
    warnings: list[str] = []
    top = _Doc(env, file, raw, "")
    if top.get("apiVersion", str) != API_VERSION:
        raise top.fail("apiVersion", raw.get("apiVersion"), API_VERSION)
    if top.get("kind", str) != KIND:
        raise top.fail("kind", raw.get("kind"), KIND)
    meta = top.child("metadata")
    name = meta.get("name", str)
    if not re.fullmatch(r"[a-z]([-a-z0-9]{0,38}[a-z0-9])?", name):
        raise meta.fail("name", name, "a DNS label of at most 40 characters")
    meta.done(warnings)
    spec = top.child("spec")
    top.done(warnings)

    model_name = spec.get("modelName", str)
    itype = ec2_type(spec.get("instanceType", str))
    shape = gpu_shape(itype)
    if shape is None:
        raise spec.fail("instanceType", spec.data["instanceType"], "a GPU instance type, e.g. "
                        "ml.g5.24xlarge")
    replicas = spec.get("replicas", int, 1)
    if not 1 <= replicas <= 64:
        raise spec.fail("replicas", replicas, "an integer from 1 to 64")
    path = "/" + spec.get("invocationEndpoint", str, "v1/chat/completions").lstrip("/")

    source = spec.child("modelSourceConfig")
    if source.get("modelSourceType", str) != "s3":
        raise source.fail("modelSourceType", source.data["modelSourceType"],
                          "s3 (the only source reachable in every region, China included)")
    s3 = source.child("s3Storage", {})
    s3.done(warnings)
    location = source.get("modelLocation", str).strip("/")
    if not re.fullmatch(r"[A-Za-z0-9._\-/]+", location) or ".." in location:
        raise source.fail("modelLocation", location, "an S3 key prefix of letters, digits, "
                          "'.', '_', '-' and '/'")
    source.done(warnings)

    kv = spec.child("kvCacheSpec", {})
    l1 = kv.get("enableL1Cache", bool, True)
    l1_size = kv.get("l1CacheSizeGiB", int, 0)  # our one extension; sized below if unset
    l2 = kv.get("enableL2Cache", bool, False)
    backend = None
    if l2:
        l2spec = kv.child("l2CacheSpec", {})
        backend = l2spec.get("l2CacheBackend", str, "redis")
        if backend not in L2_BACKENDS:
            raise l2spec.fail("l2CacheBackend", backend, L2_BACKENDS)
        if "l2CacheLocalUrl" in l2spec.data:
            raise l2spec.fail("l2CacheLocalUrl", l2spec.data["l2CacheLocalUrl"],
                              "unset: the cache URL comes from the environment's cache")
        l2spec.done(warnings)
        if backend == "tieredstorage":
            warnings.append(f"{file}: spec.kvCacheSpec.l2CacheSpec.l2CacheBackend: "
                            "tieredstorage is HyperPod-only; using LMCache's own cache server "
                            "(lmcache-server), the closest self-hosted equivalent")
            backend = "lmcache-server"
    else:
        kv.used.add("l2CacheSpec")
    kv.done(warnings)

    routing = spec.child("intelligentRoutingSpec", {})
    # HyperPod accepts autoScalingSpec at spec level and, in newer CLIs, under routing.
    autoscaling = None
    for holder in (spec, routing):
        if "autoScalingSpec" in holder.data:
            if autoscaling is not None:
                raise holder.fail("autoScalingSpec", "twice",
                                  "one autoScalingSpec, under spec or intelligentRoutingSpec")
            autoscaling = _autoscaling(holder.child("autoScalingSpec"), warnings)
    strategy = routing.get("routingStrategy", str, "prefixaware")
    if strategy not in ROUTING_POLICIES:
        raise routing.fail("routingStrategy", strategy, tuple(ROUTING_POLICIES))
    if not routing.get("enabled", bool, True):
        warnings.append(f"{file}: spec.intelligentRoutingSpec.enabled is false: roundrobin")
        strategy = "roundrobin"
    routing.done(warnings)

    metrics = spec.child("metrics", {})
    metrics_enabled = metrics.get("enabled", bool, True)
    model_metrics = metrics.child("modelMetrics", {})
    metrics_port = model_metrics.get("port", int, 8000)
    metrics_path = model_metrics.get("path", str, "/metrics")
    model_metrics.done(warnings)
    metrics.done(warnings)

    lb = spec.child("loadBalancer", {})
    health = lb.get("healthCheckPath", str, "/health")
    if not health.startswith("/"):
        raise lb.fail("healthCheckPath", health, "an absolute path such as /health")
    lb.done(warnings)

    worker = spec.child("worker")
    image = worker.get("image", str)
    args = worker.get("args", list, [])
    for i, a in enumerate(args):
        if not isinstance(a, str):
            raise worker._err(f"{worker.p('args')}[{i}]", a, "a string")
    env_vars = []
    for i, item in enumerate(worker.get("environmentVariables", list, [])):
        if not (isinstance(item, Mapping) and isinstance(item.get("name"), str)
                and isinstance(item.get("value"), str) and set(item) <= {"name", "value"}):
            raise worker._err(f"{worker.p('environmentVariables')}[{i}]", item,
                              "{name: string, value: string} (secrets are not allowed here)")
        env_vars.append((item["name"], item["value"]))
    res = worker.child("resources", {})
    requests = res.get("requests", Mapping, {})
    limits = res.get("limits", Mapping, {})
    res.done(warnings)
    gpus = int(limits.get("nvidia.com/gpu", requests.get("nvidia.com/gpu", shape.gpus)))
    if not 1 <= gpus <= shape.gpus or shape.gpus % gpus:
        raise worker._err("spec.worker.resources.limits.nvidia.com/gpu", gpus,
                          f"a divisor of {shape.gpus} (GPUs on {itype})")
    pods_per_node = shape.gpus // gpus
    cpu = str(requests.get("cpu", max(1, shape.vcpus // pods_per_node - 2)))
    memory = str(requests.get("memory", f"{shape.memory_gib // pods_per_node - 8}Gi"))
    for key, value in (("cpu", cpu), ("memory", memory)):
        if not _QUANTITY.match(value):
            raise worker._err(f"spec.worker.resources.requests.{key}", value,
                              "a Kubernetes quantity, e.g. 16 or 96Gi")
    # L1 lives in the worker's own memory: it must fit beside vLLM (8 GiB headroom).
    mem_gib = _gib(memory)
    if not l1_size:
        l1_size = max(1, int(mem_gib // 2))
    if l1 and not 1 <= l1_size <= mem_gib - 8:
        raise kv.fail("l1CacheSizeGiB", l1_size,
                      f"1 to {int(mem_gib - 8)} (the worker's memory {memory} less 8 GiB)")
    port_doc = worker.child("modelInvocationPort", {})
    port = port_doc.get("containerPort", int, 8000)
    port_doc.done(warnings)
    mount = worker.child("modelVolumeMount", {})
    mount_path = mount.get("mountPath", str, "/opt/ml/model")
    mount.done(warnings)
    worker.done(warnings)
    spec.done(warnings)

    return EndpointSpec(
        name=name, model_name=model_name, instance_type=itype,
        replicas=replicas, invocation_path=path, model_location=location,
        l1_enabled=l1, l1_size_gib=l1_size, l2_enabled=l2, l2_backend=backend,
        routing_strategy=strategy, metrics_enabled=metrics_enabled, metrics_port=metrics_port,
        metrics_path=metrics_path, health_check_path=health, worker_image=image,
        worker_args=tuple(args), worker_env=tuple(env_vars), cpu=cpu, memory=memory,
        gpus=gpus, port=port, model_mount_path=mount_path, source_file=file,
        autoscaling=autoscaling,
        warnings=tuple(warnings),
    )


def _autoscaling(doc: _Doc, warnings: list[str]) -> AutoScaling:
    def seconds(key: str, default: int) -> int:
        value = doc.get(key, int, default)
        if not 0 <= value <= 86400:
            raise doc.fail(key, value, "seconds from 0 to 86400")
        return value

    lo = doc.get("minReplicaCount", int, 1)
    hi = doc.get("maxReplicaCount", int, 5)
    if lo < 0:
        raise doc.fail("minReplicaCount", lo, "0 or more")
    if hi < max(lo, 1):
        raise doc.fail("maxReplicaCount", hi, f"at least minReplicaCount ({lo}) and 1")
    for key in ("cloudWatchTrigger", "cloudWatchTriggerList"):
        if key in doc.data:
            raise doc.fail(key, "CloudWatch trigger", "prometheusTrigger or prometheusTriggerList "
                           "(metrics live in AMP or the in-cluster Prometheus, in China too)")
    raw_triggers = []
    if "prometheusTriggerList" in doc.data:
        raw_triggers = [(f"prometheusTriggerList[{i}]", t) for i, t in
                        enumerate(doc.get("prometheusTriggerList", list))]
        doc.used.add("prometheusTrigger")
    elif "prometheusTrigger" in doc.data:
        raw_triggers = [("prometheusTrigger", doc.get("prometheusTrigger", Mapping))]
    triggers = []
    for i, (key, raw) in enumerate(raw_triggers):
        t = _Doc(doc.env, doc.file, raw, doc.p(key))
        query = t.get("query", str)
        target = t.get("targetValue", (int, float), allowed="a number")
        if isinstance(target, bool) or target <= 0:
            raise t.fail("targetValue", target, "a positive number")
        activation = t.get("activationTargetValue", (int, float), 0, allowed="a number")
        metric_type = t.get("metricType", str, "Average")
        if metric_type not in ("Average", "Value"):
            raise t.fail("metricType", metric_type, ("Average", "Value"))
        for ignored in ("serverAddress", "namespace", "customHeaders", "useCachedMetrics"):
            if ignored in t.data:
                t.used.add(ignored)
                warnings.append(f"{doc.file}: {t.p(ignored)}: the environment's Prometheus or "
                                "AMP workspace is queried; this field is ignored")
        triggers.append(PrometheusTrigger(
            query=query, target_value=float(target), activation_target_value=float(activation),
            metric_type="AverageValue" if metric_type == "Average" else "Value",
            name=t.get("name", str, f"trigger-{i}")))
        t.done(warnings)
    scaling = AutoScaling(
        min_replicas=lo, max_replicas=hi,
        polling_interval=seconds("pollingInterval", 30),
        cooldown_period=seconds("cooldownPeriod", 300),
        initial_cooldown_period=seconds("initialCooldownPeriod", 300),
        scale_up_stabilization=seconds("scaleUpStabilizationTime", 0),
        scale_down_stabilization=seconds("scaleDownStabilizationTime", 300),
        triggers=tuple(triggers))
    doc.done(warnings)
    return scaling


def _gib(quantity: str) -> float:
    units = {"Ki": 2**-20, "Mi": 2**-10, "Gi": 1, "Ti": 2**10, "k": 1e3 / 2**30,
             "M": 1e6 / 2**30, "G": 1e9 / 2**30, "T": 1e12 / 2**30, "m": 1e-3 / 2**30, "": 1 / 2**30}
    number, unit = re.match(r"^(\d+(?:\.\d+)?)(\D*)$", quantity).groups()
    return float(number) * units[unit]


def load_endpoint(env: str, path: Path, root: Path) -> EndpointSpec:
    rel = str(path.relative_to(root)) if path.is_relative_to(root) else str(path)
    if not path.is_file():
        raise ConfigError(env, "endpoints", rel, "paths of existing endpoint files")
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark else "the file"
        raise ConfigError(env, f"{rel}", f"malformed YAML at {where}", "a YAML mapping")
    return parse_endpoint(env, rel, raw)
