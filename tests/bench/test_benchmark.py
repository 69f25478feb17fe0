"""bench and bench-compare through the real routers (rendered args) in front of fake workers on
127.0.0.1. Small and fast: structure, counts and files, never timings."""
from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Iterator

import pytest

from bench.benchmark import (
    BenchConfig, aggregate, build_phases, config_from_args, percentiles, register,
    run_benchmark,
)
from bench.loopback import FakeWorkerPool, RouterProcess, free_port, localize_router_args
from bench.loopback_bench import MODEL, rendered_router_args, router_strategy, run_policy
from bench.report import compare_markdown, verdict, write_run
from tools.__main__ import main

ROOT = Path(__file__).resolve().parents[2]

FAST = {"prefill_ms_per_token": 0.01, "decode_ms_per_token": 0.2, "overhead_ms": 0.5}
SMALL = ["--requests", "2", "--prefix-words", "48", "--sessions", "2", "--turns", "2",
         "--user-words", "8", "--documents", "1", "--questions", "2", "--contexts", "96",
         "--max-tokens", "4", "--overhead-requests", "2", "--concurrency", "2",
         "--repeats", "1", "--warmup", "1"]
SCENARIOS = ["cold", "warm", "shared-prefix", "distinct-prefix", "multi-turn", "document-96"]
PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def router(tmp_path_factory) -> Iterator[tuple[RouterProcess, FakeWorkerPool]]:
    with FakeWorkerPool(2, model=MODEL, **FAST) as pool:
        args = localize_router_args(rendered_router_args("prefixaware@vllm"), pool.urls,
                                    free_port(), free_port())
        log = tmp_path_factory.mktemp("router") / "router.log"
        with RouterProcess(args, log_path=log) as proc:
            yield proc, pool


def test_bench_through_sglang_router_asks_for_the_model_it_cannot_list(tmp_path, capsys):
    """prefixaware's router lists `unknown` as the model: bench says to pass --model (one line,
    exit 2, nothing written) and with it runs."""
    from bench.loopback import router_launch

    with FakeWorkerPool(2, model=MODEL, **FAST) as pool:
        args = localize_router_args(rendered_router_args("prefixaware"), pool.urls,
                                    free_port(), free_port())
        binary, argv = router_launch("sglang-router", args)
        with RouterProcess(argv, binary=binary) as proc:
            out = tmp_path / "run"
            assert main(["bench", "--url", proc.url, "--out", str(out), *SMALL]) == 2
            err = capsys.readouterr().err
            assert "--model" in err and "`unknown`" in err and len(err.strip().splitlines()) == 1
            assert not out.exists()
            assert main(["bench", "--url", proc.url, "--out", str(out), "--model", MODEL,
                         "--scenarios", "multi-turn", *SMALL]) == 0
    result = json.loads((out / "results.json").read_text())
    assert result["scenarios"]["multi-turn"]["errors"] == 0


