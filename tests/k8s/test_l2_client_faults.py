"""The in-cluster L2's client under faults: k8s/l2.py CLIENT_FAULTS against what LMCache's own
client does (tests/k8s/l2_client_drill.py: its RemoteBackend built from the lmcache.yaml we
render for each connector the image's LMCache has for the in-cluster Valkey, against a real
redis-server that stalls, stops, starts again empty and evicts, allkeys-lru as rendered).

A client passes when no read returns bytes other than those stored (a read that fails must come
back None, a miss the engine recomputes) and every call returns within blocking_timeout_secs +
1 s, also once the server is back. A pair listed in CLIENT_FAULTS must fail the drill and one not
listed must pass it; synth deploys no in-cluster L2 where every connector is listed.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from unittest import mock

import pytest
import yaml

import k8s.serving
from config.images import IMAGES, image_release
from k8s.l2 import (
    CLIENT_FAULTS, IN_CLUSTER, connector_for, in_cluster_candidates, in_cluster_refusal,
)
from k8s.workers import L2_SAFE_LMCACHE
from tests.background import Background
from tests.conftest import ROOT
from tests.k8s.lmcache_parse import LMCACHE_PY, PARSERS, parser_versions

DRILL = Path(__file__).with_name("l2_client_drill.py")
BOUND_S = 1.0     # past blocking_timeout_secs: a call still running then counts as hung
# every release an image that may have an L2 carries, with each connector it has in the cluster
DRILLED = [(c.name, release) for release in
           (tuple(map(int, v.split("."))) for v in parser_versions())
           if release >= L2_SAFE_LMCACHE for c in in_cluster_candidates(release)]


def _release(release: tuple[int, ...]) -> str:
    return ".".join(map(str, release))


def _rendered(name: str, tmp: Path) -> Path:
    """The workers' lmcache.yaml as build_charts renders it for the in-cluster Valkey when
    `name` is its connector (the seed, l2CacheBackend: valkey)."""
    import cdk8s

    from k8s.l2 import CONNECTORS
    from k8s.serving import build_charts, placeholder_facts
    from tests.k8s.test_charts import _env, _spec

    cfg = _env("dev")
    spec = _spec(cfg, backend="valkey")
    with mock.patch.object(k8s.serving, "connector_for", lambda *_: CONNECTORS[name]):
        docs = [d for chart in build_charts(cdk8s.App(), cfg, (spec,),
                                            placeholder_facts(cfg, (spec,)))
                for d in chart.to_json()]
    cm = next(d for d in docs if d["kind"] == "ConfigMap"
              and d["metadata"]["name"].endswith("-workers-lmcache"))
    path = tmp / f"{name}.yaml"
    path.write_text(cm["data"]["lmcache.yaml"])
    return path


def _drill(tmp: Path) -> Background:
    """One LMCache process per release (its import is most of the cost), its connectors'
    drills side by side, each stopping at its first wrong read or hung call."""
    release = {r for _, r in DRILLED}
    assert len(release) == 1, "one LMCache process per release: extend _drill"
    (release,) = release
    configs = [a for name, _ in DRILLED for a in ("--config", str(_rendered(name, tmp)))]
    timeout = max(yaml.safe_load(Path(c).read_text())["blocking_timeout_secs"]
                  for c in configs[1::2])
    return Background([str(LMCACHE_PY), str(DRILL), *configs, "--fail-fast",
                       "--bound", str(timeout + BOUND_S)], timeout=240,
                      env={**os.environ, "PYTHONPATH": str(PARSERS / _release(release))})


_RESULTS: dict = {}


@pytest.fixture
def drilled(early) -> dict:
    """{connector name: its drill's result}, from the run started with the session."""
    if not _RESULTS:
        proc = early.run.result()
        line = next((x for x in proc.stdout.splitlines() if x.startswith("DRILL ")), None)
        assert line, proc.stdout[-2000:] + proc.stderr[-3000:]
        _RESULTS.update({yaml.safe_load(Path(path).read_text())["remote_url"].split("://")[0]:
                         result for path, result in
                         json.loads(line.removeprefix("DRILL ")).items()})
    return _RESULTS


def _faults(result: dict) -> list[str]:
    """What in a drill's result breaks the rule (module docstring)."""
    out = []
    for phase, t in result.items():
        if not isinstance(t, dict):
            continue
        if t["wrong"]:
            out.append(f"{phase}: {t['wrong']} chunk(s) read back with other bytes")
        if t["hung_calls"]:
            out.append(f"{phase}: {t['hung_calls']} call(s) past {result['bound_s']} s")
    return out


@pytest.mark.starts_early(start=_drill)
@pytest.mark.parametrize("name,release", DRILLED, ids=lambda x: x if isinstance(x, str)
                         else _release(x))
def test_a_connector_is_listed_as_faulty_exactly_when_the_drill_finds_it(drilled, name,
                                                                          release):
    result = drilled[name]
    assert "failed" not in result, result
    faults = _faults(result)
    if (name, release) in CLIENT_FAULTS:
        assert faults, (f"{name}:// in LMCache {_release(release)} passed the drill: take it "
                        f"out of k8s/l2.py CLIENT_FAULTS", result)
        return
    assert not faults, (f"{name}:// in LMCache {_release(release)}: {faults}; list it in "
                        "k8s/l2.py CLIENT_FAULTS", result)
    # below maxmemory chunks come back as stored; past every fault fresh chunks go round
    # again; evicted ones come back as misses
    assert result["fits"]["right"] == 4 and result["fits"]["lookup_hits"] == 4, result
    assert result["restarted"]["round_trips_right"] > 0
    assert result["paused_after_lookup"]["round_trips_right"] > 0
    assert result["evicted_after_lookup"]["server_evicted_keys"] > 0


def test_synth_deploys_no_in_cluster_l2_that_the_drill_failed():
    """The shipped worker image asks for the in-cluster Valkey: it gets it only through a
    connector that passed, and otherwise no L2, said in one line naming what failed."""
    from bench.tiers import rendered_tiers

    release = image_release(IMAGES["vllm-lmcache"]).lmcache
    sound = [c for c in in_cluster_candidates(release) if (c.name, release) not in CLIENT_FAULTS]
    r = rendered_tiers("valkey", instance_type="g5.24xlarge", gpus=4, replicas=4,
                       prefix_tokens=65536, force_l2=True)
    said = [w for w in r.warnings if "no in-cluster L2 is deployed" in w]
    if sound:
        assert r.lmcache["remote_url"].startswith(sound[0].scheme) and not said
        assert connector_for(IN_CLUSTER, release, glide=False) is sound[0]
        return
    assert "remote_url" not in r.lmcache and r.l2_capacity_gib is None
    assert len(said) == 1 and "docs/upstream.md" in said[0]
    for c in in_cluster_candidates(release):
        assert CLIENT_FAULTS[(c.name, release)] in said[0]
    assert said[0].ack.endswith(":kvCacheSpec.l2CacheSpec.l2CacheBackend")
    assert "## LMCache" in (ROOT / "docs" / "upstream.md").read_text()


def test_the_in_cluster_connector_is_the_fastest_the_drill_passed(monkeypatch):
    release = image_release(IMAGES["vllm-lmcache"]).lmcache
    resp, redis = in_cluster_candidates(release)
    monkeypatch.setattr("k8s.l2.CLIENT_FAULTS", {})
    assert connector_for(IN_CLUSTER, release, glide=False) is resp
    monkeypatch.setattr("k8s.l2.CLIENT_FAULTS", {(resp.name, release): "x"})
    assert connector_for(IN_CLUSTER, release, glide=False) is redis
    assert in_cluster_refusal(release) is None
    monkeypatch.setattr("k8s.l2.CLIENT_FAULTS", {(c.name, release): c.name for c in (resp, redis)})
    assert in_cluster_refusal(release) == "resp; redis"
    # the verdict still has a connector's rates to judge with
    assert connector_for(IN_CLUSTER, release, glide=False) is resp
