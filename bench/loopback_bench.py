"""The benchmark on 127.0.0.1: the real pinned `vllm-router`, started with the args its
Kubernetes Deployment renders, in front of emulated workers (`bench/fake_worker.py` with a GPU
profile from `bench/emulator.py`: bounded KV cache, continuous batching, prefill and decode at
the GPU's rates, render/tokenize at a tokenizer's cost). One run per strategy, then compares.

    python -m bench.loopback_bench --out /tmp/bench-results            # 4 workers, both policies
    python -m bench.loopback_bench --out /tmp/b --policies roundrobin prefixaware \\
        --scenarios multi-turn document --contexts 8192 --repeats 3

Strategies: the HyperPod names, plus `session-noheader` (the session strategy while the client
sends no X-Session-ID). Each strategy runs on the router implementation the chart deploys for it
(`config.contracts.DEFAULT_ROUTER`: sglang-router for prefixaware); `STRATEGY@vllm` and
`STRATEGY@sglang` pick one (`routerImplementations` in the environment file). Figures, not assertions: the
emulator is a model; `--time-scale` makes the GPU faster than life (every emulated duration
times the scale) while the router's own work stays real, so ratios between strategies are the
result, absolute milliseconds are not.
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

from bench.benchmark import BenchConfig, run_benchmark

# Without a profile: the fake's flat time model (~20K prompt tokens/s, 5 ms per output token).
WORKER_OPTS = {"prefill_ms_per_token": 0.05, "decode_ms_per_token": 5.0, "overhead_ms": 1.0,
               "cache_blocks": 65536, "max_model_len": 131072, "default_max_tokens": 32}
MODEL = "fake-model"
STRATEGIES = ("prefixaware", "kvaware", "session", "session-noheader", "roundrobin")
BENCH_ENDPOINT = "bench"


def router_strategy(strategy: str) -> tuple[str, bool]:
    """(HyperPod strategy the router runs, whether the client sends X-Session-ID)."""
    strategy = strategy.split("@")[0]
    if strategy.endswith("-noheader"):
        return strategy[: -len("-noheader")], False
    return strategy, True


IMPLEMENTATION_SUFFIXES = {"vllm": "vllm-router", "sglang": "sglang-router"}


def implementation(strategy: str) -> str:
    """The router `strategy` runs on: its `@vllm`/`@sglang` suffix, else the chart's default."""
    from config.contracts import default_router

    name, _, suffix = strategy.partition("@")
    if suffix:
        return IMPLEMENTATION_SUFFIXES[suffix]
    return default_router(router_strategy(name)[0])


def strategy_choices() -> tuple[str, ...]:
    """Every strategy name the tools accept: the HyperPod ones, `-noheader` variants and an
    explicit implementation where it offers the strategy."""
    from config.contracts import ROUTER_STRATEGIES

    names = STRATEGIES + ("prefixaware-noheader", "roundrobin-noheader")
    return names + tuple(f"{n}@{short}" for n in names
                         for short, impl in IMPLEMENTATION_SUFFIXES.items()
                         if router_strategy(n)[0] in ROUTER_STRATEGIES[impl])


