"""The GPU emulator behind the benchmark's workers: memory and step arithmetic, batching and the
LRU bound, and its predictions held against real vLLM on an H100. Counts and formulas, never
timings (the engine runs at a tiny time scale)."""
from __future__ import annotations

from dataclasses import replace

import pytest

from bench.emulator import (
    GIB, LLAMA_31_70B, LLAMA_31_8B, PROFILES, Engine, measured, profile,
)
from bench.fake_worker import FakeWorker, PrefixCache

G5 = PROFILES["g5.24xlarge"]
H100 = PROFILES["h100-8b"]
# the real-time engine tests count steps: no front-end wait, so submissions are ready together
G5_NOW = replace(G5, frontend_fixed_ms=0.0, frontend_us_per_token=0.0)


def _within(got: float, want: float, tol: float = 0.15) -> bool:
    return abs(got / want - 1) <= tol


def test_h100_predictions_are_within_15_percent_of_every_measured_figure():
    """Issue 17's table: real vLLM 0.24 on one H100 (bench/data/h100_vllm_0_24.json)."""
    m = measured()
    single = m["single_server"]
    for n, want in single["ttft_ms"].items():
        n = int(n)
        cold, hit = H100.prefill_seconds(n) * 1e3, H100.prefill_seconds(n, n - 256) * 1e3
        assert _within(cold, want["cold"]), (n, cold, want)
        assert _within(hit, want["hit256"]), (n, hit, want)
        assert _within(cold / hit, want["cold"] / want["hit256"]), (n, cold / hit)
    for batch, want in single["decode_step_ms"].items():
        got = H100.decode_seconds(single["decode_context"], int(batch)) * 1e3
        assert _within(got, want), (batch, got, want)
    # KV capacity from GiB: at the server's own utilization, at the 0.9, and at the
    # A/B's 0.42 (138-140K tokens there)
    at = lambda u: replace(H100, gpu_memory_utilization=u).kv_tokens  # noqa: E731
    assert _within(at(single["gpu_memory_utilization"]), single["kv_cache_size_tokens"])
    assert _within(at(0.9), single["kv_cache_size_tokens"])
    lo, hi = m["ab_two_servers_one_gpu"]["setup"]["gpu_kv_tokens_per_server"]
    assert lo * 0.98 <= at(0.42) <= hi * 1.02
    # KV loaded from CPU: a 32K request with 61% of its KV copied back, and a GPU hit with the
    # offload connector on
    off = m["cpu_offload"]
    n = off["tokens"]
    got = H100.prefill_seconds(n, n - 16, loaded=int(off["cpu_loaded_share"] * n)) * 1e3
    assert all(_within(got, want) for want in off["after_eviction_repeat_ms"]), got
    assert _within(H100.prefill_seconds(n, n - 16, connector=True) * 1e3,
                   off["gpu_hit_repeat_ms"])


def test_a_70b_layer_slice_is_held_too_so_a_step_costs_per_layer_as_well_as_per_byte():
    """The same H100 with 8 of Llama-3.1-70B's layers: about the 8B's bytes in a quarter of its
    layers. A model that charges bytes alone put its decode step 22% slow; the per-layer
    kernel costs (layer_graph_us, layer_piecewise_us) hold both shapes within 15%."""
    from bench.emulator import ModelShape
    sl = measured()["llama70b_8layer_slice"]
    shape = ModelShape("slice", sl["params_b"], sl["layers"], 8192, 8, 128)
    gpu = replace(H100, model=shape)
    for n, want in sl["ttft_ms"].items():
        n = int(n)
        assert _within(gpu.prefill_seconds(n) * 1e3, want["cold"]), (n, want)
        assert _within(gpu.prefill_seconds(n, n - 256) * 1e3, want["hit256"]), (n, want)
    for batch, want in sl["decode_step_ms"].items():
        assert _within(gpu.decode_seconds(sl["decode_context"], int(batch)) * 1e3, want)
    # bytes alone, at the efficiency that gives the 8B its measured step, miss the slice
    t8 = H100.decode_seconds(2048)
    slow = H100.bandwidth_efficiency * (1 - 32 * H100.layer_graph_us / 1e6 / t8)
    bytes_only = replace(gpu, layer_graph_us=0.0, bandwidth_efficiency=slow)
    assert replace(H100, layer_graph_us=0.0, bandwidth_efficiency=slow).decode_seconds(
        2048) == pytest.approx(t8, rel=0.01)
    assert bytes_only.decode_seconds(2048) * 1e3 > 1.15 * sl["decode_step_ms"]["1"]


