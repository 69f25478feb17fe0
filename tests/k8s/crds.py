"""Schema checks for custom resources (KEDA), which kubernetes-validate does not know.

The schemas come from npm `@kubernetes-models/keda` (generated from KEDA's CRDs, pinned in
package-lock.json); `validate_crd_objects.mjs` runs them under the venv's Node.js.
"""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_BUILTIN_GROUPS = ("v1", "apps/", "batch/", "policy/", "autoscaling/", "networking.k8s.io/",
                   "rbac.authorization.k8s.io/", "storage.k8s.io/", "apiextensions.k8s.io/")


def is_custom_resource(doc: dict) -> bool:
    api = doc["apiVersion"]
    return not (api == "v1" or api.startswith(_BUILTIN_GROUPS[1:]))


def validate_custom_resources(docs: list[dict]) -> None:
    env = {**os.environ, "PATH": f"{ROOT / '.venv' / 'bin'}{os.pathsep}{os.environ['PATH']}"}
    proc = subprocess.run(["node", str(Path(__file__).with_name("validate_crd_objects.mjs"))],
                          input=json.dumps(docs), capture_output=True, text=True, cwd=ROOT,
                          env=env, timeout=60)
    lines = proc.stdout.splitlines()
    assert proc.returncode == 0 and len(lines) == len(docs), proc.stdout + proc.stderr
