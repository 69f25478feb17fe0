"""The real routers, started from the rendered Deployment's command and args, in front of 4 fake
workers: sglang-router for prefixaware (the chart's default), vllm-router for the others.

Each HyperPod routing strategy must do what its name promises: ``prefixaware`` keeps a
conversation where its prefix is cached and spreads distinct prefixes; ``roundrobin`` spreads
evenly; ``session`` pins an ``X-Session-ID`` to one worker. All on 127.0.0.1.
"""
from __future__ import annotations

import collections
import http.client
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from bench.fake_worker import (ARRIVAL_HEAD, FakeWorker, expected_chat_text, render_chat,
                               tokenize_text)
from bench.loopback import chat, filler, http_json, localize_router_args

pytestmark = pytest.mark.e2e

MAX_TOKENS = 16
METRICS = (
    "vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:prefix_cache_queries_total",
    "vllm:prefix_cache_hits_total", "vllm:prompt_tokens_total", "vllm:generation_tokens_total",
    "vllm:time_to_first_token_seconds_bucket", "vllm:e2e_request_latency_seconds_bucket",
    "vllm:kv_cache_usage_perc",
)


def test_prefixaware_keeps_conversations_on_one_worker_and_spreads_distinct_prefixes(router_for):
    router = router_for("prefixaware")
    sessions, turns = 8, 4
    start = threading.Barrier(sessions, timeout=10)

    def conversation(s: int) -> list:
        messages = [{"role": "system", "content": filler(f"system-{s}", 400)}]
        results = []
        start.wait()  # users arrive together, as in production; the router sees their load
        for turn in range(turns):
            messages.append({"role": "user", "content": filler(f"user-{s}-{turn}", 30)})
            res = chat(router.url, messages, max_tokens=MAX_TOKENS, timeout=10)
            assert res.ok, res
            results.append(res)
            messages.append({"role": "assistant", "content": res.text})
        return results

    with ThreadPoolExecutor(sessions) as pool:
        runs = list(pool.map(conversation, range(sessions)))

    placement = {s: [r.worker_id for r in results] for s, results in enumerate(runs)}
    for s, workers in placement.items():
        assert len(set(workers)) == 1, f"session {s} moved between workers: {placement}"
    per_worker = collections.Counter(workers[0] for workers in placement.values())
    assert len(per_worker) >= 3, f"distinct prefixes not spread: {placement}"
    assert max(per_worker.values()) <= sessions // 2, f"one worker took most: {per_worker}"
    # Staying put pays: every later turn finds the whole previous turn in the worker's cache.
    for s, results in enumerate(runs):
        for prev, cur in zip(results, results[1:]):
            assert cur.cached_tokens >= prev.usage["prompt_tokens"] - 16, (s, prev.usage, cur.usage)


@pytest.mark.parametrize("strategy, implementation", [
    ("prefixaware", "sglang-router"), ("roundrobin", "vllm-router"), ("session", "vllm-router"),
    ("kvaware", "vllm-router")])
def test_each_strategy_runs_the_router_the_chart_gives_it(strategy, implementation):
    from tests.e2e.conftest import rendered_implementation

    assert rendered_implementation(strategy) == implementation


def test_sglang_router_exports_every_catalogued_smg_metric(router_for):
    """Dashboards and alerts query sglang-router's own names (observability.metrics): each
    one must be in the real binary's /metrics once it has served a request."""
    from observability.metrics import CATALOGUE, SGLANG_ROUTER_SOURCE

    router = router_for("prefixaware")
    assert chat(router.url, [{"role": "user", "content": "metrics"}], stream=False,
                max_tokens=2, timeout=10).ok
    exported = {line.split("{")[0].split(" ")[0] for line in router.metrics_text().splitlines()
                if line and not line.startswith("#")}
    wanted = {s for m in CATALOGUE.values() if m.source == SGLANG_ROUTER_SOURCE for s in m.series
              if s != "smg_worker_retries_total"}   # exported once a retry happened
    assert wanted and not wanted - exported, sorted(wanted - exported)


