"""The tier configuration does no harm by construction: an L2 is deployed only where reading a
token's KV from it beats recomputing it with 2x to spare, from the model's shape, the GPU, the
connector the image's LMCache has and the network between them (k8s/l2.py), or where the file
forces it; L1 stores layer by layer, which LMCache allows only without an L2."""
from __future__ import annotations

import json
import math
import statistics

import pytest

from bench.emulator import PROFILES
from bench.tiers import RATES_FILE, pipelined, rendered_tiers
from config.instances import GPU_MODELS, GPU_SHAPES
from config.models import known_model, shape_from_config
from config.bandwidth import EC2_BASELINE_GBPS, IN_CLUSTER_NODE_TYPES, pod_nic_gbps
from k8s.l2 import (
    CONNECTORS, ELASTICACHE, IN_CLUSTER, MARGIN, REDIS, REDISS, RESP,
    SERVER_GET_GB_PER_CPU_S, SERVER_SET_GB_PER_CPU_S, VALKEY, break_even_gbs, choose_in_cluster,
    connector_for, elasticache_server, gpu_kv_gib, in_cluster_server, l2_verdict,
    node_hourly_usd, valkey_value_bytes,
)
from k8s.workers import TIER_POLICY, tier_settings
from observability.rules import L2_GETS_FAILED_TO_BYPASS


# the in-cluster L2's rules, for an image whose client passes the fault drill (conftest.py)
pytestmark = pytest.mark.usefixtures("sound_l2_client")


FIELD = "spec.kvCacheSpec.enableL2Cache"
TFLOPS = {gpu: t for gpu, t in GPU_MODELS.values()}


# The read rate per GPU an L2 must beat (GB/s at an 8K / 64K prefix, MFU 0.6): the table the
# L2's design rests on, re-derived from each model's config.json shape.
@pytest.mark.parametrize("model, gpu, at_8k, at_64k", [
    ("Llama-3.1-8B", "H100", 4.8, 2.5), ("Llama-3.1-8B", "A100", 1.5, 0.79),
    ("Llama-3.1-8B", "L40S", 1.8, 0.91), ("Llama-3.1-8B", "A10G", 0.34, 0.18),
    ("Qwen3-32B", "H100", 2.2, 1.2), ("Qwen3-32B", "A100", 0.69, 0.37),
    ("Qwen3-32B", "L40S", 0.80, 0.43), ("Qwen3-32B", "A10G", 0.15, 0.08),
    ("Llama-3.1-70B", "H100", 1.3, 0.87), ("Llama-3.1-70B", "A100", 0.42, 0.28),
    ("Llama-3.1-70B", "L40S", 0.48, 0.32), ("Llama-3.1-70B", "A10G", 0.09, 0.06)])
def test_the_break_even_read_rate_follows_from_the_model_and_the_gpu(model, gpu, at_8k, at_64k):
    m = known_model(model)
    assert break_even_gbs(m, TFLOPS[gpu], 8192) == pytest.approx(at_8k, rel=0.06)
    assert break_even_gbs(m, TFLOPS[gpu], 65536) == pytest.approx(at_64k, rel=0.06)


@pytest.mark.parametrize("name, params_b, kv", [
    ("Llama-3.1-8B", 8.03, 131072), ("Llama-3.1-70B", 70.6, 327680),
    ("Qwen3-32B", 32.8, 262144), ("Llama-3.2-3B", 3.21, 114688)])
def test_known_shapes_carry_the_published_sizes(name, params_b, kv):
    m = known_model(f"meta-llama/{name}-Instruct")
    assert m.params / 1e9 == pytest.approx(params_b, rel=0.01)
    assert m.kv_bytes_per_token == kv


def test_a_file_states_a_shape_with_config_json_keys():
    m = shape_from_config("x", {"hidden_size": 4096, "num_hidden_layers": 32,
                                "num_attention_heads": 32, "num_key_value_heads": 8,
                                "intermediate_size": 14336, "vocab_size": 128256})
    assert m.kv_bytes_per_token == known_model("llama-3.1-8b").kv_bytes_per_token
    assert m.params == known_model("llama-3.1-8b").params
    for bad, says in (({"hidden_size": 0}, "hidden_size"), ({"num_experts": 8}, "num_experts"),
                      ({"hiden_size": 1}, "hiden_size"), ({"kv_lora_rank": 512}, "latent")):
        with pytest.raises(ValueError, match=says):
            shape_from_config("x", {"num_hidden_layers": 1, "num_attention_heads": 1,
                                    "intermediate_size": 1, "vocab_size": 1,
                                    "hidden_size": 1, **bad})


