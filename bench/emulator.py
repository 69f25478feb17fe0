"""A vLLM replica's timing and memory, emulated from a GPU profile (used by `fake_worker` and by
the virtual-time benchmarks in `bench.vtime`).

Why: a fake worker with an unbounded cache and a flat per-token cost flatters round robin (every
worker ends up holding every prefix) and hides batching; the routing comparison is only worth
something if a worker forgets like a GPU does and slows down like one under load. The figures are
held against real vLLM 0.24 on an H100 (`bench/data/h100_vllm_0_24.json`;
`tests/bench/test_emulator.py` keeps every prediction within 15%).

Model (one engine step at a time, as vLLM's scheduler runs it):
- KV capacity: GPUs x memory in GiB (as the runtime reports it) x ``gpu_memory_utilization``,
  minus the weights and an activation reserve, over the KV bytes of one token
  (2 x layers x KV heads x head dim x 2 bytes). The prefix cache is an LRU of that many tokens.
- Front end: every request pays ``frontend_fixed_ms`` + ``frontend_us_per_token`` per prompt
  token (request handling, block hashing, scheduling, sampling the first token) before and
  around its first step. It is latency, not engine time: two requests pay it side by side.
  Fitted to the H100's cold and prefix-hit TTFT together: a hit costs this plus the compute of
  its uncached tail (attention over the cached context included), which is what "~19 ms plus
  1.2 us per cached token" measured.
- One step serves every running sequence's next token plus prefill chunks, up to
  ``max_num_batched_tokens`` (chunked prefill). Its time is the larger of compute (2 x params
  FLOPs per token at ``mfu`` of peak, plus attention 2 x layers x d_model x ((c+n)^2 - c^2) for a
  chunk of n tokens after c in context, at ``attention_efficiency`` of peak) and memory traffic
  (weights + KV read, at ``bandwidth_efficiency`` of the bandwidth). No fixed per-step cost: the
  H100's decode steps at batch 1 / 8 / 32 match the bandwidth term alone within 3%.
- The scheduler plans a step while the one before it runs (vLLM's async scheduling, on by
  default in 0.24): a request that arrives during a step joins the step after next, so a
  prefill finishing in a step is not held back by a newcomer's chunk. Modelling it brought the
  emulated two-server A/B within 0.05 of every measured ratio (bench.ab_check).
- KV moved between CPU and GPU (LMCache's L1, vLLM's CPU offload): ``cpu_to_gpu_gbs`` and
  ``gpu_to_cpu_gbs`` per GPU; with a KV connector on, ``connector_us_per_token`` per prompt token
  of lookup (measured: vLLM's CPU offload turns a 57 ms 32K GPU hit into 82 ms).
- Render/tokenize (a chat request's tokenizer, and the router's cache_aware fan-out): a fixed
  HTTP cost plus a per-token tokenizer cost, as a CPU-bound API server pays it.
- ``time_scale`` (real-time `Engine` only) shrinks every emulated GPU duration (0.1: ten times
  faster than the GPU); render/tokenize stays real time, like the router's own hop.

Sources of the profile figures: `SOURCES` below (also printed in docs/benchmarks.md).
"""
from __future__ import annotations

import json
import threading
import time
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any, Callable, Sequence

GIB = 1024 ** 3
MEASURED_FILE = Path(__file__).parent / "data" / "h100_vllm_0_24.json"

@dataclass(frozen=True)
class LMCacheRates:
    """LMCache's own CPU<->GPU KV copy rates (per GPU) for one release, and where they come
    from."""

    release: str
    to_gpu_gbs: float      # retrieve: L1 (pinned CPU memory) -> paged GPU KV
    to_cpu_gbs: float      # store: paged GPU KV -> L1
    source: str


_SAME_KERNEL = ("LMCache {r}'s VLLMPagedMemGPUConnectorV2.to_gpu/from_gpu make the same "
                "multi_layer_kv_transfer call 0.5.0 makes (lmcache/v1/gpu_connector, read in both "
                "releases; the CUDA kernel itself not compared), so 0.5.0's measured rates; "
                "LMCache publishes no per-release CPU<->GPU figure we found")
# The release a profile assumes (GpuProfile.lmcache_release) picks its rates.
LMCACHE_RELEASES = {r.release: r for r in (
    LMCacheRates("0.5.0", 28.0, 25.0, "measured: LMCache 0.5.0 on vLLM 0.24, one H100 "
                 "(its retrieve_to_gpu_time: 318 MB in 11.3 ms; store_from_gpu_time: ~25 GB/s; "
                 "bench/data/h100_vllm_0_24.json)"),
    LMCacheRates("0.5.4", 28.0, 25.0, _SAME_KERNEL.format(r="0.5.4")),
    LMCacheRates("0.3.7", 28.0, 25.0, _SAME_KERNEL.format(r="0.3.7")),
)}


