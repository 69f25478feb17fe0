"""First-deploy gates on the workers of dev, china and dev's China variant (tests/k8s/
worker_gates.py says what each gate runs); the corpus runs them in test_hyperpod_corpus.py."""
from __future__ import annotations

import copy
from dataclasses import replace

import cdk8s
import pytest
import yaml

from config.images import IMAGE_FAMILIES
from config.instances import allocatable
from k8s.serving import build_charts, in_cluster_node
from k8s.workers import TIER_POLICY, tier_settings
from tests.conftest import ENVIRONMENTS
from tests.k8s.test_charts import SEED, _env, _facts
from tests.k8s.worker_gates import (
    assert_layerwise_is_guarded, assert_reaches_vllm, families_for, fake_root, lmcache_configs,
    memory_budget, run_container, upstream_ref, vllm_steps, worker_containers,
)
from config.endpoint_spec import parse_endpoint


def _docs(synth) -> list[dict]:
    return [d for chart in synth.stacks.serving.charts for d in chart.to_json()]


@pytest.mark.parametrize("env", ENVIRONMENTS)
def test_shipped_workers_reach_vllm_in_their_images_layout(synths, env, tmp_path):
    docs = _docs(synths[env])
    pods = worker_containers(docs)
    assert pods
    for i, (pod, container) in enumerate(pods):
        api_key = any(c["name"] == "fetch-api-key" for c in pod["initContainers"])
        assert api_key   # every shipped environment has an endpoint API key
        for family in families_for(upstream_ref(container["image"]),
                                   synths[env].cfg.image_bases):
            here = tmp_path / f"pod{i}"      # a root per worker workload (P/D: two)
            here.mkdir(exist_ok=True)
            root = fake_root(here, family)
            assert_reaches_vllm(run_container(root, family, container, here), root,
                                family, container, api_key)


@pytest.mark.parametrize("env", ENVIRONMENTS)
def test_shipped_workers_fit_their_memory(synths, env):
    docs = _docs(synths[env])
    for pod, container in worker_containers(docs):
        b = memory_budget(docs, pod, container)
        assert b["used"] <= b["limit"], b
        # L1 where it is on (a disaggregated endpoint's decode workers have none)
        assert (b["l1_per_rank"] >= 1 or not b["l1"]) and b["ranks"] <= b["gpus"], b


IMAGES = ["lmcache/vllm-openai:v0.3.7", "lmcache/vllm-openai:v0.5.4",
          "lmcache/vllm-openai:latest", "vllm/vllm-openai:v0.19.1",
          "public.ecr.aws/deep-learning-containers/vllm:0.11.1-gpu-py312-cu129-ubuntu22.04-ec2-v1.0",
          "registry.example.com/team/my-inference-image:1.0"]


@pytest.mark.parametrize("image", IMAGES)
@pytest.mark.parametrize("model_flag", [False, True])
@pytest.mark.parametrize("api_key", [False, True])
def test_each_image_family_starts_vllm(tmp_path, image, model_flag, api_key):
    """Both ways the files write args (`--model X` or vLLM's positional), with and without the
    API key shell, in every family (an unknown image: in all of them)."""
    cfg = _env("dev")
    raw = copy.deepcopy(SEED)
    raw["spec"]["worker"]["image"] = image
    if model_flag:
        raw["spec"]["worker"]["args"] = ["--model", "/opt/ml/model",
                                         *raw["spec"]["worker"]["args"]]
    spec = parse_endpoint(cfg.name, "endpoints/test.yaml", raw)
    facts = _facts(cfg, spec)
    if api_key:
        facts = replace(facts, api_key_secret_arn="arn:aws:secretsmanager:us-west-2:"
                        "111111111111:secret:api-key")
    docs = [d for c in build_charts(cdk8s.App(), cfg, (spec,), facts) for d in c.to_json()]
    ((_, container),) = worker_containers(docs)
    for family in families_for(image):
        root = fake_root(tmp_path, family)
        assert_reaches_vllm(run_container(root, family, container, tmp_path), root, family,
                            container, api_key)


def test_the_gate_fails_a_command_the_image_cannot_run(tmp_path):
    """What we shipped before: `vllm serve` by name in lmcache/vllm-openai v0.3.7 (vLLM in
    /opt/venv, off PATH), and python3 -m (the system python, without vllm)."""
    from config.images import LMCACHE_VENV
    root = fake_root(tmp_path, LMCACHE_VENV)
    for command in (["vllm", "serve"], ["python3", "-m", "vllm.entrypoints.openai.api_server"]):
        container = {"command": ["/bin/sh", "-c", 'exec "$@"', "vllm", *command],
                     "args": ["/opt/ml/model"], "env": []}
        seen = run_container(root, LMCACHE_VENV, container, tmp_path)
        with pytest.raises(AssertionError):
            assert_reaches_vllm(seen, root, LMCACHE_VENV, container, False)


