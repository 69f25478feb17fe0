"""Reports of `bench` runs: results.json, a Markdown summary and PNG plots, and the side by side
comparison of two runs (`bench-compare`). Plots use matplotlib's Agg backend (no display)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

Result = dict[str, Any]


def _ms(stats: dict, key: str) -> str:
    return f"{stats[key] * 1000:.1f}" if stats and key in stats else "-"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.0%}"


def _num(value: float | None, fmt: str = ".1f") -> str:
    return "-" if value is None else format(value, fmt)


def _ratio(b: float | None, a: float | None) -> str:
    return "-" if not a or b is None else f"{b / a:.2f}"


def _table(header: Sequence[str], rows: list[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


# --------------------------------------------------------------------------- one run


def summary_markdown(r: Result) -> str:
    m, cfg = r["meta"], r["meta"]["config"]
    head = [f"# Benchmark: {m['label'] or m['url']}", "",
            f"{m['url']}, model `{m['model']}`, started {m['started']}, concurrency "
            f"{cfg['concurrency']}, {cfg['max_tokens']} output tokens per request"
            f"{' (ignore_eos)' if cfg['ignore_eos'] else ''}, prompt salt `{m['salt']}`.", ""]
    rows = []
    for name, s in r["scenarios"].items():
        rows.append([
            name, str(s["prompt_words"]), f"{s['ok']}/{s['requests']}",
            _ms(s["ttft_s"], "p50"), _ms(s["ttft_s"], "p90"), _ms(s["ttft_s"], "p95"),
            _ms(s["ttft_s"], "p99"), _ms(s["itl_s"], "p50"),
            _num(s["output_tokens_per_s"]), _num(s["request_throughput_rps"], ".2f"),
            _pct(s["cache_hit_rate"]), _pct(s["usage_cached_fraction"]),
            _num(s["cost_per_1k_output_tokens_usd"], ".4f"),
            _num(s["cost_per_1k_tokens_usd"], ".5f")])
    body = _table(["scenario", "prompt words", "ok", "TTFT P50 ms", "P90", "P95", "P99",
                   "ITL P50 ms", "out tok/s", "req/s", "hit rate (metrics)",
                   "cached (usage)", "$/1K out", "$/1K all"], rows)
    notes = ["", "- hit rate (metrics): delta of `vllm:prefix_cache_hits_total` over "
             "`vllm:prefix_cache_queries_total` on every worker during the scenario; "
             "cached (usage): `usage.prompt_tokens_details.cached_tokens` over prompt tokens."]
    if cfg.get("hourly_usd"):
        notes.append(f"- cost: {cfg['instances']:g} instance(s) x ${cfg['hourly_usd']}/h over "
                     "each scenario's wall time; meaningful when the endpoint is saturated.")
    for name, s in r["scenarios"].items():
        if s["errors"]:
            kinds = "; ".join(f"{n} x {k}" for k, n in s["error_kinds"].items())
            notes.append(f"- {name}: {s['errors']} errors ({kinds})")
        if s.get("metrics_unreachable"):
            notes.append(f"- {name}: metrics unreachable: {', '.join(s['metrics_unreachable'])}")
        if s.get("skipped_after_time_limit"):
            notes.append(f"- {name}: {s['skipped_after_time_limit']} requests not sent "
                         "(time limit)")
        if s.get("workers"):
            notes.append(f"- {name}: requests per worker {s['workers']}")
    notes += [f"- {n}" for n in m.get("notes", [])]
    o = r.get("router_overhead")
    if o:
        notes += ["", "## Router hop", "", _table(
            ["path", "TTFT P50 ms", "TTFT P90 ms", "e2e P50 ms"],
            [[name, _ms(o[name]["ttft_s"], "p50"), _ms(o[name]["ttft_s"], "p90"),
              _ms(o[name]["e2e_s"], "p50")] for name in ("direct", "endpoint")]),
            "", f"Added by the endpoint (median, {o['requests_each']} requests each way, "
                f"{o['prompt_words']}-word warm prompt): TTFT "
                f"{_num((o['added_ttft_s_p50'] or 0) * 1000, '.2f')} ms, end to end "
                f"{_num((o['added_e2e_s_p50'] or 0) * 1000, '.2f')} ms."]
    return "\n".join(head) + "\n" + body + "\n" + "\n".join(notes) + "\n"


def write_run(r: Result, out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "results.json", out / "summary.md", out / "ttft.png", out / "scenarios.png"]
    paths[0].write_text(json.dumps(r, indent=1))
    paths[1].write_text(summary_markdown(r))
    _plot_distribution(r, paths[2])
    _plot_bars([r], paths[3])
    return paths


# --------------------------------------------------------------------------- two runs


def compare_markdown(a: Result, b: Result) -> str:
    la, lb = a["meta"]["label"] or "A", b["meta"]["label"] or "B"
    rows = []
    for name in _common(a, b):
        sa, sb = a["scenarios"][name], b["scenarios"][name]
        rows.append([
            name,
            _ms(sa["ttft_s"], "p50"), _ms(sb["ttft_s"], "p50"),
            _ratio(sb["ttft_s"].get("p50"), sa["ttft_s"].get("p50")),
            _ms(sa["ttft_s"], "p90"), _ms(sb["ttft_s"], "p90"),
            _ratio(sb["ttft_s"].get("p90"), sa["ttft_s"].get("p90")),
            _pct(sa["cache_hit_rate"]), _pct(sb["cache_hit_rate"]),
            _num(sa["output_tokens_per_s"]), _num(sb["output_tokens_per_s"]),
            _num(sa["cost_per_1k_output_tokens_usd"], ".4f"),
            _num(sb["cost_per_1k_output_tokens_usd"], ".4f"),
            f"{sa['errors']}/{sb['errors']}"])
    header = ["scenario", f"P50 {la}", f"P50 {lb}", f"{lb}/{la}", f"P90 {la}", f"P90 {lb}",
              f"{lb}/{la}", f"hits {la}", f"hits {lb}", f"tok/s {la}", f"tok/s {lb}",
              f"$/1K out {la}", f"$/1K out {lb}", "errors"]
    lines = [f"# {lb} vs {la}", "", f"TTFT in ms; ratios below 1 mean {lb} is faster. "
             f"{la}: {a['meta']['url']} ({a['meta']['started']}); {lb}: {b['meta']['url']} "
             f"({b['meta']['started']}).", "", _table(header, rows)]
    only = sorted(set(a["scenarios"]) ^ set(b["scenarios"]))
    if only:
        lines += ["", f"In one run only: {', '.join(only)}."]
    return "\n".join(lines) + "\n"


def write_compare(a: Result, b: Result, out: Path) -> tuple[str, list[Path]]:
    out.mkdir(parents=True, exist_ok=True)
    md = compare_markdown(a, b)
    paths = [out / "compare.md", out / "compare.png"]
    paths[0].write_text(md)
    _plot_bars([a, b], paths[1])
    return md, paths


def _common(a: Result, b: Result) -> list[str]:
    return [n for n in a["scenarios"] if n in b["scenarios"]]


# --------------------------------------------------------------------------- plots


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _plot_distribution(r: Result, path: Path) -> None:
    """Empirical CDF of TTFT per scenario (log time axis)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for name, s in r["scenarios"].items():
        xs = sorted(x * 1000 for x in s.get("ttft_samples_s", []))
        if xs:
            ax.step(xs, [(i + 1) / len(xs) for i in range(len(xs))], where="post", label=name)
    if ax.lines:
        ax.set_xscale("log")
        ax.legend(fontsize="small")
    ax.set_xlabel("time to first token (ms)")
    ax.set_ylabel("fraction of requests")
    ax.set_title(f"TTFT distribution: {r['meta']['label'] or r['meta']['url']}")
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _plot_bars(runs: list[Result], path: Path) -> None:
    """Per scenario: TTFT P50 and P90 bars, and the cache hit rate, for one run or several."""
    from matplotlib.ticker import FuncFormatter, NullFormatter

    plt = _pyplot()
    names = [n for n in runs[0]["scenarios"] if all(n in r["scenarios"] for r in runs)]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(max(8, 1.3 * len(names) + 3), 7),
                                      sharex=True)
    series = [(i, r["meta"]["label"] or f"run {i + 1}", r, p) for i, r in enumerate(runs)
              for p in ("p50", "p90")]
    width = 0.8 / len(series)
    for k, (i, label, r, p) in enumerate(series):
        ys = [r["scenarios"][n]["ttft_s"].get(p, 0) * 1000 for n in names]
        top.bar([x + k * width for x in range(len(names))], ys, width, color=f"C{i}",
                alpha=1.0 if p == "p50" else 0.5, label=f"{label} TTFT {p.upper()}")
    top.set_ylabel("TTFT (ms)")
    if any(h.get_height() > 0 for h in top.patches):
        top.set_yscale("log")
        top.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        top.yaxis.set_minor_formatter(NullFormatter())
    if names:
        top.legend(fontsize="small")
    top.grid(True, axis="y", alpha=0.3)
    hw = 0.8 / len(runs)
    for k, r in enumerate(runs):
        ys = [r["scenarios"][n]["cache_hit_rate"] or 0 for n in names]
        bottom.bar([i + k * hw for i in range(len(names))], ys, hw, color=f"C{k}",
                   label=r["meta"]["label"] or f"run {k + 1}")
    bottom.set_ylabel("prefix cache hit rate")
    bottom.set_ylim(0, 1)
    if names:
        bottom.legend(fontsize="small")
    bottom.grid(True, axis="y", alpha=0.3)
    bottom.set_xticks([i + 0.4 - hw / 2 for i in range(len(names))], names, rotation=20)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
