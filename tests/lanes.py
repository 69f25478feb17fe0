"""How `make test`'s two pytest-xdist workers (one per core of CI's 2-core machine) share the
suite.

Lane 0 is pinned to the first worker: every module that reads what the session builds once,
the synthesized environments (tests/conftest.py `Synths`, with the cfn-lint and checkov runs
over them) and LMCache's parser processes (tests/k8s/lmcache_parse.py). Under xdist's own
schedulers two workers would each build them. Lane 1 is pinned to the second worker: the other
modules with a `starts_early` run, so each such run starts in one worker only. Every other
module floats: a worker takes the next one whenever it runs short of work, so both finish
together. A module is scheduled whole (its module fixtures are built once).

A module that reads the session's synths and is not in LANE_0 still passes, only slower;
tests/test_lanes.py fails on it. docs/development.md says how `make test` runs.
"""
from __future__ import annotations

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
LANE_1 = (
    "tests/k8s/test_l2_client_faults.py", "tests/stacks/test_cli_synth.py",
    "tests/test_new_environment.py", "tests/tools/test_router_image_runs.py",
)
FLOAT = -1


def lane(nodeid: str) -> int:
    """0 or 1 (pinned), or FLOAT."""
    return 0 if nodeid.startswith(LANE_0) else 1 if nodeid.startswith(LANE_1) else FLOAT


def runs_here(config, item) -> bool:
    """Whether this process surely runs `item`: every item outside xdist, a pinned lane's in
    its worker (what starts in the background at session start starts only where its test
    runs; a floating module has no such run)."""
    info = getattr(config, "workerinput", None)
    if info is None:
        return True
    index, count = _index(info), int(info["workercount"])
    return count == 1 or lane(item.nodeid) == index


def _index(workerinput: dict) -> int:
    return int(workerinput["workerid"].removeprefix("gw"))


class LaneScheduling(LoadScopeScheduling):
    """xdist's scope scheduler with the pinned lanes and the floating modules as scopes. The
    first worker starts on lane 0 (the longest) and then floats; the second floats first and
    takes lane 1 last, so that lane's background runs have had the whole session to finish.
    A lane whose worker is gone (died, or never started) goes to whoever asks."""

    def _split_scope(self, nodeid: str) -> str:
        pinned = lane(nodeid)
        return nodeid.split("::", 1)[0] if pinned == FLOAT else f"lane{pinned}"

    def _assign_work_unit(self, node) -> None:
        index = _index(node.workerinput)
        alive = {_index(n.workerinput) for n in self.nodes}
        lanes = {int(s.removeprefix("lane")): s for s in self.workqueue if s.startswith("lane")}
        own = [lanes[index]] if index in lanes else []
        floating = [s for s in self.workqueue if not s.startswith("lane")]
        orphans = [s for k, s in lanes.items() if k not in alive]
        order = own + floating + orphans if index == 0 else floating + own + orphans
        if order:   # else what is left is another live worker's lane: this one waits
            self.workqueue.move_to_end(order[0], last=False)
            super()._assign_work_unit(node)
