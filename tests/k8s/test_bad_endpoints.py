"""Catalogue of bad endpoint files: each is refused as app.py refuses, one clear line, nothing of
a secret in it.

Files that are not one endpoint (joined, duplicated, not UTF-8, huge, an alias bomb, a symlink
out of the repository, a key file), and values that would reach another language (PromQL, a
Kubernetes env var name, an image reference, redis-py's URL query) or look right and are not.
Each case writes its file into a fresh repository root and runs the reader app.py runs.
"""
from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Callable

import promql_parser
import pytest
import yaml

from config import resolve_environment
from config.endpoint_spec import default_trigger
from k8s.serving import load_endpoints
from tests.catalogue import refused
from tests.conftest import ROOT, context_for

SEED_TEXT = (ROOT / "tests" / "fixtures" / "endpoint-seed.yaml").read_text()
SEED = yaml.safe_load(SEED_TEXT)
KEY = ("-----BEGIN OPENSSH PRIVATE KEY-----\n"
       "b3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQAAAAAAAAABAAAA\n"
       "-----END OPENSSH PRIVATE KEY-----\n")
BOMB = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [" + ", ".join([f"*{chr(97 + i)}"] * 9) + "]\n"
    for i in range(8)) + "spec: *i\n"


def _values(edit: Callable[[dict], Any]) -> Callable[[Path], str]:
    """A case: the seed with one edit, as YAML."""
    def write(root: Path) -> str:
        raw = copy.deepcopy(SEED)
        edit(raw)
        (root / "e.yaml").write_text(yaml.safe_dump(raw, allow_unicode=True))
        return "e.yaml"
    return write


def _text(text: str | bytes) -> Callable[[Path], str]:
    def write(root: Path) -> str:
        path = root / "e.yaml"
        path.write_bytes(text if isinstance(text, bytes) else text.encode())
        return "e.yaml"
    return write


def _outside_symlink(root: Path) -> str:
    (root.parent / "id_ed25519").write_text(KEY)
    (root / "e.yaml").symlink_to(root.parent / "id_ed25519")
    return "e.yaml"


def _huge(root: Path) -> str:
    with (root / "e.yaml").open("wb") as f:   # 50 MB, sparse: the size is what is refused
        f.truncate(50 * 2**20)
    return "e.yaml"


def _spec(**fields) -> Callable[[Path], str]:
    return _values(lambda r: r["spec"].update(fields))


def _worker(**fields) -> Callable[[Path], str]:
    return _values(lambda r: r["spec"]["worker"].update(fields))


def _env_var(*items) -> Callable[[Path], str]:
    return _worker(environmentVariables=list(items))


def _l2_url(url: str) -> Callable[[Path], str]:
    return _values(lambda r: r["spec"]["kvCacheSpec"]["l2CacheSpec"].update(l2CacheLocalUrl=url))


def _resources(requests: dict, limits: dict) -> Callable[[Path], str]:
    def edit(r: dict) -> None:
        r["spec"]["worker"]["resources"]["requests"].update(requests)
        r["spec"]["worker"]["resources"]["limits"].update(limits)
    return _values(edit)


def _trigger(**trigger) -> Callable[[Path], str]:
    return _spec(autoScalingSpec={"minReplicaCount": 1, "maxReplicaCount": 2,
                                  "prometheusTrigger": {"query": "sum(up)", "targetValue": 4,
                                                        **trigger}})


