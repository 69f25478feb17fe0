"""The router pod's front against one hostile client: each strategy's real router, started with
its rendered args and environment (bound to 127.0.0.1) behind the front (real HAProxy with the
rendered ConfigMap text), both routers where both serve a strategy, the load balancer played by
FAKE_NLB (PROXY protocol v2, as an AWS NLB with proxy protocol on).

Nothing that reaches the client port may change the worker set. The attacker there is a client
holding the endpoint key, the strongest one: sglang-router 0.3.2 lets such a client add a
worker (POST /workers), vllm-router 0.1.17 lets anyone (POST /add_worker), and the worker
added got other clients' chats with their Authorization header (bench/router_checks.py
`control` measures it without the front). Nothing runs for a client without the key; one
client's connections, bodies and the worker failures it provokes cost others nothing; no log
line carries a prompt, a session id or the key. Small, fast versions of the attacks that
`python -m bench.attacks` runs at full size."""
from __future__ import annotations

import contextlib
import json
import http.server
import socket
import subprocess
import threading
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from bench.loopback import (
    FAKE_NLB, FakeWorkerPool, FrontProcess, RouterProcess, RouterStartError, chat,
    container_env, localize_for_pool, nlb_connection, port_clash, proxy_v2_header,
    router_launch,
)
from bench.router_checks import rss_mib
from k8s.router import memory_bytes
from k8s.router_front import CLIENT_ROUTES, FRONT_CONFIG, PER_SOURCE_CONNECTIONS
from config.contracts import default_router
from tests.e2e.conftest import WORKER_OPTS, _container, _kv_worker_opts, _rendered_docs

pytestmark = pytest.mark.e2e
KEY = "endpoint-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
FAIL_MARKER = "an-input-the-engine-fails-on"   # the fake workers answer it with 500
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
    opts = {**WORKER_OPTS, "fail_marker": FAIL_MARKER,
            **(_kv_worker_opts(REPLICAS) if strategy == "kvaware" else {})}
    with contextlib.ExitStack() as stack:
        pool = stack.enter_context(FakeWorkerPool(REPLICAS, **opts))
        binary, argv = router_launch(router, localize_for_pool(container["args"], pool))
        process = stack.enter_context(RouterProcess(
            [*argv, "--api-key", KEY], binary=binary, api_key=KEY,
            env=container_env(container)))
        if strategy == "kvaware":
            pool.wait_kv_subscribers(1)
        front = stack.enter_context(FrontProcess(config, process.port, api_key=KEY))
        return stack.pop_all(), pool, process, front


@pytest.fixture(scope="module")
def fronted():
    """Every case's router and front, started side by side; an attacker's worker."""
    evil = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Evil)
    threading.Thread(target=evil.serve_forever, kwargs={"poll_interval": 0.05},
                     daemon=True).start()
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
    containers = {c["name"]: c for c in pod["containers"]}
    router, front = containers["router"], containers["front"]
    assert front["command"][0] == "haproxy" and front["image"] == router["image"]
    assert {c["image"] for c in containers.values()} == {router["image"]}   # the reaper's too
    assert front["ports"][0]["containerPort"] == 8000 and "ports" not in router or all(
        p["name"] != "http" for p in router["ports"])
    assert router["args"][router["args"].index("--host") + 1] == "127.0.0.1"
    series = json.loads((ROOT / "images" / "router" / "lock.json").read_text())[
        "debian"]["haproxy_series"]
    version = subprocess.run([front_binary(), "-v"], capture_output=True, text=True).stdout
    assert version.startswith(f"HAProxy version {series}."), version


def _refused_within(port: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) != 0:
                return True
        time.sleep(0.05)
    return False


# --------------------------------------------------------------------------- one hostile client


