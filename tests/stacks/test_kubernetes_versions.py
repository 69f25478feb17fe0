"""Every accepted Kubernetes minor synthesizes a Cluster stack whose control plane, kubectl layer
and Cluster Autoscaler are of that minor, so an environment moves one minor at a time by editing
one field (docs/operations.md, Upgrade Kubernetes)."""
from __future__ import annotations

import copy
import json

import aws_cdk as cdk
import pytest
from aws_cdk import aws_ec2 as ec2

from config import ConfigError, resolve_environment
from config.images import AUTOSCALER, IMAGES, KUBERNETES_VERSIONS, autoscaler_key
from k8s.serving import environment_images, load_endpoints
from stacks.cluster_stack import ClusterStack
from tests.conftest import ROOT, context_for, resources


def _env(version: str, ami_release: str | None = None) -> dict:
    ctx = copy.deepcopy(context_for(env="dev"))
    ctx["environments"]["dev"]["kubernetesVersion"] = version
    if ami_release:
        ctx["environments"]["dev"]["amiReleaseVersion"] = ami_release
    return ctx


def _release(version: str) -> str:
    """An AMI release of `version`'s form (the fixture pins one on every version)."""
    return f"{version}.3-20260115"


def _values(values) -> dict:
    """Helm values as the handler gets them; the cluster's name (a token) joined in as '?'."""
    if isinstance(values, dict) and "Fn::Join" in values:
        values = "".join(p if isinstance(p, str) else "?" for p in values["Fn::Join"][1])
    return json.loads(values)


@pytest.fixture(scope="module")
def clusters() -> dict[str, dict]:
    """minor -> the Cluster stack's template; one app, CDK's own validation off (the gates run
    it on the declared environments; here only what a version changes is looked at)."""
    app = cdk.App(context=context_for(), builtin_cloud_formation_validation=False)
    names = {}
    for version in KUBERNETES_VERSIONS:
        cfg = resolve_environment(_env(version, _release(version)))
        env = cdk.Environment(account=cfg.account, region=cfg.region)
        net = cdk.Stack(app, f"Net{version.replace('.', '')}", env=env)
        vpc = ec2.Vpc(net, "Vpc", max_azs=2)
        stack = ClusterStack(app, f"Cluster{version.replace('.', '')}", cfg=cfg, vpc=vpc,
                             env=env)
        names[version] = stack.stack_name
    assembly = app.synth()
    return {v: assembly.get_stack_by_name(n).template for v, n in names.items()}


def test_the_accepted_versions_are_consecutive_and_include_the_samples():
    minors = [int(v.split(".")[1]) for v in KUBERNETES_VERSIONS]
    assert minors == list(range(minors[0], minors[0] + len(minors))), KUBERNETES_VERSIONS
    for name in ("dev", "china"):
        assert resolve_environment(context_for(env=name)).kubernetes_version in KUBERNETES_VERSIONS


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_each_version_gets_its_own_kubectl_layer_and_autoscaler(clusters, version):
    t = clusters[version]
    (cluster,) = resources(t, "AWS::EKS::Cluster").values()
    assert cluster["Properties"]["Version"] == version
    layers = [r["Properties"].get("Description", "") for r in
              resources(t, "AWS::Lambda::LayerVersion").values()]
    assert any(f"/opt/kubectl/kubectl {version}." in d for d in layers), layers
    (values,) = [_values(r["Properties"]["Values"]) for r in t["Resources"].values()
                 if r["Type"] == "Custom::AWSCDK-EKS-HelmChart"
                 and r["Properties"].get("Release") == "cluster-autoscaler"]
    image = IMAGES[autoscaler_key(version)]
    assert values["image"]["tag"] == image.pin
    assert image.tag == AUTOSCALER[version][0]
    assert image.tag.startswith(f"v{version}.")   # Cluster Autoscaler's minor = Kubernetes'
    # the node groups move with it, to the pinned AMI release of that minor
    groups = [g["Properties"] for g in resources(t, "AWS::EKS::Nodegroup").values()]
    assert groups and all((g["Version"], g["ReleaseVersion"]) == (version, _release(version))
                          for g in groups)


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_only_the_environments_own_autoscaler_is_mirrored(version):
    cfg = resolve_environment(_env(version))
    keys = {i.key for i in environment_images(cfg, load_endpoints(cfg, ROOT))}
    assert {k for k in keys if k.startswith("cluster-autoscaler")} == {autoscaler_key(version)}


def test_a_version_eks_does_not_support_in_both_partitions_is_refused():
    with pytest.raises(ConfigError) as err:
        resolve_environment(_env("1.32"))
    assert err.value.field == "kubernetesVersion"
    assert all(v in str(err.value) for v in KUBERNETES_VERSIONS)
