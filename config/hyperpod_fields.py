"""Every field of HyperPod's `InferenceEndpointConfig` v1 and what this project does with it.

One table drives three things: the reader in `config/endpoint_spec.py` (a field marked IGNORED
becomes one synth warning naming it, a field in no row is a typo and an error), the table in
docs/serving.md (a test keeps them equal) and a test that every path of the published CRD
(aws/sagemaker-hyperpod-cli, `inference.sagemaker.aws.amazon.com_inferenceendpointconfigs.yaml`)
falls under a row. A row covers its path and everything beneath it; list indices are `[]`.
"""
from __future__ import annotations

from dataclasses import dataclass

USED = "used"
IGNORED = "ignored (warning)"


@dataclass(frozen=True)
class Field:
    path: str
    handling: str       # USED or IGNORED
    what: str           # what happens, in one sentence (docs and warnings say the same)


_ROWS = (
    Field("apiVersion", USED, "must be inference.sagemaker.aws.amazon.com/v1"),
    Field("kind", USED, "must be InferenceEndpointConfig"),
    Field("metadata.name", USED, "names the workers, router and Services (a DNS label)"),
    Field("metadata.namespace", IGNORED, "endpoints deploy to the kvcache-serving namespace; "
          "URLs in the file must use fully qualified service names"),
    Field("metadata.labels", IGNORED, "objects carry the standard app.kubernetes.io labels"),
    Field("metadata.annotations", IGNORED, "not copied to the rendered objects"),
    Field("spec.endpointName", IGNORED, "no SageMaker endpoint is registered: clients call the "
          "router's load balancer"),
    Field("spec.modelName", USED, "vLLM --served-model-name (unless the args set it) and the "
          "model_name label of metrics and autoscaling queries"),
    Field("spec.modelVersion", IGNORED, "no model registry: the weights under modelLocation "
          "are served"),
    Field("spec.instanceType", USED, "the GPU node group the workers run on (ml. prefix "
          "dropped; the environment's instanceTypeMap may serve it on another type); GPU, "
          "CPU and memory defaults follow the served type"),
    Field("spec.instanceTypes", USED, "used only without instanceType: the first type one of "
          "the environment's GPU node groups has"),
    Field("spec.replicas", USED, "worker replicas: without autoScalingSpec exactly that many, "
          "no autoscaler (as on HyperPod); the L2 and its cost are sized for them"),
    Field("spec.InitialReplicaCount", IGNORED, "replicas (or autoScalingSpec) sets the count"),
    Field("spec.invocationEndpoint", IGNORED, "the router serves vLLM's OpenAI API "
          "(/v1/chat/completions, /v1/completions, ...) on its load balancer"),
    Field("spec.maxDeployTimeInSeconds", IGNORED, "the workers' startup probe allows 30 "
          "minutes to load weights"),
    Field("spec.tags", IGNORED, "AWS tags come from the environment's tags"),
    Field("spec.dataCapture", IGNORED, "no request/response capture"),
    Field("spec.dnsConfig", IGNORED, "no Route 53 record is made: use the load balancer's "
          "name or point your own record at it"),
    Field("spec.nodeAffinity", IGNORED, "workers are placed by the GPU node group's labels "
          "and taint"),
    Field("spec.pdSpec", IGNORED, "no disaggregated prefill/decode: every worker does both"),
    Field("spec.kubernetes", IGNORED, "the file's initContainers, volumes, serviceAccountName "
          "and schedulerName are not rendered: weights are staged from the model bucket, the "
          "worker service account is ours (Pod Identity)"),
    # Model source
    Field("spec.modelSourceConfig.modelSourceType", USED, "s3: staged from the environment's "
          "model bucket; fsx, huggingface and kubernetesVolume are staged from the model "
          "bucket too (with a warning): upload the weights with `python -m tools upload-model`"),
    Field("spec.modelSourceConfig.modelLocation", USED, "the key prefix under the model "
          "bucket (default: the endpoint's name)"),
    Field("spec.modelSourceConfig.s3Storage", IGNORED, "bucketName and region: the "
          "environment's own model bucket in its region is used"),
    Field("spec.modelSourceConfig.fsxStorage", IGNORED, "FSx for Lustre is not mounted"),
    Field("spec.modelSourceConfig.huggingFaceModel", IGNORED, "the Hugging Face Hub is not "
          "reached (it is not in China); the token secret is not read"),
    Field("spec.modelSourceConfig.prefetchEnabled", IGNORED, "weights are always staged "
          "before vLLM starts"),
    # KV cache
    Field("spec.kvCacheSpec.enableL1Cache", USED, "LMCache local_cpu (L1 in the worker's CPU "
          "memory)"),
    Field("spec.kvCacheSpec.l1CacheSizeGiB", USED, "this project's extension: "
          "the worker's whole L1, split over its GPU processes into max_local_cpu_size "
          "(default: the memory vLLM and /dev/shm leave)"),
    Field("spec.kvCacheSpec.enableL2Cache", USED, "LMCache remote_url (L2 shared by workers), "
          "where a read from it can beat recomputing on the instance type's GPU and the worker "
          "image's vLLM and LMCache report a failed L2 read (otherwise not deployed, with a "
          "warning: docs/serving.md)"),
    Field("spec.kvCacheSpec.forceL2Cache", USED, "this project's extension: true deploys the "
          "L2 even where reading from it is slower than recomputing (refused for an image "
          "that cannot report a failed L2 read)"),
    Field("spec.kvCacheSpec.prefixTokens", USED, "this project's extension: the prompt prefix "
          "(tokens) an L2 hit saves, which the L2 verdict judges at (default 8192)"),
    Field("spec.kvCacheSpec.workingSetTokens", USED, "this project's extension: the distinct "
          "prompt tokens clients come back to (documents, system prompts, chat histories, and "
          "what one-time prompts write between two uses of them); the L2 is sized to hold "
          "them plus the fleet's GPU KV and L1s (default: twice the fleet's GPU KV and L1s)"),
    Field("spec.kvCacheSpec.modelShape", USED, "this project's extension: the model's shape "
          "for the L2 verdict: its config.json keys, the repository path of a copy of its "
          "config.json, or a known model's name (default: the config.json upload-model "
          "recorded at models/<modelLocation>/config.json, else the shape modelName names)"),
    Field("spec.kvCacheSpec.l2CacheSpec.l2CacheBackend", USED, "redis: the environment's "
          "cache (ElastiCache over TLS, or the in-cluster Valkey); tieredstorage: the "
          "in-cluster Valkey; also valkey and lmcache-server (this project's names; "
          "lmcache-server is served by Valkey too)"),
    Field("spec.kvCacheSpec.l2CacheSpec.l2CacheLocalUrl", USED, "the endpoint's own L2 "
          "(redis://, rediss:// or lm://, no credentials), in place of the environment's "
          "cache, with the same socket timeouts and bounded lookups"),
    Field("spec.kvCacheSpec.cacheConfigFile", IGNORED, "LMCache's settings are rendered into "
          "a ConfigMap (docs/serving.md)"),
    # Routing and scaling
    Field("spec.intelligentRoutingSpec.enabled", USED, "false: roundrobin"),
    Field("spec.intelligentRoutingSpec.routingStrategy", USED, "prefixaware -> cache_aware, "
          "kvaware -> kv_aware, session -> consistent_hash, roundrobin -> round_robin"),
    Field("spec.intelligentRoutingSpec.autoScalingSpec", USED, "as spec.autoScalingSpec"),
    Field("spec.autoScalingSpec", USED, "a KEDA ScaledObject (min/max replicas, polling, "
          "cooldowns, stabilization, Prometheus triggers; without one, waiting requests per "
          "worker); the L2 and its cost are sized for maxReplicaCount"),
    Field("spec.autoScalingSpec.prometheusTrigger.serverAddress", IGNORED, "the environment's "
          "AMP workspace or in-cluster Prometheus is queried"),
    Field("spec.autoScalingSpec.prometheusTrigger.namespace", IGNORED, "as serverAddress"),
    Field("spec.autoScalingSpec.prometheusTrigger.customHeaders", IGNORED, "as serverAddress"),
    Field("spec.autoScalingSpec.prometheusTrigger.useCachedMetrics", IGNORED,
          "KEDA's default applies"),
    Field("spec.autoScalingSpec.prometheusTriggerList[].serverAddress", IGNORED,
          "as prometheusTrigger"),
    Field("spec.autoScalingSpec.prometheusTriggerList[].namespace", IGNORED,
          "as prometheusTrigger"),
    Field("spec.autoScalingSpec.prometheusTriggerList[].customHeaders", IGNORED,
          "as prometheusTrigger"),
    Field("spec.autoScalingSpec.prometheusTriggerList[].useCachedMetrics", IGNORED,
          "as prometheusTrigger"),
    Field("spec.autoScalingSpec.cloudWatchTrigger", IGNORED, "worker metrics live in AMP or "
          "the in-cluster Prometheus (China has no AMP): the default trigger on waiting "
          "requests applies instead"),
    Field("spec.autoScalingSpec.cloudWatchTriggerList", IGNORED, "as cloudWatchTrigger"),
    # Metrics and load balancer
    Field("spec.metrics.enabled", USED, "false: the workers are not scraped"),
    Field("spec.metrics.modelMetrics.port", USED, "must be the worker port: vLLM serves "
          "/metrics there (another port is a warning)"),
    Field("spec.metrics.modelMetrics.path", USED, "/metrics is scraped (another path is a "
          "warning)"),
    Field("spec.metrics.metricsScrapeIntervalSeconds", IGNORED, "scraped every 15 s"),
    Field("spec.loadBalancer.healthCheckPath", USED, "the workers' probes and the router's "
          "health checks"),
    Field("spec.loadBalancer.routingAlgorithm", IGNORED, "the router, not the load balancer, "
          "picks workers"),
    Field("spec.tlsConfig.customCertificateConfig.acmArn", USED, "the certificate of the "
          "router load balancer's TLS listener where it is the environment's account and "
          "region; otherwise the environment's listener.certificateArn serves (a warning)"),
    Field("spec.tlsConfig.customCertificateConfig.domainName", IGNORED, "no DNS record: point "
          "the certificate's name at the load balancer"),
    Field("spec.tlsConfig.tlsCertificateOutputS3Uri", USED, "the router's front serves HTTPS "
          "with a certificate made in the cluster at deploy (its key only in a Kubernetes "
          "Secret, renewed before expiry); the certificate (public part) is written there for "
          "clients to trust, as HyperPod does. Without the field the same happens, unless the "
          "environment turns it off (listener.generatedCertificate: false) or an ACM "
          "certificate serves"),
    # Worker
    Field("spec.worker.image", USED, "the worker image as written (a vLLM image carrying "
          "LMCache); in China and with useEcrImages, its copy in the account's ECR "
          "(kvcache/<source path>:<tag>)"),
    Field("spec.worker.command", USED, "the container command, as written"),
    Field("spec.worker.args", USED, "vLLM's arguments, as written; --host, --port, "
          "--served-model-name and the LMCache connector are added only where absent"),
    Field("spec.worker.environmentVariables", USED, "passed through (value or valueFrom)"),
    Field("spec.worker.resources.requests", USED, "nvidia.com/gpu, cpu and memory (defaults "
          "from the instance type)"),
    Field("spec.worker.resources.limits", USED, "nvidia.com/gpu; memory is limited to the "
          "request"),
    Field("spec.worker.resources.claims", IGNORED, "dynamic resource claims are not rendered"),
    Field("spec.worker.modelInvocationPort.containerPort", USED, "the port vLLM listens on; "
          "the router and Prometheus reach the workers there"),
    Field("spec.worker.modelInvocationPort.name", IGNORED, "the port is named http"),
    Field("spec.worker.modelVolumeMount.mountPath", USED, "where the staged weights are "
          "mounted (read-only), so --model /opt/ml/model works as written"),
    Field("spec.worker.modelVolumeMount.name", IGNORED, "the volume is named model-weights"),
    Field("spec.worker.workingDir", USED, "the container's working directory"),
    Field("spec.worker.probes", IGNORED, "startup, readiness and liveness probes on "
          "healthCheckPath are rendered"),
    Field("spec.worker.requestLimits", USED, "a sidecar (HAProxy) in each worker pod lets "
          "maxConcurrentRequests inference requests run and maxQueueSize wait; the next gets "
          "overflowStatusCode (default 429) at once. The routers try once more, pass the status "
          "on and keep the worker in rotation"),
    Field("spec.lmcache", USED, "mode InProcess (default): LMCache inside vLLM; MultiProcess: "
          "an LMCache server (`lmcache server`, LMCache >= 0.5.0, refused for older images) "
          "beside vLLM in the worker pod holds L1; the L2 is the same"),
    Field("spec.kvCacheSpec.lmcache", USED, "as spec.lmcache"),
)

FIELDS: dict[str, Field] = {f.path: f for f in _ROWS}


def field_for(path: str) -> Field | None:
    """The row covering `path` (indices written as `[]`): itself or its nearest ancestor."""
    probe = path
    while probe:
        for candidate in (probe, probe.removesuffix("[]")):
            if candidate in FIELDS:
                return FIELDS[candidate]
        probe = probe.rpartition(".")[0]
    return None


def ignored(path: str) -> Field | None:
    """The IGNORED row of exactly `path` (autoScalingSpec under intelligentRoutingSpec reads as
    the spec-level one)."""
    row = FIELDS.get(path.replace(_ROUTING_SCALING, "spec.autoScalingSpec", 1))
    return row if row is not None and row.handling == IGNORED else None


_ROUTING_SCALING = "spec.intelligentRoutingSpec.autoScalingSpec"


def markdown_table() -> str:
    """The docs/serving.md table, generated here so the two cannot disagree."""
    lines = ["| HyperPod field | handling | what this project does |", "|---|---|---|"]
    lines += [f"| `{f.path}` | {f.handling} | {f.what} |" for f in _ROWS]
    return "\n".join(lines)
