"""Every routing strategy at 4 and 16 emulated workers and 2K/8K/64K-token prompts, through the
real router each is deployed with (rendered args: sglang-router for prefixaware, vllm-router for
the rest, `prefixaware@vllm` for vllm-router's cache_aware), and the router's added latency:
`make bench-routing`.

    python -m bench.routing --out bench-results/routing --doc docs/benchmarks.md
    python -m bench.routing --stability --out bench-results/stability   # Done-when check
    python -m bench.routing --doc docs/benchmarks.md --render-only --out DIR

Writes DIR/matrix.json (and stability.json), then docs/benchmarks.md and its PNGs beside it.
Figures, not assertions: the workers are `bench.emulator` profiles (cited there).
"""
from __future__ import annotations

import argparse
import json
import math
import re
import sys
import textwrap
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from bench.loopback_bench import STRATEGIES, open_loop, run_strategies
from bench.report import _fmt_span, _num, ratio_span, span, verdict
from bench.benchmark import BenchConfig
from bench.emulator import load_profile_option, profile_file_option

# Every HyperPod strategy on the router the chart gives it, and vllm-router's cache_aware.
VLLM_CACHE_AWARE = "prefixaware@vllm"
SGLANG_CACHE_AWARE = "prefixaware"     # the chart's default for prefixaware
MATRIX = STRATEGIES + (VLLM_CACHE_AWARE,)
PROFILE = "g5.24xlarge"
WORKERS = (4, 16)
CONTEXTS = (2048, 8192, 65536)
# Wall seconds per emulated second, per context, for --real-time runs: a repeat takes seconds,
# not minutes. The default runs on the virtual clock (bench.vtime): no scale, GPU time at life
# size, routing by the real router in lockstep, the router's hop modelled.
REAL_TIME_SCALE = {2048: 0.5, 8192: 0.25, 65536: 0.04}
VIRTUAL_SCALE = {2048: 1.0, 8192: 1.0, 65536: 1.0}
TIME_SCALE = dict(VIRTUAL_SCALE)
VIRTUAL = True
LOAD = 0.5           # arrivals at half of what the workers prefill with no cache hit
BASELINE = "roundrobin"
KEEP = ("ttft_s", "cache_hit_rate", "output_tokens_per_s", "cost_per_1k_output_tokens_usd",
        "spread", "errors", "requests", "workers", "repeats", "prompt_words")
# HyperPod's published gains, Llama-3.1-70B on 7 x p5.48xlarge (prefix-aware vs round robin)
HYPERPOD = {"8k": {"p50": 0.28, "p90": 0.60, "throughput": 1.24, "cost": 0.79},
            "64k": {"p50": 0.06, "p90": 0.65, "throughput": 1.38, "cost": 0.72}}


def use_profile_file(path: Path) -> str:
    """Emulate the GPU of a profile written by `python -m tools calibrate` (here and in the
    tiered benchmarks this module renders)."""
    from bench import tiered
    from bench.emulator import load_profile_file

    global PROFILE
    PROFILE = tiered.PROFILE = load_profile_file(path).name
    return PROFILE


def config(ctx: int, workers: int, repeats: int, seed: int) -> BenchConfig:
    scenarios = ("multi-turn", "document") if ctx == 2048 else ("document",)
    # users grow with the workers (odd counts: no power-of-two worker count divides them),
    # so each session's and each document's own request rate stays the same
    c = BenchConfig("", scenarios=scenarios, contexts=(ctx,), concurrency=8,
                    sessions=2 * workers + 5, turns=5, documents=workers + 1, questions=4,
                    max_tokens=16, repeats=repeats,
                    seed=seed, warmup=8, direct_url="auto", overhead_requests=12,
                    overhead_prompt_words=ctx, hourly_usd=8.144, instances=workers,
                    timeout_s=900, time_limit_s=900)
    c = open_loop(c, PROFILE, TIME_SCALE[ctx], workers, LOAD)
    return replace(c, think_s=2.0 * TIME_SCALE[ctx])


def run_cells(strategies: list[str], c: BenchConfig, workers: int, out: Path) -> dict:
    """Each strategy on `workers` emulated replicas: on the virtual clock through the real
    router (default), or in real time at TIME_SCALE (--real-time)."""
    if not VIRTUAL:
        return run_strategies(strategies, c, workers=workers, profile=PROFILE,
                              time_scale=TIME_SCALE[c.contexts[0]], out=out)
    from bench.emulator import profile
    from bench.tiers import no_tiers
    from bench.vtime import FleetSpec, RunConfig, Req, RealRouter, run_arm

    gpu = profile(PROFILE)
    results = {}
    for strategy in strategies:
        r = run_arm(FleetSpec(gpu, workers, no_tiers()), strategy,
                    RunConfig(c, hourly_usd=c.hourly_usd or 1.0, instances=c.instances),
                    log_dir=out / "router-logs")
        probe = Req(0, "", "", 0, [], [0] * c.overhead_prompt_words, 1)
        hop = RealRouter(strategy, None).hop_for(probe, gpu)
        r["router_overhead"] = {"added_ttft_s_p50": hop, "modelled": True}
        r["meta"] |= {"started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "loopback": {
            "workers": workers, "strategy": strategy, "profile": PROFILE, "time_scale": 1.0,
            "virtual": True}}
        results[strategy] = r
    return results


def compact(result: dict) -> dict:
    return {"meta": {k: result["meta"][k] for k in ("label", "seed", "repeats", "started")}
            | {"loopback": {k: result["meta"]["loopback"][k] for k in (
                "workers", "strategy", "profile", "time_scale")}},
            "router_overhead": result.get("router_overhead"),
            "scenarios": {n: {k: s.get(k) for k in KEEP}
                          for n, s in result["scenarios"].items()}}


