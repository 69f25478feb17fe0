"""The tier configuration does no harm by construction (issue 17): an L2 is deployed only where
reading a token's KV from it can beat recomputing it on the served GPU (or where the file
forces it), and L1 stores layer by layer beside the forward, which LMCache allows only
without an L2. The decision is made at synth time from what is known there (the instance
type) and what was measured (LMCache's Redis client), and the emulator agrees with it."""
from __future__ import annotations

import json
import statistics

import pytest

from bench.emulator import PROFILES
from bench.tiers import RATES_FILE, pipelined, redis_rates, rendered_tiers
from config.instances import GPU_MODELS
from k8s.workers import (
    L2_READ_GBS_PER_RANK, L2_SERVER_GBS, L2_SERVER_READ_SHARE, TIER_POLICY, l2_verdict,
    tier_settings,
)
from observability.rules import L2_GETS_FAILED_TO_BYPASS

FIELD = "spec.kvCacheSpec.enableL2Cache"


@pytest.mark.parametrize("family, pays", [
    ("g4dn", True), ("g5", True), ("g6", False), ("g6e", False), ("p3", False),
    ("p4d", False), ("p5", False)])
def test_an_l2_is_allowed_only_on_gpus_slower_than_the_redis_client(family, pays):
    v = l2_verdict(f"{family}.12xlarge")
    assert v.gpu == GPU_MODELS[family][0] and v.pays is pays
    assert (v.read_us < v.recompute_us) is pays


@pytest.mark.parametrize("instance_type, ranks, replicas, pays", [
    ("g5.xlarge", 1, 1, True), ("g5.xlarge", 1, 2, False), ("g4dn.xlarge", 1, 1, True),
    ("g4dn.xlarge", 1, 2, False), ("g5.24xlarge", 4, 1, False), ("g5.24xlarge", 4, 4, False)])
def test_replicas_and_ranks_share_one_l2_server(instance_type, ranks, replicas, pays):
    """Four ranks outread one Valkey thread, and replicas split it: the A10G's L2 pays only
    where few single-GPU replicas share it (the first verdict let g5.24xlarge TP 4 have one;
    the emulator found it slower at every load). An L2 shared by two replicas pays nowhere."""
    v = l2_verdict(instance_type, ranks, replicas)
    assert v.pays is pays, v
    assert v.read_gbs == pytest.approx(min(ranks * L2_READ_GBS_PER_RANK,
                                           L2_SERVER_GBS * L2_SERVER_READ_SHARE / replicas))


def test_an_unknown_gpu_keeps_what_the_file_asks():
    assert l2_verdict("x9.large").pays


def test_the_read_rate_is_the_one_measured_for_lmcaches_client():
    """LMCache's redis:// client as the images run it (redis.asyncio, no hiredis), for the
    8-10 MB chunks of a tensor-parallel rank: bench/data/lmcache_rates.json."""
    cells = json.loads(RATES_FILE.read_text())["clients"]["redis-py-pure"]["cells"]
    rates = [c["get_gbs_median"] for c in cells.values()
             if c["mode"] == "asyncio" and 8e6 < c["value_bytes"] < 11e6]
    assert len(rates) == 2
    assert L2_READ_GBS_PER_RANK == round(statistics.median(rates), 2)
    server = [c["get_server_cpu_gbs_median"] for c in cells.values()
              if c["mode"] == "asyncio" and 8e6 < c["value_bytes"] < 11e6]
    assert L2_SERVER_GBS == round(statistics.median(server), 2)


