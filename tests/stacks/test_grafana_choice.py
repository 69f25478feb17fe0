"""`grafana: managed | none` (issue 16, finding 8): Amazon Managed Grafana needs IAM Identity
Center; an environment without it keeps AMP and drops the Grafana workspace."""
from __future__ import annotations

import aws_cdk as cdk
import pytest

from config import ConfigError, resolve_environment
from stacks.observability_stack import ObservabilityStack
from tests.conftest import context_for, resources


def _env(name: str, **over):
    ctx = context_for(env=name)
    ctx["environments"][name].update(over)
    return resolve_environment(ctx)


def test_managed_by_default_where_observability_is_managed(dev, china):
    assert dev.cfg.managed_grafana and not china.cfg.managed_grafana
    assert len(resources(dev.template("Observability"), "AWS::Grafana::Workspace")) == 1


def test_none_keeps_amp_and_drops_the_workspace():
    cfg = _env("dev", grafana="none")
    assert not cfg.managed_grafana
    stack = ObservabilityStack(cdk.App(), "Obs", cfg=cfg,
                               env=cdk.Environment(account=cfg.account, region=cfg.region))
    template = cdk.assertions.Template.from_stack(stack).to_json()
    assert resources(template, "AWS::Grafana::Workspace") == {}
    assert len(resources(template, "AWS::APS::Workspace")) == 1
    assert stack.managed.grafana is None


@pytest.mark.parametrize("env, value, allowed", [
    ("dev", "amg", "managed, none"),
    ("china", "managed", "no value with observability self-hosted"),
])
def test_bad_values_are_one_line(env, value, allowed):
    with pytest.raises(ConfigError) as info:
        _env(env, grafana=value)
    assert info.value.field == "grafana" and allowed in str(info.value.allowed)
    assert "\n" not in str(info.value)