def run_matrix(out: Path, strategies: list[str], workers: list[int], contexts: list[int],
               repeats: int, seed: int) -> dict:
    path = out / "matrix.json"
    done: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {}
    for w in workers:
        for ctx in contexts:
            for strategy in strategies:
                key = f"{strategy}/{w}/{ctx}"
                if key in done:
                    continue
                t0 = time.time()
                cell = run_cells([strategy], config(ctx, w, repeats, seed), w,
                                 out / f"w{w}-{ctx}")[strategy]
                done[key] = compact(cell) | {"seconds": round(time.time() - t0, 1)}
                path.write_text(json.dumps(done, indent=1))
                print(f"{key}: {done[key]['seconds']} s", file=sys.stderr, flush=True)
    return done


def stability_path(out: Path, candidate: str) -> Path:
    return out / ("stability.json" if candidate == "prefixaware" else
                  f"stability-{candidate}.json")


def run_stability(out: Path, invocations: int, repeats: int, seed: int,
                  headers: tuple[bool, ...], candidate: str = "prefixaware") -> dict:
    """The Done-when check: the same candidate-vs-roundrobin compare, invoked again and
    again (fresh workers, router and salts each time, same seed), each with `repeats`."""
    path = stability_path(out, candidate)
    done: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {}
    for header in headers:
        for i in range(invocations):
            key = f"{'header' if header else 'noheader'}/{i}"
            if key in done:
                continue
            c = BenchConfig("", scenarios=("multi-turn", "document"), contexts=(8192,),
                            concurrency=8, sessions=13, turns=5, documents=5, questions=4,
                            max_tokens=16, repeats=repeats, seed=seed, warmup=8,
                            hourly_usd=8.144, instances=4, timeout_s=900,
                            session_header=header)
            c = replace(open_loop(c, PROFILE, TIME_SCALE[8192], 4, LOAD),
                        think_s=2.0 * TIME_SCALE[8192])
            runs = run_cells([BASELINE, candidate], c, 4,
                             out / f"{candidate}-{key.replace('/', '-')}")
            done[key] = {s: compact(r) for s, r in runs.items()}
            path.write_text(json.dumps(done, indent=1))
    return done


# --------------------------------------------------------------------------- report


def _ratio(cell: dict, base: dict, scenario: str, key: str) -> tuple | None:
    a, b = base["scenarios"].get(scenario), cell["scenarios"].get(scenario)
    return ratio_span(a, b, key) if a and b else None


def _hop_ms(cell: dict) -> str:
    o = cell.get("router_overhead") or {}
    v = o.get("added_ttft_s_p50")
    return "-" if v is None else f"{v * 1000:.1f}"


def _hop_s(cell: dict) -> float:
    return max(0.0, (cell.get("router_overhead") or {}).get("added_ttft_s_p50") or 0.0)


def life_size_ratio(cell: dict, base: dict, scenario: str, ctx: int) -> float | None:
    """The P50 ratio with the emulated part scaled back to life: (P50 - hop) / scale + hop,
    the router's real added latency `hop` left as measured. An estimate from medians."""
    scale = TIME_SCALE[ctx]
    try:
        a = base["scenarios"][scenario]["ttft_s"]["p50"]
        b = cell["scenarios"][scenario]["ttft_s"]["p50"]
    except (KeyError, TypeError):
        return None
    ha, hb = _hop_s(base), _hop_s(cell)
    life_a = max(a - ha, 0.0) / scale + ha
    life_b = max(b - hb, 0.0) / scale + hb
    return life_b / life_a if life_a else None


def fanout_table(m: dict) -> list[str]:
    """Where cache_aware's per-request render on every worker costs more than a cache hit
    saves: the measured added latency against the prefill a hit saves on each profile."""
    from bench.emulator import PROFILES

    lines = ["", "| workers | context | vllm-router cache_aware added ms (measured) | "
             "sglang-router cache_aware added ms | " + " | ".join(
                 f"prefill a hit saves on {p} ms" for p in PROFILES) + " |",
             "|" + "---|" * (4 + len(PROFILES))]
    for w in WORKERS:
        for ctx in CONTEXTS:
            cell = m.get(f"{VLLM_CACHE_AWARE}/{w}/{ctx}")
            sgl = m.get(f"{SGLANG_CACHE_AWARE}/{w}/{ctx}")
            if not cell:
                continue
            hop = _hop_s(cell)
            saves = []
            for gpu in PROFILES.values():
                saved = gpu.prefill_seconds(ctx) - gpu.prefill_seconds(ctx, ctx - 16)
                saves.append(f"{saved * 1000:.0f} (pays from a {hop / saved:.1%} hit rate)"
                             if saved > hop else f"{saved * 1000:.0f} (LOSES at any hit rate)")
            lines.append(f"| {w} | {ctx // 1024}K | {hop * 1000:.1f} | "
                         f"{_hop_ms(sgl) if sgl else '-'} | " + " | ".join(saves) + " |")
    return lines


