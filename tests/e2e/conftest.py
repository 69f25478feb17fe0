"""Fixtures for the loopback end-to-end tests: fake workers and the real router on 127.0.0.1."""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import itertools
import json
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Iterator

import pytest

_ROOT = Path(__file__).resolve().parents[2]
if str(_ROOT) not in sys.path:  # `tools` is importable however pytest is started
    sys.path.insert(0, str(_ROOT))

from bench.loopback import (  # noqa: E402
    FakeWorkerPool,
    RouterProcess,
    arg_value,
    container_env,
    free_port,
    localize_for_pool,
    localize_router_args,
    router_launch,
)

N_WORKERS = 4
SEED_FILE = "tests/fixtures/endpoint-seed.yaml"   # our HyperPod-shaped seed (L2 redis, TP 4)
# Slow enough that concurrent requests overlap in the router (its load counts), fast enough
# that a 16-token answer takes ~70 ms.
WORKER_OPTS = {"prefill_ms_per_token": 0.05, "decode_ms_per_token": 4.0, "overhead_ms": 1.0}


# jsii serves one call at a time: tests that start routers from several threads render here
# (the first time a strategy is asked for) one thread at a time, or two threads' calls cross
# and one waits forever for its answer.
_JSII = threading.Lock()


@functools.lru_cache(maxsize=None)
def _rendered_docs_json(strategy: str, replicas: int | None, router: str | None = None) -> str:
    with _JSII:
        return _render_docs_json(strategy, replicas, router)


def _render_docs_json(strategy: str, replicas: int | None, router: str | None) -> str:
    import copy

    import cdk8s
    import yaml

    from config import resolve_environment
    from config.context import repository_context
    from config.endpoint_spec import parse_endpoint
    from k8s.serving import build_charts, placeholder_facts

    cfg = resolve_environment({**repository_context(_ROOT), "env": "dev"})
    if router:   # as `routerImplementations: {strategy: router}` in cdk.json
        cfg = dataclasses.replace(cfg, router_implementations={strategy: router})
    raw = yaml.safe_load((_ROOT / SEED_FILE).read_text())
    raw = copy.deepcopy(raw)
    raw["spec"]["intelligentRoutingSpec"]["routingStrategy"] = strategy
    if replicas is not None:
        raw["spec"]["replicas"] = replicas
    spec = parse_endpoint(cfg.name, SEED_FILE, raw)
    facts = placeholder_facts(cfg, (spec,))
    return json.dumps([doc for chart in build_charts(cdk8s.App(), cfg, (spec,), facts)
                       for doc in chart.to_json()])


def _rendered_docs(strategy: str, replicas: int | None = None,
                   router: str | None = None) -> list[dict]:
    """Every Kubernetes object rendered for the shipped endpoint file switched to HyperPod
    routing strategy ``strategy`` (and to ``replicas`` workers, and to the ``router``
    implementation, if given)."""
    from config.contracts import default_router

    if router == default_router(strategy):   # the same objects: one render (jsii) serves both
        router = None
    return json.loads(_rendered_docs_json(strategy, replicas, router))


def _container(strategy: str, replicas: int | None, kind: str, suffix: str,
               router: str | None = None) -> dict:
    """The first container of the rendered ``kind`` named ``*suffix`` (see _rendered_docs)."""
    for doc in _rendered_docs(strategy, replicas, router):
        if doc["kind"] == kind and doc["metadata"]["name"].endswith(suffix):
            return doc["spec"]["template"]["spec"]["containers"][0]
    raise AssertionError(f"no {kind} *{suffix} rendered")


def _container_args(strategy: str, replicas: int | None, kind: str, suffix: str) -> list[str]:
    return list(_container(strategy, replicas, kind, suffix)["args"])


def rendered_implementation(strategy: str) -> str:
    """The router binary the rendered Deployment runs for ``strategy``: its command's last
    word (the binary itself, or the name the API-key shell `exec`s)."""
    return _container(strategy, None, "Deployment", "-router")["command"][-1]


def start_rendered_router(strategy: str, args: list[str], **kw) -> RouterProcess:
    """A RouterProcess (not started) of the binary the Deployment for ``strategy`` runs, with
    localized ``args`` and the container's environment (vllm-router's log filter)."""
    container = _container(strategy, None, "Deployment", "-router")
    binary, argv = router_launch(container["command"][-1], args)
    return RouterProcess(argv, binary=binary, env=container_env(container), **kw)


def _rendered_args(strategy: str, replicas: int | None = None) -> list[str]:
    """The router container's args exactly as the rendered Kubernetes Deployment carries them,
    for the shipped endpoint file switched to HyperPod routing strategy ``strategy`` (and to
    ``replicas`` workers if given: ``kvaware`` lists every worker in the router's args)."""
    return _container_args(strategy, replicas, "Deployment", "-router")