def _exchange(port: int, data: bytes, *, nlb_client: str | None = None, nlb: bool = False,
              timeout: float = 5.0) -> bytes:
    """Send raw bytes, return the response's status line (b"" if the front closed without
    one). ``nlb``: from the fake NLB, after its PROXY header for ``nlb_client`` (None: the
    NLB's own health check); else from 127.0.0.1 (in-cluster, or the kubelet)."""
    sock = (nlb_connection(port, nlb_client, timeout=timeout) if nlb else
            socket.create_connection(("127.0.0.1", port), timeout=timeout))
    answer = b""
    try:
        sock.sendall(data)
        while b"\r\n" not in answer:
            chunk = sock.recv(4096)
            if not chunk:
                break
            answer += chunk
        return answer.split(b"\r\n", 1)[0]
    except ConnectionResetError:
        return b""
    except TimeoutError:       # no HTTP/1 answer (e.g. an HTTP/2 SETTINGS frame): what came
        return answer[:64]
    finally:
        sock.close()


def _closed_unanswered(sock: socket.socket) -> bool:
    """The front closed (or reset) the connection without an answer."""
    try:
        return sock.recv(100) == b""
    except ConnectionResetError:
        return True


def _get(path: str, headers: str = "") -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: router\r\n{headers}Connection: close\r\n\r\n".encode()


def _chat_body(content: str) -> bytes:
    return json.dumps({"model": "fake-model", "max_tokens": 2,
                       "messages": [{"role": "user", "content": content}]}).encode()


def _post(path: str, body: bytes, headers: str = "") -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: router\r\nContent-Type: application/json\r\n"
            f"{headers}Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode() + body


@pytest.mark.parametrize("strategy, router", CASES, ids=[f"{s}@{r}" for s, r in CASES])
def test_nothing_runs_for_a_client_without_the_key(fronted, strategy, router):
    """vllm-router checks no key, and its cache_aware and kv_aware render every request on a
    worker with the router's own key before the worker could refuse it (5 keyless chats made
    10 render calls); sglang-router answered GET /v1/models without one. The front checks the
    key, so a client without it (or with a wrong one, or two Authorization headers, or the key
    in the query string) reaches neither the router nor a worker; the probes need none."""
    routers, _ = fronted
    pool, process, front = routers[(strategy, router)]
    pool.reset()
    served_before = process.served()
    body = _chat_body("who holds no key")
    attempts = {
        "no key": _post("/v1/chat/completions", body),
        "wrong key": _post("/v1/chat/completions", body, "Authorization: Bearer wrong\r\n"),
        "key twice": _post("/v1/chat/completions", body,
                           f"Authorization: Bearer wrong\r\nAuthorization: Bearer {KEY}\r\n"),
        "key in the query": _post(f"/v1/chat/completions?api_key={KEY}", body),
        "scheme only": _post("/v1/chat/completions", body, "Authorization: Bearer\r\n"),
        "models, no key": _get("/v1/models"),
    }
    answers = {name: _exchange(front.port, data) for name, data in attempts.items()}
    assert set(answers.values()) == {b"HTTP/1.1 401 Unauthorized"}, answers
    stats = pool.stats().values()
    assert sum(w["render_calls"] + w["tokenize_calls"] + w["requests"] for w in stats) == 0
    assert process.served() == served_before
    for probe in ("/health", "/liveness", "/readiness"):
        assert _exchange(front.port, _get(probe)) == b"HTTP/1.1 200 OK", probe
    assert _exchange(front.port, _get("/v1/models", f"Authorization: Bearer {KEY}\r\n")) == \
        b"HTTP/1.1 200 OK"
    assert KEY not in front.log_text()      # the refused query string is not logged


def test_http2_head_and_chunked_bodies_are_refused(fronted):
    """HAProxy spoke h2c on the plain bind: 100 streams per connection, each holding a router
    connection (100 x 100 took every slot). HTTP/1.1 only now: the HTTP/2 preface is a bad
    request. `METH_GET` admitted HEAD; a chunked body has no length the front can check (the
    router answered 400 past its limit): 411."""
    routers, _ = fronted
    _, _, front = routers[("prefixaware", "sglang-router")]
    preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
    assert _exchange(front.port, preface) == b"HTTP/1.1 400 Bad request"
    assert _exchange(front.port, _get("/health").replace(b"GET", b"HEAD", 1)) == \
        b"HTTP/1.1 403 Forbidden"
    chunked = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: router\r\nAuthorization: Bearer "
               f"{KEY}\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
               f"5\r\nhello\r\n0\r\n\r\n").encode()
    assert _exchange(front.port, chunked) == b"HTTP/1.1 411 Length Required"


