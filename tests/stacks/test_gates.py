"""Quality gates on every synthesized template: cdk-nag, CDK's own validation, cfn-lint."""
from __future__ import annotations

import json
import subprocess
import sys
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


def test_validation_is_configured_as_errors():
    flags = json.loads((ROOT / "cdk.json").read_text())["context"]
    assert flags["@aws-cdk/core:validateAgainstDefaultRules"] is True


@pytest.mark.parametrize("name", ENVIRONMENTS)
def test_cfn_lint_has_no_errors_or_warnings(synths, name):
    s = synths[name]
    templates = sorted(str(p) for p in s.outdir.glob("*.template.json"))
    assert len(templates) == len(s.templates)
    proc = subprocess.run(
        [str(Path(sys.executable).parent / "cfn-lint"), "--regions", s.cfg.region, "--", *templates],
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
