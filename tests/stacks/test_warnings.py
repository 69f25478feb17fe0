"""Synth warnings sorted by what they mean (config/notices.py): a change to the request has an
id of its own that the environment file can acknowledge; ignored fields and advice share
theirs; synth ends with a summary line."""
from __future__ import annotations

import copy

import pytest

from config import ConfigError, resolve_environment
from config.endpoint_spec import parse_endpoint
from config.notices import CHANGED, CHECK, IGNORED, ack_id, kind_of
from k8s.serving import fit_endpoint, load_endpoints
from stacks.app_builder import annotate, notices, warning_summary
from tests.conftest import ROOT, context_for
from tests.k8s.test_charts import SEED, _env


def _seed(cfg, **spec):
    raw = copy.deepcopy(SEED)
    raw["spec"].update(spec)
    return fit_endpoint(cfg, parse_endpoint(cfg.name, "endpoints/seed.yaml", raw,
                                            instance_type_map=dict(cfg.instance_type_map),
                                            node_instance_types=tuple(
                                                t for g in cfg.gpu_node_groups
                                                for t in g.instance_types)))


def test_each_change_to_the_request_has_its_own_id():
    cfg = _env("dev")
    spec = _seed(cfg, kvCacheSpec={"enableL1Cache": True, "enableL2Cache": True,
                                   "l2CacheSpec": {"l2CacheBackend": "redis"}})
    changes = {ack_id(w): w for w in spec.warnings if kind_of(w) == CHANGED}
    # g5.24xlarge: the L2 would not pay, so it is not deployed: a change, with how to force it
    l2 = changes[f"kvcache:changed:{spec.name}:kvCacheSpec.enableL2Cache"]
    assert "no L2 is deployed" in l2 and "forceL2Cache" in l2
    assert not spec.l2_enabled
    published = load_endpoints(cfg, ROOT)[0]
    kinds = {kind_of(w) for w in published.warnings}
    assert IGNORED in kinds and all(ack_id(w) == "kvcache:ignored" for w in published.warnings
                                    if kind_of(w) == IGNORED)


@pytest.mark.usefixtures("sound_l2_client")
def test_a_self_hosted_cache_no_endpoint_uses_is_said_not_dropped_silently():
    cfg = _env("dev", cache={"kind": "self-hosted"})
    said = [w for w in notices(cfg, load_endpoints(cfg, ROOT))
            if ack_id(w) == "kvcache:changed:environment:cache.kind"]
    assert len(said) == 1 and "no in-cluster Valkey is deployed" in said[0]
    used = _seed(cfg, kvCacheSpec={"enableL1Cache": True, "enableL2Cache": True,
                                   "forceL2Cache": True,
                                   "l2CacheSpec": {"l2CacheBackend": "valkey"}})
    assert not [w for w in notices(cfg, (used,)) if "cache.kind" in ack_id(w)]


def test_acknowledged_warnings_are_not_printed_and_the_summary_counts_them(tmp_path):
    import aws_cdk as cdk

    cfg = _env("dev", cache={"kind": "self-hosted"},
               acknowledgedWarnings=["kvcache:changed:environment:cache.kind"])
    warnings = notices(cfg, load_endpoints(cfg, ROOT))
    app = cdk.App(outdir=str(tmp_path))
    stack = cdk.Stack(app, "S")
    cdk.CfnWaitConditionHandle(stack, "H")
    annotate(stack, warnings, cfg.acknowledged_warnings)
    printed = [m.entry.data for m in app.synth().get_stack_by_name("S").messages]
    assert len(printed) == len(warnings) - 1
    assert not any("cache.kind" in str(p) for p in printed)
    assert all("[ack: kvcache:" in str(p) for p in printed)   # each says how to acknowledge
    line = warning_summary(cfg, warnings)
    ignored = sum(kind_of(w) == IGNORED for w in warnings)
    check = sum(kind_of(w) == CHECK for w in warnings)
    # the sample's ml.g5.8xlarge served on g5.24xlarge (instanceTypeMap) is still open
    assert line.startswith(f"kvcache: 1 change(s) to your request, {ignored} field(s) "
                           f"ignored, {check} to check; 1 acknowledged. Changed: "
                           "kvcache:changed:llama-8b-intel-routing:instanceType: accept")


def test_an_acknowledgement_is_an_id_synth_prints():
    ctx = context_for(env="dev")
    ctx["environments"]["dev"]["acknowledgedWarnings"] = ["the L2 one"]
    with pytest.raises(ConfigError) as info:
        resolve_environment(ctx)
    assert info.value.field == "acknowledgedWarnings[0]" and "'Annotation::ID'" in info.value.allowed