def test_bench_then_compare_write_every_report(router, tmp_path, capsys):
    proc, pool = router
    metrics = [f"{u}/metrics" for u in pool.urls]
    for label, extra in (("first", []), ("second", ["--scenarios", "cold-warm", "multi-turn"])):
        assert main(["bench", "--url", proc.url, "--label", label, "--out",
                     str(tmp_path / label), "--worker-metrics", *metrics,
                     "--direct-url", pool.urls[0], "--hourly-usd", "8.144", "--instances", "2",
                     *SMALL, *extra]) == 0
    summary = capsys.readouterr().out
    assert "# Benchmark: second" in summary and "## Router hop" in summary

    result = json.loads((tmp_path / "first" / "results.json").read_text())
    assert result["meta"]["model"] == MODEL  # read from GET /v1/models through the router
    assert list(result["scenarios"]) == SCENARIOS
    expected = {"cold": 2, "warm": 2, "shared-prefix": 2, "distinct-prefix": 2,
                "multi-turn": 4, "document-96": 2}
    for name, s in result["scenarios"].items():
        assert (s["requests"], s["ok"], s["errors"]) == (expected[name], expected[name], 0)
        assert set(s["ttft_s"]) == {"p50", "p90", "p95", "p99", "mean"}
        assert 0 <= s["cache_hit_rate"] <= 1 and 0 <= s["usage_cached_fraction"] <= 1
        assert s["output_tokens"] == 4 * s["ok"] and s["cost_per_1k_output_tokens_usd"] > 0
        assert sum(s["workers"].values()) == s["ok"]
    # a warm or later-turn request finds its prefix somewhere: hits are counted at all
    assert result["scenarios"]["warm"]["cache_hit_rate"] > 0
    overhead = result["router_overhead"]
    assert overhead["endpoint"]["ok"] == overhead["direct"]["ok"] == 2
    assert isinstance(overhead["added_ttft_s_p50"], float)
    for name in ("summary.md", "ttft.png", "scenarios.png"):
        assert (tmp_path / "first" / name).stat().st_size > 0
    assert (tmp_path / "first" / "ttft.png").read_bytes().startswith(PNG)

    assert main(["bench-compare", str(tmp_path / "first" / "results.json"),
                 str(tmp_path / "second" / "results.json"), "--out", str(tmp_path / "cmp")]) == 0
    md = (tmp_path / "cmp" / "compare.md").read_text()
    assert md.startswith("# second vs first")
    assert [n for n in SCENARIOS if f"| {n} |" in md] == ["cold", "warm", "multi-turn"]
    assert "In one run only: distinct-prefix, document-96, shared-prefix." in md
    assert (tmp_path / "cmp" / "compare.png").read_bytes().startswith(PNG)


def test_unreachable_worker_metrics_leave_the_hit_rate_unknown(router, tmp_path):
    proc, _ = router
    config = BenchConfig(proc.url, model=MODEL, scenarios=("cold-warm",), requests=1,
                         prefix_words=16, user_words=4, max_tokens=2, concurrency=1,
                         worker_metrics=(f"http://127.0.0.1:{free_port()}/metrics",), salt="x",
                         repeats=1, warmup=0)
    result = run_benchmark(config, progress=False)
    cold = result["scenarios"]["cold"]
    assert cold["ok"] == 1 and cold["cache_hit_rate"] is None
    assert cold["metrics_unreachable"][0].startswith("http://127.0.0.1:")


def test_run_policy_renders_the_router_args_of_the_strategy():
    args = rendered_router_args("roundrobin")
    assert args[args.index("--policy") + 1] == "round_robin" and "--service-discovery" in args
    result = run_policy("roundrobin", BenchConfig("", scenarios=("multi-turn",), sessions=2,
                                                  turns=2, prefix_words=32, user_words=4,
                                                  max_tokens=2, concurrency=2, salt="rr",
                                                  repeats=1, warmup=0),
                        workers=2, worker_opts=FAST, progress=False)
    mt = result["scenarios"]["multi-turn"]
    assert mt["ok"] == 4 and 0 <= mt["cache_hit_rate"] <= 1
    assert "--worker-urls" in result["meta"]["loopback"]["router_args"]