def test_a_prefix_hit_costs_a_fixed_part_plus_a_part_per_cached_token():
    """What the H100 showed: ~19 ms plus ~1.2 us per cached token, so an 8K hit is 5-10x
    cheaper than a miss, not ~50x as the first emulator had it."""
    hits = [H100.prefill_seconds(n, n - 256) for n in (2048, 8192, 32768, 65536)]
    per_token = (hits[-1] - hits[0]) / (65536 - 2048)
    assert 0.9e-6 < per_token < 1.8e-6
    assert 0.012 < hits[0] - 2048 * per_token < 0.025
    assert 5 < H100.prefill_seconds(8192) / H100.prefill_seconds(8192, 8192 - 256) < 10


def test_kv_bytes_per_token_follow_the_model_shape():
    # 2 (K and V) x layers x KV heads x head dim x 2 bytes (BF16)
    assert LLAMA_31_8B.kv_bytes_per_token == 2 * 32 * 8 * 128 * 2 == 131_072
    assert LLAMA_31_70B.kv_bytes_per_token == 2 * 80 * 8 * 128 * 2 == 327_680


def test_kv_capacity_is_what_is_left_of_the_memory_after_the_weights():
    expected = (4 * 22.49 * GIB * 0.9 - 8.03e9 * 2 - 4 * 1.5e9) // 131_072
    assert G5.kv_tokens == int(expected)
    assert 400_000 < G5.kv_tokens < 600_000  # "roughly 0.5M KV tokens per replica"
    # a 70B model on 8 x H100 80 GB holds more than on 8 x A100 40 GB
    assert PROFILES["p5.48xlarge"].kv_tokens > 2.5 * PROFILES["p4d.24xlarge"].kv_tokens
    with pytest.raises(ValueError, match="does not fit"):
        _ = replace(G5, model=LLAMA_31_70B).kv_tokens


def test_prefill_flops_add_up_over_chunks_and_grow_quadratically():
    full = G5.prefill_flops(0, 65536)
    assert full == pytest.approx(G5.prefill_flops(0, 8192) + G5.prefill_flops(8192, 57344))
    linear = 2 * (8.03e9 - 2 * 128256 * 4096) * 65536   # the layers: no embedding, no LM head
    assert full - linear == pytest.approx(2 * 32 * 4096 * 65536 ** 2)


def test_decode_is_memory_bound_and_prefill_compute_bound():
    assert G5.step_overhead_ms == H100.step_overhead_ms == 0   # none beyond what was measured
    # a decode step reads every weight but the input embedding (it gathers its rows), and pays
    # each layer's kernels once per GPU (a full CUDA graph)
    table = 128256 * 4096
    assert LLAMA_31_8B.read_bytes == pytest.approx((8.03e9 - table) * 2)
    assert G5.decode_seconds(0) == pytest.approx(LLAMA_31_8B.read_bytes / G5.bytes_per_s
                                                 + 32 * G5.layer_graph_us / 1e6
                                                 + G5.allreduce_seconds(1)
                                                 + G5.logits_gather_seconds(1))
    # a prefill chunk multiplies its tokens by the layers, and the LM head only for the one
    # token it samples; its host launches attention layer by layer between graph pieces, the
    # GPU idle meanwhile (host time: engines sharing a GPU do not share it)
    assert G5.layer_piecewise_us > G5.layer_graph_us > 0
    assert G5.host_seconds(prefill=False) == 0.0
    assert G5.host_seconds(prefill=True) == pytest.approx(32 * G5.layer_piecewise_us / 1e6)
    assert G5.step_seconds((), [(0, 2048)]) == pytest.approx(
        2 * ((8.03e9 - 2 * table) * 2048 + table) / G5.flops_per_s
        + G5.attention_flops(0, 2048) / G5.attention_flops_per_s
        + 32 * (G5.layer_graph_us + G5.layer_piecewise_us) / 1e6 + G5.allreduce_seconds(2048)
        + G5.logits_gather_seconds(1))
    # batching decode is nearly free; a cached prefix costs the front end and its tail
    assert G5.decode_seconds(2048, 32) < 2 * G5.decode_seconds(2048, 1)
    assert G5.prefill_seconds(8192, cached=8176) < G5.prefill_seconds(8192) / 10