def test_the_connector_follows_the_images_lmcache_and_the_l2():
    assert connector_for(IN_CLUSTER, (0, 5, 4), glide=False) is RESP
    assert connector_for(IN_CLUSTER, (0, 3, 7), glide=False) is REDIS   # no resp:// there
    assert connector_for(IN_CLUSTER, None, glide=False) is REDIS        # release unknown
    assert connector_for(ELASTICACHE, (0, 5, 4), glide=False) is REDISS   # TLS, one shard
    assert connector_for(ELASTICACHE, (0, 5, 4), glide=True) is VALKEY
    assert connector_for(ELASTICACHE, (0, 4, 6), glide=True) is REDISS    # before the sync pool
    assert RESP.tls is False and VALKEY.tls and VALKEY.cluster and not REDISS.cluster


def _row(label: str) -> dict:
    return json.loads(RATES_FILE.read_text())["clients"][label]["cells"]["llama-8b-tp4"]


@pytest.mark.parametrize("name", sorted(CONNECTORS))
def test_each_connectors_rates_are_the_ones_measured(name):
    """bench/lmcache_rates.py drove LMCache's own connector; the verdict reads its row."""
    c = CONNECTORS[name]
    cell = _row(c.measured)
    # rediss:// ran against Redis 7's own TLS (its server CPU bound the wall rate): the client's
    # one loop is what the verdict counts
    wall = cell["get_client_cpu_gbs_median"] if c.tls and not c.batched else cell[
        "get_gbs_median"]
    assert cell["connections"] * c.gbs_per_connection == pytest.approx(wall, rel=0.05)
    assert c.client_gb_per_cpu_s == pytest.approx(cell["get_client_cpu_gbs_median"], rel=0.05)


def test_valkeys_own_cost_is_the_median_over_every_run():
    rows = json.loads(RATES_FILE.read_text())["clients"]
    cells = [r["cells"]["llama-8b-tp4"] for r in rows.values()
             if r.get("server", "").startswith("Valkey") and "llama-8b-tp4" in r["cells"]]
    assert len(cells) >= 5
    assert SERVER_GET_GB_PER_CPU_S == pytest.approx(statistics.median(
        c["get_server_cpu_gbs_median"] for c in cells), abs=0.01)
    assert SERVER_SET_GB_PER_CPU_S == pytest.approx(statistics.median(
        c["set_server_cpu_gbs_median"] for c in cells), abs=0.01)


def test_the_verdict_is_the_least_term_against_twice_the_break_even():
    m = known_model("llama-3.1-8b")
    v = l2_verdict(instance_type="g5.24xlarge", model=m, ranks=4, replicas=4, connector=VALKEY,
                   server=elasticache_server("cache.r7g.large", 1), prefix_tokens=65536)
    assert v.deliver_gbs == min(t.gbs for t in v.terms) and v.binding.gbs == v.deliver_gbs
    assert v.pays is (v.deliver_gbs >= MARGIN * v.need_gbs)
    assert "cache.r7g.large" in v.binding.what   # one r7g.large shard: 0.94 Gbps for 16 GPUs
    assert not v.pays
    sharded = l2_verdict(instance_type="g5.24xlarge", model=m, ranks=4, replicas=4,
                         connector=VALKEY, server=elasticache_server("cache.r7g.4xlarge", 16),
                         prefix_tokens=65536)
    assert sharded.pays and 1 < sharded.shards <= 16   # the fewest that pay
    fewer = l2_verdict(instance_type="g5.24xlarge", model=m, ranks=4, replicas=4,
                       connector=VALKEY, server=elasticache_server("cache.r7g.4xlarge",
                                                                  sharded.shards - 1),
                       prefix_tokens=65536)
    assert not fewer.pays