@pytest.mark.parametrize("argv, message", [
    (["bench", "--url", "http://x", "--scenarios", "chat"],
     "--scenarios = 'chat' is not valid; allowed: cold-warm, prefix, multi-turn, document"),
    (["bench", "--url", "http://x", "--concurrency", "0"], "--concurrency = 0 is not valid"),
    (["bench", "--url", "http://x", "--repeats", "0"], "--repeats = 0 is not valid"),
    (["bench", "--url", "http://x", "--request-rate", "-1"],
     "--request-rate = -1.0 is not valid; allowed: a positive number"),
    (["bench", "--url", "http://x", "--env", "dev", "--endpoint", "nope"],
     "--endpoint = 'nope' is not valid; allowed: llama-8b-intel-routing"),
    (["bench-compare", "missing-a.json", "missing-b.json"],
     "baseline = 'missing-a.json' is not valid; allowed: a results.json written by"),
])
def test_bad_input_is_one_line_and_exit_2(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: {message}") and "\n" not in err, err


def test_price_and_instances_come_from_the_environment():
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    args = parser.parse_args(["bench", "--url", "http://r:8000", "--env", "dev"])
    c = config_from_args(args)
    # dev: g5.24xlarge at 8.144/h; the shipped file's 1 replica x 1 GPU is a quarter of a node
    assert (c.hourly_usd, c.instances) == (8.144, 0.25)


def test_contexts_beyond_the_model_are_left_out_with_a_note():
    phases, notes = build_phases(BenchConfig("", scenarios=("document",),
                                             contexts=(8192, 65536), salt="s"), 32768)
    assert [p.scenario for p in phases] == ["document-8k"]
    assert notes == ["document-64k left out: 65536 tokens exceed the model's max_model_len "
                     "32768"]
    # "Run <salt>. Document <id>." + 8K words
    assert len(phases[0].jobs[0].system.split()) == 4 + 8192


def test_percentiles_interpolate_like_numpy():
    assert percentiles([4.0, 1.0, 3.0, 2.0]) == pytest.approx(
        {"p50": 2.5, "p90": 3.7, "p95": 3.85, "p99": 3.97, "mean": 2.5})
    assert percentiles([]) == {}


def test_written_paths_are_relative_to_out(tmp_path: Path):
    result = {"meta": {"label": "x", "url": "http://u", "model": "m", "started": "t",
                       "salt": "s", "notes": [], "config": {"concurrency": 1, "max_tokens": 1,
                                                            "ignore_eos": True}},
              "scenarios": {}, "router_overhead": None}
    paths = write_run(result, tmp_path / "run")
    assert [p.name for p in paths] == ["results.json", "summary.md", "ttft.png", "scenarios.png"]


# --------------------------------------------------------------------------- the request plan

PLAN = BenchConfig("", scenarios=("multi-turn", "document"), contexts=(64,), prefix_words=32,
                   user_words=4, seed=3, salt="a")


def _shape(phases):
    """Everything of a plan but the salt: order, delays, arrivals, prompt lengths."""
    return [(p.scenario, [(j.session.split("-", 1)[1], j.delays, j.arrival_s,
                           len((j.system or "").split()), [len(u.split()) for u in j.users])
                          for j in p.jobs]) for p in phases]


def test_the_same_seed_gives_the_same_plan_whatever_the_salt():
    a, _ = build_phases(PLAN)
    b, _ = build_phases(replace(PLAN, salt="b"))
    assert _shape(a) == _shape(b)
    assert a[0].jobs[0].system.startswith("Run a. ") and b[0].jobs[0].system.startswith("Run b. ")
    # the texts differ only by the salt
    assert a[1].jobs[0].system.split()[2:] == b[1].jobs[0].system.split()[2:]
    other, _ = build_phases(replace(PLAN, seed=4))
    assert _shape(other) != _shape(a)


def test_the_plan_does_not_line_up_with_the_workers():
    assert all(math.gcd(BenchConfig("").sessions, w) == 1 for w in (2, 4, 8, 16))
    phases, _ = build_phases(PLAN)
    turns, docs = phases
    order = [j.session for j in turns.jobs]
    assert sorted(order) != order and len(set(order)) == BenchConfig("").sessions
    # every document question is its own job, one document's questions interleaved with others
    ids = [j.session for j in docs.jobs]
    assert len(ids) == PLAN.documents * PLAN.questions
    assert any(ids[i] != ids[i + 1] and ids[i] in ids[i + 2:] for i in range(len(ids) - 2))
    # closed loop: a seeded jitter before every request, within bounds, not all equal
    delays = [d for j in turns.jobs for d in j.delays]
    assert all(0 <= d <= PLAN.jitter_s for d in delays) and len(set(delays)) == len(delays)


def test_open_loop_arrivals_are_poisson_at_the_rate():
    docs = build_phases(replace(PLAN, scenarios=("document",), request_rate=10.0,
                                documents=50))[0][0]
    arrivals = [j.arrival_s for j in docs.jobs]
    assert arrivals == sorted(arrivals) and len(set(arrivals)) == len(arrivals)
    assert 0.5 < len(arrivals) / arrivals[-1] / 10.0 < 1.5  # 200 arrivals at about 10/s
    rates = dict(replace(PLAN, scenario_rates=(("document-64", 1.0),)).scenario_rates)
    assert rates == {"document-64": 1.0}


def test_repeats_give_the_median_and_the_range_and_sum_the_counts():
    def run(p50, hit, ok):
        return {"s": {"ttft_s": {"p50": p50, "p90": 2 * p50}, "cache_hit_rate": hit,
                      "requests": ok, "ok": ok, "errors": 0, "workers": {"w0": ok},
                      "ttft_samples_s": [p50], "samples": [{"turn": 0}]}}

    agg = aggregate([run(0.3, 0.5, 2), run(0.1, None, 2), run(0.2, 0.7, 2)])["s"]
    assert agg["ttft_s"] == {"p50": 0.2, "p90": 0.4}
    assert agg["spread"]["ttft_s.p50"] == [0.1, 0.3] and agg["spread"]["ttft_s.p90"] == [0.2, 0.6]
    assert agg["cache_hit_rate"] == pytest.approx(0.6)  # median of the repeats that have one
    assert agg["spread"]["cache_hit_rate"] == [0.5, 0.7]
    assert (agg["requests"], agg["ok"], agg["repeats"], agg["workers"]) == (6, 6, 3, {"w0": 6})
    assert [s["repeat"] for s in agg["samples"]] == [0, 1, 2]


def _result(label, ranges):
    scen = {name: {"ttft_s": {"p50": m, "p90": m}, "cache_hit_rate": 0.5, "errors": 0,
                   "output_tokens_per_s": 1.0, "cost_per_1k_output_tokens_usd": None,
                   "spread": {"ttft_s.p50": [lo, hi], "ttft_s.p90": [lo, hi]}}
            for name, (m, lo, hi) in ranges.items()}
    return {"meta": {"label": label, "url": "u", "started": "t", "seed": 1, "repeats": 3},
            "scenarios": scen}


def test_compare_says_no_clear_difference_when_the_ranges_overlap():
    a = _result("rr", {"multi-turn": (0.10, 0.08, 0.12), "document-8k": (0.10, 0.09, 0.11)})
    b = _result("pa", {"multi-turn": (0.11, 0.10, 0.30), "document-8k": (0.02, 0.01, 0.03)})
    md = compare_markdown(a, b)
    rows = {line.split(" | ")[0].strip("| "): line for line in md.splitlines()
            if line.startswith("| multi") or line.startswith("| document")}
    assert "no clear difference" in rows["multi-turn"]
    assert "pa lower" in rows["document-8k"] and "no clear" not in rows["document-8k"]
    # ratio of the medians, with the widest range the repeats allow
    assert "0.20 (0.09-0.33)" in rows["document-8k"]
    assert verdict(b["scenarios"]["document-8k"], a["scenarios"]["document-8k"], "ttft_s.p50",
                   "pa", "rr") == "pa lower"


def test_repeats_and_warm_up_through_the_router(router):
    proc, pool = router
    pool.reset()
    seen = []
    config = BenchConfig(proc.url, model=MODEL, scenarios=("multi-turn",), sessions=3, turns=2,
                         prefix_words=16, user_words=4, max_tokens=2, concurrency=2,
                         repeats=2, warmup=3, worker_metrics=tuple(f"{u}/metrics"
                                                                   for u in pool.urls))
    result = run_benchmark(config, progress=False, between_repeats=seen.append)
    mt = result["scenarios"]["multi-turn"]
    assert seen == [0, 1] and len(result["runs"]) == 2
    assert (mt["requests"], mt["ok"], mt["repeats"]) == (12, 12, 2)
    assert set(mt["spread"]) >= {"ttft_s.p50", "ttft_s.p90", "cache_hit_rate"}
    # the warm-up reached the workers but not the figures
    served = sum(s["requests"] for s in pool.stats().values())
    assert served == 12 + 2 * 3
    assert result["meta"]["seed"] == 1 and result["meta"]["repeats"] == 2


def test_loopback_strategies_render_their_own_router_args():
    kv = rendered_router_args("kvaware", 2)
    assert kv[kv.index("--policy") + 1] == "kv_aware"
    assert sum(a == "--kv-event-source" for a in kv) == 2 and "--worker-urls" in kv
    assert router_strategy("session-noheader") == ("session", False)
    result = run_policy("session-noheader", BenchConfig(
        "", scenarios=("multi-turn",), sessions=3, turns=2, prefix_words=16, user_words=4,
        max_tokens=2, concurrency=2, repeats=1, warmup=0), workers=2, worker_opts=FAST,
        progress=False)
    assert result["meta"]["config"]["session_header"] is False
    # consistent_hash with no key: every request on one worker
    assert len(result["scenarios"]["multi-turn"]["workers"]) == 1


@pytest.mark.parametrize("strategy", ["prefixaware", "kvaware"])
def test_every_repeat_gets_a_new_router_on_the_same_url(strategy, tmp_path):
    """A router's learned placement (prefix tree, KV index) lives in its process: each repeat
    starts a new one, so repeats vary as separate invocations do; each keeps its own log."""
    result = run_policy(strategy, BenchConfig(
        "", scenarios=("multi-turn",), sessions=3, turns=2, prefix_words=16, user_words=4,
        max_tokens=2, concurrency=2, repeats=3, warmup=0), workers=2, worker_opts=FAST,
        progress=False, processes=strategy == "kvaware", log_dir=tmp_path)
    pids = result["meta"]["loopback"]["router_pids"]
    assert len(set(pids)) == 3 and None not in pids, pids
    logs = sorted(p.name for p in tmp_path.glob("router-*.log"))
    assert logs == [f"router-{strategy}-r{r}.log" for r in range(3)], logs
    assert all((tmp_path / name).stat().st_size > 0 for name in logs)
    assert result["scenarios"]["multi-turn"]["errors"] == 0


def test_sglang_router_serves_with_the_args_router_args_renders():
    """The second implementation: the real sglang-router binary, started with
    `sglang_router_args` (localized), routes by its own prefix tree."""
    args = rendered_router_args("prefixaware@sglang")
    assert args[0] == "launch" and args[args.index("--policy") + 1] == "cache_aware"
    result = run_policy("prefixaware@sglang", BenchConfig(
        "", scenarios=("multi-turn",), sessions=3, turns=3, prefix_words=64, user_words=4,
        max_tokens=2, concurrency=2, repeats=1, warmup=0), workers=2, worker_opts=FAST,
        progress=False)
    mt = result["scenarios"]["multi-turn"]
    assert (mt["ok"], mt["errors"]) == (9, 0) and mt["cache_hit_rate"] > 0.3
    assert result["meta"]["loopback"]["router_args"][:2] == ["launch", "--host"]


@pytest.mark.parametrize("policy", ["kv_aware", "consistent_hash"])
def test_sglang_router_refuses_what_it_cannot_do(policy):
    from k8s.router import RouterProps, router_args

    props = RouterProps(endpoint="e", namespace="n", image="i", policy=policy,
                        worker_selector={"a": "b"}, implementation="sglang-router")
    with pytest.raises(ValueError, match=f"sglang-router has no policy '{policy}'"):
        router_args(props)
    with pytest.raises(ValueError, match="router implementation 'x': one of vllm-router, "
                                         "sglang-router"):
        router_args(replace(props, implementation="x"))


def test_bench_starts_without_the_aws_sdk(tmp_path):
    """`python -m tools bench` on a client with no boto3/botocore: the SDK is only for prices."""
    blocker = tmp_path / "sitecustomize.py"
    blocker.write_text(
        "import sys\n"
        "class _NoAws:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in ('boto3', 'botocore'):\n"
        "            raise ImportError(f'{name} is not installed')\n"
        "sys.meta_path.insert(0, _NoAws())\n")
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}"}
    run = subprocess.run([sys.executable, "-m", "tools", "bench", "--url", "http://127.0.0.1:9",
                          "--scenarios", "nonsense"], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=60)
    assert "boto" not in run.stderr, run.stderr
    assert run.returncode == 2 and run.stderr.startswith("error: "), run.stderr


