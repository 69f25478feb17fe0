"""Every import runs one way: `config/` at the bottom, then `observability/` (metrics, rules, dashboards as data)
and `k8s/` (charts, the monitoring chart among them),
`constructs/`, `stacks/`, `app.py`; the operator's `tools/` and the measuring `bench/` on top.
Nothing that ships imports `bench/`, and `bench/` never imports `tools/`; and no two modules
import each other, directly or round a longer circle. Imports inside functions count too: a lazy
import is still a dependency."""
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


def _module(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module(p): p for p in SOURCES}


def module_imports(path: Path) -> set[str]:
    """This repository's modules that `path` imports, anywhere in it (`from bench import
    tiered` is bench.tiered; a name from a package's __init__ is the package)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        else:
            continue
        for name in names:
            while name and name not in MODULES:
                name = name.rpartition(".")[0]
            if name:
                found.add(name)
    return found - {_module(path)}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_module_imports_itself_round_a_circle():
    graph = {m: module_imports(p) for m, p in MODULES.items()}
    assert circles(graph) == []
    # the check itself can fail: a two-module and a three-module circle are found
    assert circles({"a": {"b"}, "b": {"a"}, "c": {"d"}, "d": {"e"}, "e": {"c"}}) == [
        ["a", "b"], ["c", "d", "e"]]
    # and it sees a lazy `from bench import tiered`
    assert "bench.tiered" in graph["bench.routing"]
