"""Reads HyperPod `InferenceEndpointConfig` files (inference.sagemaker.aws.amazon.com/v1).

A HyperPod user brings the file they have. What each field becomes is one table,
`config/hyperpod_fields.py`: fields we act on are parsed into `EndpointSpec`, fields we do not act
on become one warning each (printed at synth), a field the CRD does not have is a `ConfigError`
naming it, and so is a bad value.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence
from urllib.parse import parse_qsl, urlsplit

import promql_parser

from config.errors import ConfigError, allowed_for, excerpt, type_name
from config.files import load_json_object, load_yaml_document, read_repository_file
from config.images import Image, image_for, lmcache_version
from config.contracts import LMCACHE_SERVER_HTTP_PORT, LMCACHE_SERVER_PORT, WORKER_LIMITS_PORT
from config.instances import ec2_type, gpu_shape, pod_share
from config.models import (
    FAMILIES, RECORDED, ModelShape, known_model, shape_from_config, shape_from_config_json,
)
from config.hyperpod_fields import FIELDS, OPERATOR_CHART, OPERATOR_VERSION, ignored
from config import pod_fields
from config.notices import changed

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
# An endpoint's own L2 (l2CacheLocalUrl): schemes LMCache 0.5.x connects to without extras.
L2_URL_SCHEMES = ("redis", "rediss", "lm")
MODEL_SOURCES = ("s3", "fsx", "huggingface", "kubernetesVolume")
# Paths the workers chart mounts itself: the model may not be mounted over them.
RESERVED_MOUNTS = ("/dev/shm", "/etc/lmcache", "/run/lmcache", "/models")

@dataclass(frozen=True)
class PrometheusTrigger:
    query: str
    target_value: float
    activation_target_value: float = 0.0
    metric_type: str = "AverageValue"     # KEDA: AverageValue (per worker) or Value
    name: str = "trigger"


@dataclass(frozen=True)
class HubModel:
    """modelSourceConfig.huggingFaceModel: staged from the Hugging Face Hub before vLLM starts,
    with the environment's Hub token from Secrets Manager where the file names a token."""

    model_id: str
    revision: str | None = None      # commitSHA; None: main, as on HyperPod
    token: bool = False              # tokenSecretRef set: a gated or private model


@dataclass(frozen=True)
class CloudWatchTrigger:
    """HyperPod `cloudWatchTrigger`: KEDA's aws-cloudwatch scaler, as the KEDA operator's Pod
    Identity (cloudwatch:GetMetricData)."""

    name: str
    namespace: str
    metric_name: str
    target_value: float
    dimensions: tuple[tuple[str, str], ...] = ()
    activation_target_value: float = 0.0
    min_value: float = 0.0
    metric_stat: str = "Average"
    period_s: int = 300              # metricCollectionPeriod: the statistic's period
    start_s: int = 300               # metricCollectionStartTime: how far back to query
    metric_type: str = "AverageValue"
    use_cached: bool = True          # useCachedMetrics: KEDA's cache between polls


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
    cloudwatch: tuple[CloudWatchTrigger, ...] = ()


# How long a worker may take to load weights and start, unless maxDeployTimeInSeconds says
DEFAULT_STARTUP_S = 1800
DEFAULT_SCRAPE_S = 15    # HyperPod's default, and k8s/monitoring.py SCRAPE_INTERVAL
MIN_STARTUP_S, MAX_STARTUP_S = 120, 86400

@dataclass(frozen=True)
class RequestLimits:
    """HyperPod `worker.requestLimits`: per worker, at most `max_concurrent` inference requests
    run and `max_queue` wait; the next one is answered `status` (k8s/request_limits.py)."""

    max_concurrent: int
    max_queue: int = 0
    status: int = 429


# HyperPod `lmcache.mode`: LMCache inside vLLM (InProcess, the default) or as an LMCache server
# beside it in the worker pod (MultiProcess, LMCache >= 0.5.0; k8s/lmcache_server.py).
LMCACHE_MODES = ("InProcess", "MultiProcess")
MAX_CONCURRENT_LIMIT, MAX_QUEUE_LIMIT = 4096, 65536


# Default trigger when the file has none: waiting requests per worker (vLLM's own queue).
DEFAULT_WAITING_PER_WORKER = 4.0


def promql_string(text: str) -> str:
    """`text` as a PromQL string literal: JSON's escapes are Go's, which PromQL reads."""
    return json.dumps(text)


def default_trigger(model_name: str) -> PrometheusTrigger:
    return PrometheusTrigger(
        query=f"sum(vllm:num_requests_waiting{{model_name={promql_string(model_name)}}})",
        target_value=DEFAULT_WAITING_PER_WORKER, activation_target_value=0.0,
        metric_type="AverageValue", name="waiting-requests")


@dataclass(frozen=True)
class RoleSpec:
    """One role of HyperPod's `pdSpec` (prefillSpec or decodingSpec), merged with the shared
    worker: its args appended after worker.args with the role's flags winning, its resources
    and nodeSelector, its own autoscaling."""

    role: str                     # "prefill" or "decode"
    replicas: int
    args: tuple[str, ...]         # worker.args merged with the role's (merge_args)
    gpus: int
    cpu: str
    memory: str
    node_selector: tuple[tuple[str, str], ...] = ()
    autoscaling: AutoScaling | None = None


@dataclass(frozen=True)
class PDSpec:
    """HyperPod's `pdSpec`: prefill and decode apart (k8s/pd.py decides whether it renders)."""

    prefill: RoleSpec
    decode: RoleSpec
    routing_threshold: int = 4096   # estimated input tokens at or above which P/D is used; 0: always
    same_az: bool = True
    placement_group: str | None = None
    availability_zone: str | None = None
    forced: bool = False            # forceDisaggregation: our extension, overrides cost only

    @property
    def roles(self) -> tuple[RoleSpec, RoleSpec]:
        return (self.prefill, self.decode)


