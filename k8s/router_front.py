"""The router's front: HAProxy in the router pod, the only thing on the client port.

Both routers serve their control routes on the port they serve clients on: vllm-router 0.1.17
takes `POST /add_worker?url=`, `/remove_worker`, `POST /workers`, `DELETE /workers/{url}`
from anyone, key or not; sglang-router 0.3.2 from anyone holding the endpoint's key, which every
client holds (measured on loopback: a worker added that way got other clients' chats with their
`Authorization` header). Neither has a flag that closes them, so the router listens on
127.0.0.1 and this front passes on only the client routes below, by exact method and path;
everything else is refused with 403 before it reaches the router. HAProxy comes from the router
image's Debian release (images/router/Dockerfile), the same package the loopback tests run.

The config names its two addresses by environment variable, so the loopback tests run the
rendered text unchanged on their own ports.
"""
from __future__ import annotations

import hashlib

from config.contracts import ROUTER_BACKEND_PORT, ROUTER_PORT
from k8s.objects import hardened

# (method, exact path) a client may reach: inference, the model list, and the health routes
# the kubelet and the NLB probe. Anything else, the control routes included, is refused.
CLIENT_ROUTES = (
    ("GET", "/health"), ("GET", "/liveness"), ("GET", "/readiness"), ("GET", "/v1/models"),
    ("POST", "/v1/chat/completions"), ("POST", "/v1/completions"), ("POST", "/v1/embeddings"),
)
FRONT_DIR = "/etc/kvcache-front"
FRONT_CONFIG = "haproxy.cfg"
BIND_ENV, ROUTER_ENV = "FRONT_BIND", "ROUTER_ADDR"
# Concurrent client connections per router replica; HAProxy allocates two buffers of
# tune.bufsize (16 KiB) per active stream, so 4096 streams fit in FRONT_MEMORY.
MAX_CONNECTIONS = 4096
FRONT_CPU, FRONT_MEMORY = "250m", "192Mi"
# On termination the front keeps serving while the NLB stops sending it new connections
# (DEREGISTER_S), then soft-stops (SIGUSR1: it closes its listener and finishes the requests it
# has, streams included) for at most DRAIN_S (`hard-stop-after`). SIGTERM, what the kubelet
# sends, would make HAProxy drop every open stream at once. The router container outlives both
# (k8s/router.py), so nothing in flight loses its router.
DEREGISTER_S = 30
DRAIN_S = 60
# The preStop hook: $1 seconds of grace for the NLB, then the soft stop of HAProxy (PID 1 in its
# container; FRONT_PID only where a test runs it beside other processes), then wait until it
# has finished.
PRE_STOP = ["/bin/sh", "-c", 'sleep "$1"; pid="${FRONT_PID:-1}"; kill -USR1 "$pid"; '
            'while kill -0 "$pid" 2>/dev/null; do sleep 1; done', "pre-stop",
            str(DEREGISTER_S)]


def front_config(request_timeout_s: int, max_body_bytes: int) -> str:
    """HAProxy's config. Its idle timeouts outlast the router's request timeout, so the router
    (not the front) decides when a slow generation has taken too long. A body declared larger
    than the router's payload limit gets 413 here, before any of it is read (sglang-router
    answers 413 mid-upload and closes, which clients behind a proxy see as a dropped
    connection); chunked bodies meet the router's own limit. Only abnormal requests are logged
    (errors, timeouts, refusals), never one line per normal request."""
    methods: dict[str, list[str]] = {}
    for method, path in CLIENT_ROUTES:
        methods.setdefault(method, []).append(path)
    acls = [f"    acl route_{m.lower()} path {' '.join(paths)}" for m, paths in methods.items()]
    allowed = " or ".join(f"METH_{m} route_{m.lower()}" for m in methods)
    idle = request_timeout_s + 30
    return "\n".join([
        "global",
        f"    maxconn {MAX_CONNECTIONS}",
        f"    hard-stop-after {DRAIN_S}s",
        "    log stdout format raw local0",
        "defaults",
        "    mode http",
        "    log global",
        "    option httplog",
        "    option dontlog-normal",
        "    option http-no-delay",
        "    retries 3",
        "    timeout connect 2s",
        "    timeout http-request 30s",
        "    timeout http-keep-alive 60s",
        f"    timeout client {idle}s",
        f"    timeout server {idle}s",
        "frontend clients",
        f'    bind "${{{BIND_ENV}}}"',
        *acls,
        f"    http-request deny deny_status 403 unless {allowed}",
        f"    http-request deny deny_status 413 if {{ req.hdr_val(content-length) gt "
        f"{max_body_bytes} }}",
        "    default_backend router",
        "backend router",
        f'    server router "${{{ROUTER_ENV}}}"',
        "",
    ])


def front_config_hash(text: str) -> str:
    """A pod annotation: a new config rolls the pods (a ConfigMap change alone does not)."""
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def front_container(image: str, config_volume: str) -> dict:
    """The front's container: the router image's haproxy in the foreground (`-db`), the
    Service's port, the config from ``config_volume``."""
    return {
        "name": "front", "image": image, "imagePullPolicy": "IfNotPresent",
        "command": ["haproxy", "-db", "-f", f"{FRONT_DIR}/{FRONT_CONFIG}"],
        "env": [{"name": BIND_ENV, "value": f":{ROUTER_PORT}"},
                {"name": ROUTER_ENV, "value": f"127.0.0.1:{ROUTER_BACKEND_PORT}"}],
        "ports": [{"name": "http", "containerPort": ROUTER_PORT}],
        # its own liveness: it accepts connections (the router's probes go through it)
        "livenessProbe": {"tcpSocket": {"port": ROUTER_PORT}, "periodSeconds": 10},
        "readinessProbe": {"tcpSocket": {"port": ROUTER_PORT}, "periodSeconds": 10},
        "lifecycle": {"preStop": {"exec": {"command": PRE_STOP}}},
        "volumeMounts": [{"name": config_volume, "mountPath": FRONT_DIR, "readOnly": True}],
        "resources": {"requests": {"cpu": FRONT_CPU, "memory": FRONT_MEMORY},
                      "limits": {"cpu": FRONT_CPU, "memory": FRONT_MEMORY}},
        "securityContext": hardened(),
    }
