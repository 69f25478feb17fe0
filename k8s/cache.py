"""Self-hosted L2 caches in the cluster, shared by an environment's workers.

Valkey runs as a pure cache (no persistence, LRU eviction); LMCache's own server backs the
`tieredstorage` -> `lmcache-server` mapping. Only worker pods may connect (NetworkPolicy;
enforced where the VPC CNI's network policy agent is on).
"""
from __future__ import annotations

from dataclasses import dataclass

from cdk8s import Chart
from constructs import Construct

from config.contracts import (
    CACHE_PORT, LABEL_NAME, LMCACHE_SERVER_PORT, MONITORING_NAMESPACE, NODE_ROLE_LABEL,
    NODE_ROLE_SYSTEM, REDIS_EXPORTER_PORT,
)
from k8s.objects import hardened, k8s_object, pdb, selector_labels, standard_labels
from k8s.workers import COMPONENT as WORKER_COMPONENT

VALKEY = "valkey"
LMCACHE_SERVER = "lmcache-server"


@dataclass(frozen=True)
class CacheProps:
    namespace: str
    kind: str                 # VALKEY or LMCACHE_SERVER
    image: str
    memory: str = "24Gi"
    cpu: str = "4"
    exporter_image: str | None = None   # redis_exporter sidecar (Valkey only)

    @property
    def url(self) -> str:
        host = f"kvcache-{self.kind}.{self.namespace}.svc.cluster.local"
        return (f"redis://{host}:{CACHE_PORT}" if self.kind == VALKEY
                else f"lm://{host}:{LMCACHE_SERVER_PORT}")


class SharedCacheChart(Chart):
    def __init__(self, scope: Construct, id: str, *, props: CacheProps) -> None:
        super().__init__(scope, id, namespace=props.namespace)
        p, name = props, f"kvcache-{props.kind}"
        sel = selector_labels(p.kind, "shared")
        labels = standard_labels(p.kind, "shared")
        port = CACHE_PORT if p.kind == VALKEY else LMCACHE_SERVER_PORT
        maxmem_mib = int(p.memory.removesuffix("Gi")) * 1024 * 3 // 4  # headroom for overhead
        if p.kind == VALKEY:
            container = {
                "name": "valkey", "image": p.image, "imagePullPolicy": "IfNotPresent",
                "args": ["valkey-server", "--port", str(port), "--save", "",
                         "--appendonly", "no", "--maxmemory", f"{maxmem_mib}mb",
                         "--maxmemory-policy", "allkeys-lru", "--protected-mode", "no"],
                "securityContext": hardened(read_only_root=True, run_as_user=999),
            }
            probe = {"tcpSocket": {"port": "cache"}, "periodSeconds": 10}
        else:
            container = {
                "name": "lmcache-server", "image": p.image, "imagePullPolicy": "IfNotPresent",
                "command": ["lmcache_server"], "args": ["0.0.0.0", str(port), "cpu"],
                "securityContext": {"allowPrivilegeEscalation": False,
                                    "capabilities": {"drop": ["ALL"]}},
            }
            probe = {"tcpSocket": {"port": "cache"}, "periodSeconds": 10}
        container.update({
            "ports": [{"name": "cache", "containerPort": port}],
            "resources": {"requests": {"cpu": p.cpu, "memory": p.memory},
                          "limits": {"memory": p.memory}},
            "readinessProbe": probe, "livenessProbe": {**probe, "failureThreshold": 6},
        })
        containers = [container]
        ports = [{"name": "cache", "port": port, "targetPort": "cache"}]
        ingress = [{"from": [{"podSelector": {"matchLabels": {LABEL_NAME: WORKER_COMPONENT}}}],
                    "ports": [{"protocol": "TCP", "port": port}]}]
        if p.exporter_image:
            if p.kind != VALKEY:
                raise ValueError("the redis_exporter sidecar reads Valkey only")
            containers.append(_exporter(p.exporter_image, port))
            ports.append({"name": "metrics", "port": REDIS_EXPORTER_PORT,
                          "targetPort": "metrics"})
            ingress.append({"from": [{"namespaceSelector": {"matchLabels": {
                "kubernetes.io/metadata.name": MONITORING_NAMESPACE}}}],
                "ports": [{"protocol": "TCP", "port": REDIS_EXPORTER_PORT}]})
        k8s_object(self, "StatefulSet", api_version="apps/v1", kind="StatefulSet", name=name,
                   namespace=p.namespace, labels=labels, body={"spec": {
                       "replicas": 1, "serviceName": name,
                       "selector": {"matchLabels": sel},
                       "template": {"metadata": {"labels": labels}, "spec": {
                           "automountServiceAccountToken": False,
                           "nodeSelector": {NODE_ROLE_LABEL: NODE_ROLE_SYSTEM},
                           "containers": containers}}}})
        pdb(self, name=name, namespace=p.namespace, labels=labels, selector=sel)
        k8s_object(self, "Service", api_version="v1", kind="Service", name=name,
                   namespace=p.namespace, labels=labels, body={"spec": {
                       "selector": sel, "ports": ports}})
        k8s_object(self, "NetworkPolicy", api_version="networking.k8s.io/v1",
                   kind="NetworkPolicy", name=name, namespace=p.namespace, labels=labels,
                   body={"spec": {
                       "podSelector": {"matchLabels": sel}, "policyTypes": ["Ingress"],
                       "ingress": ingress}})


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
                      "limits": {"memory": "128Mi"}},
        "readinessProbe": probe, "livenessProbe": {**probe, "failureThreshold": 6},
        "securityContext": hardened(read_only_root=True, run_as_user=59000),
    }
