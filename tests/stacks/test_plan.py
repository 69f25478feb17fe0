"""The plan synth ends with (stacks/plan.py): every node group and endpoint the app deploys,
the L2 each gets and why, the load balancers, and the hourly cost in the region's currency
from prices with a source; a dropped L2 counted as a change to the request."""
from __future__ import annotations

import copy

import pytest
import yaml

from config import ConfigError, resolve_environment
from config.endpoint_spec import parse_endpoint
from config.notices import CHANGED, kind_of
from config.prices import EKS_CLUSTER, NLB, region_currency
from k8s.serving import fit_endpoint, in_cluster_node, l2_plan, load_endpoints
from stacks.plan import plan_text
from tests.k8s.test_charts import worker_on
from tests.conftest import DECLARED, ENVIRONMENTS, ROOT, context_for, resources

SEED = yaml.safe_load((ROOT / "tests" / "fixtures" / "endpoint-seed.yaml").read_text())


def _context(name: str, **fields) -> dict:
    """The context selecting declared environment `name`, its file's fields replaced."""
    ctx = copy.deepcopy({**context_for(), **DECLARED[name]})
    env = ctx["environments"][DECLARED[name]["env"]]
    env.update(fields)
    env.get("chinaVariant", {}).update(fields)
    return ctx


@pytest.mark.parametrize("name", ENVIRONMENTS)
def test_the_plan_lists_every_node_group_and_endpoint_of_the_app(synths, name):
    s = synths[name]
    plan = plan_text(s.cfg, load_endpoints(s.cfg, ROOT))
    lines = plan.splitlines()
    groups = [g for t in s.templates.values() for g in resources(t, "AWS::EKS::Nodegroup").values()]
    assert sum(" / desired " in line for line in lines) == len(groups)
    for g in groups:
        p = g["Properties"]
        size = p["ScalingConfig"]
        want = (f"min {size['MinSize']} / desired {size['DesiredSize']} / "
                f"max {size['MaxSize']}")
        assert any(want in line and all(t in line for t in p["InstanceTypes"])
                   for line in lines), (want, p["InstanceTypes"], plan)
    routers = [o for chart in s.stacks.serving.charts for o in chart.to_json()
               if o["kind"] == "Service" and o["spec"].get("type") == "LoadBalancer"]
    assert routers and sum(line.startswith("  endpoint ") for line in lines) == len(routers)
    for svc in routers:
        scheme = svc["metadata"]["annotations"][
            "service.beta.kubernetes.io/aws-load-balancer-scheme"]
        port = svc["spec"]["ports"][0]["port"]
        assert any(f"NLB {scheme} " in line and f"port {port}," in line for line in lines)
    caches = [r for t in s.templates.values()
              for r in resources(t, "AWS::ElastiCache::ReplicationGroup").values()]
    assert ("  ElastiCache: " in plan) == bool(caches)
    has_cache_stack = f"{s.cfg.stack_prefix}-Cache" in s.templates
    assert ("  L2 node: none" in plan) == (not has_cache_stack)
    currency = region_currency(s.cfg.region)
    assert f"on demand in {currency}" in plan and "prices: " in lines[-1]


def test_china_costs_are_in_cny_from_the_environments_own_prices():
    name = _a_china_environment()
    cfg = resolve_environment(_context(name))
    endpoints = load_endpoints(cfg, ROOT)
    unpriced = plan_text(cfg, endpoints)
    assert "on demand in CNY" in unpriced and "$" not in unpriced and "USD" not in unpriced
    # every type the plan names, priced in CNY by the environment: the total is their sum
    types = {t for g in (cfg.system_nodes, *cfg.gpu_node_groups) for t in g.instance_types}
    hourly = {t: 10.0 + i for i, t in enumerate(sorted(types))}
    hourly.update({EKS_CLUSTER: 0.5, NLB: 0.25})
    cfg = resolve_environment(_context(name, instancePrices={
        "currency": "CNY", "hourly": hourly, "source": "our contract, 2026-11"}))
    plan = plan_text(cfg, load_endpoints(cfg, ROOT))
    desired = (sum(hourly[g.instance_types[0]] * g.desired_size
                   for g in (cfg.system_nodes, *cfg.gpu_node_groups))
               + 0.5 + 0.25 * len(endpoints))
    assert f"on demand in CNY: {desired:,.2f} at the node groups' desired sizes" in plan
    assert "our contract, 2026-11 (instancePrices)" in plan and "unknown" not in plan


@pytest.mark.parametrize("prices, field", [
    ({"currency": "USD", "hourly": {"g5.24xlarge": 1}}, "instancePrices.currency"),
    ({"currency": "CNY", "hourly": {"g5.24xlarge": -1}}, "instancePrices.hourly.g5.24xlarge"),
    ({"currency": "CNY", "hourly": {"G5": 1}}, "instancePrices.hourly"),
    ({"currency": "CNY", "hourly": {}, "sauce": "x"}, "instancePrices.sauce"),
])
def test_instance_prices_are_the_regions_currency_and_positive(prices, field):
    name = _a_china_environment()
    with pytest.raises(ConfigError) as err:
        resolve_environment(_context(name, instancePrices=prices))
    assert err.value.field == field and "\n" not in str(err.value)


