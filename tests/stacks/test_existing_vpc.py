"""An environment on a VPC the team already has (`existingVpc`): its subnets come from CDK's
lookup cache, nothing is created in it, and the load balancer's ranges follow its subnets."""
from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path

import pytest

from config import ConfigError, resolve_environment
from config.images import IMAGES
from config.network import vpc_lookup_key
from k8s.serving import load_endpoints
from tests.lint import CfnLint
from tests.conftest import ROOT, context_for, dumps, resources

VPC = "vpc-0a1b2c3d4e5f60718"
ZONES = ("us-west-2a", "us-west-2b", "us-west-2c")
PRIVATE = [f"subnet-0{i}a1b2c3d4e5f6071" for i in range(3)]
PUBLIC = [f"subnet-0{i}b1b2c3d4e5f6071" for i in range(3)]
SPARE = "subnet-09c1b2c3d4e5f6071"      # a second private subnet in us-west-2a
# A corporate layout: not ours (non-contiguous public /24s, private /20s, one spare subnet).
ANSWER = {
    "vpcId": VPC, "vpcCidrBlock": "10.20.0.0/16", "ownerAccountId": "111111111111",
    "availabilityZones": [],
    "subnetGroups": [
        {"name": "Public", "type": "Public", "subnets": [
            {"subnetId": s, "cidr": f"10.20.{8 * i}.0/24", "availabilityZone": z,
             "routeTableId": "rtb-0a1b2c3d4e5f60718"}
            for i, (s, z) in enumerate(zip(PUBLIC, ZONES))]},
        {"name": "Private", "type": "Private", "subnets": [
            {"subnetId": s, "cidr": f"10.20.{64 + 16 * i}.0/20", "availabilityZone": z,
             "routeTableId": f"rtb-0{i}c1b2c3d4e5f6071"}
            for i, (s, z) in enumerate(zip(PRIVATE, ZONES))] + [
            {"subnetId": SPARE, "cidr": "10.20.128.0/20", "availabilityZone": ZONES[0],
             "routeTableId": "rtb-09c1b2c3d4e5f6071"}]},
    ],
}


def _context(answer=ANSWER, **existing) -> dict:
    ctx = copy.deepcopy(context_for(env="dev"))
    raw = ctx["environments"]["dev"]
    del raw["natGateways"]
    raw["existingVpc"] = {"vpcId": VPC, **existing}
    if answer is not None:
        ctx[vpc_lookup_key(raw["account"], raw["region"], VPC)] = answer
    return ctx


@pytest.fixture(scope="module")
def synth(tmp_path_factory):
    import aws_cdk as cdk

    from stacks.app_builder import build

    ctx = _context(privateSubnetIds=PRIVATE)
    cfg = resolve_environment(ctx)
    app = cdk.App(context=ctx, outdir=str(tmp_path_factory.mktemp("existing-vpc")))
    # an endpoint that forces the managed L2, so that the Cache stack exists and shows where
    # it puts the cache (the sample's endpoint asks for L1 only), on an image that may have an
    # L2 (k8s/workers.py l2_refusal: the sample's v0.3.7 may not)
    shipped = IMAGES["vllm-lmcache"]
    specs = tuple(dataclasses.replace(s, l2_enabled=True, l2_backend="redis", l2_forced=True,
                                      image=shipped, worker_image=shipped.source_ref)
                  for s in load_endpoints(cfg, ROOT))
    stacks = build(app, cfg, specs)
    assembly = app.synth()
    return cfg, stacks, Path(assembly.directory), {s.stack_name: s.template
                                                   for s in assembly.stacks}


def test_nothing_is_created_in_the_existing_vpc(synth):
    cfg, _, _, templates = synth
    assert "KvCache-dev-Network" not in templates
    for name, t in templates.items():
        for kind in ("AWS::EC2::VPC", "AWS::EC2::Subnet", "AWS::EC2::NatGateway",
                     "AWS::EC2::VPCEndpoint", "AWS::EC2::FlowLog"):
            assert not resources(t, kind), (name, kind)
    cluster = templates["KvCache-dev-Cluster"]
    (eks,) = resources(cluster, "AWS::EKS::Cluster").values()
    assert eks["Properties"]["ResourcesVpcConfig"]["SubnetIds"] == PRIVATE
    for group in resources(cluster, "AWS::EKS::Nodegroup").values():
        assert group["Properties"]["Subnets"] == PRIVATE
    (subnets,) = resources(templates["KvCache-dev-Cache"],
                           "AWS::ElastiCache::SubnetGroup").values()
    assert subnets["Properties"]["SubnetIds"] == PRIVATE
    assert VPC in dumps(resources(templates["KvCache-dev-Cache"], "AWS::EC2::SecurityGroup"))


