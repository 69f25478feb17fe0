"""bench.router_fork: a forked console script gets what an exec of it gets (argv, environment,
working directory, stdout/stderr, stdin, exit status, signals), so the loopback tests that
start routers through it run the routers as the kernel would."""
from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest

from bench import router_fork

SCRIPT = """#!{python}
import json, os, sys
print(json.dumps({{"argv": sys.argv, "env": os.environ.get("FORK_PROBE"), "cwd": os.getcwd(),
                  "stdin": sys.stdin.read(), "path0": sys.path[0], "main": __name__}}))
print("to stderr", file=sys.stderr)
sys.stdout.flush()
if sys.argv[1] == "wait":
    import time
    time.sleep(60)
sys.exit(int(sys.argv[1]) if sys.argv[1].isdigit() else sys.argv[1])
"""


@pytest.fixture()
def script(tmp_path: Path) -> Path:
    path = tmp_path / "bin" / "probe-router"
    path.parent.mkdir()
    path.write_text(SCRIPT.format(python=sys.executable))
    path.chmod(0o755)
    return path


def _run(script: Path, args: list[str], log: Path, **env: str):
    with open(log, "wb") as f:
        return router_fork.spawn(str(script), args, {**os.environ, **env}, f.fileno())


def test_a_forked_script_sees_what_an_exec_would_give_it(script, tmp_path, monkeypatch):
    assert router_fork.forkable(str(script))
    monkeypatch.chdir(tmp_path)
    proc = _run(script, ["3", "--flag"], tmp_path / "log", FORK_PROBE="yes")
    assert isinstance(proc, router_fork.ForkedProcess)
    assert proc.wait(timeout=10) == 3
    first, second = (tmp_path / "log").read_text().splitlines()
    seen = json.loads(first)
    assert seen == {"argv": [str(script), "3", "--flag"], "env": "yes", "cwd": str(tmp_path),
                    "stdin": "", "path0": str(script.parent), "main": "__main__"}
    assert second == "to stderr"
    assert _run(script, ["not a number"], tmp_path / "log2").wait(timeout=10) == 1
    assert (tmp_path / "log2").read_text().splitlines()[-1] == "not a number"


def test_a_forked_script_dies_of_the_signal_it_is_sent(script, tmp_path):
    proc = _run(script, ["wait"], tmp_path / "log")
    deadline = time.monotonic() + 10
    while not (tmp_path / "log").read_text() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert proc.poll() is None
    proc.terminate()
    assert proc.wait(timeout=10) == -signal.SIGTERM


def test_only_this_pythons_scripts_are_forked(script, monkeypatch):
    assert not router_fork.forkable("/bin/sh")
    monkeypatch.setenv("LOOPBACK_ROUTER_EXEC", "1")
    assert not router_fork.forkable(str(script))
