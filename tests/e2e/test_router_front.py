"""Nothing that reaches the client port may change the worker set: each strategy's real router,
started with its rendered args (bound to 127.0.0.1) behind the front (real HAProxy with the
rendered ConfigMap text), both routers where both serve a strategy. The attacker is a client
holding the endpoint key, the strongest one: sglang-router 0.3.2 lets such a client add a
worker (POST /workers), vllm-router 0.1.17 lets anyone (POST /add_worker), and the worker
added got other clients' chats with their Authorization header (bench/router_checks.py
`control` measures it without the front)."""
from __future__ import annotations

import contextlib
import http.server
import os
import socket
import subprocess
import threading
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from bench.loopback import (
    FakeWorkerPool, FrontProcess, RouterProcess, RouterStartError, chat, localize_for_pool,
    port_clash, router_launch,
)
from k8s.router_front import CLIENT_ROUTES, FRONT_CONFIG
from config.contracts import default_router
from tests.e2e.conftest import WORKER_OPTS, _container, _kv_worker_opts, _rendered_docs

pytestmark = pytest.mark.e2e
KEY = "endpoint-key"
REPLICAS = 2   # the seed endpoint's: kvaware's rendered args list that many workers
CASES = [("prefixaware", "sglang-router"), ("roundrobin", "sglang-router"),
         ("prefixaware", "vllm-router"), ("roundrobin", "vllm-router"),
         ("session", "vllm-router"), ("kvaware", "vllm-router")]


class _Evil(http.server.BaseHTTPRequestHandler):
    """A worker an attacker would add: it records whatever reaches it."""

    seen: list = []

    def log_message(self, *args) -> None:
        pass

    def do_GET(self) -> None:   # noqa: N802
        self.seen.append(self.path)
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_POST = do_GET


def _override(strategy: str, router: str | None) -> str | None:
    """`router` as a `routerImplementations` override, None where it is the default (so the
    render is shared with the other e2e tests)."""
    return None if router == default_router(strategy) else router


def front_config_text(strategy: str, router: str | None, replicas: int | None = None) -> str:
    """The front's config exactly as the rendered ConfigMap carries it."""
    for doc in _rendered_docs(strategy, replicas, _override(strategy, router)):
        if doc["kind"] == "ConfigMap" and doc["metadata"]["name"].endswith("-router-front"):
            return doc["data"][FRONT_CONFIG]
    raise AssertionError("no front ConfigMap rendered")


def _start(strategy: str, router: str, attempts: int = 3):
    """(its ExitStack, pool, router process, front) of one case; again on fresh ports if
    something took one of its ports before the router bound it."""
    for attempt in range(attempts):
        try:
            return _start_once(strategy, router)
        except RouterStartError as exc:
            if not port_clash(exc) or attempt == attempts - 1:
                raise


def _start_once(strategy: str, router: str):
    container = _container(strategy, None, "Deployment", "-router", _override(strategy, router))
    config = front_config_text(strategy, router)
    opts = {**WORKER_OPTS, **(_kv_worker_opts(REPLICAS) if strategy == "kvaware" else {})}
    with contextlib.ExitStack() as stack:
        pool = stack.enter_context(FakeWorkerPool(REPLICAS, **opts))
        binary, argv = router_launch(router, localize_for_pool(container["args"], pool))
        process = stack.enter_context(RouterProcess([*argv, "--api-key", KEY], binary=binary,
                                                    api_key=KEY))
        if strategy == "kvaware":
            pool.wait_kv_subscribers(1)
        front = stack.enter_context(FrontProcess(config, process.port))
        return stack.pop_all(), pool, process, front


@pytest.fixture(scope="module")
def fronted():
    """Every case's router and front, started side by side; an attacker's worker."""
    evil = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Evil)
    threading.Thread(target=evil.serve_forever, daemon=True).start()
    for strategy, router in CASES:   # render first: jsii serves one thread at a time
        _start_renders(strategy, router)
    with contextlib.ExitStack() as stack:
        stack.callback(evil.shutdown)
        with ThreadPoolExecutor(len(CASES)) as starting:
            futures = [starting.submit(_start, *case) for case in CASES]
        owned = [f.result()[0] for f in futures if f.exception() is None]
        stack.callback(_close_all, owned)
        for future in futures:
            future.result()   # the first start that failed, after every other is stopped
        started = {case: f.result()[1:] for case, f in zip(CASES, futures)}
        yield started, f"http://127.0.0.1:{evil.server_address[1]}"