def test_render_cost_is_fixed_plus_per_token():
    assert G5.render_seconds(8192) == pytest.approx(1e-3 + 1.5e-6 * 8192)


def test_unknown_profile_names_the_known_ones():
    with pytest.raises(ValueError, match="unknown GPU profile 'x'; known: g5.24xlarge"):
        profile("x")


def test_engine_batches_sequences_into_shared_steps():
    engine = Engine(replace(G5_NOW, max_num_batched_tokens=8192), time_scale=1e-4)
    try:
        a = engine.submit(100, 0, 5)
        b = engine.submit(100, 0, 5)
        for seq in (a, b):
            engine.wait_token(seq, 4)
        # one prefill step (the first token) + 4 decode steps, shared by both sequences
        assert engine.steps == 5 and a.produced == b.produced == 5
        long = engine.submit(20_000, 0, 3)
        engine.wait_token(long, 2)
        # chunked prefill: ceil(20000 / 8192) = 3 steps, then 2 decode steps
        assert engine.steps == 5 + 3 + 2
        cached = engine.submit(20_000, 19_984, 1)
        engine.wait_token(cached, 0)
        assert engine.steps == 11  # only the uncached tail: one step
    finally:
        engine.stop()


def test_an_emulated_worker_holds_its_profile_kv_capacity_lru():
    w = FakeWorker(0, "g5", profile="g5.24xlarge", time_scale=1e-3, block_size=16)
    assert w.cache.capacity_blocks == G5.kv_tokens // 16
    w.engine.stop()
    cache = PrefixCache(16, 100)
    first = list(range(16 * 60))
    cache.insert(first)
    cache.insert(list(range(10**6, 10**6 + 16 * 60)))
    assert len(cache) == 100                    # bounded
    assert cache.lookup(first + [1]) == 0       # the oldest prefix went first


def test_a_request_queued_behind_the_same_prefix_finds_it_cached_when_scheduled():
    """vLLM looks the prefix cache up when it schedules a request, and caches blocks as
    chunks complete: the second of two same-prefix requests waits, then hits."""
    engine = Engine(replace(G5_NOW, max_num_batched_tokens=8192), time_scale=1e-4)
    computed = [0]
    looked: list[int] = []

    def lookup() -> int:
        looked.append(computed[0])
        return computed[0]

    try:
        a = engine.submit(20_000, 0, 1, on_progress=lambda done: computed.__setitem__(0, done))
        b = engine.submit(20_000, 0, 1, lookup=lookup)
        engine.wait_token(a, 0)
        engine.wait_token(b, 0)
        # a takes the whole 8192-token budget twice; b is scheduled in the third step, with
        # a's first 16384 tokens computed, and finishes in that same step
        assert looked == [16_384] and engine.steps == 3
    finally:
        engine.stop()


# --------------------------------------------------------------------------- KV admission


def _kv_seqs(kv, prompts, max_tokens=4):
    from bench.emulator import Sequence_

    out = []
    for ids in prompts:
        s = Sequence_(len(ids), 0, max_tokens)
        s.ids, s.hashes = ids, kv.block_hashes(ids)
        out.append(s)
    return out


def _run_steps(queue, gpu, kv, steps, preempted=None):
    from bench.emulator import apply_step, plan_step

    for t in range(steps):
        decode, chunks = plan_step(queue, gpu, float(t), kv=kv, preempted=preempted)
        apply_step(decode, chunks, float(t))
        for s in [s for s in queue if s.produced >= s.max_tokens]:
            kv.release(s.held)
            queue.remove(s)


