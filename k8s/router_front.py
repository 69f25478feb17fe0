"""The router's front: HAProxy in the router pod, the only thing on the client port, and the
pod's shield against a hostile client.

Both routers serve their control routes on the port they serve clients on: vllm-router 0.1.17
takes `POST /add_worker?url=`, `/remove_worker`, `POST /workers`, `DELETE /workers/{url}`
from anyone, key or not; sglang-router 0.3.2 from anyone holding the endpoint's key, which every
client holds (measured on loopback: a worker added that way got other clients' chats with their
`Authorization` header). Neither has a flag that closes them, so the router listens on
127.0.0.1 and this front passes on only the client routes below, by exact method and path;
everything else is refused with 403 before it reaches the router. HAProxy comes from the router
image's Debian release (images/router/Dockerfile), the same package the loopback tests run.

What else it does, each measured with `python -m bench.attacks` (docs/security.md):
- HTTP/1.1 only (`proto h1`): HAProxy's h2c on a plain bind let one client open 100 streams per
  connection, each holding a router connection.
- The real client address: the NLB sends a PROXY protocol v2 header (k8s/router.py turns it on)
  and the front requires one on every connection from the load balancer's subnets; the kubelet's
  probes and in-cluster clients come from elsewhere and send none.
- At most PER_SOURCE_CONNECTIONS connections per client address, whatever they do.
- The endpoint key, checked here: a client without it gets 401 before the router sees the
  request (vllm-router checks no key and cache_aware/kv_aware call the workers before the
  workers' own check), `/v1/models` included; only the probes' routes are open.
- Request bodies with a declared length only (411 for chunked), at most the router's payload
  limit (413), the first buffer of it within BODY_WAIT_S and then no pause longer than
  CLIENT_IDLE_S; a client that stops reading its answer is cut after CLIENT_IDLE_S too (the
  router would buffer the stream for it).
- A cap on the router's connections by body size, from the router's memory (router_slots),
  with a queue of QUEUE_S in front of it.
- Logs: only abnormal requests, with the client address and the path without its query string.

The config names its addresses and files by environment variable, so the loopback tests run the
rendered text unchanged on their own ports.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

from config.contracts import (
    DEREGISTER_S_DEFAULT, LONGEST_REQUEST_S, ROUTER_BACKEND_PORT, ROUTER_OVERFLOW_STATUS,
    ROUTER_PORT,
)
from config.endpoint_spec import MODEL_NAME
from k8s.objects import hardened

# (method, exact path) a client may reach: inference, the model list, and the health routes
# the kubelet and the NLB probe. Anything else, the control routes included, is refused.
CLIENT_ROUTES = (
    ("GET", "/health"), ("GET", "/liveness"), ("GET", "/readiness"), ("GET", "/v1/models"),
    ("POST", "/v1/chat/completions"), ("POST", "/v1/completions"), ("POST", "/v1/embeddings"),
)
# The probes' routes: open without the key (the kubelet and the NLB send none).
PROBE_PATHS = ("/health", "/liveness", "/readiness")
FRONT_DIR = "/etc/kvcache-front"
FRONT_CONFIG = "haproxy.cfg"
BIND_ENV, ROUTER_ENV = "FRONT_BIND", "ROUTER_ADDR"
DECODE_ROUTER_ENV = "DECODE_ROUTER_ADDR"   # a disaggregated endpoint's decode-only router
LOAD_BALANCER_ENV, KEY_DIGEST_ENV = "FRONT_LOAD_BALANCER", "FRONT_KEY_DIGEST"
# The bind's TLS words (`ssl crt FILE`), empty for plain HTTP: one config text either way
# (k8s/certificate.py makes the certificate; the loopback tests run both).
TLS_ENV = "FRONT_TLS"
TLS_DIR = "/etc/kvcache-tls"
TLS_FILE = f"{TLS_DIR}/front.pem"
# Concurrent client connections per router replica; HAProxy allocates two buffers of
# tune.bufsize (16 KiB) per active stream, so 4096 streams fit in FRONT_MEMORY.
MAX_CONNECTIONS = 4096
FRONT_CPU, FRONT_MEMORY = "250m", "192Mi"
# Connections one client address may hold at once: a client's connection pool (the OpenAI SDK
# allows up to 1,000; benchmark clients run 256 concurrent requests) beside one attacker's
# thousands. Clients behind one NAT share it.
PER_SOURCE_CONNECTIONS = 256
# Headers, and the first buffer of a body (16 KiB, or the whole body if smaller), must arrive
# within this; the rest of a body may not pause longer than CLIENT_IDLE_S.
HEADERS_S = BODY_WAIT_S = 10
# How long the client may leave the front waiting for data it must send or acknowledge: a body
# being uploaded, or an answer it stopped reading (vllm-router keeps reading the worker's
# stream for it: +3.7 MB/s per stream at the fake worker's full speed). HAProxy does not apply
# it while the client waits for an answer (measured: a 3 s client timeout let a silent 8 s
# request through), so long generations are not cut by it.
CLIENT_IDLE_S = 10
# Bodies up to SMALL_BODY_BYTES and larger ones queue for the router separately: a body the
# router holds costs it up to ~1.5 bytes of memory per byte (PARKED_RSS_PER_BODY_BYTE, measured:
# sglang-router 1.24, vllm-router 1.5, 300 bodies at 128 KiB), so large ones get fewer slots.
SMALL_BODY_BYTES = 64 * 1024
PARKED_RSS_PER_BODY_BYTE = 1.5
# Of the router's memory limit, for bodies in flight: beside cache_aware's prefix tree (half,
# k8s/router.py TREE_MEMORY_SHARE, a bound the soak never came near) and the binary (~80-90 MiB)
ROUTER_MEMORY_SHARE = 0.25
ROUTER_SMALL_CONNECTIONS = 1024
QUEUE_S = 10                        # a request waits this long for a router slot, then 503
RETRY_AFTER_S = 1                   # what a full worker's refusal tells the client to wait
# TCP keepalives on idle client connections: an NLB drops a flow idle for 350 s on a TLS
# listener (fixed), keepalive packets reset its timer; on TCP listeners the idle timeout is set
# above the router's request timeout as well (k8s/router.py).
KEEPALIVE_IDLE_S = 60
# Termination (a rollout, a KEDA scale-down). An AWS NLB keeps opening new connections to a
# target for about two minutes after its deregistration starts, whatever the target group's
# deregistration delay says (aws-load-balancer-controller #2366: "deregistration takes at least
# 2 minutes regardless of the deregistration delay setting"; #3270, #1834; aws/containers-roadmap
# #470: "the effective minimum delay seems to be 120 seconds"); the fault drill, whose balancer
# sent for 45 s against the 30 s allowed then, lost 36 new connections. So the front keeps
# serving for DEREGISTER_S, then soft-stops (SIGUSR1: it closes its listener and finishes the
# requests it has, streams included) for at most DRAIN_S (`hard-stop-after`), which covers the
# longest request the router lets run (LONGEST_REQUEST_S, plus the slack of `timeout server`):
# a stream accepted the moment before the soft stop ends on its own, not by the drain (the
# drill's 120 s stream was cut at 90 s by the 60 s drain then). SIGTERM, what the kubelet
# sends, would make HAProxy drop every open stream at once. The router container waits for the
# front to be done (ROUTER_PRE_STOP: the front's hook leaves FRONT_DONE on a volume both mount),
# so nothing in flight loses its router, and a pod with nothing in flight goes at DEREGISTER_S.
DEREGISTER_S = DEREGISTER_S_DEFAULT     # `listener.deregistrationWaitSeconds` sets it
DRAIN_S = LONGEST_REQUEST_S + 30
DRAIN_DIR = "/run/kvcache-drain"
FRONT_DONE = f"{DRAIN_DIR}/front-done"
# The front's preStop hook: $1 seconds of grace for the NLB, then the soft stop of HAProxy (PID 1
# in its container; FRONT_PID only where a test runs it beside other processes), then wait until
# it has finished, then tell the router ($2).
def front_pre_stop(deregister_s: int = DEREGISTER_S) -> list[str]:
    return ["/bin/sh", "-c", 'sleep "$1"; pid="${FRONT_PID:-1}"; kill -USR1 "$pid"; '
            'while kill -0 "$pid" 2>/dev/null; do sleep 1; done; touch "$2"', "pre-stop",
            str(deregister_s), FRONT_DONE]


# The router's preStop hook: wait until the front is done ($1 exists), at most $2 seconds; the
# kubelet's SIGTERM follows (both routers then finish what they still hold and exit).
def router_pre_stop(deregister_s: int = DEREGISTER_S) -> list[str]:
    return ["/bin/sh", "-c", 'i=0; while [ ! -e "$1" ] && [ "$i" -lt "$2" ]; do '
            'sleep 1; i=$((i+1)); done', "router-pre-stop", FRONT_DONE,
            str(deregister_s + DRAIN_S)]


def termination_grace_s(deregister_s: int = DEREGISTER_S) -> int:
    """terminationGracePeriodSeconds: both hooks, and the processes' exit after them."""
    return deregister_s + DRAIN_S + 30