@pytest.mark.parametrize("itype", sorted(GPU_SHAPES))
def test_every_gpu_type_is_judged_with_its_workers_nic(itype):
    """The NIC term is there on every type a file may serve, what a pod's TCP sustains over
    the node's GPUs (gr6, p3dn, p4de, p5.4xlarge, p5e, p5en and p6 once went without it; p4d,
    p5 and p6 were once judged on every network card's figure, EFA's included)."""
    v = l2_verdict(instance_type=itype, model=known_model("llama-3.1-8b"), ranks=1,
                   replicas=1, connector=RESP, server=None)
    nic = [t for t in v.terms if t.what.startswith(f"the worker's NIC ({itype}, ")]
    assert len(nic) == 1
    assert nic[0].gbs == pod_nic_gbps(itype) / 8 / GPU_SHAPES[itype].gpus
    assert ("network card 0" in nic[0].what) == (pod_nic_gbps(itype) < EC2_BASELINE_GBPS[itype])


@pytest.mark.parametrize("prefix", [8192, 65536])
def test_sharded_elasticache_cannot_feed_a_p5_pod_past_its_network_card(prefix):
    """Llama-3.1-70B at TP 8 on p5.48xlarge against ElastiCache (cache.r7g.16xlarge, up to 16
    shards, valkey://): on the instance's 3200 Gbps it paid with 4 shards at 64K (1.88 GB/s
    against a break-even of 0.87) and 6 at 8K (2.81 against 1.32), an ElastiCache the pod
    could not read at that rate. The pod rides network card 0, 100 Gbps over 8 GPUs: 1.56
    GB/s whatever the shards, under 2x the break-even at both lengths."""
    m = known_model("llama-3.1-70b")
    v = l2_verdict(instance_type="p5.48xlarge", model=m, ranks=8, replicas=1,
                   connector=VALKEY, server=elasticache_server("cache.r7g.16xlarge", 16),
                   prefix_tokens=prefix)
    assert not v.pays and v.shards == 16
    assert v.binding.what == ("the worker's NIC (p5.48xlarge, 100 Gbps: network card 0 of its "
                              "3200) over its 8 GPUs")
    assert v.deliver_gbs == pytest.approx(100 / 8 / 8)
    assert MARGIN * v.need_gbs > v.deliver_gbs > v.need_gbs   # it would break even: not 2x


def test_a_slow_nic_binds_the_verdict_and_the_timeout():
    """gr6.4xlarge sustains 10 Gbps (25 only as burst): 1.25 GB/s for its one L4, a quarter
    of what 8 flows carry, so the read of a 64K prefix must be given 4x as long."""
    m = known_model("llama-3.1-8b")
    v = l2_verdict(instance_type="gr6.4xlarge", model=m, ranks=1, replicas=1,
                   connector=RESP, server=None, prefix_tokens=65536)
    assert v.binding.what == "the worker's NIC (gr6.4xlarge, 10 Gbps) over its 1 GPUs"
    assert v.deliver_gbs == pytest.approx(1.25)
    assert v.blocking_timeout_s == math.ceil(MARGIN * 65536 * m.kv_bytes_per_token / 1.25e9)


def test_a_gpu_type_without_a_nic_baseline_fails_naming_it(monkeypatch):
    monkeypatch.delitem(EC2_BASELINE_GBPS, "p5en.48xlarge")
    with pytest.raises(LookupError, match=r"^p5en\.48xlarge: .*EC2_BASELINE_GBPS"):
        l2_verdict(instance_type="p5en.48xlarge", model=known_model("llama-3.1-70b"),
                   ranks=8, replicas=1, connector=RESP, server=None)


def test_an_unknown_gpu_keeps_what_the_file_asks():
    v = l2_verdict(instance_type="x9.large", model=known_model("llama-3.2-3b"), ranks=1, replicas=1,
                   connector=RESP, server=None)
    assert v.need_gbs is None and v.pays


@pytest.mark.parametrize("name", sorted(PROFILES))
def test_what_a_deployed_l2_delivers_beats_the_emulators_recompute(name):
    """The verdict recomputes at MFU 0.6 (the H100's measured at 8K: 0.59); the emulator's
    A10G and T4 are slower, its H100 and A100 (0.78 on the linear layers) up to ~25% faster.
    Either way an L2 the verdict deploys (2x its break-even) reads faster than the emulated
    GPU recomputes."""
    p = PROFILES[name]
    model = known_model(p.model.name)
    compute = p.prefill_seconds(8192) - p.frontend_seconds(8192)
    emulated = p.model.kv_bytes_per_token * 8192 / compute / p.gpus / 1e9
    need = break_even_gbs(model, TFLOPS[GPU_MODELS[p.instance_type.split(".")[0]][0]], 8192)
    assert emulated < MARGIN * need and emulated < 1.3 * need, (name, emulated, need)