def test_the_load_balancer_goes_to_its_subnets_and_the_policy_admits_their_ranges(synth):
    cfg, stacks, _, templates = synth
    assert cfg.network.load_balancer_cidrs == ("10.20.0.0/24", "10.20.8.0/24", "10.20.16.0/24")
    assert ",".join(PUBLIC) in dumps(templates["KvCache-dev-Serving"])
    blocks = {p["ipBlock"]["cidr"] for c in stacks.serving.charts for d in c.to_json()
              if d["kind"] == "NetworkPolicy" for rule in d["spec"].get("ingress", [])
              for p in rule["from"] if "ipBlock" in p}
    assert blocks == set(cfg.network.load_balancer_cidrs)


def test_gates_pass_on_the_existing_vpc(synth):
    _, _, outdir, templates = synth
    report = json.loads((outdir / "validation-report.json").read_text())
    for rep in report["pluginReports"]:
        assert rep["conclusion"] == "success", (rep["pluginName"], rep["violations"][:3])
    paths = sorted(str(p) for p in outdir.glob("*.template.json"))
    assert len(paths) == len(templates)
    proc = CfnLint(("us-west-2",), paths).result()
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_our_lookup_key_is_the_one_cdk_asks_the_cli_for(tmp_path, capsys):
    """With the VPC not yet looked up, app.py (run by the CLI) asks for exactly the lookup
    config/network.py reads back: CDK's key format is not an API, this pins it."""
    import aws_cdk as cdk

    from config.network import VpcLookupNeeded
    from stacks.lookups import request_vpc_lookup

    ctx = _context(answer=None)
    with pytest.raises(VpcLookupNeeded) as info:
        resolve_environment(ctx)
    app = cdk.App(context=ctx, outdir=str(tmp_path))
    request_vpc_lookup(app, info.value)
    app.synth()
    missing = json.loads((tmp_path / "manifest.json").read_text())["missing"]
    assert [m["key"] for m in missing] == [vpc_lookup_key("111111111111", "us-west-2", VPC)]
    # without the CLI nobody can look it up: the error line says what to run
    assert "cdk.context.json" in info.value.allowed and "account 111111111111" in str(
        info.value)


@pytest.mark.parametrize("existing, answer_edit, field, allowed", [
    ({"privateSubnetIds": ["subnet-0fffffffffffffff0"]}, None, "existingVpc.privateSubnetIds",
     "a subnet of vpc-"),
    ({}, None, "existingVpc.privateSubnetIds", "one subnet per zone"),   # SPARE in 2a too
    ({"privateSubnetIds": PRIVATE, "loadBalancerSubnetIds": PRIVATE[:1]}, None,
     "existingVpc.loadBalancerSubnetIds", "where no node runs"),
    ({"privateSubnetIds": PRIVATE[:2]}, None, "existingVpc.privateSubnetIds",
     "each of the environment's zones"),
    ({"privateSubnetIds": PRIVATE}, "no public", "existingVpc.loadBalancerSubnetIds",
     "has no public subnet"),
    ({"vpcId": "vpc-12"}, None, "existingVpc.vpcId", "a VPC id"),
    ({"subnets": []}, None, "existingVpc.subnets", "known fields"),
])
def test_bad_existing_vpc_is_one_clear_line(existing, answer_edit, field, allowed):
    answer = copy.deepcopy(ANSWER)
    if answer_edit == "no public":
        answer["subnetGroups"] = answer["subnetGroups"][1:]
    with pytest.raises(ConfigError) as info:
        resolve_environment(_context(answer, **existing))
    assert info.value.field == field and allowed in info.value.allowed, str(info.value)


def test_an_existing_vpc_owns_its_range_and_nat():
    ctx = _context(privateSubnetIds=PRIVATE)
    ctx["environments"]["dev"]["vpcCidr"] = "10.30.0.0/16"
    with pytest.raises(ConfigError) as info:
        resolve_environment(ctx)
    assert info.value.field == "vpcCidr" and "existingVpc" in info.value.allowed
