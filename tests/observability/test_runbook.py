"""docs/runbook.md has an entry for every alert we ship, in every variant: what it means and
the first three things to do; and no entry for an alert that no longer exists."""
from __future__ import annotations

import copy
import re

from config import resolve_environment
from observability.alerting import INHIBITIONS
from observability.rules import alert_groups
from tests.conftest import DECLARED, ROOT, context_for

RUNBOOK = ROOT / "docs" / "runbook.md"


def _shipped_alerts() -> set[str]:
    cfgs = [resolve_environment(context_for(**ctx)) for ctx in DECLARED.values()]
    ctx = copy.deepcopy(context_for(env="dev"))
    ctx["environments"]["dev"]["cache"] = {"kind": "self-hosted"}
    cfgs.append(resolve_environment(ctx))
    return {a.name for cfg in cfgs for group in alert_groups(cfg).values() for a in group}


def _entries() -> dict[str, str]:
    text = RUNBOOK.read_text()
    alerts = text[text.index("\n## Alerts\n"):]
    parts = re.split(r"^### (\S+)\n", alerts, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2]))


def test_every_alert_has_exactly_one_entry_and_every_entry_an_alert():
    names = _shipped_alerts()
    entries = _entries()
    assert len(names) >= 20
    assert sorted(entries) == sorted(names)
    assert len(re.findall(r"^### ", RUNBOOK.read_text(), flags=re.M)) == len(names)


def test_each_entry_says_what_it_means_and_three_first_steps():
    for name, body in _entries().items():
        body = body.split("\n## ")[0]
        assert body.startswith("Means: "), name
        steps = re.findall(r"^(\d)\. ", body, flags=re.M)
        assert steps == ["1", "2", "3"], (name, steps)


def test_entries_of_inhibited_alerts_name_what_silences_them():
    """An operator who sees only the cause must not hunt for its symptoms' pages."""
    entries = _entries()
    for rule in INHIBITIONS:
        assert "held back" in entries[rule.source], rule.source
