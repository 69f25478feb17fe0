"""HyperPod `lmcache.mode: MultiProcess`, as rendered: the LMCache server beside vLLM in the
worker pod for an image whose LMCache has it (lmcache/vllm-openai v0.5.4), one line for one
whose LMCache does not (v0.3.7), and the server's arguments as that release's own CLI reads
them (k8s/lmcache_server.py)."""
from __future__ import annotations

import copy
import json

import cdk8s
import pytest

from config.contracts import LMCACHE_SERVER_HTTP_PORT, LMCACHE_SERVER_PORT
from config.errors import ConfigError
from config.endpoint_spec import parse_endpoint
from k8s.lmcache_server import MP_CONNECTOR_MODULE, SHM_NAME
from k8s.serving import build_charts, multi_process_check
from k8s.workers import CHUNK_TOKENS
from tests.k8s.lmcache_parse import parse_server_args
from tests.k8s.test_charts import SEED, _env, _facts


def _file(image: str, where: str = "spec", l2: bool = True) -> dict:
    raw = copy.deepcopy(SEED)
    raw["spec"]["worker"]["image"] = image
    if not l2:
        raw["spec"]["kvCacheSpec"] = {"enableL1Cache": True, "enableL2Cache": False}
    else:   # the in-cluster Valkey: plain RESP, which 0.5.4's server reaches
        raw["spec"]["kvCacheSpec"]["l2CacheSpec"]["l2CacheBackend"] = "valkey"
    holder = raw["spec"] if where == "spec" else raw["spec"]["kvCacheSpec"]
    holder["lmcache"] = {"mode": "MultiProcess"}
    return raw


def _worker_pod(env: str, raw: dict) -> tuple[dict, dict]:
    cfg = _env(env)
    spec = parse_endpoint(cfg.name, "endpoints/test.yaml", raw)
    docs = [d for chart in build_charts(cdk8s.App(), cfg, (spec,), _facts(cfg, spec))
            for d in chart.to_json()]
    workload = next(d for d in docs if d["kind"] in ("Deployment", "StatefulSet")
                    and d["metadata"]["name"].endswith("-workers"))
    return workload["spec"]["template"]["spec"], {"spec": spec}


def _gi(quantity: str) -> float:
    scale = {"Gi": 1, "Mi": 1 / 1024}[quantity[-2:]]
    return float(quantity[:-2]) * scale


def _cores(quantity: str) -> float:
    return int(quantity[:-1]) / 1000 if quantity.endswith("m") else float(quantity)


@pytest.fixture(scope="module")
def rendered():
    """Each environment once, one with the in-cluster Valkey L2 and one without an L2."""
    return {(env, l2): _worker_pod(env, _file("lmcache/vllm-openai:v0.5.4", l2=l2))
            for env, l2 in CASES}


CASES = [("dev", True), ("china", False)]


@pytest.mark.parametrize("env,l2", CASES)
def test_multiprocess_runs_the_lmcache_server_beside_vllm(rendered, env, l2):
    pod, _ = rendered[(env, l2)]
    server = next(c for c in pod["initContainers"] if c["name"] == "lmcache-server")
    vllm = next(c for c in pod["containers"] if c["name"] == "vllm")
    assert server["restartPolicy"] == "Always"               # native: before vLLM, after it
    assert server["image"] == vllm["image"]                  # the same LMCache release
    assert "nvidia.com/gpu" not in server["resources"]["limits"]
    args = vllm["args"]
    transfer = json.loads(args[args.index("--kv-transfer-config") + 1])
    assert transfer["kv_connector"] == "LMCacheMPConnector"
    assert transfer["kv_connector_module_path"] == MP_CONNECTOR_MODULE
    extra = transfer["kv_connector_extra_config"]
    assert (extra["lmcache.mp.host"], extra["lmcache.mp.port"]) == ("tcp://127.0.0.1",
                                                                      LMCACHE_SERVER_PORT)
    assert extra["lmcache.mp.mp_transfer_mode"] == "engine_driven"
    # L1 is the server's, in the pod's shared memory: counted once, in the server
    l1 = float(server["args"][server["args"].index("--l1-size-gb") + 1])
    shm = next(v for v in pod["volumes"] if v["name"] == "dshm")["emptyDir"]["sizeLimit"]
    assert _gi(shm) >= l1 > 0
    mounts = {m["mountPath"] for m in server["volumeMounts"]}
    assert "/dev/shm" in mounts and "/dev/shm" in {m["mountPath"] for m in vllm["volumeMounts"]}
    # the pod still fits the worker's share of its node: the server comes out of vLLM's
    spec = _seed(env)
    assert (_gi(server["resources"]["limits"]["memory"])
            + _gi(vllm["resources"]["limits"]["memory"])) <= _gi(spec.memory)
    assert (_cores(server["resources"]["requests"]["cpu"])
            + _cores(vllm["resources"]["requests"]["cpu"])) <= _cores(spec.cpu)


