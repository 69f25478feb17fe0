"""The worker's LMCache config, read by LMCache 0.5.6's own parser (it ignores unknown keys and
turns bad values into None, so the test asserts the parsed values, not just that it parsed).

For the managed L2, the real init-container script runs here with a stub `aws` that prints a
token, exactly as it would write the file in the pod.
"""
from __future__ import annotations

import json
import os
import stat
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.conftest import ROOT
from tests.k8s.test_charts import _env, _spec, render

LMCACHE_PY = ROOT / ".venv-lmcache" / "bin" / "python"
_PARSE = """
import json, sys
from lmcache.v1.config import LMCacheEngineConfig
out = []
for path in sys.argv[1:]:
    c = LMCacheEngineConfig.from_file(path)
    out.append({k: getattr(c, k) for k in ("chunk_size", "local_cpu", "max_local_cpu_size",
            "remote_url", "remote_serde", "blocking_timeout_secs", "lookup_timeout_ms",
            "extra_config", "save_unfull_chunk")})
print(json.dumps(out))
"""


def _worker_pod(docs):
    return next(d for d in docs if d["kind"] in ("Deployment", "StatefulSet")
                and d["metadata"]["name"].endswith("-workers"))["spec"]["template"]["spec"]


def _config_file(docs, tmp: Path) -> Path:
    cm = next(d for d in docs if d["kind"] == "ConfigMap")
    base = tmp / "config" / "lmcache.yaml"
    base.parent.mkdir(parents=True)
    base.write_text(cm["data"]["lmcache.yaml"])
    init = [c for c in _worker_pod(docs)["initContainers"] if c["name"] == "fetch-l2-secret"]
    if not init:
        return base
    (tmp / "bin").mkdir()
    aws = tmp / "bin" / "aws"
    aws.write_text("#!/bin/sh\necho 's3cretT0ken'\n")
    aws.chmod(aws.stat().st_mode | stat.S_IEXEC)
    env = {e["name"]: e["value"] for e in init[0]["env"]}
    env["OUT"] = str(tmp / "runtime.yaml")
    script = init[0]["command"][2].replace("/config/lmcache.yaml", str(base))
    subprocess.run(["/bin/sh", "-c", script], check=True, timeout=30,
                   env={**env, "PATH": f"{tmp / 'bin'}:{os.environ['PATH']}"})
    return tmp / "runtime.yaml"


BACKENDS = ["redis", "valkey", "lmcache-server", None]


@pytest.fixture(scope="module")
def parsed(tmp_path_factory) -> dict:
    """Render each backend, write its config as the pod would, parse all in one LMCache run."""
    assert LMCACHE_PY.exists(), "run `make test` (it creates .venv-lmcache)"
    cfg = _env("dev")
    rendered, paths = {}, []
    for backend in BACKENDS:
        docs = render(cfg, _spec(cfg, backend=backend))
        rendered[backend] = docs
        paths.append(str(_config_file(docs, tmp_path_factory.mktemp(str(backend)))))
    proc = subprocess.run([str(LMCACHE_PY), "-c", _PARSE, *paths], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    values = json.loads(proc.stdout.strip().splitlines()[-1])
    return {b: (v, rendered[b]) for b, v in zip(BACKENDS, values)}


@pytest.mark.parametrize("backend", BACKENDS)
def test_lmcache_reads_the_values_we_render(parsed, backend):
    parsed, docs = parsed[backend]
    assert parsed["local_cpu"] is True and parsed["max_local_cpu_size"] == 48.0
    assert parsed["chunk_size"] == 256
    if backend is None:
        assert parsed["remote_url"] is None
        return
    assert parsed["blocking_timeout_secs"] == 2 and parsed["lookup_timeout_ms"] == 1000
    assert parsed["extra_config"]["fallback_policy"] == "local_cpu"
    url = parsed["remote_url"]
    expected = {"redis": "rediss://:s3cretT0ken@l2.example.internal:6379?socket_timeout=1",
                "valkey": "redis://kvcache-valkey.", "lmcache-server": "lm://kvcache-lmcache"}
    assert url.startswith(expected[backend]), url
    # the token exists only in the pod's memory volume, never in what we render
    assert "s3cretT0ken" not in yaml.safe_dump_all(docs)


# LMCache's own remote backend, built as a worker builds it: config file + env, then the
# connector for `remote_url` (it never connects: redis-py pools connect lazily), then one
# lookup that fails against a closed port, so its warning path runs too. The engine's
# "Creating LMCacheEngine with config" line is emitted through the engine module's own logger
# (building a whole engine needs a GPU connector).
_CONNECT = """
import asyncio, os, sys, threading, types
import torch
from lmcache.utils import CacheEngineKey
from lmcache.v1.config import LMCacheEngineConfig
from lmcache.v1.metadata import LMCacheMetadata
from lmcache.v1.storage_backend.remote_backend import RemoteBackend
import lmcache.v1.cache_engine as cache_engine
cfg = LMCacheEngineConfig.from_file(os.environ["LMCACHE_CONFIG_FILE"])
cfg.update_config_from_env()
meta = LMCacheMetadata(model_name="m", world_size=1, local_world_size=1, worker_id=0,
                       local_worker_id=0, kv_dtype=torch.bfloat16, kv_shape=(2, 2, 256, 2, 64))
loop = asyncio.new_event_loop()
threading.Thread(target=loop.run_forever, daemon=True).start()
backend = RemoteBackend(cfg, meta, loop, types.SimpleNamespace(config=cfg, metadata=meta),
                        dst_device="cpu")
cache_engine.logger.info("Creating LMCacheEngine with config: %s", cfg)
backend.contains(CacheEngineKey("m", 1, 0, 1, torch.bfloat16))
pool = backend.connection._connector.pool.connection_kwargs
print("AUTH-IN-POOL" if pool.get("password") == sys.argv[1] else "NO-AUTH", flush=True)
"""


def _run_lmcache_remote(tmp_path, env: dict) -> str:
    proc = subprocess.run([str(LMCACHE_PY), "-c", _CONNECT, TOKEN], capture_output=True,
                          text=True, timeout=120, env={**os.environ, **env})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "AUTH-IN-POOL" in proc.stdout  # the token did reach the redis client
    return proc.stdout + proc.stderr


TOKEN = "s3cretT0ken"


def test_the_l2_token_appears_in_no_lmcache_log_line(tmp_path):
    cfg = _env("dev")
    docs = render(cfg, _spec(cfg, backend="redis"))
    runtime = _config_file(docs, tmp_path)
    text = runtime.read_text()
    # point the URL at a closed loopback port: the lookup fails fast, the token stays in it
    runtime.write_text(text.replace("l2.example.internal:6379", "127.0.0.1:9"))
    worker = next(c for c in _worker_pod(docs)["containers"] if c["name"] == "vllm")
    env = {e["name"]: e["value"] for e in worker["env"]
           if e["name"].startswith(("LMCACHE_", "PYTHONHASHSEED"))}
    env["LMCACHE_CONFIG_FILE"] = str(runtime)
    logged = _run_lmcache_remote(tmp_path, env)
    assert TOKEN not in logged
    assert "LMCache WARNING" in logged  # its warnings still reach the log (the failed lookup)
    # The same code at LMCache's default level prints the token: the test can see a leak.
    loud = _run_lmcache_remote(tmp_path, {**env, "LMCACHE_LOG_LEVEL": "INFO"})
    assert loud.count(TOKEN) >= 4