def matrix_tables(m: dict) -> tuple[list[str], list[dict]]:
    """Markdown lines, and rows (for plots) of every scenario x workers x strategy."""
    lines: list[str] = []
    rows: list[dict] = []
    scenarios = []
    for key, cell in m.items():
        for name in cell["scenarios"]:
            ctx = int(key.split("/")[2])
            if (name, ctx) not in scenarios:
                scenarios.append((name, ctx))
    for name, ctx in scenarios:
        what = "2K-token system prompt, growing history" if name == "multi-turn" \
            else "document Q&A"
        clock = "virtual, life size" if VIRTUAL else "wall, time-scaled"
        hop = "modelled" if VIRTUAL else "warm prompt of the context's size"
        lines += ["", f"### {name} ({what})",
                  "", f"| workers | strategy | TTFT P50 ms ({clock}) | P90 ms | P50 / round "
                  "robin | P90 / round robin | P50 / rr at life size (est.) | hit rate | "
                  f"tok/s / rr | $/1K out / rr | router added ms ({hop}) | errors |",
                  "|" + "---|" * 12]
        for w in WORKERS:
            base = m.get(f"{BASELINE}/{w}/{ctx}")
            for strategy in MATRIX:
                cell = m.get(f"{strategy}/{w}/{ctx}")
                if not cell or name not in cell["scenarios"] or not base:
                    continue
                s = cell["scenarios"][name]
                r50 = _ratio(cell, base, name, "ttft_s.p50")
                r90 = _ratio(cell, base, name, "ttft_s.p90")
                lines.append("| " + " | ".join([
                    str(w), strategy, _fmt_span(span(s, "ttft_s.p50"), 1000),
                    _fmt_span(span(s, "ttft_s.p90"), 1000),
                    "-" if strategy == BASELINE else _fmt_span(r50, fmt=".2f"),
                    "-" if strategy == BASELINE else _fmt_span(r90, fmt=".2f"),
                    "-" if strategy == BASELINE else _num(
                        life_size_ratio(cell, base, name, ctx), ".2f"),
                    _fmt_span(span(s, "cache_hit_rate"), pct=True),
                    "-" if strategy == BASELINE else _fmt_span(
                        _ratio(cell, base, name, "output_tokens_per_s"), fmt=".2f"),
                    "-" if strategy == BASELINE else _fmt_span(
                        _ratio(cell, base, name, "cost_per_1k_output_tokens_usd"), fmt=".2f"),
                    _hop_ms(cell), str(s.get("errors", 0))]) + " |")
                rows.append({"scenario": name, "ctx": ctx, "workers": w, "strategy": strategy,
                             "p50": r50, "p90": r90,
                             "hit": span(s, "cache_hit_rate"), "hop": (cell.get(
                                 "router_overhead") or {}).get("added_ttft_s_p50")})
    return lines, rows


def _candidate(runs: dict) -> str:
    return next(k for k in runs if k != BASELINE)


def stability_table(st: dict) -> list[str]:
    cand = _candidate(next(iter(st.values())))
    lines = ["", f"| invocation | session header | scenario | P50 {cand} / roundrobin "
             "(range) | P90 ratio (range) | hit rate rr / candidate |",
             "|---|---|---|---|---|---|"]
    for key, runs in st.items():
        header, i = key.split("/")
        base, pa = runs[BASELINE], runs[cand]
        for name in pa["scenarios"]:
            lines.append("| " + " | ".join([
                str(int(i) + 1), "yes" if header == "header" else "no", name,
                _fmt_span(_ratio(pa, base, name, "ttft_s.p50"), fmt=".2f"),
                _fmt_span(_ratio(pa, base, name, "ttft_s.p90"), fmt=".2f"),
                f"{_fmt_span(span(base['scenarios'][name], 'cache_hit_rate'), pct=True)} / "
                f"{_fmt_span(span(pa['scenarios'][name], 'cache_hit_rate'), pct=True)}"]) + " |")
    return lines


