"""The router's hardening, measured on 127.0.0.1 with the real pinned routers and the real front
(HAProxy), each started exactly as the default environment's router pod renders them.

    python -m bench.router_checks control     # who can change the worker set, per strategy
    python -m bench.router_checks burst       # a client's 4xx burst vs everyone else
    python -m bench.router_checks faults      # hung worker, dead worker, killed router
    python -m bench.router_checks soak --minutes 10 --rate 20   # memory plateau, 0 errors
    python -m bench.router_checks placement   # low-load placement vs fleet cache capacity
    python -m bench.router_checks logs        # log bytes per request
    python -m bench.router_checks front       # the front's added latency

Figures, not assertions: each prints its numbers (docs/serving.md and docs/runbook.md cite
them). `--extra-args='--flag value ...'` appends router flags (the last value of a flag wins),
to compare a setting with the rendered one. Standard library and the project only.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import http.client
import http.server
import json
import os
import shlex
import signal
import statistics
import sys
import threading
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Iterator, Self

from bench.loopback import (
    ChatResult, FakeWorkerPool, FrontProcess, RouterProcess, chat, container_env, filler,
    localize_for_pool, router_launch,
)

ROOT = Path(__file__).resolve().parent.parent
ENV = "dev"
CASES = [("prefixaware", "sglang-router"), ("roundrobin", "sglang-router"),
         ("prefixaware", "vllm-router"), ("roundrobin", "vllm-router"),
         ("session", "vllm-router"), ("kvaware", "vllm-router")]
# The endpoint key the router pods here run with; every client sends it (the front refuses
# clients without it).
KEY = "endpoint-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
# Slow enough that requests overlap in the router, fast enough for many per second.
WORKER_OPTS = {"prefill_ms_per_token": 0.05, "decode_ms_per_token": 4.0, "overhead_ms": 1.0}


# --------------------------------------------------------------------------- the rendered pod


@dataclasses.dataclass(frozen=True)
class RenderedRouter:
    implementation: str
    args: list[str]                 # the router container's args
    front_config: str               # the front's ConfigMap text
    kv_worker_opts: dict            # FakeWorker options of the rendered kvaware workers
    env: list = dataclasses.field(default_factory=list)   # the router container's env
    memory_limit: str = "1Gi"       # the router container's memory limit


def rendered(strategy: str | None = None, router: str | None = None,
             replicas: int | None = None, context_tokens: int | None = None) -> RenderedRouter:
    """The router pod of the default environment's first endpoint, switched to `strategy`
    (its own if None), to `router` (as `routerImplementations` would), `replicas` and a
    model context of `context_tokens` (vLLM's --max-model-len)."""
    import cdk8s

    from config import resolve_environment
    from config.context import repository_context
    from config.endpoint_spec import arg_value
    from k8s.router_front import FRONT_CONFIG
    from k8s.serving import build_charts, load_endpoints, placeholder_facts

    cfg = resolve_environment({**repository_context(ROOT), "env": ENV})
    spec = load_endpoints(cfg, ROOT)[0]
    spec = dataclasses.replace(spec, routing_strategy=strategy or spec.routing_strategy,
                               replicas=replicas or spec.replicas)
    if context_tokens:
        args = list(spec.worker_args)
        if "--max-model-len" in args:
            i = args.index("--max-model-len")
            del args[i:i + 2]
        args = [a for a in args if not a.startswith("--max-model-len=")]
        spec = dataclasses.replace(spec, worker_args=(*args, "--max-model-len",
                                                      str(context_tokens)))
    if router:
        cfg = dataclasses.replace(cfg, router_implementations={spec.routing_strategy: router})
    docs = [d for chart in build_charts(cdk8s.App(), cfg, (spec,),
                                        placeholder_facts(cfg, (spec,)))
            for d in chart.to_json()]
    deployment = next(d for d in docs if d["kind"] == "Deployment"
                      and d["metadata"]["name"].endswith("-router"))
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    front = next(d for d in docs if d["kind"] == "ConfigMap"
                 and d["metadata"]["name"].endswith("-router-front"))
    kv_opts: dict = {}
    workers = [d for d in docs if d["kind"] == "StatefulSet"]
    if workers:
        wargs = workers[0]["spec"]["template"]["spec"]["containers"][0]["args"]
        events = json.loads(arg_value(wargs, "--kv-events-config") or "{}")
        kv_opts = {"block_size": int(arg_value(wargs, "--block-size") or 16),
                   "kv_events_port": 0, "kv_events_topic": events.get("topic", "")}
    return RenderedRouter(container["command"][-1], list(container["args"]),
                          front["data"][FRONT_CONFIG], kv_opts, list(container.get("env", [])),
                          container["resources"]["limits"]["memory"])


@contextlib.contextmanager
def router_pod(r: RenderedRouter, pool: FakeWorkerPool, *, extra: tuple[str, ...] = (),
               front: bool = True, api_key: str | None = KEY, env: dict | None = None
               ) -> Iterator[tuple[RouterProcess, FrontProcess | None]]:
    """The rendered router (and its front) in front of `pool`, the router with its rendered
    environment (and `env` over it); yields (router, front)."""
    binary, argv = router_launch(r.implementation, localize_for_pool(r.args, pool))
    argv = [*argv, *extra, *(["--api-key", api_key] if api_key else [])]
    with RouterProcess(argv, binary=binary, api_key=api_key,
                       env={**container_env({"env": r.env}), **(env or {})}) as process:
        if "--kv-event-source" in argv:
            pool.wait_kv_subscribers(1)
        if not front:
            yield process, None
            return
        with FrontProcess(r.front_config, process.port, api_key=api_key) as f:
            yield process, f


def _name(strategy: str | None, r: RenderedRouter) -> str:
    return f"{strategy or 'default'}@{r.implementation}"


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _status(port: int, method: str, path: str, body: Any = None,
            headers: dict | None = None) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        data = json.dumps(body).encode() if body is not None else None
        conn.request(method, path, body=data, headers={"Content-Type": "application/json",
                                                       **(headers or {})})
        return conn.getresponse().status
    except OSError as exc:
        return -1 if not str(exc) else -2
    finally:
        conn.close()


class Background:
    """A context manager that runs ``_run`` on a daemon thread while the block runs; ``_run``
    ends when ``_stop`` is set."""

    def __init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()


class Load(Background):
    """Open-loop chats at `rate` per second from a pool of threads until stopped; every result
    kept with its send time. Sessions cycle over `sessions` system prompts of `words`."""

    def __init__(self, url: str, rate: float, *, sessions: int = 13, words: int = 200,
                 unique_words: int = 0, max_tokens: int = 16, timeout: float = 60.0) -> None:
        super().__init__()
        self.url, self.rate, self.sessions, self.words = url, rate, sessions, words
        self.unique_words, self.max_tokens, self.timeout = unique_words, max_tokens, timeout
        self.results: list[tuple[float, Any]] = []

    def _run(self) -> None:
        with ThreadPoolExecutor(256) as ex:
            t0, i = time.monotonic(), 0
            while not self._stop.is_set():
                s = i % self.sessions
                msgs = [{"role": "system", "content": filler(f"system-{s}", self.words)},
                        {"role": "user", "content": f"question {i} " + (
                            filler(f"doc-{i}", self.unique_words) if self.unique_words else "")}]
                self.results.append((time.monotonic(), ex.submit(
                    chat, self.url, msgs, f"s{s}", False, self.max_tokens,
                    timeout=self.timeout, headers=AUTH)))
                i += 1
                time.sleep(max(0.0, t0 + i / self.rate - time.monotonic()))

    def done(self, since: float = 0.0, until: float = float("inf")) -> list[ChatResult]:
        return [f.result() for t, f in self.results if since <= t < until]


# --------------------------------------------------------------------------- control routes


class _Recorder(http.server.BaseHTTPRequestHandler):
    """A worker an attacker adds: answers like one, records what reaches it."""

    seen: list = []
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: Any) -> None:
        pass

    def _reply(self) -> None:
        if self.command == "POST":
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.seen.append((self.path, self.headers.get("Authorization")))
        body = json.dumps({"id": "x", "object": "chat.completion", "model": "fake-model",
                           "worker_id": "attacker", "data": [{"id": "fake-model"}],
                           "tokens": [1, 2], "count": 2, "max_model_len": 4096,
                           "choices": [{"index": 0, "finish_reason": "stop", "message": {
                               "role": "assistant", "content": "stolen"}}],
                           "usage": {"prompt_tokens": 2, "completion_tokens": 1,
                                     "total_tokens": 3}}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = _reply


def control(a: argparse.Namespace) -> None:
    key = KEY
    evil_server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    threading.Thread(target=evil_server.serve_forever, kwargs={"poll_interval": 0.05},
                     daemon=True).start()
    evil = f"http://127.0.0.1:{evil_server.server_address[1]}"
    q = urllib.parse.quote
    for strategy, router in CASES:
        r = rendered(strategy, router, 2)
        with FakeWorkerPool(2, **WORKER_OPTS, **r.kv_worker_opts) as pool, \
                router_pod(r, pool, api_key=key) as (process, front):
            row = {}
            for label, port in (("front", front.port), ("router port", process.port)):
                _Recorder.seen.clear()
                attacks = {"add_worker": ("POST", f"/add_worker?url={q(evil)}", None),
                           "POST /workers": ("POST", "/workers", {"url": evil}),
                           "flush_cache": ("POST", "/flush_cache", None)}
                codes = {name: (_status(port, m, p, b), _status(port, m, p, b, {
                    "Authorization": f"Bearer {key}"})) for name, (m, p, b) in attacks.items()}
                time.sleep(1.5)
                for i in range(8):
                    chat(f"http://127.0.0.1:{port}", [{"role": "user", "content": f"hi {i}"}],
                         f"s{i}", False, 2, headers={"Authorization": f"Bearer {key}"})
                stolen = [s for s in _Recorder.seen if s[0].endswith("/chat/completions")]
                removed = _status(port, "POST", f"/remove_worker?url={q(pool.urls[0])}")
                time.sleep(0.5)
                row[label] = (f"add_worker/POST workers/flush_cache (no key, key) = "
                              f"{list(codes.values())}; attacker got {len(stolen)} of 8 chats"
                              f"{' with the key' if any(s[1] for s in stolen) else ''}; "
                              f"remove_worker (no key) {removed}; workers now "
                              f"{len(process.workers())}")
            for label, text in row.items():
                print(f"{strategy}@{router} via {label}: {text}", flush=True)
    evil_server.shutdown()


# --------------------------------------------------------------------------- 4xx burst


def burst(a: argparse.Namespace) -> None:
    """10 good requests per second; after 4 s one client sends `--bad` requests that a worker
    answers with 4xx (a model that does not exist), one after another."""
    for strategy, router in [(None, None), ("roundrobin", None)]:
        r = rendered(strategy, router)
        with FakeWorkerPool(4, **WORKER_OPTS) as pool, \
                router_pod(r, pool, extra=tuple(a.extra_args)) as (process, front):
            with Load(front.url, 10.0, words=30, max_tokens=4) as load:
                time.sleep(4.0)
                t_bad = time.monotonic()
                bad = [chat(front.url, [{"role": "user", "content": f"bad {j}"}], f"b{j}",
                            False, 4, model="no-such-model", headers=AUTH)
                       for j in range(a.bad)]
                time.sleep(21.0)
            after = load.done(since=t_bad)[:200]
            failed = [x.status for x in after if not x.ok]
            print(f"{_name(strategy, r)}: {a.bad} bad -> statuses "
                  f"{sorted({x.status for x in bad})}; of the next {len(after)} good "
                  f"requests {len(failed)} failed {sorted(set(failed))}", flush=True)


# --------------------------------------------------------------------------- faults


def faults(a: argparse.Namespace) -> None:
    for strategy in [None, "roundrobin"]:
        r = rendered(strategy)
        name = _name(strategy, r)
        for fault in ("hung", "dead", "router"):
            with FakeWorkerPool(4, **WORKER_OPTS) as pool, \
                    router_pod(r, pool, extra=tuple(a.extra_args)) as (process, front):
                print(f"{name} {fault}: {_fault(fault, pool, process, front, a)}", flush=True)


def _fault(fault: str, pool: FakeWorkerPool, process: RouterProcess, front: FrontProcess,
           a: argparse.Namespace) -> str:
    with Load(front.url, a.rate, timeout=a.freeze + 30) as load:
        time.sleep(4.0)
        victim = max(pool, key=lambda w: w.requests_served)
        t0 = time.monotonic()
        out_at = back_at = None
        if fault == "hung":
            victim.hang(a.freeze)
        elif fault == "dead":
            victim.stop()
        else:
            os.kill(process.pid, signal.SIGKILL)
            process.restart()
            back_at = time.monotonic() - t0
        held_at: dict[int, int] = {}
        while time.monotonic() - t0 < a.freeze:
            if fault != "router" and out_at is None and \
                    victim.url not in process.healthy_workers():
                out_at = time.monotonic() - t0
            for k in (2, 3, 5, 10):
                if k not in held_at and time.monotonic() - t0 >= k:
                    held_at[k] = victim.held["/v1/chat/completions"]
            time.sleep(0.1)
        t_end = time.monotonic()
    window = load.done(since=t0, until=t_end)
    failed = [x.status for x in window if not x.ok]
    slow = sorted(x.total_s for x in window if x.ok)
    text = (f"{len(window)} requests in {a.freeze:.0f} s: {len(failed)} failed "
            f"{sorted(set(failed))}, slowest {slow[-1] if slow else 0:.1f} s, "
            f">2 s: {sum(s > 2 for s in slow)}")
    if fault == "hung":
        text += (f"; out of the router after {out_at and round(out_at, 1)} s; chats held "
                 f"at 2/3/5/10 s: {[held_at.get(k) for k in (2, 3, 5, 10)]}")
    elif fault == "dead":
        text += f"; out of the router after {out_at and round(out_at, 1)} s"
    else:
        text += f"; router killed and restarted, serving again after {back_at:.1f} s"
    return text


# --------------------------------------------------------------------------- memory soak


def soak(a: argparse.Namespace) -> None:
    """The default router pod at `--rate` for `--minutes`: 13 chat sessions, each request
    carrying a new document of `--doc-words` words (every request adds text to the prefix
    tree, the case that grows it). RSS of the router and the front every 10 s."""
    r = rendered()
    samples: list[tuple[float, float, float]] = []
    with FakeWorkerPool(4, **WORKER_OPTS, max_model_len=10**6) as pool, \
            router_pod(r, pool, extra=tuple(a.extra_args)) as (process, front):
        t0 = time.monotonic()
        with Load(front.url, a.rate, unique_words=a.doc_words) as load:
            while time.monotonic() - t0 < a.minutes * 60:
                samples.append((time.monotonic() - t0, rss_mib(process.pid),
                                rss_mib(front.proc.pid)))
                print(f"{samples[-1][0]:5.0f} s router {samples[-1][1]:6.1f} MiB front "
                      f"{samples[-1][2]:5.1f} MiB, {len(load.results)} sent", flush=True)
                time.sleep(10.0)
        results = load.done()
    errors = [x.status for x in results if not x.ok]
    routers = [s[1] for s in samples]
    tail = [s[1] for s in samples if s[0] >= samples[-1][0] * 0.6]
    print(json.dumps({
        "requests": len(results), "errors": len(errors), "error_statuses": sorted(set(errors)),
        "router_rss_mib": {"start": routers[0], "max": max(routers), "last": routers[-1],
                           "last_40pct_min": min(tail), "last_40pct_max": max(tail)},
        "front_rss_mib_max": max(s[2] for s in samples),
        "tree_chars_sent": len(results) * len(filler("x", a.doc_words)),
        "args": {f: v for f, v in zip(r.args, r.args[1:])
                 if f in ("--max-tree-size", "--max-payload-size", "--eviction-interval-secs")},
        "ttft_p50_s": statistics.median([x.total_s for x in results if x.ok] or [0]),
    }, indent=1))


# --------------------------------------------------------------------------- placement


def placement(a: argparse.Namespace) -> None:
    """`--prefixes` documents of `--doc-words` words (one token per word for the fakes), read
    again and again by `--concurrency` clients, against 4 workers whose KV cache holds
    `--cache-tokens` each: the working set fits the fleet but not one worker. Per strategy:
    where the documents landed and the fleet's prefix-cache hit rate."""
    block = 16
    for strategy, router in [(None, None), ("prefixaware", "vllm-router"),
                             ("session", None), ("roundrobin", None)]:
        r = rendered(strategy, router)
        with FakeWorkerPool(4, prefill_ms_per_token=0.0, decode_ms_per_token=0.5,
                            overhead_ms=1.0, cache_blocks=a.cache_tokens // block,
                            max_model_len=10**6) as pool, \
                router_pod(r, pool, extra=tuple(a.extra_args)) as (process, front):
            docs = [filler(f"doc-{i}", a.doc_words) for i in range(a.prefixes)]
            order = [i for _ in range(a.rounds) for i in range(a.prefixes)]

            def ask(n: int) -> ChatResult:
                i = order[n]
                return chat(front.url, [{"role": "system", "content": docs[i]},
                                        {"role": "user", "content": f"q{n}"}],
                            f"doc-{i}", False, 4, headers=AUTH)

            first = [ask(n) for n in range(a.prefixes)]   # one at a time: an idle fleet
            pool.reset()
            with ThreadPoolExecutor(a.concurrency) as ex:
                rest = list(ex.map(ask, range(a.prefixes, len(order))))
            spread = sorted(((x.worker_id or "?") for x in first))
            per = {w: spread.count(w) for w in pool.ids}
            hits = sum(w.hit_tokens for w in pool) / max(1, sum(w.query_tokens for w in pool))
            print(f"{_name(strategy, r)}: first pass {per}; then "
                  f"{a.rounds - 1} rounds at concurrency {a.concurrency}: hit rate "
                  f"{hits:.2f}, failed {sum(not x.ok for x in first + rest)}", flush=True)


# --------------------------------------------------------------------------- logs and latency


def logs(a: argparse.Namespace) -> None:
    """Log bytes per request at the rendered level and at info (sglang-router's flag,
    vllm-router's RUST_LOG, which its flag cannot set)."""
    for strategy in [None, "roundrobin", "session"]:
        r = rendered(strategy)
        info = ({"env": {"RUST_LOG": "info"}} if r.implementation == "vllm-router" else
                {"extra": ("--log-level", "info")})
        for label, kw in (("rendered", {}), ("info", info)):
            with FakeWorkerPool(4, **WORKER_OPTS) as pool, \
                    router_pod(r, pool, **kw) as (process, front):
                before = process.log_path.stat().st_size
                n = 200
                ok = sum(chat(front.url, [{"role": "user", "content": f"hi {i}"}], f"s{i}",
                              False, 4, headers=AUTH).ok for i in range(n))
                bad = sum(not chat(front.url, [{"role": "user", "content": "x"}], "b",
                                   False, 4, model="nope", headers=AUTH).ok for _ in range(20))
                time.sleep(0.5)
                grown = process.log_path.stat().st_size - before
                print(f"{_name(strategy, r)} at {label}: {grown} bytes "
                      f"for {ok} good + {bad} refused requests "
                      f"({grown / (ok + bad):.0f} B/request); front log "
                      f"{len(front.log_text())} bytes", flush=True)


def front_latency(a: argparse.Namespace) -> None:
    r = rendered()
    with FakeWorkerPool(1, prefill_ms_per_token=0.0, decode_ms_per_token=0.5,
                        overhead_ms=1.0) as pool, router_pod(r, pool) as (process, front):
        msgs = [{"role": "user", "content": filler("latency", 2000)}]
        for url in (process.url, front.url) * 2:   # warm both paths
            chat(url, msgs, "s", True, 16, headers=AUTH)
        ttft: dict[str, list[float]] = {"router": [], "front": []}
        for _ in range(a.requests):   # interleaved, so drift hits both alike
            for label, url in (("router", process.url), ("front", front.url)):
                ttft[label].append(chat(url, msgs, "s", True, 16, headers=AUTH).ttft_s * 1e3)
        med = {k: statistics.median(v) for k, v in ttft.items()}
        print(f"TTFT median over {a.requests} streamed requests each (2,000-word prompt, one "
              f"worker): direct to the router {med['router']:.2f} ms, through the front "
              f"{med['front']:.2f} ms: +{med['front'] - med['router']:.2f} ms")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.router_checks", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="check", required=True)
    for name in ("control", "burst", "faults", "soak", "placement", "logs", "front"):
        s = sub.add_parser(name)
        s.add_argument("--extra-args", type=shlex.split, default=[],
                       help="router flags appended to the rendered args, as one string: "
                            "--extra-args='--log-level info'")
        if name == "burst":
            s.add_argument("--bad", type=int, default=24)
        if name == "faults":
            s.add_argument("--rate", type=float, default=20.0)
            s.add_argument("--freeze", type=float, default=20.0)
        if name == "soak":
            s.add_argument("--minutes", type=float, default=10.0)
            s.add_argument("--rate", type=float, default=20.0)
            s.add_argument("--doc-words", type=int, default=1200)
        if name == "placement":
            s.add_argument("--prefixes", type=int, default=40)
            s.add_argument("--doc-words", type=int, default=2000)
            s.add_argument("--cache-tokens", type=int, default=32000)
            s.add_argument("--rounds", type=int, default=4)
            s.add_argument("--concurrency", type=int, default=1)
        if name == "front":
            s.add_argument("--requests", type=int, default=200)
    a = p.parse_args(argv)
    {"control": control, "burst": burst, "faults": faults, "soak": soak,
     "placement": placement, "logs": logs, "front": front_latency}[a.check](a)
    return 0


if __name__ == "__main__":
    sys.exit(main())