@dataclass(frozen=True)
class EndpointSpec:
    name: str
    model_name: str
    instance_type: str            # the EC2 type served (`ml.` dropped, instanceTypeMap applied)
    replicas: int
    model_location: str           # S3 key prefix in the model bucket
    l1_enabled: bool
    l1_size_gib: int
    l2_enabled: bool
    l2_backend: str | None
    routing_strategy: str
    metrics_enabled: bool
    health_check_path: str
    worker_image: str             # as written in the file
    worker_args: tuple[str, ...]
    worker_env: tuple[Mapping[str, Any], ...]   # Kubernetes EnvVar objects, as written
    cpu: str
    memory: str
    gpus: int
    port: int                     # modelInvocationPort.containerPort: where vLLM listens
    model_mount_path: str
    source_file: str
    image: Image | None = None    # the catalogue entry, or one made for the file's image
    worker_command: tuple[str, ...] = ()
    working_dir: str | None = None
    l2_url: str | None = None     # l2CacheLocalUrl: the endpoint's own L2, no credentials
    l2_forced: bool = False       # forceL2Cache: even where a read cannot beat recompute
    prefix_tokens: int = 8192     # prefixTokens: the prompt prefix an L2 hit saves (k8s/l2.py)
    working_set_tokens: int | None = None   # workingSetTokens: what the L2 must keep (k8s/l2.py)
    model: ModelShape | None = None   # modelShape, or the shape modelName names; None: unknown
    tls_certificate_arn: str | None = None
    tls_certificate_s3_uri: str | None = None   # tlsConfig.tlsCertificateOutputS3Uri
    request_limits: RequestLimits | None = None
    lmcache_mode: str = "InProcess"
    # inferenceGateway.enabled: an InferencePool and endpoint picker beside the router, for the
    # environment's Gateway (k8s/gateway.py)
    inference_gateway: bool = False
    autoscaling: AutoScaling | None = None
    # Pod-level fields (config/pod_fields.py), checked against node groups in fit_endpoint
    tolerations: tuple[Mapping[str, Any], ...] = ()
    node_affinity: Mapping[str, Any] | None = None
    pod: pod_fields.PodExtras = pod_fields.PodExtras()
    startup_budget_s: int = DEFAULT_STARTUP_S   # maxDeployTimeInSeconds: the startup probe's
    scrape_interval_s: int = 15     # metrics.metricsScrapeIntervalSeconds (k8s/monitoring.py)
    dns_zone_id: str | None = None  # dnsConfig.hostedZoneId: a Route 53 record for the router
    l2_backend_asked: str | None = None   # l2CacheBackend as written, where we serve another
    domain_name: str | None = None  # tlsConfig.customCertificateConfig.domainName: its name
    hub: HubModel | None = None     # huggingFaceModel: staged from the Hub (global regions)
    pd: PDSpec | None = None      # pdSpec as written; k8s/pd.py's verdict may drop it
    warnings: tuple[str, ...] = field(default=())

    @property
    def router_policy(self) -> str:
        return ROUTING_POLICIES[self.routing_strategy]


def _index_free(path: str) -> str:
    return re.sub(r"\[\d+\]", "[]", path)


class _Doc:
    def __init__(self, env: str, file: str, data: Any, path: str):
        self.env, self.file, self.path = env, file, path
        if not isinstance(data, Mapping):
            # The whole file not a mapping (a key file behind a symlink, a log): say what it
            # is, never what it holds.
            shown = data if path else f"a YAML {type(data).__name__}, not a mapping"
            raise self._err(path or "<document>", shown, "a mapping")
        self.data, self.used = data, set()

    def _err(self, path: str, value: Any, allowed: Any) -> ConfigError:
        return ConfigError(self.env, f"{self.file}: {path}", value, allowed)

    def p(self, key: str) -> str:
        return f"{self.path}.{key}" if self.path else key

    def fail(self, key: str, value: Any, allowed: Any) -> ConfigError:
        return self._err(self.p(key), value, allowed)

    def get(self, key: str, kind: Any, default: Any = ..., allowed: str = "") -> Any:
        self.used.add(key)
        if key not in self.data or (self.data[key] is None and default is not ...):
            if default is ...:
                raise self.fail(key, None, f"a required field ({allowed or type_name(kind)})")
            return default
        value = self.data[key]
        if (isinstance(value, bool) and kind in (int, float, (int, float))) \
                or not isinstance(value, kind):
            raise self.fail(key, value, allowed_for(allowed or type_name(kind), value, kind is str))
        return value

    def child(self, key: str, default: Any = ...) -> "_Doc":
        return _Doc(self.env, self.file, self.get(key, Mapping, default, "a mapping"),
                    self.p(key))

    def done(self, warnings: list[str]) -> None:
        """Fields HyperPod has but we do not act on: one warning each. Others: an error."""
        for key in sorted(set(self.data) - self.used):
            path = self.p(key)
            row = ignored(_index_free(path))
            if row is not None:
                warnings.append(f"{self.file}: {path}: ignored: {row.what}")
                continue
            prefix = _index_free(self.path) + "."
            known = sorted(self.used | {f.rsplit(".", 1)[1] for f in FIELDS
                                        if f.startswith(prefix) and "." not in f[len(prefix):]})
            raise self.fail(key, self.data[key], f"fields of InferenceEndpointConfig v1 here "
                            f"(HyperPod inference operator {OPERATOR_VERSION}, chart "
                            f"{OPERATOR_CHART}: a field of a newer operator is not read yet, "
                            "config/hyperpod_fields.py): " + ", ".join(known))


_QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?(m|Ki|Mi|Gi|Ti|k|M|G|T)?$")
_ACM_ARN = re.compile(r"arn:aws(-cn|-us-gov)?:acm:[a-z0-9-]+:[0-9]{12}:certificate/[A-Fa-f0-9-]+")
# The served model name: vLLM's --served-model-name, the model_name label of every worker
# metric, and a label value in KEDA's PromQL. Hugging Face style names fit.
MODEL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/+-]{0,127}", re.A)
# Kubernetes 1.35 env var names (RelaxedEnvironmentVariableValidation, GA): printable ASCII but
# '=', at least one character.
_ENV_NAME = re.compile(r"[\x20-\x3c\x3e-\x7e]+")
# Variables that hold a credential: never a literal (config/pod_fields.py CREDENTIAL_VAR)
_CREDENTIAL_VAR = pod_fields.CREDENTIAL_VAR


