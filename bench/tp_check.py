"""Tensor-parallel replicas held against published absolute figures (bench/data/published_tp.json).

Why: the step model was fitted on one H100 (TP 1); a TP 4 or TP 8 replica adds all-reduces and
runs every layer's kernels on every GPU, which only a multi-GPU figure can check. The figures
are vLLM's own `vllm bench latency` runs (32 tokens in, 128 out, batch 8): one prefill step of
the batch, then a decode step per further token, replayed on `GpuProfile.step_seconds`.

A build page does not say which vLLM it ran, and older releases spent host time per step
(scheduling, input preparation, output processing) that 0.24 overlaps with the GPU (async
scheduling, vllm/v1/engine/core.py step_with_batch_queue; our H100 decode steps need no fixed
per-step term). So each build's TP 1 run fixes that build's host time per step; its TP 4 run,
held out, is then predicted with nothing fitted to it.
"""
from __future__ import annotations

import functools
import json
from dataclasses import replace
from pathlib import Path

from bench.emulator import MODELS, PROFILES, GpuProfile

DATA = Path(__file__).parent / "data" / "published_tp.json"
TOLERANCE = 0.15     # the bar: a TP 4 and a TP 8 replica within 15% of published figures


@functools.lru_cache(maxsize=1)
def published() -> dict:
    return json.loads(DATA.read_text())


def replica(gpu: str, tp: int, model: str, host_ms: float = 0.0) -> GpuProfile:
    """`gpu` x `tp` serving `model` with the calibrated H100 efficiencies and per-layer costs,
    the GPU's own bandwidth, FLOPS and interconnect, and `host_ms` per step of host time."""
    spec = {k: v for k, v in published()["gpus"][gpu].items() if k != "source"}
    return replace(PROFILES["p5.48xlarge"], name=f"{gpu}x{tp}", gpu=gpu, gpus=tp,
                   model=MODELS[model], step_overhead_ms=host_ms, **spec)


def latency(gpu: GpuProfile, test: dict) -> float:
    """`vllm bench latency`: the batch's prompts prefilled in one step (its first token),
    then one decode step per further token (seconds)."""
    n, b = test["input_tokens"], test["batch"]
    t = gpu.step_seconds((), [(0, n)] * b)
    for k in range(test["output_tokens"] - 1):
        t += gpu.step_seconds([n + 1 + k] * b, ())
    return t


def host_ms(build: dict) -> float:
    """The host time per step that makes the build's TP 1 run come out as published (>= 0):
    fitted on `fit` only, never on `held_out`."""
    test = published()["latency_test"]
    fit = build["fit"]
    ours = latency(replica(build["gpu"], fit["tp"], fit["model"]), test) * 1e3
    return max(0.0, (fit["mean_latency_ms"] - ours) / test["output_tokens"])


def rows() -> list[dict]:
    """Per build: the TP 1 run (ours without host time, and the host time it implies) and the
    held-out TP 4 run (published, ours with that host time, ratio)."""
    test = published()["latency_test"]
    out = []
    for b in published()["builds"]:
        fit, held = b["fit"], b["held_out"]
        h = host_ms(b)
        ours_fit = latency(replica(b["gpu"], fit["tp"], fit["model"]), test) * 1e3
        ours = latency(replica(b["gpu"], held["tp"], held["model"], h), test) * 1e3
        bare = latency(replica(b["gpu"], held["tp"], held["model"]), test) * 1e3
        out.append({"build": b["build"], "source": b["source"], "gpu": b["gpu"],
                    "fit": fit, "ours_fit_ms": ours_fit, "host_ms": h, "held_out": held,
                    "ours_ms": ours, "ours_no_host_ms": bare,
                    "ratio": ours / held["mean_latency_ms"],
                    "ok": abs(ours / held["mean_latency_ms"] - 1) <= TOLERANCE})
    return out


def render() -> list[str]:
    """The rows for docs/benchmarks.md ('Held against real hardware')."""
    data = published()
    t = data["latency_test"]
    lines = ["", f"Tensor-parallel replicas against vLLM's own published latency runs "
             f"(`vllm bench latency`, {t['input_tokens']} in / {t['output_tokens']} out, batch "
             f"{t['batch']}, bench/data/published_tp.json; `bench.tp_check`). Each build's "
             "TP 1 run (Llama-3-8B) fixes the host time per step of its unstated vLLM release; "
             "its TP 4 run (Llama-3-70B) is held out: nothing is fitted to it. Latency in ms:",
             "", "| build (GPU) | TP 1 published / ours without host time | host ms per step "
             "| TP 4 published (held out) | ours | ours / published | ours without host time |",
             "|---|---|---|---|---|---|---|"]
    for r in rows():
        lines.append(f"| {r['build']} ({r['gpu']}) | {r['fit']['mean_latency_ms']:,.1f} / "
                     f"{r['ours_fit_ms']:,.1f} | {r['host_ms']:.2f} | "
                     f"{r['held_out']['mean_latency_ms']:,.1f} | {r['ours_ms']:,.1f} | "
                     f"{r['ratio']:.2f}{'' if r['ok'] else ' (NOT within 15%)'} | "
                     f"{r['ours_no_host_ms']:,.1f} "
                     f"({r['ours_no_host_ms'] / r['held_out']['mean_latency_ms']:.2f}) |")
    lines += ["", f"TP 8: not held. {data['tp8']}"]
    return lines