def test_valkey_counts_a_chunk_as_jemalloc_allocates_it():
    """What `maxmemory` bounds per chunk, from a real server: Debian's Redis 7 with jemalloc 5.3
    (the allocator the Valkey 9 image builds with), for a rank's chunk of Llama-3.1-8B at TP 4
    (8 MiB: the next size class, 1.25x) and of Llama-3.1-70B at TP 8 (10 MiB: 1.2x). Counted
    between 4 and 8 keys, so the connection's own read buffer drops out."""
    import shutil

    import valkey

    from bench.tiers import ValkeyServer

    server = ValkeyServer()
    server.binary = shutil.which("redis-server")
    with server:
        c = valkey.Valkey(port=server.port)
        assert "jemalloc" in c.info("memory")["mem_allocator"]
        for size in (8 << 20, 10 << 20):
            c.flushall()
            value, used = b"\0" * size, []
            for n in (4, 8):
                for i in range(n - 4, n):
                    c.set(f"chunk-{i}", value)
                used.append(c.info("memory")["used_memory"])
            per_key = (used[1] - used[0]) / 4
            assert per_key == pytest.approx(valkey_value_bytes(size), rel=0.01), size
    assert valkey_value_bytes(8 << 20) / (8 << 20) == 1.25
    assert valkey_value_bytes(10 << 20) / (10 << 20) == 1.2


@pytest.mark.parametrize("name", sorted(PROFILES))
def test_the_fleet_is_counted_with_no_less_gpu_kv_than_vllm_holds(name):
    """F, what the fleet's GPUs and L1s hold, takes a replica's GPU KV from the GPU's nominal
    memory and the weights alone: no less than the emulator's vLLM holds (its measured memory,
    activations reserved), so the L2 is never sized smaller, and within 30% of it."""
    p = PROFILES[name]
    ours = gpu_kv_gib(p.instance_type, known_model(p.model.name), p.gpus)
    vllm = p.kv_tokens * p.model.kv_bytes_per_token / 2 ** 30
    assert vllm <= ours <= 1.3 * vllm, (name, ours, vllm)


def test_the_l2_holds_the_working_set_and_the_fleets_gpus_and_l1s_on_the_cheapest_node():
    """An inclusive L2 adds only what it holds beyond the fleet's GPU KV and L1s (F): it must
    hold the working set plus F, the working set taken as F where the file does not state it,
    in Valkey's own count of a chunk (1.25x for 8 MiB); the in-cluster Valkey gets the cheapest
    node on which it pays and holds that."""
    assert [n.hourly_usd for n in IN_CLUSTER_NODE_TYPES] == sorted(
        n.hourly_usd for n in IN_CLUSTER_NODE_TYPES)
    offered = frozenset(n.type for n in IN_CLUSTER_NODE_TYPES)
    args = dict(instance_type="g5.24xlarge", model=known_model("Llama-3.1-8B"), ranks=4,
                replicas=4, connector=RESP, prefix_tokens=65536, fleet_gib=600.0)
    default = choose_in_cluster(offered, None, **args)
    stated = choose_in_cluster(offered, None, working_set_gib=100.0, **args)
    assert default.capacity_gib == 1200 and stated.capacity_gib == 700
    for v in (default, stated):
        assert v.value_overhead == 1.25 and v.pays and v.holds
        assert v.kv_gib == pytest.approx(v.server.memory_gib / 1.25)
        price = node_hourly_usd(v.server.node_type)
        for n in IN_CLUSTER_NODE_TYPES:
            if n.hourly_usd < price:
                cheaper = l2_verdict(server=in_cluster_server(n.type, n.vcpus, n.gib), **args,
                                     working_set_gib=v.working_set_gib)
                assert not (cheaper.pays and cheaper.holds), n.type
    assert node_hourly_usd(stated.server.node_type) < node_hourly_usd(default.server.node_type)
    # an L2 the size of the fleet's L1s (the first rule's) would not hold it
    small = l2_verdict(server=in_cluster_server("x2idn.16xlarge", 64, 1024), **args)
    assert small.pays and not small.holds and "less than it must" in small.explain()


