"""HyperPod `worker.requestLimits`, as rendered: the worker pod's sidecar (real HAProxy, the
rendered ConfigMap text unchanged) in front of a vLLM stand-in that holds every inference
request until the test lets it go. Request maxConcurrentRequests + maxQueueSize + 1 gets
overflowStatusCode, none before it; health and metrics still pass while the worker is full;
the routers reach the workers only through the sidecar."""
from __future__ import annotations

import contextlib
import copy
import functools
import http.server
import json
import os
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path

from concurrent.futures import ThreadPoolExecutor

import cdk8s
import pytest
import requests

from bench.loopback import (
    FrontProcess, RouterProcess, RouterStartError, container_env, localize_router_args,
    nlb_connection, port_clash, router_launch,
)

from config.contracts import (
    ROUTER_OVERFLOW_STATUS, WORKER_LIMITS_GATEWAY_PORT, WORKER_LIMITS_PORT,
)
from config.errors import ConfigError
from config.endpoint_spec import parse_endpoint
from k8s.router_front import FRONT_CONFIG
from k8s.request_limits import BIND_ENV, GATEWAY_BIND_ENV, LIMITS_CONFIG, VLLM_ENV
from k8s.serving import build_charts
from tests.k8s.test_charts import SEED, _env, _facts

LIMITS = {"maxConcurrentRequests": 3, "maxQueueSize": 2}
DEADLINE_S = 20   # bounds every wait; nothing asserts on time


def _render(limits: dict, strategy: str = "prefixaware", replicas: int | None = None
            ) -> list[dict]:
    return _rendered(json.dumps(limits, sort_keys=True), strategy, replicas)


@functools.lru_cache(maxsize=None)
def _rendered(limits_json: str, strategy: str, replicas: int | None = None) -> list[dict]:
    """Rendered once per limits and strategy (jsii renders take most of this file's time)."""
    limits = json.loads(limits_json)
    cfg = _env("dev")
    raw = copy.deepcopy(SEED)
    raw["spec"]["worker"]["requestLimits"] = limits
    if replicas:
        raw["spec"]["replicas"] = replicas
    raw["spec"]["intelligentRoutingSpec"]["routingStrategy"] = strategy
    spec = parse_endpoint(cfg.name, "endpoints/test.yaml", raw)
    return [d for chart in build_charts(cdk8s.App(), cfg, (spec,), _facts(cfg, spec))
            for d in chart.to_json()]


