"""An L2 only for a worker image whose vLLM + LMCache report a failed L2 read to vLLM (k8s/
workers.py l2_refusal): LMCache 0.3.7 in lmcache/vllm-openai v0.3.7 swallows the error and vLLM
0.10.2 computes on KV that never loaded. Each case is the same endpoint twice, v0.5.4 against
another image, in a configuration where the verdict (k8s/l2.py) deploys the L2: only the image's
releases differ."""
from __future__ import annotations

import copy
import json

import cdk8s
import pytest
import yaml

from config import ConfigError, resolve_environment
from config.endpoint_spec import parse_endpoint
from config.images import image_for, image_release
from k8s.serving import (
    build_charts, environment_images, environment_notices, fit_endpoint, in_cluster_node,
    managed_l2_plans, placeholder_facts,
)
from k8s.workers import (
    KV_LOAD_FAILURE_POLICY_SINCE, L2_SAFE_LMCACHE, L2_SAFE_VLLM, kv_transfer_config, l2_refusal,
)
from stacks.app_builder import l2_needs
from tests.conftest import context_for
from tests.k8s.test_charts import SEED


# the in-cluster L2's rules, for an image whose client passes the fault drill (conftest.py)
pytestmark = pytest.mark.usefixtures("sound_l2_client")


SHIPPED = "lmcache/vllm-openai:v0.5.4"          # vLLM 0.27.1 + LMCache 0.5.4
OLD = "lmcache/vllm-openai:v0.3.7"              # vLLM 0.10.2 + LMCache 0.3.7
UNKNOWN_LMCACHE = ["vllm/vllm-openai:v0.27.1",  # LMCache unpinned in the image
                   "public.ecr.aws/deep-learning-containers/vllm:0.11.1-gpu-py312-cu129-"
                   "ubuntu22.04-ec2-v1.0",
                   "lmcache/vllm-openai:latest"]   # a moving tag: neither release known


def _env(cache: dict | None = None):
    ctx = context_for(env="dev")
    if cache:
        ctx["environments"]["dev"]["cache"] = cache
    return resolve_environment(ctx)


def _fit(cfg, image: str, backend: str = "valkey", forced: bool = False):
    """The seed (g5.24xlarge, TP 4) on `image`; with the in-cluster Valkey the verdict deploys
    an L2 unforced (docs/serving.md's table)."""
    raw = copy.deepcopy(SEED)
    raw["spec"]["worker"]["image"] = image
    raw["spec"]["kvCacheSpec"]["forceL2Cache"] = forced
    raw["spec"]["kvCacheSpec"]["l2CacheSpec"]["l2CacheBackend"] = backend
    return fit_endpoint(cfg, parse_endpoint(cfg.name, "endpoints/seed.yaml", raw))


def _docs(cfg, spec) -> list[dict]:
    return [d for c in build_charts(cdk8s.App(), cfg, (spec,), placeholder_facts(cfg, (spec,)))
            for d in c.to_json()]


def _lmcache(docs) -> dict:
    (cm,) = [d for d in docs if d["kind"] == "ConfigMap"
             and d["metadata"]["name"].endswith("-workers-lmcache")]
    return yaml.safe_load(cm["data"]["lmcache.yaml"])


def _kv_transfer(docs) -> dict:
    (worker,) = [d for d in docs if d["kind"] in ("Deployment", "StatefulSet")
                 and d["metadata"]["name"].endswith("-workers")]
    args = worker["spec"]["template"]["spec"]["containers"][0]["args"]
    return json.loads(args[args.index("--kv-transfer-config") + 1])


def _caches(docs) -> list[dict]:
    return [d for d in docs if d["kind"] == "StatefulSet" and "valkey" in d["metadata"]["name"]]


def _said(spec) -> list[str]:
    return [w for w in spec.warnings if "no L2 is deployed for" in w]


def test_v037_gets_no_l2_and_no_in_cluster_cache_where_v054_gets_both():
    cfg = _env({"kind": "self-hosted"})
    new, old = _fit(cfg, SHIPPED), _fit(cfg, OLD)
    assert new.l2_enabled and not _said(new)
    new_docs = _docs(cfg, new)
    assert _lmcache(new_docs)["remote_url"].startswith("resp://") and _caches(new_docs)
    assert in_cluster_node(cfg, (new,)) is not None
    assert "valkey" in {i.key for i in environment_images(cfg, (new,))}
    assert l2_needs(cfg, (new,)).in_cluster_node_type is not None

    assert not old.l2_enabled
    (said,) = _said(old)
    assert said.startswith("endpoints/seed.yaml: spec.kvCacheSpec.enableL2Cache")
    assert OLD in said and "vLLM 0.10.2 + LMCache 0.3.7" in said and SHIPPED in said
    assert said.ack == f"kvcache:changed:{old.name}:kvCacheSpec.enableL2Cache"
    docs = _docs(cfg, old)
    assert "remote_url" not in _lmcache(docs) and not _caches(docs)
    assert "kv_load_failure_policy" not in _kv_transfer(docs)
    # nothing else uses an L2: no Valkey, no node for it, and the environment is told why
    assert in_cluster_node(cfg, (old,)) is None
    assert "valkey" not in {i.key for i in environment_images(cfg, (old,))}
    assert l2_needs(cfg, (old,)).in_cluster_node_type is None
    assert any("no in-cluster Valkey is deployed" in n for n in environment_notices(cfg, (old,)))


