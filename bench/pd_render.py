"""The HyperPod docs' DPD example (tests/fixtures/hyperpod/awsdocs-dpd-llama70b.yaml) rendered in
one of the repository's environments with a GPU node group of `instance_type` added and
`ml.p5.48xlarge` mapped to it (instanceTypeMap), as `cdk synth` reads it: the spec after
fit_endpoint (its warnings) and every rendered object."""
from __future__ import annotations

import copy
import functools
from dataclasses import dataclass, replace
from typing import Any, Callable

import yaml

from config.context import ROOT

DPD_FILE = ROOT / "tests" / "fixtures" / "hyperpod" / "awsdocs-dpd-llama70b.yaml"


@dataclass(frozen=True)
class Rendered:
    cfg: Any
    spec: Any
    docs: tuple[dict, ...]

    def one(self, kind: str, name: str) -> dict:
        found = [d for d in self.docs if d["kind"] == kind and d["metadata"]["name"] == name]
        assert len(found) == 1, (kind, name, len(found))
        return found[0]

    def container(self, deployment: str, name: str) -> dict:
        pod = self.one("Deployment", deployment)["spec"]["template"]["spec"]
        return next(c for c in pod["containers"] if c["name"] == name)

    def pd_warnings(self) -> list[str]:
        return [w for w in self.spec.warnings if "spec.pdSpec:" in w]


def dpd_raw(edit: Callable[[dict], Any] | None = None) -> dict:
    raw = copy.deepcopy(_raw())
    if edit:
        edit(raw)
    return raw


@functools.lru_cache(maxsize=None)
def _raw() -> dict:
    return yaml.safe_load(DPD_FILE.read_text())


def render(env: str, instance_type: str, raw: dict | None = None) -> Rendered:
    from cdk8s import App

    from config import resolve_environment
    from config.context import repository_context
    from config.endpoint_spec import parse_endpoint
    from config.instances import gpu_direct_efa_in
    from k8s.serving import build_charts, fit_endpoint, placeholder_facts

    ctx = repository_context(ROOT)
    ctx["env"] = env
    cfg = resolve_environment(ctx)
    group = replace(cfg.gpu_node_groups[0], name="efa", instance_types=(instance_type,),
                    efa=gpu_direct_efa_in(instance_type, cfg.region))
    cfg = replace(cfg, gpu_node_groups=(*cfg.gpu_node_groups, group),
                  instance_type_map={**cfg.instance_type_map, "ml.p5.48xlarge": instance_type})
    spec = parse_endpoint(env, "dpd.yaml", raw or dpd_raw(),
                          instance_type_map=cfg.instance_type_map,
                          node_instance_types=(instance_type,), root=ROOT)
    spec = fit_endpoint(cfg, spec)
    app = App()
    charts = build_charts(app, cfg, (spec,), placeholder_facts(cfg, (spec,)))
    return Rendered(cfg, spec, tuple(d for c in charts for d in c.to_json()))


@functools.lru_cache(maxsize=None)
def rendered(env: str, instance_type: str) -> Rendered:
    return render(env, instance_type)