def parse_endpoint(env: str, file: str, raw: Any, *,
                   instance_type_map: Mapping[str, str] | None = None,
                   node_instance_types: tuple[str, ...] = (),
                   root: Path | None = None) -> EndpointSpec:
    """One file -> `EndpointSpec`. `instance_type_map` (HyperPod type -> EC2 type) and
    `node_instance_types` (the environment's GPU node groups) pick the type served; `root`,
    the repository, holds the model config.json files a shape may be read from."""
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
    if not MODEL_NAME.fullmatch(model_name):
        raise spec.fail("modelName", model_name, "letters, digits and . _ - : / + (at most 128, "
                        "starting with a letter or digit), e.g. Llama-3.1-8B-Instruct")
    itype, shape = _instance_type(spec, instance_type_map or {}, node_instance_types, warnings,
                                  name)
    replicas = spec.get("replicas", int, 1)
    if not 1 <= replicas <= 64:
        raise spec.fail("replicas", replicas, "an integer from 1 to 64")
    invocation = spec.get("invocationEndpoint", str, "v1/chat/completions").lstrip("/")
    if not invocation.startswith("v1/"):
        warnings.append(f"{file}: spec.invocationEndpoint: {excerpt(invocation)} is not served: "
                        "clients call vLLM's OpenAI API (/v1/chat/completions, "
                        "/v1/completions) on the router")

    source = spec.child("modelSourceConfig")
    source_type = source.get("modelSourceType", str)
    if source_type not in MODEL_SOURCES:
        raise source.fail("modelSourceType", source_type, MODEL_SOURCES)
    location = source.get("modelLocation", str, name).strip("/") or name
    if not re.fullmatch(r"[A-Za-z0-9._\-/]+", location) or ".." in location:
        raise source.fail("modelLocation", location, "an S3 key prefix of letters, digits, "
                          "'.', '_', '-' and '/'")
    source.get("prefetchEnabled", bool, False)   # staged before start either way (the table)
    hub = None
    if source_type == "huggingface" and "huggingFaceModel" in source.data:
        hub = _hub_model(source.child("huggingFaceModel"), warnings)
    elif source_type != "s3":
        warnings.append(f"{file}: spec.modelSourceConfig.modelSourceType: {source_type} is "
                        "not mounted: the weights are staged from the environment's model "
                        f"bucket at <bucket>/{location}/ (python -m tools upload-model)")
    if hub is None and "huggingFaceModel" in source.data:
        source.used.add("huggingFaceModel")
        warnings.append(f"{file}: spec.modelSourceConfig.huggingFaceModel: ignored: "
                        f"modelSourceType is {source_type}")
    source.done(warnings)

    kv = spec.child("kvCacheSpec", {})
    l1 = kv.get("enableL1Cache", bool, True)
    l1_size = kv.get("l1CacheSizeGiB", int, 0)  # our extension; sized below if unset
    l2 = kv.get("enableL2Cache", bool, False)
    l2_forced = kv.get("forceL2Cache", bool, False)   # our extension (k8s/workers.py)
    prefix_tokens = kv.get("prefixTokens", int, 8192)   # our extension (k8s/l2.py)
    if not MIN_PREFIX_TOKENS <= prefix_tokens <= MAX_PREFIX_TOKENS:
        raise kv.fail("prefixTokens", prefix_tokens, f"an integer from {MIN_PREFIX_TOKENS} to "
                      f"{MAX_PREFIX_TOKENS:,} (the prompt prefix, in tokens, an L2 hit saves)")
    working_set = kv.get("workingSetTokens", int, None)   # our extension (k8s/l2.py)
    if working_set is not None and not MIN_PREFIX_TOKENS <= working_set <= MAX_WORKING_SET:
        raise kv.fail("workingSetTokens", working_set, f"an integer from {MIN_PREFIX_TOKENS} "
                      f"to {MAX_WORKING_SET:,} (the distinct prompt tokens clients come back "
                      "to, which the L2 is sized to keep)")
    model = _model_shape(kv, model_name, location, root)
    backend = l2_url = l2_asked = None
    if l2:
        l2spec = kv.child("l2CacheSpec", {})
        backend = l2spec.get("l2CacheBackend", str, "redis").lower()
        if backend not in L2_BACKENDS:
            raise l2spec.fail("l2CacheBackend", backend, L2_BACKENDS)
        if "l2CacheLocalUrl" in l2spec.data:
            l2_url = _l2_url(l2spec, warnings)
        l2spec.done(warnings)
        if backend == "tieredstorage" and l2_url is None:
            # Said by k8s/serving.py only where the L2 is deployed: a dropped L2 has one line.
            l2_asked, backend = backend, "valkey"
    if l2_forced and not l2:
        warnings.append(f"{file}: spec.kvCacheSpec.forceL2Cache: ignored: enableL2Cache is "
                        "false")
    if working_set is not None and not l2:
        warnings.append(f"{file}: spec.kvCacheSpec.workingSetTokens: ignored: enableL2Cache "
                        "is false")
    if not l2 and "l2CacheSpec" in kv.data:
        kv.used.add("l2CacheSpec")
        warnings.append(f"{file}: spec.kvCacheSpec.l2CacheSpec: ignored: enableL2Cache is "
                        "false")
    mode_docs = [d for d in (kv, spec) if "lmcache" in d.data]
    if len(mode_docs) > 1:
        raise spec.fail("lmcache", "twice", "one lmcache, under spec or kvCacheSpec")
    lmcache_mode = _lmcache_mode(mode_docs[0].child("lmcache")) if mode_docs else "InProcess"
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
    if not routing.get("enabled", bool, False):  # the CRD's default, as on HyperPod
        warnings.append(changed(f"{file}: spec.intelligentRoutingSpec.enabled: absent or false "
                                "(HyperPod's default): the router spreads requests roundrobin",
                                name, "intelligentRoutingSpec.enabled"))
        strategy = "roundrobin"
    routing.done(warnings)

    worker = spec.child("worker")
    port_doc = worker.child("modelInvocationPort", {})
    port = port_doc.get("containerPort", int, 8000)
    _same_as_ours(port_doc, "name", "http")
    if not 1024 <= port <= 65535:
        raise port_doc.fail("containerPort", port, "a port from 1024 to 65535 (vLLM runs as a "
                            "non-root user)")
    if port in (WORKER_LIMITS_PORT, LMCACHE_SERVER_PORT, LMCACHE_SERVER_HTTP_PORT):
        raise port_doc.fail("containerPort", port, "a port other than "
                            f"{WORKER_LIMITS_PORT} (the request-limit sidecar) and "
                            f"{LMCACHE_SERVER_PORT}, {LMCACHE_SERVER_HTTP_PORT} (the LMCache "
                            "server)")
    port_doc.done(warnings)

    metrics = spec.child("metrics", {})
    metrics_enabled = metrics.get("enabled", bool, True)
    scrape_s = metrics.get("metricsScrapeIntervalSeconds", int, DEFAULT_SCRAPE_S)
    if not 5 <= scrape_s <= 300:
        raise metrics.fail("metricsScrapeIntervalSeconds", scrape_s, "5 to 300 seconds")
    model_metrics = metrics.child("modelMetrics", {})
    for key, expected in (("port", port), ("path", "/metrics")):
        value = model_metrics.get(key, type(expected), expected)
        if value != expected:
            warnings.append(f"{file}: {model_metrics.p(key)}: {excerpt(value)} differs from vLLM's "
                            f"own {expected!r}, which is what is scraped")
    model_metrics.done(warnings)
    metrics.done(warnings)

    lb = spec.child("loadBalancer", {})
    health = lb.get("healthCheckPath", str, "/health")
    if not re.fullmatch(r"/[!-~]*", health):
        raise lb.fail("healthCheckPath", health, "an absolute path such as /health")
    lb.done(warnings)

    tls_arn = domain = None
    tls = spec.child("tlsConfig", {})
    if "customCertificateConfig" in tls.data:
        custom = tls.child("customCertificateConfig")
        tls_arn = custom.get("acmArn", str)
        domain = custom.get("domainName", str, None)
        if domain is not None and not re.fullmatch(
                r"([a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?\.)+[a-z]{2,63}", domain.rstrip(".")):
            raise custom.fail("domainName", domain, "a domain name, e.g. chat.example.com")
        if not _ACM_ARN.fullmatch(tls_arn):
            raise custom.fail("acmArn", tls_arn, "an ACM certificate ARN, "
                              "arn:<partition>:acm:<region>:<account>:certificate/<id>")
        custom.done(warnings)
    s3_uri = tls.get("tlsCertificateOutputS3Uri", str, None)
    if s3_uri is not None and not _S3_URI.fullmatch(s3_uri):
        # published samples carry placeholders (s3://<YOUR_TLS_BUCKET>): served, not written
        warnings.append(f"{file}: spec.tlsConfig.tlsCertificateOutputS3Uri: {excerpt(s3_uri)} is "
                        "not s3://BUCKET[/PREFIX]: the front's certificate is made but not "
                        "written to S3 (kubectl reads it from the Secret: docs/serving.md)")
        s3_uri = None
    if s3_uri and tls_arn:
        warnings.append(f"{file}: spec.tlsConfig.tlsCertificateOutputS3Uri: ignored: the ACM "
                        "certificate (customCertificateConfig.acmArn) serves, so none is made "
                        "to write there")
    tls.done(warnings)

    image_ref = worker.get("image", str)
    try:
        image = image_for(image_ref)
    except ValueError as err:
        raise worker.fail("image", image_ref, str(err)) from None
    if lmcache_mode == "MultiProcess" and not _lmcache_at_least(image, (0, 5, 0)):
        found = lmcache_version(image)
        raise ConfigError(env, f"{file}: spec.lmcache.mode", "MultiProcess",
                          "InProcess for this image: MultiProcess needs LMCache 0.5.0 or newer "
                          f"(its `lmcache server`); {image_ref} carries LMCache "
                          + (".".join(map(str, found)) if found else "of no known release"))
    request_limits = _request_limits(worker.child("requestLimits"), warnings) \
        if "requestLimits" in worker.data else None
    args = _strings(worker, "args")
    command = _strings(worker, "command")
    working_dir = worker.get("workingDir", str, None)
    env_vars = []
    for i, item in enumerate(worker.get("environmentVariables", list, [])):
        where = f"{worker.p('environmentVariables')}[{i}]"
        if not (isinstance(item, Mapping) and isinstance(item.get("name"), str)
                and set(item) <= {"name", "value", "valueFrom"}
                and isinstance(item.get("value", ""), (str, int, float))
                and isinstance(item.get("valueFrom", {}), Mapping)):
            # the name only: a value may be a token
            raise worker._err(where, item.get("name") if isinstance(item, Mapping) else item,
                              "{name: string, value: string} or "
                              "{name: string, valueFrom: {...}}")
        if not _ENV_NAME.fullmatch(item["name"]):
            raise worker._err(f"{where}.name", item["name"], "printable ASCII but '=', at "
                              "least one character (Kubernetes' rule for variable names)")
        if item.get("value") not in (None, "") and _CREDENTIAL_VAR.fullmatch(item["name"]):
            raise worker._err(f"{where}.value", "<a literal credential>", "valueFrom."
                              "secretKeyRef (a Secret in kvcache-serving): a literal would be "
                              "in the CloudFormation template and the GitOps YAML")
        if any(e["name"] == item["name"] for e in env_vars):
            raise worker._err(f"{where}.name", item["name"], "each name once (Kubernetes "
                              "would keep the last silently)")
        var = {"name": item["name"]}
        if "valueFrom" in item:
            var["valueFrom"] = dict(item["valueFrom"])
            refs = {"secretKeyRef", "configMapKeyRef"} & set(item["valueFrom"])
            if refs:
                warnings.append(f"{file}: {where}.valueFrom: the {sorted(refs)[0]} must exist "
                                "in the kvcache-serving namespace")
        else:
            var["value"] = str(item.get("value", ""))
        env_vars.append(var)
    res = worker.child("resources", {})
    requests = res.get("requests", Mapping, {})
    limits = res.get("limits", Mapping, {})
    res.done(warnings)
    for where, given in (("requests", requests), ("limits", limits)):
        for key in sorted(set(given) - {"nvidia.com/gpu", "cpu", "memory"}):
            warnings.append(f"{file}: spec.worker.resources.{where}.{key}: ignored: workers "
                            "request nvidia.com/gpu, cpu and memory")
    gpu_limit, gpu_request = limits.get("nvidia.com/gpu"), requests.get("nvidia.com/gpu")
    if None not in (gpu_limit, gpu_request) and str(gpu_limit) != str(gpu_request):
        raise res.fail("requests.nvidia.com/gpu", gpu_request, f"the limit ({gpu_limit}) or "
                       "none: Kubernetes takes GPU requests only equal to limits")
    gpu_value = next((v for v in (gpu_limit, gpu_request) if v is not None), shape.gpus)
    if isinstance(gpu_value, bool) or not re.fullmatch(r"[0-9]{1,3}", str(gpu_value)):
        raise res.fail("limits.nvidia.com/gpu", gpu_value, "a whole number of GPUs")
    gpus = int(gpu_value)
    if not 1 <= gpus <= shape.gpus or shape.gpus % gpus:
        raise worker._err("spec.worker.resources.limits.nvidia.com/gpu", gpus,
                          f"a divisor of {shape.gpus} (GPUs on {itype})")
    pods_per_node = shape.gpus // gpus
    # Defaults, and the most a file may ask for: this pod's share of what the node allocates
    # (config/instances.py); a file written for a larger instance (instanceTypeMap) is capped.
    share_cpu, share_gib = pod_share(itype, pods_per_node)
    cpu = str(requests.get("cpu", share_cpu))
    memory = str(requests.get("memory", f"{share_gib}Gi"))
    for key, value in (("cpu", cpu), ("memory", memory)):
        if not _QUANTITY.match(value):
            raise worker._err(f"spec.worker.resources.requests.{key}", value,
                              "a Kubernetes quantity, e.g. 16 or 96Gi")
    if _cores(cpu) > share_cpu or _gib(memory) > share_gib:
        warnings.append(changed(f"{file}: spec.worker.resources.requests: cpu {cpu}, memory "
                                f"{memory} exceed a {itype} worker's share of the node "
                                f"({share_cpu} CPU, {share_gib}Gi with {pods_per_node} per "
                                "node): capped to it", name, "worker.resources.requests"))
        cpu = cpu if _cores(cpu) <= share_cpu else str(share_cpu)
        memory = memory if _gib(memory) <= share_gib else f"{share_gib}Gi"
    # L1 lives in the worker's own memory: it must fit beside vLLM (8 GiB headroom). 0: sized
    # from the container's memory per GPU process (k8s/workers.py l1_budget).
    mem_gib = _gib(memory)
    if l1 and l1_size and not 1 <= l1_size <= mem_gib - 8:
        raise kv._err("spec.kvCacheSpec.l1CacheSizeGiB", l1_size,
                      f"1 to {int(mem_gib - 8)} (the worker's memory {memory} less 8 GiB)")
    mount = worker.child("modelVolumeMount", {})
    mount_path = mount.get("mountPath", str, "/opt/ml/model").rstrip("/") or "/"
    _same_as_ours(mount, "name", "model-weights")
    if not mount_path.startswith("/") or any(
            mount_path == r or mount_path.startswith(r + "/") or r.startswith(mount_path + "/")
            for r in RESERVED_MOUNTS) or mount_path == "/":
        raise mount.fail("mountPath", mount_path, "an absolute path other than "
                         + ", ".join(RESERVED_MOUNTS) + " and their parents")
    mount.done(warnings)
    _check_args(worker, args, port, mount_path, warnings)
    model_volume = mount.data.get("name", "model-weights")
    if lmcache_mode == "MultiProcess" and arg_value(args, "--kv-transfer-config") is not None:
        # an in-process connector beside an LMCache server never talks to it (LMCache #4213)
        raise worker.fail("args", "--kv-transfer-config ...", "no --kv-transfer-config with "
                          "lmcache.mode MultiProcess: the LMCacheMPConnector that reaches the "
                          "pod's LMCache server is rendered (k8s/lmcache_server.py)")
    worker.done(warnings)

    def fail(path: str, value: Any, allowed: Any) -> ConfigError:
        return ConfigError(env, f"{file}: {path}", value, allowed)

    tolerations = pod_fields.tolerations(spec.get("tolerations", list, []), "spec.tolerations",
                                         fail)
    affinity = None
    if "nodeAffinity" in spec.data:
        affinity = pod_fields.node_affinity(
            spec.get("nodeAffinity", Mapping), "spec.nodeAffinity", fail,
            pod_fields.served_type(instance_type_map or {}))
    pod = _pod_extras(spec, fail, warnings, model_volume)
    startup = spec.get("maxDeployTimeInSeconds", int, DEFAULT_STARTUP_S)
    if not MIN_STARTUP_S <= startup <= MAX_STARTUP_S:
        raise spec.fail("maxDeployTimeInSeconds", startup, f"{MIN_STARTUP_S} to {MAX_STARTUP_S} "
                        "seconds (the workers' startup budget)")
    _data_capture(spec)
    zone_id = None
    if "dnsConfig" in spec.data:
        dns = spec.child("dnsConfig")
        zone_id = dns.get("hostedZoneId", str)
        if not re.fullmatch(r"Z[A-Z0-9]{1,32}", zone_id):
            raise dns.fail("hostedZoneId", zone_id, "a Route 53 hosted zone id (Z...)")
        dns.done(warnings)
    pd = None
    if "pdSpec" in spec.data:
        pd = _pd_spec(spec.child("pdSpec"), args, gpus, cpu, memory, shape, itype, port,
                      mount_path, warnings)
    gateway_doc = spec.child("inferenceGateway", {})
    inference_gateway = gateway_doc.get("enabled", bool, False)
    gateway_doc.done(warnings)
    spec.done(warnings)

    return EndpointSpec(
        name=name, model_name=model_name, instance_type=itype,
        replicas=replicas, model_location=location,
        l1_enabled=l1, l1_size_gib=l1_size, l2_enabled=l2, l2_backend=backend, l2_forced=l2_forced,
        l2_backend_asked=l2_asked,
        prefix_tokens=prefix_tokens, model=model, working_set_tokens=working_set,
        routing_strategy=strategy, metrics_enabled=metrics_enabled, health_check_path=health,
        worker_image=image_ref, worker_args=args, worker_env=tuple(env_vars), cpu=cpu,
        memory=memory, gpus=gpus, port=port, model_mount_path=mount_path, source_file=file,
        image=image, worker_command=command, working_dir=working_dir, l2_url=l2_url,
        tls_certificate_arn=tls_arn, tls_certificate_s3_uri=s3_uri, request_limits=request_limits,
        lmcache_mode=lmcache_mode, autoscaling=autoscaling, tolerations=tolerations,
        node_affinity=affinity, pod=pod, startup_budget_s=startup, scrape_interval_s=scrape_s,
        dns_zone_id=zone_id, domain_name=domain.rstrip(".") if domain else None, hub=hub,
        pd=pd, inference_gateway=inference_gateway, warnings=tuple(warnings),
    )


