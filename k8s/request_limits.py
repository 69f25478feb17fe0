"""HyperPod's `worker.requestLimits` on EKS: a small HAProxy beside vLLM in each worker pod.

HyperPod enforces the limit with an nginx sidecar in the model's pod, so the limit is per
worker whatever the router does. Here the sidecar is the router image's HAProxy (already in the
account's ECR, China included), and the router reaches the workers only through it
(WORKER_LIMITS_PORT): at most `maxConcurrentRequests` inference requests go on to vLLM at once,
`maxQueueSize` more wait in HAProxy's queue for a slot, and the one after them is answered at
once: on the routers' port with ROUTER_OVERFLOW_STATUS, which no router retries and the router
pod's front turns into `overflowStatusCode` (429 by default) with `Retry-After` (a 429 there
waited for the routers' 2.5 s retry, measured); on the gateway's port
(WORKER_LIMITS_GATEWAY_PORT, the InferencePool's) with `overflowStatusCode` itself. Both ports
count against the one backend, so the limit is the worker's whichever path a request takes. The routers' own
`--max-concurrent-requests` / `--queue-size` count the whole router, not one worker, and a
second router replica doubles them, so they cannot give HyperPod's figure.

Only the client routes the front lets through count (k8s/router_front.py CLIENT_ROUTES, POST);
health checks, /metrics and cache_aware's render/tokenize calls pass without a slot, so a busy
worker stays healthy in the routers' eyes and they never mark it down for being busy. The
refusal reaches the router as an answer, not a failure (the circuit breakers are off,
k8s/router.py), and goes on to the client at once: HyperPod's limit fails fast.

One thread (`nbthread 1`) decides admission, so the count is exact: with every slot taken
(`be_conn_free` 0) and `maxQueueSize` waiting (`queue`), the request is refused. The sidecar runs
as a native sidecar (an init container with `restartPolicy: Always`): it is up before vLLM, and
the kubelet stops it only after vLLM has drained (k8s/workers.py), so no drained stream loses
its proxy.
"""
from __future__ import annotations

import json

from config.contracts import (
    LONGEST_REQUEST_S, ROUTER_OVERFLOW_STATUS, WORKER_LIMITS_GATEWAY_PORT, WORKER_LIMITS_PORT,
)
from config.endpoint_spec import RequestLimits
from k8s.objects import hardened
from k8s.router_front import CLIENT_ROUTES, RETRY_AFTER_S

LIMITS_DIR = "/etc/kvcache-limits"
LIMITS_CONFIG = "haproxy.cfg"
BIND_ENV, GATEWAY_BIND_ENV, VLLM_ENV = "LIMITS_BIND", "LIMITS_GATEWAY_BIND", "VLLM_ADDR"
# Beside the limited requests: the routers' health checks, Prometheus, render/tokenize calls.
OPEN_CONNECTIONS = 256
LIMITS_CPU, LIMITS_MEMORY_MIB = "250m", 128
LIMITS_MEMORY = f"{LIMITS_MEMORY_MIB}Mi"
# The limited inference routes: what the front passes on as POST.
LIMITED_PATHS = tuple(path for method, path in CLIENT_ROUTES if method == "POST")


def limits_config(limits: RequestLimits) -> str:
    """The sidecar's HAProxy config; addresses by environment variable so a loopback test runs
    the text unchanged. A queued request waits up to the longest request the router allows."""
    body = json.dumps({"error": {
        "message": f"this worker is running {limits.max_concurrent} requests with "
                   f"{limits.max_queue} waiting; try again", "type": "overloaded",
        "code": limits.status}}, separators=(",", ":"))
    full = (f"{{ be_conn_free(limited) eq 0 }} {{ queue(limited) ge {limits.max_queue} }}")
    return "\n".join([
        "global",
        "    nbthread 1",
        f"    maxconn {limits.max_concurrent + limits.max_queue + OPEN_CONNECTIONS}",
        f"    hard-stop-after {LONGEST_REQUEST_S + 30}s",
        "    log stdout format raw local0",
        "defaults",
        "    mode http",
        "    log global",
        "    option dontlog-normal",
        "    option http-no-delay",
        "    timeout connect 2s",
        "    timeout http-request 10s",
        "    timeout http-keep-alive 60s",
        f"    timeout client {LONGEST_REQUEST_S + 30}s",
        f"    timeout server {LONGEST_REQUEST_S + 30}s",
        f"    timeout queue {LONGEST_REQUEST_S}s",
        *(line for name, bind, status in (("routers", BIND_ENV, ROUTER_OVERFLOW_STATUS),
                                          ("gateway", GATEWAY_BIND_ENV, limits.status))
          for line in (
              f"frontend {name}",
              f'    bind "${{{bind}}}" proto h1',
              f"    acl limited_route path {' '.join(LIMITED_PATHS)}",
              f"    http-request return status {status} content-type application/json "
              f"hdr Retry-After {RETRY_AFTER_S} string '{body}' "
              f"if METH_POST limited_route {full}",
              "    use_backend limited if METH_POST limited_route",
              "    default_backend open")),
        "backend limited",
        f'    server vllm "${{{VLLM_ENV}}}" maxconn {limits.max_concurrent}',
        "backend open",
        f'    server vllm "${{{VLLM_ENV}}}"',
        "",
    ])


def limits_container(image: str, config_volume: str, vllm_port: int) -> dict:
    """The native sidecar: HAProxy in the foreground on WORKER_LIMITS_PORT (the routers') and
    WORKER_LIMITS_GATEWAY_PORT (the gateway's), vLLM on loopback."""
    return {
        "name": "request-limits", "image": image, "imagePullPolicy": "IfNotPresent",
        "restartPolicy": "Always",
        "command": ["haproxy", "-db", "-f", f"{LIMITS_DIR}/{LIMITS_CONFIG}"],
        "env": [{"name": BIND_ENV, "value": f":{WORKER_LIMITS_PORT}"},
                {"name": GATEWAY_BIND_ENV, "value": f":{WORKER_LIMITS_GATEWAY_PORT}"},
                {"name": VLLM_ENV, "value": f"127.0.0.1:{vllm_port}"}],
        "ports": [{"name": "limited", "containerPort": WORKER_LIMITS_PORT},
                  {"name": "limited-gw", "containerPort": WORKER_LIMITS_GATEWAY_PORT}],
        "startupProbe": {"tcpSocket": {"port": WORKER_LIMITS_PORT}, "periodSeconds": 1,
                         "failureThreshold": 30},
        "livenessProbe": {"tcpSocket": {"port": WORKER_LIMITS_PORT}, "periodSeconds": 10},
        "volumeMounts": [{"name": config_volume, "mountPath": LIMITS_DIR, "readOnly": True}],
        "resources": {"requests": {"cpu": LIMITS_CPU, "memory": LIMITS_MEMORY},
                      "limits": {"cpu": LIMITS_CPU, "memory": LIMITS_MEMORY}},
        "securityContext": hardened(),
    }
