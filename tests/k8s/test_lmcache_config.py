"""The worker's LMCache config, read by the LMCache release the worker image carries, with that
release's own parser (tests/k8s/lmcache_parse.py): 0.3.7 for lmcache/vllm-openai v0.3.7, 0.5.4
for v0.5.4, and for an image whose LMCache no record pins, the oldest and the newest we have.
LMCache ignores unknown keys (with a warning) and turns bad values into None, so the test
asserts the values it read and that it warned about no key.

For the managed L2, the real init-container script runs here with a stub `aws` that prints a
token, exactly as it would write the file in the pod.
"""
from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pytest
import yaml

from config.images import image_for, lmcache_version
from k8s.workers import tier_settings
from k8s.serving import load_endpoints
from tests.background import Background
from tests.conftest import ENVIRONMENTS, ROOT
from tests.k8s.lmcache_parse import LMCACHE_PY, NEWEST, PARSERS, parse, parser_versions, start
from tests.k8s.test_charts import SEED, _env, _spec, render


def _worker_pod(docs):
    return next(d for d in docs if d["kind"] in ("Deployment", "StatefulSet")
                and d["metadata"]["name"].endswith(("-workers", "-prefill"))
                )["spec"]["template"]["spec"]


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


def parsers_for(image_ref: str) -> list[str]:
    """The parser(s) of the LMCache an image carries: its release, or (not known) all."""
    version = lmcache_version(image_for(image_ref))
    if version is None:
        return [*parser_versions(), NEWEST]
    return [".".join(map(str, version))]


def check_parsed(parsed: dict, rendered: dict, image_ref: str) -> None:
    """LMCache read every key we wrote, each as we wrote it, and nothing it does not know."""
    assert parsed["unknown"] == [], (image_ref, parsed["unknown"])
    for key, value in rendered.items():
        assert parsed["values"][key] == value, (image_ref, key, parsed["values"][key])
    version = lmcache_version(image_for(image_ref))
    policy = tier_settings(version, "remote_url" in rendered or "remote_serde" in rendered)
    # use_layerwise also needs its guard (tests/k8s/worker_gates.py assert_layerwise_is_guarded)
    assert set(policy) - {"use_layerwise"} <= set(rendered), (image_ref,
                                                               set(policy) - set(rendered))


def test_a_parser_for_every_lmcache_an_image_carries():
    """requirements-lmcache-parsers.txt (what make installs) names the LMCache of each image
    with a known release: the catalogue's and the published files' lmcache/vllm-openai tags."""
    from config.images import IMAGES
    from tests.k8s.test_hyperpod_corpus import SERVED, _yaml
    refs = [i.source_ref for i in IMAGES.values()] + [
        _yaml(f)["spec"]["worker"]["image"] for f in SERVED]
    known = {".".join(map(str, v)) for r in refs if (v := lmcache_version(image_for(r)))}
    assert known == set(parser_versions())
    assert all((PARSERS / v).is_dir() for v in known), "run make (.lmcache-parsers)"


BACKENDS = ["redis", "valkey", None]
IMAGES = ["lmcache/vllm-openai:v0.5.4", "lmcache/vllm-openai:v0.3.7", "vllm/vllm-openai:v0.19.1"]
L2_IMAGE = IMAGES[0]   # the one of them whose vLLM + LMCache may have an L2
CASES = [(i, b) for i in IMAGES for b in BACKENDS]