SOURCES = (
    "Measured (the calibration): vLLM 0.24.0 on one H100 80GB HBM3, Llama-3.1-8B shapes, prefix "
    "caching, chunked prefill 8192, CUDA graphs: cold and prefix-hit TTFT at 2K-64K, decode "
    "steps at batch 1/8/32, KV capacity, CPU->GPU KV loads (`bench/data/h100_vllm_0_24.json`)"
    "; the same with 8 of Llama-3.1-70B's layers (about the 8B's bytes in a quarter of "
    "its layers: what a step costs per layer apart from what it costs per byte). Fitted "
    "(least squares, relative errors): the decode steps of both shapes give 0.83 of the memory "
    "bandwidth for the weights read (all but the input embedding) and KV, plus 35 us per layer "
    "(a full CUDA graph's kernel boundaries); the TTFTs give prefill at 0.67 of peak on the "
    "layers' FLOPs and 0.61 on attention, 185 us per layer more in a step with a prefill chunk "
    "(its host launching attention between graph pieces, vLLM 0.24's FULL_AND_PIECEWISE CUDA "
    "graphs; the GPU idles meanwhile), a front end of 4.6 ms + 1.17 us per prompt token; 1.5 GB "
    "per GPU of activation reserve. No fixed per-step host cost: 0.24 plans the next step while "
    "the GPU runs this one (async scheduling; vllm/v1/engine/core.py step_with_batch_queue).",
    "A10G: 24 GB GDDR6 (nvidia-smi: 23,028 MiB), 600 GB/s; tensor FP16 ~70 TFLOPS dense: "
    "https://www.baseten.co/blog/nvidia-a10-vs-a10g-for-ml-model-inference/",
    "g5.24xlarge = 4 x A10G over PCIe, 50 Gbps; p4d.24xlarge = 8 x A100 40 GB over NVLink, "
    "400 Gbps; p5.48xlarge = 8 x H100 80 GB, 3,200 Gbps (AWS EC2 accelerated-computing "
    "instances; https://gist.github.com/shashankprasanna/10ebe6dc1ba1d8d93db17da4e2cc890e).",
    "A100 40 GB: 312 TFLOPS BF16 dense, 1,555 GB/s, 40,960 MiB (NVIDIA A100 datasheet).",
    "T4: 16 GB GDDR6 (15,360 MiB), 320 GB/s, 65 TFLOPS FP16 tensor dense (NVIDIA T4 datasheet); "
    "g4dn.12xlarge = 4 x T4, 50 Gbps; prefill efficiency assumed as the A10G's (not measured).",
    "H100 SXM: 989 TFLOPS BF16 dense, 3.35 TB/s; 79.2 GiB as the runtime reports it "
    "(measured; https://glennklockwood.com/garden/processors/h100).",
    "Not measured, kept from before: A10G TP 4 over PCIe prefills at 0.3 of peak (2 x A10G TP 2 "
    "then make 2,400-2,700 prompt tokens/s at 8K-2K, 11-22% above the ~2,200 published); "
    "the other A100/A10G efficiencies, the per-layer costs and the front end are the H100's.",
    "Llama-3.1-8B: 32 layers, d_model 4096, 8 KV heads x 128; Llama-3.1-70B: 80 layers, "
    "d_model 8192, 8 KV heads x 128 (the models' config.json); BF16 weights and KV.",
    "vLLM defaults: gpu_memory_utilization 0.9, block size 16, chunked prefill; the API "
    "server's batch: 8192 tokens / 1024 sequences on an H100, 2048 / 256 on A100 and A10G "
    "(vllm/engine/arg_utils.py, get_batch_defaults).",
    "CPU<->GPU KV: 46 GB/s in vLLM's CPU offload (55 GB/s raw pinned copy), measured on the "
    "H100; LMCache's, per release (every profile records the one it assumes: 0.5.0): "
    + "; ".join(f"{r.release}: {r.to_gpu_gbs:g} GB/s CPU->GPU, {r.to_cpu_gbs:g} GPU->CPU, "
                f"{r.source}" for r in LMCACHE_RELEASES.values()) + ".",
    "Render/tokenize: ~1.5 us per token for a byte-level BPE on one core (measured on one "
    "core of a 2-core machine) + 1 ms HTTP.",
    "Tensor parallelism: 2 all-reduces per layer (attention and MLP outputs; vLLM's "
    "RowParallelLinear), not overlapped with compute, each a latency plus a ring's 2(n-1)/n "
    "of the step's activations at 0.8 of the link: NVLink 4 (H100 SXM, p5) 900 GB/s "
    "bidirectional per GPU, so 450 GB/s per direction (NVIDIA H100 datasheet); NVLink 3 "
    "(A100, p4d) 600 GB/s, 300 per direction (NVIDIA A100 datasheet); PCIe Gen4 x16 (g5's "
    "A10Gs have no NVLink) 32 GB/s per direction, PCIe Gen3 x16 (g4dn's T4s) 16 (PCI-SIG). "
    "Latency 10 us on NVLink (vLLM's "
    "custom all-reduce: 10 us for 32 tokens x 8192 hidden on 2 x H100, vllm-project/vllm "
    "PR 22086), 30 us over PCIe (assumed, not measured). The 0.8 efficiency is assumed; beside "
    "vLLM's own all-reduce benchmarks (benchmark_device_communicators, hidden 8192 BF16): on "
    "H100 at TP 2, 7 us for 0.5 MB (vllm-project/vllm PR 24111; model 11.5 us); at TP 4, "
    "10 / 14 / 23 us for 0.5 / 1 / 2 MB and 28 us for 4 MB (PR 24532, the best algorithm, "
    "its GPU not named; model 12 / 14 / 19 / 28 us). vLLM 0.24 picks the algorithm by size "
    "(custom all-reduce up to 32 MB at TP 4 and 256 KB at TP 8 on Hopper, "
    "then PyTorch symmetric memory, then NCCL: distributed/device_communicators/"
    "all_reduce_utils.py, cuda_communicator.py). Once a step the sampled tokens' logits are "
    "all-gathered (the LM head is split by vocabulary; LogitsProcessor._gather_logits), "
    "modelled like an all-reduce without the ring's factor 2. Per layer, every GPU runs all "
    "the layer's kernels, so the per-layer costs above do not shrink with TP; the scheduler's "
    "output reaches the TP workers through a shared-memory MessageQueue (v1/executor/"
    "multiproc_executor.py) while the previous step runs, so it adds no step time at 0.24. "
    "Held against vLLM's published TP 4 latency runs (bench.tp_check): 0.89-0.96.",
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
    q_dim: int = 0         # query width (heads x head dim) where it differs from d_model
    vocab: int = 128256    # input embedding and LM head rows
    tied: bool = False     # the LM head is the input embedding (tie_word_embeddings)

    @property
    def weight_bytes(self) -> float:
        return self.params_b * 1e9 * self.dtype_bytes

    @property
    def table_params(self) -> float:
        """One vocabulary table (the input embedding; the LM head is as large)."""
        return self.vocab * self.d_model

    @property
    def read_bytes(self) -> float:
        """What a step reads of the weights: all but the input embedding, of which it gathers
        only its tokens' rows (tied, the LM head reads that table whole)."""
        return (self.params_b * 1e9 - (0 if self.tied else self.table_params)) \
            * self.dtype_bytes

    @property
    def layer_params(self) -> float:
        """The transformer layers' parameters: what every token of a step multiplies by (the
        LM head only runs for the tokens that are sampled)."""
        return self.params_b * 1e9 - (1 if self.tied else 2) * self.table_params

    @property
    def kv_bytes_per_token(self) -> int:
        """K and V, every layer: 2 x layers x KV heads x head dim x dtype bytes."""
        return 2 * self.layers * self.kv_heads * self.head_dim * self.dtype_bytes


LLAMA_31_8B = ModelShape("Llama-3.1-8B", 8.03, 32, 4096, 8, 128)
LLAMA_31_70B = ModelShape("Llama-3.1-70B", 70.6, 80, 8192, 8, 128)
# llm-d's benchmark model: 64 layers, hidden 5120, 64 query heads and 8 KV heads of 128.
QWEN3_32B = ModelShape("Qwen3-32B", 32.8, 64, 5120, 8, 128, q_dim=8192, vocab=151936)
MODELS = {m.name: m for m in (LLAMA_31_8B, LLAMA_31_70B, QWEN3_32B)}


def emulator_model(name: str) -> ModelShape:
    """The emulator's shape of a model named as MODELS or config.models names it (any size of
    the families synth knows, from their config.json). The emulator's step time is a dense
    model's: a mixture of experts is refused with one line."""
    if name in MODELS:
        return MODELS[name]
    from config.models import FAMILIES, known_model

    shape = known_model(name)
    if shape is None or shape.experts:
        raise ValueError(f"model {name!r}: a dense model of {FAMILIES} (config/models.py)"
                         + (": the emulator models dense layers only" if shape else ""))
    return ModelShape(shape.name, shape.params / 1e9, shape.layers, shape.hidden,
                      shape.kv_heads, shape.head_dim, dtype_bytes=shape.dtype_bytes,
                      q_dim=shape.q_dim if shape.q_dim != shape.hidden else 0,
                      vocab=shape.vocab, tied=shape.tied)


@dataclass(frozen=True)
class GpuProfile:
    """One replica: `gpus` GPUs of one instance serving `model` with tensor parallelism."""

    name: str
    instance_type: str
    gpu: str
    gpus: int                      # tensor parallel size = GPUs of the replica
    gpu_memory_gib: float          # per GPU, as the runtime reports the total
    tflops: float                  # dense BF16/FP16 tensor, per GPU
    bandwidth_gbs: float           # per GPU
    model: ModelShape
    mfu: float                     # prefill compute efficiency, linear layers
    bandwidth_efficiency: float    # decode memory efficiency
    attention_efficiency: float = 0.61
    gpu_memory_utilization: float = 0.9   # vLLM's default
    activation_reserve_gb: float = 1.5    # per GPU: activations, CUDA graphs (fitted, H100)
    step_overhead_ms: float = 0.0
    # Per layer and step, what neither FLOPs nor bytes explain: the gaps between a layer's
    # dozen kernels and the small kernels' fixed time (norms, rotary, KV-cache write,
    # activation). Every GPU of a TP group runs every layer's kernels, so it does not shrink
    # with TP. vLLM 0.24 runs a decode-only step as one full CUDA graph and a step with a
    # prefill chunk as piecewise graphs with attention launched between them
    # (CUDAGraphMode.FULL_AND_PIECEWISE), so the two differ. Fitted on the H100: Llama-3.1-8B
    # (32 layers) against an 8-layer slice of Llama-3.1-70B, the same bytes in fewer layers.
    layer_graph_us: float = 35.0
    layer_piecewise_us: float = 185.0
    max_num_batched_tokens: int = 8192
    max_num_seqs: int = 1024
    # vLLM's scheduler runs one step ahead of the GPU (async scheduling, on by default since
    # vllm-project/vllm#27614; 0.24 ran with it): a request that arrives while a step runs
    # joins the step after next, unless the engine was idle.
    async_scheduling: bool = True
    frontend_fixed_ms: float = 4.6
    frontend_us_per_token: float = 1.17
    connector_us_per_token: float = 0.74
    cpu_to_gpu_gbs: float = 46.0          # per GPU: vLLM's own CPU offload (measured)
    gpu_to_cpu_gbs: float = 25.0          # per GPU
    lmcache_release: str = "0.5.0"        # the LMCache whose copy rates the tiers use
    network_gbps: float = 50.0            # the instance's NIC
    # Tensor parallelism: every layer all-reduces its attention output and its MLP output
    # across the replica's GPUs (Megatron-style sharding, vLLM's RowParallelLinear), over the
    # instance's GPU interconnect, not overlapped with compute. Per all-reduce: a latency plus
    # a ring's 2 (n-1)/n x the activations (tokens of the step x d_model x 2 bytes) at the
    # link's per-direction bandwidth x `allreduce_efficiency`. Sources: SOURCES.
    interconnect: str = "NVLink 4"
    link_gbs: float = 450.0               # per GPU, per direction
    allreduce_latency_us: float = 10.0
    allreduce_efficiency: float = 0.8
    render_fixed_ms: float = 1.0
    render_us_per_token: float = 1.5

    @property
    def kv_tokens(self) -> int:
        """Tokens of KV cache the replica holds (what vLLM logs as 'GPU KV cache size')."""
        usable = self.gpus * self.gpu_memory_gib * GIB * self.gpu_memory_utilization
        free = usable - self.model.weight_bytes - self.gpus * self.activation_reserve_gb * 1e9
        if free <= 0:
            raise ValueError(f"{self.name}: {self.model.name} does not fit")
        return int(free // self.model.kv_bytes_per_token)

    @property
    def flops_per_s(self) -> float:
        return self.gpus * self.tflops * 1e12 * self.mfu

    @property
    def attention_flops_per_s(self) -> float:
        return self.gpus * self.tflops * 1e12 * self.attention_efficiency

    @property
    def bytes_per_s(self) -> float:
        return self.gpus * self.bandwidth_gbs * 1e9 * self.bandwidth_efficiency

    def prefill_flops(self, context: int, n: int) -> float:
        """FLOPs of a prefill chunk of `n` tokens after `context` tokens already in KV (the
        layers; its sampled token's LM head is the step's)."""
        return 2 * self.model.layer_params * n + self.attention_flops(context, n)

    def attention_flops(self, context: int, n: int) -> float:
        m = self.model
        return 2 * m.layers * (m.q_dim or m.d_model) * ((context + n) ** 2 - context ** 2)

    def allreduce_seconds(self, tokens: int) -> float:
        """The step's tensor-parallel all-reduces: 2 per layer (attention, MLP) over the
        step's `tokens` activations; none on one GPU."""
        n = self.gpus
        if n <= 1 or tokens <= 0:
            return 0.0
        m = self.model
        size = tokens * m.d_model * m.dtype_bytes
        one = self.allreduce_latency_us / 1e6 + 2 * (n - 1) / n * size / (
            self.link_gbs * 1e9 * self.allreduce_efficiency)
        return 2 * m.layers * one

    def step_seconds(self, decode_contexts: Sequence[int],
                     chunks: Sequence[tuple[int, int]]) -> float:
        """One engine step: a token for each decoding sequence (its context length given) and
        prefill chunks (context before, tokens); compute or memory, whichever is longer, then
        the tensor-parallel all-reduces."""
        m = self.model
        tokens = sum(n for _, n in chunks) + len(decode_contexts)
        sampled = len(decode_contexts) + len(chunks)     # the LM head runs for these only
        linear = 2 * (m.layer_params * tokens + m.table_params * sampled)
        attention = sum(self.attention_flops(c, n) for c, n in chunks) + \
            sum(4 * m.layers * (m.q_dim or m.d_model) * c for c in decode_contexts)
        kv_read = sum(decode_contexts) + sum(c + n for c, n in chunks)
        traffic = m.read_bytes + m.kv_bytes_per_token * kv_read
        compute = linear / self.flops_per_s + attention / self.attention_flops_per_s
        return (max(compute, traffic / self.bytes_per_s) + m.layers * self.layer_graph_us / 1e6
                + self.allreduce_seconds(tokens) + self.logits_gather_seconds(sampled)
                + self.host_seconds(bool(chunks)))

    def logits_gather_seconds(self, sampled: int) -> float:
        """The LM head is split by vocabulary over the TP group and every rank all-gathers the
        sampled tokens' logits (vLLM 0.24 LogitsProcessor._gather_logits; CUDA all-gathers):
        a latency plus (n-1)/n of sampled x vocab x 2 bytes; none on one GPU."""
        n = self.gpus
        if n <= 1 or sampled <= 0:
            return 0.0
        size = sampled * self.model.vocab * self.model.dtype_bytes
        return self.allreduce_latency_us / 1e6 + (n - 1) / n * size / (
            self.link_gbs * 1e9 * self.allreduce_efficiency)

    def host_seconds(self, prefill: bool) -> float:
        """The part of a step its host spends with the GPU idle: the CPU work vLLM does not
        overlap (`step_overhead_ms`) and, in a step with a prefill chunk, the layer-by-layer
        launches of attention between the graph pieces (`layer_piecewise_us` per layer;
        measured additive: the 8B's and the slice's prefix hits differ by it). Engines sharing
        a GPU (bench.vtime.SharedGpu) do not share it."""
        launch = self.model.layers * self.layer_piecewise_us / 1e6 if prefill else 0.0
        return self.step_overhead_ms / 1e3 + launch

    @property
    def lmcache_rates(self) -> LMCacheRates:
        try:
            return LMCACHE_RELEASES[self.lmcache_release]
        except KeyError:
            raise ValueError(f"{self.name}: no CPU<->GPU rates for LMCache "
                             f"{self.lmcache_release}; known: {', '.join(LMCACHE_RELEASES)}"
                             ) from None

    def frontend_seconds(self, tokens: int) -> float:
        """What a request waits outside the GPU steps: handling, hashing, first-token path."""
        return self.frontend_fixed_ms / 1e3 + self.frontend_us_per_token * tokens / 1e6

    def connector_seconds(self, tokens: int) -> float:
        """A KV connector's lookup over the prompt (vLLM's CPU offload, LMCache)."""
        return self.connector_us_per_token * tokens / 1e6

    def kv_transfer_seconds(self, tokens: int, to_gpu: bool = True) -> float:
        """Moving `tokens` of KV between CPU and GPU memory (every GPU its shard, in
        parallel)."""
        rate = self.cpu_to_gpu_gbs if to_gpu else self.gpu_to_cpu_gbs
        return tokens * self.model.kv_bytes_per_token / (self.gpus * rate * 1e9)

    def prefill_seconds(self, tokens: int, cached: int = 0, loaded: int = 0,
                        connector: bool = False) -> float:
        """Time to first token of one request alone on the replica (chunked prefill): the
        front end, `loaded` cached tokens copied from CPU, the uncached rest computed."""
        total, done = 0.0, min(cached, tokens - 1)
        while done < tokens:
            n = min(self.max_num_batched_tokens, tokens - done)
            total += self.step_seconds((), [(done, n)])
            done += n
        total += self.frontend_seconds(tokens) + self.kv_transfer_seconds(loaded)
        return total + (self.connector_seconds(tokens) if connector or loaded else 0.0)

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
            "hit_ttft_s": {f"{k // 1024}k": round(self.prefill_seconds(k, k - 256), 3)
                           for k in (2048, 8192, 65536)},
            "decode_ms_per_token": round(self.decode_seconds(2048) * 1e3, 2),
            "decode_ms_per_token_batch_32": round(self.decode_seconds(2048, 32) * 1e3, 2),
            "render_ms_8k": round(self.render_seconds(8192) * 1e3, 2),
            "allreduce_ms_8k": round(self.allreduce_seconds(self.max_num_batched_tokens) * 1e3, 2),
            "allreduce_ms_decode": round(self.allreduce_seconds(1) * 1e3, 2),
            "interconnect": self.interconnect if self.gpus > 1 else "one GPU",
            "lmcache": f"{self.lmcache_release} ({self.lmcache_rates.to_gpu_gbs:g})",
        }

    # -- profile files (written by `python -m tools calibrate`, read by --profile-file)

    def to_json(self) -> dict:
        d = asdict(self)
        d["model"] = asdict(self.model)
        return d

    @classmethod
    def from_json(cls, data: dict) -> "GpuProfile":
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known - {"about", "calibration"})
        if unknown:
            raise ValueError(f"profile: unknown field(s) {', '.join(unknown)}")
        kwargs: dict[str, Any] = {k: v for k, v in data.items() if k in known}
        model = kwargs.get("model")
        kwargs["model"] = emulator_model(model) if isinstance(model, str) else ModelShape(**model)
        return cls(**kwargs)