def in_cluster_workers(n: int) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Worker URLs and KV event endpoints as a kvaware Deployment names them (stand-ins that
    the loopback maps onto local ports)."""
    svc = f"{BENCH_ENDPOINT}-workers"
    host = [f"{svc}-{i}.{svc}.bench.svc.cluster.local" for i in range(n)]
    return (tuple(f"http://{h}:8000" for h in host), tuple(f"tcp://{h}:5557" for h in host))


def rendered_router_args(strategy: str, workers: int = 4) -> list[str]:
    """The router container's args exactly as `k8s.router` renders them for `strategy`
    (kvaware: a static worker list and one KV event source per worker, as k8s.serving)."""
    from config.contracts import SERVING_NAMESPACE
    from config.endpoint_spec import ROUTING_POLICIES
    from k8s.router import RouterProps, router_args
    from k8s.workers import KV_BLOCK_SIZE

    name, _ = router_strategy(strategy)
    kv = name == "kvaware"
    urls, endpoints = in_cluster_workers(workers) if kv else ((), ())
    return router_args(RouterProps(
        endpoint=BENCH_ENDPOINT, namespace=SERVING_NAMESPACE, image="local",
        policy=ROUTING_POLICIES[name], implementation=implementation(strategy),
        worker_selector={"app.kubernetes.io/instance": BENCH_ENDPOINT},
        static_workers=urls, kv_event_sources=tuple(zip(urls, endpoints)),
        kv_event_block_size=KV_BLOCK_SIZE, model_name=MODEL if kv else ""))


class WorkerProcesses:
    """`n` fake workers, each in its own process (`python -m bench.fake_worker`), so that
    neither they nor the benchmark client wait on one another's interpreter lock: in one
    process, the router's /tokenize calls and the client's stream parsing queue behind each
    other and add milliseconds that are the harness's, not the router's."""

    def __init__(self, n: int, *, kv_events: bool = False, **opts: Any) -> None:
        ports = distinct_ports(2 * n if kv_events else n)
        self.ports, self.kv_ports = ports[:n], ports[n:]
        self.opts = opts
        self.procs: list[subprocess.Popen] = []

    @property
    def urls(self) -> list[str]:
        return [f"http://127.0.0.1:{p}" for p in self.ports]

    @property
    def kv_endpoints(self) -> list[str]:
        return [f"tcp://127.0.0.1:{p}" for p in self.kv_ports]

    def __enter__(self) -> "WorkerProcesses":
        from bench.loopback import http_json

        flags = [x for k, v in self.opts.items() if v is not None
                 for x in (f"--{k.replace('_', '-')}", str(v))]
        try:
            for i, port in enumerate(self.ports):
                kv = ["--kv-events-port", str(self.kv_ports[i])] if self.kv_ports else []
                self.procs.append(subprocess.Popen(
                    [sys.executable, "-m", "bench.fake_worker", "--port", str(port),
                     "--worker-id", f"w{i}", *flags, *kv], stdout=subprocess.DEVNULL,
                    cwd=Path(__file__).resolve().parent.parent))
            deadline = time.monotonic() + 60
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

    def wait_kv_subscribers(self, n: int = 1, timeout: float = 5.0) -> None:
        """As FakeWorkerPool.wait_kv_subscribers, asked over each worker's HTTP port."""
        from bench.loopback import http_json, wait_kv_subscribers

        wait_kv_subscribers(lambda: {u: http_json("GET", u + "/kv_subscribers", timeout=2)[1][
            "subscribers"] for u in self.urls}, n, timeout)

    def reset(self) -> None:
        """Empty every worker's prefix cache (between repeats: each starts cold)."""
        from bench.loopback import http_json

        for url in self.urls:
            http_json("POST", url + "/reset_prefix_cache", {}, timeout=10)

    def __exit__(self, *exc: Any) -> None:
        from bench.loopback import stop_process

        for proc in self.procs:
            proc.terminate()          # all at once, then wait for each
        for proc in self.procs:
            stop_process(proc)


def distinct_ports(n: int, taken: set[int] = frozenset()) -> list[int]:
    """`n` distinct ports free a moment ago, none of them in `taken`."""
    from bench.loopback import free_port

    out: list[int] = []
    while len(out) < n:           # free_port never repeats itself; `taken` it cannot know
        port = free_port()
        if port not in taken:
            out.append(port)
    return out


