"""A vLLM replica's timing and memory, emulated from a GPU profile (used by `fake_worker`).

Why: a fake worker with an unbounded cache and a flat per-token cost flatters round robin (every
worker ends up holding every prefix) and hides batching; the routing comparison is only worth
something if a worker forgets like a GPU does and slows down like one under load.

Model (a roofline, one engine step at a time, as vLLM's scheduler runs it):
- KV capacity: GPUs x memory x ``gpu_memory_utilization`` minus the weights and an activation
  reserve, divided by the KV bytes of one token (2 x layers x KV heads x head dim x 2 bytes).
  The prefix cache is an LRU of that many tokens (in blocks).
- One step serves every running sequence's next token plus prefill chunks, up to
  ``max_num_batched_tokens`` (chunked prefill, vLLM's default in V1). Its time is the larger of
  compute (2 x params FLOPs per token + attention 2 x layers x d_model x ((c+n)^2 - c^2) for a
  chunk of n tokens after c in context, over peak x MFU) and memory traffic (weights + KV read,
  over bandwidth x efficiency), plus a fixed per-step overhead.
- Render/tokenize (the router's cache_aware calls it on every worker per request): a fixed HTTP
  cost plus a per-token tokenizer cost, as a CPU-bound API server pays it.
- ``time_scale`` shrinks every emulated GPU duration (0.1: ten times faster than the GPU), so
  long contexts fit in a benchmark run. Render/tokenize is CPU work in the API server and stays
  real time, like the router's own hop: what cache_aware's fan-out costs is never scaled away.

Sources of the profile figures: `SOURCES` below (also printed in docs/benchmarks.md).
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Callable, Sequence

SOURCES = (
    "A10G: 24 GB GDDR6, 600 GB/s; tensor FP16 ~70 TFLOPS dense (below the A10's 125): "
    "https://www.baseten.co/blog/nvidia-a10-vs-a10g-for-ml-model-inference/",
    "g5.24xlarge = 4 x A10G 24 GB over PCIe; p4d.24xlarge = 8 x A100 40 GB over NVLink: AWS "
    "instance tables as collected in "
    "https://gist.github.com/shashankprasanna/10ebe6dc1ba1d8d93db17da4e2cc890e; p5.48xlarge "
    "= 8 x H100 80 GB (AWS EC2 accelerated-computing instances).",
    "A100 40 GB: 312 TFLOPS BF16 dense, 1,555 GB/s (NVIDIA A100 datasheet).",
    "H100 SXM: 989 TFLOPS BF16 dense, 3.35 TB/s, 80 GB HBM3 (NVIDIA H100 datasheet; "
    "https://glennklockwood.com/garden/processors/h100).",
    "Decode efficiency: vLLM serving Llama-3.1-8B on one A100 40 GB decodes one stream at "
    "~75 tokens/s, 'roughly 77% of the GPU's memory-bandwidth ceiling': "
    "https://johnmusgrave.com/p/vllm-throughput-latency-sweep-on (0.77 here; 0.75 for PCIe "
    "tensor parallelism on g5).",
    "Prefill MFU: 0.5 on NVLink/SXM parts; 0.3 on A10G TP 4 over PCIe, which puts 2 x A10G "
    "TP 2 at ~2,600 prompt tokens/s, within 20% of the ~2,200 published for that setup "
    "(project FACTS.md).",
    "Llama-3.1-8B: 32 layers, d_model 4096, 8 KV heads x 128; Llama-3.1-70B: 80 layers, "
    "d_model 8192, 8 KV heads x 128 (the models' config.json); BF16 weights and KV.",
    "vLLM defaults: gpu_memory_utilization 0.9, block size 16, chunked prefill with "
    "max_num_batched_tokens 8192, max_num_seqs 256 (vLLM engine arguments).",
    "Render/tokenize: ~1.5 us per token for a byte-level BPE on one core (measured here, "
    "project FACTS.md) + 1 ms HTTP.",
    "Assumptions of this model, not published figures: 2 GB per GPU of activation reserve, "
    "3 ms of per-step overhead.",
)


@dataclass(frozen=True)
class ModelShape:
    name: str
    params_b: float        # billions of parameters
    layers: int
    d_model: int
    kv_heads: int
    head_dim: int
    dtype_bytes: int = 2   # BF16

    @property
    def weight_bytes(self) -> float:
        return self.params_b * 1e9 * self.dtype_bytes

    @property
    def kv_bytes_per_token(self) -> int:
        """K and V, every layer: 2 x layers x KV heads x head dim x dtype bytes."""
        return 2 * self.layers * self.kv_heads * self.head_dim * self.dtype_bytes


LLAMA_31_8B = ModelShape("Llama-3.1-8B", 8.03, 32, 4096, 8, 128)
LLAMA_31_70B = ModelShape("Llama-3.1-70B", 70.6, 80, 8192, 8, 128)


@dataclass(frozen=True)
class GpuProfile:
    """One replica: `gpus` GPUs of one instance serving `model` with tensor parallelism."""

    name: str
    instance_type: str
    gpu: str
    gpus: int                      # tensor parallel size = GPUs of the replica
    gpu_memory_gb: float
    tflops: float                  # dense BF16/FP16 tensor, per GPU
    bandwidth_gbs: float           # per GPU
    model: ModelShape
    mfu: float                     # prefill compute efficiency
    bandwidth_efficiency: float    # decode memory efficiency
    gpu_memory_utilization: float = 0.9   # vLLM's default
    activation_reserve_gb: float = 2.0    # per GPU: activations, CUDA graphs
    step_overhead_ms: float = 3.0
    max_num_batched_tokens: int = 8192
    max_num_seqs: int = 256
    render_fixed_ms: float = 1.0
    render_us_per_token: float = 1.5

    @property
    def kv_tokens(self) -> int:
        """Tokens of KV cache the replica holds (what vLLM logs as 'GPU KV cache size')."""
        usable = self.gpus * self.gpu_memory_gb * 1e9 * self.gpu_memory_utilization
        free = usable - self.model.weight_bytes - self.gpus * self.activation_reserve_gb * 1e9
        if free <= 0:
            raise ValueError(f"{self.name}: {self.model.name} does not fit")
        return int(free // self.model.kv_bytes_per_token)

    @property
    def flops_per_s(self) -> float:
        return self.gpus * self.tflops * 1e12 * self.mfu

    @property
    def bytes_per_s(self) -> float:
        return self.gpus * self.bandwidth_gbs * 1e9 * self.bandwidth_efficiency

    def prefill_flops(self, context: int, n: int) -> float:
        """FLOPs of a prefill chunk of `n` tokens after `context` tokens already in KV."""
        m = self.model
        return 2 * m.params_b * 1e9 * n + 2 * m.layers * m.d_model * ((context + n) ** 2
                                                                       - context ** 2)

    def step_seconds(self, decode_contexts: Sequence[int],
                     chunks: Sequence[tuple[int, int]]) -> float:
        """One engine step: a token for each decoding sequence (its context length given) and
        prefill chunks (context before, tokens)."""
        m = self.model
        flops = sum(self.prefill_flops(c, n) for c, n in chunks)
        flops += sum(2 * m.params_b * 1e9 + 4 * m.layers * m.d_model * c
                     for c in decode_contexts)
        kv_read = sum(decode_contexts) + sum(c + n for c, n in chunks)
        traffic = m.weight_bytes + m.kv_bytes_per_token * kv_read
        return max(flops / self.flops_per_s, traffic / self.bytes_per_s) + \
            self.step_overhead_ms / 1e3

    def prefill_seconds(self, tokens: int, cached: int = 0) -> float:
        """Time to first token of one request alone on the replica (chunked prefill)."""
        total, done = 0.0, cached
        while done < tokens:
            n = min(self.max_num_batched_tokens, tokens - done)
            total += self.step_seconds((), [(done, n)])
            done += n
        return total or self.step_seconds((), [(cached, 1)])

    def decode_seconds(self, context: int, batch: int = 1) -> float:
        return self.step_seconds([context] * batch, ())

    def render_seconds(self, tokens: int) -> float:
        return self.render_fixed_ms / 1e3 + self.render_us_per_token * tokens / 1e6

    def describe(self) -> dict:
        return {
            "profile": self.name, "instance_type": self.instance_type,
            "replica": f"{self.gpus} x {self.gpu} (TP {self.gpus})", "model": self.model.name,
            "kv_bytes_per_token": self.model.kv_bytes_per_token, "kv_tokens": self.kv_tokens,
            "prefill_tokens_per_s_2k": round(2048 / self.prefill_seconds(2048)),
            "ttft_s": {f"{k // 1024}k": round(self.prefill_seconds(k), 3)
                       for k in (2048, 8192, 65536)},
            "decode_ms_per_token": round(self.decode_seconds(2048) * 1e3, 2),
            "decode_ms_per_token_batch_32": round(self.decode_seconds(2048, 32) * 1e3, 2),
            "render_ms_8k": round(self.render_seconds(8192) * 1e3, 2),
        }


PROFILES: dict[str, GpuProfile] = {p.name: p for p in (
    GpuProfile("g5.24xlarge", "g5.24xlarge", "A10G", 4, 24, 70, 600, LLAMA_31_8B,
               mfu=0.3, bandwidth_efficiency=0.75),
    GpuProfile("p4d.24xlarge", "p4d.24xlarge", "A100-40GB", 8, 40, 312, 1555, LLAMA_31_70B,
               mfu=0.5, bandwidth_efficiency=0.77),
    GpuProfile("p5.48xlarge", "p5.48xlarge", "H100-SXM", 8, 80, 989, 3350, LLAMA_31_70B,
               mfu=0.5, bandwidth_efficiency=0.77),
)}


def profile(name: str) -> GpuProfile:
    try:
        return PROFILES[name]
    except KeyError:
        raise ValueError(f"unknown GPU profile {name!r}; known: {', '.join(PROFILES)}") from None


# --------------------------------------------------------------------------- engine


class Sequence_:
    """One request in the engine: prefill from `cached` to `prompt`, then `max_tokens` steps.

    `lookup()`, if given, is asked for the cached prefix when the sequence is first scheduled
    (as vLLM's scheduler does, so a request queued behind another with the same prefix finds
    what that one computed); `on_progress(done)` hears of every prefill chunk (the worker
    caches the computed blocks at once, as vLLM does)."""

    __slots__ = ("prompt", "done", "max_tokens", "produced", "times", "lookup", "on_progress")

    def __init__(self, prompt: int, cached: int, max_tokens: int,
                 lookup: Callable[[], int] | None = None,
                 on_progress: Callable[[int], None] | None = None) -> None:
        self.prompt, self.done, self.max_tokens = prompt, min(cached, prompt - 1), max_tokens
        self.produced = 0
        self.times: list[float] = []   # perf_counter of each token
        self.lookup, self.on_progress = lookup, on_progress

    @property
    def context(self) -> int:
        return self.done + self.produced


class Engine:
    """vLLM's continuous batching on an emulated GPU, in one thread: every step takes the
    decoding sequences first, then prefill chunks in arrival order, within the token budget;
    sleeps the step's emulated time (x `time_scale`); then hands out the tokens."""

    def __init__(self, gpu: GpuProfile, time_scale: float = 1.0) -> None:
        if not 0 < time_scale <= 100:
            raise ValueError("time_scale must be in (0, 100]")
        self.gpu, self.time_scale = gpu, time_scale
        self._cond = threading.Condition()
        self._queue: list[Sequence_] = []
        self._stop = False
        self.steps = 0
        self._thread = threading.Thread(target=self._run, name="emulated-gpu", daemon=True)
        self._thread.start()

    def submit(self, prompt: int, cached: int, max_tokens: int,
               lookup: Callable[[], int] | None = None,
               on_progress: Callable[[int], None] | None = None) -> Sequence_:
        seq = Sequence_(prompt, cached, max_tokens, lookup, on_progress)
        with self._cond:
            self._queue.append(seq)
            self._cond.notify_all()
        return seq

    def wait_token(self, seq: Sequence_, index: int) -> float:
        """Blocks until token `index` (0 = the first) exists; returns when it was made."""
        with self._cond:
            self._cond.wait_for(lambda: seq.produced > index or self._stop)
            return seq.times[index] if seq.produced > index else time.perf_counter()

    def stop(self) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify_all()

    def plan(self) -> tuple[list[Sequence_], list[tuple[Sequence_, int]]]:
        """The next step: decoding sequences, and (sequence, chunk) prefill pieces."""
        gpu = self.gpu
        running = self._queue[:gpu.max_num_seqs]
        decode = [s for s in running if s.done >= s.prompt and s.produced < s.max_tokens]
        budget = gpu.max_num_batched_tokens - len(decode)
        chunks = []
        for s in running:
            if budget <= 0:
                break
            if s.lookup is not None:  # first scheduled: what is cached now
                s.done = max(s.done, min(s.lookup(), s.prompt - 1))
                s.lookup = None
            if s.done < s.prompt:
                n = min(budget, s.prompt - s.done)
                chunks.append((s, n))
                budget -= n
        return decode, chunks

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._queue or self._stop)
                if self._stop:
                    return
                decode, chunks = self.plan()
            seconds = self.gpu.step_seconds([s.context for s in decode],
                                            [(s.done, n) for s, n in chunks])
            time.sleep(seconds * self.time_scale)
            now = time.perf_counter()
            with self._cond:
                self.steps += 1
                for s in decode:
                    s.produced += 1
                    s.times.append(now)
                for s, n in chunks:
                    s.done += n
                    if s.on_progress is not None:
                        s.on_progress(s.done)
                    if s.done >= s.prompt:  # the prefill's last step samples the first token
                        s.produced += 1
                        s.times.append(now)
                self._queue = [s for s in self._queue if s.produced < s.max_tokens]
                self._cond.notify_all()