def _pod_extras(spec: _Doc, fail, warnings: list[str], model_volume: str
                ) -> pod_fields.PodExtras:
    """spec.kubernetes: what the file adds to the worker pod (config/pod_fields.py)."""
    kube = spec.child("kubernetes", {})
    file, where = spec.file, "spec.kubernetes"
    vols = pod_fields.volumes(kube.get("volumes", list, []), f"{where}.volumes", fail, warnings,
                              file, model_volume, pod_fields.OUR_VOLUMES)
    inits = pod_fields.init_containers(
        kube.get("initContainers", list, []), f"{where}.initContainers", fail, warnings, file,
        model_volume, {v["name"] for v in vols}, pod_fields.OUR_INIT_CONTAINERS)
    account = kube.get("serviceAccountName", str, None)
    if account is not None:
        account = pod_fields.service_account(account, f"{where}.serviceAccountName", fail)
    notes = pod_fields.annotations(kube.get("podTemplateAnnotations", Mapping, {}),
                                   f"{where}.podTemplateAnnotations", fail, warnings, file)
    kube.done(warnings)
    return pod_fields.PodExtras(init_containers=inits, volumes=vols, service_account=account,
                                annotations=notes)


def _hub_model(doc: _Doc, warnings: list[str]) -> HubModel:
    model_id = doc.get("modelId", str)
    if not re.fullmatch(r"[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+", model_id):
        raise doc.fail("modelId", model_id, "a Hub model id, org/model")
    revision = doc.get("commitSHA", str, None)
    if revision is not None and not re.fullmatch(r"[0-9a-f]{40}", revision):
        raise doc.fail("commitSHA", revision, "a full 40-character lowercase hex commit")
    token = "tokenSecretRef" in doc.data
    if token:
        doc.get("tokenSecretRef", Mapping)
    doc.done(warnings)
    return HubModel(model_id, revision, token)


