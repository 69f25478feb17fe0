"""Alerting rules: valid for Prometheus (promtool) and for the parser, only catalogue metrics,
and the same document in both deliveries."""
from __future__ import annotations

import shutil
import subprocess

import pytest
import yaml

from config import ConfigError, resolve_environment
from observability.metrics import ENDPOINT_LABEL, series_names
from observability.promql import metric_names
from observability.rules import TTFT_P90_OBJECTIVE_SECONDS, alert_groups, render, rule_file
from tests.conftest import context_for

REQUIRED = {"KvcacheTtftP90AboveObjective", "KvcacheHitRateCollapse", "KvcacheL2Unhealthy",
            "KvcacheL2Slow", "KvcacheWorkerUnhealthy", "KvcacheRouterDown",
            "KvcacheQueueGrowing", "KvcacheGpuMemoryPressure"}


def _rules(cfg):
    return [r for g in rule_file(cfg)["groups"] for r in g["rules"]]


@pytest.mark.parametrize("name", ["dev", "china"])
def test_rule_file_passes_promtool(synths, name, tmp_path):
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool not found: install Debian's `prometheus` package "
                    "(apt-get install -y --no-install-recommends prometheus)")
    path = tmp_path / "rules.yaml"
    path.write_text(render(synths[name].cfg))
    proc = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"SUCCESS: {len(_rules(synths[name].cfg))} rules found" in proc.stdout


def test_every_expression_parses_and_reads_only_catalogue_metrics(dev):
    known = series_names()
    for rule in _rules(dev.cfg):
        names = metric_names(rule["expr"])
        assert names and names <= known, (rule["alert"], names - known)


def test_the_issue_s_alerts_exist_with_severity_and_text(dev):
    rules = {r["alert"]: r for r in _rules(dev.cfg)}
    assert REQUIRED <= set(rules)
    for rule in rules.values():
        assert rule["labels"]["severity"] in ("warning", "critical")
        assert rule["annotations"]["summary"] and rule["annotations"]["description"]
    # Per endpoint: the grouping label the scrape configs add
    assert f"by ({ENDPOINT_LABEL}, le)" in rules["KvcacheTtftP90AboveObjective"]["expr"]


def _ttft(cfg) -> str:
    return {a.name: a.expr for g in alert_groups(cfg).values() for a in g}[
        "KvcacheTtftP90AboveObjective"]


def test_ttft_objective_defaults_and_follows_the_environment(dev):
    assert dev.cfg.ttft_objective_seconds is None
    assert _ttft(dev.cfg).endswith(f"> {TTFT_P90_OBJECTIVE_SECONDS:g}")
    ctx = context_for(env="dev")
    ctx["environments"]["dev"]["ttftObjectiveSeconds"] = 1
    assert _ttft(resolve_environment(ctx)).endswith("> 1")


@pytest.mark.parametrize("value", [0, -1, 601, True, "2"])
def test_a_bad_ttft_objective_is_a_config_error(value):
    ctx = context_for(env="dev")
    ctx["environments"]["dev"]["ttftObjectiveSeconds"] = value
    with pytest.raises(ConfigError, match="ttftObjectiveSeconds"):
        resolve_environment(ctx)


def test_render_is_a_standard_rule_file(dev):
    doc = yaml.safe_load(render(dev.cfg))
    assert list(doc) == ["groups"]
    assert all(set(g) == {"name", "rules"} for g in doc["groups"])
