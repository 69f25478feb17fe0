"""The metric catalogue: names as the pinned images export them, nothing deprecated."""
from __future__ import annotations

import re

from observability.metrics import (
    CATALOGUE, COUNTER, DEPRECATED, GAUGE, HISTOGRAM, known_sources, metric_of, series_names,
)


def test_every_metric_has_a_known_source_and_type():
    for metric in CATALOGUE.values():
        assert metric.source in known_sources(), metric
        assert metric.type in (COUNTER, GAUGE, HISTOGRAM), metric


def test_names_follow_each_exporters_conventions():
    for m in CATALOGUE.values():
        if m.type == HISTOGRAM:   # the base name; _bucket/_sum/_count are the series
            assert not re.search(r"_(bucket|sum|count|total)$", m.name), m.name
        if m.type == COUNTER and m.source != "dcgm-exporter":
            assert m.name.endswith("_total"), m.name  # prometheus_client and metrics-rs
        if m.name.startswith(("vllm:", "lmcache:")):
            assert m.source == "vllm-lmcache"
        if m.name.startswith("vllm_router_"):
            assert m.source == "vllm-router"
        if m.name.startswith("smg_"):
            assert m.source == "sglang-router"


def test_every_router_meaning_is_catalogued_under_each_routers_own_name():
    from observability.metrics import ROUTER_METRIC_PREFIX, ROUTER_METRICS

    for meaning, names in ROUTER_METRICS.items():
        assert len(names) == len(ROUTER_METRIC_PREFIX) == 2, meaning
        for name, (source, prefix) in zip(names, ROUTER_METRIC_PREFIX.items()):
            assert CATALOGUE[name].source == source and name.startswith(prefix), name
        assert len({CATALOGUE[n].type for n in names}) == 1, names


def test_no_deprecated_vllm_name_is_catalogued():
    assert not DEPRECATED & series_names()
    assert not any(":gpu_" in name for name in series_names())
    assert "vllm:inter_token_latency_seconds" in CATALOGUE   # renamed from time_per_output_token


def test_series_map_back_to_their_metric():
    assert metric_of("vllm:time_to_first_token_seconds_bucket").type == HISTOGRAM
    assert metric_of("vllm:prompt_tokens_total").name == "vllm:prompt_tokens_total"
    assert metric_of("vllm:gpu_cache_usage_perc") is None
