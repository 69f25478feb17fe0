"""EFA node groups (disaggregated prefill/decode): a GPU node group with `efa: true` gets a
launch template carrying the type's EFA interfaces (config/instances.py EFA, which preflight
holds to EC2's answer), a cluster placement group, one subnet (one zone) and a self-referencing
security group beside the cluster's; types without GPUDirect RDMA over EFA in the region are
refused in one line. A small app, as tests/constructs/test_gpu_nodegroups.py builds one."""
from __future__ import annotations

import json
from importlib import resources as package_files

import aws_cdk as cdk
import jsonschema
import pytest
from aws_cdk import aws_ec2 as ec2, aws_eks_v2 as eks, aws_iam as iam

from config import ConfigError, resolve_environment
from config.contracts import (
    CA_NODE_TEMPLATE_RESOURCE, EFA_RESOURCE, NODE_ROLE_GPU, NODE_ROLE_LABEL,
)
from config.instances import EFA
from constructs.gpu_cluster import EfaPlacement, NodeVersions, node_group
from tests.conftest import context_for, resources
from tools.preflight import FAIL, PASS, efa_row
from tests.constructs.test_gpu_nodegroups import _context, _resolved

CASES = [("aws", "us-west-2", "p5.48xlarge"), ("aws-cn", "cn-northwest-1", "p4d.24xlarge")]


def _group(itype: str, **extra) -> dict:
    return {"name": "efa", "instanceTypes": [itype], "minSize": 0, "maxSize": 2, "efa": True,
            **extra}


@pytest.fixture(scope="module")
def templates() -> dict[str, dict]:
    app = cdk.App(context=context_for(), builtin_cloud_formation_validation=False)
    stacks = {}
    for partition, region, itype in CASES:
        cfg = resolve_environment(_context(partition, region, [_group(itype)]))
        stack = cdk.Stack(app, f"Efa-{region}",
                          env=cdk.Environment(account=cfg.account, region=region))
        vpc = ec2.Vpc.from_vpc_attributes(
            stack, "Vpc", vpc_id="vpc-0123456789abcdef0",
            availability_zones=list(cfg.availability_zones),
            private_subnet_ids=[f"subnet-0{i}23456789abcdef0" for i in range(3)],
            private_subnet_route_table_ids=[f"rtb-0{i}23456789abcdef0" for i in range(3)])
        cluster = eks.Cluster.from_cluster_attributes(
            stack, "Cluster", cluster_name="kvcache", vpc=vpc,
            cluster_security_group_id="sg-0123456789abcdef0")
        role = iam.Role(stack, "NodeRole", assumed_by=iam.ServicePrincipal("ec2.amazonaws.com"))
        (group,) = cfg.gpu_node_groups
        efa = EfaPlacement.for_group(stack, group, cluster, vpc, cfg.facts.china)
        node_group(stack, stack, cluster, group, node_role=role, subnets=efa.subnets,
                   versions=NodeVersions(cfg.kubernetes_version),
                   labels={NODE_ROLE_LABEL: NODE_ROLE_GPU}, efa=efa)
        stacks[stack.stack_name] = (region, itype)
    assembly = app.synth()
    return {itype: (region, assembly.get_stack_by_name(name).template)
            for name, (region, itype) in stacks.items()}


def _schema(region: str, kind: str):
    schemas = package_files.files("cfnlint.data.schemas")
    digest = json.loads((schemas / "providers" / f"{region}.json").read_text())[kind]
    return jsonschema.Draft7Validator(json.loads(
        (schemas / "resources" / f"{digest}.json").read_text()))