def test_the_l2s_size_and_price_are_said_and_a_working_set_the_fleet_holds_is_flagged():
    import copy

    import yaml

    from config import resolve_environment
    from config.endpoint_spec import parse_endpoint
    from k8s.serving import fit_endpoint, l2_plan
    from tests.conftest import ROOT, context_for

    cfg = resolve_environment(context_for(env="dev"))   # prices g5.24xlarge (instanceHourlyUsd)
    seed = yaml.safe_load((ROOT / "tests" / "fixtures" / "endpoint-seed.yaml").read_text())
    said = {}
    for working_set in (None, 1_000_000):
        raw = copy.deepcopy(seed)
        raw["spec"]["kvCacheSpec"].update(prefixTokens=65536, forceL2Cache=False)
        if working_set:
            raw["spec"]["kvCacheSpec"]["workingSetTokens"] = working_set
        raw["spec"]["kvCacheSpec"]["l2CacheSpec"]["l2CacheBackend"] = "valkey"
        spec = fit_endpoint(cfg, parse_endpoint(cfg.name, "endpoints/seed.yaml", raw))
        v = l2_plan(cfg, spec).verdict
        assert spec.l2_enabled and v.deploys
        (said[working_set],) = [w for w in spec.warnings if "workingSetTokens" in w]
        # no autoScalingSpec: the file's replicas are what runs, and what the L2 is priced for
        assert spec.autoscaling is None and v.replicas == spec.replicas
        n = spec.replicas   # one worker per g5.24xlarge (TP 4)
        node, fleet = v.server.node_type, n * cfg.instance_hourly_usd["g5.24xlarge"]
        assert f"on a {node} of its own, USD {node_hourly_usd(node):.2f}/h" in said[working_set]
        assert f"{node_hourly_usd(node) / fleet:.0%} of the {n} x g5.24xlarge" in said[working_set]
        assert f"for {n} replica(s) (spec.replicas, no autoScalingSpec" in said[working_set]
        assert f"{v.capacity_gib:,.0f} GiB" in said[working_set]
    assert "stays on one replica" not in said[None]
    assert "stays on one replica" in said[1_000_000]      # 122 GiB: the fleet's GPUs hold it


def test_docs_show_the_verdicts_as_synth_makes_them():
    import re

    from bench.tiered import l2_verdict_table
    from tests.conftest import ROOT

    doc = (ROOT / "docs" / "serving.md").read_text()
    block = re.search(r"<!-- l2-verdicts:begin[^>]*-->\n(.*?)\n<!-- l2-verdicts:end -->", doc,
                      re.S)
    assert block and block.group(1) == l2_verdict_table()


def test_an_h100_8b_file_asking_for_l2_gets_layerwise_l1_and_one_warning():
    r = rendered_tiers("valkey", instance_type="p5.48xlarge", gpus=1, replicas=4)
    assert "remote_url" not in r.lmcache and r.l2_url is None
    assert r.l2_capacity_gib is None                     # no Valkey deployed for it
    assert r.lmcache["use_layerwise"] is True and r.lmcache["local_cpu"] is True
    said = [w for w in r.warnings if FIELD in w]
    assert len(said) == 1 and "p5.48xlarge (H100)" in said[0] and "forceL2Cache" in said[0]
    for term in ("client", "TCP flows", "NIC", "sustained network", "server's CPU"):
        assert term in said[0], term


def test_forcing_the_l2_deploys_it_and_drops_layerwise():
    r = rendered_tiers("valkey", instance_type="p5.48xlarge", gpus=1, force_l2=True)
    assert r.lmcache["remote_url"].startswith("resp://") and r.l2_capacity_gib > 0
    assert "use_layerwise" not in r.lmcache
    assert not [w for w in r.warnings if FIELD in w]


