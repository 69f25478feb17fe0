"""The benchmark on 127.0.0.1: the real pinned `vllm-router`, started with the args its
Kubernetes Deployment renders, in front of fake workers (prefix cache on, TTFT growing with the
uncached part of the prompt). One run per HyperPod routing strategy, then a comparison.

    python -m tools.bench_loopback --out /tmp/bench-results            # 4 workers, both policies
    python -m tools.bench_loopback --out /tmp/b --policies session --sessions 4 --contexts 2048

Figures, not assertions: the fake's timings are a model (`tools/fake_worker.py`), so ratios
between policies mean something, absolute milliseconds do not.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

from tools.benchmark import BenchConfig, run_benchmark

# A worker's time model for the measurement: ~20K prompt tokens/s of prefill, 5 ms per output
# token; 1M tokens of prefix cache each (no eviction at these sizes); 64K contexts allowed.
WORKER_OPTS = {"prefill_ms_per_token": 0.05, "decode_ms_per_token": 5.0, "overhead_ms": 1.0,
               "cache_blocks": 65536, "max_model_len": 131072, "default_max_tokens": 32}
MODEL = "fake-model"


def rendered_router_args(strategy: str) -> list[str]:
    """The router container's args exactly as `k8s.router` renders them for `strategy`."""
    from config.contracts import SERVING_NAMESPACE
    from k8s.endpoint_spec import ROUTING_POLICIES
    from k8s.router import RouterProps, router_args

    return router_args(RouterProps(
        endpoint="bench", namespace=SERVING_NAMESPACE, image="local",
        policy=ROUTING_POLICIES[strategy],
        worker_selector={"app.kubernetes.io/instance": "bench"}))


class WorkerProcesses:
    """`n` fake workers, each in its own process (`python -m tools.fake_worker`), so that
    neither they nor the benchmark client wait on one another's interpreter lock: in one
    process, the router's /tokenize calls and the client's stream parsing queue behind each
    other and add milliseconds that are the harness's, not the router's."""

    def __init__(self, n: int, **opts: Any) -> None:
        from tools.loopback import free_port

        self.ports = [free_port() for _ in range(n)]
        self.opts = opts
        self.procs: list[subprocess.Popen] = []

    @property
    def urls(self) -> list[str]:
        return [f"http://127.0.0.1:{p}" for p in self.ports]

    def __enter__(self) -> "WorkerProcesses":
        from tools.loopback import http_json

        flags = [x for k, v in self.opts.items() for x in (f"--{k.replace('_', '-')}", str(v))]
        try:
            for i, port in enumerate(self.ports):
                self.procs.append(subprocess.Popen(
                    [sys.executable, "-m", "tools.fake_worker", "--port", str(port),
                     "--worker-id", f"w{i}", *flags], stdout=subprocess.DEVNULL,
                    cwd=Path(__file__).resolve().parent.parent))
            deadline = time.monotonic() + 20
            for url in self.urls:
                while True:
                    try:
                        if http_json("GET", url + "/health", timeout=1)[0] == 200:
                            break
                    except OSError:
                        pass
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"fake worker {url} did not start")
                    time.sleep(0.05)
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        for proc in self.procs:
            proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()


def run_policy(strategy: str, config: BenchConfig, *, workers: int = 4,
               worker_opts: dict[str, Any] | None = None, log_dir: Path | None = None,
               progress: bool = True, processes: bool = False) -> dict:
    """One benchmark through the router for `strategy`, on fresh fake workers (threads of this
    process, or one process each)."""
    from tools.loopback import FakeWorkerPool, RouterProcess, free_port, localize_router_args

    opts = {**WORKER_OPTS, **(worker_opts or {})}
    pool_cm = (WorkerProcesses(workers, model=MODEL, **opts) if processes
               else FakeWorkerPool(workers, model=MODEL, **opts))
    with pool_cm as pool:
        rendered = rendered_router_args(strategy)
        args = localize_router_args(rendered, pool.urls, free_port(), free_port())
        log = (log_dir / f"router-{strategy}.log") if log_dir else None
        with RouterProcess(args, log_path=log) as router:
            c = replace(config, url=router.url, model=MODEL, label=config.label or strategy,
                        worker_metrics=tuple(f"{u}/metrics" for u in pool.urls),
                        direct_url=pool.urls[0] if config.direct_url == "auto"
                        else config.direct_url)
            result = run_benchmark(c, progress=progress)
        result["meta"]["loopback"] = {"workers": workers, "worker_opts": opts,
                                      "worker_processes": processes,
                                      "router_args": args, "rendered_args": rendered}
    return result


def main(argv: list[str] | None = None) -> int:
    from tools import bench_report

    p = argparse.ArgumentParser(prog="python -m tools.bench_loopback", description=__doc__)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--policies", nargs="+", default=["roundrobin", "prefixaware"])
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--scenarios", nargs="+", default=["cold-warm", "prefix", "multi-turn",
                                                      "document"])
    p.add_argument("--contexts", nargs="+", type=int, default=[8192, 65536])
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--requests", type=int, default=16)
    p.add_argument("--sessions", type=int, default=16)
    p.add_argument("--turns", type=int, default=5)
    p.add_argument("--documents", type=int, default=4)
    p.add_argument("--questions", type=int, default=4)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--in-process", action="store_true",
                   help="fake workers as threads of this process (faster start, noisier)")
    p.add_argument("--hourly-usd", type=float, default=8.144,
                   help="price per worker instance (default: dev's g5.24xlarge)")
    a = p.parse_args(argv)
    a.out.mkdir(parents=True, exist_ok=True)
    config = BenchConfig(
        url="", scenarios=tuple(a.scenarios), contexts=tuple(a.contexts),
        concurrency=a.concurrency, requests=a.requests, sessions=a.sessions, turns=a.turns,
        documents=a.documents, questions=a.questions, max_tokens=a.max_tokens,
        direct_url="auto", hourly_usd=a.hourly_usd, instances=a.workers, timeout_s=120)
    results = {}
    for strategy in a.policies:
        results[strategy] = run_policy(strategy, replace(config, salt=uuid.uuid4().hex[:8]),
                                       workers=a.workers, log_dir=a.out,
                                       processes=not a.in_process)
        paths = bench_report.write_run(results[strategy], a.out / strategy)
        print(f"{strategy}: wrote {', '.join(map(str, paths))}", file=sys.stderr)
    if len(results) >= 2:
        first, *rest = a.policies
        for other in rest:
            md, _ = bench_report.write_compare(results[first], results[other],
                                               a.out / f"compare-{other}-vs-{first}")
            print(md)
    figures = {s: {name: {k: r["scenarios"][name][k] for k in (
        "ttft_s", "cache_hit_rate", "usage_cached_fraction", "workers", "errors")}
        for name in r["scenarios"]} | {"router_overhead": r["router_overhead"]}
        for s, r in results.items()}
    (a.out / "figures.json").write_text(json.dumps(figures, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