def test_a_prefix_block_shared_by_running_requests_is_held_once():
    """vLLM's reference counts: 6 requests of 1,024 shared + 64 own tokens fit in 100 blocks
    (64 shared + 6 x 5), though 6 x 68 blocks would not."""
    from bench.fake_worker import KvCache

    kv = KvCache(16, 100)
    shared = list(range(1024))
    queue = _kv_seqs(kv, [shared + [10_000 + 100 * i + k for k in range(64)] for i in range(6)],
                     max_tokens=20)
    gpu = replace(H100, max_num_batched_tokens=1024)
    _run_steps(queue, gpu, kv, 3)
    assert all(s.running for s in queue) and kv.preemptions == 0
    held = {h for s in queue for h in s.held.blocks if h is not None}
    assert kv.ref[kv.block_hashes(shared)[0]] == 6          # one block, six holders
    assert kv.used == 64 + 6 * 5 <= kv.capacity_blocks and len(held) >= 64


def test_a_request_waits_until_its_prompt_blocks_are_free_and_the_queue_is_first_come():
    from bench.fake_worker import KvCache

    kv = KvCache(16, 100)
    big, other, small = _kv_seqs(kv, [list(range(1200)), list(range(5000, 6200)),
                                      list(range(9000, 9032))], max_tokens=3)
    queue = [big, other, small]
    gpu = replace(H100, max_num_batched_tokens=8192)
    _run_steps(queue, gpu, kv, 1)
    # 75 blocks for the first; the second needs 75 more of the 25 free: it waits, and the
    # small one behind it waits too (first come, first served), though it would fit
    assert big.running and not other.running and not small.running
    _run_steps(queue, gpu, kv, 3)        # the first finishes; its blocks stay cached
    assert other.running and small.running and kv.used <= kv.capacity_blocks
    # the next request evicted what it needed of them, the last block first: the first
    # request's prefix is still cached, its tail is not
    assert 0 < kv.lookup(big.ids) < 1184


def test_a_decode_that_cannot_get_a_block_preempts_the_newest_running_request():
    from bench.fake_worker import KvCache

    kv = KvCache(16, 20)
    seqs = _kv_seqs(kv, [list(range(i * 1000, i * 1000 + 96)) for i in range(3)],
                    max_tokens=60)
    queue = list(seqs)
    preempted: list = []
    gpu = replace(H100, max_num_batched_tokens=8192)
    _run_steps(queue, gpu, kv, 200, preempted)
    # 3 x 6 blocks admitted, then growing past 20 blocks preempts the last admitted, which
    # recomputes its prompt and what it had produced, and still finishes
    assert preempted and preempted[0] is seqs[2] and kv.preemptions >= 1
    assert not queue and all(s.produced == 60 for s in seqs)
    assert kv.used == 0 and len(kv.ref) <= kv.capacity_blocks


def test_the_engine_waiting_queue_is_exported_as_vllm_metrics():
    """What KEDA reads (vllm:num_requests_waiting): on the virtual clock the emulated
    engine's queue, not the HTTP server's in-flight count."""
    class Hook:
        def gauges(self, worker):
            return 3, 7

        def metrics_lines(self, worker, labels):
            return []
    w = FakeWorker(0, "w0", virtual=Hook())
    text = w.metrics_text()
    assert 'vllm:num_requests_waiting{engine="0",model_name="fake-model"} 7.0' in text
    assert 'vllm:num_requests_running{engine="0",model_name="fake-model"} 3.0' in text


