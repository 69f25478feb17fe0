"""Names both sides must agree on: the CDK node groups and the cdk8s charts import these.

Two copies of a label or a taint drift apart; one constant cannot.
"""
from __future__ import annotations

APP_NAME = "kvcache"

# Node groups (CDK) <-> scheduling (cdk8s)
NODE_ROLE_LABEL = "kvcache.io/node-role"
NODE_ROLE_SYSTEM = "system"
NODE_ROLE_GPU = "gpu"
NODE_ROLE_CACHE = "cache"          # the in-cluster L2's own node (stacks/cache_stack.py)
CACHE_NODE_GROUP = "l2cache"
CACHE_TAINT_KEY = "kvcache.io/l2-cache"
NODE_GROUP_LABEL = "kvcache.io/node-group"
GPU_TAINT_KEY = "nvidia.com/gpu"
GPU_TAINT_VALUE = "present"
GPU_RESOURCE = "nvidia.com/gpu"
# On AL2023 NVIDIA nodes, which lack a device plugin (Bottlerocket NVIDIA ships one)
DEVICE_PLUGIN_LABEL = "kvcache.io/nvidia-device-plugin"
# Cluster Autoscaler's AWS provider (cloudprovider/aws/aws_cloud_provider.go GPULabel): a node
# still starting that carries it will have GPUs, so pending GPU pods wait for it instead of
# causing a second scale-up (kubernetes/autoscaler#1949, #3164). CA reads a node group's labels
# from the node template: ASG tags under this prefix, and for EKS managed node groups the
# labels of eks:DescribeNodegroup (cloudprovider/aws/aws_manager.go buildNodeFromTemplate).
ACCELERATOR_LABEL = "k8s.amazonaws.com/accelerator"
CA_NODE_TEMPLATE_LABEL = "k8s.io/cluster-autoscaler/node-template/label/"
# what a node of the group offers before one exists (CA reads it from the node group's tags)
CA_NODE_TEMPLATE_RESOURCE = "k8s.io/cluster-autoscaler/node-template/resources/"

# Namespaces
SERVING_NAMESPACE = "kvcache-serving"
SYSTEM_NAMESPACE = "kube-system"
MONITORING_NAMESPACE = "kvcache-monitoring"
KEDA_NAMESPACE = "keda"

# Ports
WORKER_PORT = 8000            # vLLM's OpenAI server
ROUTER_PORT = 8000            # the router pod's client port (its front), and the Service
ROUTER_BACKEND_PORT = 8001    # the router binary itself, on 127.0.0.1 behind the front
ROUTER_METRICS_PORT = 29000   # vllm-router --prometheus-port
KV_EVENTS_PORT = 5557         # vLLM's ZMQ KV event publisher
# A worker's request-limit sidecar (HyperPod `worker.requestLimits`): the router's way in
WORKER_LIMITS_PORT = 8090
# The request-limit sidecar's second port, for the team's inference gateway: it answers a full
# worker with the file's overflowStatusCode itself (nothing of ours sits between).
WORKER_LIMITS_GATEWAY_PORT = 8091
# What the sidecar answers a router for a full worker: a status neither pinned router retries
# (measured: 429 and 503 are retried after 2.5 s, 420 passes at once), which the router pod's
# front turns into the file's overflowStatusCode with Retry-After (k8s/router_front.py).
ROUTER_OVERFLOW_STATUS = 420
LMCACHE_SERVER_PORT = 5555    # `lmcache server` in the worker pod (lmcache.mode MultiProcess)
LMCACHE_SERVER_HTTP_PORT = 8091
KV_EVENTS_REPLAY_PORT = 5558
CACHE_PORT = 6379             # Valkey/Redis, managed or self-hosted
# The longest a request may take end to end (the router's --request-timeout-secs): what a
# router pod's drain and a worker's drain (vLLM --shutdown-timeout) must both cover, so a
# rollout or a scale-down ends no request that was accepted (docs/runbook.md, "Rollouts").
LONGEST_REQUEST_S = 600
# How long a router pod's front keeps serving after its NLB target starts deregistering
# (`listener.deregistrationWaitSeconds`, k8s/router_front.py): an NLB keeps sending new
# connections for about two minutes (measured; docs/runbook.md), so at least that.
DEREGISTER_S_DEFAULT, DEREGISTER_S_MIN, DEREGISTER_S_MAX = 150, 120, 900
# The in-cluster L2 (Valkey): its StatefulSet and Service; the cache-down alert selects it
SHARED_CACHE_NAME = "kvcache-valkey"
REDIS_EXPORTER_PORT = 9121    # redis_exporter beside the self-hosted Valkey (its metrics port)

# The in-cluster Prometheus (China, self-hosted observability) that KEDA queries
MONITORING_RELEASE = "kvcache"   # kube-prometheus-stack release and fullnameOverride
PROMETHEUS_PORT = 9090
IN_CLUSTER_PROMETHEUS_URL = (f"http://{MONITORING_RELEASE}-prometheus.{MONITORING_NAMESPACE}"
                             f".svc.cluster.local:{PROMETHEUS_PORT}")

# Router implementations and the HyperPod strategies each runs (their --help): sglang-router
# has no KV event index (kvaware) and no session-key hashing (session).
ROUTER_STRATEGIES = {
    "vllm-router": ("prefixaware", "kvaware", "session", "roundrobin"),
    "sglang-router": ("prefixaware", "roundrobin"),
}
# The implementation a strategy gets unless the environment's `routerImplementations` says
# otherwise: the measured winner (docs/benchmarks.md: sglang-router's cache_aware keeps its
# prefix tree in the router and calls no worker per request; vllm-router's renders on every
# worker first). vllm-router for every other strategy.
DEFAULT_ROUTER = {"prefixaware": "sglang-router"}


def default_router(strategy: str) -> str:
    return DEFAULT_ROUTER.get(strategy, "vllm-router")


# Session affinity for the `session` strategy (vllm-router consistent_hash reads it first)
SESSION_HEADER = "X-Session-ID"

# Standard labels; the router selects workers by these
LABEL_NAME = "app.kubernetes.io/name"
LABEL_INSTANCE = "app.kubernetes.io/instance"
LABEL_COMPONENT = "app.kubernetes.io/component"
LABEL_PART_OF = "app.kubernetes.io/part-of"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"

# How long a pod may wait for a node: the cluster autoscaler notices it (10 s scan), EC2
# launches, the node joins and pulls images. Helm releases that wait for their pods get
# HELM_TIMEOUT_MINUTES, above this and inside the kubectl handler Lambda's 15 minutes (chart
# pull and an atomic rollback included); the kvaware router waits this long for a worker on
# top of the worker's own startup window.
NODE_START_MINUTES = 10
HELM_TIMEOUT_MINUTES = 12


# Disaggregated prefill/decode (k8s/pd.py, k8s/workers.py, k8s/router.py)
PD_ROLE_LABEL = "kvcache.io/pd-role"   # prefill | decode, on the pods of a P/D endpoint
NIXL_SIDE_CHANNEL_PORT = 5600          # vLLM's VLLM_NIXL_SIDE_CHANNEL_PORT default, one engine a pod
EFA_RESOURCE = "vpc.amazonaws.com/efa"  # the EFA device plugin's resource
EFA_NODE_LABEL = "kvcache.io/efa"      # "true" on the nodes of GPU node groups with efa: true
