"""Cluster-level charts and the plain-YAML delivery for review and GitOps."""
from __future__ import annotations

import cdk8s
import kubernetes_validate
import yaml

from config.contracts import DEVICE_PLUGIN_LABEL
from config.images import ImageResolver
from k8s.device_plugin import DevicePluginChart
from k8s.serving import load_endpoints
from stacks.app_builder import write_manifests
from tests.conftest import ROOT
from tests.k8s.crds import is_custom_resource, validate_custom_resources


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
        files = write_manifests(cfg, load_endpoints(cfg, ROOT), tmp_path / name)
        assert [f.name for f in files] == ["00-namespace.yaml",
                                           "01-llama-3-1-8b-instruct-workers.yaml",
                                           "02-llama-3-1-8b-instruct-router.yaml",
                                           "03-serving-network-policies.yaml"]
        docs = [d for f in files for d in yaml.safe_load_all(f.read_text())]
        for doc in docs:
            if not is_custom_resource(doc):
                kubernetes_validate.validate(doc, cfg.kubernetes_version + ".0", strict=True)
        validate_custom_resources([d for d in docs if is_custom_resource(d)])
        text = "".join(f.read_text() for f in files)
        assert "${Token[" not in text
        for placeholder in ("${ROUTER_IMAGE}", "${MODEL_BUCKET}", "${L2_ENDPOINT}",
                            "${L2_SECRET_ARN}", "${API_KEY_SECRET_ARN}", "${LB_SUBNETS}"):
            assert placeholder in text, placeholder
