"""Quality gates on every synthesized template: cdk-nag, CDK's own validation, cfn-lint."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from config.notices import ack_id
from stacks.app_builder import notices
from k8s.serving import load_endpoints
from tests.conftest import ROOT, ENVIRONMENTS


@pytest.mark.parametrize("name", ENVIRONMENTS)
def test_cdk_nag_and_cdk_validation_report_no_unacknowledged_findings(synths, name):
    report = json.loads((synths[name].outdir / "validation-report.json").read_text())
    plugins = {r["pluginName"]: r for r in report["pluginReports"]}
    assert "AwsSolutions" in plugins  # the nag pack really ran
    # With `@aws-cdk/core:annotationsInValidationReport` the report also carries annotations:
    # the only ones allowed are our own warnings (config/notices.py), each under the id of its
    # kind, exactly those the environment has and does not acknowledge.
    s = synths[name]
    acked = set(s.cfg.acknowledged_warnings)
    expected = sorted((f"Annotation::{ack_id(w)}", str(w)) for w in notices(s.cfg, load_endpoints(
        s.cfg, ROOT)) if ack_id(w) not in acked)
    said = []
    for plugin, rep in plugins.items():
        assert rep["conclusion"] == "success", (plugin, rep["violations"])
        ours = [(v["ruleName"], v["description"]) for v in rep["violations"]
                if v["ruleName"].startswith("Annotation::kvcache:")
                and v["severity"] == "warning"]
        said += ours
        findings = [v for v in rep["violations"]
                    if (v["ruleName"], v["description"]) not in ours]
        assert findings == [], plugin
    assert sorted(set(said)) == sorted(set(expected))
    # a configured ElastiCache that no endpoint's L2 verdict uses is said once, not provisioned
    unused = [w for w in expected if w[0] == "Annotation::kvcache:changed:environment:cache.kind"
              and "no ElastiCache is provisioned" in w[1]]
    provisioned = any(r["Type"] == "AWS::ElastiCache::ReplicationGroup"
                      for t in s.templates.values() for r in t["Resources"].values())
    assert len(unused) == (s.cfg.cache.kind == "elasticache" and not provisioned), unused


def test_validation_is_configured_as_errors():
    flags = json.loads((ROOT / "cdk.json").read_text())["context"]
    assert flags["@aws-cdk/core:validateAgainstDefaultRules"] is True


@pytest.mark.parametrize("name", ENVIRONMENTS)
def test_cfn_lint_has_no_errors_or_warnings(synths, cfn_lint, name):
    lint = cfn_lint(name)
    assert len(lint.templates) == len(synths[name].templates)
    proc = lint.result()
    assert proc.returncode == 0, proc.stdout + proc.stderr


def foreign_build_steps(outdir: Path, registry: str) -> list[str]:
    """What a deploy of this cloud assembly would build from outside `registry`: a Docker
    image asset whose FROM is elsewhere, or any build step (RUN, ADD: they can fetch from any
    host), or an asset made by running a command."""
    found = []
    for manifest in sorted(outdir.glob("*.assets.json")):
        assets = json.loads(manifest.read_text())
        for kind in ("dockerImages", "files"):
            for asset_id, asset in assets.get(kind, {}).items():
                source = asset["source"]
                if "executable" in source:
                    found.append(f"{manifest.name} {asset_id}: built by a command")
                if kind == "files":
                    continue
                directory = outdir / source["directory"]
                args = dict(source.get("dockerBuildArgs", {}))
                text = (directory / source.get("dockerFile", "Dockerfile")).read_text()
                for line in text.replace("\\\n", " ").splitlines():
                    words = line.split()
                    if not words or words[0].startswith("#"):
                        continue
                    op = words[0].upper()
                    if op == "ARG" and "=" in words[1]:
                        name, _, default = words[1].partition("=")
                        args.setdefault(name, default)
                    elif op == "FROM":
                        ref = words[1]
                        for name, value in args.items():
                            ref = ref.replace(f"${{{name}}}", value).replace(f"${name}", value)
                        if not ref.startswith(f"{registry}/"):
                            found.append(f"{manifest.name} {asset_id}: FROM {ref}")
                    elif op in ("RUN", "ADD"):
                        found.append(f"{manifest.name} {asset_id}: {op} {' '.join(words[1:])}"
                                     [:160])
    return found


def test_a_china_deploy_builds_nothing_from_outside_its_own_registry(synths):
    """The router image is built and pushed by `python -m tools mirror`; what `cdk deploy`
    publishes in China is only what the cloud assembly holds (templates, zipped handlers)."""
    china = [s for s in synths.all().values() if s.cfg.facts.china]
    if not china:
        pytest.skip("no China environment among those the gates run on")
    for s in china:
        registry = f"{s.cfg.account}.{s.cfg.facts.ecr_host_suffix}"
        assert foreign_build_steps(s.outdir, registry) == [], s.cfg.name


def test_the_gate_sees_an_image_built_at_deploy_time(tmp_path):
    """The router image as `cdk deploy` used to build it: FROM the mirrored base, then
    apt-get and pip against hosts outside China."""
    old = ("ARG BASE_IMAGE\nFROM ${BASE_IMAGE}\nARG VLLM_ROUTER_VERSION\n"
           "ARG PIP_INDEX_URL=https://pypi.org/simple\n"
           "RUN apt-get update && apt-get install -y --no-install-recommends haproxy \\\n"
           "    && pip install --no-cache-dir --index-url \"${PIP_INDEX_URL}\" \\\n"
           "        \"vllm-router==${VLLM_ROUTER_VERSION}\"\nUSER 65532:65532\n")
    (tmp_path / "asset.1").mkdir()
    (tmp_path / "asset.1" / "Dockerfile").write_text(old)
    registry = "222222222222.dkr.ecr.cn-northwest-1.amazonaws.com.cn"
    (tmp_path / "S.assets.json").write_text(json.dumps({"dockerImages": {"1": {"source": {
        "directory": "asset.1", "dockerBuildArgs": {
            "BASE_IMAGE": f"{registry}/kvcache/library/python:3.12"}}}}}))
    found = foreign_build_steps(tmp_path, registry)
    assert len(found) == 1 and "RUN apt-get update" in found[0]
    (tmp_path / "S.assets.json").write_text(json.dumps({"dockerImages": {"1": {"source": {
        "directory": "asset.1", "dockerBuildArgs": {"BASE_IMAGE": "python:3.12"}}}}}))
    assert any("FROM python:3.12" in f for f in foreign_build_steps(tmp_path, registry))
