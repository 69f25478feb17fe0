"""docs/benchmarks.md from saved figures: tables, the emulator's profile and sources, and the
statements computed from the numbers (no runs here: synthetic figures)."""
from __future__ import annotations

import json

from bench.routing import CONTEXTS, MATRIX, VLLM_CACHE_AWARE, render_doc
from bench.emulator import PROFILES, SOURCES


def _cell(strategy, w, ctx, p50, hop):
    name = "document-8k" if ctx == 8192 else f"document-{ctx // 1024}k"
    s = {"ttft_s": {"p50": p50, "p90": 2 * p50}, "cache_hit_rate": 0.7, "errors": 0,
         "output_tokens_per_s": 10.0, "cost_per_1k_output_tokens_usd": 0.1, "requests": 60,
         "spread": {"ttft_s.p50": [0.9 * p50, 1.1 * p50]}, "repeats": 3}
    return {"meta": {"label": strategy, "seed": 1, "repeats": 3, "started": "t",
                     "loopback": {"workers": w, "strategy": strategy}},
            "router_overhead": {"added_ttft_s_p50": hop}, "scenarios": {name: s}}


def test_the_doc_holds_the_table_the_profiles_and_what_the_numbers_say(tmp_path):
    m = {}
    for ctx in CONTEXTS:
        for w in (4, 16):
            for strategy in MATRIX:
                p50 = 1.0 if strategy == "roundrobin" else 0.1
                hop = 0.5 if (strategy == VLLM_CACHE_AWARE and ctx == 2048) else 0.001
                m[f"{strategy}/{w}/{ctx}"] = _cell(strategy, w, ctx, p50, hop)
    m[f"{VLLM_CACHE_AWARE}/16/65536"] = _cell(VLLM_CACHE_AWARE, 16, 65536, 2.0, 0.5)
    st = {f"{h}/{i}": {"roundrobin": _cell("roundrobin", 4, 8192, 1.0, 0),
                       "prefixaware": _cell("prefixaware", 4, 8192, 0.1 + i / 100, 0)}
          for h in ("header", "noheader") for i in range(3)}
    (tmp_path / "matrix.json").write_text(json.dumps(m))
    (tmp_path / "stability.json").write_text(json.dumps(st))
    doc = tmp_path / "docs" / "benchmarks.md"
    render_doc(doc, tmp_path)
    text = doc.read_text()
    rows = [line for line in text.splitlines() if line.startswith("| 16 | ")]
    assert max(len(x) for x in text.splitlines() if " " in x and not x.startswith(("|", "#"))) \
        <= 100   # prose wrapped (bench.routing.wrap_prose)
    text = " ".join(text.split())   # a statement may run over a line break
    assert all(f"| {p} |" in text for p in PROFILES) and all(s in text for s in SOURCES)
    assert len(rows) == len(CONTEXTS) * len(MATRIX) + len(CONTEXTS)  # + fan-out rows
    assert "| 4 | prefixaware | 100.0 (90.0-110.0) |" in text and "(virtual, life size)" in text
    assert "0.10 (0.08-0.12)" in text  # ratio of medians, widest range of the repeats
    # a 500 ms fan-out at 2K is more than a hit saves on p5: said, with the numbers
    assert "LOSES at any hit rate" in text and "costs more than a hit saves: 4, 2K" in text
    assert "the ranges overlap (0.098-0.122 is in all) and stay below 1" in text
    assert "vllm-router's cache_aware loses to round robin on document-64k at 16 workers" in text
    assert (doc.parent / "benchmarks" / "ttft-p50-ratio.png").stat().st_size > 0
