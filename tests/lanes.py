"""How `make test`'s two pytest-xdist workers (one per core of CI's 2-core machine) share the
suite.

- Lane 0, pinned to the first worker, first: every module that reads what the session builds
  once, the synthesized environments (tests/conftest.py `Synths`, with the cfn-lint and checkov
  runs over them) and LMCache's parser processes (tests/k8s/lmcache_parse.py). Under xdist's
  own schedulers both workers would build them.
- Lane 1, pinned to the second worker, first: the loopback tests that time real routers,
  workers and HAProxy. The first worker runs niced (`NICE`), like the background runs, so
  that these get the CPU when they need it, as they did when the suite ran in one process.
- Last 1, pinned to the second worker, after everything else it gets: the other modules with
  a `starts_early` run (each such run starts in one worker only, and has had the session to
  finish when its test asks).
- Every other module floats: whichever worker runs short takes the next one whole, so that
  both finish together.

A module that reads the session's synths outside lane 0 still passes, only slower;
tests/test_lanes.py fails on it. docs/development.md says how `make test` runs.
"""
from __future__ import annotations

import os

from xdist.scheduler import LoadScopeScheduling

# Checked by a run that records which module asks for a synth or a parser (tests/test_lanes.py
# holds the others to it)
LANE_0 = (
    "tests/constructs/test_gpu_nodegroups.py", "tests/k8s/test_delivery.py",
    "tests/k8s/test_hyperpod_corpus.py", "tests/k8s/test_lmcache_config.py",
    "tests/k8s/test_lmcache_server.py", "tests/k8s/test_monitoring.py",
    "tests/k8s/test_worker_gates.py", "tests/observability/",
    "tests/stacks/test_deploy_order.py", "tests/stacks/test_existing_vpc.py",
    "tests/stacks/test_feature_flags.py", "tests/stacks/test_grafana_choice.py",
    "tests/stacks/test_gates.py", "tests/stacks/test_plan.py", "tests/stacks/test_scheduling.py",
    "tests/stacks/test_snapshots.py", "tests/stacks/test_stacks.py", "tests/test_checkov.py",
    "tests/tools/test_carry.py",
)
LANE_1 = ("tests/e2e/", "tests/bench/", "tests/k8s/test_request_limits.py")
LAST_1 = (
    "tests/k8s/test_l2_client_faults.py", "tests/stacks/test_cli_synth.py",
    "tests/test_new_environment.py", "tests/tools/test_router_image_runs.py",
)
PINNED = {"lane0": LANE_0, "lane1": LANE_1, "last1": LAST_1}
# The first worker's niceness: below the background runs' 10 (tests/background.py)
NICE = 5


def scope(nodeid: str) -> str | None:
    """The pinned scope of a test (a key of PINNED), or None where it floats."""
    return next((name for name, prefixes in PINNED.items() if nodeid.startswith(prefixes)),
                None)


def owner(pinned: str) -> int:
    """The index of the worker a pinned scope belongs to."""
    return int(pinned[4:])


def runs_here(config, item) -> bool:
    """Whether this process surely runs `item`: every item outside xdist or with one worker,
    a pinned scope's in its worker (what starts in the background at session start starts
    only where its test runs; a floating module has no such run)."""
    index, count = _this_worker(config)
    if count == 1:
        return True
    pinned = scope(item.nodeid)
    return pinned is not None and owner(pinned) == index


def yield_to_lane_1(config) -> None:
    """In the first of several workers: run niced, so that lane 1's routers and workers get
    the CPU first."""
    index, count = _this_worker(config)
    if index == 0 and count > 1:
        os.nice(NICE)


def worker_index(workerinput: dict) -> int:
    return int(workerinput["workerid"].removeprefix("gw"))


def _this_worker(config) -> tuple[int, int]:
    """(this process's worker index, the number of workers); (0, 1) outside xdist."""
    info = getattr(config, "workerinput", None)
    return (worker_index(info), int(info["workercount"])) if info else (0, 1)


class LaneScheduling(LoadScopeScheduling):
    """xdist's scope scheduler with the pinned scopes and the floating modules as scopes. A
    worker takes its own first scope, then floating modules one at a time as it runs short,
    then its own last scope; a pinned scope whose worker is gone (died, or never started) goes
    to whoever asks."""

    def _split_scope(self, nodeid: str) -> str:
        return scope(nodeid) or nodeid.split("::", 1)[0]

    def _assign_work_unit(self, node) -> None:
        index = worker_index(node.workerinput)
        alive = {worker_index(n.workerinput) for n in self.nodes}
        pinned = [s for s in self.workqueue if s in PINNED]
        floating = [s for s in self.workqueue if s not in pinned]
        order = ([s for s in pinned if s == f"lane{index}"] + floating
                 + [s for s in pinned if s == f"last{index}"]
                 + [s for s in pinned if owner(s) not in alive])
        if order:   # else what is left is another live worker's: this one waits
            self.workqueue.move_to_end(order[0], last=False)
            super()._assign_work_unit(node)
