"""`make test`'s lanes (tests/lanes.py): each pinned scope goes whole to its own worker in its
turn, the other modules float whole to whichever worker runs short, a dead worker's is taken,
and no module outside lane 0 reads what lane 0 builds once per session (the synthesized
environments and what runs over them, LMCache's parsers), which both workers would then build;
every module with a `starts_early` run is pinned, so that run starts in one worker."""
from __future__ import annotations

import ast
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.conftest import ROOT
from tests.lanes import LANE_0, LANE_1, LAST_1, NICE, LaneScheduling, scope, yield_to_lane_1

# What the session builds once, in lane 0: tests/conftest.py's fixtures over `Synths` (cfn-lint
# and the checkov scan over them too), and what starts LMCache's parsers
LANE_0_FIXTURES = {"synths", "cfn_lint", "dev", "china", "scans", "environment_snapshot"}
PARSER_STARTS = {"parse", "parse_server_args", "start"}
# Where those are defined or only named
NOT_USERS = {"tests/conftest.py", "tests/lanes.py", "tests/test_lanes.py",
             "tests/k8s/lmcache_parse.py", "tests/test_checkov.py"}


class _Node:
    def __init__(self, workerid: str):
        self.workerinput = {"workerid": workerid}
        self.gateway = SimpleNamespace(id=workerid)
        self.shutting_down, self.sent, self.done = False, [], 0

    def send_runtest_some(self, indices):
        self.sent += indices

    def shutdown(self):
        self.shutting_down = True


COLLECTION = ["tests/stacks/test_gates.py::test_a[dev]", "tests/e2e/test_pd.py::test_b",
              "tests/e2e/test_pd.py::test_b2", "tests/k8s/test_charts.py::test_c",
              "tests/test_new_environment.py::test_d", "tests/stacks/test_gates.py::test_a[cn]",
              "tests/tools/test_mirror.py::test_e", "tests/test_docs.py::test_f",
              "tests/test_docs.py::test_g", "tests/tools/test_hub.py::test_h"]


def _run(nodes: list[_Node], collection=COLLECTION, *, die=None) -> LaneScheduling:
    """Schedule `collection` on `nodes` and run it as workers do, one test per worker in
    turn; `die`: a worker that dies before its first test, replaced by a new one."""
    config = SimpleNamespace(getvalue=lambda name: [f"{len(nodes)}*popen"],
                             option=SimpleNamespace(loadscopereorder=True))
    sched = LaneScheduling(config)
    for node in nodes:
        sched.add_node(node)
        sched.add_node_collection(node, collection)
    sched.schedule()
    if die is not None:
        sched.remove_node(die)
        nodes = [n for n in nodes if n is not die] + [replacement := _Node("gw9")]
        sched.add_node(replacement)
        sched.add_node_collection(replacement, collection)
        sched.schedule()
    while not sched.tests_finished:
        busy = [n for n in nodes if n.done < len(n.sent)]
        assert busy, "work is left that no worker was given"
        for node in busy:
            sched.mark_test_complete(node, node.sent[node.done])
            node.done += 1
    return sched


def _ran(node: _Node) -> list[str]:
    return [COLLECTION[i] for i in node.sent]


@pytest.mark.parametrize("order", ["gw0 first", "gw1 first"])
def test_pinned_scopes_go_whole_to_their_workers_and_modules_float(order):
    gw0, gw1 = _Node("gw0"), _Node("gw1")
    _run([gw0, gw1] if order == "gw0 first" else [gw1, gw0])
    assert sorted(gw0.sent + gw1.sent) == list(range(len(COLLECTION)))   # each once
    assert {scope(n) for n in COLLECTION} == {"lane0", "lane1", "last1", None}
    pinned = {s: [n for n in COLLECTION if scope(n) == s] for s in ("lane0", "lane1", "last1")}
    assert _ran(gw0)[:len(pinned["lane0"])] == pinned["lane0"]   # each starts on its lane
    assert _ran(gw1)[:len(pinned["lane1"])] == pinned["lane1"]
    assert _ran(gw1)[-len(pinned["last1"]):] == pinned["last1"]  # and the second ends so
    floated = [n for n in COLLECTION if scope(n) is None]
    assert set(floated) & set(_ran(gw0)) and set(floated) & set(_ran(gw1))   # both took some
    for name in {n.split("::")[0] for n in COLLECTION}:   # a module runs in one worker
        assert len({i for i, node in enumerate((gw0, gw1))
                    if any(n.startswith(name) for n in _ran(node))}) == 1, name


def test_one_worker_runs_everything():
    gw0 = _Node("gw0")
    _run([gw0])
    assert sorted(gw0.sent) == list(range(len(COLLECTION)))


def test_a_dead_workers_lane_goes_to_whoever_asks():
    gw0, gw1 = _Node("gw0"), _Node("gw1")
    _run([gw0, gw1], die=gw1)
    assert gw0.sent and len(set(gw0.sent)) == len(gw0.sent)


def _outside_lane_0() -> list[Path]:
    for entry in LANE_0 + LANE_1 + LAST_1:
        assert (ROOT / entry).exists(), f"tests/lanes.py names {entry}, which does not exist"
    return [p for p in sorted((ROOT / "tests").rglob("*.py"))
            if not str(p.relative_to(ROOT)).startswith(LANE_0)
            and str(p.relative_to(ROOT)) not in NOT_USERS]


@pytest.mark.parametrize("path", _outside_lane_0(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_module_outside_lane_0_reads_what_lane_0_builds(path):
    tree = ast.parse(path.read_text())
    asked = {a.arg for node in ast.walk(tree)
             if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
             for a in node.args.args + node.args.kwonlyargs}
    starts = {a.name for n in ast.walk(tree)
              if isinstance(n, ast.ImportFrom) and n.module == "tests.k8s.lmcache_parse"
              for a in n.names} & PARSER_STARTS
    rel = str(path.relative_to(ROOT))
    assert not asked & LANE_0_FIXTURES, f"{rel} asks for {asked & LANE_0_FIXTURES}: " \
        "add it to LANE_0 in tests/lanes.py"
    assert not starts, f"{rel} starts LMCache parsers ({starts}): add it to LANE_0"
    early = any(isinstance(n, ast.Attribute) and n.attr == "starts_early"
                for n in ast.walk(tree))
    assert not early or rel.startswith(LAST_1), \
        f"{rel} has a starts_early run: add it to LAST_1 in tests/lanes.py"


@pytest.mark.parametrize("workerid, count, raised", [("gw0", 2, NICE), ("gw1", 2, 0),
                                                     ("gw0", 1, 0)])
def test_only_the_first_of_several_workers_runs_niced(workerid, count, raised):
    """In a child process (a niceness cannot be lowered back)."""
    import os

    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:   # the child writes what it measured, or nothing, and never returns
        try:
            before = os.nice(0)
            yield_to_lane_1(SimpleNamespace(workerinput={"workerid": workerid,
                                                         "workercount": count}))
            os.write(write, str(os.nice(0) - before).encode())
        finally:
            os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    assert int(os.read(read, 16)) == raised
    os.close(read)