def test_families_cover_every_family_the_corpus_names():
    assert {f.key for f in IMAGE_FAMILIES} == {"lmcache-venv", "lmcache-path", "vllm-openai",
                                              "dlc-vllm"}
    assert all(f.source and f.vllm.startswith("/") and f.python.startswith("/")
               for f in IMAGE_FAMILIES)


def test_tier_policy_is_data_for_each_lmcache():
    old, new = tier_settings((0, 3, 7), l2=True), tier_settings((0, 5, 4), l2=True)
    assert "extra_config" not in old and new["extra_config"]["fallback_policy"] == "local_cpu"
    assert tier_settings(None, l2=True) == old         # unknown: what the oldest reads
    assert "lookup_timeout_ms" not in tier_settings((0, 5, 4), l2=False)
    assert all(t.why for t in TIER_POLICY)


@pytest.mark.parametrize("env", ENVIRONMENTS)
def test_workers_call_no_outside_host(synths, env):
    for _, container in worker_containers(_docs(synths[env])):
        values = {e["name"]: e.get("value") for e in container["env"]}
        assert values["VLLM_NO_USAGE_STATS"] == "1" and values["DO_NOT_TRACK"] == "1"
        assert values["LMCACHE_TRACK_USAGE"] == "false"


# What the system node types hold (EC2 pages) less EKS's kube-reserved and eviction threshold
# on AL2023 (~0.9 GiB and 80m at 58 pods); half of that is left to the cluster's own pods.


@pytest.mark.parametrize("backend", ["valkey", "tieredstorage", "lmcache-server"])
def test_the_in_cluster_l2_fits_its_own_node_and_evicts(backend):
    from config.endpoint_spec import _gib
    cfg = _env("dev")
    raw = copy.deepcopy(SEED)
    raw["spec"]["kvCacheSpec"]["l2CacheSpec"]["l2CacheBackend"] = backend
    spec = parse_endpoint(cfg.name, "endpoints/test.yaml", raw)
    docs = [d for c in build_charts(cdk8s.App(), cfg, (spec,), _facts(cfg, spec))
            for d in c.to_json()]
    (sts,) = [d for d in docs if d["kind"] == "StatefulSet"]
    pod = sts["spec"]["template"]["spec"]
    # the node the L2 verdict chose (stacks/cache_stack.py adds it, tainted for the Valkey)
    assert pod["nodeSelector"] == {"kvcache.io/node-role": "cache",
                                   "kvcache.io/node-group": "l2cache"}
    assert pod["tolerations"][0]["key"] == "kvcache.io/l2-cache"
    node = in_cluster_node(cfg, (spec,)).node_type
    a = allocatable(node)
    cpu, mem = a.cpu_m / 1000, a.memory_mib / 1024
    requests = {"cpu": 0.0, "memory": 0.0}
    for c in pod["containers"]:
        r = c["resources"]["requests"]
        requests["cpu"] += float(r["cpu"].removesuffix("m")) / (1000 if r["cpu"].endswith("m")
                                                                 else 1)
        requests["memory"] += _gib(r["memory"])
    assert requests["cpu"] <= cpu and requests["memory"] <= mem, (node, requests, cpu, mem)
    assert requests["memory"] >= mem / 2           # the node is the L2's: most of it is
    args = pod["containers"][0]["args"]
    assert args[args.index("--maxmemory-policy") + 1] == "allkeys-lru"
    maxmemory = int(args[args.index("--maxmemory") + 1].removesuffix("mb")) / 1024
    assert 0 < maxmemory < _gib(pod["containers"][0]["resources"]["limits"]["memory"])


# --- Layerwise only where every step runs LMCache's layer hooks (k8s/workers.py LAYERWISE_GUARD)

def _l1_only_docs(image: str, args: tuple[str, ...] = ()) -> list[dict]:
    cfg = _env("dev")
    raw = copy.deepcopy(SEED)
    raw["spec"]["worker"]["image"] = image
    raw["spec"]["worker"]["args"] = [*raw["spec"]["worker"]["args"], *args]
    raw["spec"]["kvCacheSpec"]["enableL2Cache"] = False
    spec = parse_endpoint(cfg.name, "endpoints/test.yaml", raw)
    return [d for c in build_charts(cdk8s.App(), cfg, (spec,), _facts(cfg, spec))
            for d in c.to_json()]