def plot_ratios(rows: list[dict], path: Path) -> None:
    from bench.report import _pyplot

    plt = _pyplot()
    groups = [(n, c) for n, c in dict.fromkeys((r["scenario"], r["ctx"]) for r in rows)]
    strategies = [s for s in MATRIX if s != BASELINE]
    fig, axes = plt.subplots(1, len(WORKERS), figsize=(13, 4.5), sharey=True)
    for ax, w in zip(axes, WORKERS):
        width = 0.8 / len(strategies)
        for k, strategy in enumerate(strategies):
            got = {(r["scenario"], r["ctx"]): r["p50"] for r in rows
                   if r["workers"] == w and r["strategy"] == strategy}
            vals = [got.get(g) or (0, 0, 0) for g in groups]
            ax.bar([i + k * width for i in range(len(groups))], [v[0] for v in vals], width,
                   yerr=[[v[0] - v[1] for v in vals], [v[2] - v[0] for v in vals]],
                   capsize=2, color=f"C{k}", label=strategy)
        ax.axhline(1.0, color="black", lw=0.8)
        ax.axhline(HYPERPOD["8k"]["p50"], color="grey", ls="--", lw=0.8,
                   label="HyperPod 8K P50 (0.28)")
        ax.set_yscale("log")
        ax.set_title(f"{w} workers ({PROFILE})")
        ax.set_xticks([i + 0.4 - width / 2 for i in range(len(groups))],
                      [n for n, _ in groups], rotation=15)
        ax.grid(True, axis="y", alpha=0.3)
    axes[0].set_ylabel("TTFT P50 / round robin (median, min-max)")
    axes[-1].legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def render_doc(doc: Path, out: Path) -> None:
    from bench.emulator import PROFILES, SOURCES

    m = json.loads((out / "matrix.json").read_text()) if (out / "matrix.json").exists() else {}
    st = json.loads((out / "stability.json").read_text()) \
        if (out / "stability.json").exists() else {}
    vllm_path = stability_path(out, VLLM_CACHE_AWARE)
    st_vllm = json.loads(vllm_path.read_text()) if vllm_path.exists() else {}
    figs = doc.parent / "benchmarks"
    figs.mkdir(parents=True, exist_ok=True)
    lines, rows = matrix_tables(m)
    if rows:
        plot_ratios(rows, figs / "ttft-p50-ratio.png")
    prof = [p.describe() for p in PROFILES.values()]
    text = [
        "# Routing benchmarks (emulated GPUs, real router)", "",
        "Generated by `make bench-routing` (`python -m bench.routing`); do not edit by "
        "hand. Figures, not assertions.", "",
        "## How these numbers are made", "",
        "- The real routers the chart deploys, started with the args `k8s/router.py` renders "
        "for each strategy: `sglang-router` 0.3.2 for prefixaware (the default), `vllm-router` "
        "0.1.17 for kvaware (static workers and one KV event source each), session and "
        "roundrobin, and for `prefixaware@vllm` (vllm-router's cache_aware, the alternative "
        "`routerImplementations` offers), in front of "
        "emulated vLLM replicas (`bench/fake_worker.py` + `bench/emulator.py`), all on "
        "127.0.0.1.",
        f"- Workers emulate the `{PROFILE}` profile below: bounded KV cache (LRU), continuous "
        "batching with chunked prefill, prefill and decode at fitted rates, a front end per "
        "request, render/tokenize at a tokenizer's cost. Only the H100 figures were held "
        "against real hardware ('Held against real hardware'); an A10G's are its published "
        "specs with an assumed prefill efficiency (see the sources): `python -m tools "
        "calibrate` on a real worker replaces them.",
        f"- Workload (`bench/benchmark.py`): seed 1, the same plan for every strategy; "
        "2 x workers + 5 multi-turn sessions x 5 turns (2K-token system prompt), workers + 1 "
        "documents x 4 questions per context (13 and 5 at 4 workers, 37 and 17 at 16); "
        "shuffled order; Poisson arrivals at "
        f"{LOAD:.0%} of what the workers prefill with no cache hit; 8 warm-up requests per "
        "repeat left out; every repeat on emptied worker caches and a new router process (a "
        "router's learned placement lives in its process, so repeats sample it as separate "
        "invocations do); 16 output tokens per request.",
        "- Every figure: the median of 3 repeats, min-max in brackets; a ratio's range is "
        "the widest the repeats allow (min B / max A .. max B / min A).",
        (("- Virtual time (`bench.vtime`): emulated GPU time at life size on a discrete-event "
          "clock, so CPU contention on this machine changes no figure. Every request still goes "
          "through the real router, in lockstep: the clock waits at each arrival until the "
          "router has chosen a worker and at each completion until the answer has passed back, "
          "so the router decides on exactly the requests in flight it would see live. Its own "
          "hop is modelled ('router added ms'): ~1 ms, plus for vllm-router's cache_aware and "
          "kv_aware the prompt's render/tokenize on the workers (1 ms + 1.5 us per token). "
          "Repeats differ only in their prompt salts, so their ranges are narrow. "
          "`--real-time` runs the former real-time, time-scaled benchmark instead.") if VIRTUAL
         else ("- Time scale: emulated GPU time runs faster than life (2K: x"
               f"{TIME_SCALE[2048]}, 8K: x{TIME_SCALE[8192]}, 64K: x{TIME_SCALE[65536]}); the "
               "router's own hop and the workers' render/tokenize cost stay real time. 'at life "
               "size (est.)': both medians with the emulated part divided by the time scale.")),
        "- `session-noheader`: the session strategy (consistent_hash on X-Session-ID) while "
        "the client sends no header.",
        "", "## Emulator profiles", "",
        "| profile | replica | model | KV bytes/token | KV tokens per replica | prefill tok/s "
        "(2K) | TTFT 2K / 8K / 64K s (alone, no cache) | the same, all but 256 tokens cached | "
        "decode ms/token (1 / 32 seqs) | render 8K ms | TP all-reduces of a full prefill step "
        "(max batched tokens) / a decode step ms (interconnect) | LMCache release (CPU->GPU "
        "GB/s per GPU) |", "|" + "---|" * 12]
    for p in prof:
        text.append(f"| {p['profile']} | {p['replica']} | {p['model']} | "
                    f"{p['kv_bytes_per_token']:,} | {p['kv_tokens']:,} | "
                    f"{p['prefill_tokens_per_s_2k']:,} | {p['ttft_s']['2k']} / "
                    f"{p['ttft_s']['8k']} / {p['ttft_s']['64k']} | {p['hit_ttft_s']['2k']} / "
                    f"{p['hit_ttft_s']['8k']} / {p['hit_ttft_s']['64k']} | "
                    f"{p['decode_ms_per_token']} / {p['decode_ms_per_token_batch_32']} | "
                    f"{p['render_ms_8k']} | {p['allreduce_ms_8k']} / {p['allreduce_ms_decode']} "
                    f"({p['interconnect']}) | {p['lmcache']} |")
    text += ["", "Sources of the profile figures:", ""] + [f"- {s}" for s in SOURCES]
    text += held_against_hardware(out)
    text += model_bars(out)
    text += ["", "## Every strategy (ratios against round robin at the same workers)"]
    text += lines or ["", "(no matrix results yet)"]
    if rows:
        text += ["", "![TTFT P50 ratio to round robin](benchmarks/ttft-p50-ratio.png)"]
    text += ["", "## Where cache_aware's render fan-out stops paying", "",
             "vllm-router 0.1.17's cache_aware renders every request on every worker and waits "
             "for the slowest; the added latency below is "
             + ("modelled (see above; measured on loopback: 4 workers 6.6 / 39.6 ms at "
                "8K / 64K on loopback)" if VIRTUAL else "measured (warm prompt of the "
                "context's size, direct vs through the router, median of 12)")
             + ". A cache hit saves "
             "the prefill of the prompt less 16 tokens, from each profile's model; the fan-out "
             "pays once the hit rate exceeds added / saved (every request pays it, only hits "
             "save). Caveat: "
             "here up to 16 worker processes render on 2 shared cores, so the 16-worker "
             "fan-out is slower than on 16 separate API servers."]
    text += fanout_table(m) if m else ["", "(no matrix results yet)"]
    text += ["", "## Stability: the same compare, invoked three times", "",
             "prefixaware (the default: sglang-router's cache_aware) vs roundrobin, 4 workers, "
             "multi-turn and 8K document Q&A, each invocation with 3 repeats (fresh workers, "
             "router and prompt salts)."
             + (" On the virtual clock invocations can only differ by their salts: identical "
                "figures show the harness is deterministic, not that a live system is." if VIRTUAL
                else "")]
    text += stability_table(st) if st else ["", "(no stability results yet)"]
    if st_vllm:
        text += ["", "The same check with vllm-router's cache_aware as the candidate "
                 f"(`--stability --candidate {VLLM_CACHE_AWARE}`):"] + stability_table(st_vllm)
    text += ["", "## HyperPod's published yardstick", "",
             "Llama-3.1-70B on 7 x p5.48xlarge, prefix-aware vs round robin: 8K context TTFT "
             "P50 -72% (ratio 0.28), P90 -40% (0.60), throughput +24%, cost -21%; 64K P50 -94% "
             "(0.06), P90 -35% (0.65), throughput +38%, cost -28%."]
    from bench import tiered

    tiered_dir = out.parent / "tiered"
    text += tiered.render(tiered_dir) if tiered_dir.exists() else [
        "", "(no tiered results yet: python -m bench.tiered)"]
    from bench import pd_sim

    text += pd_sim.render()    # from bench/data/pd_sim.json
    doc.write_text(wrap_prose("\n".join(text + findings(m, st) + (
        _stability_findings(st_vllm) if st_vllm else []))) + "\n")


