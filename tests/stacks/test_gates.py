"""Quality gates on every synthesized template: cdk-nag, CDK's own validation, cfn-lint."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from config.images import unpinned_images
from k8s.serving import load_endpoints
from tests.conftest import ROOT, SHIPPED


@pytest.mark.parametrize("name", SHIPPED)
def test_cdk_nag_and_cdk_validation_report_no_unacknowledged_findings(synths, name):
    report = json.loads((synths[name].outdir / "validation-report.json").read_text())
    plugins = {r["pluginName"]: r for r in report["pluginReports"]}
    assert "AwsSolutions" in plugins  # the nag pack really ran
    # With `@aws-cdk/core:annotationsInValidationReport` the report also carries annotations:
    # the only ones allowed are the warning naming each image still pinned by tag alone, and
    # exactly the endpoint files' own warnings (fields not acted on, each said once).
    unpinned = {f"{i.source}:{i.tag}" for i in unpinned_images()}
    endpoint_warnings = [w for s in load_endpoints(synths[name].cfg, ROOT) for w in s.warnings]
    for plugin, rep in plugins.items():
        assert rep["conclusion"] == "success", (plugin, rep["violations"])
        said = [v["description"] for v in rep["violations"]
                if v["ruleName"] == "Annotation::kvcache:endpoint-file"
                and v["severity"] == "warning"]
        # a configured cache that no endpoint's L2 verdict uses is said once, not provisioned
        unused = [v for v in rep["violations"]
                  if v["ruleName"] == "Annotation::kvcache:cache-not-provisioned"]
        if plugin == "Construct Annotations":
            assert len(unused) == (synths[name].cfg.cache.kind == "elasticache"
                                   and f"{synths[name].cfg.stack_prefix}-Cache"
                                   not in synths[name].templates), unused
        findings = [v for v in rep["violations"] if not (
            v["ruleName"] == "Annotation::kvcache:image-without-digest"
            and v["severity"] == "warning" and v["description"].split(" ")[0] in unpinned)
            and v["ruleName"] != "Annotation::kvcache:endpoint-file" and v not in unused]
        assert findings == [], plugin
        if said:
            assert sorted(said) == sorted(endpoint_warnings)


def test_validation_is_configured_as_errors():
    flags = json.loads((ROOT / "cdk.json").read_text())["context"]
    assert flags["@aws-cdk/core:validateAgainstDefaultRules"] is True


@pytest.mark.parametrize("name", SHIPPED)
def test_cfn_lint_has_no_errors_or_warnings(synths, name):
    s = synths[name]
    templates = sorted(str(p) for p in s.outdir.glob("*.template.json"))
    assert len(templates) == len(s.templates)
    proc = subprocess.run(
        [str(Path(sys.executable).parent / "cfn-lint"), "--regions", s.cfg.region, "--", *templates],
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
