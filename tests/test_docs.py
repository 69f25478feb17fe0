"""The docs speak of the repository only, and the day-two page says which command needs AWS."""
from __future__ import annotations

import re

import pytest

from tests.conftest import ROOT

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# Our own tracker's numbers mean nothing to a user; an upstream `owner/repo#N` does.
OURS = re.compile(r"\b[Ii]ssues? \d+|(?<![\w/.-])#\d+\b|\.\./shared|FACTS\.md")


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_docs_point_nowhere_outside_the_repository(doc):
    found = [(n, m.group()) for n, line in enumerate(doc.read_text().splitlines(), 1)
             for m in OURS.finditer(line)]
    assert found == [], found


def test_every_day_two_command_is_run_by_a_test_or_needs_an_account():
    text = (ROOT / "docs" / "operations.md").read_text()
    blocks = re.findall(r"```bash\n(.*?)```", text, re.S)
    commands = [line for block in blocks for line in block.splitlines() if line.strip()]
    assert len(commands) >= 8
    for line in commands:
        marker = re.search(r"#\s*(needs an account|run by (tests/\S+))", line)
        assert marker, line
        if marker.group(2):
            assert (ROOT / marker.group(2)).exists(), line
    for tool in re.findall(r"python -m tools (\S+)", text):   # the tools it names exist
        assert (ROOT / "tools" / f"{tool.replace('-', '_')}.py").exists() or tool in (
            "bench", "calibrate", "bench-compare"), tool
