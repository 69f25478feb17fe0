"""Self-hosted L2 caches in the cluster, shared by an environment's workers.

Valkey runs as a pure cache (no persistence, LRU eviction); LMCache's own server backs the
`tieredstorage` -> `lmcache-server` mapping. Only worker pods may connect (the flows below
become NetworkPolicies in k8s/network_policies.py).
"""
from __future__ import annotations

from dataclasses import dataclass

from cdk8s import Chart
from constructs import Construct

from config.contracts import (
    CACHE_PORT, LABEL_NAME, LMCACHE_SERVER_PORT, NODE_ROLE_LABEL, NODE_ROLE_SYSTEM,
    REDIS_EXPORTER_PORT,
)
from k8s.flows import PROMETHEUS, Flow, Peer
from k8s.objects import (
    hardened, k8s_object, pdb, pod_security, selector_labels, standard_labels,
)
from k8s.workers import COMPONENT as WORKER_COMPONENT, SCRATCH_ENV, WORKER_HOME, WORKER_UID

VALKEY = "valkey"
LMCACHE_SERVER = "lmcache-server"
VALKEY_UID = 999   # the valkey image's own user


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
                "securityContext": hardened(read_only_root=True, run_as_user=VALKEY_UID),
            }
            uid, volumes = VALKEY_UID, []
            probe = {"tcpSocket": {"port": "cache"}, "periodSeconds": 10}
        else:
            container = {
                "name": "lmcache-server", "image": p.image, "imagePullPolicy": "IfNotPresent",
                "command": ["lmcache_server"], "args": ["0.0.0.0", str(port), "cpu"],
                # the worker image, run as the workers run it: non-root, read-only root
                "env": SCRATCH_ENV,
                "volumeMounts": [{"name": "home", "mountPath": WORKER_HOME},
                                 {"name": "tmp", "mountPath": "/tmp"}],
                "securityContext": hardened(run_as_user=WORKER_UID),
            }
            uid = WORKER_UID
            volumes = [{"name": "home", "emptyDir": {"sizeLimit": "1Gi"}},
                       {"name": "tmp", "emptyDir": {"sizeLimit": "1Gi"}}]
            probe = {"tcpSocket": {"port": "cache"}, "periodSeconds": 10}
        container.update({
            "ports": [{"name": "cache", "containerPort": port}],
            "resources": {"requests": {"cpu": p.cpu, "memory": p.memory},
                          "limits": {"memory": p.memory}},
            "readinessProbe": probe, "livenessProbe": {**probe, "failureThreshold": 6},
        })
        containers = [container]
        ports = [{"name": "cache", "port": port, "targetPort": "cache"}]
        if p.exporter_image:
            if p.kind != VALKEY:
                raise ValueError("the redis_exporter sidecar reads Valkey only")
            containers.append(_exporter(p.exporter_image, port))
            ports.append({"name": "metrics", "port": REDIS_EXPORTER_PORT,
                          "targetPort": "metrics"})
        workload = k8s_object(
                   self, "StatefulSet", api_version="apps/v1", kind="StatefulSet", name=name,
                   namespace=p.namespace, labels=labels, body={"spec": {
                       "replicas": 1, "serviceName": name,
                       "selector": {"matchLabels": sel},
                       "template": {"metadata": {"labels": labels}, "spec": {
                           "automountServiceAccountToken": False,
                           "securityContext": pod_security(uid),
                           "nodeSelector": {NODE_ROLE_LABEL: NODE_ROLE_SYSTEM},
                           "containers": containers, "volumes": volumes}}}})
        pdb(self, name=name, namespace=p.namespace, labels=labels, selector=sel)
        k8s_object(self, "Service", api_version="v1", kind="Service", name=name,
                   namespace=p.namespace, labels=labels, body={"spec": {
                       "selector": sel, "ports": ports}})
        cache = Peer(name, p.namespace, sel)
        workers = Peer("all-workers", p.namespace, {LABEL_NAME: WORKER_COMPONENT})
        self.flows = (Flow(workers, cache, port, "KV chunks from every endpoint's workers"),)
        pod = workload.to_json()["spec"]["template"]["spec"]
        exposed = {pt["containerPort"] for c in pod["containers"] for pt in c.get("ports", [])}
        if REDIS_EXPORTER_PORT in exposed:  # the redis_exporter sidecar, where it runs
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
                      "limits": {"memory": "128Mi"}},
        "readinessProbe": probe, "livenessProbe": {**probe, "failureThreshold": 6},
        "securityContext": hardened(read_only_root=True, run_as_user=59000),
    }
