"""Fixtures for the loopback end-to-end tests: fake workers and the real router on 127.0.0.1."""
from __future__ import annotations

import contextlib
import sys
from pathlib import Path
from typing import Callable, Iterator

import pytest

_ROOT = Path(__file__).resolve().parents[2]
if str(_ROOT) not in sys.path:  # `tools` is importable however pytest is started
    sys.path.insert(0, str(_ROOT))

from tools.loopback import (  # noqa: E402
    FakeWorkerPool,
    RouterProcess,
    free_port,
    localize_router_args,
)

N_WORKERS = 4
# Slow enough that concurrent requests overlap in the router (its load counts), fast enough
# that a 16-token answer takes ~70 ms.
WORKER_OPTS = {"prefill_ms_per_token": 0.05, "decode_ms_per_token": 4.0, "overhead_ms": 1.0}


def _rendered_args(strategy: str, replicas: int | None = None) -> list[str]:
    """The router container's args exactly as the rendered Kubernetes Deployment carries them,
    for the shipped endpoint file switched to HyperPod routing strategy ``strategy`` (and to
    ``replicas`` workers if given: ``kvaware`` lists every worker in the router's args)."""
    import copy

    import cdk8s
    import yaml

    from config import resolve_environment
    from config.context import cdk_json_context
    from k8s.endpoint_spec import parse_endpoint
    from k8s.serving import ServingFacts, build_charts, worker_service_account
    from k8s.workers import MetricsSource

    cfg = resolve_environment({**cdk_json_context(_ROOT), "env": "dev"})
    raw = yaml.safe_load((_ROOT / cfg.endpoint_files[0]).read_text())
    raw = copy.deepcopy(raw)
    raw["spec"]["intelligentRoutingSpec"]["routingStrategy"] = strategy
    if replicas is not None:
        raw["spec"]["replicas"] = replicas
    spec = parse_endpoint(cfg.name, cfg.endpoint_files[0], raw)
    facts = ServingFacts(router_image="router", model_bucket="bucket", managed_l2=None,
                         service_account={spec.name: worker_service_account(spec.name)},
                         metrics=MetricsSource("http://prometheus:9090"))
    for chart in build_charts(cdk8s.App(), cfg, (spec,), facts):
        for doc in chart.to_json():
            if doc["kind"] == "Deployment" and doc["metadata"]["name"].endswith("-router"):
                return list(doc["spec"]["template"]["spec"]["containers"][0]["args"])
    raise AssertionError("no router Deployment rendered")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "e2e: runs the real vllm-router against fake workers on 127.0.0.1"
    )


@pytest.fixture(scope="session")
def router_args() -> Callable[[str], list[str]]:
    """``router_args(strategy)`` -> the args list of the rendered router Deployment."""
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
                started[strategy] = stack.enter_context(RouterProcess(args, log_path=log))
            return started[strategy]

        yield get
