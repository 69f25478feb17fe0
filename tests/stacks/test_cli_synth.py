"""The README's synth through the pinned CLI prints no feature-flag notice and uses no
deprecated API (JSII_DEPRECATED=fail turns any deprecated call into an error)."""
from __future__ import annotations

import os
import subprocess

from stacks.app_builder import SUMMARY_FILE
from tests.conftest import ROOT


def test_cli_synth_has_no_flag_notice_and_no_deprecated_api(tmp_path):
    env = {**os.environ, "JSII_DEPRECATED": "fail",
           "PATH": os.pathsep.join([str(ROOT / ".venv" / "bin"),
                                    str(ROOT / "node_modules" / ".bin"), os.environ["PATH"]])}
    proc = subprocess.run(["cdk", "synth", "-q", "-c", "env=dev", "-o", str(tmp_path / "out")],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output
    assert "feature flags are not configured" not in output
    assert "deprecated" not in output.lower()
    assert (tmp_path / "out" / "KvCache-dev-Cluster.template.json").exists()
    # the warnings' summary, in the assembly for `make synth` to print after CDK's warnings
    summary = (tmp_path / "out" / SUMMARY_FILE).read_text().strip()
    assert summary.startswith("kvcache: ") and "change(s) to your request" in summary
    assert summary in output
