"""Schema checks for custom resources, which kubernetes-validate does not know.

KEDA's and Istio's schemas come from npm `@kubernetes-models/keda` and `@kubernetes-models/istio`
(generated from KEDA's CRDs and Istio 1.29.2's, pinned in package-lock.json); `validate_crd_objects.mjs` runs them under the venv's Node.js. The
InferencePool's and HTTPRoute's are the pinned CRDs themselves (k8s/crds/, tests/fixtures/
gateway/), checked strictly with jsonschema.
"""
from __future__ import annotations

import copy
import json
import os
import subprocess
from functools import lru_cache
from pathlib import Path

import jsonschema
import yaml

ROOT = Path(__file__).resolve().parents[2]
_BUILTIN_GROUPS = ("v1", "apps/", "batch/", "policy/", "autoscaling/", "networking.k8s.io/",
                   "rbac.authorization.k8s.io/", "storage.k8s.io/", "apiextensions.k8s.io/")


def is_custom_resource(doc: dict) -> bool:
    api = doc["apiVersion"]
    return not (api == "v1" or api.startswith(_BUILTIN_GROUPS[1:]))


def _strict(schema: dict) -> dict:
    """A CRD's openAPIV3Schema as JSON Schema that refuses fields it does not declare (what the
    API server's pruning would drop silently: a field we set and it ignores is a bug)."""
    schema = copy.deepcopy(schema)

    def walk(node):
        if isinstance(node, dict):
            if node.get("type") == "object" and "properties" in node \
                    and not node.get("x-kubernetes-preserve-unknown-fields"):
                node.setdefault("additionalProperties", False)
            for v in list(node.values()):
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)
    walk(schema)
    schema["properties"]["metadata"] = {"type": "object"}
    return schema


def _crd_schema(doc: dict, version: str = "v1") -> dict:
    (v,) = [v for v in doc["spec"]["versions"] if v["name"] == version]
    return _strict(v["schema"]["openAPIV3Schema"])


@lru_cache(maxsize=1)
def gateway_schemas() -> dict[str, dict]:
    """apiVersion -> strict schema: the pinned InferencePool and HTTPRoute CRDs."""
    from k8s.gateway import POOL_API, ROUTE_API, crd
    from tests.conftest import YAML_LOADER

    route = yaml.load((ROOT / "tests" / "fixtures" / "gateway" /    # 340 kB
                       "gateway.networking.k8s.io_httproutes.yaml").read_text(),
                      Loader=YAML_LOADER)
    return {POOL_API: _crd_schema(crd()), ROUTE_API: _crd_schema(route)}


def validate_custom_resources(docs: list[dict]) -> None:
    gateway = [d for d in docs if d["apiVersion"] in gateway_schemas()]
    for doc in gateway:
        jsonschema.validate(doc, gateway_schemas()[doc["apiVersion"]])
    docs = [d for d in docs if d not in gateway]
    if not docs:
        return
    env = {**os.environ, "PATH": f"{ROOT / '.venv' / 'bin'}{os.pathsep}{os.environ['PATH']}"}
    proc = subprocess.run(["node", str(Path(__file__).with_name("validate_crd_objects.mjs"))],
                          input=json.dumps(docs), capture_output=True, text=True, cwd=ROOT,
                          env=env, timeout=60)
    lines = proc.stdout.splitlines()
    assert proc.returncode == 0 and len(lines) == len(docs), proc.stdout + proc.stderr