_ITEM = re.compile(r"^(\s*)((?:[-*+]|\d+[.)])\s+)")
_STARTS_BLOCK = re.compile(r"^([-+*#>|]|\d+[.)])(\s|$)")


def _special(line: str) -> bool:
    return not line.strip() or line.lstrip().startswith(("|", "#", "<!--", "```"))


def wrap_prose(text: str, width: int = 100) -> str:
    """Markdown prose re-wrapped at `width` columns so the page reads in a terminal and diffs
    line by line; tables, code, headings and list structure stay as they are (a paragraph or
    list item is one unit; a line is never begun with what would start a new block)."""
    lines, out, i, fence = text.split("\n"), [], 0, False
    while i < len(lines):
        if lines[i].startswith("```"):
            fence = not fence
        if fence or _special(lines[i]):
            out.append(lines[i])
            i += 1
            continue
        j = i + 1
        while j < len(lines) and not _special(lines[j]) and not _ITEM.match(lines[j]):
            j += 1
        block = lines[i:j]
        if max(map(len, block)) > width:
            m = _ITEM.match(block[0])
            lead = m.group(1) + m.group(2) if m else re.match(r"\s*", block[0]).group()
            rest = " " * len(lead)
            words = " ".join(x.strip() for x in [block[0][len(lead):], *block[1:]])
            block = textwrap.wrap(words, width=width, initial_indent=lead, subsequent_indent=rest,
                                  break_long_words=False, break_on_hyphens=False)
            for k in range(1, len(block)):
                while _STARTS_BLOCK.match(block[k][len(rest):]) and " " in block[k - 1].strip():
                    head, word = block[k - 1].rsplit(" ", 1)
                    block[k - 1], block[k] = head, rest + word + " " + block[k][len(rest):]
        out.extend(block)
        i = j
    return "\n".join(out)


def lmcache_rows(lmc: dict) -> list[str]:
    """The tiers run (LMCache 0.5.0 as we used to configure it) beside the emulator, and the
    configuration k8s/workers.py renders now in the same setting."""
    from bench.emulator import measured

    meas = measured()["lmcache_two_servers_one_gpu"]["arms"]
    ref = {"A roundrobin, no LMCache": "r95-A-rr", "roundrobin + old (measured run)":
           "r95-B-rr-lmc", "prefixaware + old (measured run)": "r95-C-pa-lmc"}
    lines = ["", "The tiers run on that hardware (the same servers with 2,000-block GPU caches, "
             "LMCache 0.5.0 as we used to configure it: L1 20 GiB, L2 `lm://` on the host, "
             "lookup_timeout_ms 1000; 3.93 req/s) beside the emulator, and the configuration "
             "k8s/workers.py renders now in the same setting (emulated only). TTFT in ms, "
             "real in brackets:", "",
             "| arm | scenario | P50 | P90 | out tok/s | cached share GPU / L1 / L2 | P50 / P90 vs "
             "arm A | lookup timeouts |", "|---|---|---|---|---|---|---|---|"]
    base = lmc.get("A roundrobin, no LMCache", {}).get("scenarios", {})
    for name, arm in lmc.items():
        for scen, x in arm["scenarios"].items():
            m = meas.get(ref.get(name, ""), {}).get("scenarios", {}).get(scen)
            real = (lambda k: f" ({m['ttft_ms'][k]:,.0f})") if m else (lambda k: "")
            b = base.get(scen, {}).get("ttft_s") or {}
            t = x["ttft_s"]
            a = meas["r95-A-rr"]["scenarios"][scen]["ttft_ms"]
            vs = (f"{t['p50'] / b['p50']:.2f} / {t['p90'] / b['p90']:.2f}"
                  + (f" ({m['ttft_ms']['p50'] / a['p50']:.2f} / "
                     f"{m['ttft_ms']['p90'] / a['p90']:.2f})" if m else "")) if b else "-"
            tok = f" ({m['output_tokens_per_s']:.0f})" if m else ""
            lines.append(f"| {name} | {scen} | {t['p50'] * 1e3:,.0f}{real('p50')} | "
                         f"{t['p90'] * 1e3:,.0f}{real('p90')} | "
                         f"{x['output_tokens_per_s']:.0f}{tok} | {x['gpu_hit_rate']:.0%} / "
                         f"{x['l1_hit_rate']:.0%} / {x['l2_hit_rate']:.0%} | {vs} | "
                         f"{x.get('lookup_timeouts') or 0} |")
    return lines


def _slice_profile(h: Any, sl: dict) -> Any:
    """`h` serving the measured slice of Llama-3.1-70B (`sl`: its layers and parameters)."""
    from bench.emulator import ModelShape

    return replace(h, model=ModelShape("slice", sl["params_b"], sl["layers"], 8192, 8, 128))


