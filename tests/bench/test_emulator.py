"""The GPU emulator behind the benchmark's workers: memory and step arithmetic, batching and the
LRU bound. Counts and formulas, never timings (the engine runs at a tiny time scale)."""
from __future__ import annotations

from dataclasses import replace

import pytest

from bench.emulator import LLAMA_31_70B, LLAMA_31_8B, PROFILES, Engine, profile
from bench.fake_worker import FakeWorker, PrefixCache

G5 = PROFILES["g5.24xlarge"]


def test_kv_bytes_per_token_follow_the_model_shape():
    # 2 (K and V) x layers x KV heads x head dim x 2 bytes (BF16)
    assert LLAMA_31_8B.kv_bytes_per_token == 2 * 32 * 8 * 128 * 2 == 131_072
    assert LLAMA_31_70B.kv_bytes_per_token == 2 * 80 * 8 * 128 * 2 == 327_680


def test_kv_capacity_is_what_is_left_of_the_memory_after_the_weights():
    expected = (4 * 24e9 * 0.9 - 8.03e9 * 2 - 4 * 2e9) // 131_072
    assert G5.kv_tokens == int(expected)
    assert 400_000 < G5.kv_tokens < 600_000  # "roughly 0.5M KV tokens per replica"
    # a 70B model on 8 x H100 80 GB holds more than on 8 x A100 40 GB
    assert PROFILES["p5.48xlarge"].kv_tokens > 3 * PROFILES["p4d.24xlarge"].kv_tokens
    with pytest.raises(ValueError, match="does not fit"):
        _ = replace(G5, model=LLAMA_31_70B).kv_tokens


def test_prefill_flops_add_up_over_chunks_and_grow_quadratically():
    full = G5.prefill_flops(0, 65536)
    assert full == pytest.approx(G5.prefill_flops(0, 8192) + G5.prefill_flops(8192, 57344))
    linear = 2 * 8.03e9 * 65536
    assert full - linear == pytest.approx(2 * 32 * 4096 * 65536 ** 2)


def test_decode_is_memory_bound_and_prefill_compute_bound():
    overhead = G5.step_overhead_ms / 1e3
    assert G5.decode_seconds(0) == pytest.approx(LLAMA_31_8B.weight_bytes / G5.bytes_per_s
                                                 + overhead)
    assert G5.step_seconds((), [(0, 8192)]) == pytest.approx(
        G5.prefill_flops(0, 8192) / G5.flops_per_s + overhead)
    # batching decode is nearly free; a cached prefix is nearly free
    assert G5.decode_seconds(2048, 32) < 2 * G5.decode_seconds(2048, 1)
    assert G5.prefill_seconds(8192, cached=8176) < G5.prefill_seconds(8192) / 50


def test_render_cost_is_fixed_plus_per_token():
    assert G5.render_seconds(8192) == pytest.approx(1e-3 + 1.5e-6 * 8192)


def test_unknown_profile_names_the_known_ones():
    with pytest.raises(ValueError, match="unknown GPU profile 'x'; known: g5.24xlarge"):
        profile("x")


def test_engine_batches_sequences_into_shared_steps():
    engine = Engine(G5, time_scale=1e-4)
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
    engine = Engine(G5, time_scale=1e-4)
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