def test_tensor_parallelism_pays_two_all_reduces_per_layer_over_the_interconnect():
    """Nothing on one GPU; on 4 A10Gs over PCIe a token's all-reduces cost what a ring moves
    (2 x 3/4 of 4096 x 2 bytes, 64 times) plus a latency each; NVLink is ~14x cheaper per byte."""
    assert H100.allreduce_seconds(8192) == H100.logits_gather_seconds(8) == 0.0
    # the sampled tokens' logits are all-gathered once a step (vocabulary-split LM head)
    assert G5.logits_gather_seconds(8) == pytest.approx(
        30e-6 + 3 / 4 * 8 * 128256 * 2 / (32e9 * 0.8))
    per_ar = 30e-6 + 2 * 3 / 4 * 8192 * 4096 * 2 / (32e9 * 0.8)
    assert G5.allreduce_seconds(8192) == pytest.approx(2 * 32 * per_ar)
    p5, p4d = PROFILES["p5.48xlarge"], PROFILES["p4d.24xlarge"]
    assert G5.interconnect.startswith("PCIe") and p5.interconnect == "NVLink 4"
    assert p5.allreduce_seconds(8192) < p4d.allreduce_seconds(8192)
    # the all-reduce is part of every step: a TP 8 decode step costs it on top of the weights
    assert p5.decode_seconds(2048) > p5.model.read_bytes / p5.bytes_per_s + 160 * 10e-6


def test_lmcache_copy_rates_come_from_the_release_the_profile_assumes():
    """Every LMCache release a worker image carries has CPU<->GPU rates with a source, and a
    profile names the release it assumes; an unknown one is an error, not a silent 28 GB/s."""
    import re

    from bench.emulator import LMCACHE_RELEASES
    from tests.conftest import ROOT

    carried = re.findall(r"^lmcache==(\S+)", (ROOT / "requirements-lmcache-parsers.txt")
                         .read_text(), re.M)
    assert carried and set(carried) <= set(LMCACHE_RELEASES)
    assert all(r.source for r in LMCACHE_RELEASES.values())
    assert H100.lmcache_release == "0.5.0" and H100.lmcache_rates.to_gpu_gbs == 28.0
    with pytest.raises(ValueError, match="no CPU<->GPU rates for LMCache 9.9"):
        _ = replace(H100, lmcache_release="9.9").lmcache_rates


def test_tp4_replicas_are_within_15_percent_of_published_runs_held_out():
    """vLLM's own latency runs (bench/data/published_tp.json): each build's TP 1 run fixes its
    host time per step, its TP 4 run is predicted within 15% with nothing fitted to it."""
    from bench import tp_check

    rows = tp_check.rows()
    assert {r["gpu"] for r in rows} >= {"H100", "H200", "A100-SXM4-80GB"}
    for r in rows:
        assert r["held_out"]["tp"] == 4 and r["fit"]["tp"] == 1
        assert r["ok"] and abs(r["ratio"] - 1) <= 0.15, (r["build"], r["ratio"])
    # the host time comes from the TP 1 run alone: the held-out figure moves nothing
    b = tp_check.published()["builds"][0]
    moved = {**b, "held_out": {**b["held_out"], "mean_latency_ms": 1.0}}
    assert tp_check.host_ms(moved) == tp_check.host_ms(b) > 0


def test_the_emulator_takes_every_dense_model_synth_knows_and_refuses_the_rest():
    """A profile may name any model config.models knows: the same shape as synth judges, in
    the emulator's terms (its own three agree with it); a mixture of experts is one line."""
    from bench.emulator import MODELS, emulator_model
    from config.models import KNOWN_MODELS, known_model

    for m in KNOWN_MODELS.values():
        if m.experts:
            with pytest.raises(ValueError, match=f"^model '{m.name}': .*dense layers only"):
                emulator_model(m.name)
            continue
        if m.name in MODELS:   # the emulator's own, checked below
            continue
        e = emulator_model(m.name)
        assert e.kv_bytes_per_token == m.kv_bytes_per_token and e.layers == m.layers
        assert e.params_b * 1e9 == pytest.approx(m.params)
        assert e.layer_params == pytest.approx(m.layers * m.layer_params)
        assert (e.q_dim or e.d_model) == m.q_dim
    for name, e in MODELS.items():
        m = known_model(name)
        assert e.kv_bytes_per_token == m.kv_bytes_per_token
        assert e.params_b * 1e9 == pytest.approx(m.params, rel=0.01)
    with pytest.raises(ValueError, match="^model 'acme-13b': a dense model of Llama"):
        emulator_model("acme-13b")