def test_v037_on_the_managed_cache_provisions_no_elasticache(monkeypatch):
    """ElastiCache sized to pay (valkey:// in cluster mode for a GLIDE image): v0.5.4 gets it,
    v0.3.7 gets neither the L2 nor a cluster."""
    import config.images

    monkeypatch.setattr(config.images, "GLIDE_IMAGES",
                        frozenset({"vllm-lmcache", image_for(OLD).key}))
    cfg = _env({"kind": "elasticache", "engine": "valkey", "engineVersion": "9.0",
                "nodeType": "cache.r7g.4xlarge", "maxShards": 32, "replicas": 1,
                "multiAz": True})
    new = _fit(cfg, SHIPPED, backend="redis")
    assert new.l2_enabled and managed_l2_plans(cfg, (new,))
    assert l2_needs(cfg, (new,)).elasticache_shards
    old = _fit(cfg, OLD, backend="redis")
    assert not old.l2_enabled and _said(old)
    assert not managed_l2_plans(cfg, (old,))
    assert l2_needs(cfg, (old,)).elasticache_shards is None
    assert any("no ElastiCache is provisioned" in n for n in environment_notices(cfg, (old,)))
    assert "remote_url" not in _lmcache(_docs(cfg, old))
    # the two together: v0.5.4's L2 stays, v0.3.7's worker stays L1-only
    both = (new, _fit(cfg, OLD, backend="redis"))
    assert len(managed_l2_plans(cfg, both)) == 1


@pytest.mark.parametrize("image", UNKNOWN_LMCACHE)
def test_an_image_whose_lmcache_is_not_known_gets_no_l2(image):
    cfg = _env({"kind": "self-hosted"})
    assert image_release(image_for(image)).lmcache is None
    spec = _fit(cfg, image)
    assert not spec.l2_enabled
    (said,) = _said(spec)
    assert image in said and "no public record pins" in said
    docs = _docs(cfg, spec)
    assert "remote_url" not in _lmcache(docs) and not _caches(docs)


@pytest.mark.parametrize("image", [OLD, *UNKNOWN_LMCACHE])
def test_forcing_an_l2_on_an_image_that_cannot_report_a_failed_read_is_refused(image):
    """forceL2Cache overrides the cost verdict, not whether a failed read is served as KV."""
    cfg = _env({"kind": "self-hosted"})
    with pytest.raises(ConfigError) as info:
        _fit(cfg, image, forced=True)
    err = info.value
    assert err.field == "endpoints/seed.yaml: spec.kvCacheSpec.forceL2Cache" and err.value is True
    assert image in err.allowed and SHIPPED in err.allowed and "false" in err.allowed
    assert "\n" not in str(err)
    assert _fit(cfg, SHIPPED, forced=True).l2_enabled


def test_forced_l2_on_v037_is_refused_when_the_files_are_read(tmp_path):
    """load_endpoints is what app.py runs before CDK builds anything (a refusal there writes
    nothing: tests/config/test_bad_inputs.py test_the_app_exits_2_before_writing_anything)."""
    from k8s.serving import load_endpoints

    raw = copy.deepcopy(SEED)
    raw["spec"]["worker"]["image"] = OLD      # the seed forces its L2
    (tmp_path / "e.yaml").write_text(yaml.safe_dump(raw))
    ctx = context_for(env="dev")
    ctx["environments"]["dev"]["endpoints"] = ["e.yaml"]
    with pytest.raises(ConfigError, match=r"kvCacheSpec\.forceL2Cache = True is not valid"):
        load_endpoints(resolve_environment(ctx), tmp_path)


def test_the_l2_worker_fails_a_request_whose_l2_read_failed():
    """vLLM 0.27.1 would fail it by default, but its "recompute" is wrong output on Model
    Runner V2 (k8s/workers.py): the policy is written out wherever the key exists."""
    cfg = _env({"kind": "self-hosted"})
    docs = _docs(cfg, _fit(cfg, SHIPPED))
    assert _kv_transfer(docs) == {"kv_connector": "LMCacheConnectorV1", "kv_role": "kv_both",
                                  "kv_load_failure_policy": "fail"}
    raw = copy.deepcopy(SEED)
    raw["spec"]["kvCacheSpec"] = {"enableL1Cache": True, "enableL2Cache": False}
    l1 = fit_endpoint(cfg, parse_endpoint(cfg.name, "endpoints/seed.yaml", raw))
    assert "kv_load_failure_policy" not in _kv_transfer(_docs(cfg, l1))
    # vLLM's KVTransferConfig has the key from 0.13.0; 0.12.0 has none (it always recomputes)
    assert "kv_load_failure_policy" not in kv_transfer_config((0, 12, 0), True)
    assert kv_transfer_config((0, 13, 0), True)["kv_load_failure_policy"] == "fail"
    assert KV_LOAD_FAILURE_POLICY_SINCE <= image_release(image_for(SHIPPED)).vllm