def test_the_nlb_path_carries_the_client_address(fronted):
    """The NLB (proxy protocol v2) names the client in a PROXY header: the front requires it
    from the load balancer's addresses, logs the client's address, and its health checks
    (command LOCAL) pass; the kubelet and in-cluster clients send none, and may not send one
    (an in-cluster client could name any address)."""
    routers, _ = fronted
    _, _, front = routers[("session", "vllm-router")]
    client = "198.51.100.23"
    assert _exchange(front.port, _get("/readiness"), nlb=True) == b"HTTP/1.1 200 OK"
    assert _exchange(front.port, _get("/readiness")) == b"HTTP/1.1 200 OK"   # the kubelet
    refused = _get(f"/add_worker?url=http://evil&api_key={KEY}", "Authorization: Bearer x\r\n")
    assert _exchange(front.port, refused, nlb=True, nlb_client=client) == b"HTTP/1.1 403 Forbidden"
    ok = chat(front.url, [{"role": "user", "content": "through the NLB"}], "nlb", False, 2,
              headers=AUTH, via_nlb=client)
    assert ok.ok, ok
    # the NLB's address without its header, and a header from elsewhere: no request served
    sock = socket.create_connection(("127.0.0.1", front.port), timeout=5,
                                    source_address=(FAKE_NLB, 0))
    with sock:
        sock.sendall(_get("/readiness"))
        assert _closed_unanswered(sock)
    spoofed = proxy_v2_header("203.0.113.99") + _get("/readiness")
    assert _exchange(front.port, spoofed) == b"HTTP/1.1 400 Bad request"
    time.sleep(0.2)
    line = [ln for ln in front.log_text().splitlines() if "/add_worker" in ln][-1]
    assert line.startswith(f"{client}:") and KEY not in line and "evil" not in line, line


@pytest.mark.parametrize("strategy, router", [("prefixaware", "sglang-router"),
                                              ("session", "vllm-router")])
def test_one_client_cannot_take_the_pods_slots_or_memory(fronted, strategy, router):
    """One address holding the front's connections (4,200 idle, slowloris and slow-body ones
    left a well-behaved client 0 of 2 chats) and parking bodies one byte short of their
    length at the payload limit in the router (+1.2 GiB past its 1 GiB limit with 2,000): the
    front takes PER_SOURCE_CONNECTIONS from one address and closes the rest, while another
    client is served promptly and the router stays well inside its memory limit."""
    routers, _ = fronted
    _, process, front = routers[(strategy, router)]
    container = _container(strategy, None, "Deployment", "-router", _override(strategy, router))
    limit = int(container["args"][container["args"].index("--max-payload-size") + 1])
    memory_limit = memory_bytes(container["resources"]["limits"]["memory"]) / 2**20
    attacker, good = "198.51.100.66", "203.0.113.7"
    body = _chat_body("x" * limit)[:limit - 1]
    parked = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: router\r\nContent-Type: "
              f"application/json\r\nAuthorization: Bearer {KEY}\r\nContent-Length: {limit}"
              f"\r\n\r\n").encode() + body
    held: list[socket.socket] = []
    try:
        for i in range(PER_SOURCE_CONNECTIONS):
            sock = nlb_connection(front.port, attacker, client_port=20000 + i)
            if i % 2:
                sock.sendall(parked)
            held.append(sock)
        time.sleep(0.3)
        extra = nlb_connection(front.port, attacker, client_port=19999)
        with extra:
            extra.sendall(_get("/health"))
            assert _closed_unanswered(extra), "a connection past the address's share was served"
        peak = rss_mib(process.pid)
        chats = []
        for i in range(20):
            chats.append(chat(front.url, [{"role": "user", "content": f"good {i}"}], f"g{i}",
                              False, 2, headers=AUTH, timeout=10, via_nlb=good))
            peak = max(peak, rss_mib(process.pid))
    finally:
        for sock in held:
            sock.close()
    served = [c for c in chats if c.ok and c.total_s <= 5.0]
    assert len(served) >= 19, [(c.status, round(c.total_s, 2)) for c in chats]
    assert peak < 0.8 * memory_limit, (peak, memory_limit)


