"""The "deploy it first" hint names the `-c` flags that select the very environment the tool
ran on: read from the declared environments and the region, not from a `-cn` in the name."""
from __future__ import annotations

import json
import shlex
import shutil
from pathlib import Path

import boto3
import pytest
from botocore.stub import Stubber

from config import resolve_environment
from config.arguments import ToolError
from config.context import declared_environments, repository_context
from tests.conftest import ROOT
from tools.cli import Aws, deploy_context

CHINA = json.loads((ROOT / "environments" / "china.json").read_text())
DEV = json.loads((ROOT / "environments" / "dev.json").read_text())


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    """The repository's environments, and three a team could name as it likes: a China-region
    file named like a variant (`prod-cn`), a global one ending in `-cn`, and a global one with
    a China variant of its own."""
    root = tmp_path_factory.mktemp("repo")
    shutil.copy(ROOT / "cdk.json", root)
    shutil.copytree(ROOT / "environments", root / "environments")
    extra = {"prod-cn": CHINA,
             "stage-cn": {k: v for k, v in DEV.items() if k != "chinaVariant"},
             "edge": DEV}
    for name, raw in extra.items():
        (root / "environments" / f"{name}.json").write_text(json.dumps(raw))
    return root


def _selected(root: Path, flags: str) -> tuple[str, str]:
    """(name, region) of what `cdk ... FLAGS` synthesizes."""
    words = shlex.split(flags)
    context = dict(w.split("=", 1) for w in words[1::2])
    assert words[::2] == ["-c"] * len(context)
    cfg = resolve_environment({**repository_context(root), **context})
    return cfg.name, cfg.region


def test_every_environment_hint_selects_that_environment(root):
    names = declared_environments(root)
    assert {"prod-cn", "stage-cn", "edge-cn"} <= set(names)
    for name, selection in names.items():
        cfg = resolve_environment({**repository_context(root), **selection})
        flags = deploy_context(cfg, root)
        assert _selected(root, flags) == (cfg.name, cfg.region), name
        assert ("china=true" in flags) == cfg.region.startswith("cn-"), name


def test_missing_stack_names_the_flags(monkeypatch):
    """Through the tool's own path: CloudFormation says the stack does not exist."""
    cfg = resolve_environment({**repository_context(ROOT), "env": "dev", "china": "true"})

    def factory(service):
        client = boto3.client(service, region_name=cfg.region, aws_access_key_id="x",
                              aws_secret_access_key="x")
        stub = Stubber(client)
        stub.add_client_error("describe_stacks", service_error_code="ValidationError",
                              service_message="Stack with id x does not exist")
        stub.activate()
        return client

    with pytest.raises(ToolError) as err:
        Aws(cfg, factory=factory).stack_output("Storage", "ModelBucketName")
    assert str(err.value).endswith(f"(cdk deploy KvCache-{cfg.name}-Storage "
                                   f"{deploy_context(cfg)})")
    assert _selected(ROOT, deploy_context(cfg)) == (cfg.name, cfg.region)