_CAPTURE_TIERS = ("loadBalancer", "modelPod", "sagemakerEndpoint")


def _data_capture(spec: _Doc) -> None:
    """dataCapture: refused where a tier is on (docs/serving.md says why and what instead)."""
    capture = spec.child("dataCapture", {})
    for tier in _CAPTURE_TIERS:
        if tier in capture.data:
            t = capture.child(tier)
            if t.get("enabled", bool, False):
                raise t.fail("enabled", True, "false: requests and answers are not captured "
                             "here (prompts are customer data, and the router front logs no "
                             "bodies); capture in the client, with its own KMS key and bucket")
            t.used |= set(t.data)
    capture.used |= set(capture.data)


MIN_PREFIX_TOKENS, MAX_PREFIX_TOKENS = 256, 1 << 20
_S3_URI = re.compile(r"s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9](/[A-Za-z0-9!_.*'()/-]*)?", re.A)


def _lmcache_mode(doc: _Doc) -> str:
    mode = doc.get("mode", str, "InProcess")
    if mode not in LMCACHE_MODES:
        raise doc.fail("mode", mode, LMCACHE_MODES)
    doc.done([])
    return mode


def _lmcache_at_least(image: Image, release: tuple[int, int, int]) -> bool:
    found = lmcache_version(image)
    return found is not None and tuple(found) >= release


def _request_limits(doc: _Doc, warnings: list[str]) -> RequestLimits | None:
    """HyperPod's per-worker admission limit; without maxConcurrentRequests there is none."""
    if "maxConcurrentRequests" not in doc.data:
        doc.used.update(doc.data)
        warnings.append(f"{doc.file}: {doc.path}: ignored: no maxConcurrentRequests, no limit")
        return None
    running = doc.get("maxConcurrentRequests", int)
    if not 1 <= running <= MAX_CONCURRENT_LIMIT:
        raise doc.fail("maxConcurrentRequests", running, f"an integer from 1 to "
                       f"{MAX_CONCURRENT_LIMIT} (requests one worker runs at once)")
    queue = doc.get("maxQueueSize", int, 0)
    if not 0 <= queue <= MAX_QUEUE_LIMIT:
        raise doc.fail("maxQueueSize", queue, f"an integer from 0 to {MAX_QUEUE_LIMIT} "
                       "(requests that wait for one of the worker's slots)")
    status = doc.get("overflowStatusCode", int, 429)
    if not 400 <= status <= 599:
        raise doc.fail("overflowStatusCode", status, "an HTTP error status from 400 to 599 "
                       "(429, HyperPod's default, or 503)")
    doc.done(warnings)
    return RequestLimits(running, queue, status)
