"""cfn-lint (the venv's, pinned in requirements.txt) started in the background as soon as its
templates are written: most of a run is cfn-lint's own start and one process uses one core, so
the suite goes on (on the other core) while it lints; the test that asserts on it waits."""
from __future__ import annotations

import sys
from pathlib import Path

from tests.background import Background
from tests.conftest import ROOT

CFN_LINT = Path(sys.executable).parent / "cfn-lint"


class CfnLint(Background):
    """One cfn-lint run over `templates` for `regions`, running from construction on."""

    def __init__(self, regions: tuple[str, ...], templates: list[str]):
        self.templates = list(templates)
        super().__init__([str(CFN_LINT), "--regions", *regions, "--", *self.templates],
                         timeout=300, cwd=ROOT)
