"""A published HyperPod file asking for the inference gateway (`spec.inferenceGateway.enabled`)
synthesizes in the global sample with a Gateway named: the whole CDK app with cdk-nag and CDK's
validation, and the first-deploy scheduling gate over every pod. China is the `corp-cn` sample
(its endpoints join a gateway), under every gate the shipped environments pass. The synth runs
in the test's own process, whose CDK kernel is loaded already (a subprocess paid ~5 s of CPU
for the imports and the kernel's start)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tests.conftest import ROOT

PUBLISHED = ROOT / "tests" / "fixtures" / "hyperpod" / \
    "hpcli-sample-llama31-8b-intelligent-routing.yaml"
# the dev sample's system nodes (m6i.xlarge) hold 2 of upstream's 4 picker CPUs
GATEWAY = {"gateway": {"name": "inference", "namespace": "istio-ingress"},
           "implementation": "istio", "picker": {"cpu": 2}}


def synthesize(tmp: Path) -> None:
    """The dev sample with a Gateway named, serving the published file with HyperPod's own
    opt-in added, synthesized into tmp/out as `cdk synth` would."""
    import aws_cdk as cdk

    from config import resolve_environment
    from k8s.serving import load_endpoints
    from stacks.app_builder import build
    from tests.conftest import context_for

    raw = yaml.safe_load(PUBLISHED.read_text())
    raw["spec"]["inferenceGateway"] = {"enabled": True}
    (tmp / "endpoints").mkdir(parents=True, exist_ok=True)
    (tmp / "endpoints" / "asks.yaml").write_text(yaml.safe_dump(raw))
    ctx = context_for(env="dev")
    ctx["environments"]["dev"].update(inferenceGateway=GATEWAY,
                                      endpoints=["endpoints/asks.yaml"])
    cfg = resolve_environment(ctx)
    specs = load_endpoints(cfg, tmp)
    assert specs[0].inference_gateway
    app = cdk.App(context=ctx, outdir=str(tmp / "out"))
    build(app, cfg, specs)
    app.synth()


@pytest.fixture(scope="module")
def out(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("gateway")
    synthesize(tmp)
    return tmp / "out"


def test_cdk_nag_and_validation_find_nothing_but_our_own_warnings(out):
    report = json.loads((out / "validation-report.json").read_text())
    plugins = {r["pluginName"]: r for r in report["pluginReports"]}
    assert "AwsSolutions" in plugins
    for plugin, rep in plugins.items():
        assert rep["conclusion"] == "success", (plugin, rep["violations"])
        assert [v for v in rep["violations"]
                if not v["ruleName"].startswith("Annotation::kvcache:")] == [], plugin


def test_every_pod_fits_a_node_group_beside_the_gateway_path(out):
    from tests.stacks.cluster_model import manifest_pods, node_groups, unschedulable
    templates = {p.name.removesuffix(".template.json"): json.loads(p.read_text())
                 for p in out.glob("*.template.json")}
    pods = manifest_pods(templates)
    assert any(p.owner.endswith("-epp") for p in pods)
    assert unschedulable(pods, node_groups(templates)) == []
    serving = json.dumps(templates)
    assert "InferencePool" in serving and "HTTPRoute" in serving