def _close_all(stacks: list[contextlib.ExitStack]) -> None:
    """Stop every case at once (each router takes a moment to shut down)."""
    with ThreadPoolExecutor(max(1, len(stacks))) as stopping:
        list(stopping.map(contextlib.ExitStack.close, stacks))


def _start_renders(strategy: str, router: str) -> None:
    _container(strategy, None, "Deployment", "-router", _override(strategy, router))
    front_config_text(strategy, router)
    if strategy == "kvaware":
        _kv_worker_opts(REPLICAS)


def _attacks(evil: str, victim: str) -> list[tuple[str, str, dict | None]]:
    q = urllib.parse.quote
    return [("POST", f"/add_worker?url={q(evil)}", None),
            ("POST", f"/remove_worker?url={q(victim)}", None),
            ("POST", "/workers", {"url": evil}),
            ("DELETE", f"/workers/{q(victim, safe='')}", None),
            ("POST", "/flush_cache", None), ("GET", "/get_loads", None),
            ("GET", "/list_workers", None), ("GET", "/workers", None),
            # spellings of the same routes, and a client route with the wrong method
            ("POST", f"//add_worker?url={q(evil)}", None),
            ("POST", f"/v1/chat/completions/../../add_worker?url={q(evil)}", None),
            ("POST", f"/add_worker/?url={q(evil)}", None),
            ("GET", f"/add_worker?url={q(evil)}", None),
            ("DELETE", "/v1/chat/completions", None)]


@pytest.mark.parametrize("strategy, router", CASES, ids=[f"{s}@{r}" for s, r in CASES])
def test_the_client_port_cannot_change_the_worker_set(fronted, strategy, router):
    routers, evil = fronted
    pool, process, front = routers[(strategy, router)]
    _Evil.seen.clear()
    auth = {"Authorization": f"Bearer {KEY}"}
    refused = {}
    for method, path, body in _attacks(evil, pool.urls[0]):
        # http.client keeps the path as written (requests would normalise `..` away)
        status = _raw(front.port, method, path, body, auth)
        refused[f"{method} {path.split('?')[0]}"] = status
    assert set(refused.values()) == {403}, refused
    # the router's own view, on its loopback port: the same workers, all healthy
    assert sorted(process.healthy_workers()) == sorted(pool.urls)
    answers = [requests.post(f"{front.url}/v1/chat/completions", headers={**auth,
               "X-Session-ID": f"s{i}"}, json={"model": "fake-model", "max_tokens": 2,
               "messages": [{"role": "user", "content": f"hello {i}"}]}, timeout=10)
               for i in range(4)]
    assert [a.status_code for a in answers] == [200] * 4
    assert {a.json()["worker_id"] for a in answers} <= set(pool.ids)
    assert _Evil.seen == []


@pytest.mark.parametrize("strategy, router", CASES, ids=[f"{s}@{r}" for s, r in CASES])
def test_a_clients_4xx_burst_costs_other_clients_nothing(fronted, strategy, router):
    """sglang-router 0.3.2 counted each 4xx against the worker's circuit breaker: 24
    wrong-model requests failed 145 of the next 200 good ones. Now no good request fails,
    during the burst or after it, whatever the strategy."""
    routers, _ = fronted
    _, _, front = routers[(strategy, router)]
    auth = {"Authorization": f"Bearer {KEY}"}

    def good(i: int):
        return chat(front.url, [{"role": "user", "content": f"question {i}"}], f"s{i % 13}",
                    False, 2, headers=auth, timeout=30)

    with ThreadPoolExecutor(4) as ex:
        during = [ex.submit(good, i) for i in range(20)]
        bad = [chat(front.url, [{"role": "user", "content": f"typo {j}"}], f"b{j}", False, 2,
                    model="no-such-model", headers=auth) for j in range(16)]
        bad += [chat(front.url, [{"role": "user", "content": "x"}], "b", False, 2,
                     headers=auth, extra_body={"max_tokens": -1}) for _ in range(4)]
        after = list(ex.map(good, range(20, 40)))
    assert all(400 <= r.status < 500 for r in bad), [r.status for r in bad]
    assert [r.status for r in [f.result() for f in during] + after] == [200] * 40