MAX_WORKING_SET = 1 << 40


def _model_shape(kv: _Doc, model_name: str, location: str, root: Path | None
                 ) -> ModelShape | None:
    """The model's shape (config/models.py): `kvCacheSpec.modelShape` (our extension:
    config.json's keys, the path of a copy of config.json in the repository, or a model we
    know), else the config.json upload-model recorded for `location`, else the shape
    `modelName` names; None where none of them gives one."""
    given = kv.get("modelShape", (str, Mapping), None,
                   "a known model's name, the path of its config.json, or its config.json keys")
    if isinstance(given, Mapping):
        try:
            return shape_from_config(model_name, given)
        except ValueError as exc:
            key, _, allowed = str(exc).partition(": ")
            raise kv._err(f"{kv.p('modelShape')}.{key}", given.get(key), allowed) from None
    if isinstance(given, str) and not given.endswith(".json"):
        shape = known_model(given)
        if shape is None:
            raise kv.fail("modelShape", given, f"a model we know ({FAMILIES}; "
                          "config/models.py), the repository path of a copy of its "
                          "config.json, or its config.json keys (hidden_size, "
                          "num_hidden_layers, ...)")
        return shape
    recorded = RECORDED.format(location=location)
    if given is None and (root is None or not (root / recorded).is_file()):
        return known_model(model_name)
    if root is None:
        raise kv.fail("modelShape", given, "a model we know or its config.json keys (a path "
                      "is read only from a repository)")
    written = given or recorded
    field = (f"{kv.file}: {kv.p('modelShape')}" if given else
             f"{kv.file}: spec.modelSourceConfig.modelLocation (upload-model's record of it)")
    text, rel = read_repository_file(kv.env, field, written, root)
    config = load_json_object(kv.env, rel, text)
    try:
        return shape_from_config_json(model_name, config, rel)
    except ValueError as exc:
        key, _, allowed = str(exc).partition(": ")
        raise ConfigError(kv.env, f"{rel}: {key}", config.get(key) if isinstance(
            config, Mapping) else config, allowed) from None


def _strings(doc: _Doc, key: str) -> tuple[str, ...]:
    values = doc.get(key, list, [])
    for i, a in enumerate(values):
        if not isinstance(a, str):
            raise doc._err(f"{doc.p(key)}[{i}]", a, "a string")
    return tuple(values)


def _instance_type(spec: _Doc, mapping: Mapping[str, str], node_types: tuple[str, ...],
                   warnings: list[str], endpoint: str) -> tuple[str, Any]:
    """The EC2 type the workers run on, and the shape defaults are sized from."""
    written = spec.get("instanceType", str, None)
    candidates = spec.get("instanceTypes", list, [])
    if written is None:
        written = next((t for t in candidates if isinstance(t, str) and
                        mapping.get(t, ec2_type(t)) in node_types), None)
        if written is None:
            if not node_types:
                raise spec.fail("instanceType", None, "a required field (e.g. ml.g5.24xlarge)")
            written = node_types[0]
            warnings.append(changed(f"{spec.file}: spec.instanceType: absent; the workers run "
                                    f"on {written}, the environment's first GPU node group "
                                    "type", endpoint, "instanceType"))
    elif candidates:
        warnings.append(f"{spec.file}: spec.instanceTypes: ignored: instanceType is set")
    served = mapping.get(written, ec2_type(written))
    if served != ec2_type(written):
        warnings.append(changed(f"{spec.file}: spec.instanceType: {written} is served on "
                                f"{served} (the environment's instanceTypeMap)", endpoint,
                                "instanceType"))
    if gpu_shape(ec2_type(written)) is None and gpu_shape(served) is None:
        raise spec.fail("instanceType", written, "a GPU instance type, e.g. ml.g5.24xlarge")
    shape = gpu_shape(served)
    if shape is None:
        raise spec.fail("instanceType", written, f"a GPU type; instanceTypeMap maps it to "
                        f"{served}, which is not one")
    return served, shape


def _l2_url(l2spec: _Doc, warnings: list[str]) -> str:
    """The endpoint's own L2: a URL LMCache connects to, never a password in it."""
    url = l2spec.get("l2CacheLocalUrl", str).strip()
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018  (raises on a bad port)
    except ValueError:
        parts = None
    if parts is None or parts.scheme not in L2_URL_SCHEMES or not parts.hostname:
        raise l2spec.fail("l2CacheLocalUrl", url, "redis://HOST[:PORT], rediss://HOST[:PORT] "
                          "or lm://HOST:PORT (LMCache server)")
    if parts.username or parts.password or "@" in parts.netloc:
        raise l2spec.fail("l2CacheLocalUrl", "<a URL with credentials>", "a URL without user "
                          "or password: a password-protected L2 is the environment's cache "
                          "(cache.kind elasticache), whose AUTH token stays in Secrets Manager "
                          "and is read at pod start")
    if parts.fragment or any(k != "db" or not re.fullmatch(r"[0-9]{1,2}", v)
                             for k, v in parse_qsl(parts.query, keep_blank_values=True)):
        # redis-py (LMCache's client) makes every query parameter a connection setting,
        # ?password= included: that would put a password in the workers' ConfigMap.
        raise l2spec.fail("l2CacheLocalUrl", f"{parts.scheme}://{parts.netloc}{parts.path}?...",
                          "no query but db=N: LMCache's redis client reads each parameter as "
                          "a connection setting (a password too); the socket timeouts are ours")
    if not re.fullmatch(r"[A-Za-z0-9.-]+", parts.hostname, re.A):
        raise l2spec.fail("l2CacheLocalUrl", url, "a host name of letters, digits, '.' and '-'")
    if parts.scheme == "lm" and not parts.port:
        raise l2spec.fail("l2CacheLocalUrl", url, "lm://HOST:PORT (the LMCache server's port)")
    if "." not in parts.hostname:
        warnings.append(f"{l2spec.file}: {l2spec.p('l2CacheLocalUrl')}: {excerpt(parts.hostname)} "
                        "resolves in the kvcache-serving namespace; write "
                        "NAME.NAMESPACE.svc.cluster.local for a service elsewhere")
    warnings.append(f"{l2spec.file}: {l2spec.p('l2CacheLocalUrl')}: this endpoint's L2 is "
                    f"{parts.scheme}://{parts.netloc}, not the environment's cache")
    return url


