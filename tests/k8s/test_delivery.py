"""Cluster-level charts and the plain-YAML delivery for review and GitOps."""
from __future__ import annotations

import json

import cdk8s
import kubernetes_validate
import yaml

from config.contracts import DEVICE_PLUGIN_LABEL
from config.images import CHARTS, ImageResolver
from k8s.monitoring import CHART_KEY, PLACEHOLDERS
from k8s.device_plugin import DevicePluginChart
from k8s.serving import load_endpoints
from stacks.app_builder import write_manifests
from tests.conftest import ROOT
from tests.k8s.crds import is_custom_resource, validate_custom_resources
from tests.k8s.test_monitoring import _validate_prometheus_rule


def test_device_plugin_daemonset_runs_only_where_the_ami_lacks_one(china):
    image = ImageResolver(True, china.cfg.account, china.cfg.facts).uri("nvidia-device-plugin")
    (ds,) = DevicePluginChart(cdk8s.App(), "dp", image=image).to_json()
    kubernetes_validate.validate(ds, china.cfg.kubernetes_version + ".0", strict=True)
    pod = ds["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {DEVICE_PLUGIN_LABEL: "daemonset"}
    assert pod["containers"][0]["image"].startswith(
        "222222222222.dkr.ecr.cn-northwest-1.amazonaws.com.cn/kvcache/nvidia/k8s-device-plugin:")
    assert "@sha256:" in pod["containers"][0]["image"]


def test_cluster_stack_applies_the_device_plugin(dev):
    text = str(dev.template("Cluster"))
    assert "nvidia-device-plugin" in text


def test_dist_yaml_is_written_valid_and_token_free(tmp_path, synths):
    for name in ("dev", "china"):
        cfg = synths[name].cfg
        specs = load_endpoints(cfg, ROOT)
        files = write_manifests(cfg, specs, tmp_path / name)
        monitoring = (["04-monitoring-base.yaml", "05-dcgm-exporter.yaml",
                       "06-monitoring-network-policies.yaml"]
                      + (["07-alert-rules.yaml", "08-dashboards.yaml"]
                         if cfg.observability == "self-hosted" else []))
        assert [f.name for f in files] == ["00-namespace.yaml",
                                           "01-llama-8b-intel-routing-workers.yaml",
                                           "02-llama-8b-intel-routing-router.yaml",
                                           "03-serving-network-policies.yaml",
                                           *monitoring, "kube-prometheus-stack.values.yaml"]
        objects = [f for f in files if f.parent == tmp_path / name]
        docs = [d for f in objects for d in yaml.safe_load_all(f.read_text())]
        for doc in docs:
            if doc["kind"] == "PrometheusRule":
                _validate_prometheus_rule(doc)
            elif not is_custom_resource(doc):
                kubernetes_validate.validate(doc, cfg.kubernetes_version + ".0", strict=True)
        validate_custom_resources([d for d in docs if is_custom_resource(d)
                                   and d["kind"] != "PrometheusRule"])
        text = "".join(f.read_text() for f in files)
        assert "${Token[" not in text
        for placeholder in ("${MODEL_BUCKET}", "${API_KEY_SECRET_ARN}", "${LB_SUBNETS}"):
            assert placeholder in text, placeholder
        # the router image is the catalogue's, in the account's ECR: no placeholder
        assert cfg.images.uri("router") in text and "${ROUTER_IMAGE}" not in text
        managed_l2 = any(s.l2_enabled and not s.l2_url for s in specs)   # the shipped: L1 only
        for placeholder in ("${L2_ENDPOINT}", "${L2_SECRET_ARN}"):
            assert (placeholder in text) is managed_l2, placeholder


def test_dist_holds_the_monitoring_objects_the_stack_deploys(tmp_path, synths):
    """Same charts and same values as the Monitoring stack, AWS-assigned values as ${...}."""
    for name in ("dev", "china"):
        s = synths[name]
        files = write_manifests(s.cfg, load_endpoints(s.cfg, ROOT), tmp_path / name)
        by_name = {f.name: f for f in files}
        for chart in s.stacks.monitoring.charts.all():
            (path,) = [f for n, f in by_name.items() if n.endswith(f"-{chart.node.id}.yaml")]
            assert list(yaml.safe_load_all(path.read_text())) == chart.to_json()
        values_file = by_name["kube-prometheus-stack.values.yaml"]
        assert values_file.parent.name == "helm"
        header = values_file.read_text().splitlines()[0]
        assert header.startswith("# helm upgrade --install kvcache ")
        assert f"--version {CHARTS[CHART_KEY].version}" in header
        values = yaml.safe_load(values_file.read_text())
        deployed = json.loads(json.dumps(s.stacks.monitoring.collector.values, default=str))
        placeholders = set(PLACEHOLDERS.values())
        found = set()

        def same(ours, theirs):   # equal except where the stack passes a deploy-time token
            if isinstance(ours, dict):
                assert set(ours) == set(theirs)
                for k in ours:
                    same(ours[k], theirs[k])
            elif isinstance(ours, list):
                assert len(ours) == len(theirs)
                for a, b in zip(ours, theirs):
                    same(a, b)
            elif ours in placeholders:
                found.add(ours)
                assert "${Token[" in str(theirs)
            else:
                assert ours == theirs
        same(values, deployed)
        expected = ({PLACEHOLDERS["remote_write"]} if s.cfg.observability == "managed"
                    else {PLACEHOLDERS["alert_topic"], PLACEHOLDERS["grafana_admin_secret"]})
        assert found == expected
