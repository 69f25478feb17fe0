"""Every field of HyperPod's `InferenceEndpointConfig` v1 and what this project does with it.

One table drives three things: the reader in `config/endpoint_spec.py` (a field marked IGNORED
becomes one synth warning naming it, a field in no row is a typo and an error), the table in
docs/serving.md (a test keeps them equal) and a test that every path of the published CRD
(aws/sagemaker-hyperpod-cli, `inference.sagemaker.aws.amazon.com_inferenceendpointconfigs.yaml`)
falls under a row (tests/fixtures/hyperpod/README.md: chart 2.2.2's and today's, v3.7). A
row covers its path and everything beneath it; list indices are `[]`.
"""
from __future__ import annotations

from dataclasses import dataclass

# The operator release whose CRD the table follows (tests/fixtures/hyperpod/FIELDS-2.7.0.txt):
# a field a later operator adds is refused until a row reads it, and the refusal says so.
OPERATOR_VERSION, OPERATOR_CHART = "v3.7", "2.7.0"
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
    Field("spec.maxDeployTimeInSeconds", USED, "the workers' startup budget: their startup "
          "probe gives vLLM that long to load weights and start (default 1800 s here; HyperPod's "
          "3600 s bounds its whole deployment)"),
    Field("spec.tags", IGNORED, "AWS tags come from the environment's tags"),
    Field("spec.dataCapture", USED, "refused where a tier is enabled: requests and answers "
          "are not captured (prompts are customer data; the router front logs no bodies); "
          "capture in your client, or disable the tiers (enabled: false is accepted)"),
    Field("spec.dnsConfig", USED, "a Route 53 CNAME to the router's load balancer in that "
          "hosted zone, which the environment must name (hostedZones; a warning otherwise); "
          "named customCertificateConfig.domainName, else <endpoint>.<zone>"),
    Field("spec.nodeAffinity", USED, "added to the workers' placement on their GPU node "
          "group (ml. instance types read as instanceType is); a required term no node group "
          "of the environment satisfies is an error at synth, not a Pending pod"),
    Field("spec.tolerations", USED, "added to the workers' own GPU toleration; one that "
          "matches no node group's taint is a warning"),
    Field("spec.inferenceGateway.enabled", USED, "an InferencePool, an endpoint picker and "
          "an HTTPRoute to the environment's `inferenceGateway.gateway` (a Gateway API gateway "
          "the team runs), beside the router and its load balancer (docs/gateway.md); refused "
          "where the environment names no gateway"),
    Field("spec.modelCacheConfig", IGNORED, "images are pulled per node (IfNotPresent) and "
          "weights staged per pod from the model bucket: no node-level image or weights cache"),
    Field("spec.kubernetes.initContainers", USED, "run after ours (weights staged first), "
          "under the workers' pod security: a privileged, root or escalating container is "
          "refused, naming it; one that loads the model volume is replaced by our staging"),
    Field("spec.kubernetes.volumes", USED, "added to the worker pod; a hostPath volume (which "
          "the restricted pod security standard refuses) becomes an emptyDir, with a warning; "
          "one named as the model volume is ours"),
    Field("spec.kubernetes.serviceAccountName", USED, "the name of the workers' service "
          "account, which Pod Identity binds to the worker role (model bucket read)"),
    Field("spec.kubernetes.podTemplateAnnotations", USED, "on the worker pod template; where "
          "one collides with ours, ours wins (a warning names it)"),
    Field("spec.kubernetes.schedulerName", IGNORED, "the default scheduler places workers "
          "(the cluster autoscaler plans for it)"),
    # Disaggregated prefill/decode (k8s/pd.py decides where it pays; otherwise colocated)
    Field("spec.pdSpec", USED, "prefill and decode Deployments with vLLM's NixlConnector "
          "(LIBFABRIC over EFA) behind vllm-router's P/D mode, where the model class, the "
          "instance type's GPU-direct EFA in the region, the KV handoff against the prefill at "
          "kvCacheSpec.prefixTokens and the worker image's NIXL and libfabric allow it; "
          "otherwise every worker does both, with one warning naming the failing term "
          "(docs/serving.md, 'Disaggregated prefill and decode')"),
    *(f for key, role in (("prefillSpec", "prefill"), ("decodingSpec", "decode")) for f in (
        Field(f"spec.pdSpec.{key}.replicas", USED, f"{role} workers (default 1); without "
              f"{role} autoscaling exactly that many"),
        Field(f"spec.pdSpec.{key}.args", USED, f"appended after worker.args; a flag given here "
              f"replaces the shared one (with its value) on {role} workers"),
        Field(f"spec.pdSpec.{key}.resources.requests", USED, "nvidia.com/gpu (a divisor of the "
              "node's GPUs), cpu and memory (default: the worker's, or the node's share); "
              "vpc.amazonaws.com/efa is added from the instance type"),
        Field(f"spec.pdSpec.{key}.resources.limits", USED, "nvidia.com/gpu; memory is limited "
              "to the request"),
        Field(f"spec.pdSpec.{key}.resources.claims", IGNORED, "dynamic resource claims are "
              "not rendered"),
        Field(f"spec.pdSpec.{key}.nodeSelector", USED, f"added to the {role} pods' node "
              "selector (beside the GPU node group's labels)"),
    )),
    Field("spec.pdSpec.routingThreshold", USED, "requests whose body is at least 4 bytes per "
          "token of it (default 4096 tokens: 16 KiB) go prefill then decode; shorter ones go "
          "to a decode worker alone, which prefills locally; 0: every request is disaggregated "
          "(docs/serving.md says how the estimate errs)"),
    Field("spec.pdSpec.topologySpec.sameAZ", USED, "true (default): prefill pods are "
          "scheduled in the zone of decode pods (required pod affinity on "
          "topology.kubernetes.io/zone)"),
    Field("spec.pdSpec.topologySpec.availabilityZone", USED, "both roles' node selector on "
          "topology.kubernetes.io/zone"),
    Field("spec.pdSpec.topologySpec.placementGroup", IGNORED, "the environment's EFA node "
          "group has its own cluster placement group (CDK owns it)"),
    Field("spec.pdSpec.forceDisaggregation", USED, "this project's extension: true renders "
          "P/D where the model class or the handoff cost says it does not pay (never where "
          "the network or the image cannot carry it)"),
    *(f for role in ("prefillAutoScaling", "decodingAutoScaling") for f in (
        Field(f"spec.pdSpec.autoScalingSpec.{role}", USED, "as spec.autoScalingSpec, a KEDA "
              f"ScaledObject for the {role.removesuffix('AutoScaling').replace('decoding', 'decode')}"
              " Deployment (default trigger: its waiting requests)"),
        *(Field(f"spec.pdSpec.autoScalingSpec.{role}.{sub}", IGNORED, "as in "
                "spec.autoScalingSpec") for sub in (
            "prometheusTrigger.serverAddress", "prometheusTrigger.namespace",
            "prometheusTrigger.customHeaders", "prometheusTrigger.useCachedMetrics",
            "prometheusTriggerList[].serverAddress", "prometheusTriggerList[].namespace",
            "prometheusTriggerList[].customHeaders", "prometheusTriggerList[].useCachedMetrics",
            "cloudWatchTrigger", "cloudWatchTriggerList")),
    )),
    # Model source
    Field("spec.modelSourceConfig.modelSourceType", USED, "s3: staged from the environment's "
          "model bucket; fsx, huggingface and kubernetesVolume are staged from the model "
          "bucket too (with a warning): upload the weights with `python -m tools upload-model`"),
    Field("spec.modelSourceConfig.modelLocation", USED, "the key prefix under the model "
          "bucket (default: the endpoint's name)"),
    Field("spec.modelSourceConfig.s3Storage", IGNORED, "bucketName and region: the "
          "environment's own model bucket in its region is used"),
    Field("spec.modelSourceConfig.fsxStorage", IGNORED, "FSx for Lustre is not mounted"),
    Field("spec.modelSourceConfig.huggingFaceModel", USED, "global regions: staged from the "
          "Hub before vLLM starts (modelId at commitSHA, else main), with the token from the "
          "environment's Secrets Manager secret where tokenSecretRef is set; China (no Hub): "
          "staged from the model bucket, put there with python -m tools upload-model"),
    Field("spec.modelSourceConfig.prefetchEnabled", USED, "true or false, the weights are "
          "staged to the pod's local disk before vLLM starts (prefetch's effect: no load from "
          "a remote mount), and vLLM reads them from there"),
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
    Field("spec.autoScalingSpec.cloudWatchTrigger", USED, "a KEDA aws-cloudwatch trigger "
          "in the environment's region, read as the KEDA operator's Pod Identity "
          "(cloudwatch:GetMetricData); beside the Prometheus triggers (KEDA scales to the "
          "largest)"),
    Field("spec.autoScalingSpec.cloudWatchTriggerList", USED, "as cloudWatchTrigger, one "
          "trigger each (it wins over cloudWatchTrigger, as on HyperPod)"),
    # Metrics and load balancer
    Field("spec.metrics.enabled", USED, "false: the workers are not scraped"),
    Field("spec.metrics.modelMetrics.port", USED, "must be the worker port: vLLM serves "
          "/metrics there (another port is a warning)"),
    Field("spec.metrics.modelMetrics.path", USED, "/metrics is scraped (another path is a "
          "warning)"),
    Field("spec.metrics.metricsScrapeIntervalSeconds", USED, "how often Prometheus scrapes "
          "the endpoint's workers and router (default 15 s); series keep their usual job "
          "label"),
    Field("spec.loadBalancer.healthCheckPath", USED, "the workers' probes and the router's "
          "health checks"),
    Field("spec.loadBalancer.idleTimeoutSeconds", IGNORED, "the router's network load "
          "balancer keeps idle TCP connections 350 s; the router bounds each request"),
    Field("spec.loadBalancer.routingAlgorithm", IGNORED, "the router, not the load balancer, "
          "picks workers"),
    Field("spec.tlsConfig.customCertificateConfig.acmArn", USED, "the certificate of the "
          "router load balancer's TLS listener where it is the environment's account and "
          "region; otherwise the environment's listener.certificateArn serves (a warning)"),
    Field("spec.tlsConfig.customCertificateConfig.domainName", USED, "the name of the "
          "dnsConfig record (without dnsConfig: point it at the load balancer yourself)"),
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
          "overflowStatusCode (default 429) at once, through the routers (no retry) and through "
          "the gateway, and the worker stays in rotation; one client address holds at most "
          "half the slots"),
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
    row = FIELDS.get(path)
    if row is None and path.startswith(_ROUTING_SCALING):
        row = FIELDS.get(path.replace(_ROUTING_SCALING, "spec.autoScalingSpec", 1))
    return row if row is not None and row.handling == IGNORED else None


_ROUTING_SCALING = "spec.intelligentRoutingSpec.autoScalingSpec"


def markdown_table() -> str:
    """The docs/serving.md table, generated here so the two cannot disagree."""
    lines = ["| HyperPod field | handling | what this project does |", "|---|---|---|"]
    lines += [f"| `{f.path}` | {f.handling} | {f.what} |" for f in _ROWS]
    return "\n".join(lines)