def test_a10g_replicas_on_64k_documents_get_their_l2_by_resp():
    """g5.24xlarge, TP 4, 4 replicas, Llama-3.1-8B at a 64K prefix: the in-cluster Valkey on a
    node whose network carries 16 GPUs at twice the break-even, read by LMCache's C++ client;
    a whole batched retrieve of the prefix gets a timeout it can meet."""
    r = rendered_tiers("valkey", instance_type="g5.24xlarge", gpus=4, replicas=4,
                       prefix_tokens=65536)
    assert r.lmcache["remote_url"].startswith("resp://kvcache-valkey.")
    assert r.lmcache["extra_config"]["save_chunk_meta"] is False
    assert "use_layerwise" not in r.lmcache
    v = r.verdict
    assert v.deploys and v.deliver_gbs >= MARGIN * v.need_gbs
    rank_bytes = 65536 * v.model.kv_bytes_per_token / 4
    assert r.lmcache["blocking_timeout_secs"] * v.deliver_gbs * 1e9 >= rank_bytes
    # it keeps twice the fleet's GPU KV and L1s, in Valkey's own count of a chunk
    assert v.capacity_gib == pytest.approx(2 * v.fleet_gib)
    assert r.l2_capacity_gib / v.value_overhead >= v.capacity_gib


def test_a100_replicas_of_a_70b_model_get_no_l2_and_say_why():
    """4 x p4d.24xlarge, Llama-3.1-70B TP 8: 32 GPUs reading at once outrun the largest node
    the in-cluster Valkey can have (100 Gbps), even at a 64K prefix."""
    r = rendered_tiers("valkey", instance_type="p4d.24xlarge", gpus=8, replicas=4,
                       prefix_tokens=65536, model="Llama-3.1-70B-Instruct")
    said = [w for w in r.warnings if FIELD in w]
    assert "remote_url" not in r.lmcache and len(said) == 1
    assert "4 replica(s) x 8 GPU(s)" in said[0] and "Llama-3.1-70B" in said[0]
    assert "x2iedn.32xlarge, 100 Gbps" in said[0]   # the fastest node that holds it


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


def test_endpoints_sharing_the_in_cluster_valkey_are_told_when_together_it_is_too_small(
        tmp_path):
    """Each verdict counts its own fleet; two fleets on the one in-cluster Valkey share it."""
    import copy

    import yaml

    from config import resolve_environment
    from k8s.serving import load_endpoints
    from tests.conftest import ROOT, context_for

    seed = yaml.safe_load((ROOT / "tests" / "fixtures" / "endpoint-seed.yaml").read_text())
    ctx = context_for(env="dev")
    names = []
    for name in ("doc-a", "doc-b"):
        raw = copy.deepcopy(seed)
        raw["metadata"]["name"] = name
        raw["spec"]["kvCacheSpec"].update(prefixTokens=65536, forceL2Cache=False)
        raw["spec"]["kvCacheSpec"]["l2CacheSpec"]["l2CacheBackend"] = "valkey"
        raw["spec"]["autoScalingSpec"] = {"minReplicaCount": 2, "maxReplicaCount": 2}
        (tmp_path / f"{name}.yaml").write_text(yaml.safe_dump(raw))
        names.append(f"{name}.yaml")
    ctx["environments"]["dev"]["endpoints"] = names
    cfg = resolve_environment(ctx)
    alone = load_endpoints(cfg, tmp_path)
    assert all(s.l2_enabled for s in alone)
    assert not [w for s in alone for w in s.warnings if "shared by 2 endpoints" in w]
    # a node that carries and holds each fleet alone, not both: 8 GiB of L1 per replica and a
    # stated working set of 100K tokens keep each one's L2 within an r6i.16xlarge
    for name in names:
        raw = yaml.safe_load((tmp_path / name).read_text())
        raw["spec"]["kvCacheSpec"].update(l1CacheSizeGiB=8, workingSetTokens=100_000)
        (tmp_path / name).write_text(yaml.safe_dump(raw))
    ctx["environments"]["dev"]["cache"]["inClusterNodeType"] = "r6i.16xlarge"
    pinned = load_endpoints(resolve_environment(ctx), tmp_path)
    assert all(s.l2_enabled for s in pinned)
    shared = [w for s in pinned for w in s.warnings if "shared by 2 endpoints" in w]
    network = [w for w in shared if "GB/s each" in w]
    memory = [w for w in shared if "together must hold" in w]
    assert len(network) == 2 and len(memory) == 2 and "r6i.16xlarge" in shared[0]