def _seed(env: str):
    cfg = _env(env)
    return parse_endpoint(cfg.name, "endpoints/test.yaml", copy.deepcopy(SEED))


@pytest.mark.parametrize("env,l2", CASES)
def test_the_server_args_are_what_lmcache_0_5_4_reads(rendered, env, l2):
    """LMCache 0.5.4's own `lmcache server` parser (the image's release) reads the rendered
    arguments: every value as meant, the L2 (where the verdict deploys one) as its RESP adapter."""
    pod, _ = rendered[(env, l2)]
    server = next(c for c in pod["initContainers"] if c["name"] == "lmcache-server")
    assert server["command"][-2:] == ["-m", "lmcache.cli.main"]
    read = parse_server_args("0.5.4", server["args"])
    l1 = float(server["args"][server["args"].index("--l1-size-gb") + 1])
    assert read["host"] == "127.0.0.1" and read["port"] == LMCACHE_SERVER_PORT
    assert read["chunk_size"] == CHUNK_TOKENS
    assert read["transfer"] == "engine_driven" and read["shm_name"] == SHM_NAME
    assert read["l1_bytes"] == int(l1 * 2 ** 30) and read["eviction"] == "LRU"
    assert read["http"] == ["127.0.0.1", LMCACHE_SERVER_HTTP_PORT]
    l2_env = [c for c in pod["containers"] if c["name"] == "vllm"][0]
    if any(a.startswith("--l2-adapter") for a in server["args"]):
        (adapter,) = read["l2"]
        assert adapter["type"] == "RESPL2AdapterConfig" and adapter["port"] > 0
        assert adapter["host"] and not adapter["password"]
    else:
        assert read["l2"] == []
    assert l2_env


@pytest.mark.parametrize("where", ["spec", "kvCacheSpec"])
def test_multiprocess_is_refused_in_one_line_for_lmcache_before_0_5(where):
    cfg = _env("dev")
    with pytest.raises(ConfigError) as err:
        parse_endpoint(cfg.name, "endpoints/test.yaml", _file("lmcache/vllm-openai:v0.3.7",
                                                              where))
    text = str(err.value)
    assert "\n" not in text.strip()
    assert "lmcache.mode" in text and "MultiProcess" in text and "0.3.7" in text


@pytest.mark.parametrize("env", ["dev", "china"])
def test_multiprocess_with_elasticache_is_one_line_before_deploy(env):
    """The environments' ElastiCache is TLS with an AUTH token: 0.5.4's server has no client
    for it in the published image."""
    cfg = _env(env)
    raw = _file("lmcache/vllm-openai:v0.5.4")
    raw["spec"]["kvCacheSpec"]["l2CacheSpec"]["l2CacheBackend"] = "redis"
    spec = parse_endpoint(cfg.name, "endpoints/test.yaml", raw)
    with pytest.raises(ConfigError) as err:
        multi_process_check(cfg, spec)
    assert "\n" not in str(err.value).strip() and "InProcess" in str(err.value)


def test_inprocess_renders_no_server():
    cfg = _env("dev")
    raw = copy.deepcopy(SEED)
    raw["spec"]["lmcache"] = {"mode": "InProcess"}
    pod, _ = _worker_pod("dev", raw)
    assert all(c["name"] != "lmcache-server" for c in pod.get("initContainers", []))
    assert cfg


def test_multiprocess_with_the_files_own_connector_is_one_line():
    """An in-process connector beside the server would never reach it (LMCache #4213)."""
    cfg = _env("dev")
    raw = _file("lmcache/vllm-openai:v0.5.4")
    raw["spec"]["worker"]["args"] = [*raw["spec"]["worker"].get("args", []),
                                     "--kv-transfer-config",
                                     '{"kv_connector":"LMCacheConnectorV1","kv_role":"kv_both"}']
    with pytest.raises(ConfigError, match="LMCacheMPConnector"):
        parse_endpoint(cfg.name, "endpoints/test.yaml", raw)