def load_profile_file(path: str | Path) -> GpuProfile:
    """A profile written by `python -m tools calibrate` (JSON); registered under its name."""
    try:
        data = json.loads(Path(path).read_text())
        gpu = GpuProfile.from_json(data)
    except (OSError, ValueError, TypeError, KeyError) as exc:
        raise ValueError(f"--profile-file {str(path)!r}: not an emulator profile ({exc})") \
            from None
    PROFILES[gpu.name] = gpu
    return gpu


# vLLM's API-server defaults (vllm/engine/arg_utils.py, get_batch_defaults): 8192 batched
# tokens and 1024 sequences on GPUs with >= 70 GiB that are not A100s, 2048 and 256 elsewhere.
H100 = dict(gpu="H100-SXM", gpu_memory_gib=79.2, tflops=989, bandwidth_gbs=3350, mfu=0.67,
            attention_efficiency=0.61, bandwidth_efficiency=0.83, max_num_batched_tokens=8192,
            max_num_seqs=1024)
SMALL_BATCH = dict(max_num_batched_tokens=2048, max_num_seqs=256)
# GPU interconnects (SOURCES): per GPU, per direction
NVLINK3 = dict(interconnect="NVLink 3", link_gbs=300.0, allreduce_latency_us=10.0)
PCIE4 = dict(interconnect="PCIe Gen4 x16", link_gbs=32.0, allreduce_latency_us=30.0)
# g4dn's T4s sit on PCIe Gen3 x16: half Gen4's rate per direction (PCI-SIG); latency as PCIE4's
PCIE3 = dict(interconnect="PCIe Gen3 x16", link_gbs=16.0, allreduce_latency_us=30.0)
PROFILES: dict[str, GpuProfile] = {p.name: p for p in (
    GpuProfile("g5.24xlarge", "g5.24xlarge", "A10G", 4, 22.49, 70, 600, LLAMA_31_8B,
               mfu=0.3, attention_efficiency=0.3, bandwidth_efficiency=0.75, network_gbps=50,
               **PCIE4, **SMALL_BATCH),
    # China's other GPU node group: 4 x T4 (16 GB, 15,360 MiB as the runtime reports it, 65
    # TFLOPS FP16 tensor dense, 320 GB/s; NVIDIA T4 datasheet), 50 Gbps; prefill efficiency
    # assumed as the A10G's (not measured).
    GpuProfile("g4dn.12xlarge", "g4dn.12xlarge", "T4", 4, 15.0, 65, 320, LLAMA_31_8B,
               mfu=0.3, attention_efficiency=0.3, bandwidth_efficiency=0.75, network_gbps=50,
               **PCIE3, **SMALL_BATCH),
    GpuProfile("p4d.24xlarge", "p4d.24xlarge", "A100-40GB", 8, 40.0, 312, 1555, LLAMA_31_70B,
               mfu=0.67, attention_efficiency=0.61, bandwidth_efficiency=0.83,
               network_gbps=400, **NVLINK3, **SMALL_BATCH),
    GpuProfile("p5.48xlarge", "p5.48xlarge", gpus=8, model=LLAMA_31_70B, network_gbps=3200,
               **H100),
    # The measured card itself: one H100 serving Llama-3.1-8B (the calibration's setup).
    GpuProfile("h100-8b", "p5.48xlarge", gpus=1, model=LLAMA_31_8B, network_gbps=400, **H100),
)}


