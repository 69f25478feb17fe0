"""The self-hosted L2 cache in the cluster, shared by an environment's workers: Valkey.

Valkey runs as a pure cache: no persistence, a `maxmemory` bound and `allkeys-lru` eviction
(LMCache sets no TTL, so only an all-keys policy ever evicts). LMCache's own `lm://` server is
not run: it has no eviction and serializes lookups behind writes (k8s/workers.py TIER_POLICY).
Only worker pods may connect (the flows below become NetworkPolicies in
k8s/network_policies.py).

Where it lands: a node of its own (the `l2cache` node group stacks/cache_stack.py adds, tainted
for it), of the type k8s/l2.py chose so that the L2 pays: the node's sustained network is what
a cache read all day long gets, and Valkey 9 moves large values with its io-threads. Its
memory is most of the node's: `maxmemory` is 90% of the container's, the rest Valkey's buffers
(DATA_SHARE says why that is enough). LMCache reaches it by `resp://` where the image's LMCache has it: plain TCP,
no AUTH, which only worker pods may open (the NetworkPolicy below; docs/security.md).
"""
from __future__ import annotations

from dataclasses import dataclass

from cdk8s import Chart
from constructs import Construct

from config.contracts import (
    CACHE_NODE_GROUP, CACHE_PORT, CACHE_TAINT_KEY, LABEL_NAME, NODE_GROUP_LABEL,
    NODE_ROLE_CACHE, NODE_ROLE_LABEL, REDIS_EXPORTER_PORT, SHARED_CACHE_NAME,
)
from k8s.flows import PROMETHEUS, Flow, Peer
from k8s.objects import (
    hardened, k8s_object, pdb, pod_security, selector_labels, standard_labels,
)
from k8s.workers import COMPONENT as WORKER_COMPONENT

VALKEY = "valkey"
# Not the image's own user (999): a UID no host account has (checkov CKV_K8S_40). Valkey
# writes nothing (no persistence, read-only root), so it needs no file the image's user owns;
# tests/k8s/test_valkey_exporter.py starts the rendered arguments as this UID.
VALKEY_UID = 10999
EVICTION_POLICY = "allkeys-lru"
# maxmemory, of the container's memory. What Valkey holds beyond `used_memory` (which maxmemory
# bounds): client buffers (a chunk in flight per connection: LMCache's 8 per rank, ~10 MiB
# each, about 1 GiB for 16 ranks) and what jemalloc keeps. No fork needs room (no persistence,
# no replica). And for KV chunks used_memory over-counts what is resident: it counts each
# value's size class (10 MiB for an 8 MiB chunk: k8s/l2.py valkey_value_bytes) of which only
# the pages written are: RSS was 0.82x used_memory under allkeys-lru churn of 8 and 10 MiB
# values (Redis 7, jemalloc 5.3). 10% of a cache node's container is tens of GiB.
DATA_SHARE = 0.9


# What the node keeps for itself and its DaemonSets (kubelet reserve, eviction threshold,
# aws-node, kube-proxy, node exporter): the rest is Valkey's.
NODE_KEEP_CPUS = 2
NODE_KEEP_SHARE = 0.12


@dataclass(frozen=True)
class CacheProps:
    namespace: str
    image: str
    kind: str = VALKEY
    memory_gib: int = 6
    cpu: str = "1"
    io_threads: int = 1
    exporter_image: str | None = None   # redis_exporter sidecar

    @classmethod
    def on_node(cls, namespace: str, image: str, vcpus: int, node_gib: float,
                io_threads: int, exporter_image: str | None = None) -> "CacheProps":
        """Valkey sized to the node it has to itself."""
        return cls(namespace=namespace, image=image, cpu=str(max(1, vcpus - NODE_KEEP_CPUS)),
                   memory_gib=container_gib(node_gib),
                   io_threads=io_threads, exporter_image=exporter_image)

    @property
    def url(self) -> str:
        return f"redis://{SHARED_CACHE_NAME}.{self.namespace}.svc.cluster.local:{CACHE_PORT}"

    @property
    def maxmemory_mib(self) -> int:
        return maxmemory_mib(self.memory_gib)


def container_gib(node_gib: float) -> int:
    """The Valkey container's memory on a node of its own."""
    return int(node_gib * (1 - NODE_KEEP_SHARE)) - 2


def maxmemory_mib(container: float) -> int:
    return int(container * 1024 * DATA_SHARE)


