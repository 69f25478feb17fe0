"""cdk.json carries every flag a new `cdk init` app gets from the pinned aws-cdk-lib (its
`recommended-feature-flags.json`, which the CLI's init template copies), so synth prints no
"feature flags are not configured" notice. Each deliberate difference is listed with its reason.

Reviewed against the stateful resources (model bucket, ECR repositories, ElastiCache, KMS keys,
AMP workspace, secrets): none of the 81 flags added in issue 12 changes one of them; the
template diff was the Cluster stack only (native OIDC provider, the kubectl handlers'
CDK-managed log groups), and `explicitStackTags` made the stacks' tags explicit (README:
upgrading a deployed environment)."""
from __future__ import annotations

import json
import tarfile
from importlib import resources as importlib_resources

import aws_cdk

from tests.conftest import ROOT

# flag -> (our value, why it differs from the recommendation)
DEVIATIONS = {
    "@aws-cdk/core:enablePartitionLiterals": (
        False, "ARNs keep the AWS::Partition token: one template works in both partitions and "
               "a test proves no `arn:aws:` literal ever reaches a template"),
    "@aws-cdk/core:defaultCrossStackReferences": (
        "strong", "stacks pass typed objects: a strong export stops deleting a stack another "
                  "one still reads"),
}


def _recommended() -> dict:
    tgz = next(p for p in importlib_resources.files(aws_cdk).joinpath("_jsii").iterdir()
               if p.name.startswith("aws-cdk-lib@"))
    with tarfile.open(str(tgz)) as tar:
        return json.load(tar.extractfile("package/recommended-feature-flags.json"))


def test_every_recommended_flag_is_configured_as_recommended_or_deliberately():
    context = json.loads((ROOT / "cdk.json").read_text())["context"]
    recommended = _recommended()
    assert len(recommended) > 80
    missing = sorted(set(recommended) - set(context))
    assert missing == []
    differ = {k: context[k] for k, v in recommended.items() if context[k] != v}
    assert differ == {k: v for k, (v, _) in DEVIATIONS.items()}


def test_eks_uses_the_native_oidc_provider_not_the_deprecated_custom_resource(synths):
    """The ALB controller's service account still uses IRSA (aws_eks_v2.AlbController creates
    it), so the cluster keeps an OIDC provider: the native AWS::IAM::OIDCProvider."""
    for s in synths.values():
        types = [r["Type"] for r in s.template("Cluster")["Resources"].values()]
        assert types.count("AWS::IAM::OIDCProvider") == 1
        assert "Custom::AWSCDKOpenIdConnectProvider" not in types


def test_stacks_keep_their_tags_under_explicit_stack_tags(synths):
    """`explicitStackTags`: tags on the app no longer reach the CloudFormation stacks, so the
    stacks get them explicitly (CloudFormation propagates stack tags to their resources)."""
    for s in synths.values():
        manifest = json.loads((s.outdir / "manifest.json").read_text())
        stacks = {k: a for k, a in manifest["artifacts"].items()
                  if a["type"] == "aws:cloudformation:stack"}
        assert len(stacks) == len(s.templates)
        expected = {"kvcache:environment": s.cfg.name, **s.cfg.tags}
        for name, artifact in stacks.items():
            assert artifact["properties"]["tags"] == expected, name