def _a_china_environment() -> str:
    """A declared China environment (the China sample at least), whatever --environment
    narrows the per-environment gates to: these tests are about CNY, not one environment."""
    return next(n for n in sorted(DECLARED)
                if resolve_environment(_context(n)).region.startswith("cn-"))


def _asking_l2(model: str, instance_type: str, force: bool, cache_kind: str) -> dict:
    """The seed asking for an L2 the environment can serve: its shared cache (redis), or,
    where `cache.kind` is none (which refuses redis), the in-cluster Valkey; on as many of
    the type's GPUs as the seed's 4 or fewer, with a share of its CPU and memory."""
    raw = copy.deepcopy(SEED)
    raw["spec"].update(modelName=model)
    raw["spec"]["kvCacheSpec"].update(enableL2Cache=True, forceL2Cache=force)
    if cache_kind == "none":
        raw["spec"]["kvCacheSpec"]["l2CacheSpec"]["l2CacheBackend"] = "valkey"
    return worker_on(raw, instance_type, cpu=40, memory_gib=160)


@pytest.mark.parametrize("name", ENVIRONMENTS)
@pytest.mark.parametrize("model", ["meta-llama/Llama-3.1-8B-Instruct",
                                   "Qwen/Qwen2.5-32B-Instruct"])
@pytest.mark.parametrize("force", [False, True])
def test_an_l2_asked_for_and_not_deployed_is_a_change_to_the_request(name, model, force):
    cfg = resolve_environment(_context(name))
    itype = cfg.gpu_node_groups[0].instance_types[0]
    spec = fit_endpoint(cfg, parse_endpoint(cfg.name, "endpoints/e.yaml",
                                            _asking_l2(model, itype, force,
                                                       cfg.cache.kind)))
    changes = [w for w in spec.warnings if kind_of(w) == CHANGED and ".kvCacheSpec." in w]
    plan = plan_text(cfg, (spec,))
    if l2_plan(cfg, spec) is None:
        assert changes and "L2: none: dropped" in plan
    else:
        assert "L2: none" not in plan and "GB/s per GPU" in plan
        assert ("forceL2Cache" in plan) == force


def test_every_price_table_has_a_source_a_date_and_its_regions_currency():
    from config.prices import TABLES
    for region, table in TABLES.items():
        assert table.currency == region_currency(region) and table.source and table.date
        assert table.hourly and all(v > 0 for v in table.hourly.values()), region


def test_the_cny_tables_are_cny_not_usd():
    """A CNY table holding USD figures (or fen) would price China 7x too low (or 100x too
    high): every type both tables know costs 4 to 20 times its us-east-1 USD figure."""
    from config.prices import TABLES
    usd = TABLES["us-east-1"].hourly
    for region in ("cn-north-1", "cn-northwest-1"):
        shared = set(TABLES[region].hourly) & set(usd) - {EKS_CLUSTER, NLB}
        assert len(shared) >= 10, region
        for t in shared:
            assert 4 < TABLES[region].hourly[t] / usd[t] < 20, (region, t)


def test_a_china_plan_counts_the_kept_cny_table_and_names_what_it_lacks():
    from config.prices import price_table
    for name in ENVIRONMENTS:
        cfg = resolve_environment(_context(name))
        if not cfg.region.startswith("cn-") or cfg.instance_prices is not None:
            continue
        endpoints = load_endpoints(cfg, ROOT)
        plan = plan_text(cfg, endpoints)
        table = price_table(cfg.region).hourly
        groups = (cfg.system_nodes, *cfg.gpu_node_groups)
        known = sum(table[g.instance_types[0]] * g.desired_size for g in groups
                    if g.instance_types[0] in table)
        node = in_cluster_node(cfg, endpoints)
        known += table.get(node.node_type, 0.0) if node is not None else 0.0
        assert known > 0 and f"on demand in CNY: at least {known:,.2f}" in plan, plan
        lacking = plan.split("no CNY price for ", 1)[1].split(":", 1)[0].split(", ")
        assert {EKS_CLUSTER, NLB} <= set(lacking) and not set(lacking) & set(table), lacking
        assert "prices: " + ("cn-north-1's (none kept" if cfg.region != "cn-north-1"
                             else "AWS Price List API") in plan


def test_a_redis_l2_where_cache_kind_is_none_is_one_line_naming_the_backend():
    """What the L2 test above steers around: with no shared cache, a `redis` L2 (which
    needs one) is refused, naming the field and what the environment can serve."""
    name = ENVIRONMENTS[0]
    cfg = resolve_environment(_context(name, cache={"kind": "none"}))
    raw = _asking_l2("meta-llama/Llama-3.1-8B-Instruct",
                     cfg.gpu_node_groups[0].instance_types[0], True, "elasticache")
    with pytest.raises(ConfigError) as err:
        fit_endpoint(cfg, parse_endpoint(cfg.name, "endpoints/e.yaml", raw))
    assert err.value.field.endswith("kvCacheSpec.l2CacheSpec.l2CacheBackend")
    assert "valkey" in str(err.value) and "\n" not in str(err.value)