def model_bars(out: Path) -> list[str]:
    """Each bar the emulator is held to, met or not, with its figures (computed from the
    results on disk and the data in bench/data; nothing hand-written)."""
    from bench import tiered, tp_check
    from bench.emulator import measured, profile

    h = profile("h100-8b")
    m = measured()
    worst = []
    for n, v in m["single_server"]["ttft_ms"].items():
        n_ = int(n)
        worst += [h.prefill_seconds(n_) * 1e3 / v["cold"],
                  h.prefill_seconds(n_, n_ - 256) * 1e3 / v["hit256"]]
    worst += [h.decode_seconds(2048, int(b)) * 1e3 / v
              for b, v in m["single_server"]["decode_step_ms"].items()]
    sl = m["llama70b_8layer_slice"]
    g = _slice_profile(h, sl)
    for n, v in sl["ttft_ms"].items():
        n_ = int(n)
        worst += [g.prefill_seconds(n_) * 1e3 / v["cold"],
                  g.prefill_seconds(n_, n_ - 256) * 1e3 / v["hit256"]]
    worst += [g.decode_seconds(2048, int(b)) * 1e3 / v for b, v in sl["decode_step_ms"].items()]
    far = max(worst, key=lambda r: abs(r - 1))
    lines = ["", "## The bars the model is held to", "",
             f"- One H100, every measured TTFT and decode step (Llama-3.1-8B, and 8 of "
             f"Llama-3.1-70B's layers) within 15%: {'met' if abs(far - 1) <= 0.15 else 'NOT met'}"
             f" ({len(worst)} figures, furthest {far:.2f}x)."]
    ab = out.parent / "ab-check.json"
    if ab.exists():
        rows = json.loads(ab.read_text())["reproduction"]
        diffs = [abs(r[f"{k}_measured"] - r[f"{k}_emulated"]) for r in rows
                 for k in ("p50", "p90")]
        lines.append(f"- The H100 A/B, every TTFT P50/P90 ratio within 0.1 and hit rate within "
                     f"5 points: {'met' if all(r['ok'] for r in rows) else 'NOT met'} "
                     f"(largest ratio difference {max(diffs):.2f}).")
    rows = tp_check.rows()
    lines.append("- A TP 4 replica within 15% of published absolute figures: "
                 + ("met" if rows and all(r["ok"] for r in rows) else "NOT met") + " ("
                 + ", ".join(f"{r['gpu']} {r['ratio']:.2f}x" for r in rows)
                 + "; vLLM's own latency runs, each held out, the same build's TP 1 run "
                 "fixing its host time).")
    lines.append("- A TP 8 replica within 15% of a published absolute figure: NOT met (no "
                 "published TP 8 run with a replayable setup found; bench/data/"
                 "published_tp.json says which were looked at).")
    tdir = out.parent / "tiered"
    for name, label in (("llmd.json", "1,000 output tokens, as configured"),
                        (tiered.LLMD_IMPLIED, "the output length their figures imply")):
        path = tdir / name
        if not path.exists():
            continue
        v = tiered.llmd_verdict(json.loads(path.read_text()))
        for arm, x in v["arms"].items():
            # furthest by factor (0.5x is as far as 2x), as "within 2x" judges
            far_b = max(x["rows"], key=lambda r: max(abs(math.log(r["mean"])),
                                                     abs(math.log(r["p90"]))))
            aw = [r for r in x["rows"] if r["aware"] is not None]
            far_a = max(aw, key=lambda r: abs(math.log(r["aware"]))) if aw else None
            bad = [r["qps"] for r in x["rows"] if not 0.5 <= r["mean"] <= 2
                   or not 0.5 <= r["p90"] <= 2]
            bad_a = [r["qps"] for r in aw if not 0.5 <= r["aware"] <= 2]
            yn = lambda ok: "met" if ok else "NOT met"   # noqa: E731
            lines.append(
                f"- llm-d's run, {label}, {arm} as the cache-blind arm: mean and P90 TTFT "
                f"within 2x of their random scheduler's at every stage {yn(x['blind_ok'])}"
                + (f" (off at {', '.join(map(str, bad))} QPS; furthest {far_b['qps']} QPS: "
                   f"mean {far_b['mean']:.2f}x, P90 {far_b['p90']:.2f}x)" if bad else "")
                + f"; knee within one stage {yn(x['knee_ok'])} (ours {x['knee']} QPS, theirs "
                f"{v['their_knee']}); prefix-aware's mean within 2x of their precise "
                f"scheduler's {yn(x['aware_ok'])}"
                + (f" (off at {', '.join(map(str, bad_a))} QPS; furthest {far_a['qps']} QPS, "
                   f"{far_a['aware']:.2f}x)" if bad_a and far_a else "")
                + f"; output throughput ratio within 25% {yn(x['ratio_ok'])} "
                f"({x['ratio']:.2f} against their {v['their_ratio']:.2f}).")
    lines.append("- `python -m tools calibrate` against an endpoint whose cost is linear in "
                 "tokens: three runs each predict cold TTFT at 2K, 8K and 64K within 15% "
                 "(tests/bench/test_calibrate.py holds it with such a fake).")
    return lines