PRE_STOP, ROUTER_PRE_STOP = front_pre_stop(), router_pre_stop()   # at the default wait
TERMINATION_GRACE_S = termination_grace_s()
DRAIN_VOLUME = {"name": "drain", "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}}
DRAIN_MOUNT = {"name": "drain", "mountPath": DRAIN_DIR}
# HAProxy's `option httplog` line with the request's method, path (no query string: a key
# sent there would be logged) and version in place of the request line.
LOG_FORMAT = ("%ci:%cp [%tr] %ft %b/%s %TR/%Tw/%Tc/%Tr/%Ta %ST %B %tsc %ac/%fc/%bc/%sc/%rc "
              '%sq/%bq \\"%HM %HPO %HV\\"')


def key_digest(api_key: str) -> str:
    """What the front compares a client's Authorization header with: the SHA-256 (hex) of
    `Bearer <key>`, the header vLLM's own check expects. The pod's init container writes it
    (k8s/secret_fetch.py); the key itself is in no config."""
    return hashlib.sha256(f"Bearer {api_key}".encode()).hexdigest()


@dataclass(frozen=True)
class RouterSlots:
    """Concurrent requests the front lets through to the router, by body size."""

    small: int     # bodies up to SMALL_BODY_BYTES (and GETs)
    large: int     # larger bodies, up to the payload limit


def router_slots(router_memory_bytes: int, max_body_bytes: int) -> RouterSlots:
    """Slots whose bodies, held whole by the router, fit ROUTER_MEMORY_SHARE of its memory:
    ROUTER_SMALL_CONNECTIONS small ones, the rest of the share for large ones (dev: 1 GiB,
    128 KiB payload limit -> 1024 and 853; a 128K-token context, 2 MiB -> 1024 and 51)."""
    budget = router_memory_bytes * ROUTER_MEMORY_SHARE
    small_cost = ROUTER_SMALL_CONNECTIONS * SMALL_BODY_BYTES * PARKED_RSS_PER_BODY_BYTE
    per_large = max(max_body_bytes, SMALL_BODY_BYTES) * PARKED_RSS_PER_BODY_BYTE
    large = int((budget - small_cost) // per_large)
    if large < 1:
        raise ValueError(f"router memory {router_memory_bytes} B holds no request body of "
                         f"{max_body_bytes} B beside {ROUTER_SMALL_CONNECTIONS} small ones")
    return RouterSlots(ROUTER_SMALL_CONNECTIONS, min(large, ROUTER_SMALL_CONNECTIONS))


def models_answer(models: tuple[str, ...]) -> str:
    """`GET /v1/models` answered by the front, in vLLM's shape (id, object, created: the time
    of the request, owned_by), for a router that cannot name its workers' model:
    sglang-router 0.3.2 registers a worker it discovers with model id `unknown` (it learns a
    model only from SGLang's `/server_info`, which vLLM has not) and lists that id
    (docs/upstream.md). Names are what config/endpoint_spec.py admits, so nothing in them
    needs quoting in HAProxy's single-quoted log-format string."""
    for name in models:
        if not MODEL_NAME.fullmatch(name):
            raise ValueError(f"served model name {name!r} (spec.modelName or the worker args' "
                             f"--served-model-name): allowed {MODEL_NAME.pattern}")
    data = ",".join('{"id":"%s","object":"model","created":%%[date],"owned_by":"vllm"}' % m
                    for m in models)
    return ("    http-request return status 200 content-type application/json lf-string "
            f"'{{\"object\":\"list\",\"data\":[{data}]}}' if {{ method GET }} "
            "{ path /v1/models }")


def front_config(request_timeout_s: int, max_body_bytes: int, slots: RouterSlots, *,
                 key_check: bool, models: tuple[str, ...] = (),
                 short_body_bytes: int | None = None,
                 overflow_status: int | None = None,
                 per_source_requests: int | None = None) -> str:
    """HAProxy's config. Its server timeout outlasts the router's request timeout, so the
    router (not the front) decides when a slow generation has taken too long. A body declared
    larger than the router's payload limit gets 413 here, before any of it is read
    (sglang-router answers 413 mid-upload and closes, which clients behind a proxy see as a
    dropped connection). Only abnormal requests are logged (errors, timeouts, refusals), never
    one line per normal request. ``key_check``: the endpoint has an API key (its digest file is
    named by KEY_DIGEST_ENV). ``models``: the served model names the front lists itself on
    `GET /v1/models`, after the key check (models_answer); empty: the router answers.
    ``short_body_bytes`` (a disaggregated endpoint's pdSpec.routingThreshold x k8s/pd.py
    BODY_BYTES_PER_TOKEN): bodies shorter than that go to the decode-only router (named by
    DECODE_ROUTER_ENV), the rest to the P/D router; requests without a body (GET) go to the
    P/D router. ``overflow_status`` (worker.requestLimits): a full worker's sidecar answers the
    router ROUTER_OVERFLOW_STATUS, which no router retries; the front gives the client the
    file's status and Retry-After instead. ``per_source_requests``: with request limits, the
    inference requests one client address may have in flight at once (its share of the
    endpoint's slots, fair_share): the next is answered the file's status at once, so one
    client cannot take every worker's slots from the others."""
    methods: dict[str, list[str]] = {}
    for method, path in CLIENT_ROUTES:
        methods.setdefault(method, []).append(path)
    # `method GET`, not METH_GET, which matches HEAD too
    acls = [f"    acl route_{m.lower()} path {' '.join(paths)}" for m, paths in methods.items()]
    allowed = " or ".join(f"{{ method {m} }} route_{m.lower()}" for m in methods)
    key = [
        f"    acl probe path {' '.join(PROBE_PATHS)}",
        "    acl one_key req.fhdr_cnt(authorization) eq 1",
        f'    acl key_ok req.fhdr(authorization),sha2(256),hex,lower -m str -f '
        f'"${{{KEY_DIGEST_ENV}}}"',
        "    http-request deny deny_status 401 unless probe or one_key key_ok",
    ] if key_check else []
    shared = bool(per_source_requests and overflow_status)   # each address's share counted
    return "\n".join([
        "global",
        f"    maxconn {MAX_CONNECTIONS}",
        f"    hard-stop-after {DRAIN_S}s",
        "    log stdout format raw local0",
        "defaults",
        "    mode http",
        "    log global",
        f'    log-format "{LOG_FORMAT}"',
        "    option dontlog-normal",
        "    option http-no-delay",
        "    option clitcpka",
        f"    clitcpka-idle {KEEPALIVE_IDLE_S}s",
        f"    clitcpka-intvl {KEEPALIVE_IDLE_S}s",
        "    retries 3",
        "    timeout connect 2s",
        f"    timeout http-request {HEADERS_S}s",
        "    timeout http-keep-alive 60s",
        f"    timeout client {CLIENT_IDLE_S}s",
        f"    timeout server {request_timeout_s + 30}s",
        f"    timeout queue {QUEUE_S}s",
        "frontend clients",
        f'    bind "${{{BIND_ENV}}}" proto h1 "${{{TLS_ENV}[*]}}"',
        # an NLB connection starts with its PROXY v2 header (the NLB's health checks' too,
        # with command LOCAL); nothing else may send one
        f'    tcp-request connection expect-proxy layer4 if {{ src "${{{LOAD_BALANCER_ENV}[*]}}" }}',
        "    stick-table type ipv6 size 100k expire 60s store conn_cur",
        "    tcp-request session track-sc0 src",
        f"    tcp-request session reject if {{ sc_conn_cur(0) gt {PER_SOURCE_CONNECTIONS} }}",
        *acls,
        f"    http-request deny deny_status 403 unless {allowed}",
        *key,
        *([models_answer(models)] if models else []),
        *(per_source_rules(overflow_status, per_source_requests) if shared else []),
        # (411 is not among HAProxy's built-in error pages, so `return`, not `deny`)
        '    http-request return status 411 content-type text/plain string '
        '"a request body needs a Content-Length" if { req.hdr(transfer-encoding) -m found }',
        f"    http-request deny deny_status 413 if {{ req.hdr_val(content-length) gt "
        f"{max_body_bytes} }}",
        f"    http-request wait-for-body time {BODY_WAIT_S}s",
        *([f"    acl short_body req.hdr_val(content-length) lt {short_body_bytes}",
           f"    acl large_body req.hdr_val(content-length) gt {SMALL_BODY_BYTES}",
           "    use_backend decode_large if short_body large_body",
           "    use_backend decode if short_body"] if short_body_bytes else []),
        f"    use_backend router_large if {{ req.hdr_val(content-length) gt "
        f"{SMALL_BODY_BYTES} }}",
        "    default_backend router",
        *([f"    http-response set-header Retry-After {RETRY_AFTER_S} if "
           f"{{ status {ROUTER_OVERFLOW_STATUS} }}",
           f"    http-response set-status {overflow_status} if "
           f"{{ status {ROUTER_OVERFLOW_STATUS} }}"] if overflow_status else []),
        *(["backend per_source",   # a table of its own: client address -> requests in flight
           "    stick-table type ipv6 size 100k expire 60s store http_req_cnt"]
          if shared else []),
        "backend router",
        f'    server router "${{{ROUTER_ENV}}}" maxconn {slots.small}',
        "backend router_large",
        f'    server router "${{{ROUTER_ENV}}}" maxconn {slots.large}',
        *([f"backend decode",
           f'    server router "${{{DECODE_ROUTER_ENV}}}" maxconn {slots.small}',
           "backend decode_large",
           f'    server router "${{{DECODE_ROUTER_ENV}}}" maxconn {slots.large}']
          if short_body_bytes else []),
        "",
    ])


def per_source_rules(status: int, most: int) -> list[str]:
    """Each client address's inference requests in flight counted (the `per_source` table;
    the address is the PROXY header's, the client's own), and the one over `most` answered
    `status` at once."""
    body = json.dumps({"error": {
        "message": f"this client has {most} requests in flight, its share of the endpoint; "
                   "try again", "type": "overloaded", "code": status}}, separators=(",", ":"))
    return ["    http-request track-sc1 src table per_source if { method POST } route_post",
            f"    http-request return status {status} content-type application/json "
            f"hdr Retry-After {RETRY_AFTER_S} string '{body}' "
            f"if {{ method POST }} route_post {{ sc_trackers(1) gt {most} }}"]


def fair_share(slots: int) -> int:
    """What one client address may hold of an endpoint's `slots` (its workers' requestLimits,
    running and queued, at the fewest workers it runs): half, so a second client always finds
    room while the first holds its share."""
    return max(1, slots // 2)


def front_config_hash(text: str) -> str:
    """A pod annotation: a new config rolls the pods (a ConfigMap change alone does not)."""
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def front_container(image: str, config_volume: str, load_balancer_cidrs: tuple[str, ...],
                    key_digest_file: str | None, key_volume: str | None,
                    decode_router: str | None = None, tls_volume: str | None = None,
                    deregister_s: int = DEREGISTER_S) -> dict:
    """The front's container: the router image's haproxy in the foreground (`-db`), the
    Service's port, the config from ``config_volume``; the NLB's addresses and, where the
    endpoint has a key, its digest (on ``key_volume``); with ``tls_volume`` (the Secret
    k8s/certificate.py fills) it serves HTTPS."""
    env = [{"name": BIND_ENV, "value": f":{ROUTER_PORT}"},
           {"name": ROUTER_ENV, "value": f"127.0.0.1:{ROUTER_BACKEND_PORT}"},
           # one word per CIDR: `${VAR[*]}` in the config makes each an argument of its own
           {"name": LOAD_BALANCER_ENV, "value": " ".join(load_balancer_cidrs)}]
    if decode_router:
        env.append({"name": DECODE_ROUTER_ENV, "value": decode_router})
    mounts = [{"name": config_volume, "mountPath": FRONT_DIR, "readOnly": True}, DRAIN_MOUNT]
    if tls_volume:
        env.append({"name": TLS_ENV, "value": f"ssl crt {TLS_FILE}"})
        mounts.append({"name": tls_volume, "mountPath": TLS_DIR, "readOnly": True})
    if key_digest_file:
        env.append({"name": KEY_DIGEST_ENV, "value": key_digest_file})
        mounts.append({"name": key_volume, "mountPath": key_digest_file.rsplit("/", 1)[0],
                       "readOnly": True})
    return {
        "name": "front", "image": image, "imagePullPolicy": "IfNotPresent",
        "command": ["haproxy", "-db", "-f", f"{FRONT_DIR}/{FRONT_CONFIG}"],
        "env": env,
        "ports": [{"name": "http", "containerPort": ROUTER_PORT}],
        # its own liveness: it accepts connections (the router's probes go through it)
        "livenessProbe": {"tcpSocket": {"port": ROUTER_PORT}, "periodSeconds": 10},
        "readinessProbe": {"tcpSocket": {"port": ROUTER_PORT}, "periodSeconds": 10},
        "lifecycle": {"preStop": {"exec": {"command": front_pre_stop(deregister_s)}}},
        "volumeMounts": mounts,
        "resources": {"requests": {"cpu": FRONT_CPU, "memory": FRONT_MEMORY},
                      "limits": {"cpu": FRONT_CPU, "memory": FRONT_MEMORY}},
        "securityContext": hardened(),
    }
