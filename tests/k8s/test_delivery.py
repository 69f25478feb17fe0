"""Cluster-level charts and the plain-YAML delivery for review and GitOps."""
from __future__ import annotations

import json

import cdk8s
import kubernetes_validate
import pytest
import yaml

from config.contracts import DEVICE_PLUGIN_LABEL
from config.images import CHARTS, ImageResolver
from k8s.monitoring import CHART_KEY, PLACEHOLDERS
from k8s.device_plugin import DevicePluginChart
from k8s.serving import load_endpoints, managed_l2_plans
from stacks.app_builder import write_manifests
from k8s.placeholders import PATTERN, PLACEHOLDERS as FILLABLE
from tests.conftest import ENVIRONMENTS, ROOT, YAML_LOADER
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


@pytest.mark.parametrize("name", ENVIRONMENTS)
def test_dist_yaml_is_written_valid_and_token_free(tmp_path, synths, name):
    """Gate: every environment's GitOps YAML passes the strict schemas, holds no CDK token and
    names what AWS assigns by placeholders the fill tool knows."""
    cfg = synths[name].cfg
    specs = load_endpoints(cfg, ROOT)
    files = write_manifests(cfg, specs, tmp_path / name)
    objects = [f for f in files if f.parent == tmp_path / name]
    docs = [d for f in objects for d in yaml.load_all(f.read_text(), Loader=YAML_LOADER)]
    for doc in docs:
        if doc["kind"] == "PrometheusRule":
            _validate_prometheus_rule(doc)
        elif not is_custom_resource(doc):
            kubernetes_validate.validate(doc, cfg.kubernetes_version + ".0", strict=True)
    validate_custom_resources([d for d in docs if is_custom_resource(d)
                               and d["kind"] != "PrometheusRule"])
    text = "".join(f.read_text() for f in files)
    assert "${Token[" not in text
    named = set(PATTERN.findall(text))
    assert named <= set(FILLABLE)
    assert {"MODEL_BUCKET", "API_KEY_SECRET_ARN"} <= named
    # the router image is the catalogue's, in the account's ECR: no placeholder
    assert cfg.images.uri("router") in text and "ROUTER_IMAGE" not in named
    assert ("LB_SUBNETS" in named) is (not cfg.network.existing)
    managed_l2 = bool(managed_l2_plans(cfg, specs))   # an endpoint's L2 is the ElastiCache
    assert {"L2_ENDPOINT", "L2_SECRET_ARN"} <= named if managed_l2 else not (
        {"L2_ENDPOINT", "L2_SECRET_ARN"} & named)


def test_dist_file_names_of_the_samples(tmp_path, synths):
    for name in ("dev", "china"):
        cfg = synths[name].cfg
        files = write_manifests(cfg, load_endpoints(cfg, ROOT), tmp_path / name)
        monitoring = (["40-monitoring-base.yaml", "41-dcgm-exporter.yaml",
                       "42-monitoring-network-policies.yaml"]
                      + (["50-alert-rules.yaml", "51-dashboards.yaml"]
                         if cfg.observability == "self-hosted" else []))
        assert [f.name for f in files] == ["00-namespace.yaml",
                                           "20-llama-8b-intel-routing-workers.yaml",
                                           "20-llama-8b-intel-routing-router.yaml",
                                           "30-serving-network-policies.yaml",
                                           *monitoring, "kube-prometheus-stack.values.yaml"]


def test_an_endpoints_files_keep_their_names_when_another_is_added(tmp_path):
    """GitOps: adding an endpoint (and the in-cluster cache it brings) adds files and renames
    none, so the diff holds only what changed; removing it takes only its own files away."""
    import copy

    from config.endpoint_spec import parse_endpoint
    from tests.k8s.test_charts import SEED, _env

    cfg = _env("dev", cache={"kind": "self-hosted"})
    specs = load_endpoints(cfg, ROOT)
    raw = copy.deepcopy(SEED)
    raw["metadata"]["name"] = "aaa-first-in-order"
    added = parse_endpoint(cfg.name, "endpoints/aaa.yaml", raw)
    assert added.l2_enabled    # it brings the in-cluster Valkey: one more chart before it
    before = {f.name: f.read_text() for f in write_manifests(cfg, specs, tmp_path / "a")}
    after = {f.name: f.read_text() for f in write_manifests(cfg, (added, *specs),
                                                            tmp_path / "b")}
    assert set(before) < set(after)
    new = set(after) - set(before)
    assert {n for n in new if "aaa-first-in-order" in n} == {
        "20-aaa-first-in-order-workers.yaml", "20-aaa-first-in-order-router.yaml"}
    assert all(n.startswith(("10-cache-", "20-aaa-")) for n in new), new
    for name in ("20-llama-8b-intel-routing-workers.yaml", "20-llama-8b-intel-routing-router.yaml"):
        assert after[name] == before[name]
    # and removed again: exactly the files it added are gone
    again = {f.name for f in write_manifests(cfg, specs, tmp_path / "b")}
    assert again == set(before)


@pytest.mark.parametrize("name", ENVIRONMENTS)
def test_dist_holds_the_monitoring_objects_the_stack_deploys(tmp_path, synths, name):
    """Same charts and same values as the Monitoring stack, AWS-assigned values as
    placeholders."""
    if True:
        s = synths[name]
        files = write_manifests(s.cfg, load_endpoints(s.cfg, ROOT), tmp_path / name)
        by_name = {f.name: f for f in files}
        for chart in s.stacks.monitoring.charts.all():
            (path,) = [f for n, f in by_name.items() if n.endswith(f"-{chart.node.id}.yaml")]
            assert list(yaml.load_all(path.read_text(), Loader=YAML_LOADER)) == chart.to_json()
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