def arg_value(args: Sequence[str], flag: str) -> str | None:
    """The value of ``flag`` in an argument list (``--flag value`` or ``--flag=value``)."""
    for i, tok in enumerate(args):
        if tok == flag and i + 1 < len(args):
            return args[i + 1]
        if tok.startswith(flag + "="):
            return tok.split("=", 1)[1]
    return None


def named_model(args: Sequence[str]) -> str | None:
    """The model the args already name: `--model X`, or `vllm serve`'s positional."""
    return arg_value(args, "--model") or (args[0] if args and not args[0].startswith("-")
                                          else None)


def _same_as_ours(doc: _Doc, key: str, ours: str) -> None:
    """A name that already is the one we render is acted on, not ignored: no warning."""
    if doc.data.get(key) == ours:
        doc.used.add(key)


def _check_args(worker: _Doc, args: tuple[str, ...], port: int, mount_path: str,
                warnings: list[str]) -> None:
    if arg_value(args, "--api-key") is not None:
        raise worker.fail("args", "--api-key <redacted>", "no --api-key: the endpoint's key is "
                          "the environment's, read from Secrets Manager at pod start (a literal "
                          "would be in the template and the GitOps YAML; docs/security.md)")
    given = arg_value(args, "--port")
    if given is not None and given != str(port):
        raise worker.fail("args", f"--port {given}", f"--port {port} (the "
                          "modelInvocationPort.containerPort) or no --port")
    model = named_model(args)
    if model is not None and not (model == mount_path or model.startswith(mount_path + "/")):
        warnings.append(f"{worker.file}: {worker.p('args')}: the model {excerpt(model)} is not the "
                        f"staged weights at {mount_path}: vLLM runs offline "
                        "(HF_HUB_OFFLINE=1, and the Hub is out of reach in China) and finds it "
                        f"only if it is a path in the image; write {mount_path} to serve the "
                        "weights from the model bucket")


def _flag_groups(args: Sequence[str]) -> list[tuple[str | None, list[str]]]:
    """Args as (flag name, its tokens): `--flag value`, `--flag=value`, a bare `--flag` (the
    next token is a flag too), and leading positionals (name None)."""
    groups: list[tuple[str | None, list[str]]] = []
    for tok in args:
        if tok.startswith("-") and len(tok) > 1 and not _NUMBER.fullmatch(tok):
            groups.append((tok.split("=", 1)[0].replace("_", "-"), [tok]))
        elif groups and groups[-1][0] is not None and len(groups[-1][1]) == 1 \
                and "=" not in groups[-1][1][0]:
            groups[-1][1].append(tok)
        else:
            groups.append((None, [tok]))
    return groups


_NUMBER = re.compile(r"-[0-9.]+")


def merge_args(shared: Sequence[str], role: Sequence[str]) -> tuple[str, ...]:
    """HyperPod's rule for a role's args: "appended after the shared workerConfig.args and
    override any matching flags". A flag the role gives is dropped from the shared args (with
    its value), so vLLM sees it once, the role's; a flag given as `--x` or `--x=v` or `--x_y`
    is the same flag. A flag taking several values (`--middleware a b`) keeps only its first
    value in this grouping; vLLM's own flags here take one."""
    mine = {name for name, _ in _flag_groups(role) if name}
    kept = [tok for name, toks in _flag_groups(shared) if name not in mine for tok in toks]
    return (*kept, *role)


PD_ROLES = (("prefillSpec", "prefill"), ("decodingSpec", "decode"))


