"""cfn-lint (the venv's, pinned in requirements.txt) started in the background as soon as its
templates are written: most of a run is cfn-lint's own start and one process uses one core, so
the suite goes on (on the other core) while it lints; the test that asserts on it waits.

A template whose bytes this session already lints for the same regions is not linted again:
cfn-lint reads the template, the regions and ROOT/.cfnlintrc (every run's, and it names no
template), never the template's path, so identical bytes lint identically (the corpus's two
apps per variant share their Network and Cluster stacks, and some with the shipped samples).
Each lint still waits on runs that cover every one of its templates and asserts on them."""
from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

from tests.background import Background
from tests.conftest import ROOT

CFN_LINT = Path(sys.executable).parent / "cfn-lint"

# (regions, sha256 of a template's bytes) -> the run of this session that lints those bytes
_RUNS: dict[tuple[tuple[str, ...], str], Background] = {}


class CfnLint:
    """cfn-lint over `templates` for `regions`: one run of those not yet linted by this
    session, started at construction, and the earlier runs that lint the others."""

    def __init__(self, regions: tuple[str, ...], templates: list[str]):
        self.templates = list(templates)
        regions = tuple(regions)
        keys = {t: (regions, hashlib.sha256(Path(t).read_bytes()).hexdigest())
                for t in self.templates}
        fresh: dict[tuple, str] = {}   # content not linted yet -> its first path
        for t in self.templates:
            if keys[t] not in _RUNS:
                fresh.setdefault(keys[t], t)
        if fresh:
            run = Background([str(CFN_LINT), "--regions", *regions, "--", *fresh.values()],
                             timeout=300, cwd=ROOT)
            _RUNS.update(dict.fromkeys(fresh, run))
        self._runs = list({id(_RUNS[k]): _RUNS[k] for k in keys.values()}.values())

    def result(self) -> subprocess.CompletedProcess:
        """Every run this lint waits on, finished, as one: the first non-zero exit status (a
        run that failed fails every lint it covers a template of), every run's output."""
        procs = [run.result() for run in self._runs]
        return subprocess.CompletedProcess(
            [a for p in procs for a in p.args],
            next((p.returncode for p in procs if p.returncode), 0),
            "".join(p.stdout for p in procs), "".join(p.stderr for p in procs))
