"""tests.lint.CfnLint lints each template content once per session and regions, and every lint
still waits on runs that cover all of its templates (a stand-in cfn-lint: the runs are what is
tested, not cfn-lint)."""
from __future__ import annotations

import pytest
import yaml

import tests.lint
from tests.conftest import ROOT
from tests.lint import CfnLint


@pytest.fixture
def fake(tmp_path, monkeypatch):
    """A cfn-lint that prints the templates it was given and fails on one named bad*."""
    script = tmp_path / "cfn-lint"
    script.write_text('#!/bin/sh\necho "run: $*"\ncase "$*" in *bad*) exit 2;; esac\n')
    script.chmod(0o755)
    monkeypatch.setattr(tests.lint, "CFN_LINT", script)
    monkeypatch.setattr(tests.lint, "_RUNS", {})
    return tmp_path


def _template(path, body: str) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(body)
    return str(path)


def test_same_bytes_in_the_same_regions_are_linted_once(fake):
    a = _template(fake / "one" / "Net.template.json", '{"a": 1}')
    b = _template(fake / "one" / "Srv.template.json", '{"b": 1}')
    a2 = _template(fake / "two" / "Net.template.json", '{"a": 1}')
    c = _template(fake / "two" / "Srv.template.json", '{"c": 1}')
    first = CfnLint(("us-west-2",), [a, b])
    second = CfnLint(("us-west-2",), [a2, c, c])
    assert second.templates == [a2, c, c]          # what the test asserts it covers
    proc = second.result()
    assert proc.returncode == 0
    runs = proc.stdout.splitlines()
    assert runs == [f"run: --regions us-west-2 -- {a} {b}", f"run: --regions us-west-2 -- {c}"]
    assert first.result().stdout.splitlines() == runs[:1]
    # another region is another lint of the same bytes
    third = CfnLint(("cn-north-1",), [a2])
    assert third.result().stdout.splitlines() == [f"run: --regions cn-north-1 -- {a2}"]


def test_a_failing_run_fails_every_lint_that_covers_a_template_of_it(fake):
    bad = _template(fake / "one" / "bad.template.json", '{"bad": 1}')
    ok = _template(fake / "one" / "ok.template.json", '{"ok": 1}')
    same = _template(fake / "two" / "ok.template.json", '{"ok": 1}')
    CfnLint(("us-west-2",), [bad, ok])
    proc = CfnLint(("us-west-2",), [same]).result()
    assert proc.returncode == 2 and bad in proc.stdout


def test_the_project_config_names_no_template():
    """Sharing runs by content holds while ROOT/.cfnlintrc treats every template alike."""
    config = yaml.safe_load((ROOT / ".cfnlintrc").read_text())
    assert not {"templates", "ignore_templates"} & set(config), config