PASSWORD_URL = "redis://redis.ns.svc.cluster.local:6379/0?password=hunter2"
CASES = [
    # files that are not one endpoint
    ("two files joined without a newline",
     _text(SEED_TEXT.rstrip("\n") + "---\n" + SEED_TEXT.replace("llama-3-1-8b", "other")),
     "e.yaml: line"),
    ("two documents", _text(SEED_TEXT + "---\n" + SEED_TEXT), "e.yaml: line"),
    ("duplicate key", _text(SEED_TEXT.replace("  replicas: 2\n", "  replicas: 2\n  replicas: 1\n")),
     "e.yaml: line 12"),
    ("not UTF-8", _text(SEED_TEXT.encode().replace(b"default", b"d\xe9faut")), "e.yaml: line 7"),
    ("a 50 MB file", _huge, "endpoints[0]"),
    ("an alias bomb", _text(BOMB), "e.yaml: line 2"),
    ("nested 5,000 deep", _text("[" * 5_000), "e.yaml"),
    ("an integer of 5,000 digits",
     _text(SEED_TEXT.replace("replicas: 2", "replicas: " + "9" * 5000)),
     "e.yaml"),
    ("symlink to a key outside the repository", _outside_symlink, "endpoints[0]"),
    ("a key file in the repository", _text(KEY), "e.yaml: <document>"),
    ("a .env file", _text("HF_TOKEN=s3cr3t-t0ken\n"), "e.yaml: <document>"),
    ("a list", _text("- a\n- b\n"), "e.yaml: <document>"),
    ("empty", _text(""), "e.yaml"),
    ("malformed", _text("spec: [unclosed\n"), "e.yaml"),
    ("a directory", lambda root: (root / "d.yaml").mkdir() or "d.yaml", "endpoints[0]"),
    ("missing", lambda root: "missing.yaml", "endpoints[0]"),
    ("absolute path outside", lambda root: str(root.parent / "elsewhere.yaml"), "endpoints[0]"),
    ("terminal escape in a string", _text(SEED_TEXT.replace(
        "namespace: default", 'namespace: "def\\e[2Jault"')), "e.yaml: line 7"),
    ("NaN target", _trigger(targetValue=float("nan")), "e.yaml: line"),
    # values that reach other languages
    ("modelName closing the PromQL selector", _spec(modelName='x"} or vector(1000) or up{a="'),
     "spec.modelName"),
    ("modelName with a newline", _spec(modelName="a\nb"), "spec.modelName"),
    ("modelName as a number", _spec(modelName=3.1), "spec.modelName"),
    ("unparsable trigger query", _trigger(query="sum(x{"), "prometheusTrigger.query"),
    ("image with a space", _worker(image="lmcache/vllm-openai :v0.5.4"), "spec.worker.image"),
    ("image with a non-ASCII tag", _worker(image="lmcache/vllm-openai:v0.5.４"),
     "spec.worker.image"),
    ("image registry with a space", _worker(image="my registry.io/vllm:1"), "spec.worker.image"),
    ("env var name with '='", _env_var({"name": "A=B", "value": "1"}),
     "environmentVariables[0].name"),
    ("empty env var name", _env_var({"name": "", "value": "1"}), "environmentVariables[0].name"),
    ("env var twice", _env_var({"name": "A", "value": "1"}, {"name": "A", "value": "2"}),
     "environmentVariables[1].name"),
    ("env var as NAME=value", _env_var("HF_TOKEN=s3cr3t-t0ken"), "environmentVariables[0]"),
    ("env var with a stray key", _env_var({"name": "HF_TOKEN", "value": "s3cr3t-t0ken", "x": 1}),
     "environmentVariables[0]"),
    ("a token as a literal", _env_var({"name": "HF_TOKEN", "value": "s3cr3t-t0ken"}),
     "environmentVariables[0].value"),
    ("an API key in the args", _worker(args=["--api-key", "s3cr3t-t0ken"]), "spec.worker.args"),
    ("health check path with a space", _spec(loadBalancer={"healthCheckPath": "/he alth"}),
     "loadBalancer.healthCheckPath"),
    ("password in the L2 URL's query", _l2_url(PASSWORD_URL), "l2CacheLocalUrl"),
    ("password in the L2 URL", _l2_url("rediss://default:hunter2@redis.ns:6379"),
     "l2CacheLocalUrl"),
    ("L2 host with a space", _l2_url("redis://my host:6379"), "l2CacheLocalUrl"),
    # values that look right and are not
    ("GPU request below the limit", _resources({"nvidia.com/gpu": 2}, {"nvidia.com/gpu": 4}),
     "requests.nvidia.com/gpu"),
    ("full-width GPU count", _resources({"nvidia.com/gpu": "４"}, {"nvidia.com/gpu": "４"}),
     "nvidia.com/gpu"),
    ("full-width CPU count", _resources({"cpu": "１６"}, {}), "requests.cpu"),
    ("a working set below one chunk",
     _values(lambda r: r["spec"]["kvCacheSpec"].update(workingSetTokens=100)),
     "kvCacheSpec.workingSetTokens"),
    ("a working set in words",
     _values(lambda r: r["spec"]["kvCacheSpec"].update(workingSetTokens="5M")),
     "kvCacheSpec.workingSetTokens"),
    ("a working set as true",
     _values(lambda r: r["spec"]["kvCacheSpec"].update(workingSetTokens=True)),
     "kvCacheSpec.workingSetTokens"),
]


@pytest.mark.parametrize("case, write, field", CASES, ids=[c[0] for c in CASES])
def test_bad_endpoint_file_is_one_clear_line(tmp_path, capsys, case, write, field):
    root = tmp_path / "repo"
    root.mkdir()
    written = write(root)
    ctx = context_for(env="dev")
    ctx["environments"]["dev"]["endpoints"] = [written]
    cfg = resolve_environment(ctx)
    refused(capsys, lambda: load_endpoints(cfg, root), field)


def test_the_seed_itself_is_served(tmp_path):
    """The catalogue's cases are one edit away from a file that is accepted."""
    (tmp_path / "e.yaml").write_text(SEED_TEXT)
    ctx = context_for(env="dev")
    ctx["environments"]["dev"]["endpoints"] = ["e.yaml"]
    (spec,) = load_endpoints(resolve_environment(ctx), tmp_path)
    assert spec.model_name == "Llama-3.1-8B-Instruct"


def test_a_symlink_inside_the_repository_is_followed(tmp_path):
    (tmp_path / "real.yaml").write_text(SEED_TEXT)
    (tmp_path / "e.yaml").symlink_to("real.yaml")
    ctx = context_for(env="dev")
    ctx["environments"]["dev"]["endpoints"] = ["e.yaml"]
    (spec,) = load_endpoints(resolve_environment(ctx), tmp_path)
    assert spec.source_file == "real.yaml"


@pytest.mark.parametrize("name", ['x"} or vector(1000) or up{a="', "a\\", "é\n}"])
def test_the_default_trigger_selects_exactly_the_model_name(name):
    """Whatever reaches the PromQL query is one label value, however it is spelled."""
    selectors = []
    promql_parser.walk(promql_parser.parse(default_trigger(name).query),
                       lambda node: selectors.append(node)
                       if isinstance(node, promql_parser.VectorSelector) else None)
    (selector,) = selectors
    assert [(m.name, m.value) for m in selector.matchers.matchers] == [("model_name", name)]
