"""Every import runs one way: `config/` at the bottom, then `observability/` (metrics, rules, dashboards as data)
and `k8s/` (charts, the monitoring chart among them),
`constructs/`, `stacks/`, `app.py`; the operator's `tools/` and the measuring `bench/` on top.
Nothing that ships imports `bench/`, and `bench/` never imports `tools/`. Imports inside
functions count too: a lazy import is still a dependency."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.conftest import ROOT

# package -> the packages of this repository it may import (besides itself)
ALLOWED = {
    "config": set(),
    "observability": {"config"},
    "k8s": {"config", "observability"},
    "constructs": {"config", "k8s", "observability"},
    "stacks": {"config", "k8s", "observability", "constructs"},
    "app": {"config", "k8s", "observability", "constructs", "stacks"},
    "bench": {"config", "k8s", "observability"},
    "tools": {"config", "k8s", "observability", "bench"},
}
OURS = set(ALLOWED)


def _package(path: Path) -> str:
    rel = path.relative_to(ROOT)
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


def imports_of(path: Path) -> set[str]:
    """Top-level names of this repository's packages that `path` imports, anywhere in it."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        for name in names:
            top = name.split(".")[0]
            # `constructs` is also the CDK library: only its submodules here are ours
            if top == "constructs" and name == "constructs":
                continue
            if top in OURS:
                found.add(top)
    return found


SOURCES = sorted(p for pkg in OURS for p in
                 ([ROOT / "app.py"] if pkg == "app" else (ROOT / pkg).rglob("*.py")))


def test_the_rule_sees_every_package():
    assert {_package(p) for p in SOURCES} == OURS
    # and it can fail: bench importing tools is refused
    assert "tools" not in ALLOWED["bench"] and "bench" not in ALLOWED["k8s"]


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_imports_run_one_way(path):
    pkg = _package(path)
    upward = imports_of(path) - ALLOWED[pkg] - {pkg}
    assert not upward, f"{path.relative_to(ROOT)} ({pkg}) imports {sorted(upward)}"