@pytest.fixture(scope="module")
def parsed(tmp_path_factory) -> dict:
    """Render each image x backend, write its config as the pod would, and parse them with
    one run per LMCache release."""
    assert LMCACHE_PY.exists(), "run `make test` (it creates .venv-lmcache)"
    cfg = _env("dev")
    files, rendered = {}, {}
    for i, (image, backend) in enumerate(CASES):
        docs = render(cfg, _spec(cfg, backend=backend, image=image))
        path = _config_file(docs, tmp_path_factory.mktemp(f"case{i}"))
        files[(image, backend)] = str(path)
        rendered[(image, backend)] = (yaml.safe_load(path.read_text()), docs)
    out = {}
    versions = {v for image, _ in CASES for v in parsers_for(image)}
    start(*versions)
    for version in versions:
        cases = [c for c in CASES if version in parsers_for(c[0])]
        for case, result in zip(cases, parse(version, [files[c] for c in cases])):
            out[(case, version)] = result
    return {"parsed": out, "rendered": rendered}


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-{c[1]}")
def test_the_images_lmcache_reads_the_values_we_render(parsed, case):
    image, backend = case
    ours, docs = parsed["rendered"][case]
    for version in parsers_for(image):
        got = parsed["parsed"][(case, version)]
        check_parsed(got, ours, image)
        values = got["values"]
        assert values["local_cpu"] is True and values["max_local_cpu_size"] == 20.0  # (96-12-4)/4
        assert values["chunk_size"] == 256 and values["save_unfull_chunk"] is False
        if backend is None or image != L2_IMAGE:
            # L1 alone, stored layer by layer beside the forward: asked for or (an L2 asked of
            # an image whose pair does not report a failed L2 read: k8s/workers.py l2_refusal)
            # what the image gets instead
            assert values["remote_url"] is None and values["use_layerwise"] is True
            assert "blocking_timeout_secs" not in ours and "remote_serde" not in ours
            continue
        assert values["use_layerwise"] is False   # LMCache retrieves layerwise from L1 only
        assert values["blocking_timeout_secs"] >= 2 and values["lookup_timeout_ms"] == 200
        # the in-cluster Valkey by LMCache's C++ client where the release has it (0.5.4)
        resp = image.endswith("v0.5.4")
        expected = {"redis": "rediss://:s3cretT0ken@l2.example.internal:6379?socket_timeout=1",
                    "valkey": "resp://kvcache-valkey." if resp else "redis://kvcache-valkey."}
        assert values["remote_url"].startswith(expected[backend]), values["remote_url"]
        if backend == "valkey" and resp:
            assert values["extra_config"]["resp_num_threads"] == 8
            assert values["extra_config"]["save_chunk_meta"] is False
        # only 0.5.x has the health monitor that reads fallback_policy
        health = (values.get("extra_config") or {}).get("fallback_policy")
        assert health == ("local_cpu" if image.endswith("v0.5.4") else None), version
        # the token exists only in the pod's memory volume, never in what we render
        assert "s3cretT0ken" not in yaml.safe_dump_all(docs)


@pytest.mark.parametrize("name", ENVIRONMENTS)
def test_every_environments_workers_config_is_read_by_their_lmcache(synths, name, tmp_path):
    """Gate: each endpoint of the environment, as its Serving stack applies it, read by the
    LMCache release its image carries."""
    s = synths[name]
    charts = {c.node.id: c for c in s.stacks.serving.charts}
    specs = load_endpoints(s.cfg, ROOT)
    assert specs or not s.cfg.endpoint_files
    start(*{v for spec in specs for v in parsers_for(spec.worker_image)})
    for i, spec in enumerate(specs):
        # a disaggregated endpoint's LMCache (its L1) is on its prefill workers
        chart = charts.get(f"{spec.name}-workers") or charts[f"{spec.name}-prefill"]
        path = _config_file(chart.to_json(), tmp_path / f"endpoint{i}")
        rendered = yaml.safe_load(path.read_text())
        for version in parsers_for(spec.worker_image):
            (got,) = parse(version, [str(path)])
            check_parsed(got, rendered, spec.worker_image)


def test_elasticache_by_valkey_glide_gets_its_token_at_pod_start(tmp_path, monkeypatch):
    """An image that carries valkey-glide-sync reaches ElastiCache by valkey:// in cluster
    mode over TLS; the init container writes the AUTH token into extra_config (the real
    script, a stub `aws`), and LMCache 0.5.4's own parser reads every value."""
    import config.images

    monkeypatch.setattr(config.images, "GLIDE_IMAGES", frozenset({"vllm-lmcache"}))
    cfg = _env("dev")
    docs = render(cfg, _spec(cfg, backend="redis", image="lmcache/vllm-openai:v0.5.4"))
    path = _config_file(docs, tmp_path)
    (got,) = parse("0.5.4", [str(path)])
    assert got["unknown"] == []
    v = got["values"]
    assert v["remote_url"] == "valkey://l2.example.internal:6379"
    extra = v["extra_config"]
    assert extra["valkey_password"] == "s3cretT0ken" and extra["valkey_mode"] == "cluster"
    assert extra["tls_enable"] is True and extra["save_chunk_meta"] is False
    assert extra["fallback_policy"] == "local_cpu"      # the health monitor's keys stay
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