@pytest.mark.parametrize("replicas", [1, 4])
@pytest.mark.parametrize("name", sorted(PROFILES))
def test_the_synth_time_choice_agrees_with_the_emulator(name, replicas):
    """Where k8s deploys an L2, the emulator (its model, TP, and the measured client and
    server rates for that chunk size) reads a token faster than it recomputes one, and where
    it does not, slower."""
    p = PROFILES[name]
    recompute = (p.prefill_seconds(8192) - p.frontend_seconds(8192)) / 8192
    _, get, server = redis_rates(256 * p.model.kv_bytes_per_token // p.gpus)
    gbs = min(p.gpus * get, server * L2_SERVER_READ_SHARE / replicas)
    read = p.model.kv_bytes_per_token / (gbs * 1e9)
    assert l2_verdict(p.instance_type, p.gpus, replicas).pays is (read < recompute), (
        name, read, recompute)


def test_an_h100_file_asking_for_l2_gets_layerwise_l1_and_one_warning():
    r = rendered_tiers("valkey", instance_type="p5.48xlarge", gpus=1)
    assert "remote_url" not in r.lmcache and r.l2_url is None
    assert r.l2_capacity_gib is None                     # no Valkey deployed for it
    assert r.lmcache["use_layerwise"] is True and r.lmcache["local_cpu"] is True
    said = [w for w in r.warnings if FIELD in w]
    assert len(said) == 1 and "p5.48xlarge (H100)" in said[0] and "forceL2Cache" in said[0]


def test_forcing_the_l2_deploys_it_and_drops_layerwise():
    r = rendered_tiers("valkey", instance_type="p5.48xlarge", gpus=1, force_l2=True)
    assert r.lmcache["remote_url"].startswith("redis://") and r.l2_capacity_gib > 0
    assert "use_layerwise" not in r.lmcache
    assert not [w for w in r.warnings if FIELD in w]


def test_a_single_gpu_a10g_file_gets_its_l2_without_layerwise():
    r = rendered_tiers("valkey", instance_type="g5.xlarge", gpus=1, replicas=1)
    assert r.lmcache["remote_url"].startswith("redis://")
    assert "use_layerwise" not in r.lmcache
    assert not [w for w in r.warnings if FIELD in w]


def test_the_seeds_shape_gets_no_l2_unless_forced_and_says_why():
    """g5.24xlarge, TP 4, 2 replicas: each replica's share of one L2 server is slower than
    its four GPUs recompute."""
    r = rendered_tiers("valkey")
    assert "remote_url" not in r.lmcache and r.lmcache["use_layerwise"] is True
    said = [w for w in r.warnings if FIELD in w]
    assert len(said) == 1 and "2 replica(s)" in said[0] and "g5.24xlarge (A10G)" in said[0]


def test_layerwise_is_rendered_by_every_release_we_know_but_never_beside_an_l2():
    setting = next(t for t in TIER_POLICY if t.key == "use_layerwise")
    assert setting.l1_only and not setting.l2_only
    for version in ((0, 3, 7), (0, 5, 4), None):
        assert tier_settings(version, False)["use_layerwise"] is True
        assert "use_layerwise" not in tier_settings(version, True)


def test_a_layerwise_store_costs_one_layer_when_the_forward_hides_the_rest():
    """8K tokens of an 8B model on one H100: the synchronous store the step used to wait for
    (~43 ms at 25 GB/s, +19% on a 228 ms prefill) becomes the last layer's copy."""
    h = PROFILES["h100-8b"]
    store = h.kv_transfer_seconds(8192, to_gpu=False)
    compute = h.prefill_seconds(8192) - h.frontend_seconds(8192)
    assert store / compute > 0.15
    assert pipelined(store, compute, h.model.layers) == pytest.approx(store / 32)
    assert pipelined(store, compute, h.model.layers) < 0.01 * compute
    assert pipelined(2.0, 1.0, 32) == pytest.approx(2.0 / 32 + 1.0)   # copy-bound: the excess


def test_the_l2_alert_counts_what_makes_lmcache_take_l2_out():
    extra = next(t for t in TIER_POLICY if t.key == "extra_config").value
    assert extra["get_blocking_failed_threshold"] == L2_GETS_FAILED_TO_BYPASS