def held_against_hardware(out: Path) -> list[str]:
    """The calibration's check (every H100 figure of issue 17's table beside the emulator's)
    and the real A/B reproduced (`python -m bench.ab_check --json`), when it has run."""
    from dataclasses import replace as _replace

    from bench import tp_check
    from bench.emulator import measured, profile

    h = profile("h100-8b")
    m = measured()["single_server"]
    lines = ["", "## Held against real hardware", "",
             "Real vLLM 0.24.0 on one H100 80GB (Llama-3.1-8B shapes, and the same server "
             "with 8 of Llama-3.1-70B's layers; bench/data/h100_vllm_0_24.json) beside the "
             "`h100-8b` profile (tests/bench/test_emulator.py keeps every figure within "
             "15%):", "",
             "| figure | real vLLM | emulator |", "|---|---|---|"]
    for n, v in m["ttft_ms"].items():
        n_ = int(n)
        lines.append(f"| TTFT cold / all but 256 cached, {n_ // 1024}K, ms | {v['cold']} / "
                     f"{v['hit256']} | {h.prefill_seconds(n_) * 1e3:.1f} / "
                     f"{h.prefill_seconds(n_, n_ - 256) * 1e3:.1f} |")
    for b, v in m["decode_step_ms"].items():
        lines.append(f"| decode step, 2K context, batch {b}, ms | {v} | "
                     f"{h.decode_seconds(2048, int(b)) * 1e3:.2f} |")
    lines.append(f"| KV tokens at utilization {m['gpu_memory_utilization']} | "
                 f"{m['kv_cache_size_tokens']:,} | "
                 f"{_replace(h, gpu_memory_utilization=m['gpu_memory_utilization']).kv_tokens:,} |")
    sl = measured()["llama70b_8layer_slice"]
    g = _slice_profile(h, sl)
    for n, v in sl["ttft_ms"].items():
        n_ = int(n)
        lines.append(f"| Llama-3.1-70B's layers, 8 of them: TTFT cold / all but 256 cached, "
                     f"{n_ // 1024}K, ms | {v['cold']} / {v['hit256']} | "
                     f"{g.prefill_seconds(n_) * 1e3:.1f} / "
                     f"{g.prefill_seconds(n_, n_ - 256) * 1e3:.1f} |")
    for b, v in sl["decode_step_ms"].items():
        lines.append(f"| Llama-3.1-70B's layers, 8 of them: decode step, 2K context, batch {b}, "
                     f"ms | {v} | {g.decode_seconds(2048, int(b)) * 1e3:.2f} |")
    lines += tp_check.render()
    ab = out.parent / "ab-check.json"
    if ab.exists():
        rows = json.loads(ab.read_text())["reproduction"]
        lines += ["", "The product's A/B on that hardware (two vLLM servers sharing the H100, "
                  "the routers k8s/router.py renders, this project's bench, 3 repeats), and the "
                  "emulator set up the same way (`python -m bench.ab_check`: the same bench "
                  "arguments, the same real routers in lockstep):", "",
                  "| rate | scenario | TTFT P50 prefixaware / RR real | emulated | P90 real | "
                  "emulated | hit RR real / emulated | hit prefixaware real / emulated |",
                  "|---|---|---|---|---|---|---|---|"]
        for r in rows:
            lines.append(f"| {r['rate']} | {r['scenario']} | {r['p50_measured']:.2f} | "
                         f"{r['p50_emulated']:.2f} | {r['p90_measured']:.2f} | "
                         f"{r['p90_emulated']:.2f} | {r['hit_roundrobin'][0]:.0%} / "
                         f"{r['hit_roundrobin'][1]:.0%} | {r['hit_prefixaware'][0]:.0%} / "
                         f"{r['hit_prefixaware'][1]:.0%} |")
        lmc = json.loads(ab.read_text()).get("lmcache")
        if lmc:
            lines += lmcache_rows(lmc)
        bad = [f"{r['scenario']} at {r['rate']} req/s" for r in rows if not r["ok"]]
        lines += ["", "Within 0.1 on every ratio and 5 points on every hit rate: "
                  + ("all rows (with vLLM's async scheduling modelled: without it the 3.93 "
                     "req/s document P90 ratio was 0.49 against 0.70)." if not bad else
                     "all rows but " + ", ".join(bad) + ".")]
    return lines


def findings(m: dict, st: dict) -> list[str]:
    """What the figures say, computed from them (no hand-written claims)."""
    out = ["", "## What the figures say", ""]
    if st:
        out += _stability_findings(st)
    if m:
        out += _matrix_findings(m)
    return out


def _stability_findings(st: dict) -> list[str]:
    """Per scenario and header setting: do the invocations' P50 ratio ranges overlap (for
    intervals, pairwise overlap = one common point) and stay on one side of 1?"""
    out = []
    for header in ("header", "noheader"):
        runs = {k: r for k, r in st.items() if k.split("/")[0] == header}
        for name in ("multi-turn", "document-8k"):
            got = [v for r in runs.values()
                   if (v := _ratio(r[_candidate(r)], r[BASELINE], name, "ttft_s.p50"))]
            if not got:
                continue
            lo, hi = max(v[1] for v in got), min(v[2] for v in got)
            side = all(v[2] < 1 for v in got) or all(v[1] > 1 for v in got)
            worst = max(v[2] for v in got)
            out.append(
                f"- {name}, {'with' if header == 'header' else 'without'} X-Session-ID, "
                f"{_candidate(next(iter(runs.values())))} / roundrobin TTFT P50 over {len(got)} invocations of 3 repeats: "
                f"medians {', '.join(f'{v[0]:.2f}' for v in got)}; the ranges "
                + (f"overlap ({lo:.3f}-{hi:.3f} is in all)" if lo <= hi else
                   f"do NOT all overlap (highest low {lo:.3f} > lowest high {hi:.3f})")
                + f" and {'stay below 1' if side else 'cross 1'}; the worst end of any "
                f"range, {worst:.2f}, is "
                f"{'within' if worst <= HYPERPOD['8k']['p50'] else 'above'} HyperPod's 8K "
                f"P50 yardstick ({HYPERPOD['8k']['p50']}).")
    return out


