"""How rules, dashboards and the collector reach each variant, read from the session's synths:
AMP/AMG only in global regions, nothing AWS-managed in China, China images from its ECR only,
no Grafana password in any template."""
from __future__ import annotations

import json
import re

import pytest
import yaml

from config.images import CHARTS
from k8s.monitoring import CHART_KEY, chart_images
from observability.rules import render
from tests.conftest import ENVIRONMENTS, dumps, normalise, resources

MANAGED_TYPES = ("AWS::APS::", "AWS::Grafana::", "Custom::GrafanaDashboards")


def _all_types(synth) -> set[str]:
    return {r["Type"] for t in synth.templates.values() for r in t.get("Resources", {}).values()}


def _helm(synth) -> dict:
    (chart,) = resources(synth.template("Monitoring"), "Custom::AWSCDK-EKS-HelmChart").values()
    return chart["Properties"]


def test_global_gets_amp_rules_amg_dashboards_and_an_agent(dev):
    obs = dev.template("Observability")
    (ns,) = resources(obs, "AWS::APS::RuleGroupsNamespace").values()
    assert ns["Properties"]["Data"] == render(dev.cfg)
    assert yaml.safe_load(ns["Properties"]["Data"])["groups"]
    assert resources(obs, "AWS::Grafana::Workspace") and resources(obs, "AWS::APS::Workspace")

    mon = dev.template("Monitoring")
    (dash,) = resources(mon, "Custom::GrafanaDashboards").values()
    assert {"BundleBucket", "BundleKey", "WorkspaceId", "PrometheusUrl"} <= set(
        dash["Properties"])
    helm = _helm(dev)
    assert helm["Repository"] == CHARTS[CHART_KEY].repository
    assert helm["Version"] == CHARTS[CHART_KEY].version
    values = dumps(helm["Values"])
    assert '\\"agentMode\\":true' in values and "api/v1/remote_write" in values
    policies = json.dumps(resources(mon, "AWS::IAM::Policy"))
    assert '"aps:RemoteWrite"' in policies
    assocs = [a["Properties"]["ServiceAccount"]
              for a in resources(mon, "AWS::EKS::PodIdentityAssociation").values()]
    assert assocs == ["kvcache-prometheus"]


@pytest.mark.parametrize("name", ["china", "dev-cn"])
def test_china_has_no_aws_managed_observability(synths, name):
    s = synths[name]
    assert f"{s.cfg.stack_prefix}-Observability" not in s.templates
    assert not any(t.startswith(MANAGED_TYPES) for t in _all_types(s))
    mon = s.template("Monitoring")
    assert "aps:" not in json.dumps(mon) and "grafana:" not in json.dumps(mon)


@pytest.mark.parametrize("name", ["china", "dev-cn"])
def test_china_chart_and_images_come_from_the_china_ecr(synths, name):
    s = synths[name]
    registry = f"{s.cfg.account}.dkr.ecr.{s.cfg.region}.amazonaws.com.cn"
    helm = _helm(s)
    assert helm["Repository"] == f"oci://{registry}/kvcache/charts/{CHART_KEY}"
    values = s.stacks.monitoring.collector.values
    images = set(chart_images(values))
    for chart in s.stacks.monitoring.charts.all():
        for doc in chart.to_json():
            pod = doc.get("spec", {}).get("template", {}).get("spec", {})
            images |= {c["image"] for c in pod.get("containers", [])}
    assert images and all(i.startswith(registry + "/") and "@sha256:" in i for i in images)
    # No other registry host anywhere in the monitoring template
    hosts = set(re.findall(r"[a-z0-9.-]+\.(?:io|com|cn|org)/[a-z0-9._/-]+:[\w.-]+@sha256",
                           dumps(s.template("Monitoring"))))
    assert hosts and all(h.startswith(registry) for h in hosts), hosts


@pytest.mark.parametrize("name", ["china", "dev-cn"])
def test_grafana_password_lives_only_in_secrets_manager(synths, name):
    s = synths[name]
    mon = s.template("Monitoring")
    (secret,) = resources(mon, "AWS::SecretsManager::Secret").values()
    assert "GenerateSecretString" in secret["Properties"]
    assert "SecretString" not in secret["Properties"]
    text = dumps(mon)
    assert "GF_SECURITY_ADMIN_PASSWORD__FILE" in text
    assert not re.search(r'GF_SECURITY_ADMIN_PASSWORD\\+":', text)   # only the __FILE form
    assert "adminPassword" not in text
    assocs = sorted(a["Properties"]["ServiceAccount"]
                    for a in resources(mon, "AWS::EKS::PodIdentityAssociation").values())
    assert assocs == ["kvcache-alertmanager", "kvcache-grafana", "kvcache-prometheus"]
    policy = json.dumps(resources(mon, "AWS::IAM::Policy"))
    assert "secretsmanager:GetSecretValue" in policy


@pytest.mark.parametrize("name", ["china", "dev-cn"])
def test_rules_and_dashboards_wait_for_the_chart_s_crds(synths, name):
    mon = synths[name].template("Monitoring")
    helm_id = next(iter(resources(mon, "Custom::AWSCDK-EKS-HelmChart")))
    manifests = resources(mon, "Custom::AWSCDK-EKS-KubernetesResource")
    rules = next(r for r in manifests.values() if "PrometheusRule" in dumps(r))
    assert helm_id in rules.get("DependsOn", [])


@pytest.mark.parametrize("name", ENVIRONMENTS)
def test_monitoring_template_snapshot(synths, name, environment_snapshot):
    s = synths[name]
    text = json.dumps(s.template("Monitoring"), indent=1, sort_keys=True)
    assert normalise(text) == environment_snapshot
