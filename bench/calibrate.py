"""Measure an OpenAI-compatible vLLM endpoint and write an emulator profile from it.

    python -m tools calibrate --url http://WORKER:8000 --base-profile g5.24xlarge \\
        --out profiles/my-g5.json
    make bench-routing PROFILE_FILE=profiles/my-g5.json

Why: the emulator's figures are only as good as the GPU they were held against. Users measure
their own deployment (one worker, not the router: the router spreads requests) before they buy
more GPUs, then run the routing and tier benchmarks on their own numbers.

What it measures (as ../shared/gpu/bench_vllm.py did on the H100): prompts of random token ids
sent to /v1/completions (no tokenizer in the figures), streamed:
- cold TTFT at each length (a fresh prompt, one output token);
- prefix-hit TTFT: the last cold prompt's first N-256 tokens and 256 new ones;
- the decode step: B requests of 2K tokens decoding together (B = 1, 8, 32), the median gap
  between tokens while all B stream;
- KV capacity and utilization from /metrics (`vllm:cache_config_info`).

What it fits, on the base profile's GPU and model shape (peak FLOPS and bandwidth, layers...):
memory bandwidth efficiency from the decode steps (least squares); then the front end (fixed
+ per prompt token) and the prefill efficiency of the linear layers and of attention from the
cold and hit TTFTs together (least squares over the same step model the emulator runs, steps
that are memory-bound taken as such); the activation reserve from the KV capacity.
"""
from __future__ import annotations

import argparse
import http.client
import json
import random
import statistics
import threading
import time
import urllib.parse
from dataclasses import replace
from pathlib import Path
from typing import Any, Protocol, Sequence

from bench.emulator import GIB, GpuProfile, PROFILES, profile

DEFAULT_LENGTHS = (2048, 8192, 32768)
BATCHES = (1, 8, 32)
DECODE_CONTEXT = 2048
DECODE_TOKENS = 64


class Probe(Protocol):
    """Something that answers requests of token ids and times them."""

    def ttft(self, prompt: list[int]) -> tuple[float, int]:
        """Seconds to the first token and the cached tokens the server reports."""

    def decode_step(self, prompts: list[list[int]], tokens: int) -> float:
        """Median seconds between tokens while all `prompts` decode together."""

    def cache_config(self) -> dict[str, str]:
        """The labels of `vllm:cache_config_info`."""


