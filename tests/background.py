"""Subprocesses started ahead of the test that asserts on them.

pytest runs one test at a time on one core; a check that is one long subprocess (cfn-lint, a
CLI synth, the suite in a scratch copy) can run on the other core meanwhile. A `Background` is
started at once, its output goes to temporary files (never a full pipe), and `result()` waits
for it. A test marked `@pytest.mark.starts_early(start=f)` gets `f(tmp)` run when the session
starts (the `early` fixture hands it over, or starts it then if it was not): the test still
runs alone, in any order, and asserts on the whole run as before.
"""
from __future__ import annotations

import atexit
import subprocess
import tempfile
import time
from pathlib import Path


class Background:
    """`args` running from construction on, niced: it takes the CPU the suite leaves idle and
    yields it to the tests that time real processes (loopback routers, workers). `result()`
    waits at most `timeout` s from start."""

    def __init__(self, args: list[str], *, timeout: float, **popen):
        self.args = list(args)
        self._deadline = time.monotonic() + timeout
        self._out = tempfile.TemporaryFile(mode="w+")
        self._err = tempfile.TemporaryFile(mode="w+")
        self._proc = subprocess.Popen(["nice", "-n", "10", *self.args], stdout=self._out,
                                      stderr=self._err, text=True, **popen)
        atexit.register(self.stop)

    def result(self) -> subprocess.CompletedProcess:
        """The finished run, as subprocess.run returns it (TimeoutExpired past the deadline)."""
        try:
            self._proc.wait(max(0.0, self._deadline - time.monotonic()))
        finally:
            self.stop()
        self._out.seek(0)
        self._err.seek(0)
        return subprocess.CompletedProcess(self.args, self._proc.returncode, self._out.read(),
                                           self._err.read())

    def stop(self) -> None:
        if self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()


class Early:
    """What a `starts_early` test gets: its scratch directory and its running subprocess."""

    def __init__(self, tmp: Path, run: Background):
        self.tmp, self.run = tmp, run
