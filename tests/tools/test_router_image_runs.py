"""The router image runs: built from the real lock by the project's own build() on a base shaped
like python:3.12-slim-bookworm (merged-/usr, made from this machine's Debian packages and a real
CPython 3.12), unpacked by umoci and run under chroot as the image's user
(tests/tools/image_run.py); linux/arm64 too where the kernel runs aarch64 programs (qemu-user
through binfmt_misc), without its routers (no arm64 CPython 3.12 here). A layer that put a
directory over the base's `lib -> usr/lib` (the fault of issue 29) leaves every program
without its ELF interpreter: these fail with 127.

The build and unpack run from the session's start on the other core (tests/background.py);
the lock's files are fetched once into .build/router-image/.
"""
from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest

from tests.background import Background
from tests.conftest import ROOT
from tools.router_image import load_lock

PLATFORMS = ("linux/amd64", "linux/arm64")


def _needs() -> str | None:
    """Why the image cannot be run here, or None."""
    if os.geteuid() != 0:
        return "chroot and umoci's unpack need root"
    missing = [t for t in ("umoci", "chroot") if shutil.which(t) is None]
    return f"missing {', '.join(missing)} (scripts/debian-tools installs them)" if missing \
        else None


def _image_run(tmp: Path) -> Background:
    from k8s.router import router_command
    from k8s.router_front import DEREGISTER_S, PRE_STOP, ROUTER_PRE_STOP
    from k8s.secret_fetch import API_KEY_FILE

    if _needs():
        return Background(["true"], timeout=10)
    (tmp / "commands.json").write_text(json.dumps({
        # the rendered hooks, the front's with no NLB grace; the router's as rendered: it
        # returns at once only if the front's hook left the file it waits for (else it runs
        # into the runner's 60 s timeout)
        "pre_stop": [("0" if a == str(DEREGISTER_S) else a) for a in PRE_STOP],
        "router_pre_stop": ROUTER_PRE_STOP, "api_key_file": API_KEY_FILE,
        "routers": {name: router_command(name, api_key=True)
                    for name in ("vllm-router", "sglang-router")}}))
    return Background([sys.executable, "-m", "tests.tools.image_run", str(tmp)], cwd=ROOT,
                      timeout=600)


@pytest.fixture
def report(early) -> dict:
    if why := _needs():
        pytest.skip(why)
    proc = early.run.result()
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads((early.tmp / "report.json").read_text())


def _ok(result: dict) -> str:
    assert result["rc"] == 0, result
    return result["out"]


def _ran(report: dict, platform: str) -> dict:
    if "skipped" in report[platform]:
        pytest.skip(f"{platform} not run: {report[platform]['skipped']}")
    return report[platform]


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.starts_early(start=_image_run)
def test_the_built_image_runs_haproxy_a_shell_and_the_front_prestop_hook(report, platform):
    ran = _ran(report, platform)
    series = load_lock()["debian"]["haproxy_series"]
    assert _ok(ran["haproxy -v"]).startswith(f"HAProxy version {series}.")
    _ok(ran["sh -c true"])
    # the hook soft-stops a HAProxy running in the image and returns once it has exited,
    # leaving the file the router's hook waits for; that one then returns at once
    assert _ok(ran["preStop"]) == "" and ran["preStop"]["front_rc"] == 0
    assert ran["preStop"]["front_done"] is True
    assert _ok(ran["routerPreStop"]) == ""
    assert ran["entrypoint"] == ["vllm-router"]


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.starts_early(start=_image_run)
def test_both_routers_commands_run_with_the_bases_python(report, platform):
    ran = _ran(report, platform)
    for name in ("vllm-router", "sglang-router"):
        if "skipped" in ran[name]:
            pytest.skip(f"{platform} {name} not run: {ran[name]['skipped']}")
        out = _ok(ran[name])
        assert out.startswith(f"usage: {name}") or f"\nusage: {name}" in out, out
