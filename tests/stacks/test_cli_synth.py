"""The README's synth through the pinned CLI prints no feature-flag notice and uses no
deprecated API (JSII_DEPRECATED=fail turns any deprecated call into an error)."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from stacks.app_builder import SUMMARY_FILE
from stacks.plan import PLAN_FILE
from tests.background import Background
from tests.conftest import ROOT


def _cli_synth(tmp: Path) -> Background:
    """`cdk synth` as the README runs it (a subprocess that starts with the session)."""
    env = {**os.environ, "JSII_DEPRECATED": "fail",
           "PATH": os.pathsep.join([str(ROOT / ".venv" / "bin"),
                                    str(ROOT / "node_modules" / ".bin"), os.environ["PATH"]])}
    return Background(["cdk", "synth", "-q", "-c", "env=dev", "-o", str(tmp / "out")],
                      cwd=ROOT, env=env, timeout=300)


@pytest.mark.starts_early(start=_cli_synth)
def test_cli_synth_has_no_flag_notice_and_no_deprecated_api(early):
    tmp_path = early.tmp
    proc = early.run.result()
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output
    assert "feature flags are not configured" not in output
    assert "deprecated" not in output.lower()
    assert (tmp_path / "out" / "KvCache-dev-Cluster.template.json").exists()
    # the warnings' summary, in the assembly for `make synth` to print after CDK's warnings
    summary = (tmp_path / "out" / SUMMARY_FILE).read_text().strip()
    assert summary.startswith("kvcache: ") and "change(s) to your request" in summary
    assert summary in output
    # the plan, beside it, which `make synth` prints last
    plan = (tmp_path / "out" / PLAN_FILE).read_text()
    assert plan.startswith("kvcache plan: environment dev ") and "cost per hour" in plan
    synth_recipe = (ROOT / "Makefile").read_text().split("\nsynth:", 1)[1].split("\n\n")[0]
    assert synth_recipe.rstrip().endswith(f"@cat cdk.out/{PLAN_FILE} >&2")