def profile_file_option(p: Any) -> None:
    """`--profile-file` on a benchmark's argument parser (bench.routing, bench.tiered)."""
    from pathlib import Path as _Path

    p.add_argument("--profile-file", type=_Path, help="emulate this profile (written by "
                   "`python -m tools calibrate`) instead of the built-in one")


def load_profile_option(p: Any, args: Any) -> str | None:
    """The profile `--profile-file` names, loaded and registered (its name), or None; a file
    that is not a profile is the parser's one-line error."""
    if not getattr(args, "profile_file", None):
        return None
    try:
        return load_profile_file(args.profile_file).name
    except ValueError as exc:
        p.error(str(exc))
        return None


def profile(name: str) -> GpuProfile:
    try:
        return PROFILES[name]
    except KeyError:
        raise ValueError(f"unknown GPU profile {name!r}; known: {', '.join(PROFILES)}") from None


def measured() -> dict:
    """The real-vLLM figures the model is held against (bench/data/h100_vllm_0_24.json)."""
    return json.loads(MEASURED_FILE.read_text())


# --------------------------------------------------------------------------- engine


class KvBlocks:
    """The blocks one running request holds (`KvCache`): per block the hash it is cached under,
    or None for a block no hash names (a partly filled tail, or a duplicate of a block another
    request cached first). `committed`: blocks already offered to the cache."""

    __slots__ = ("blocks", "committed")

    def __init__(self) -> None:
        self.blocks: list[int | None] = []
        self.committed = 0

    def __len__(self) -> int:
        return len(self.blocks)