def _raw(port: int, method: str, path: str, body: dict | None, headers: dict) -> int:
    import http.client
    import json

    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        data = json.dumps(body).encode() if body is not None else None
        conn.request(method, path, body=data, headers={**headers, "Content-Type":
                                                       "application/json"})
        return conn.getresponse().status
    finally:
        conn.close()


def test_every_client_route_passes_the_front(fronted):
    """The allowlist is the client API: each route reaches the router (no 403)."""
    routers, _ = fronted
    pool, process, front = routers[("prefixaware", "sglang-router")]
    auth = {"Authorization": f"Bearer {KEY}"}
    body = {"model": "fake-model", "max_tokens": 2, "prompt": "hi", "input": "hi",
            "messages": [{"role": "user", "content": "hi"}]}
    statuses = {path: _raw(front.port, method, path, body if method == "POST" else None, auth)
                for method, path in CLIENT_ROUTES}
    assert 403 not in statuses.values(), statuses
    assert statuses["/v1/chat/completions"] == statuses["/health"] == 200, statuses


def test_the_pod_runs_the_front_the_tests_run():
    """The front container is the router image's haproxy, of the series its lock pins
    (images/router/lock.json) and these tests run (Debian's package); the router binds only
    127.0.0.1."""
    import json
    import subprocess

    from bench.loopback import front_binary
    from tests.conftest import ROOT

    docs = _rendered_docs("prefixaware", None, None)
    pod = next(d for d in docs if d["kind"] == "Deployment"
               and d["metadata"]["name"].endswith("-router"))["spec"]["template"]["spec"]
    router, front = pod["containers"]
    assert front["command"][0] == "haproxy" and front["image"] == router["image"]
    assert front["ports"][0]["containerPort"] == 8000 and "ports" not in router or all(
        p["name"] != "http" for p in router["ports"])
    assert router["args"][router["args"].index("--host") + 1] == "127.0.0.1"
    series = json.loads((ROOT / "images" / "router" / "lock.json").read_text())[
        "debian"]["haproxy_series"]
    version = subprocess.run([front_binary(), "-v"], capture_output=True, text=True).stdout
    assert version.startswith(f"HAProxy version {series}."), version


def test_on_termination_the_front_finishes_open_streams_and_takes_no_new_ones():
    """The front container's preStop, run as rendered (its NLB wait shortened to 0 s) against
    the real HAProxy with the rendered config: a stream open at that moment completes, and
    new connections are refused once the soft stop began; the hook returns when HAProxy has
    exited (SIGTERM, which the kubelet sends after the hook, would have cut the stream)."""
    pod = next(d for d in _rendered_docs("roundrobin") if d["kind"] == "Deployment"
               and d["metadata"]["name"].endswith("-router"))["spec"]["template"]["spec"]
    front_c = next(c for c in pod["containers"] if c["name"] == "front")
    hook = front_c["lifecycle"]["preStop"]["exec"]["command"]
    router = default_router("roundrobin")
    container = _container("roundrobin", None, "Deployment", "-router")
    slow = {**WORKER_OPTS, "decode_ms_per_token": 50.0}       # ~2 s for 40 tokens
    with FakeWorkerPool(1, **slow) as pool:
        binary, argv = router_launch(router, localize_for_pool(container["args"], pool))
        with RouterProcess(argv, binary=binary) as process, \
                FrontProcess(front_config_text("roundrobin", None), process.port) as front:
            with ThreadPoolExecutor(1) as streaming:
                started = time.monotonic()
                open_stream = streaming.submit(
                    chat, front.url, [{"role": "user", "content": "a long answer please"}],
                    max_tokens=40)
                time.sleep(0.4)                                 # the stream has begun
                stopping = subprocess.Popen([*hook[:-1], "0"], env={
                    **os.environ, "FRONT_PID": str(front.proc.pid)})
                refused = _refused_within(front.port, 2.0)
                result = open_stream.result(timeout=30)
            # HAProxy exits once the stream is done (reaped here: in the pod it is PID 1, and
            # its exit ends the container), and with it the hook
            assert front.proc.wait(timeout=30) == 0
            assert stopping.wait(timeout=10) == 0
    assert refused, "the front still accepted connections after its soft stop"
    assert result.ok and result.tokens == 40, result
    assert time.monotonic() - started > 1.5     # it really was in flight across the stop


def _refused_within(port: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) != 0:
                return True
        time.sleep(0.05)
    return False
