"""Every GPU family of config/instances.py becomes a node group EKS would accept, in every
partition that offers it, or is refused in one line where the region does not offer it.

A small app holds only what a node group needs (an imported VPC and cluster, the node role)
and one node group per family, built by the same function as the Cluster stack's; the
environments it comes from go through the real config path (cdk.json context, edited), so a
family the config takes but CDK refuses fails here, as p5.48xlarge once did with a jsii trace.
"""
from __future__ import annotations

import copy
import json
from importlib import resources as package_files

import aws_cdk as cdk
import pytest
from aws_cdk import aws_ec2 as ec2, aws_eks_v2 as eks, aws_iam as iam

from config import resolve_environment
from config.contracts import (
    ACCELERATOR_LABEL, CA_NODE_TEMPLATE_LABEL, NODE_ROLE_GPU, NODE_ROLE_LABEL,
)
from config.instances import GPU_FAMILIES, GPU_SHAPES, accelerator_label
from config.regions import CHINA_REGIONS, instance_types_in, region_facts
from constructs.gpu_cluster import NodeVersions, node_group
from tests.catalogue import refused
from tests.conftest import context_for, resources

# Where each partition's node groups are tried: the first of these regions offering the family
# (cfn-lint's region data, as the config reads it).
PREFERRED = {"aws": ("us-west-2", "us-east-1", "us-east-2", "eu-north-1", "ap-northeast-2"),
             "aws-cn": ("cn-northwest-1", "cn-north-1")}
BASE_ENV = {"aws": "dev", "aws-cn": "china"}


def _types(family: str, region: str) -> list[str]:
    offered = instance_types_in(region)
    return [t for t in GPU_SHAPES if t.split(".", 1)[0] == family and t in offered]


def _region(family: str, partition: str) -> str | None:
    return next((r for r in PREFERRED[partition] if _types(family, r)), None)


CASES = [(f, p, _region(f, p)) for f in sorted(GPU_FAMILIES) for p in PREFERRED]


def _context(partition: str, region: str, groups: list[dict]) -> dict:
    env = BASE_ENV[partition]
    ctx = copy.deepcopy(context_for(env=env))
    raw = ctx["environments"][env]
    raw.pop("chinaVariant", None)
    raw.update(region=region, availabilityZones=[f"{region}{z}" for z in "abc"],
               instanceTypeMap={}, instanceHourlyUsd={})
    raw["nodeGroups"]["gpu"] = groups
    return ctx


@pytest.fixture(scope="module")
def node_groups() -> dict[str, dict]:
    """family/partition -> the synthesized AWS::EKS::Nodegroup's properties."""
    by_region: dict[tuple[str, str], list[str]] = {}
    for family, partition, region in CASES:
        if region:
            by_region.setdefault((partition, region), []).append(family)
    # cdk.json's flags (AL2023 defaults included). CDK's own CloudFormation validation costs
    # seconds per app; the node groups' properties are checked below against the region's
    # schema itself (the same check for a fraction of the time).
    app = cdk.App(context=context_for(), builtin_cloud_formation_validation=False)
    stacks = {}
    for (partition, region), families in by_region.items():
        groups = [{"name": f, "instanceTypes": [_types(f, region)[-1]], "minSize": 0,
                   "maxSize": 2} for f in families]
        cfg = resolve_environment(_context(partition, region, groups))
        assert cfg.facts.partition == partition
        stack = cdk.Stack(app, f"NodeGroups-{region}",
                          env=cdk.Environment(account=cfg.account, region=region))
        vpc = ec2.Vpc.from_vpc_attributes(
            stack, "Vpc", vpc_id="vpc-0123456789abcdef0",
            availability_zones=list(cfg.availability_zones),
            private_subnet_ids=[f"subnet-0{i}23456789abcdef0" for i in range(3)],
            private_subnet_route_table_ids=[f"rtb-0{i}23456789abcdef0" for i in range(3)])
        cluster = eks.Cluster.from_cluster_attributes(stack, "Cluster", cluster_name="kvcache",
                                                      vpc=vpc)
        role = iam.Role(stack, "NodeRole", assumed_by=iam.ServicePrincipal("ec2.amazonaws.com"))
        for group in cfg.gpu_node_groups:
            node_group(stack, stack, cluster, group, node_role=role,
                       subnets=ec2.SubnetSelection(subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS),
                       versions=NodeVersions(cfg.kubernetes_version),
                       labels={NODE_ROLE_LABEL: NODE_ROLE_GPU})
        stacks[stack.stack_name] = (partition, stack)
    assembly = app.synth()
    out = {}
    for name, (partition, stack) in stacks.items():
        messages = [m for m in assembly.get_stack_by_name(name).messages
                    if m.level.value in ("WARNING", "ERROR")]
        assert messages == [], [(m.id, m.entry.data) for m in messages]
        template = assembly.get_stack_by_name(name).template
        region = stack.region
        for props in (r["Properties"] for r in resources(template,
                                                          "AWS::EKS::Nodegroup").values()):
            errors = sorted(e.message for e in _nodegroup_schema(region).iter_errors(
                _resolved(props)))
            assert errors == [], errors   # e.g. an AmiType CloudFormation does not take
            out[f"{props['Labels']['kvcache.io/node-group']}/{partition}"] = props
    return out