def test_sglang_router_needs_the_model_field_that_openai_clients_send(router_for):
    """Known difference, documented in docs/serving.md: sglang-router 0.3.2 cannot read the
    model from vLLM (it asks SGLang-only endpoints) and fills a missing `model` with
    `unknown`, which vLLM refuses; vllm-router passes the body through and vLLM uses its
    served model. If a new pin changes this, the docs must change too."""
    ask = [{"role": "user", "content": "which model?"}]
    assert chat(router_for("prefixaware").url, ask, stream=False, max_tokens=2).ok
    bare = chat(router_for("prefixaware").url, ask, stream=False, max_tokens=2, model=None)
    assert bare.status == 404 and "`unknown` does not exist" in bare.error, bare
    assert chat(router_for("roundrobin").url, ask, stream=False, max_tokens=2, model=None).ok


def test_roundrobin_spreads_requests_evenly(router_for, worker_pool):
    router = router_for("roundrobin")
    n = 40
    counts = collections.Counter()
    for i in range(n):
        res = chat(router.url, [{"role": "user", "content": f"question {i}"}], stream=False,
                   max_tokens=2, timeout=10)
        assert res.ok, res
        counts[res.worker_id] += 1
    assert set(counts) == set(worker_pool.ids), counts
    assert max(counts.values()) - min(counts.values()) <= 1, counts


def test_session_pins_each_session_id_to_one_worker(router_for):
    router = router_for("session")
    placement = collections.defaultdict(set)
    for rnd in range(3):
        for s in range(24):
            res = chat(router.url, [{"role": "user", "content": f"round {rnd} of session {s}"}],
                       session_id=f"session-{s:03d}", stream=False, max_tokens=2, timeout=10)
            assert res.ok, res
            placement[s].add(res.worker_id)
    moved = {s: w for s, w in placement.items() if len(w) != 1}
    assert not moved, f"sessions moved between workers: {moved}"
    used = {next(iter(w)) for w in placement.values()}
    assert len(used) >= 3, f"24 session ids landed on {used}"


@pytest.mark.parametrize("strategy", ["prefixaware", "roundrobin", "session"])
def test_router_streams_the_workers_tokens(router_for, worker_pool, strategy):
    router = router_for(strategy)
    messages = [{"role": "system", "content": filler("stream-system", 300)},
                {"role": "user", "content": f"stream through {strategy}"}]
    res = chat(router.url, messages, session_id="stream-session", stream=True,
               max_tokens=MAX_TOKENS, timeout=10)
    assert res.status == 200 and res.error is None, res
    assert res.done, "stream ended without data: [DONE]"
    assert res.text == expected_chat_text(messages, MAX_TOKENS)
    assert res.tokens == MAX_TOKENS
    assert res.worker_id in worker_pool.ids
    assert set(res.chunk_worker_ids) == {res.worker_id}, res.chunk_worker_ids
    assert res.header_worker_id == res.worker_id  # the router passes worker headers through
    assert res.usage and res.usage["completion_tokens"] == MAX_TOKENS
    assert 0 < res.ttft_s <= res.total_s


def test_localize_router_args_changes_only_what_must_change(router_args):
    rendered = router_args("prefixaware") + [
        "--kv-event-source", "http://llama-0.serving:8000=tcp://llama-0.serving:5557",
    ]
    local = ["http://127.0.0.1:9001", "http://127.0.0.1:9002"]
    args = localize_router_args(
        rendered, local, 9100, 9101,
        kv_worker_map={"http://llama-0.serving:8000": local[0]},
        kv_endpoint_map={"tcp://llama-0.serving:5557": "tcp://127.0.0.1:9557"},
    )
    for gone in ("--service-discovery", "--selector", "--service-discovery-namespace",
                 "--service-discovery-port"):
        assert gone not in args, (gone, args)
    selector = rendered[rendered.index("--selector") + 1:]
    selector = selector[:next(i for i, a in enumerate(selector + ["--"]) if a.startswith("--"))]
    assert selector and not set(selector) & set(args), (selector, args)
    value = {a: args[i + 1] for i, a in enumerate(args[:-1]) if a.startswith("--")}
    assert value["--host"] == value["--prometheus-host"] == "127.0.0.1"
    assert (value["--port"], value["--prometheus-port"]) == ("9100", "9101")
    assert args.count("--port") == args.count("--host") == 1
    assert value["--kv-event-source"] == "http://127.0.0.1:9001=tcp://127.0.0.1:9557"
    assert args[-3:] == ["--worker-urls", *local]
    # Everything else reaches the router exactly as rendered, in order.
    moved = {rendered[rendered.index(f) + 1] for f in ("--host", "--port", "--prometheus-host")}
    kept = [a for a in rendered if a in args and a not in ("--host", "--port", *moved)]
    assert [a for a in args if a in kept] == kept
    assert value["--policy"] == "cache_aware"
    with pytest.raises(ValueError, match="in-cluster worker"):
        localize_router_args(rendered, local, 9100, 9101)


