"""`make test`'s lanes (tests/lanes.py): each lane goes whole to its own worker, a worker
that dies leaves its lane to the other, and no lane-1 module reads what lane 0 builds once per
session (the synthesized environments and what runs over them, LMCache's parsers), which would
then be built in both workers."""
from __future__ import annotations

import ast
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.conftest import ROOT
from tests.lanes import LANE_0, LANE_1, LaneScheduling, lane

# What the session builds once, in lane 0: tests/conftest.py's fixtures over `Synths` (cfn-lint
# and the checkov scan over them too), and LMCache's parsers
LANE_0_FIXTURES = {"synths", "cfn_lint", "dev", "china", "scans", "environment_snapshot"}
LANE_0_MODULES = {"tests.k8s.lmcache_parse"}


class _Node:
    def __init__(self, workerid: str):
        self.workerinput = {"workerid": workerid}
        self.gateway = SimpleNamespace(id=workerid)
        self.shutting_down, self.sent = False, []

    def send_runtest_some(self, indices):
        self.sent += indices

    def shutdown(self):
        self.shutting_down = True


def _scheduler(nodes: list[_Node], collection: list[str]) -> LaneScheduling:
    config = SimpleNamespace(getvalue=lambda name: [f"{len(nodes)}*popen"],
                             option=SimpleNamespace(loadscopereorder=True))
    sched = LaneScheduling(config)
    for node in nodes:
        sched.add_node(node)
    for node in nodes:
        sched.add_node_collection(node, collection)
    sched.schedule()
    return sched


COLLECTION = ["tests/stacks/test_gates.py::test_a[dev]", "tests/e2e/test_pd.py::test_b",
              "tests/k8s/test_charts.py::test_c", "tests/tools/test_mirror.py::test_d",
              "tests/test_docs.py::test_e"]


@pytest.mark.parametrize("order", ["gw0 first", "gw1 first"])
def test_each_lane_goes_whole_to_its_own_worker(order):
    gw0, gw1 = _Node("gw0"), _Node("gw1")
    _scheduler([gw0, gw1] if order == "gw0 first" else [gw1, gw0], COLLECTION)
    assert [COLLECTION[i] for i in gw0.sent] == [n for n in COLLECTION if lane(n) == 0]
    assert [COLLECTION[i] for i in gw1.sent] == [n for n in COLLECTION if lane(n) == 1]
    assert {lane(n) for n in COLLECTION} == {0, 1}


def test_one_worker_runs_both_lanes():
    (gw0,) = nodes = [_Node("gw0")]
    sched = _scheduler(nodes, COLLECTION)
    done = 0
    while done < len(gw0.sent):   # it asks for more as it runs out
        sched.mark_test_complete(gw0, gw0.sent[done])
        done += 1
    assert sorted(gw0.sent) == list(range(len(COLLECTION)))


def test_a_dead_workers_lane_goes_to_the_worker_that_replaces_it():
    gw0, gw1 = _Node("gw0"), _Node("gw1")
    sched = _scheduler([gw0, gw1], COLLECTION)
    lost = sorted(gw1.sent)
    sched.remove_node(gw1)     # it died before running any of its lane
    gw2 = _Node("gw2")         # xdist starts a replacement
    sched.add_node(gw2)
    sched.add_node_collection(gw2, COLLECTION)
    sched.schedule()
    assert sorted(gw2.sent) == lost and not set(gw0.sent) & set(lost)


def _lane_1_files() -> list[Path]:
    files = []
    for entry in LANE_0:
        assert (ROOT / entry).exists(), f"tests/lanes.py names {entry}, which does not exist"
    for entry in LANE_1:
        path = ROOT / entry
        assert path.exists(), f"tests/lanes.py names {entry}, which does not exist"
        files += sorted(path.rglob("*.py")) if path.is_dir() else [path]
    return [f for f in files if not str(f.relative_to(ROOT)).startswith(LANE_0)]


@pytest.mark.parametrize("path", _lane_1_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_lane_1_module_reads_what_lane_0_builds(path):
    tree = ast.parse(path.read_text())
    asked = {a.arg for node in ast.walk(tree)
             if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
             for a in node.args.args + node.args.kwonlyargs}
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)} | {
        a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert not asked & LANE_0_FIXTURES, (path, asked & LANE_0_FIXTURES)
    assert not imported & LANE_0_MODULES, (path, imported & LANE_0_MODULES)