class SharedCacheChart(Chart):
    def __init__(self, scope: Construct, id: str, *, props: CacheProps) -> None:
        super().__init__(scope, id, namespace=props.namespace)
        p, name = props, SHARED_CACHE_NAME
        if p.kind != VALKEY:
            raise ValueError(f"the in-cluster L2 is Valkey, not {p.kind}")
        sel = selector_labels(p.kind, "shared")
        labels = standard_labels(p.kind, "shared")
        probe = {"tcpSocket": {"port": "cache"}, "periodSeconds": 10}
        memory = f"{p.memory_gib}Gi"
        container = {
            "name": "valkey", "image": p.image, "imagePullPolicy": "IfNotPresent",
            "args": ["valkey-server", "--port", str(CACHE_PORT), "--save", "",
                     "--appendonly", "no", "--maxmemory", f"{p.maxmemory_mib}mb",
                     "--maxmemory-policy", EVICTION_POLICY, "--protected-mode", "no",
                     "--io-threads", str(p.io_threads)],
            "securityContext": hardened(read_only_root=True, run_as_user=VALKEY_UID),
            "ports": [{"name": "cache", "containerPort": CACHE_PORT}],
            # Limits at the requests: the node's own reserve stays the kubelet's and the
            # DaemonSets', and the limit never throttles Valkey, whose threads (main and
            # io-threads, at most half the vCPUs: k8s/l2.py) are fewer than the cores it gets.
            "resources": {"requests": {"cpu": p.cpu, "memory": memory},
                          "limits": {"cpu": p.cpu, "memory": memory}},
            "readinessProbe": probe, "livenessProbe": {**probe, "failureThreshold": 6},
        }
        containers = [container]
        ports = [{"name": "cache", "port": CACHE_PORT, "targetPort": "cache"}]
        if p.exporter_image:
            containers.append(_exporter(p.exporter_image, CACHE_PORT))
            ports.append({"name": "metrics", "port": REDIS_EXPORTER_PORT,
                          "targetPort": "metrics"})
        k8s_object(self, "StatefulSet", api_version="apps/v1", kind="StatefulSet", name=name,
                   namespace=p.namespace, labels=labels, body={"spec": {
                       "replicas": 1, "serviceName": name,
                       "selector": {"matchLabels": sel},
                       "template": {"metadata": {"labels": labels}, "spec": {
                           "automountServiceAccountToken": False,
                           "securityContext": pod_security(VALKEY_UID),
                           "nodeSelector": {NODE_ROLE_LABEL: NODE_ROLE_CACHE,
                                            NODE_GROUP_LABEL: CACHE_NODE_GROUP},
                           "tolerations": [{"key": CACHE_TAINT_KEY, "operator": "Exists",
                                            "effect": "NoSchedule"}],
                           "containers": containers}}}})
        pdb(self, name=name, namespace=p.namespace, labels=labels, selector=sel)
        k8s_object(self, "Service", api_version="v1", kind="Service", name=name,
                   namespace=p.namespace, labels=labels, body={"spec": {
                       "selector": sel, "ports": ports}})
        cache = Peer(name, p.namespace, sel)
        workers = Peer("all-workers", p.namespace, {LABEL_NAME: WORKER_COMPONENT})
        self.flows = (Flow(workers, cache, CACHE_PORT, "KV chunks from every endpoint's workers"),)
        if p.exporter_image:  # the redis_exporter sidecar, where it runs
            self.flows += (Flow(PROMETHEUS, cache, REDIS_EXPORTER_PORT, "cache metrics"),)


def _exporter(image: str, cache_port: int) -> dict:
    """redis_exporter in the Valkey pod: reads INFO over loopback, serves /metrics on
    REDIS_EXPORTER_PORT (scraped by the `kvcache-valkey` job). The image runs as 59000."""
    probe = {"httpGet": {"path": "/health", "port": "metrics"}, "periodSeconds": 10}
    return {
        "name": "redis-exporter", "image": image, "imagePullPolicy": "IfNotPresent",
        "args": [f"--redis.addr=redis://127.0.0.1:{cache_port}",
                 f"--web.listen-address=:{REDIS_EXPORTER_PORT}"],
        "ports": [{"name": "metrics", "containerPort": REDIS_EXPORTER_PORT}],
        "resources": {"requests": {"cpu": "50m", "memory": "32Mi"},
                      "limits": {"cpu": "200m", "memory": "128Mi"}},
        "readinessProbe": probe, "livenessProbe": {**probe, "failureThreshold": 6},
        "securityContext": hardened(read_only_root=True, run_as_user=59000),
    }