def _layerwise(docs: list[dict]) -> bool:
    (text,) = lmcache_configs(docs).values()
    return yaml.safe_load(text).get("use_layerwise") is True


# vLLM known (and >= 0.10.2): layerwise with the guard; vLLM unknown: no layerwise
LAYERWISE = {"lmcache/vllm-openai:v0.3.7": True, "lmcache/vllm-openai:v0.5.4": True,
             "lmcache/vllm-openai:latest": False, "vllm/vllm-openai:v0.19.1": True,
             "public.ecr.aws/deep-learning-containers/vllm:0.11.1-gpu-py312-cu129-ubuntu22.04-"
             "ec2-v1.0": True, "registry.example.com/team/my-inference-image:1.0": False}


@pytest.mark.parametrize("image", sorted(LAYERWISE))
def test_layerwise_only_where_every_step_runs_the_layer_hooks(image):
    """LMCache 0.3.x dies (StopIteration) and any release reads KV still loading when a step
    skips the per-layer hooks: a full CUDA graph (vLLM's default from 0.11) or async
    scheduling (from 0.14). Fails with the guard removed (v0.5.4 = vLLM 0.27.1 runs
    FULL_AND_PIECEWISE and async scheduling by default) or with layerwise for an image whose
    vLLM is unknown."""
    docs = _l1_only_docs(image)
    assert _layerwise(docs) is LAYERWISE[image]
    assert assert_layerwise_is_guarded(docs) is LAYERWISE[image]


@pytest.mark.parametrize("args", [("--async-scheduling",), ("-O3",), ("--enforce-eager",),
                                  ("--compilation-config", '{"cudagraph_mode":"FULL"}'),
                                  ("--compilation-config.cudagraph_mode=FULL",)])
def test_a_file_that_sets_graphs_or_scheduling_itself_gets_no_layerwise(args):
    docs = _l1_only_docs("lmcache/vllm-openai:v0.5.4", args)
    assert not _layerwise(docs)
    ((_, container),) = worker_containers(docs)
    assert "--no-async-scheduling" not in container["args"]   # the file's own choice stands


def test_the_step_model_reads_vllms_defaults_per_release():
    """What the gate holds the args to (worker_gates.vllm_steps), on the releases we render."""
    assert vllm_steps((0, 10, 2), []) == ("PIECEWISE", False)
    assert vllm_steps((0, 11, 1), []) == ("FULL_AND_PIECEWISE", False)
    assert vllm_steps((0, 27, 1), []) == ("FULL_AND_PIECEWISE", True)
    guard = ["--compilation-config", '{"cudagraph_mode":"PIECEWISE"}', "--no-async-scheduling"]
    assert vllm_steps((0, 27, 1), guard) == ("PIECEWISE", False)
    assert vllm_steps(None, guard) is None


@pytest.mark.parametrize("env", ENVIRONMENTS)
def test_shipped_workers_store_layerwise_only_with_the_guard(synths, env):
    docs = _docs(synths[env])
    assert worker_containers(docs)
    assert_layerwise_is_guarded(docs, synths[env].cfg.image_bases)


def test_every_image_we_render_for_says_its_vllm_and_lmcache_with_a_source():
    """The release tags we ship or the published files name carry a known pair; moving tags
    and unpinned installs say so (None) rather than guess."""
    from config.images import IMAGES as CATALOGUE, image_for, image_release
    from tests.k8s.test_hyperpod_corpus import SERVED, _yaml
    refs = {CATALOGUE["vllm-lmcache"].source_ref, *IMAGES,
            *(_yaml(f)["spec"]["worker"]["image"] for f in SERVED)}
    pair = {r: (image_release(image_for(r)).vllm, image_release(image_for(r)).lmcache)
            for r in refs}
    assert all(image_release(image_for(r)).source for r in refs)
    assert pair["lmcache/vllm-openai:v0.3.7"] == ((0, 10, 2), (0, 3, 7))
    assert pair["lmcache/vllm-openai:v0.5.4"] == ((0, 27, 1), (0, 5, 4))
    assert pair["vllm/vllm-openai:v0.19.1"] == ((0, 19, 1), None)
    assert pair["lmcache/vllm-openai:latest"] == (None, None)
    dlc = next(r for r in refs if "deep-learning-containers/vllm:0.11.1" in r)
    assert pair[dlc] == ((0, 11, 1), None)
