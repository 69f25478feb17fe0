"""Dashboards as code: valid for the SDK's model, every query valid PromQL naming only
catalogue metrics, the panels the issue asks for, and cost from the environment's prices."""
from __future__ import annotations

import dataclasses
import json

import pytest
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.cog.plugins import register_default_plugins
from grafana_foundation_sdk.models import dashboard as dm
from grafana_foundation_sdk.models import prometheus as pm

from k8s.serving import load_endpoints
from observability.dashboards import SERVING_UID, build_dashboards, panel_queries
from observability.metrics import series_names
from observability.promql import metric_names
from tests.conftest import ROOT, Lazy, normalise

PANELS = [
    "Time to first token P50 / P90 / P99", "End-to-end latency P50 / P90 / P99",
    "Inter-token latency P50 / P90 / P99", "Prompt and generation tokens/s",
    "Requests running and waiting", "GPU KV-cache usage", "GPU prefix-cache hit rate",
    "L1 and L2 hit rates (LMCache)", "L2 read and write volume",
    "L2 get and put latency P50 / P90", "Router decisions per worker",
    "Router decisions per policy", "Worker health", "GPU utilisation", "GPU memory",
    "Cost per 1K tokens",
]


@pytest.fixture(scope="module")
def dashboards(synths):
    """name -> its dashboards, built on first use (not only those synthesized so far: a run
    narrowed by --environment has synthesized none of the samples these tests read)."""
    return Lazy(lambda name: build_dashboards(synths[name].cfg, load_endpoints(
        synths[name].cfg, ROOT)))


def _panels(dashboard: dict) -> dict[str, dict]:
    return {p["title"]: p for p in dashboard["panels"] if p["type"] != "row"}


@pytest.mark.parametrize("name", ["dev", "china"])
def test_dashboards_round_trip_through_the_sdk_model(dashboards, name):
    register_default_plugins()   # typed panel options and Prometheus queries on decode
    for dashboard in dashboards[name].values():
        model = dm.Dashboard.from_json(dashboard)
        again = json.loads(json.dumps(model, cls=JSONEncoder, sort_keys=True))
        assert again == dashboard
        targets = [t for p in model.panels if isinstance(p, dm.Panel) for t in p.targets]
        assert targets and all(isinstance(t, pm.Dataquery) for t in targets)


@pytest.mark.parametrize("name", ["dev", "china"])
def test_every_query_parses_and_names_only_catalogue_metrics(dashboards, name):
    known = series_names()
    queries = [q for d in dashboards[name].values() for q in panel_queries(d)]
    assert len(queries) > 30
    for title, expr in queries:
        names = metric_names(expr)       # raises on invalid PromQL
        assert names and names <= known, (title, names - known)


def test_the_issue_s_panels_are_there(dashboards):
    panels = _panels(dashboards["dev"][SERVING_UID])
    assert set(PANELS) <= set(panels)
    ids = [p["id"] for p in dashboards["dev"][SERVING_UID]["panels"]]
    assert len(ids) == len(set(ids))
    ttft = [t["expr"] for t in panels[PANELS[0]]["targets"]]
    assert [e.split(",")[0] for e in ttft] == ["histogram_quantile(0.5", "histogram_quantile(0.9",
                                              "histogram_quantile(0.99"]


@pytest.mark.parametrize("name,currency", [("dev", "USD"), ("china", "CNY")])
def test_cost_uses_the_environment_s_price_and_live_tokens(dashboards, synths, name, currency):
    """The price the plan counts (the region's table under the file's own), in the region's
    currency: dev's instanceHourlyUsd, China's CNY table."""
    cfg = synths[name].cfg
    (spec,) = load_endpoints(cfg, ROOT)   # g5.24xlarge, 1 of its 4 GPUs per pod
    price = cfg.prices().get(spec.instance_type)
    assert cfg.prices().currency == currency and price
    panel = _panels(dashboards[name][SERVING_UID])["Cost per 1K tokens"]
    (target,) = panel["targets"]
    expr = target["expr"]
    assert f"* {price * spec.gpus / 4:g} / 3600" in expr and expr.endswith("* 1000")
    assert (panel["fieldConfig"]["defaults"]["unit"] == "currencyUSD") == (currency == "USD")
    assert "vllm:prompt_tokens_total" in expr and "vllm:generation_tokens_total" in expr
    assert f'kvcache_endpoint="{spec.name}"' in expr


def test_an_instance_without_a_price_is_named_not_guessed(synths):
    cfg = synths["china"].cfg      # the CNY table prices no p5
    specs = tuple(dataclasses.replace(s, instance_type="p5.48xlarge")
                  for s in load_endpoints(cfg, ROOT))
    unpriced = cfg
    panel = _panels(build_dashboards(unpriced, specs)[SERVING_UID])["Cost per 1K tokens"]
    assert panel.get("targets") in (None, [])
    assert specs[0].name in panel["description"]


@pytest.mark.parametrize("name", ["dev", "china"])
def test_dashboard_snapshot(dashboards, name, snapshot):
    assert normalise(json.dumps(dashboards[name], indent=1, sort_keys=True)) == snapshot