def test_peak_sweep_keeps_n_in_flight_and_stops_at_saturation():
    """`bench --peak`: closed loop at 1, 2, 4, ... in flight (no jitter, no rate), stopping
    once requests/s grow by less than 3%; the peak is the best point."""
    from bench.benchmark import in_flight_config, peak_markdown, peak_sweep

    seen = []

    def run(cfg):   # a server that saturates at 10 req/s
        seen.append((cfg.concurrency, cfg.jitter_s, cfg.request_rate))
        rps = min(10.0, 3.0 * cfg.concurrency)
        return {"scenarios": {"document-8k": {"request_throughput_rps": rps,
                                              "output_tokens_per_s": 64 * rps,
                                              "ttft_s": {"p50": cfg.concurrency / rps},
                                              "errors": 0}}}
    c = BenchConfig("http://x", request_rate=5.0, label="pa")
    peak = peak_sweep(c, run=run)
    assert seen == [(1, 0.0, None), (2, 0.0, None), (4, 0.0, None), (8, 0.0, None)]
    best = peak["scenarios"]["document-8k"]["peak"]
    assert (best["in_flight"], best["rps"]) == (4, 10.0)
    assert "| document-8k | 4 (peak) | 10.00 |" in peak_markdown(peak)
    assert in_flight_config(c, 3).concurrency == 3


