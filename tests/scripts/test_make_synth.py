"""`make synth` installs what synthesis needs and nothing the tests alone need (issue 16)."""
from __future__ import annotations

import os
import subprocess

from tests.conftest import ROOT


def test_make_synth_builds_only_the_synthesis_toolchain():
    # -n: print, run nothing; -B: as on a fresh clone, every target out of date
    # run as a user would, not as a sub-make of `make test` (which prints "Entering directory")
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS")}
    out = subprocess.run(["make", "-n", "-B", "--no-print-directory", "synth"], cwd=ROOT,
                         capture_output=True, text=True, timeout=60, check=True, env=env).stdout
    assert "pip install -q -r requirements.txt" in out and "npm ci" in out
    assert "cdk synth" in out
    # the warnings' summary, then the plan (what will run and what it costs) last
    assert out.rstrip().endswith("cat cdk.out/kvcache-warnings.txt >&2\n"
                                 "cat cdk.out/kvcache-plan.txt >&2")
    for test_only in (".venv-lmcache", ".venv-checkov", "scripts/debian-tools"):
        assert test_only not in out, test_only
