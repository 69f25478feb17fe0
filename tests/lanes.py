"""Two lanes for `make test`'s two pytest-xdist workers, one per core of CI's 2-core machine.

Lane 0 holds every test that reads the session's synthesized environments (tests/conftest.py
`Synths`) or LMCache's parsers (tests/k8s/lmcache_parse.py), with the background runs those
start (cfn-lint, checkov); lane 1 holds the tests that read neither: the loopback tests, which
mostly wait on real routers and workers, the tools and the config tests. Pinning each lane to
one worker (`LaneScheduling`) keeps each session-wide synth and parser in one process: xdist's
own schedulers would send tests of one environment to both workers, and both would synthesize
it. A test module not named here is in lane 0, so a new one can cost time, never correctness:
every worker can run every test.

docs/development.md says how `make test` runs them.
"""
from __future__ import annotations

from xdist.scheduler import LoadScopeScheduling

# Lane 1: modules and folders that start no synth of a declared environment and no LMCache
# parser (checked: a run that records who asks for them).
LANE_1 = (
    "tests/e2e/", "tests/bench/", "tests/tools/", "tests/config/", "tests/scripts/",
    "tests/test_imports.py", "tests/test_docs.py", "tests/test_lint.py",
    "tests/k8s/test_hyperpod_today.py", "tests/stacks/test_kubernetes_versions.py",
    "tests/constructs/test_efa_nodegroup.py", "tests/stacks/test_cache_stack.py",
    "tests/stacks/test_gateway_synth.py",
)
# Lane 0 inside those folders: tools tests that read a synthesized environment
LANE_0 = ("tests/tools/test_carry.py",)


def lane(nodeid: str) -> int:
    return 1 if nodeid.startswith(LANE_1) and not nodeid.startswith(LANE_0) else 0


def worker(config) -> tuple[int, int] | None:
    """(this worker's index, the number of workers), or None outside an xdist worker."""
    info = getattr(config, "workerinput", None)
    return (int(info["workerid"].removeprefix("gw")), int(info["workercount"])) if info else None


def runs_here(config, item) -> bool:
    """Whether this process runs `item`: every item outside xdist, its lane's in a worker
    (what starts in the background at session start starts only where its test runs)."""
    here = worker(config)
    return here is None or lane(item.nodeid) % here[1] == here[0]


class LaneScheduling(LoadScopeScheduling):
    """xdist's scope scheduler with the lanes as scopes, lane k sent to worker k mod n: each
    worker gets its lane whole, at once, and runs it in collection order."""

    def _split_scope(self, nodeid: str) -> str:
        return f"lane{lane(nodeid)}"

    def _assign_work_unit(self, node) -> None:
        index = int(node.workerinput["workerid"].removeprefix("gw"))
        mine = [s for s in self.workqueue
                if int(s.removeprefix("lane")) % len(self.nodes) == index]
        if mine:   # otherwise a lane left by a worker that died: whoever asks takes it
            self.workqueue.move_to_end(mine[0], last=False)
        super()._assign_work_unit(node)