def test_free_port_never_hands_out_the_same_port_twice():
    """Routers started side by side each get ports no other start in this process got."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(8) as ex:
        ports = list(ex.map(lambda _: free_port(), range(200)))
    assert len(set(ports)) == 200


def test_a_port_clash_is_told_apart_from_other_start_failures():
    from bench.loopback import RouterStartError, port_clash

    assert port_clash(RouterStartError("port(s) [46489] on 127.0.0.1 already in use"))
    assert port_clash(RouterStartError("vllm-router exited with 1 during startup; log x:\n"
                                       "Error starting router: Address already in use (os "
                                       "error 98)"))
    assert not port_clash(RouterStartError("vllm-router exited with 2: unknown argument"))
    assert not port_clash(OSError("already in use"))


def test_an_unreachable_url_says_so_not_that_a_model_is_missing(tmp_path, capsys):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert main(["bench", "--url", f"http://127.0.0.1:{port}", "--out", str(tmp_path / "o"),
                 "--repeats", "1"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: cannot reach http://127.0.0.1:{port}") and "\n" not in err
    assert "--model" not in err


def test_an_emulated_fleets_cost_is_counted_over_modelled_time():
    """At time_scale 0.25 a wall second is four served seconds: the cost per 1K tokens is
    four times what the wall clock alone would say (issue 42: the loopback benchmark's was
    4x too low)."""
    from bench.benchmark import BenchConfig, Phase, Sample, summarise

    samples = [Sample("s", "a", 0, ok=True, status=200, ttft_s=0.1, e2e_s=1.0,
                      output_tokens=100, prompt_tokens=10)]
    cost = {scale: summarise(Phase("s", (), 10), samples, 10.0, 0, {}, BenchConfig(
        "u", hourly_usd=8.0, instances=2, time_scale=scale))["cost_per_1k_output_tokens_usd"]
        for scale in (1.0, 0.25)}
    assert cost[0.25] == pytest.approx(4 * cost[1.0])
    assert cost[1.0] == pytest.approx(8.0 * 2 / 3600 * 10.0 / 100 * 1000)