@pytest.mark.parametrize("partition,region,itype", CASES)
def test_an_efa_group_carries_the_types_interfaces_in_one_zone_and_placement(
        templates, partition, region, itype):
    region, t = templates[itype]
    (lt,) = resources(t, "AWS::EC2::LaunchTemplate").values()
    data = lt["Properties"]["LaunchTemplateData"]
    nics = data["NetworkInterfaces"]
    assert [n["NetworkCardIndex"] for n in nics] == list(range(EFA[itype].interfaces))
    assert nics[0]["DeviceIndex"] == 0 and nics[0]["InterfaceType"] == "efa"
    assert {n["InterfaceType"] for n in nics[1:]} <= {"efa", "efa-only"}
    if partition == "aws-cn":   # efa-only is not confirmed in China
        assert {n["InterfaceType"] for n in nics} == {"efa"}
    (placement_id, placement), = resources(t, "AWS::EC2::PlacementGroup").items()
    assert placement["Properties"]["Strategy"] == "cluster"
    assert data["Placement"]["GroupName"] == {"Ref": placement_id}
    (ng,) = resources(t, "AWS::EKS::Nodegroup").values()
    assert len(ng["Properties"]["Subnets"]) == 1                      # one zone
    (sg_id, _), = resources(t, "AWS::EC2::SecurityGroup").items()
    self_ref = {"Fn::GetAtt": [sg_id, "GroupId"]}
    ingress = [r["Properties"] for r in resources(t, "AWS::EC2::SecurityGroupIngress").values()]
    egress = [r["Properties"] for r in resources(t, "AWS::EC2::SecurityGroupEgress").values()]
    assert any(r["IpProtocol"] == "-1" and r["SourceSecurityGroupId"] == self_ref
               for r in ingress)
    assert any(r["IpProtocol"] == "-1" and r["DestinationSecurityGroupId"] == self_ref
               for r in egress)
    for n in nics:   # the cluster's security group too: the template names the interfaces'
        assert "sg-0123456789abcdef0" in n["Groups"] and self_ref in n["Groups"]
    # Cluster Autoscaler's template node for the group at zero nodes (CA 1.35 aws_manager.go
    # reads `node-template/resources/<name>` from the node group's tags): as many EFA devices
    # as the plugin will advertise, one per interface the template attaches
    offered = {k.split(CA_NODE_TEMPLATE_RESOURCE, 1)[1]: v
               for k, v in ng["Properties"]["Tags"].items() if CA_NODE_TEMPLATE_RESOURCE in k}
    assert offered == {EFA_RESOURCE: str(len(nics))}
    for kind, props in (("AWS::EC2::LaunchTemplate", lt["Properties"]),
                        ("AWS::EKS::Nodegroup", ng["Properties"])):
        assert sorted(e.message for e in _schema(region, kind).iter_errors(
            _resolved(props))) == []


@pytest.mark.parametrize("partition,region,itype", [
    ("aws-cn", "cn-northwest-1", "g5.48xlarge"),      # EFA without GPUDirect RDMA
    ("aws-cn", "cn-north-1", "p4d.24xlarge"),         # China's GPU-direct EFA is cn-northwest-1
])
def test_efa_where_the_type_has_no_gpu_direct_efa_is_one_line(partition, region, itype):
    with pytest.raises(ConfigError) as err:
        resolve_environment(_context(partition, region, [_group(itype)]))
    said = str(err.value)
    assert "nodeGroups.gpu[0].instanceTypes[0]" in said and "\n" not in said


def test_preflight_holds_the_instance_table_to_ec2():
    p5 = EFA["p5.48xlarge"]
    ok = efa_row("p5.48xlarge", {"EfaSupported": True,
                                 "EfaInfo": {"MaximumEfaInterfaces": p5.interfaces}}, "us-west-2")
    assert ok.status == PASS
    wrong = efa_row("p5.48xlarge", {"EfaSupported": True,
                                    "EfaInfo": {"MaximumEfaInterfaces": p5.interfaces - 1}},
                    "us-west-2")
    assert wrong.status == FAIL and "config/instances.py" in wrong.detail
    assert efa_row("p4d.24xlarge", {"EfaSupported": False}, "cn-north-1").status == FAIL
