"""The kvaware router's start, with the pinned vllm-router and its static worker list.

Measured here (issue 16, finding 5): vllm-router 0.1.17 with `--worker-urls` listens only once
one listed worker answers its health check, checks every `--worker-startup-check-interval`,
and exits 1 when none has after `--worker-startup-timeout-secs`. The rendered Deployment must
let it wait as long as a worker may take to start, and its startupProbe must outlast that wait
(liveness alone killed it after a minute: a crash loop on every first rollout).
The rendered args run as rendered, with the wait shortened to seconds.
"""
from __future__ import annotations

import os
import socket
import time

import pytest

from bench import router_fork
from bench.loopback import FakeWorkerPool, localize_for_pool
from config.contracts import NODE_START_MINUTES
from tests.e2e.conftest import _container, _rendered_docs, start_rendered_router

pytestmark = pytest.mark.e2e
TIMEOUT_FLAG = "--worker-startup-timeout-secs"
INTERVAL_FLAG = "--worker-startup-check-interval"


def _value(args: list[str], flag: str) -> int:
    return int(args[args.index(flag) + 1])


def test_the_rendered_router_outwaits_its_workers_and_the_probe_outwaits_the_router():
    router = _container("kvaware", None, "Deployment", "-router")
    args = router["args"]
    timeout, interval = _value(args, TIMEOUT_FLAG), _value(args, INTERVAL_FLAG)
    worker = next(d for d in _rendered_docs("kvaware") if d["kind"] == "StatefulSet"
                  and d["metadata"]["name"].endswith("-workers"))
    probe = worker["spec"]["template"]["spec"]["containers"][0]["startupProbe"]
    worker_window = probe["failureThreshold"] * probe["periodSeconds"]
    # a worker may need a node, then its whole startup window
    assert timeout >= NODE_START_MINUTES * 60 + worker_window
    startup = router["startupProbe"]
    assert startup["failureThreshold"] * startup["periodSeconds"] > timeout + interval
    assert router["livenessProbe"]["httpGet"]["path"] == startup["httpGet"]["path"]


def _shorten(args: list[str], timeout: int, interval: int) -> list[str]:
    out = list(args)
    out[out.index(TIMEOUT_FLAG) + 1] = str(timeout)
    out[out.index(INTERVAL_FLAG) + 1] = str(interval)
    return out


def _listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _watch(router, seconds: float, on_tick=None) -> tuple[float | None, int | None, float]:
    """Start the router process bare until it listens, exits or `seconds` pass: (listening
    since, exit code, seconds watched)."""
    with open(os.devnull, "wb") as devnull:   # forked as RouterProcess starts it: no imports
        proc = router_fork.spawn(router.binary, router.args, router.env, devnull.fileno())
    t0, listening = time.monotonic(), None
    try:
        while time.monotonic() - t0 < seconds and proc.poll() is None and listening is None:
            if on_tick:
                on_tick(time.monotonic() - t0)
            if _listening(router.port):
                listening = time.monotonic() - t0
            time.sleep(0.05)
        return listening, proc.poll(), time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(10)


@pytest.fixture()
def pool():
    with FakeWorkerPool(2, id_prefix="s", kv_events_port=0) as p:
        yield p


def _router(pool, router_args, timeout: int, interval: int):
    args = _shorten(localize_for_pool(router_args("kvaware", 2), pool), timeout, interval)
    return start_rendered_router("kvaware", args)


def test_no_worker_healthy_it_never_listens_and_exits_after_its_timeout(
        pool, router_args, report_figure):
    for w in pool:
        w.stop()
    listening, code, at = _watch(_router(pool, router_args, 2, 1), 15)
    assert listening is None and code == 1
    assert 2 <= at < 6
    report_figure(f"kvaware router, no worker up, --worker-startup-timeout-secs 2: exit {code} "
                  f"after {at:.1f} s, never listening")


def test_it_listens_once_one_worker_answers_within_a_check_interval(
        pool, router_args, report_figure):
    for w in pool:
        w.stop()
    first = pool.workers[0]
    up_at, interval = 1.0, 1   # the router, forked, checks from ~0.1 s: its first checks fail

    def revive(t: float) -> None:
        if t >= up_at and not getattr(revive, "done", False):
            first.start()
            revive.done = True

    listening, code, _ = _watch(_router(pool, router_args, 30, interval), 12, revive)
    assert code is None and listening is not None
    assert up_at < listening <= up_at + interval + 1.5   # the next check after the worker is up
    report_figure(f"kvaware router, one of 2 workers up at {up_at:.0f} s, check interval "
                  f"{interval} s: listening at {listening:.1f} s")