class HttpProbe:
    """A real endpoint over HTTP (wall clock)."""

    def __init__(self, url: str, model: str | None = None, metrics_url: str | None = None,
                 timeout_s: float = 600.0) -> None:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"--url {url!r}: an http:// or https:// base URL")
        self.parts, self.timeout_s = parts, timeout_s
        self.base = parts.path.rstrip("/")
        self.metrics_url = metrics_url or f"{parts.scheme}://{parts.netloc}/metrics"
        self.model = model or self._model()

    def _conn(self) -> http.client.HTTPConnection:
        cls = http.client.HTTPSConnection if self.parts.scheme == "https" else \
            http.client.HTTPConnection
        return cls(self.parts.hostname, self.parts.port, timeout=self.timeout_s)

    def _model(self) -> str:
        conn = self._conn()
        try:
            conn.request("GET", self.base + "/v1/models")
            data = json.loads(conn.getresponse().read())
            return data["data"][0]["id"]
        finally:
            conn.close()

    def _stream(self, prompt: list[int], max_tokens: int) -> tuple[list[float], int, float]:
        body = {"model": self.model, "prompt": prompt, "max_tokens": max_tokens,
                "stream": True, "temperature": 0.0, "ignore_eos": True,
                "stream_options": {"include_usage": True}}
        conn = self._conn()
        times: list[float] = []
        cached = 0
        t0 = time.perf_counter()
        try:
            conn.request("POST", self.base + "/v1/completions", body=json.dumps(body).encode(),
                         headers={"Content-Type": "application/json"})
            resp = conn.getresponse()
            if resp.status != 200:
                raise RuntimeError(f"HTTP {resp.status}: {resp.read(300)!r}")
            for raw in resp:
                line = raw.strip()
                if not line.startswith(b"data: "):
                    continue
                if line[6:] == b"[DONE]":
                    break
                obj = json.loads(line[6:])
                usage = obj.get("usage")
                if usage:
                    cached = (usage.get("prompt_tokens_details") or {}).get(
                        "cached_tokens") or 0
                if any(c.get("text") for c in obj.get("choices") or []):
                    times.append(time.perf_counter())
        finally:
            conn.close()
        return times, cached, t0

    def ttft(self, prompt: list[int]) -> tuple[float, int]:
        times, cached, t0 = self._stream(prompt, 1)
        return times[0] - t0, cached

    def decode_step(self, prompts: list[list[int]], tokens: int) -> float:
        results: list[list[float]] = [[] for _ in prompts]

        def go(i: int) -> None:
            results[i] = self._stream(prompts[i], tokens)[0]
        threads = [threading.Thread(target=go, args=(i,)) for i in range(len(prompts))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        start = max(r[0] for r in results)      # everyone decoding
        end = min(r[-1] for r in results)
        gaps = [b - a for r in results for a, b in zip(r, r[1:]) if a >= start and b <= end]
        return statistics.median(gaps) if gaps else 0.0

    def cache_config(self) -> dict[str, str]:
        from urllib.request import ProxyHandler, build_opener

        with build_opener(ProxyHandler({})).open(self.metrics_url, timeout=30) as resp:
            text = resp.read().decode(errors="replace")
        return cache_config_labels(text)


def cache_config_labels(metrics_text: str) -> dict[str, str]:
    import re

    for line in metrics_text.splitlines():
        if line.startswith("vllm:cache_config_info{"):
            return dict(re.findall(r'(\w+)="([^"]*)"', line.split("}", 1)[0]))
    raise ValueError("no vllm:cache_config_info in the metrics")


class EmulatedProbe:
    """The emulated worker itself, on the virtual clock (`bench.vtime`): what `calibrate`
    measures there is the emulator's own timing, so a fit must give its parameters back."""

    def __init__(self, gpu: GpuProfile) -> None:
        from bench.fake_worker import KvCache

        self.gpu = gpu
        self.cache = KvCache(16, gpu.kv_tokens // 16)

    def _run(self, prompts: list[list[int]], tokens: int) -> list:
        from bench.tiers import no_tiers
        from bench.vtime import Req, SharedGpu, Sim, VirtualWorker

        sim = Sim()
        w = VirtualWorker(sim, 0, "w0", self.gpu, self.cache, no_tiers(), None, SharedGpu(sim),
                          chat_render=False)
        reqs = []
        for i, p in enumerate(prompts):
            r = Req(i, "calibrate", "s", 0, [], list(p), tokens)
            r.on_done = lambda r: None
            reqs.append(r)
            w.submit(r)
        sim.run()
        return reqs

    def ttft(self, prompt: list[int]) -> tuple[float, int]:
        r = self._run([prompt], 1)[0]
        return r.t_first - r.t_send, r.cached

    def decode_step(self, prompts: list[list[int]], tokens: int) -> float:
        reqs = self._run(prompts, tokens)
        start = max(r.token_times[0] for r in reqs)
        end = min(r.token_times[-1] for r in reqs)
        gaps = [b - a for r in reqs for a, b in zip(r.token_times, r.token_times[1:])
                if a >= start and b <= end]
        return statistics.median(gaps)

    def cache_config(self) -> dict[str, str]:
        return {"block_size": "16", "num_gpu_blocks": str(self.cache.capacity_blocks),
                "gpu_memory_utilization": str(self.gpu.gpu_memory_utilization)}


def measure(probe: Probe, lengths: Sequence[int] = DEFAULT_LENGTHS, reps: int = 3,
            seed: int = 7, log: Any = None) -> dict:
    """Cold and hit TTFT per length (medians), decode steps, the cache config."""
    rng = random.Random(seed)

    def ids(n: int) -> list[int]:
        return [rng.randrange(0, 30000) for _ in range(n)]

    out: dict[str, Any] = {"ttft": {}, "decode": {}}
    for n in lengths:
        cold, hit = [], []
        last: list[int] = []
        for _ in range(reps):
            last = ids(n)
            cold.append(probe.ttft(last)[0])
        for _ in range(reps):
            t, cached = probe.ttft(last[:n - 256] + ids(256))
            hit.append((t, cached))
        out["ttft"][str(n)] = {"cold_s": statistics.median(cold),
                               "hit256_s": statistics.median(t for t, _ in hit),
                               "hit_cached_tokens": statistics.median(c for _, c in hit)}
        if log:
            log(f"{n} tokens: cold {out['ttft'][str(n)]['cold_s'] * 1e3:.1f} ms, hit "
                f"{out['ttft'][str(n)]['hit256_s'] * 1e3:.1f} ms")
    for b in BATCHES:
        out["decode"][str(b)] = probe.decode_step([ids(DECODE_CONTEXT) for _ in range(b)],
                                                  DECODE_TOKENS)
        if log:
            log(f"decode batch {b}: {out['decode'][str(b)] * 1e3:.2f} ms/step")
    out["cache_config"] = probe.cache_config()
    return out


def _solve(a: list[list[float]], b: list[float]) -> list[float]:
    """Least squares by the normal equations (a small, well-conditioned system)."""
    n = len(a[0])
    m = [[sum(r[i] * r[j] for r in a) for j in range(n)] + [sum(r[i] * y for r, y in zip(a, b))]
         for i in range(n)]
    for col in range(n):
        piv = max(range(col, n), key=lambda r: abs(m[r][col]))
        m[col], m[piv] = m[piv], m[col]
        for r in range(n):
            if r != col and m[col][col]:
                f = m[r][col] / m[col][col]
                m[r] = [x - f * y for x, y in zip(m[r], m[col])]
    return [m[i][n] / m[i][i] for i in range(n)]


def fit(base: GpuProfile, meas: dict, name: str) -> GpuProfile:
    """The profile that reproduces `meas` best on `base`'s GPU and model."""
    m, g = base.model, base
    # decode: step = (weights + KV read) / (bandwidth x efficiency)
    rows, ys = [], []
    for b, step in meas["decode"].items():
        traffic = m.weight_bytes + m.kv_bytes_per_token * int(b) * DECODE_CONTEXT
        rows.append([traffic / (g.gpus * g.bandwidth_gbs * 1e9)])
        ys.append(step)
    inv_bw = _solve(rows, ys)[0]
    gpu = replace(base, name=name, bandwidth_efficiency=1 / inv_bw, step_overhead_ms=0.0)
    # prefill: TTFT = a + b N + memory-bound steps + linear/peak x (1/mfu) + attention/peak x
    # (1/attention_efficiency), iterated until the memory/compute split is stable
    peak = g.gpus * g.tflops * 1e12
    points = [(int(n), 0, v["cold_s"]) for n, v in meas["ttft"].items()] + \
        [(int(n), int(v["hit_cached_tokens"]), v["hit256_s"]) for n, v in meas["ttft"].items()]
    for _ in range(5):
        rows, ys = [], []
        for n, cached, t in points:
            lin = att = fixed = 0.0
            done = min(cached, n - 1)
            while done < n:
                k = min(gpu.max_num_batched_tokens, n - done)
                compute = 2 * m.params_b * 1e9 * k / gpu.flops_per_s + \
                    gpu.attention_flops(done, k) / gpu.attention_flops_per_s
                memory = (m.weight_bytes + m.kv_bytes_per_token * (done + k)) / gpu.bytes_per_s
                if memory > compute:
                    fixed += memory
                else:
                    lin += 2 * m.params_b * 1e9 * k / peak
                    att += gpu.attention_flops(done, k) / peak
                done += k
            rows.append([1 / t, n / t, lin / t, att / t])   # relative errors weigh equally
            ys.append((t - fixed) / t)
        a, b, x_lin, x_att = _solve(rows, ys)
        gpu = replace(gpu, frontend_fixed_ms=a * 1e3, frontend_us_per_token=b * 1e6,
                      mfu=1 / x_lin if x_lin > 0 else gpu.mfu,
                      attention_efficiency=1 / x_att if x_att > 0 else
                      gpu.attention_efficiency)
    # KV capacity: the activation reserve that gives vLLM's figure at its utilization
    cc = meas["cache_config"]
    tokens = int(cc.get("kv_cache_size_tokens") or
                 int(cc["num_gpu_blocks"]) * int(cc["block_size"]))
    util = float(cc.get("gpu_memory_utilization") or gpu.gpu_memory_utilization)
    usable = g.gpus * g.gpu_memory_gib * GIB * util
    reserve = (usable - m.weight_bytes - tokens * m.kv_bytes_per_token) / g.gpus / 1e9
    return replace(gpu, gpu_memory_utilization=util, activation_reserve_gb=reserve)


def residuals(gpu: GpuProfile, meas: dict) -> dict:
    out = {}
    for n, v in meas["ttft"].items():
        n_ = int(n)
        out[f"cold_{n}"] = gpu.prefill_seconds(n_) / v["cold_s"] - 1
        out[f"hit_{n}"] = gpu.prefill_seconds(n_, int(v["hit_cached_tokens"])) / \
            v["hit256_s"] - 1
    for b, step in meas["decode"].items():
        out[f"decode_{b}"] = gpu.decode_seconds(DECODE_CONTEXT, int(b)) / step - 1
    return {k: round(v, 4) for k, v in out.items()}


def calibrate(probe: Probe, base: GpuProfile, name: str, *, lengths: Sequence[int],
              reps: int, log: Any = None) -> tuple[GpuProfile, dict]:
    meas = measure(probe, lengths, reps, log=log)
    gpu = fit(base, meas, name)
    return gpu, {"measured": meas, "residuals": residuals(gpu, meas), "base_profile": base.name}


# --------------------------------------------------------------------------- command


def register(sub: argparse._SubParsersAction) -> None:
    from config.arguments import add_command, base_url, http_url

    p = add_command(sub, "calibrate", main, "measure a vLLM endpoint and write an emulator "
                    "profile (for bench-routing --profile-file)", __doc__, env=False,
                    formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--url", required=True, type=base_url,
                   help="one worker's base URL (not the router's)")
    p.add_argument("--model", help="served model name (default: the first of /v1/models)")
    p.add_argument("--metrics-url", type=http_url, help="its /metrics (default: URL/metrics)")
    p.add_argument("--base-profile", default="h100-8b", choices=list(PROFILES),
                   help="the GPU and model shape measured (peak FLOPS, bandwidth, layers)")
    p.add_argument("--name", help="the profile's name (default: <base>-calibrated)")
    p.add_argument("--lengths", default=",".join(map(str, DEFAULT_LENGTHS)),
                   help="prompt lengths, comma-separated")
    p.add_argument("--reps", type=int, default=3, help="measurements per figure (median)")
    p.add_argument("--out", type=Path, default=Path("calibrated-profile.json"))


def main(args: argparse.Namespace) -> int:
    from config.arguments import ToolError, check_output_dir, err_console, out_console

    try:
        lengths = tuple(int(x) for x in args.lengths.split(","))
    except ValueError:
        raise ToolError.bad_input("--lengths", args.lengths, "comma-separated token counts")
    if not lengths or any(not 512 <= n <= 1_000_000 for n in lengths):
        raise ToolError.bad_input("--lengths", args.lengths, "token counts from 512 to 1000000")
    if not 1 <= args.reps <= 100:
        raise ToolError.bad_input("--reps", args.reps, "1 to 100")
    if args.out.is_dir():
        raise ToolError.bad_input("--out", str(args.out), "a file to write the profile to")
    check_output_dir("--out", args.out.parent)   # before measuring, not after
    try:
        probe = HttpProbe(args.url, args.model, args.metrics_url)
    except ValueError as exc:
        raise ToolError.bad_input("--url", args.url, str(exc).split(": ", 1)[-1]) from None
    except (OSError, KeyError, IndexError) as exc:
        raise ToolError(f"{args.url}/v1/models did not answer: {exc}") from None
    base = profile(args.base_profile)
    name = args.name or f"{base.name}-calibrated"
    try:
        gpu, report = calibrate(probe, base, name, lengths=lengths, reps=args.reps,
                                log=lambda s: err_console.print(s))
    except (OSError, RuntimeError, ValueError, http.client.HTTPException) as exc:
        raise ToolError(f"calibrate: {exc}") from None
    data = gpu.to_json() | {"about": f"measured from {args.url} by python -m tools calibrate "
                                     f"on {time.strftime('%Y-%m-%d')}", "calibration": report}
    args.out.write_text(json.dumps(data, indent=1))
    out_console.print(json.dumps(gpu.describe(), indent=1))
    err_console.print(f"wrote {args.out} (use: make bench-routing PROFILE_FILE={args.out})")
    return 0
