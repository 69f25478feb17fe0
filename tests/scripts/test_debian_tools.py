"""`make test` on a fresh machine: scripts/debian-tools finds the Debian tools the suite runs,
installs them as root (shown for real on a machine without them: see the report in the PR),
and otherwise stops at once with the exact command. Here the PATH is a folder of stubs."""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from tests.conftest import ROOT

SCRIPT = ROOT / "scripts" / "debian-tools"
TOOLS = {"promtool": "prometheus", "amtool": "prometheus-alertmanager", "skopeo": "skopeo",
         "docker-registry": "docker-registry", "redis-server": "redis-server",
         "prometheus-redis-exporter": "prometheus-redis-exporter", "haproxy": "haproxy",
         "umoci": "umoci"}


def _run(tmp_path: Path, present: set[str], uid: str) -> subprocess.CompletedProcess:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in present:
        stub = bin_dir / tool
        stub.write_text("#!/bin/sh\nexit 0\n")
        stub.chmod(0o755)
    return subprocess.run(["/bin/sh", str(SCRIPT)], capture_output=True, text=True,
                          env={"PATH": str(bin_dir), "KVCACHE_AS_UID": uid}, timeout=30)


def test_all_present_is_silent_and_succeeds(tmp_path):
    proc = _run(tmp_path, set(TOOLS), uid="1000")
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "", "")


@pytest.mark.parametrize("absent", sorted(TOOLS))
def test_non_root_stops_with_the_command_naming_the_missing_package(tmp_path, absent):
    proc = _run(tmp_path, set(TOOLS) - {absent}, uid="1000")
    assert proc.returncode == 2 and proc.stdout == ""
    (line,) = proc.stderr.splitlines()
    assert line.endswith(f"apt-get install -y --no-install-recommends {TOOLS[absent]}")
    assert line.startswith("error: ")


def test_every_tool_the_suite_calls_is_covered():
    text = SCRIPT.read_text()
    for tool, package in TOOLS.items():
        assert f"{package}:{tool}" in text
    called = set()
    for path in (ROOT / "tests").rglob("*.py"):
        if path.name != Path(__file__).name:
            called |= {t for t in TOOLS if re.search(rf'["\[]{t}["\]]', path.read_text())}
    assert called == set(TOOLS)


def test_make_test_runs_it_before_anything_else():
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^test: tools deps$", makefile, re.M)
    assert re.search(r"^tools:\n\t@scripts/debian-tools$", makefile, re.M)
    assert (ROOT / ".ci" / "run").read_text().strip().splitlines()[-1] == "exec make test"