VERSIONS = [None, (0, 10, 2), (0, 11, 0), (0, 11, 1), (0, 27, 1)]
LMCACHES = [None, (0, 3, 7), (0, 3, 9), (0, 3, 15), (0, 4, 0), (0, 4, 1), (0, 5, 4)]


def test_the_gate_allows_exactly_the_known_pairs_past_both_floors():
    for vllm in VERSIONS:
        for lmcache in LMCACHES:
            allowed = (vllm is not None and lmcache is not None and vllm >= L2_SAFE_VLLM
                       and lmcache >= L2_SAFE_LMCACHE)
            why = l2_refusal(vllm, lmcache)
            assert (why is None) is allowed, (vllm, lmcache, why)
            assert why is None or "\n" not in why
    assert "dies on an assert" in l2_refusal((0, 27, 1), (0, 3, 15))
    assert "wrong text" in l2_refusal((0, 10, 2), (0, 3, 7))


def test_the_elasticache_token_goes_only_to_workers_that_read_it(monkeypatch):
    """The Serving stack grants the ElastiCache AUTH secret to a worker's role by
    k8s.serving.reads_managed_l2 (stacks/serving_stack.py): exactly where the rendered worker
    fetches it, not where its L2 is the in-cluster Valkey, its own URL, or refused."""
    import config.images
    from config.endpoint_spec import parse_endpoint
    from k8s.serving import reads_managed_l2

    monkeypatch.setattr(config.images, "GLIDE_IMAGES", frozenset({"vllm-lmcache"}))
    cfg = _env({"kind": "elasticache", "engine": "valkey", "engineVersion": "9.0",
                "nodeType": "cache.r7g.4xlarge", "maxShards": 32, "replicas": 1,
                "multiAz": True})
    raw = copy.deepcopy(SEED)
    raw["spec"]["worker"]["image"] = SHIPPED
    raw["spec"]["kvCacheSpec"]["l2CacheSpec"]["l2CacheLocalUrl"] = "redis://l2.team.internal:6379"
    own = fit_endpoint(cfg, parse_endpoint(cfg.name, "endpoints/own.yaml", raw))
    cases = {"managed": _fit(cfg, SHIPPED, backend="redis"),
             "in-cluster": _fit(cfg, SHIPPED, backend="valkey"),
             "own": own, "refused": _fit(cfg, OLD, backend="redis")}
    reads = {name: reads_managed_l2(cfg, s) for name, s in cases.items()}
    assert reads == {"managed": True, "in-cluster": False, "own": False, "refused": False}
    for name, s in cases.items():
        assert ("L2_SECRET_ARN" in json.dumps(_docs(cfg, s))) == reads[name], name


def test_a_files_own_lmcache_remote_url_is_held_to_the_same_gate():
    """LMCache's LMCACHE_* variables override the rendered config file (update_config_from_env
    after from_file, 0.3.7 and 0.5.4), so a file's LMCACHE_REMOTE_URL is an L2 the gate must see:
    refused on v0.3.7 and on an image whose LMCache is unknown, naming the variable and never
    its value; kept as written on v0.5.4."""
    cfg = _env({"kind": "self-hosted"})

    def fit(image: str):
        raw = copy.deepcopy(SEED)
        raw["spec"]["worker"]["image"] = image
        raw["spec"]["kvCacheSpec"] = {"enableL1Cache": True, "enableL2Cache": False}
        raw["spec"]["worker"]["environmentVariables"] = [
            {"name": "HF_TOKEN_PATH", "value": "/tmp/none"},
            {"name": "LMCACHE_REMOTE_URL", "value": "redis://:hunter2@l2.team.internal:6379"}]
        return fit_endpoint(cfg, parse_endpoint(cfg.name, "endpoints/seed.yaml", raw))

    for image in (OLD, UNKNOWN_LMCACHE[0]):
        with pytest.raises(ConfigError) as err:
            fit(image)
        line = str(err.value)
        assert "environmentVariables[1].name" in line and "LMCACHE_REMOTE_URL" in line, line
        assert "hunter2" not in line and image in line, line
    kept = fit(SHIPPED)
    assert {"name": "LMCACHE_REMOTE_URL",
            "value": "redis://:hunter2@l2.team.internal:6379"} in kept.worker_env
