"""Faults through the default router pod (sglang-router cache_aware, rendered args, behind its
front) on 127.0.0.1: a hung worker holds a handful of requests and is out in seconds, an
oversized body is refused (a client's 4xx burst: tests/e2e/test_router_front.py, every
strategy). bench/router_checks.py measures the same at length (figures in docs/runbook.md)."""
from __future__ import annotations

import http.client
import json
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from bench.loopback import FakeWorkerPool, chat, filler
from bench.router_checks import AUTH, RenderedRouter, router_pod
from k8s.router import (
    BALANCE_ABS_THRESHOLD, HEALTH_FAILURES, HEALTH_INTERVAL_S, HEALTH_TIMEOUT_S,
)
from tests.e2e.conftest import WORKER_OPTS, _container
from tests.e2e.test_router_front import front_config_text

pytestmark = pytest.mark.e2e


def _pod(strategy: str) -> RenderedRouter:
    container = _container(strategy, None, "Deployment", "-router")
    return RenderedRouter(container["command"][-1], list(container["args"]),
                          front_config_text(strategy, None), {}, container.get("env", []),
                          container["resources"]["limits"]["memory"])


@pytest.fixture(scope="module")
def default_pod():
    """The default strategy's router pod in front of 4 workers."""
    pod = _pod("prefixaware")
    with FakeWorkerPool(4, **WORKER_OPTS, max_model_len=10**6) as pool, \
            router_pod(pod, pool) as (router, front):
        yield pool, router, front, pod


def _good(url: str, i: int):
    return chat(url, [{"role": "system", "content": filler(f"system-{i % 13}", 60)},
                      {"role": "user", "content": f"question {i}"}], f"s{i % 13}", False, 4,
                timeout=30, headers=AUTH)


def test_a_hung_worker_holds_a_handful_and_is_out_in_seconds(default_pod):
    """A worker that stops answering (its health checks included) while clients keep sending:
    cache_aware stops choosing it once it holds BALANCE_ABS_THRESHOLD more than the least
    loaded worker, and the health checks take it out; before, it collected 64 requests (the
    default threshold) and stayed in for the whole 20 s it hung."""
    pool, router, front, _ = default_pod
    victim = pool.workers[0]
    victim.hang()
    t0 = time.monotonic()
    out_after = None
    try:
        with ThreadPoolExecutor(64) as ex:
            sent = []
            bound = HEALTH_FAILURES * (HEALTH_INTERVAL_S + HEALTH_TIMEOUT_S) + 2 * HEALTH_INTERVAL_S
            while time.monotonic() - t0 < bound + 1:
                sent.append(ex.submit(_good, front.url, len(sent)))
                if out_after is None and victim.url not in router.healthy_workers():
                    out_after = time.monotonic() - t0
                    break
                time.sleep(0.05)
            held = victim.held["/v1/chat/completions"]
            victim.thaw()
            results = [f.result() for f in sent]
    finally:
        victim.thaw()
    assert out_after is not None, f"still routed to after {bound + 1} s"
    assert held <= BALANCE_ABS_THRESHOLD + 2, held
    assert all(r.ok for r in results)   # the held ones are answered once it wakes up


def test_a_body_beyond_the_models_context_is_refused(default_pod):
    """The payload limit is derived from the model's context (tests/k8s/test_router_limits.py:
    a whole context of text fits); it was 512 MB, and a 200 MB body was accepted and held in
    memory. Up to the limit a body passes; past it, 413 from the front, before it is read."""
    _, _, front, pod = default_pod
    limit = int(pod.args[pod.args.index("--max-payload-size") + 1])

    def send(size: int) -> int:
        envelope = len(json.dumps({"model": "fake-model", "max_tokens": 2, "messages": [
            {"role": "user", "content": ""}]}))
        body = {"model": "fake-model", "max_tokens": 2,
                "messages": [{"role": "user", "content": "w" * (size - envelope)}]}
        return requests.post(f"{front.url}/v1/chat/completions", timeout=30,
                             data=json.dumps(body), headers={
                                 "Content-Type": "application/json", **AUTH}).status_code

    assert send(limit) == 200
    assert send(limit + 1) == 413
    # 200 MB announced: refused on the headers alone, nothing of it sent
    conn = http.client.HTTPConnection("127.0.0.1", front.port, timeout=10)
    try:
        conn.putrequest("POST", "/v1/chat/completions")
        conn.putheader("Content-Type", "application/json")
        conn.putheader("Authorization", AUTH["Authorization"])
        conn.putheader("Content-Length", str(200 * 2**20))
        conn.endheaders()
        assert conn.getresponse().status == 413
    finally:
        conn.close()
