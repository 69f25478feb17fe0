"""An endpoint is judged with its own model's shape: a model we know by name, the config.json
upload-model recorded for its modelLocation, or a copy the file points at; a model none of them
gives is one line naming what to provide."""
from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import yaml

from config import ConfigError, resolve_environment
from config.endpoint_spec import load_endpoint, parse_endpoint
from config.instances import GPU_MODELS, gpu_shape
from config.models import KNOWN_MODELS, RECORDED, known_model
from config.regions import instance_types_in
from k8s.l2 import GIB, break_even_gbs
from k8s.serving import fit_endpoint, l2_plan, weights_fit_notice
from tests.config.test_models import config_json
from tests.conftest import DECLARED, ENVIRONMENTS, ROOT, context_for
from tools.upload_model import record_model_config

SEED = yaml.safe_load((ROOT / "tests" / "fixtures" / "endpoint-seed.yaml").read_text())
TYPE = "g5.12xlarge"   # 4 x A10G: the team of issue 30


def _env(name: str):
    """A declared environment, its GPU nodes made g5.12xlarge and its L2 ElastiCache (where
    its region offers no g5.12xlarge, the test is about another: skipped, saying so)."""
    ctx = {**context_for(), **DECLARED[name]}
    env = ctx["environments"][DECLARED[name]["env"]]
    region = env["region"]
    if DECLARED[name].get("china"):
        region = env["chinaVariant"].get("region", region)
    if TYPE not in instance_types_in(region):
        pytest.skip(f"{region} offers no {TYPE}: these tests judge a model's shape on it")
    # the environment's shared L2 on ElastiCache, whatever its file's cache (self-hosted: the
    # in-cluster Valkey's client refusal, none: no shared L2) would decide before the verdict
    for raw in (env, env.get("chinaVariant", {})):
        if "cache" in raw:
            raw["cache"] = {"kind": "elasticache"}
    variant = env.get("chinaVariant", {})
    for raw in (env, variant):
        raw.pop("instanceTypeMap", None)
        raw.pop("instanceHourlyUsd", None)
    env["nodeGroups"] = {**env["nodeGroups"], "gpu": [
        {"name": "g5", "instanceTypes": [TYPE], "minSize": 1, "maxSize": 4,
         "diskSizeGiB": 300}]}
    if "nodeGroups" in variant:
        variant["nodeGroups"] = env["nodeGroups"]
    return resolve_environment(ctx)


def _raw(model: str, l2: bool = True, **kv) -> dict:
    raw = copy.deepcopy(SEED)
    raw["spec"].update(modelName=model, instanceType=f"ml.{TYPE}")
    raw["spec"]["kvCacheSpec"].update(enableL2Cache=l2, forceL2Cache=False, **kv)
    if not l2:
        raw["spec"]["kvCacheSpec"].pop("l2CacheSpec")
    raw["spec"]["worker"]["resources"]["requests"].update(cpu="40", memory="160Gi")
    return raw


@pytest.mark.parametrize("name", ENVIRONMENTS)
def test_qwen25_32b_on_g5_12xlarge_is_judged_with_its_own_shape(name):
    cfg = _env(name)
    parsed = parse_endpoint(cfg.name, "endpoints/qwen.yaml", _raw("Qwen/Qwen2.5-32B-Instruct"))
    spec = fit_endpoint(cfg, parsed)    # the L2 kept or dropped, a line says it with the shape
    v = l2_plan(cfg, parsed).verdict
    assert v.model is KNOWN_MODELS["qwen2.5-32b"]
    assert v.model.kv_bytes_per_token == 2 * 64 * 8 * 128 * 2       # its config.json
    assert v.need_gbs == pytest.approx(break_even_gbs(v.model, GPU_MODELS["g5"][1], 8192))
    said = [w for w in spec.warnings if "Qwen2.5-32B: 256 KiB of KV per token" in w]
    assert len(said) == 1 and "Llama-3.2-3B" not in " ".join(spec.warnings)