class Sequence_:
    """One request in the engine: prefill from `cached` to `prompt`, then `max_tokens` steps.

    `lookup()`, if given, is asked for the cached prefix when the sequence is first scheduled
    (as vLLM's scheduler does, so a request queued behind another with the same prefix finds
    what that one computed); `on_progress(done)` hears of every prefill chunk. `ready_at`: not
    scheduled before that clock reading (its front-end time).

    With a KV cache (`plan_step`'s `kv`): `ids` and `hashes` (its prompt's token ids and block
    hashes), `held` (the blocks it holds while running). A preempted sequence starts again
    from its prefix hit: `target` (the tokens to prefill) becomes prompt + tokens produced,
    `decoded` (tokens since its last prefill) 0."""

    __slots__ = ("prompt", "done", "max_tokens", "produced", "times", "lookup", "on_progress",
                 "ready_at", "extra_s", "target", "decoded", "order", "preempted", "held",
                 "ids", "hashes")

    def __init__(self, prompt: int, cached: int, max_tokens: int,
                 lookup: Callable[[], int] | None = None,
                 on_progress: Callable[[int], None] | None = None,
                 ready_at: float = 0.0) -> None:
        self.prompt, self.done, self.max_tokens = prompt, min(cached, prompt - 1), max_tokens
        self.target = prompt
        self.produced = 0
        self.decoded = 0
        self.times: list[float] = []   # clock reading of each token
        self.lookup, self.on_progress = lookup, on_progress
        self.ready_at = ready_at
        self.extra_s = 0.0             # engine time its first step adds (KV loads)
        self.order: int | None = None  # admission order while running (None: waiting)
        self.preempted = 0             # > 0: preempted (the latest gets the highest)
        self.held: Any = None
        self.ids: Sequence[int] = ()
        self.hashes: Sequence[int] = ()

    @property
    def context(self) -> int:
        """Tokens whose KV the next decode step reads and writes (its new token included)."""
        return self.done + self.decoded

    @property
    def running(self) -> bool:
        return self.order is not None


