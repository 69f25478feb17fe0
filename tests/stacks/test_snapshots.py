"""Snapshots catch drift; the assertions beside them say what must hold."""
from __future__ import annotations

import json

import pytest

from tests.conftest import ENVIRONMENTS, normalise

STACKS = ["Network", "Storage", "Cluster", "Cache", "Observability", "Serving"]


@pytest.mark.parametrize("stack", STACKS)
@pytest.mark.parametrize("name", ENVIRONMENTS)
def test_template_snapshot(synths, name, stack, snapshot):
    s = synths[name]
    key = f"{s.cfg.stack_prefix}-{stack}"
    if key not in s.templates:
        pytest.skip(f"{name} has no {stack} stack")
    assert normalise(json.dumps(s.templates[key], indent=1, sort_keys=True)) == snapshot