def _rendered_worker_args(strategy: str, replicas: int | None = None) -> list[str]:
    """The vLLM container's args of the rendered workers (a StatefulSet for ``kvaware``)."""
    kind = "StatefulSet" if strategy == "kvaware" else "Deployment"
    return _container_args(strategy, replicas, kind, "-workers")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "e2e: runs the real vllm-router against fake workers on 127.0.0.1"
    )


_FIGURES: list[str] = []


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if _FIGURES:
        terminalreporter.section("loopback measurements")
        for line in _FIGURES:
            terminalreporter.write_line(line)


@pytest.fixture(scope="session")
def report_figure() -> Callable[[str], None]:
    """``report_figure(line)``: a measured figure (not an assertion), printed in the summary."""
    return _FIGURES.append


@pytest.fixture(scope="session")
def router_args() -> Callable[..., list[str]]:
    """``router_args(strategy, replicas=None)`` -> the args list of the rendered router
    Deployment."""
    return _rendered_args


@pytest.fixture(scope="module")
def worker_pool() -> Iterator[FakeWorkerPool]:
    with FakeWorkerPool(N_WORKERS, **WORKER_OPTS) as pool:
        yield pool


@pytest.fixture(scope="module")
def router_for(
    router_args, worker_pool, tmp_path_factory
) -> Iterator[Callable[[str], RouterProcess]]:
    """``router_for(strategy)`` -> a running router for that strategy, started once per module
    in front of ``worker_pool``; its log is kept under pytest's tmp dir."""
    started: dict[str, RouterProcess] = {}
    with contextlib.ExitStack() as stack:
        def get(strategy: str) -> RouterProcess:
            if strategy not in started:
                args = localize_router_args(
                    router_args(strategy), worker_pool.urls, free_port(), free_port()
                )
                log = tmp_path_factory.mktemp(f"router-{strategy}") / "router.log"
                started[strategy] = stack.enter_context(
                    start_rendered_router(strategy, args, log_path=log))
            return started[strategy]

        yield get


def _kv_worker_opts(replicas: int) -> dict:
    """FakeWorker options for what the rendered kvaware vLLM workers are told: publish KV events
    (if ``--kv-events-config`` enables a zmq publisher) on its topic, in ``--block-size``
    blocks. So a worker/router mismatch fails the loopback tests as it would fail in-cluster."""
    args = _rendered_worker_args("kvaware", replicas)
    events = json.loads(arg_value(args, "--kv-events-config") or "{}")
    publishes = events.get("enable_kv_cache_events") and events.get("publisher") == "zmq"
    return {"block_size": int(arg_value(args, "--block-size") or 16),
            "kv_events_port": 0 if publishes else None,
            "kv_events_topic": events.get("topic", "")}


@pytest.fixture(scope="session")
def kv_worker_opts() -> Callable[[int], dict]:
    """``kv_worker_opts(n)`` -> FakeWorker options (timings and KV events) for ``n`` workers
    configured as the rendered kvaware vLLM workers are."""
    return lambda n: {**WORKER_OPTS, **_kv_worker_opts(n)}


@pytest.fixture(scope="module")
def kv_worker_pool(kv_worker_opts) -> Iterator[FakeWorkerPool]:
    """``N_WORKERS`` fake workers that also publish their KV cache events (ZMQ, vLLM's format),
    configured as the rendered kvaware workers are."""
    with FakeWorkerPool(N_WORKERS, **kv_worker_opts(N_WORKERS)) as pool:
        yield pool


@pytest.fixture
def launch_routers(router_args, tmp_path) -> Iterator[Callable[..., list[RouterProcess]]]:
    """``launch_routers(strategy, pool, n=1, kv_endpoints=None)`` -> ``n`` real routers, started
    side by side from the args rendered for ``strategy`` with one worker replica per pool
    worker, each on its own ports in front of ``pool``. kv_aware ones are subscribed to every
    worker's events before this returns (unless ``kv_endpoints`` points them elsewhere). All
    stop when the test ends; their logs stay under the test's tmp dir. May be called from
    several threads at once."""
    numbers = itertools.count()
    with contextlib.ExitStack() as stack:
        def launch(strategy: str, pool: FakeWorkerPool, n: int = 1, *,
                   kv_endpoints: list[str] | None = None) -> list[RouterProcess]:
            rendered = router_args(strategy, len(pool))
            routers = []
            for _ in range(n):
                log = tmp_path / f"router-{strategy}-{next(numbers)}.log"
                args = localize_for_pool(rendered, pool, kv_endpoints=kv_endpoints)
                router = start_rendered_router(strategy, args, log_path=log)
                stack.callback(router.stop)
                routers.append(router)
            with ThreadPoolExecutor(n) as starting:
                list(starting.map(RouterProcess.start, routers))
            if "--kv-event-source" in rendered and kv_endpoints is None:
                pool.wait_kv_subscribers(n)
            return routers

        yield launch