def _matrix_findings(m: dict) -> list[str]:
    out = []
    _, rows = matrix_tables(m)
    best: dict[tuple, tuple[str, float]] = {}
    for r in rows:
        if r["strategy"] == BASELINE or not r["p50"]:
            continue
        key = (r["scenario"], r["workers"])
        if key not in best or r["p50"][0] < best[key][1]:
            best[key] = (r["strategy"], r["p50"][0])
    for (name, w), (strategy, ratio) in best.items():
        out.append(f"- {name}, {w} workers: lowest TTFT P50 {strategy} ({ratio:.2f} x round "
                   "robin).")
    loses = [line for line in fanout_table(m) if "LOSES" in line]
    out.append("- vllm-router's cache_aware render fan-out, per request, costs more than a "
               "hit saves: " + ("; ".join(line.strip("| ").replace(" | ", ", ")
                                          for line in loses)
                                if loses else "nowhere in the measured range (its added "
                                "latency stays below the prefill a hit saves on every "
                                "profile, 2K to 64K, 4 and 16 workers)."))
    out += _fanout_losses(m, rows)
    for key, cell in sorted(m.items()):
        strategy, w, ctx = key.split("/")
        vllm = m.get(f"{VLLM_CACHE_AWARE}/{w}/{ctx}")
        if strategy != SGLANG_CACHE_AWARE or not vllm:
            continue
        for name, sg in cell["scenarios"].items():
            va = vllm["scenarios"].get(name)
            r = ratio_span(va, sg, "ttft_s.p50") if va else None
            if r:
                out.append(f"- {name}, {w} workers: sglang-router / vllm-router cache_aware "
                           f"TTFT P50 {_fmt_span(r, fmt='.2f')}: "
                           f"{verdict(va, sg, 'ttft_s.p50', 'vllm-router', 'sglang-router')}"
                           f"; router added latency {_hop_ms(cell)} vs {_hop_ms(vllm)} ms.")
    twins = {k: m[v] for k in m if k.startswith(f"{SGLANG_CACHE_AWARE}/")
             and (v := k.replace(SGLANG_CACHE_AWARE, VLLM_CACHE_AWARE, 1)) in m}
    pairs = [(k, n) for k in twins for n in m[k]["scenarios"]]
    lower = [(k, n) for k, n in pairs if verdict(
        twins[k]["scenarios"].get(n) or {}, m[k]["scenarios"][n],
        "ttft_s.p50", "v", "s") == "s lower"]
    if pairs:
        out.append(
            f"- Default: sglang-router's cache_aware has the lower TTFT P50 than vllm-router's "
            f"in {len(lower)} of {len(pairs)} cells (clear of the ranges), at the same hit "
            "rate, with no session header needed: the chart deploys it for `prefixaware` "
            "(`config.contracts.DEFAULT_ROUTER`); `routerImplementations: {\"prefixaware\": "
            "\"vllm-router\"}` in an environment brings vllm-router's back.")
    noheader = [r for r in rows if r["strategy"] == "session-noheader" and r["p50"]]
    if noheader:
        worst = max(noheader, key=lambda r: r["p50"][0])
        out.append(f"- session without X-Session-ID (consistent_hash on a constant key) "
                   f"puts every request on one worker: up to {worst['p50'][0]:.2f} x round "
                   f"robin's P50 ({worst['scenario']}, {worst['workers']} workers).")
    return out


def _fanout_losses(m: dict, rows: list[dict]) -> list[str]:
    """Cells where vllm-router's cache_aware does worse than round robin, with what explains
    it: requests that arrive while earlier ones are still in the fan-out are routed before
    the router's tree holds their prefix."""
    from bench.emulator import profile as gpu_profile

    out = []
    gpu = gpu_profile(PROFILE)
    for r in rows:
        if r["strategy"] != VLLM_CACHE_AWARE or not r["p50"] or r["p50"][0] <= 1:
            continue
        ctx, w = r["ctx"], r["workers"]
        gap = TIME_SCALE[ctx] * gpu.prefill_seconds(ctx) / (LOAD * w)  # wall s per arrival
        sgl = m.get(f"{SGLANG_CACHE_AWARE}/{w}/{ctx}", {}).get("scenarios", {}).get(
            r["scenario"])
        out.append(
            f"- vllm-router's cache_aware loses to round robin on {r['scenario']} at {w} "
            f"workers: P50 {_fmt_span(r['p50'], fmt='.2f')} x round robin, hit rate "
            f"{_fmt_span(r['hit'], pct=True)}"
            + (f" (sglang-router's cache_aware: {_fmt_span(span(sgl, 'cache_hit_rate'), pct=True)})"
               if sgl else "")
            + f". Each routing decision waits {r['hop'] * 1000:.0f} ms for {w} renders of "
            f"{ctx // 1024}K tokens while requests arrive every {gap * 1000:.0f} ms (wall): "
            + ("decisions overlap, the tree does not hold a document yet when its next "
               "questions are routed, affinity is lost. At life size the arrivals would be "
               f"{1 / TIME_SCALE[ctx]:.0f} x sparser; any traffic whose same-prefix requests "
               "come closer together than the fan-out meets the same loss."
               if r["hop"] and r["hop"] > gap else "the fan-out itself outweighs the gain."))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.routing", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=Path("bench-results/routing"))
    p.add_argument("--doc", type=Path, default=Path("docs/benchmarks.md"))
    p.add_argument("--strategies", nargs="+", default=list(MATRIX), choices=MATRIX)
    p.add_argument("--workers", nargs="+", type=int, default=list(WORKERS))
    p.add_argument("--contexts", nargs="+", type=int, default=list(CONTEXTS),
                   choices=list(CONTEXTS))
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--stability", action="store_true", help="run the Done-when check only")
    p.add_argument("--invocations", type=int, default=3)
    p.add_argument("--candidate", default="prefixaware", choices=MATRIX,
                   help="with --stability: the strategy compared with round robin")
    p.add_argument("--render-only", action="store_true", help="rewrite the doc from DIR")
    profile_file_option(p)
    p.add_argument("--real-time", action="store_true", help="the emulated GPUs in real time "
                   "(time-scaled) and the router's hop measured, instead of the virtual clock")
    a = p.parse_args(argv)
    if a.real_time:
        global VIRTUAL
        VIRTUAL = False
        TIME_SCALE.update(REAL_TIME_SCALE)
    if load_profile_option(p, a):
        use_profile_file(a.profile_file)
    a.out.mkdir(parents=True, exist_ok=True)
    if a.stability:
        run_stability(a.out, a.invocations, a.repeats, a.seed, (True, False), a.candidate)
    elif not a.render_only:
        run_matrix(a.out, a.strategies, a.workers, a.contexts, a.repeats, a.seed)
    render_doc(a.doc, a.out)
    print(f"wrote {a.doc}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
