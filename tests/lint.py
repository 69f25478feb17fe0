"""cfn-lint (the venv's, pinned in requirements.txt) started in the background as soon as its
templates are written: most of a run is cfn-lint's own start and one process uses one core, so
the suite goes on (on the other core) while it lints; the test that asserts on it waits."""
from __future__ import annotations

import atexit
import subprocess
import sys
import tempfile
from pathlib import Path

from tests.conftest import ROOT

CFN_LINT = Path(sys.executable).parent / "cfn-lint"


class CfnLint:
    """One cfn-lint run over `templates` for `region`, running from construction on."""

    def __init__(self, region: str, templates: list[str]):
        self.templates = list(templates)
        self._out = tempfile.TemporaryFile(mode="w+")   # never a full pipe, however long
        self._proc = subprocess.Popen([str(CFN_LINT), "--regions", region, "--",
                                       *self.templates], cwd=ROOT, stdout=self._out,
                                      stderr=subprocess.STDOUT, text=True)
        atexit.register(self._stop)

    def result(self, timeout: float = 300) -> tuple[int, str]:
        """(exit status, what it printed), once it has finished."""
        try:
            self._proc.wait(timeout)
        finally:
            self._stop()
        self._out.seek(0)
        return self._proc.returncode, self._out.read()

    def _stop(self) -> None:
        if self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()
