"""Issue 42's team, in its own files (tests/team_fleet.py): each environment's plan is priced,
both models are reachable through the one Istio Gateway by the model a request names, each
endpoint runs on the node group it names, and the team's own image, built FROM LMCache's
release, gets that image's drain and stall probe. tests/test_new_environment.py runs every
gate on the same two environments."""
from __future__ import annotations

import json
import shutil

import cdk8s
import pytest

from config import resolve_environment
from config.context import repository_context
from config.contracts import NODE_GROUP_LABEL
from config.images import LMCACHE_PATH
from k8s.gateway import MODEL_HEADER
from k8s.serving import build_charts, load_endpoints, placeholder_facts
from k8s.workers import DRAIN_HOOK, STALL_PROBE
from stacks.plan import plan_text
from tests.conftest import ROOT
from tests.k8s.test_gateway import _gateway_picks
from tests.team_fleet import fleet

ENVS, FILES = fleet()


@pytest.fixture(scope="module")
def team(tmp_path_factory):
    """The team's repository: ours with its environment and endpoint files added."""
    repo = tmp_path_factory.mktemp("team")
    shutil.copy(ROOT / "cdk.json", repo / "cdk.json")
    (repo / "environments").mkdir()
    for path, text in FILES.items():
        (repo / path).parent.mkdir(parents=True, exist_ok=True)
        (repo / path).write_text(text)
    for name, raw in ENVS.items():
        (repo / "environments" / f"{name}.json").write_text(json.dumps(raw))
    out = {}
    for name in ENVS:
        cfg = resolve_environment({**repository_context(repo), "env": name})
        specs = load_endpoints(cfg, repo)
        docs = [d for c in build_charts(cdk8s.App(), cfg, specs, placeholder_facts(cfg, specs))
                for d in c.to_json()]
        out[name] = (cfg, specs, docs)
    return out


@pytest.mark.parametrize("name", sorted(ENVS))
def test_the_plan_is_priced_and_names_no_idle_group(team, name):
    cfg, specs, _ = team[name]
    plan = plan_text(cfg, specs)
    (cost,) = [line for line in plan.splitlines() if "cost per hour" in line]
    assert "unknown" not in cost and "at least" not in cost and "no USD price" not in cost
    assert "idle" not in plan


@pytest.mark.parametrize("name", sorted(ENVS))
def test_both_models_are_reachable_through_the_gateway_by_the_model_they_name(team, name):
    _, specs, docs = team[name]
    routes = [d for d in docs if d["kind"] == "HTTPRoute"]
    assert len(routes) == len(specs) == 2
    for s in specs:
        assert _gateway_picks(routes, "gateway.example.com", {MODEL_HEADER: s.model_name}) \
            == {f"{s.name}-pool"}, s.name
    assert [d for d in docs if d["kind"] == "DestinationRule"]   # Istio reaches the picker


@pytest.mark.parametrize("name", sorted(ENVS))
def test_each_endpoint_runs_where_it_names_with_its_images_drain_and_probe(team, name):
    cfg, specs, docs = team[name]
    groups = {}
    for d in docs:
        if d["kind"] in ("Deployment", "StatefulSet") and d["metadata"]["name"].endswith(
                "-workers"):
            pod = d["spec"]["template"]["spec"]
            groups[d["metadata"]["name"]] = pod["nodeSelector"][NODE_GROUP_LABEL]
            (vllm,) = [c for c in pod["containers"] if c["name"] == "vllm"]
            hook = vllm["lifecycle"]["preStop"]["exec"]["command"]
            assert hook[:3] == [LMCACHE_PATH.python, "-c", DRAIN_HOOK]
            assert vllm["livenessProbe"]["exec"]["command"][:3] == [
                LMCACHE_PATH.python, "-c", STALL_PROBE]
            assert pod["terminationGracePeriodSeconds"] > 600
    assert len(set(groups.values())) == 2, groups     # one group each, as the files name