def test_fake_worker_tokenizes_by_content_and_caches_prefixes():
    a = FakeWorker(0, "a", prefill_ms_per_token=0.25, decode_ms_per_token=0.2).start()
    b = FakeWorker(0, "b").start()
    try:
        def tokenize(worker, body):
            r = requests.post(worker.url + "/tokenize", json=body, timeout=5)
            assert r.status_code == 200 and r.headers["X-Worker-Id"] == worker.worker_id
            return r.json()

        first = tokenize(a, {"prompt": "red green red blue"})
        assert first["tokens"] == tokenize(b, {"prompt": "red green red blue"})["tokens"]
        assert first["count"] == len(first["tokens"]) == 5  # bos + 4 words
        ids = first["tokens"][1:]
        assert ids[0] == ids[2] and len({ids[0], ids[1], ids[3]}) == 3, ids
        assert ids == tokenize_text("red green red blue")
        assert tokenize(a, {"prompt": "blue green red red"})["tokens"] != first["tokens"]
        chat_ids = tokenize(a, {"messages": [{"role": "user", "content": "red green"}]})["tokens"]
        assert chat_ids[2:4] == ids[:2]

        messages = [{"role": "system", "content": filler("cache", 600)},
                    {"role": "user", "content": "summarize"}]
        cold = chat(a.url, messages, max_tokens=8, timeout=10)
        warm = chat(a.url, messages, max_tokens=8, timeout=10)
        assert cold.ok and warm.ok and cold.text == warm.text
        assert cold.cached_tokens == 0
        # each request's arrival, with its prompt's head (which conversation reached it)
        head = tuple(render_chat(messages)[:ARRIVAL_HEAD])
        assert [h for _, h in a.arrivals()][-2:] == [head, head] and len(head) == ARRIVAL_HEAD
        prompt_tokens = warm.usage["prompt_tokens"]
        assert warm.cached_tokens >= prompt_tokens - 16, warm.usage
        assert warm.ttft_s < cold.ttft_s / 2, (cold.ttft_s, warm.ttft_s)
        stats = a.stats()
        assert stats["requests"] == 2
        assert stats["query_tokens"] == 2 * prompt_tokens
        assert stats["hit_tokens"] == warm.cached_tokens

        metrics = requests.get(a.url + "/metrics", timeout=5).text
        for name in METRICS:
            assert f'{name}{{engine="0",model_name="fake-model"' in metrics, name
        assert (f'vllm:prefix_cache_hits_total{{engine="0",model_name="fake-model"}} '
                f"{float(warm.cached_tokens)}") in metrics
    finally:
        a.stop()
        b.stop()


def test_fake_worker_health_switch_and_death():
    w = FakeWorker(0, "mortal").start()
    try:
        assert requests.get(w.url + "/health", timeout=5).status_code == 200
        w.set_healthy(False)
        assert requests.get(w.url + "/health", timeout=5).status_code == 503
        w.set_healthy(True)
        # A kept-alive connection (as the router holds) is cut when the worker dies.
        conn = http.client.HTTPConnection("127.0.0.1", w.port, timeout=5)
        conn.request("GET", "/health")
        assert conn.getresponse().read() == b""
        w.stop()
        with pytest.raises((OSError, http.client.HTTPException)):
            conn.request("GET", "/health")
            conn.getresponse()
        conn.close()
        with pytest.raises(OSError):
            http_json("GET", w.url + "/health", timeout=2)
        w.start()  # back on the same port
        deadline = time.monotonic() + 5
        status = None
        while time.monotonic() < deadline and status != 200:
            status, _ = http_json("GET", w.url + "/health", timeout=2)
        assert status == 200
    finally:
        w.stop()
