"""Measure an OpenAI-compatible vLLM endpoint and write an emulator profile from it.

    python -m tools calibrate --url http://WORKER:8000 --base-profile g5.24xlarge \\
        --out profiles/my-g5.json
    make bench-routing PROFILE_FILE=profiles/my-g5.json

Why: the emulator's figures are only as good as the GPU they were held against. Users measure
their own deployment (one worker, not the router: the router spreads requests) before they buy
more GPUs, then run the routing and tier benchmarks on their own numbers.

What it measures (as our H100 run did, bench/data/h100_vllm_0_24.json): prompts of random token ids
sent to /v1/completions (no tokenizer in the figures), streamed:
- cold TTFT at each length (a fresh prompt, one output token), 2K to 64K or the endpoint's
  `max_model_len` (from /v1/models), whichever is smaller: the longest prompt the profile
  predicts is one it measured, not an extrapolation;
- prefix-hit TTFT: the last cold prompt's first N-256 tokens and 256 new ones;
- the decode step: B requests of 2K tokens decoding together (B = 1, 8, 32), the median gap
  between tokens while all B stream;
- KV capacity and utilization from /metrics (`vllm:cache_config_info`).

What it fits, on the base profile's GPU and model shape (peak FLOPS and bandwidth, layers,
interconnect): the prefill efficiency of the linear layers and of attention, the decode's
memory bandwidth efficiency and the front end (fixed + per prompt token), all at once, by a
bounded least-squares fit (scipy's `least_squares`) of the emulator's own step model to every
measured point, relative errors weighed equally; every efficiency in (0, 1], the front end
>= 0: a fit outside physics is not a fit. The activation reserve follows from the KV capacity
(>= 0). Every point's residual is printed; if one is over 10% the endpoint does not behave like
the base profile's GPU and model (a wrong `--base-profile`, or an endpoint that is not what
it says), and no profile is written (exit 1). A stream that fails is tried again (3 times),
then named.
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

DEFAULT_LENGTHS = (2048, 8192, 32768, 65536)
MAX_LENGTH = 65536       # measured up to this, or the endpoint's max_model_len
BATCHES = (1, 8, 32)
DECODE_CONTEXT = 2048
DECODE_TOKENS = 64
TRIES = 3                # a failed stream is sent again, then named
NO_CACHED_TOKENS = ("the endpoint reports no cached tokens (its usage has no "
                    "prompt_tokens_details): start its vLLM with --enable-prompt-tokens-details "
                    "(an endpoint file's spec.worker.args)")
MAX_RESIDUAL = 0.10      # the fit must reproduce every measured point within 10%
FITTED = ("mfu", "attention_efficiency", "bandwidth_efficiency", "frontend_fixed_ms",
          "frontend_us_per_token")
BOUNDS = {"mfu": (0.01, 1.0), "attention_efficiency": (0.01, 1.0),
          "bandwidth_efficiency": (0.01, 1.0), "frontend_fixed_ms": (0.0, 10_000.0),
          "frontend_us_per_token": (0.0, 1_000.0)}


class ProbeError(RuntimeError):
    """A measurement that failed every try (one line, naming it)."""


class Probe(Protocol):
    """Something that answers requests of token ids and times them."""

    def ttft(self, prompt: list[int]) -> tuple[float, int | None]:
        """Seconds to the first token and the cached tokens the server reports (None: it
        reports none)."""

    def decode_step(self, prompts: list[list[int]], tokens: int) -> float:
        """Median seconds between tokens while all `prompts` decode together."""

    def cache_config(self) -> dict[str, str]:
        """The labels of `vllm:cache_config_info`."""

    def max_model_len(self) -> int | None:
        """The longest sequence the endpoint serves (None: not said)."""


def tried(what: str, fn: Any, tries: int = TRIES) -> Any:
    """`fn()`, sent again on failure up to `tries` times, then a ProbeError naming `what`."""
    last: Exception | None = None
    for _ in range(tries):
        try:
            return fn()
        except (OSError, RuntimeError, ValueError, KeyError, IndexError,
                http.client.HTTPException) as exc:
            last = exc
    first = str(last).splitlines()[0][:200] if last and str(last) else type(last).__name__
    raise ProbeError(f"{what} failed {tries} times: {first}")


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
        try:
            self._models = self._list_models()
            self.model = model or self._models[0]["id"]
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            raise OSError(f"not an OpenAI model list ({exc})") from None

    def _conn(self) -> http.client.HTTPConnection:
        cls = http.client.HTTPSConnection if self.parts.scheme == "https" else \
            http.client.HTTPConnection
        return cls(self.parts.hostname, self.parts.port, timeout=self.timeout_s)

    def _list_models(self) -> list[dict]:
        conn = self._conn()
        try:
            conn.request("GET", self.base + "/v1/models")
            return list(json.loads(conn.getresponse().read())["data"])
        finally:
            conn.close()

    def max_model_len(self) -> int | None:
        """vLLM's /v1/models names each model's `max_model_len`."""
        for m in self._models:
            if m.get("id") == self.model and m.get("max_model_len"):
                return int(m["max_model_len"])
        return None

    def _stream(self, prompt: list[int],
                max_tokens: int) -> tuple[list[float], int | None, float]:
        body = {"model": self.model, "prompt": prompt, "max_tokens": max_tokens,
                "stream": True, "temperature": 0.0, "ignore_eos": True,
                "stream_options": {"include_usage": True}}
        conn = self._conn()
        times: list[float] = []
        cached: int | None = None   # None: the usage had no prompt_tokens_details
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
                    details = usage.get("prompt_tokens_details")
                    cached = None if details is None else details.get("cached_tokens") or 0
                if any(c.get("text") for c in obj.get("choices") or []):
                    times.append(time.perf_counter())
        finally:
            conn.close()
        return times, cached, t0

    def _tokens(self, prompt: list[int],
                max_tokens: int) -> tuple[list[float], int | None, float]:
        """A stream that must bring `max_tokens` tokens (a cut one is a failure)."""
        times, cached, t0 = self._stream(prompt, max_tokens)
        if len(times) < max_tokens:
            raise RuntimeError(f"the stream ended after {len(times)} of {max_tokens} tokens")
        return times, cached, t0

    def ttft(self, prompt: list[int]) -> tuple[float, int | None]:
        times, cached, t0 = tried(f"a {len(prompt)}-token prompt",
                                  lambda: self._tokens(prompt, 1))
        return times[0] - t0, cached

    def decode_step(self, prompts: list[list[int]], tokens: int) -> float:
        def batch() -> float:
            results: list[list[float] | Exception] = [[] for _ in prompts]

            def go(i: int) -> None:
                try:
                    results[i] = self._tokens(prompts[i], tokens)[0]
                except Exception as exc:   # noqa: BLE001 - judged below, in this thread
                    results[i] = exc
            threads = [threading.Thread(target=go, args=(i,)) for i in range(len(prompts))]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            failed = [r for r in results if isinstance(r, Exception)]
            if failed:
                raise RuntimeError(f"{len(failed)} of {len(prompts)} streams failed: "
                                   f"{failed[0]}")
            return decode_gap(results)   # type: ignore[arg-type]
        return tried(f"the decode of {len(prompts)} streams of {tokens} tokens", batch)

    def cache_config(self) -> dict[str, str]:
        from urllib.request import ProxyHandler, build_opener

        with build_opener(ProxyHandler({})).open(self.metrics_url, timeout=30) as resp:
            text = resp.read().decode(errors="replace")
        return cache_config_labels(text)


def decode_gap(token_times: list[list[float]]) -> float:
    """The median gap between tokens while every stream decodes."""
    start = max(r[0] for r in token_times)      # everyone decoding
    end = min(r[-1] for r in token_times)
    gaps = [b - a for r in token_times for a, b in zip(r, r[1:]) if a >= start and b <= end]
    if not gaps:
        raise RuntimeError("the streams never decoded together")
    return statistics.median(gaps)


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
        return decode_gap([r.token_times for r in self._run(prompts, tokens)])

    def cache_config(self) -> dict[str, str]:
        return {"block_size": "16", "num_gpu_blocks": str(self.cache.capacity_blocks),
                "gpu_memory_utilization": str(self.gpu.gpu_memory_utilization)}

    def max_model_len(self) -> int | None:
        return 131072


def lengths_for(probe: Probe, lengths: Sequence[int]) -> tuple[int, ...]:
    """The prompt lengths to measure: those asked, none longer than MAX_LENGTH or than the
    endpoint serves (a prompt and its one output token), the longest it serves up to 64K
    always among them."""
    mml = probe.max_model_len()
    cap = min(MAX_LENGTH, (mml - 1) if mml else MAX_LENGTH)
    return tuple(sorted({min(n, cap) for n in lengths} | {cap}))


def token_ids(rng: random.Random, n: int) -> list[int]:
    """n of `rng.randrange(0, 30000)`, the same draws in the same order, three times faster (a
    run draws ~300K): randrange takes 15-bit draws and drops those >= 30000."""
    bits, out = rng.getrandbits, []
    while len(out) < n:
        out += [x for x in [bits(15) for _ in range(n - len(out))] if x < 30000]
    return out


def measure(probe: Probe, lengths: Sequence[int] = DEFAULT_LENGTHS, reps: int = 3,
            seed: int = 7, log: Any = None) -> dict:
    """Cold and hit TTFT per length (medians), decode steps, the cache config."""
    rng = random.Random(seed)
    lengths = lengths_for(probe, lengths)

    out: dict[str, Any] = {"ttft": {}, "decode": {}}
    for n in lengths:
        cold, hit = [], []
        last: list[int] = []
        for _ in range(reps):
            last = token_ids(rng, n)
            cold.append(probe.ttft(last)[0])
        for _ in range(reps):
            t, cached = probe.ttft(last[:n - 256] + token_ids(rng, 256))
            if cached is None:   # vLLM's default: the fit would take every hit for a miss
                raise ProbeError(NO_CACHED_TOKENS)
            hit.append((t, cached))
        out["ttft"][str(n)] = {"cold_s": statistics.median(cold),
                               "hit256_s": statistics.median(t for t, _ in hit),
                               "hit_cached_tokens": statistics.median(c for _, c in hit)}
        if log:
            log(f"{n} tokens: cold {out['ttft'][str(n)]['cold_s'] * 1e3:.1f} ms, hit "
                f"{out['ttft'][str(n)]['hit256_s'] * 1e3:.1f} ms")
    mml = probe.max_model_len()
    ctx = min(DECODE_CONTEXT, mml - DECODE_TOKENS - 1) if mml else DECODE_CONTEXT
    out["decode_context"] = ctx
    for b in BATCHES:
        out["decode"][str(b)] = probe.decode_step([token_ids(rng, ctx) for _ in range(b)],
                                                  DECODE_TOKENS)
        if log:
            log(f"decode batch {b}: {out['decode'][str(b)] * 1e3:.2f} ms/step")
    out["cache_config"] = tried("/metrics (vllm:cache_config_info)", probe.cache_config)
    out["max_model_len"] = probe.max_model_len()
    return out


def _points(meas: dict) -> list[tuple[str, Any, float]]:
    """(name, predictor(gpu) -> seconds, measured seconds) for every measured figure."""
    out: list[tuple[str, Any, float]] = []
    for n, v in meas["ttft"].items():
        n_, hit = int(n), int(v["hit_cached_tokens"])
        out.append((f"cold {n_:,}", lambda g, n_=n_: g.prefill_seconds(n_), v["cold_s"]))
        out.append((f"hit {n_:,} ({hit:,} cached)",
                    lambda g, n_=n_, hit=hit: g.prefill_seconds(n_, hit), v["hit256_s"]))
    ctx = meas.get("decode_context", DECODE_CONTEXT)
    for b, step in meas["decode"].items():
        out.append((f"decode step, batch {b}",
                    lambda g, b=int(b): g.decode_seconds(ctx, b), step))
    return out


def _kv_tokens(meas: dict) -> tuple[int, float]:
    cc = meas["cache_config"]
    tokens = int(cc.get("kv_cache_size_tokens") or
                 int(cc["num_gpu_blocks"]) * int(cc["block_size"]))
    return tokens, float(cc.get("gpu_memory_utilization") or 0.9)


def fit(base: GpuProfile, meas: dict, name: str) -> GpuProfile:
    """The profile within physics that reproduces `meas` best on `base`'s GPU, model and
    interconnect: a bounded least-squares fit of the emulator's own step model (relative
    errors), from a few starting points (the best kept), then the activation reserve from
    the KV capacity."""
    import numpy as np
    from scipy.optimize import least_squares

    points = _points(meas)
    lo = np.array([BOUNDS[k][0] for k in FITTED])
    hi = np.array([BOUNDS[k][1] for k in FITTED])

    def gpu_of(x: Any) -> GpuProfile:
        return replace(base, name=name, step_overhead_ms=0.0,
                       **{k: float(v) for k, v in zip(FITTED, x)})

    def errors(x: Any) -> Any:
        g = gpu_of(x)
        return np.array([predict(g) / measured - 1 for _, predict, measured in points])

    best = None
    for start in ((0.6, 0.6, 0.7, 10.0, 1.0), (0.3, 0.9, 0.5, 1.0, 0.1),
                  (0.9, 0.3, 0.9, 20.0, 3.0)):
        x0 = np.clip(np.array(start), lo + 1e-9, hi - 1e-9)
        r = least_squares(errors, x0, bounds=(lo, hi), x_scale=np.maximum(x0, 0.1),
                          diff_step=1e-4, max_nfev=400)
        if best is None or r.cost < best.cost - 1e-12:
            best = r
    gpu = gpu_of(best.x)
    tokens, util = _kv_tokens(meas)
    m = base.model
    usable = base.gpus * base.gpu_memory_gib * GIB * util
    reserve = (usable - m.weight_bytes - tokens * m.kv_bytes_per_token) / base.gpus / 1e9
    return replace(gpu, gpu_memory_utilization=util, activation_reserve_gb=max(0.0, reserve))


def residuals(gpu: GpuProfile, meas: dict) -> dict:
    """Predicted / measured - 1 at every measured point (and the KV capacity)."""
    out = {name: predict(gpu) / measured - 1 for name, predict, measured in _points(meas)}
    tokens, util = _kv_tokens(meas)
    out["KV capacity, tokens"] = replace(gpu, gpu_memory_utilization=util).kv_tokens / tokens - 1
    return {k: round(v, 4) for k, v in out.items()}


def calibrate(probe: Probe, base: GpuProfile, name: str, *, lengths: Sequence[int],
              reps: int, log: Any = None, seed: int = 7) -> tuple[GpuProfile, dict]:
    meas = measure(probe, lengths, reps, seed=seed, log=log)
    gpu = fit(base, meas, name)
    res = residuals(gpu, meas)
    worst = max(res, key=lambda k: abs(res[k]))
    return gpu, {"measured": meas, "residuals": res, "base_profile": base.name,
                 "worst": worst, "holds": abs(res[worst]) <= MAX_RESIDUAL}


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
                   help="prompt lengths, comma-separated (capped at 64K and the endpoint's "
                   "max_model_len, which is always measured)")
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
    except (OSError, KeyError, IndexError, ValueError, http.client.HTTPException) as exc:
        raise ToolError(f"{args.url}/v1/models did not answer: {exc}") from None
    base = profile(args.base_profile)
    name = args.name or f"{base.name}-calibrated"
    try:
        gpu, report = calibrate(probe, base, name, lengths=lengths, reps=args.reps,
                                log=lambda s: err_console.print(s))
    except (OSError, RuntimeError, ValueError, http.client.HTTPException) as exc:
        raise ToolError(f"calibrate: {exc}") from None
    for point, r in report["residuals"].items():
        err_console.print(f"fit residual, {point}: {r:+.1%}")
    if not report["holds"]:
        worst = report["worst"]
        raise ToolError(f"calibrate: the fit misses {worst} by {report['residuals'][worst]:+.0%} "
                        f"(more than {MAX_RESIDUAL:.0%}): {args.url} does not behave like "
                        f"{base.model.name} on {base.gpus} x {base.gpu} within physics (a "
                        f"wrong --base-profile?); no profile written")
    data = gpu.to_json() | {"about": f"measured from {args.url} by python -m tools calibrate "
                                     f"on {time.strftime('%Y-%m-%d')}", "calibration": report}
    args.out.write_text(json.dumps(data, indent=1))
    out_console.print(json.dumps(gpu.describe(), indent=1))
    err_console.print(f"wrote {args.out} (use: make bench-routing PROFILE_FILE={args.out})")
    return 0
