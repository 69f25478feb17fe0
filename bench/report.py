"""Reports of `bench` runs: results.json, a Markdown summary and PNG plots, and the side by side
comparison of two runs (`bench-compare`). Plots use matplotlib's Agg backend (no display)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

Result = dict[str, Any]


def _ms(stats: dict, key: str) -> str:
    return f"{stats[key] * 1000:.1f}" if stats and key in stats else "-"


def _num(value: float | None, fmt: str = ".1f") -> str:
    return "-" if value is None else format(value, fmt)


def span(s: dict, key: str) -> tuple[float, float, float] | None:
    """(median, min, max) of a figure over the repeats: key "ttft_s.p50", "cache_hit_rate"..."""
    head, _, stat = key.partition(".")
    value = (s.get(head) or {}).get(stat) if stat else s.get(head)
    if value is None:
        return None
    lo, hi = (s.get("spread") or {}).get(key, (value, value))
    return value, lo, hi


def _fmt_span(v: tuple[float, float, float] | None, scale: float = 1.0, fmt: str = ".1f",
              pct: bool = False) -> str:
    """"median (min-max)"; just the median when the repeats agree exactly or there is one."""
    if v is None:
        return "-"
    m, lo, hi = v
    f = (lambda x: f"{x:.0%}") if pct else (lambda x: format(x * scale, fmt))
    return f(m) if lo == hi else f"{f(m)} ({f(lo)}-{f(hi)})"


def ratio_span(a: dict, b: dict, key: str) -> tuple[float, float, float] | None:
    """b/a: the ratio of the medians, and the widest ratio the repeats allow
    (min b / max a .. max b / min a)."""
    va, vb = span(a, key), span(b, key)
    if not va or not vb or not va[0] or not va[1]:
        return None
    return vb[0] / va[0], vb[1] / va[2], vb[2] / va[1]


def verdict(a: dict, b: dict, key: str, la: str, lb: str) -> str:
    """Who is lower on `key`, or "no clear difference" when the min-max ranges overlap."""
    va, vb = span(a, key), span(b, key)
    if not va or not vb:
        return "-"
    if vb[2] < va[1]:
        return f"{lb} lower"
    if va[2] < vb[1]:
        return f"{la} lower"
    return "no clear difference"


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
            _fmt_span(span(s, "ttft_s.p50"), 1000), _fmt_span(span(s, "ttft_s.p90"), 1000),
            _fmt_span(span(s, "ttft_s.p99"), 1000), _fmt_span(span(s, "itl_s.p50"), 1000),
            _fmt_span(span(s, "output_tokens_per_s")),
            _fmt_span(span(s, "request_throughput_rps"), fmt=".2f"),
            _fmt_span(span(s, "cache_hit_rate"), pct=True),
            _fmt_span(span(s, "usage_cached_fraction"), pct=True),
            _fmt_span(span(s, "cost_per_1k_output_tokens_usd"), fmt=".4f"),
            _fmt_span(span(s, "cost_per_1k_tokens_usd"), fmt=".5f")])
    body = _table(["scenario", "prompt words", "ok", "TTFT P50 ms", "P90", "P99",
                   "ITL P50 ms", "out tok/s", "req/s", "hit rate (metrics)",
                   "cached (usage)", "$/1K out", "$/1K all"], rows)
    repeats = m.get("repeats", 1)
    notes = ["", f"- every figure: the median of {repeats} repeat(s) of the same request plan "
             f"(seed {m.get('seed', '-')}), min-max of the repeats in brackets; ok counts "
             "all repeats.",
             "- hit rate (metrics): delta of `vllm:prefix_cache_hits_total` over "
             "`vllm:prefix_cache_queries_total` on every worker during the scenario; "
             "cached (usage): `usage.prompt_tokens_details.cached_tokens` over prompt tokens."]
    if cfg.get("hourly_usd"):
        scale = cfg.get("time_scale", 1.0)
        over = ("each scenario's wall time" if scale == 1 else
                f"each scenario's modelled time (wall time / time_scale {scale:g}: an emulated "
                "fleet)")
        notes.append(f"- cost: {cfg['instances']:g} instance(s) x ${cfg['hourly_usd']}/h over "
                     f"{over}; meaningful when the endpoint is saturated.")
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
        row = [name]
        for p in ("p50", "p90"):
            key = f"ttft_s.{p}"
            row += [_fmt_span(span(sa, key), 1000), _fmt_span(span(sb, key), 1000),
                    _fmt_span(ratio_span(sa, sb, key), fmt=".2f"),
                    verdict(sa, sb, key, la, lb)]
        row += [_fmt_span(span(sa, "cache_hit_rate"), pct=True),
                _fmt_span(span(sb, "cache_hit_rate"), pct=True),
                _fmt_span(ratio_span(sa, sb, "output_tokens_per_s"), fmt=".2f"),
                _fmt_span(ratio_span(sa, sb, "cost_per_1k_output_tokens_usd"), fmt=".2f"),
                f"{sa['errors']}/{sb['errors']}"]
        rows.append(row)
    header = ["scenario", f"P50 {la}", f"P50 {lb}", f"{lb}/{la}", "P50 verdict",
              f"P90 {la}", f"P90 {lb}", f"{lb}/{la}", "P90 verdict", f"hits {la}",
              f"hits {lb}", f"tok/s {lb}/{la}", f"$/1K out {lb}/{la}", "errors"]
    ra, rb = a["meta"].get("repeats", 1), b["meta"].get("repeats", 1)
    lines = [f"# {lb} vs {la}", "",
             f"TTFT in ms: the median of the repeats ({la}: {ra}, {lb}: {rb}), min-max in "
             f"brackets. Ratios below 1 mean {lb} is lower; a ratio's range is the widest the "
             f"repeats allow (min {lb} / max {la} .. max {lb} / min {la}). \"no clear "
             "difference\": the two min-max ranges overlap. "
             f"{la}: {a['meta']['url']} ({a['meta']['started']}, seed "
             f"{a['meta'].get('seed', '-')}); {lb}: {b['meta']['url']} ({b['meta']['started']}, "
             f"seed {b['meta'].get('seed', '-')}).", "", _table(header, rows)]
    only = sorted(set(a["scenarios"]) ^ set(b["scenarios"]))
    if only:
        lines += ["", f"In one run only: {', '.join(only)}."]
    if a["meta"].get("seed") != b["meta"].get("seed"):
        lines += ["", "The two runs used different seeds: different request plans."]
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
    ax.set_title(f"TTFT distribution: {r['meta']['label'] or r['meta']['url']} "
                 f"(all {r['meta'].get('repeats', 1)} repeats)")
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _plot_bars(runs: list[Result], path: Path) -> None:
    """Per scenario: TTFT P50 and P90 bars, and the cache hit rate, for one run or several;
    bars at the median of the repeats, whiskers at their min and max."""
    from matplotlib.ticker import FuncFormatter, NullFormatter

    plt = _pyplot()
    names = [n for n in runs[0]["scenarios"] if all(n in r["scenarios"] for r in runs)]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(max(8, 1.3 * len(names) + 3), 7),
                                      sharex=True)
    series = [(i, r["meta"]["label"] or f"run {i + 1}", r, p) for i, r in enumerate(runs)
              for p in ("p50", "p90")]
    width = 0.8 / len(series)
    for k, (i, label, r, p) in enumerate(series):
        spans = [span(r["scenarios"][n], f"ttft_s.{p}") or (0, 0, 0) for n in names]
        ys = [v[0] * 1000 for v in spans]
        err = [[(v[0] - v[1]) * 1000 for v in spans], [(v[2] - v[0]) * 1000 for v in spans]]
        top.bar([x + k * width for x in range(len(names))], ys, width, color=f"C{i}",
                alpha=1.0 if p == "p50" else 0.5, label=f"{label} TTFT {p.upper()}",
                yerr=err, capsize=2, ecolor="black")
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
        spans = [span(r["scenarios"][n], "cache_hit_rate") or (0, 0, 0) for n in names]
        bottom.bar([i + k * hw for i in range(len(names))], [v[0] for v in spans], hw,
                   color=f"C{k}", label=r["meta"]["label"] or f"run {k + 1}",
                   yerr=[[v[0] - v[1] for v in spans], [v[2] - v[0] for v in spans]],
                   capsize=2, ecolor="black")
    bottom.set_ylabel("prefix cache hit rate")
    bottom.set_ylim(0, 1)
    if names:
        bottom.legend(fontsize="small")
    bottom.grid(True, axis="y", alpha=0.3)
    bottom.set_xticks([i + 0.4 - hw / 2 for i in range(len(names))], names, rotation=20)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
