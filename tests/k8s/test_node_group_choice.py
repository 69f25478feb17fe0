"""An endpoint names its node group where several carry its instance type (a team's two p4d
groups, one per model): its `nodeAffinity` on `kvcache.io/node-group` picks the group its
workers are placed, counted and scaled on; without one, the first group of the type. A group
no endpoint runs on is one line in the plan."""
from __future__ import annotations

import copy

import cdk8s
import pytest

from config import ConfigError
from config.contracts import NODE_GROUP_LABEL
from config.endpoint_spec import parse_endpoint
from k8s.serving import build_charts, endpoint_group, fit_endpoint, worker_capacity
from stacks.plan import plan_text
from tests.k8s.test_charts import SEED, _env, _facts

GROUPS = [{"name": name, "instanceTypes": ["g5.24xlarge"], "minSize": 0, "maxSize": size,
           "desiredSize": 1} for name, size in (("g5-a", 2), ("g5-b", 4))]


def _spec(cfg, group: str | None, name: str = "chat"):
    raw = copy.deepcopy(SEED)
    raw["metadata"]["name"] = name
    if group:
        raw["spec"]["nodeAffinity"] = {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [
                {"key": NODE_GROUP_LABEL, "operator": "In", "values": [group]}]}]}}
    return fit_endpoint(cfg, parse_endpoint(cfg.name, f"endpoints/{name}.yaml", raw))


def _workers(cfg, spec) -> dict:
    docs = [d for c in build_charts(cdk8s.App(), cfg, (spec,), _facts(cfg, spec))
            for d in c.to_json()]
    (w,) = [d for d in docs if d["kind"] in ("Deployment", "StatefulSet")
            and d["metadata"]["name"] == f"{spec.name}-workers"]
    return w["spec"]["template"]["spec"]


@pytest.mark.parametrize("group", [None, "g5-a", "g5-b"])
def test_the_endpoint_runs_on_the_group_it_names_or_the_first_of_its_type(group):
    cfg = _env("dev", nodeGroups={**_env_groups(), "gpu": GROUPS})
    spec = _spec(cfg, group)
    chosen = group or "g5-a"
    assert endpoint_group(cfg, spec).name == chosen
    assert _workers(cfg, spec)["nodeSelector"][NODE_GROUP_LABEL] == chosen
    size = next(g["maxSize"] for g in GROUPS if g["name"] == chosen)
    assert worker_capacity(cfg, spec) == size * (4 // spec.gpus)   # counted on its own group


def test_an_affinity_no_group_of_the_type_admits_is_one_line():
    cfg = _env("dev", nodeGroups={**_env_groups(), "gpu": GROUPS})
    with pytest.raises(ConfigError) as err:
        _spec(cfg, "g6")
    assert "nodeAffinity" in str(err.value) and "\n" not in str(err.value)


def test_a_group_no_endpoint_runs_on_is_one_line_in_the_plan():
    cfg = _env("dev", nodeGroups={**_env_groups(), "gpu": GROUPS})
    both = plan_text(cfg, (_spec(cfg, None, "one"), _spec(cfg, "g5-b", "two")))
    assert "idle" not in both
    one = plan_text(cfg, (_spec(cfg, None, "one"),)).splitlines()
    idle = [line for line in one if "idle" in line]
    assert len(idle) == 1 and "g5-b" in idle[0] and "billed for nothing" in idle[0]


def _env_groups() -> dict:
    from tests.conftest import context_for
    return copy.deepcopy(context_for(env="dev")["environments"]["dev"]["nodeGroups"])