_ADMITTED = [0]


def plan_step(queue: Sequence[Sequence_], gpu: GpuProfile, now: float,
              planned_at: float | None = None, kv: Any = None,
              preempted: list | None = None
              ) -> tuple[list[Sequence_], list[tuple[Sequence_, int]]]:
    """vLLM 0.24's next step over `queue` (`vllm/v1/core/sched/scheduler.py` schedule()).

    Running sequences first, in the order they were admitted: each its next token, or its
    next prefill chunk within the token budget (`max_num_batched_tokens`). Then, if no
    running sequence was preempted in this step, waiting ones (preempted ones first, the
    latest preempted first, then in arrival order) while budget and `max_num_seqs` allow: a
    sequence's `lookup` runs when it is first scheduled.

    With `kv` (a `fake_worker.KvCache`), as vLLM's KV cache manager does it: a waiting
    sequence is admitted only if the blocks its whole prompt still needs (after its prefix
    hit) are free, else it and every one behind it waits (first come, first served); a
    running sequence that cannot get a block for its next tokens preempts the last admitted
    running sequence (its blocks freed, to be recomputed later), and so on until it fits or
    is itself the one preempted. Preempted sequences are appended to `preempted`.

    `planned_at`: when the scheduler planned the step (with async scheduling, when the step
    before it started); only sequences ready by then are in it, unless none is and one is
    ready now (an idle scheduler plans at once)."""
    at = now
    if planned_at is not None and gpu.async_scheduling and planned_at < now and any(
            s.order is not None or s.ready_at <= planned_at for s in queue):
        at = planned_at
    running = sorted((s for s in queue if s.order is not None), key=lambda s: s.order)
    budget = gpu.max_num_batched_tokens
    decode: list[Sequence_] = []
    chunks: list[tuple[Sequence_, int]] = []
    was_preempted = False
    i = 0
    while i < len(running) and budget > 0:
        s = running[i]
        if s.done < s.target:
            n = min(s.target - s.done, budget)
            tokens = s.done + n
        elif s.produced < s.max_tokens:
            n, tokens = 1, s.context
        else:
            i += 1
            continue
        if kv is not None and not kv.grow(s.held, tokens):
            while True:   # preempt the last admitted until it fits, or `s` itself
                victim = running.pop()
                _preempt(victim, kv)
                was_preempted = True
                if preempted is not None:
                    preempted.append(victim)
                if victim is s or kv.grow(s.held, tokens):
                    break
            if victim is s:
                break
        if n == 1 and s.done >= s.target:
            decode.append(s)
        else:
            chunks.append((s, n))
            if kv is not None and s.hashes:
                kv.commit(s.held, s.hashes, s.ids, tokens // kv.block_size)
        budget -= n
        i += 1
    if was_preempted:
        return decode, chunks
    waiting = [s for s in queue if s.order is None and s.ready_at <= at]
    waiting.sort(key=lambda s: -s.preempted)   # stable: arrival order among the rest
    for s in waiting:
        if budget <= 0 or len(running) >= gpu.max_num_seqs:
            break
        hit = 0
        if kv is not None:
            bs = kv.block_size
            hit = kv.match(s.hashes[:(s.target - 1) // bs])
            if -(-s.target // bs) - hit + sum(1 for h in s.hashes[:hit] if kv.ref[h] == 0) \
                    > kv.free_blocks():
                break      # it waits, and everyone behind it
        if s.lookup is not None:  # first scheduled: what is cached now
            got = s.lookup()
            if got is None:       # an asynchronous lookup still running: not yet
                continue
            s.done = max(s.done, min(got, s.target - 1))
            s.lookup = None
        elif kv is not None:
            s.done = max(s.done, min(hit * kv.block_size, s.target - 1))
        n = min(budget, s.target - s.done)
        if kv is not None:
            s.held = KvBlocks()
            hit = min(hit, s.done // kv.block_size)
            if not kv.admit(s.held, s.hashes, hit, s.target, s.done + n):
                s.held = None
                break
            kv.commit(s.held, s.hashes, s.ids, (s.done + n) // kv.block_size)
        _ADMITTED[0] += 1
        s.order = _ADMITTED[0]
        running.append(s)
        chunks.append((s, n))
        budget -= n
    return decode, chunks


def _preempt(s: Sequence_, kv: Any) -> None:
    """vLLM's recompute preemption: the blocks go back (its cached ones stay evictable), the
    sequence waits at the head of the queue and prefills again what it had, outputs
    included."""
    kv.release(s.held)
    kv.preemptions += 1
    s.held = None
    s.order = None
    _ADMITTED[0] += 1
    s.preempted = _ADMITTED[0]
    s.target = s.prompt + s.produced
    s.done = 0
    s.decoded = 0


def apply_step(decode: list[Sequence_], chunks: list[tuple[Sequence_, int]], now: float) -> None:
    """The tokens a finished step hands out: one per decoding sequence, and the next token of
    every sequence whose prefill it completed."""
    for s in decode:
        s.produced += 1
        s.decoded += 1
        s.times.append(now)
    for s, n in chunks:
        s.done += n
        if s.on_progress is not None:
            s.on_progress(s.done)
        if s.done >= s.target:  # the prefill's last step samples a token
            s.produced += 1
            s.decoded = 1
            s.times.append(now)


class Engine:
    """vLLM's continuous batching on an emulated GPU, in one thread, in real time: every step
    takes the decoding sequences first, then prefill chunks in arrival order, within the token
    budget; sleeps the step's emulated time (x `time_scale`); then hands out the tokens."""

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
        ready = time.perf_counter() + self.gpu.frontend_seconds(prompt) * self.time_scale
        seq = Sequence_(prompt, cached, max_tokens, lookup, on_progress, ready_at=ready)
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

    def plan(self, planned_at: float | None = None
             ) -> tuple[list[Sequence_], list[tuple[Sequence_, int]]]:
        """The next step: decoding sequences, and (sequence, chunk) prefill pieces."""
        return plan_step(self._queue, self.gpu, time.perf_counter(), planned_at)

    def _run(self) -> None:
        started = None      # the last step's start, while steps follow one another
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._queue or self._stop)
                if self._stop:
                    return
                decode, chunks = self.plan(started)
                if not decode and not chunks:  # only front-end waits: sleep to the first
                    started = None
                    wake = min(s.ready_at for s in self._queue) - time.perf_counter()
                    self._cond.wait(max(wake, 0.0005))
                    continue
            started = time.perf_counter()
            seconds = self.gpu.step_seconds([s.context for s in decode],
                                            [(s.done, n) for s, n in chunks])
            time.sleep(seconds * self.time_scale)
            now = time.perf_counter()
            with self._cond:
                self.steps += 1
                apply_step(decode, chunks, now)
                self._queue = [s for s in self._queue if s.produced < s.max_tokens]
                self._cond.notify_all()


def with_overrides(gpu: GpuProfile, **over: Any) -> GpuProfile:
    """`gpu` with some fields changed (the A/B's shared-GPU servers, calibrated profiles)."""
    return replace(gpu, **over)