def _start_lmcache_remote(env: dict) -> Background:
    """The seed image's own LMCache (lmcache/vllm-openai v0.5.4 carries 0.5.4)."""
    own = PARSERS / ".".join(map(str, lmcache_version(image_for(SEED["spec"]["worker"]["image"]))))
    return Background([str(LMCACHE_PY), "-c", _CONNECT, TOKEN], timeout=120,
                      env={**os.environ, **env, "PYTHONPATH": str(own)})


def _logged(run: Background) -> str:
    proc = run.result()
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "AUTH-IN-POOL" in proc.stdout  # the token did reach the redis client
    return proc.stdout + proc.stderr


TOKEN = "s3cretT0ken"


class _LogRuns:
    """The seed image's LMCache, run twice on dev's rendered config: at our log level, and at
    LMCache's default level (which prints the token: the test can see a leak)."""

    def __init__(self, tmp: Path):
        cfg = _env("dev")
        docs = render(cfg, _spec(cfg, backend="redis"))
        runtime = _config_file(docs, tmp)
        text = runtime.read_text()
        # point the URL at a closed loopback port: the lookup fails fast, the token stays in it
        runtime.write_text(text.replace("l2.example.internal:6379", "127.0.0.1:9"))
        worker = next(c for c in _worker_pod(docs)["containers"] if c["name"] == "vllm")
        env = {e["name"]: e["value"] for e in worker["env"]
               if e["name"].startswith(("LMCACHE_", "PYTHONHASHSEED"))}
        env["LMCACHE_CONFIG_FILE"] = str(runtime)
        # both side by side, from the session's start (each is mostly torch's import)
        self.ours = _start_lmcache_remote(env)
        self.default_level = _start_lmcache_remote({**env, "LMCACHE_LOG_LEVEL": "INFO"})

    def stop(self) -> None:
        self.ours.stop()
        self.default_level.stop()


@pytest.mark.starts_early(start=_LogRuns)
def test_the_l2_token_appears_in_no_lmcache_log_line(early):
    logged = _logged(early.run.ours)
    assert TOKEN not in logged
    assert "LMCache WARNING" in logged  # its warnings still reach the log (the failed lookup)
    assert _logged(early.run.default_level).count(TOKEN) >= 4


@pytest.mark.parametrize("name", ["resp", "valkey"])
def test_a_connectors_password_reaches_the_extra_config_its_lmcache_reads(
        tmp_path, monkeypatch, name):
    """The token the init container writes (the real script, a stub `aws`) lands in the
    rendered extra_config under the connector's own key, and LMCache 0.5.4's parser reads it
    there, for either connector reaching a secret-bearing L2 (resp:// reaches none today:
    k8s/l2.py connector_for; forced onto the managed L2 here)."""
    import k8s.serving
    from k8s.l2 import CONNECTORS

    c = CONNECTORS[name]
    monkeypatch.setattr(k8s.serving, "connector_for", lambda *_: c)
    cfg = _env("dev")
    docs = render(cfg, _spec(cfg, backend="redis", image="lmcache/vllm-openai:v0.5.4"))
    (got,) = parse("0.5.4", [str(_config_file(docs, tmp_path))])
    assert got["unknown"] == []
    assert got["values"]["remote_url"].startswith(c.scheme)
    assert got["values"]["extra_config"][c.password_key] == "s3cretT0ken"
    assert "s3cretT0ken" not in yaml.safe_dump_all(docs)
    # and that key is the one the connector's adapter reads its password from
    adapter = PARSERS / "0.5.4" / "lmcache" / "v1" / "storage_backend" / "connector" / (
        "redis_adapter.py" if name == "resp" else "valkey_adapter.py")
    assert f'extra_config.get("{c.password_key}"' in adapter.read_text()