def _pd_spec(doc: _Doc, shared_args: tuple[str, ...], gpus: int, cpu: str, memory: str,
             shape: Any, itype: str, port: int, mount_path: str,
             warnings: list[str]) -> PDSpec:
    """`spec.pdSpec`, every field of the CRD (tests/fixtures/hyperpod/FIELDS.txt)."""
    scaling = doc.child("autoScalingSpec", {})
    roles = {}
    for key, role in PD_ROLES:
        r = doc.child(key)
        replicas = r.get("replicas", int, 1)
        if not 1 <= replicas <= 64:
            raise r.fail("replicas", replicas, "an integer from 1 to 64")
        args = merge_args(shared_args, _strings(r, "args"))
        _check_args(r, args, port, mount_path, [])
        res = r.child("resources", {})
        requests = res.get("requests", Mapping, {})
        limits = res.get("limits", Mapping, {})
        if "claims" in res.data:
            res.used.add("claims")
            warnings.append(f"{doc.file}: {res.p('claims')}: ignored: dynamic resource claims "
                            "are not rendered")
        res.done(warnings)
        g_lim, g_req = limits.get("nvidia.com/gpu"), requests.get("nvidia.com/gpu")
        if None not in (g_lim, g_req) and str(g_lim) != str(g_req):
            raise res.fail("requests.nvidia.com/gpu", g_req, f"the limit ({g_lim}) or none: "
                           "Kubernetes takes GPU requests only equal to limits")
        value = next((v for v in (g_lim, g_req) if v is not None), gpus)
        if isinstance(value, bool) or not re.fullmatch(r"[0-9]{1,3}", str(value)) \
                or not 1 <= int(value) <= shape.gpus or shape.gpus % int(value):
            raise res.fail("limits.nvidia.com/gpu", value, f"a divisor of {shape.gpus} (GPUs "
                           f"on {itype})")
        role_gpus = int(value)
        share_cpu, share_gib = pod_share(itype, shape.gpus // role_gpus)
        role_cpu = str(requests.get("cpu", cpu if role_gpus == gpus else share_cpu))
        role_memory = str(requests.get("memory", memory if role_gpus == gpus
                                       else f"{share_gib}Gi"))
        for k, v in (("cpu", role_cpu), ("memory", role_memory)):
            if not _QUANTITY.match(v):
                raise res.fail(f"requests.{k}", v, "a Kubernetes quantity, e.g. 16 or 96Gi")
        if _cores(role_cpu) > share_cpu or _gib(role_memory) > share_gib:
            warnings.append(f"{doc.file}: {res.p('requests')}: cpu {role_cpu}, memory "
                            f"{role_memory} exceed a {itype} {role} worker's share of the node "
                            f"({share_cpu} CPU, {share_gib}Gi): capped to it")
            role_cpu = role_cpu if _cores(role_cpu) <= share_cpu else str(share_cpu)
            role_memory = role_memory if _gib(role_memory) <= share_gib else f"{share_gib}Gi"
        for where in (requests, limits):
            for k in sorted(set(where) - {"nvidia.com/gpu", "cpu", "memory"}):
                warnings.append(f"{doc.file}: {res.p(k)}: ignored: {role} workers request "
                                "nvidia.com/gpu, cpu, memory and (on EFA) vpc.amazonaws.com/efa")
        selector = r.get("nodeSelector", Mapping, {})
        for k, v in selector.items():
            if not isinstance(k, str) or not isinstance(v, str) or not _LABEL_VALUE.fullmatch(v) \
                    or not _LABEL_KEY.fullmatch(k):
                raise r._err(f"{r.p('nodeSelector')}.{k}", v, "a Kubernetes label key and value")
        r.done(warnings)
        auto_key = f"{role if role == 'prefill' else 'decoding'}AutoScaling"
        auto = (_autoscaling(scaling.child(auto_key), warnings) if auto_key in scaling.data
                else None)
        roles[role] = RoleSpec(role, replicas, args, role_gpus, role_cpu, role_memory,
                               tuple(sorted(selector.items())), auto)
    scaling.done(warnings)
    threshold = doc.get("routingThreshold", int, 4096)
    if not 0 <= threshold <= 1 << 24:
        raise doc.fail("routingThreshold", threshold, "0 (always disaggregate) or a number of "
                       "input tokens up to 16,777,216")
    topology = doc.child("topologySpec", {})
    same_az = topology.get("sameAZ", bool, True)
    group = topology.get("placementGroup", str, None)
    zone = topology.get("availabilityZone", str, None)
    if zone is not None and not re.fullmatch(r"[a-z]{2}(-[a-z]+)+-[0-9][a-z]", zone):
        raise topology.fail("availabilityZone", zone, "an availability zone name, e.g. "
                            "us-west-2a")
    if group is not None:
        warnings.append(f"{doc.file}: {topology.p('placementGroup')}: ignored: the environment's "
                        "EFA node group has its own cluster placement group (CDK owns it)")
    topology.done(warnings)
    forced = doc.get("forceDisaggregation", bool, False)
    doc.done(warnings)
    return PDSpec(roles["prefill"], roles["decode"], threshold, same_az, group, zone, forced)


_LABEL_KEY = re.compile(r"([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}"
                        r"[A-Za-z0-9])?")
_LABEL_VALUE = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?")


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
    raw_triggers = _one_or_list(doc, "prometheusTrigger")
    triggers = []
    for i, (key, raw) in enumerate(raw_triggers):
        t = _Doc(doc.env, doc.file, raw, doc.p(key))
        query = t.get("query", str)
        try:
            promql_parser.parse(query)
        except ValueError as err:
            raise t.fail("query", query, f"a PromQL expression ({err})") from None
        target = t.get("targetValue", (int, float), allowed="a number")
        if isinstance(target, bool) or target <= 0:
            raise t.fail("targetValue", target, "a positive number")
        activation = t.get("activationTargetValue", (int, float), 0, allowed="a number")
        metric_type = t.get("metricType", str, "Average")
        if metric_type not in ("Average", "Value"):
            raise t.fail("metricType", metric_type, ("Average", "Value"))
        triggers.append(PrometheusTrigger(
            query=query, target_value=float(target), activation_target_value=float(activation),
            metric_type="AverageValue" if metric_type == "Average" else "Value",
            name=t.get("name", str, f"trigger-{i}")))
        t.done(warnings)
    cloudwatch = _cloudwatch_triggers(doc, warnings)
    scaling = AutoScaling(
        min_replicas=lo, max_replicas=hi, cloudwatch=cloudwatch,
        polling_interval=seconds("pollingInterval", 30),
        cooldown_period=seconds("cooldownPeriod", 300),
        initial_cooldown_period=seconds("initialCooldownPeriod", 300),
        scale_up_stabilization=seconds("scaleUpStabilizationTime", 0),
        scale_down_stabilization=seconds("scaleDownStabilizationTime", 300),
        triggers=tuple(triggers))
    doc.done(warnings)
    return scaling


_CW_STATS = re.compile(r"(SampleCount|Average|Sum|Minimum|Maximum|p\d{1,2}(\.\d+)?)")


def _one_or_list(doc: _Doc, key: str) -> list[tuple[str, Any]]:
    """`<key>List` (which HyperPod prefers; the single form beside it is then unused) or
    `<key>`, as (path, raw) pairs."""
    if f"{key}List" in doc.data:
        doc.used.add(key)
        return [(f"{key}List[{i}]", item) for i, item in enumerate(doc.get(f"{key}List", list))]
    if key in doc.data:
        return [(key, doc.get(key, Mapping))]
    return []


def _cloudwatch_triggers(doc: _Doc, warnings: list[str]) -> tuple[CloudWatchTrigger, ...]:
    """cloudWatchTriggerList (which HyperPod prefers) or cloudWatchTrigger."""
    raw = _one_or_list(doc, "cloudWatchTrigger")
    if not raw:
        return ()
    out = []
    for i, (key, item) in enumerate(raw):
        t = _Doc(doc.env, doc.file, item, doc.p(key))
        number = (int, float)
        target = t.get("targetValue", number, allowed="a number")
        if target <= 0:
            raise t.fail("targetValue", target, "a positive number")
        dims = []
        for j, d in enumerate(t.get("dimensions", list, [])):
            if not (isinstance(d, Mapping) and set(d) == {"name", "value"}
                    and all(isinstance(d[k], str) and d[k] and ";" not in d[k]
                            for k in ("name", "value"))):
                raise t._err(f"{t.p('dimensions')}[{j}]", d, "{name, value}: strings without ';'")
            dims.append((d["name"], d["value"]))
        stat = t.get("metricStat", str, "Average")
        if not _CW_STATS.fullmatch(stat):
            raise t.fail("metricStat", stat, "SampleCount, Average, Sum, Minimum, Maximum or pNN")
        metric_type = t.get("metricType", str, "Average")
        if metric_type not in ("Average", "Value"):
            raise t.fail("metricType", metric_type, ("Average", "Value"))
        period = t.get("metricCollectionPeriod", int, 300)
        start = t.get("metricCollectionStartTime", int, 300)
        if not 1 <= period <= start <= 86400:
            raise t.fail("metricCollectionStartTime", start, f"at least metricCollectionPeriod "
                         f"({period}) and at most 86400 seconds")
        name = t.get("name", str, f"cloudwatch-{i}")
        out.append(CloudWatchTrigger(
            name=name, namespace=t.get("namespace", str), metric_name=t.get("metricName", str),
            target_value=float(target), dimensions=tuple(dims),
            activation_target_value=float(t.get("activationTargetValue", number, 0)),
            min_value=float(t.get("minValue", number, 0)), metric_stat=stat, period_s=period,
            start_s=start, metric_type="AverageValue" if metric_type == "Average" else "Value",
            use_cached=t.get("useCachedMetrics", bool, True)))
        t.done(warnings)
    return tuple(out)


def _gib(quantity: str) -> float:
    units = {"Ki": 2**-20, "Mi": 2**-10, "Gi": 1, "Ti": 2**10, "k": 1e3 / 2**30,
             "M": 1e6 / 2**30, "G": 1e9 / 2**30, "T": 1e12 / 2**30, "m": 1e-3 / 2**30, "": 1 / 2**30}
    number, unit = re.match(r"^([0-9]+(?:\.[0-9]+)?)([^0-9]*)$", quantity).groups()
    return float(number) * units[unit]


def _cores(quantity: str) -> float:
    return _gib(quantity) * 2**30


def load_endpoint(env: str, written: str, root: Path, field: str = "endpoints",
                  **served: Any) -> EndpointSpec:
    """Read the file `written` (in cdk.json's `field`) under the repository `root`, strictly
    (`config.files`); `served` as `parse_endpoint`'s instance type arguments."""
    text, rel = read_repository_file(env, field, written, root)
    return parse_endpoint(env, rel, load_yaml_document(env, rel, text), root=root, **served)