@pytest.mark.parametrize("name", ENVIRONMENTS)
def test_a_model_we_do_not_know_is_one_line_naming_what_to_provide(name):
    cfg = _env(name)
    spec = parse_endpoint(cfg.name, "endpoints/own.yaml", _raw("acme/Own-Model-13B"))
    assert spec.model is None
    with pytest.raises(ConfigError) as err:
        fit_endpoint(cfg, spec)
    e = err.value
    assert e.field == "endpoints/own.yaml: spec.modelName" and e.value == "acme/Own-Model-13B"
    assert RECORDED.format(location=spec.model_location) in e.allowed
    assert "upload-model" in e.allowed and "kvCacheSpec.modelShape" in e.allowed
    assert "\n" not in str(e)
    # without an L2 nothing refuses, and one line says what goes unchecked
    fit = fit_endpoint(cfg, parse_endpoint(cfg.name, "e.yaml", _raw("acme/Own-Model-13B",
                                                                     l2=False)))
    said = [w for w in fit.warnings if "spec.modelName" in w]
    assert len(said) == 1 and "upload-model" in said[0] and "\n" not in said[0]


def _team_repository(tmp_path: Path, raw: dict) -> Path:
    (tmp_path / "endpoints").mkdir(parents=True)
    (tmp_path / "endpoints" / "own.yaml").write_text(yaml.safe_dump(raw))
    return tmp_path


OWN = {**config_json(KNOWN_MODELS["qwen2.5-14b"]), "num_hidden_layers": 40,
       "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2"}


def test_the_config_json_upload_model_records_is_what_synth_judges(tmp_path):
    cfg = _env("dev")
    model_dir = tmp_path / "Own-Model-13B"
    model_dir.mkdir()
    (model_dir / "config.json").write_text(json.dumps(OWN))
    raw = _raw("acme/Own-Model-13B")
    location = raw["spec"]["modelSourceConfig"]["modelLocation"]
    root = _team_repository(tmp_path / "repo", raw)
    line = record_model_config(model_dir, location, root)
    assert line.startswith(f"{RECORDED.format(location=location)}: recorded")
    assert json.loads((root / RECORDED.format(location=location)).read_text()) == OWN
    parsed = load_endpoint(cfg.name, "endpoints/own.yaml", root)
    spec = fit_endpoint(cfg, parsed)
    v = l2_plan(cfg, parsed).verdict
    assert (v.model.layers, v.model.source) == (40, RECORDED.format(location=location))
    assert v.model.kv_bytes_per_token == 2 * 40 * 8 * 128 * 2
    assert any(f"from {RECORDED.format(location=location)}" in w for w in spec.warnings)


def test_a_file_may_point_at_a_copy_of_config_json_and_a_bad_one_names_its_key(tmp_path):
    cfg = _env("dev")
    root = _team_repository(tmp_path, _raw("acme/Own-Model-13B", modelShape="shapes/own.json"))
    (root / "shapes").mkdir()
    (root / "shapes" / "own.json").write_text(json.dumps(OWN))
    spec = load_endpoint(cfg.name, "endpoints/own.yaml", root)
    assert (spec.model.layers, spec.model.source) == (40, "shapes/own.json")
    (root / "shapes" / "own.json").write_text(json.dumps({**OWN, "kv_lora_rank": 512}))
    with pytest.raises(ConfigError) as err:
        load_endpoint(cfg.name, "endpoints/own.yaml", root)
    assert err.value.field == "shapes/own.json: kv_lora_rank"
    (root / "shapes" / "own.json").unlink()
    with pytest.raises(ConfigError) as err:
        load_endpoint(cfg.name, "endpoints/own.yaml", root)
    assert err.value.field == "endpoints/own.yaml: spec.kvCacheSpec.modelShape"


def test_weights_that_fill_the_gpus_are_said_for_every_known_model():
    cfg = _env("dev")
    room = 4 * gpu_shape(TYPE).gpu_memory_gib * 0.9
    for m in KNOWN_MODELS.values():
        spec = parse_endpoint(cfg.name, "e.yaml", _raw(m.name, l2=False))
        said = weights_fit_notice(spec)
        assert (said is not None) == (m.weight_bytes / GIB >= room), m.name
        if said:
            assert said.startswith("e.yaml: spec.worker.resources.limits.nvidia.com/gpu: ")
    assert known_model("Qwen2.5-72B").weight_bytes / GIB > room   # the case that matters


def test_an_fp8_kv_cache_halves_the_kv_the_verdict_moves_not_the_weights():
    cfg = _env("dev")
    raw = _raw("Qwen/Qwen2.5-32B-Instruct")
    raw["spec"]["worker"]["args"].append("--kv-cache-dtype=fp8_e4m3")
    v = l2_plan(cfg, parse_endpoint(cfg.name, "e.yaml", raw)).verdict
    m = KNOWN_MODELS["qwen2.5-32b"]
    assert v.model.kv_bytes_per_token * 2 == m.kv_bytes_per_token
    assert v.model.weight_bytes == m.weight_bytes
