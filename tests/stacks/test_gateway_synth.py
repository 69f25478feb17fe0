"""A published HyperPod file asking for the inference gateway (`spec.inferenceGateway.enabled`)
synthesizes in the global sample with a Gateway named: the whole CDK app with cdk-nag and CDK's
validation, and the first-deploy scheduling gate over every pod. China is the `corp-cn` sample
(its endpoints join a gateway), under every gate the shipped environments pass."""
from __future__ import annotations

import json

import pytest
import yaml

from config import resolve_environment
from k8s.serving import load_endpoints
from tests.conftest import ROOT, context_for
from tests.stacks.cluster_model import manifest_pods, node_groups, unschedulable

PUBLISHED = ROOT / "tests" / "fixtures" / "hyperpod" / \
    "hpcli-sample-llama31-8b-intelligent-routing.yaml"
GATEWAY = {"gateway": {"name": "inference", "namespace": "istio-ingress"}}


@pytest.fixture(scope="module")
def synth(tmp_path_factory):
    import aws_cdk as cdk

    from stacks.app_builder import build

    root = tmp_path_factory.mktemp("gateway-root")
    raw = yaml.safe_load(PUBLISHED.read_text())
    raw["spec"]["inferenceGateway"] = {"enabled": True}      # HyperPod's own opt-in
    (root / "endpoints").mkdir()
    (root / "endpoints" / "asks.yaml").write_text(yaml.safe_dump(raw))
    ctx = context_for(env="dev")
    ctx["environments"]["dev"].update(inferenceGateway=GATEWAY,
                                      endpoints=["endpoints/asks.yaml"])
    cfg = resolve_environment(ctx)
    specs = load_endpoints(cfg, root)
    assert specs[0].inference_gateway
    out = tmp_path_factory.mktemp("gateway-cdk")
    app = cdk.App(context=ctx, outdir=str(out))
    build(app, cfg, specs)
    assembly = app.synth()
    return out, {s.stack_name: s.template for s in assembly.stacks}


def test_cdk_nag_and_validation_find_nothing_but_our_own_warnings(synth):
    out, _ = synth
    report = json.loads((out / "validation-report.json").read_text())
    plugins = {r["pluginName"]: r for r in report["pluginReports"]}
    assert "AwsSolutions" in plugins
    for plugin, rep in plugins.items():
        assert rep["conclusion"] == "success", (plugin, rep["violations"])
        assert [v for v in rep["violations"]
                if not v["ruleName"].startswith("Annotation::kvcache:")] == [], plugin


def test_every_pod_fits_a_node_group_beside_the_gateway_path(synth):
    _, templates = synth
    pods = manifest_pods(templates)
    assert any(p.owner.endswith("-epp") for p in pods)
    assert unschedulable(pods, node_groups(templates)) == []
    serving = json.dumps(templates)
    assert "InferencePool" in serving and "HTTPRoute" in serving
