"""Snapshots catch drift; the assertions beside them say what must hold.

Each environment's snapshots live in a folder of its own, environments/snapshots/NAME/
(tests/conftest.py EnvironmentSnapshots), recorded by `make snapshots ENV=NAME`."""
from __future__ import annotations

import ast
import json
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from config.context import ENVIRONMENTS_DIR, SNAPSHOTS_DIR
from tests.conftest import (
    DECLARED, ENVIRONMENTS, ROOT, EnvironmentSnapshots, normalise, snapshot_folder,
)

STACKS = ["Network", "Storage", "Cluster", "Cache", "Observability", "Serving"]


@pytest.mark.parametrize("stack", STACKS)
@pytest.mark.parametrize("name", ENVIRONMENTS)
def test_template_snapshot(synths, name, stack, environment_snapshot):
    s = synths[name]
    key = f"{s.cfg.stack_prefix}-{stack}"
    if key not in s.templates:
        pytest.skip(f"{name} has no {stack} stack")
    assert normalise(json.dumps(s.templates[key], indent=1, sort_keys=True)) == \
        environment_snapshot


def test_every_snapshot_folder_belongs_to_a_declared_environment():
    """syrupy never looks in the folder of an environment that is gone: it is said here."""
    folder = ROOT / ENVIRONMENTS_DIR / SNAPSHOTS_DIR
    for path in sorted(folder.iterdir()):
        assert path.name in DECLARED, (
            f"{path.relative_to(ROOT)}: no environment {path.name} is declared "
            f"({ENVIRONMENTS_DIR}/{path.name}.json, or the chinaVariant of "
            f"{path.name.removesuffix('-cn')}): delete the folder")


def test_make_snapshots_runs_every_environment_snapshot():
    """`make snapshots` runs exactly the modules whose tests use `environment_snapshot`, and
    its `-k snapshot` selects each of those tests."""
    text = (ROOT / "Makefile").read_text().replace("\\\n", " ")
    listed = set(re.search(r"^SNAPSHOT_TESTS := (.*)$", text, re.M).group(1).split())
    users = {}
    for path in (ROOT / "tests").rglob("test_*.py"):
        source = path.read_text()
        if "environment_snapshot" not in source:   # no function of it can take the fixture
            continue
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.FunctionDef) and "environment_snapshot" in {
                    a.arg for a in node.args.args}:
                users.setdefault(str(path.relative_to(ROOT)), []).append(node.name)
    assert set(users) == listed
    assert all("snapshot" in test for tests in users.values() for test in tests), users


def test_unused_snapshots_are_sought_only_where_the_run_writes(monkeypatch):
    """syrupy deletes, on --snapshot-update, what it finds unused in the folders it looks in:
    only the folder of an environment the run covers, and only from a test that stores
    there (`make snapshots ENV=prod-cn` once deleted the China variant's snapshots through a
    test parametrized by ["china", "dev-cn"])."""
    import tests.conftest as conftest

    def where(env: str, fixtures: tuple[str, ...]) -> Path:
        item = SimpleNamespace(callspec=SimpleNamespace(params={"name": env}),
                               fixturenames=fixtures)
        return Path(EnvironmentSnapshots.discovery_dirname(
            test_location=SimpleNamespace(item=item)))

    monkeypatch.setattr(conftest, "ENVIRONMENTS", ["dev"])   # --environment dev
    assert where("dev", ("environment_snapshot",)) == snapshot_folder("dev")
    for env, fixtures in [("dev-cn", ("environment_snapshot",)), ("dev", ("synths",))]:
        assert where(env, fixtures) == snapshot_folder(None)
        assert not snapshot_folder(None).exists()