def _nodegroup_schema(region: str):
    """The region's AWS::EKS::Nodegroup resource schema (cfn-lint's copy of CloudFormation's)
    as a JSON Schema validator."""
    import jsonschema

    schemas = package_files.files("cfnlint.data.schemas")
    digest = json.loads((schemas / "providers" / f"{region}.json").read_text())[
        "AWS::EKS::Nodegroup"]
    schema = json.loads((schemas / "resources" / f"{digest}.json").read_text())
    return jsonschema.Draft7Validator(schema)


def _resolved(value):
    """Intrinsics (Ref, Fn::GetAtt, ...) as the strings they resolve to at deploy."""
    if isinstance(value, dict):
        if len(value) == 1 and next(iter(value)).startswith(("Ref", "Fn::")):
            return "resolved-at-deploy"
        return {k: _resolved(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_resolved(v) for v in value]
    return value


def _ami_types_cloudformation_takes(region: str) -> set[str]:
    return set(_nodegroup_schema(region).schema["properties"]["AmiType"]["enum"])


@pytest.mark.parametrize("family, partition, region", CASES,
                         ids=[f"{f}-{p}" for f, p, _ in CASES])
def test_each_gpu_family_synthesizes_where_offered_or_is_refused(
        node_groups, capsys, family, partition, region):
    if region is None:
        # Not offered anywhere in the partition: the config refuses it, naming the field.
        for china_region in CHINA_REGIONS if partition == "aws-cn" else ():
            itype = next(t for t in GPU_SHAPES if t.split(".", 1)[0] == family)
            ctx = _context(partition, china_region, [
                {"name": "gpu", "instanceTypes": [itype], "minSize": 0, "maxSize": 1}])
            line = refused(capsys, lambda: resolve_environment(ctx),
                           "nodeGroups.gpu[0].instanceTypes[0]")
            assert itype in line and f"offered in {china_region}" in line
        assert partition == "aws-cn", f"{family} is offered in no global region we try"
        return
    props = node_groups[f"{family}/{partition}"]
    assert props["AmiType"] == "AL2023_x86_64_NVIDIA"
    assert props["AmiType"] in _ami_types_cloudformation_takes(region)
    (itype,) = props["InstanceTypes"]
    assert itype.split(".", 1)[0] == family and itype in instance_types_in(region)
    assert "LaunchTemplate" in props and "DiskSize" not in props
    assert props["Labels"][ACCELERATOR_LABEL] == GPU_FAMILIES[family].accelerator
    assert props["Tags"] == {CA_NODE_TEMPLATE_LABEL + ACCELERATOR_LABEL:
                             GPU_FAMILIES[family].accelerator}
    assert props["Taints"][0]["Key"] == "nvidia.com/gpu"


def test_the_china_regions_offer_what_the_facts_say():
    """cfn-lint's region data, as FACTS recorded it: no g6, g6e or p5 anywhere in China."""
    offered = {r: {f for f in GPU_FAMILIES if _types(f, r)} for r in CHINA_REGIONS}
    assert offered["cn-northwest-1"] == {"g4dn", "g5", "p3", "p4d"}
    assert offered["cn-north-1"] == {"g4dn", "g5", "p3"}
    assert all(region_facts(r).partition == "aws-cn" for r in CHINA_REGIONS)


@pytest.mark.parametrize("env", ["dev", "china", "dev-cn"])
def test_shipped_gpu_node_groups_carry_the_accelerator_label(synths, env):
    """On the node (kubelet labels) and in the node template Cluster Autoscaler builds for a
    group at zero nodes (eks:DescribeNodegroup labels, and the node-template tag)."""
    s = synths[env]
    groups = [g["Properties"] for g in resources(s.template("Cluster"),
                                                 "AWS::EKS::Nodegroup").values()]
    gpu = {g["Labels"]["kvcache.io/node-group"]: g for g in groups
           if g["Labels"].get(NODE_ROLE_LABEL) == NODE_ROLE_GPU}
    assert set(gpu) == {g.name for g in s.cfg.gpu_node_groups}
    for group in s.cfg.gpu_node_groups:
        want = accelerator_label(group.instance_types[0])
        assert want and gpu[group.name]["Labels"][ACCELERATOR_LABEL] == want
        assert gpu[group.name]["Tags"][CA_NODE_TEMPLATE_LABEL + ACCELERATOR_LABEL] == want
    system = [g for g in groups if g["Labels"].get(NODE_ROLE_LABEL) != NODE_ROLE_GPU]
    assert system and all(ACCELERATOR_LABEL not in g["Labels"] for g in system)


def test_a_group_mixing_gpu_models_is_refused(capsys):
    ctx = _context("aws", "us-west-2", [{"name": "mixed", "instanceTypes": [
        "g5.12xlarge", "g6.12xlarge"], "minSize": 0, "maxSize": 1}])
    refused(capsys, lambda: resolve_environment(ctx), "nodeGroups.gpu[0].instanceTypes")


def test_every_gpu_type_has_its_pod_count():
    """The kubelet's reserved memory follows max pods: every GPU type we size has its own."""
    from config.instances import MAX_PODS
    assert set(GPU_SHAPES) <= set(MAX_PODS)