def run_policy(strategy: str, config: BenchConfig, *, workers: int = 4,
               worker_opts: dict[str, Any] | None = None, log_dir: Path | None = None,
               progress: bool = True, processes: bool = False) -> dict:
    """One benchmark (all its repeats) through the router for `strategy`, on fresh fake
    workers (threads of this process, or one process each); caches emptied between repeats."""
    from bench.loopback import (
        FakeWorkerPool, RouterProcess, localize_router_args, router_launch,
    )

    name, header = router_strategy(strategy)
    kv = name == "kvaware"
    opts = {**WORKER_OPTS, **(worker_opts or {})}
    if processes:
        pool_cm: Any = WorkerProcesses(workers, model=MODEL, kv_events=kv, **opts)
    else:
        pool_cm = FakeWorkerPool(workers, model=MODEL, kv_events_port=0 if kv else None,
                                 **opts)
    with pool_cm as pool:
        rendered = rendered_router_args(strategy, workers)
        kv_map: dict[str, str] = {}
        ep_map: dict[str, str] = {}
        if kv:
            remote_urls, remote_eps = in_cluster_workers(workers)
            local_eps = pool.kv_endpoints if processes else [w.kv_events_endpoint for w in pool]
            kv_map, ep_map = dict(zip(remote_urls, pool.urls)), dict(zip(remote_eps, local_eps))
        taken = {int(u.rsplit(":", 1)[1]) for u in pool.urls}
        port, prom = distinct_ports(2, taken | set(getattr(pool, "kv_ports", [])))
        args = localize_router_args(rendered, pool.urls, port, prom,
                                    kv_worker_map=kv_map, kv_endpoint_map=ep_map)
        def log_for(r: int) -> Path | None:
            """One router log per repeat: a restart would overwrite the last."""
            return (log_dir / f"router-{strategy}-r{r}.log") if log_dir else None
        log = log_for(0)
        binary, args = router_launch(implementation(strategy), args)
        def subscribed() -> None:
            if kv:
                pool.wait_kv_subscribers()

        with RouterProcess(args, log_path=log, binary=binary) as router:
            subscribed()
            pids = [router.pid]
            c = replace(config, url=router.url, model=MODEL, label=config.label or strategy,
                        session_header=config.session_header and header,
                        worker_metrics=tuple(f"{u}/metrics" for u in pool.urls),
                        direct_url=pool.urls[0] if config.direct_url == "auto"
                        else config.direct_url)

            def fresh(r: int) -> None:
                """Every repeat starts from nothing: empty worker caches and a new router
                process (a router's learned placement is per process, so repeats then
                sample it as invocations do)."""
                if r:
                    pool.reset()
                    if log_dir:
                        router.log_path = log_for(r)
                    router.restart()
                    subscribed()
                    pids.append(router.pid)

            result = run_benchmark(c, progress=progress, between_repeats=fresh)
        result["meta"]["loopback"] = {"workers": workers, "worker_opts": opts,
                                      "worker_processes": processes, "strategy": strategy,
                                      "router_args": args, "rendered_args": rendered,
                                      "router_pids": pids}
    return result


