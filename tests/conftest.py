"""Synthesize each shipped environment once per session; every test reads from that."""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from config import EnvironmentConfig, resolve_environment
from config.context import cdk_json_context

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = {"dev": {"env": "dev"}, "china": {"env": "china"}, "dev-cn": {"env": "dev", "china": "true"}}
_HASH = re.compile(r"[0-9a-f]{64}")


@dataclass
class Synth:
    cfg: EnvironmentConfig
    stacks: object            # stacks.app_builder.EnvironmentStacks
    outdir: Path
    templates: dict[str, dict]  # stack name -> template

    def template(self, suffix: str) -> dict:
        return self.templates[f"{self.cfg.stack_prefix}-{suffix}"]


def context_for(**overrides: str) -> dict:
    return {**cdk_json_context(ROOT), **overrides}


def normalise(text: str) -> str:
    """Asset hashes differ across machines (zip metadata): snapshots must not see them."""
    return _HASH.sub("<hash>", text)


def _synth(name: str, tmp: Path) -> Synth:
    import aws_cdk as cdk

    from stacks.app_builder import build

    from k8s.serving import load_endpoints

    ctx = context_for(**SHIPPED[name])
    cfg = resolve_environment(ctx)
    app = cdk.App(context=ctx, outdir=str(tmp / name))
    stacks = build(app, cfg, load_endpoints(cfg, ROOT))
    assembly = app.synth()
    templates = {s.stack_name: s.template for s in assembly.stacks}
    return Synth(cfg, stacks, Path(assembly.directory), templates)


@pytest.fixture(scope="session")
def synths(tmp_path_factory) -> dict[str, Synth]:
    tmp = tmp_path_factory.mktemp("cdk")
    return {name: _synth(name, tmp) for name in SHIPPED}


@pytest.fixture(scope="session")
def dev(synths) -> Synth:
    return synths["dev"]


@pytest.fixture(scope="session")
def china(synths) -> Synth:
    return synths["china"]


def resources(template: dict, type_: str) -> dict[str, dict]:
    return {k: v for k, v in template.get("Resources", {}).items() if v["Type"] == type_}


def dumps(obj) -> str:
    return json.dumps(obj, sort_keys=True)