def test_a_worker_failure_a_client_provokes_costs_others_nothing(fronted):
    """An input that makes a worker answer 500: vllm-router's breaker opened for everyone
    (3 of the next 20 good chats got 503) and sglang-router tried it 8 times. Now, while one
    client sends such inputs, every other client's chat is answered within 5 s, and each costs
    the workers at most two calls (both routers, side by side); the failures leave no prompt or
    session id in a log."""
    routers, _ = fronted

    def case(key: tuple[str, str]) -> tuple:
        pool, _, front = routers[key]
        pool.reset()
        with ThreadPoolExecutor(6) as attacker:
            bad = [attacker.submit(chat, front.url, [{"role": "user", "content":
                                                     f"{FAIL_MARKER} {PROMPT} {j}"}],
                                   f"{SESSION}-b{j}", False, 2, headers=AUTH, timeout=30)
                   for j in range(6)]
            time.sleep(0.1)
            good = [chat(front.url, [{"role": "user", "content": f"fine {i}"}], f"s{i}",
                         False, 2, headers=AUTH, timeout=10) for i in range(20)]
            statuses = [f.result().status for f in bad]
        good += [chat(front.url, [{"role": "user", "content": f"after {i}"}], f"s{i}", False,
                      2, headers=AUTH, timeout=10) for i in range(5)]
        return statuses, good, sum(w.stats()["failed"] for w in pool)

    with ThreadPoolExecutor(2) as both:
        results = dict(zip(["sglang", "vllm"], both.map(case, [
            ("prefixaware", "sglang-router"), ("session", "vllm-router")])))
    for name, (statuses, good, calls) in results.items():
        assert set(statuses) == {500}, (name, statuses)
        assert all(g.ok and g.total_s <= 5.0 for g in good), \
            (name, [(g.status, round(g.total_s, 2)) for g in good])
        assert calls <= 2 * len(statuses), (name, calls)
    time.sleep(0.3)
    for key in [("prefixaware", "sglang-router"), ("session", "vllm-router")]:
        _assert_no_client_data(key, *routers[key][1:])


PROMPT, SESSION = "prompt-4111-1111", "session-7f3a9"


def _assert_no_client_data(key, process: RouterProcess, front: FrontProcess) -> None:
    for name, text in {"router": process.log_text(), "front": front.log_text()}.items():
        for needle in (PROMPT, SESSION, KEY):
            assert needle not in text, f"{needle!r} in the {name} log of {key}:\n" + \
                "\n".join(ln for ln in text.splitlines() if needle in ln)[:2000]


def test_no_prompt_session_or_key_in_any_log(fronted):
    """At the rendered log levels: vllm-router 0.1.17 ignored its `--log-level` and, under the
    session strategy, logged each request's routing key three times at INFO (the prompt
    itself without a session header); the front logged refused URLs with their query string.
    Good requests (streamed or not, with and without a session id), refused ones and 4xx
    leave none of the client's data in any router's or front's log, on every strategy (worker
    500s: the test above)."""
    routers, _ = fronted

    def case(key: tuple[str, str]) -> None:
        pool, process, front = routers[key]
        sent = [chat(front.url, [{"role": "user", "content": f"{PROMPT} {i}"}],
                     f"{SESSION}-{i}" if i % 2 else None, stream, 2, headers=AUTH)
                for i in range(4) for stream in (False, True)]
        sent.append(chat(front.url, [{"role": "user", "content": PROMPT}], SESSION, False, 2,
                         headers=AUTH, model="no-such-model"))
        _exchange(front.port, _post(f"/v1/chat/completions?key={KEY}", _chat_body(PROMPT),
                                    f"X-Session-ID: {SESSION}\r\n"))
        _exchange(front.port, _post(f"/add_worker?key={KEY}&p={PROMPT}", b"{}"))
        assert [r.status for r in sent[:8]] == [200] * 8 and 400 <= sent[-1].status < 500, \
            (key, [r.status for r in sent])
        time.sleep(0.3)
        _assert_no_client_data(key, process, front)

    with ThreadPoolExecutor(len(CASES)) as every:
        list(every.map(case, CASES))