class _HeldVllm(http.server.BaseHTTPRequestHandler):
    """vLLM's stand-in: inference requests wait for `release`; GETs answer at once."""

    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    release = threading.Event()
    arrived: list[str] = []

    def log_message(self, *args) -> None:
        pass

    def do_POST(self) -> None:   # noqa: N802
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.arrived.append(self.path)
        self.release.wait(DEADLINE_S)
        self._answer(b'{"choices":[]}')

    def do_GET(self) -> None:   # noqa: N802
        self._answer(b"ok")

    def _answer(self, body: bytes) -> None:
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _until(condition, what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {DEADLINE_S}s: {what}")
        time.sleep(0.01)


def _send(port: int, path: str = "/v1/chat/completions") -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port))
    body = b'{"model":"m","messages":[{"role":"user","content":"hi"}]}'
    s.sendall(f"POST {path} HTTP/1.1\r\nHost: w\r\nContent-Type: application/json\r\n"
              f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
    return s


def _status(s: socket.socket, timeout: float = DEADLINE_S) -> int:
    s.settimeout(timeout)
    head = b""
    while b"\r\n" not in head:
        chunk = s.recv(4096)
        if not chunk:
            raise AssertionError("closed before a status line")
        head += chunk
    return int(head.split(b" ", 2)[1])


def _answered(s: socket.socket) -> bool:
    s.setblocking(False)
    try:
        return bool(s.recv(1, socket.MSG_PEEK))
    except BlockingIOError:
        return False
    finally:
        s.setblocking(True)


def _stat_lines(stats: Path) -> list[str]:
    """`show stat` from HAProxy's own stats socket: a CSV header line, then a line per proxy."""
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(str(stats))
        s.sendall(b"show stat\n")
        text = b""
        while chunk := s.recv(65536):
            text += chunk
    return text.decode().splitlines()


def _backend(stats: Path, column: str) -> int:
    """A column of the limited backend's row, from HAProxy's own stats socket."""
    lines = _stat_lines(stats)
    header = lines[0].lstrip("# ").split(",")
    for line in lines[1:]:
        fields = line.split(",")
        if fields[:2] == ["limited", "BACKEND"]:
            return int(fields[header.index(column)])
    raise AssertionError("no limited backend in the stats")


def _queued(stats: Path) -> int:
    """The limited backend's queue."""
    return _backend(stats, "qcur")


def _limits_text(docs: list[dict]) -> str:
    return next(d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"]
                .endswith("-workers-limits"))["data"][LIMITS_CONFIG]


@contextlib.contextmanager
def _worker(config: str):
    """(sidecar port, its stats socket, the stand-in's handler class): the rendered sidecar
    text on a free port in front of a fresh held vLLM stand-in."""
    handler = type("Held", (_HeldVllm,), {"release": threading.Event(), "arrived": []})
    vllm = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=vllm.serve_forever, kwargs={"poll_interval": 0.05},
                     daemon=True).start()
    with tempfile.TemporaryDirectory() as tmp:
        cfg, stats = Path(tmp) / "haproxy.cfg", Path(tmp) / "stats.sock"
        cfg.write_text(config)
        # the test's own second file: a stats socket to see the queue (the rendered text
        # is loaded unchanged)
        (Path(tmp) / "stats.cfg").write_text(f"global\n    stats socket {stats} level user\n")
        for _ in range(3):   # again on a fresh port if another process took this one first
            port, gateway_port = _free_port(), _free_port()
            env = {**os.environ, BIND_ENV: f"127.0.0.1:{port}",
                   GATEWAY_BIND_ENV: f"127.0.0.1:{gateway_port}",
                   VLLM_ENV: f"127.0.0.1:{vllm.server_address[1]}"}
            proc = subprocess.Popen(["haproxy", "-db", "-f", str(cfg), "-f",
                                     str(Path(tmp) / "stats.cfg")], env=env,
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            _until(lambda: proc.poll() is not None or (stats.exists() and _can_connect(port)),
                   "the sidecar listens or exits")
            if proc.poll() is None:
                break
            stats.unlink(missing_ok=True)
        try:
            assert proc.poll() is None, "the sidecar did not start"
            handler.gateway_port = gateway_port
            yield port, stats, handler
        finally:
            handler.release.set()
            proc.terminate()
            proc.wait(10)
            vllm.shutdown()


@pytest.mark.parametrize("limits", [LIMITS, {"maxConcurrentRequests": 2, "maxQueueSize": 0,
                                             "overflowStatusCode": 503}])
def test_the_request_after_the_limit_and_the_queue_gets_the_status_and_none_before(limits):
    running, queue = limits["maxConcurrentRequests"], limits.get("maxQueueSize", 0)
    status = limits.get("overflowStatusCode", 429)
    held: list[socket.socket] = []
    with _worker(_limits_text(_render(limits))) as (port, stats, vllm):
        try:
            for i in range(1, running + queue + 1):
                held.append(_send(port))
                _until(lambda: len(vllm.arrived) == min(i, running)
                       and _queued(stats) == max(0, i - running),
                       f"request {i} running or queued")
            assert not any(_answered(s) for s in held)       # none refused before the limit
            # request N + Q + 1: on the gateway's port the file's status, on the routers' the
            # one no router retries (the router pod's front answers the file's for it)
            for ask, answer in ((vllm.gateway_port, status), (port, ROUTER_OVERFLOW_STATUS)):
                over = _send(ask)
                assert _status(over) == answer, ask
                over.close()
            for path in ("/health", "/metrics"):             # a full worker is not a dead one
                with socket.create_connection(("127.0.0.1", port)) as s:
                    s.sendall(f"GET {path} HTTP/1.1\r\nHost: w\r\n\r\n".encode())
                    assert _status(s) == 200
            assert len(vllm.arrived) == running              # vLLM never saw more
            vllm.release.set()
            assert [_status(s) for s in held] == [200] * (running + queue)
            # HAProxy frees a slot when it has seen the response end, which can come after the
            # client read the status line: the next requests go once it has
            _until(lambda: _queued(stats) == 0 and _backend(stats, "scur") == 0,
                   "the queue empties and every slot is free")
            vllm.release.clear()
            again = [_send(port) for _ in range(running)]    # the slots came back
            _until(lambda: len(vllm.arrived) == 2 * running + queue, "slots reused")
            vllm.release.set()
            assert [_status(s) for s in again] == [200] * running
        finally:
            for s in held:
                s.close()


def _sidecar_refusals(stats: Path) -> int:
    """4xx answers the sidecar gave (health checks pass through it too: not req_tot)."""
    lines = _stat_lines(stats)
    header = lines[0].lstrip("# ").split(",")
    row = next(line.split(",") for line in lines[1:] if line.startswith("routers,FRONTEND"))
    return int(row[header.index("hrsp_4xx")])


def _busy_worker_through_router(implementation: str, docs: list[dict]) -> dict:
    """One worker whose only slot is taken; a client asks the router pod as rendered: the real
    front (its config and key check) in front of the real router (its args)."""
    pod = next(d for d in docs if d["kind"] == "Deployment"
               and d["metadata"]["name"].endswith("-router"))["spec"]["template"]["spec"]
    container = pod["containers"][0]
    front_text = next(d["data"][FRONT_CONFIG] for d in docs if d["kind"] == "ConfigMap"
                      and d["metadata"]["name"].endswith("-router-front"))
    body = {"model": "m", "messages": [{"role": "user", "content": "x"}]}
    with _worker(_limits_text(docs)) as (port, stats, vllm), contextlib.ExitStack() as stack:
        for attempt in range(3):   # again on fresh ports if another process took one first
            binary, argv = router_launch(implementation, localize_router_args(
                container["args"], [f"http://127.0.0.1:{port}"], _free_port(), _free_port()))
            try:
                process = stack.enter_context(RouterProcess(argv, binary=binary,
                                                            env=container_env(container)))
                front = stack.enter_context(FrontProcess(front_text, process.port))
                break
            except RouterStartError as exc:
                if not port_clash(exc) or attempt == 2:
                    raise
        first = _send(process.port)                     # takes the worker's one slot
        _until(lambda: len(vllm.arrived) == 1, "the first request runs")
        before = _sidecar_refusals(stats)
        started = time.monotonic()
        busy = requests.post(f"{front.url}/v1/chat/completions", timeout=DEADLINE_S, json=body)
        busy_s = time.monotonic() - started
        calls = _sidecar_refusals(stats) - before
        vllm.release.set()
        first_status = _status(first)
        first.close()
        # the slot frees when HAProxy has seen the response end, maybe after the status line
        _until(lambda: _backend(stats, "scur") == 0, "the worker's slot is free again")
        healthy = [w for w in process.workers() if w.get("is_healthy", True)]
        after = requests.post(f"{front.url}/v1/chat/completions", timeout=DEADLINE_S, json=body)
        return {"busy": busy.status_code, "retry_after": busy.headers.get("Retry-After"),
                "calls": calls, "first": first_status, "healthy": len(healthy),
                "after": after.status_code, "busy_s": busy_s}


@pytest.mark.parametrize("status", [429, 503])
def test_a_full_worker_fails_fast_through_the_router_pod_with_the_files_status(status):
    """Both routers, as rendered, behind the rendered front: the client of a full worker gets
    the file's overflowStatusCode with Retry-After at once (the sidecar answers the router a
    status neither router retries, which the front turns into the file's: a 429 there waited
    2.5 s for the routers' retry), the sidecar saw one call, and the worker stays listed and
    serves the next request."""
    cases = [("sglang-router", "prefixaware"), ("vllm-router", "roundrobin")]
    limits = {"maxConcurrentRequests": 1, "overflowStatusCode": status}
    rendered = [_render(limits, s) for _, s in cases]   # jsii: one thread
    with ThreadPoolExecutor(len(cases)) as pool:
        results = dict(zip(cases, pool.map(_busy_worker_through_router,
                                           [r for r, _ in cases], rendered)))
    for case, r in results.items():
        busy_s = r.pop("busy_s")
        assert r == {"busy": status, "retry_after": "1", "calls": 1, "first": 200,
                     "healthy": 1, "after": 200}, case
        assert busy_s < 1.0, (case, busy_s)   # nothing waits for the routers' 2.5 s retry


def _millicores(quantity: str) -> int:
    return int(quantity[:-1]) if quantity.endswith("m") else int(float(quantity) * 1000)


def _can_connect(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


@pytest.mark.parametrize("strategy", ["prefixaware", "kvaware"])
def test_the_routers_reach_the_workers_only_through_the_sidecar(strategy):
    """Discovery's port, the static lists (kvaware) and the router's network policy all name
    the sidecar; vLLM listens on loopback only, so Prometheus (the Service's `http` port) and
    the kubelet's startup probe come through the sidecar too, and no policy admits vLLM's own
    port; the sidecar is a native sidecar."""
    docs = _render(LIMITS, strategy)
    router = next(d for d in docs if d["kind"] == "Deployment"
                  and d["metadata"]["name"].endswith("-router"))
    args = router["spec"]["template"]["spec"]["containers"][0]["args"]
    if strategy == "kvaware":
        urls = args[args.index("--worker-urls") + 1:]
        urls = urls[:next((i for i, a in enumerate(urls) if a.startswith("--")), len(urls))]
        assert urls and all(u.endswith(f":{WORKER_LIMITS_PORT}") for u in urls)
    else:
        assert args[args.index("--service-discovery-port") + 1] == str(WORKER_LIMITS_PORT)
    policy = next(d for d in docs if d["kind"] == "NetworkPolicy"
                  and d["metadata"]["name"].endswith("-workers"))
    ports = {p["port"] for rule in policy["spec"]["ingress"] for p in rule.get("ports", [])}
    assert WORKER_LIMITS_PORT in ports
    worker = next(d for d in docs if d["kind"] in ("Deployment", "StatefulSet")
                  and d["metadata"]["name"].endswith("-workers"))
    sidecar = next(c for c in worker["spec"]["template"]["spec"]["initContainers"]
                   if c["name"] == "request-limits")
    assert sidecar["restartPolicy"] == "Always"
    vllm_c = worker["spec"]["template"]["spec"]["containers"][0]
    assert vllm_c["args"][vllm_c["args"].index("--host") + 1] == "127.0.0.1"
    assert vllm_c["startupProbe"]["httpGet"]["port"] == WORKER_LIMITS_PORT
    service = next(d for d in docs if d["kind"] == "Service"
                   and d["metadata"]["name"] == worker["metadata"]["name"])
    (http,) = [p for p in service["spec"]["ports"] if p["name"] == "http"]
    assert http["targetPort"] == "limited"
    vllm_port = next(p["containerPort"] for p in vllm_c["ports"] if p["name"] == "http")
    assert vllm_port not in ports
    assert sidecar["image"] == router["spec"]["template"]["spec"]["containers"][0]["image"]
    # the sidecar comes out of the worker's share: the pod still fits its node
    vllm = worker["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"]
    cfg = _env("dev")
    seed = parse_endpoint(cfg.name, "endpoints/test.yaml", copy.deepcopy(SEED))
    assert _millicores(vllm["cpu"]) + _millicores(sidecar["resources"]["requests"]["cpu"]) \
        <= _millicores(seed.cpu)


@pytest.mark.parametrize("limits,field", [
    ({"maxConcurrentRequests": 0}, "maxConcurrentRequests"),
    ({"maxConcurrentRequests": 2, "maxQueueSize": -1}, "maxQueueSize"),
    ({"maxConcurrentRequests": 2, "overflowStatusCode": 200}, "overflowStatusCode"),
])
def test_bad_limits_are_one_line_naming_the_field(limits, field):
    with pytest.raises(ConfigError, match=field):
        _render(limits)


def _post_as(front_port: int, client: str) -> socket.socket:
    """An inference request as the NLB hands it on for `client` (its PROXY header)."""
    sock = nlb_connection(front_port, client)
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": client}]})
    sock.sendall(f"POST /v1/chat/completions HTTP/1.1\r\nHost: f\r\nContent-Type: "
                 f"application/json\r\nContent-Length: {len(body)}\r\n\r\n{body}".encode())
    return sock


def test_one_client_cannot_take_every_slot_from_the_others():
    """A hog and a polite client through the rendered front, router and sidecar: one worker
    of 4 slots, so each address may hold 2 (fair_share). The hog's third and fourth are
    refused at the front at once with the file's status; the polite client's two run."""
    limits = {"maxConcurrentRequests": 4}
    docs = _render(limits, "roundrobin", replicas=1)
    pod = next(d for d in docs if d["kind"] == "Deployment"
               and d["metadata"]["name"].endswith("-router"))["spec"]["template"]["spec"]
    container = pod["containers"][0]
    front_text = next(d["data"][FRONT_CONFIG] for d in docs if d["kind"] == "ConfigMap"
                      and d["metadata"]["name"].endswith("-router-front"))
    assert "sc_trackers(1) gt 2" in front_text
    with _worker(_limits_text(docs)) as (port, stats, vllm), contextlib.ExitStack() as stack:
        binary, argv = router_launch("vllm-router", localize_router_args(
            container["args"], [f"http://127.0.0.1:{port}"], _free_port(), _free_port()))
        process = stack.enter_context(RouterProcess(argv, binary=binary,
                                                    env=container_env(container)))
        front = stack.enter_context(FrontProcess(front_text, process.port))
        hog = [_post_as(front.port, "198.51.100.7") for _ in range(2)]
        _until(lambda: len(vllm.arrived) == 2, "the hog's share runs")
        started = time.monotonic()
        refused = [_post_as(front.port, "198.51.100.7") for _ in range(2)]
        assert [_status(s) for s in refused] == [429, 429]
        refused_s = time.monotonic() - started
        polite = [_post_as(front.port, "198.51.100.8") for _ in range(2)]
        _until(lambda: len(vllm.arrived) == 4, "the polite client's run beside the hog's")
        vllm.release.set()
        assert [_status(s) for s in hog + polite] == [200] * 4
        for s in hog + refused + polite:
            s.close()
        assert refused_s < 1.0, refused_s


@pytest.mark.parametrize("resources,field", [({"cpu": "1"}, "cpu"),
                                             ({"memory": "8Gi"}, "memory")])
def test_a_worker_the_sidecar_leaves_too_little_is_one_line(resources, field):
    """A worker of 1 CPU (a drawn environment's) with request limits: the sidecar's 250m would
    leave vLLM 750m. One line naming the field at synth, not the render's ValueError; the
    figure it names passes."""
    import re

    from k8s.serving import fit_endpoint

    cfg = _env("dev")
    raw = copy.deepcopy(SEED)
    raw["spec"]["worker"]["requestLimits"] = {"maxConcurrentRequests": 4}
    raw["spec"]["kvCacheSpec"] = {"enableL1Cache": False, "enableL2Cache": False}
    raw["spec"]["worker"]["resources"]["requests"].update(resources)
    with pytest.raises(ConfigError) as err:
        fit_endpoint(cfg, parse_endpoint(cfg.name, "endpoints/test.yaml", raw))
    assert err.value.field.endswith(f"worker.resources.requests.{field}")
    assert "\n" not in str(err.value) and "sidecar" in err.value.allowed
    floor = re.search(r"at least (\S+?)( CPU)?:", err.value.allowed)[1]
    raw["spec"]["worker"]["resources"]["requests"][field] = floor
    fit_endpoint(cfg, parse_endpoint(cfg.name, "endpoints/test.yaml", raw))