def main(argv: list[str] | None = None) -> int:
    from bench import report as bench_report

    from bench.emulator import PROFILES
    from config.arguments import OneLineParser

    p = OneLineParser(prog="python -m bench.loopback_bench", description=__doc__,
                      formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--policies", nargs="+", default=["roundrobin", "prefixaware"],
                   choices=strategy_choices())
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--profile", default="g5.24xlarge", choices=[*PROFILES, "none"],
                   help="GPU profile to emulate (bench.emulator.PROFILES), or 'none' for the "
                        "fake's flat time model")
    p.add_argument("--time-scale", type=float, default=0.25,
                   help="wall seconds per emulated second")
    p.add_argument("--scenarios", nargs="+", default=["cold-warm", "prefix", "multi-turn",
                                                      "document"])
    p.add_argument("--contexts", nargs="+", type=int, default=[8192, 65536])
    d = BenchConfig("")
    for name in ("concurrency", "requests", "sessions", "turns", "documents", "questions",
                 "repeats", "seed", "warmup"):
        p.add_argument(f"--{name}", type=int, default=getattr(d, name))
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--request-rate", type=float, help="requests/s for every scenario "
                   "(default: from --load)")
    p.add_argument("--load", type=float, default=0.5,
                   help="with a profile and no --request-rate: Poisson arrivals at this "
                        "fraction of what the workers prefill with no cache hit (0: closed loop)")
    p.add_argument("--no-session-header", action="store_true")
    p.add_argument("--in-process", action="store_true",
                   help="fake workers as threads of this process (faster start, noisier)")
    p.add_argument("--hourly-usd", type=float, default=8.144,
                   help="price per worker instance (default: dev's g5.24xlarge)")
    a = p.parse_args(argv)
    a.out.mkdir(parents=True, exist_ok=True)
    config = bench_config(a)
    if a.request_rate is None and a.load > 0 and a.profile != "none":
        config = open_loop(config, a.profile, a.time_scale, a.workers, a.load)
    results = run_strategies(a.policies, config, workers=a.workers,
                             profile=a.profile, time_scale=a.time_scale, out=a.out,
                             processes=not a.in_process)
    if len(results) >= 2:
        first, *rest = a.policies
        for other in rest:
            md, _ = bench_report.write_compare(results[first], results[other],
                                               a.out / f"compare-{other}-vs-{first}")
            print(md)
    figures = {s: {name: {k: r["scenarios"][name][k] for k in (
        "ttft_s", "cache_hit_rate", "usage_cached_fraction", "workers", "errors", "spread")}
        for name in r["scenarios"]} | {"router_overhead": r["router_overhead"]}
        for s, r in results.items()}
    (a.out / "figures.json").write_text(json.dumps(figures, indent=1))
    return 0


def bench_config(a: argparse.Namespace) -> BenchConfig:
    return BenchConfig(
        url="", scenarios=tuple(a.scenarios), contexts=tuple(a.contexts),
        concurrency=a.concurrency, requests=a.requests, sessions=a.sessions, turns=a.turns,
        documents=a.documents, questions=a.questions, max_tokens=a.max_tokens,
        direct_url="auto", hourly_usd=a.hourly_usd, instances=a.workers, timeout_s=600,
        time_scale=a.time_scale,
        repeats=a.repeats, seed=a.seed, warmup=a.warmup, request_rate=a.request_rate,
        session_header=not a.no_session_header, overhead_requests=10)


def open_loop(config: BenchConfig, profile: str, time_scale: float, workers: int,
              load: float) -> BenchConfig:
    """Poisson arrivals per scenario at `load` x the requests/s `workers` replicas of
    `profile` serve when nothing is cached (the round-robin worst case), in wall time; think
    time between turns: 5 emulated seconds (exponential)."""
    from bench.benchmark import build_phases
    from bench.emulator import profile as gpu_profile

    gpu = gpu_profile(profile)
    rates = []
    for phase in build_phases(replace(config, salt=""))[0]:
        miss = gpu.prefill_seconds(phase.prompt_words)
        rates.append((phase.scenario, load * workers / (miss * time_scale)))
    return replace(config, scenario_rates=tuple(rates), think_s=5.0 * time_scale)


def worker_options(profile: str | None, time_scale: float) -> dict[str, Any]:
    if not profile or profile == "none":
        return {}
    return {"profile": profile, "time_scale": time_scale, "cache_blocks": None}


def run_strategies(strategies: list[str], config: BenchConfig, *, workers: int,
                   profile: str | None, time_scale: float, out: Path,
                   processes: bool = True) -> dict[str, dict]:
    """Every strategy with the same seed (the same request plan), fresh salts each."""
    from bench import report as bench_report

    results = {}
    out.mkdir(parents=True, exist_ok=True)
    for strategy in strategies:
        results[strategy] = run_policy(
            strategy, replace(config, salt=uuid.uuid4().hex[:8]), workers=workers,
            worker_opts=worker_options(profile, time_scale), log_dir=out, processes=processes)
        results[strategy]["meta"]["loopback"].update(profile=profile, time_scale=time_scale)
        paths = bench_report.write_run(results[strategy], out / strategy)
        print(f"{strategy}: wrote {', '.join(map(str, paths))}", file=sys.stderr)
    return results


if __name__ == "__main__":
    raise SystemExit(main())
