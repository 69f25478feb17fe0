"""An environment on a VPC the team already has (`existingVpc`), described in its file: synth
needs no lookup, nothing is created in the VPC, and a private-only VPC (no public subnets) gets
internal load balancers in its node subnets, admitted by their own addresses only."""
from __future__ import annotations

import copy
import dataclasses
import ipaddress
import json
from pathlib import Path

import cdk8s
import pytest

from config import ConfigError, resolve_environment
from config.images import IMAGES
from config.network import (
    LB_SLOTS, check_load_balancer_slots, lb_block, lb_slot, load_balancer_addresses,
)
from k8s.router_front import LOAD_BALANCER_ENV
from k8s.serving import build_charts, load_endpoints, placeholder_facts
from tests.lint import CfnLint
from tests.conftest import DECLARED, ENVIRONMENTS, ROOT, Synth, context_for, resources

VPC = "vpc-0a1b2c3d4e5f60718"
ZONES = ("us-west-2a", "us-west-2b", "us-west-2c")
_LB = "service.beta.kubernetes.io/aws-load-balancer-"
# A corporate layout, not ours: private /20s apart from each other, public /24s elsewhere.
PRIVATE = [{"subnetId": f"subnet-0{i}a1b2c3d4e5f6071", "zone": z,
            "cidr": f"10.20.{64 + 32 * i}.0/20", "routeTableId": f"rtb-0{i}c1b2c3d4e5f6071"}
           for i, z in enumerate(ZONES)]
PUBLIC = [{"subnetId": f"subnet-0{i}b1b2c3d4e5f6071", "zone": z, "cidr": f"10.20.{8 * i}.0/24",
           "routeTableId": "rtb-0a1b2c3d4e5f60718"} for i, z in enumerate(ZONES)]
PRIVATE_IDS = [s["subnetId"] for s in PRIVATE]

# Resources that would be something created in the team's VPC.
NETWORK_KINDS = ("AWS::EC2::VPC", "AWS::EC2::Subnet", "AWS::EC2::NatGateway",
                 "AWS::EC2::VPCEndpoint", "AWS::EC2::FlowLog", "AWS::EC2::RouteTable",
                 "AWS::EC2::Route", "AWS::EC2::InternetGateway", "AWS::EC2::EIP",
                 "AWS::EC2::SubnetRouteTableAssociation")


def _context(**existing) -> dict:
    ctx = copy.deepcopy(context_for(env="dev"))
    raw = ctx["environments"]["dev"]
    del raw["natGateways"]
    raw["existingVpc"] = {"vpcId": VPC, "cidr": "10.20.0.0/16",
                          "privateSubnets": copy.deepcopy(PRIVATE), **existing}
    return ctx


def _docs(charts) -> list[dict]:
    return [d for c in charts for d in c.to_json()]


def _router_view(docs: list[dict]) -> dict[str, tuple[dict, set[str], set[str]]]:
    """endpoint router -> (its Service's annotations and spec, the ipBlocks admitting it, the
    PROXY sources its front trusts)."""
    out = {}
    for svc in (d for d in docs if d["kind"] == "Service"
                and d["spec"].get("type") == "LoadBalancer"):
        name = svc["metadata"]["name"]
        blocks = {p["ipBlock"]["cidr"] for d in docs if d["kind"] == "NetworkPolicy"
                  and d["spec"]["podSelector"].get("matchLabels") == svc["spec"]["selector"]
                  for rule in d["spec"].get("ingress", []) for p in rule["from"]
                  if "ipBlock" in p}
        (deploy,) = [d for d in docs if d["kind"] == "Deployment"
                     and d["metadata"]["name"] == name]
        front = {e["value"] for c in deploy["spec"]["template"]["spec"]["containers"]
                 for e in c.get("env", []) if e["name"] == LOAD_BALANCER_ENV}
        out[name] = (svc, blocks, {c for v in front for c in v.split()})
    return out


def _declared_private_only() -> str | None:
    """A private-only environment the gates already synthesize (a team's, or the sample), so
    that this module adds no synth of its own to the suite."""
    return next((n for n in ENVIRONMENTS if resolve_environment(
        context_for(**DECLARED[n])).network.private_only), None)


@pytest.fixture(scope="module")
def synth(synths, tmp_path_factory) -> Synth:
    """A private-only existing VPC, synthesized offline (no credentials, no lookup): a declared
    one, else one of our own whose endpoint forces the managed L2, so that the Cache stack shows
    where it puts the cache too."""
    import aws_cdk as cdk

    from stacks.app_builder import build

    name = _declared_private_only()
    if name is not None:
        return synths[name]
    ctx = _context()
    cfg = resolve_environment(ctx)
    app = cdk.App(context=ctx, outdir=str(tmp_path_factory.mktemp("existing-vpc")))
    # on an image that may have an L2 (k8s/workers.py l2_refusal: the sample's v0.3.7 may not)
    shipped = IMAGES["vllm-lmcache"]
    specs = tuple(dataclasses.replace(s, l2_enabled=True, l2_backend="redis", l2_forced=True,
                                      image=shipped, worker_image=shipped.source_ref)
                  for s in load_endpoints(cfg, ROOT))
    stacks = build(app, cfg, specs)
    assembly = app.synth()
    return Synth(cfg, stacks, Path(assembly.directory),
                 {s.stack_name: s.template for s in assembly.stacks})


def test_a_private_only_vpc_synthesizes_offline_and_nothing_is_created_in_it(synth):
    cfg, templates = synth.cfg, synth.templates
    private = [s.subnet_id for s in cfg.network.private_subnets]
    assert cfg.network.private_only
    # no lookup asked of the CLI: the file's facts are all synth needs
    assert not json.loads((synth.outdir / "manifest.json").read_text()).get("missing")
    assert f"{cfg.stack_prefix}-Network" not in templates
    for name, t in templates.items():
        for kind in NETWORK_KINDS:
            assert not resources(t, kind), (name, kind)
    (eks,) = resources(synth.template("Cluster"), "AWS::EKS::Cluster").values()
    assert eks["Properties"]["ResourcesVpcConfig"]["SubnetIds"] == private
    for group in resources(synth.template("Cluster"), "AWS::EKS::Nodegroup").values():
        assert group["Properties"]["Subnets"] == private
    groups = [g for t in templates.values()
              for g in resources(t, "AWS::ElastiCache::SubnetGroup").values()]
    assert all(g["Properties"]["SubnetIds"] == private for g in groups)
    for t in templates.values():
        for sg in resources(t, "AWS::EC2::SecurityGroup").values():
            assert sg["Properties"].get("VpcId") in (cfg.network.vpc_id, None), sg


def test_a_private_only_load_balancer_is_internal_and_admitted_by_its_own_addresses(synth):
    """Each router's NLB sits in the node subnets at one fixed address per subnet, inside the
    subnet's top block; the NetworkPolicy and the front admit exactly those /32s, so no pod
    sharing the subnets is admitted; its security group admits the listener's clients."""
    cfg = synth.cfg
    routers = _router_view(_docs(synth.stacks.serving.charts))
    assert routers
    for name, (svc, blocks, trusted) in routers.items():
        notes = svc["metadata"]["annotations"]
        assert notes[f"{_LB}scheme"] == "internal", name
        assert notes[f"{_LB}subnets"].split(",") == [
            s.subnet_id for s in cfg.network.private_subnets]
        addresses = notes[f"{_LB}private-ipv4-addresses"].split(",")
        assert len(addresses) == len(cfg.network.private_subnets)
        for address, subnet in zip(addresses, cfg.network.private_subnets):
            assert ipaddress.ip_address(address) in lb_block(subnet)
            assert ipaddress.ip_address(address) < ipaddress.ip_network(
                subnet.cidr).broadcast_address      # the last address is AWS's
        assert blocks == trusted == {f"{a}/32" for a in addresses}, name
        assert svc["spec"]["loadBalancerSourceRanges"] == list(
            cfg.listener.source_ranges or (cfg.network.vpc_cidr,))


def test_load_balancer_subnets_when_named_keep_the_nlb_apart_from_the_nodes():
    """With `loadBalancerSubnets` the NLB goes there (no fixed address) and their ranges admit
    it, as in the VPC this app creates."""
    cfg = resolve_environment(_context(loadBalancerSubnets=PUBLIC))
    specs = load_endpoints(cfg, ROOT)
    routers = _router_view(_docs(build_charts(cdk8s.App(), cfg, specs,
                                              placeholder_facts(cfg, specs))))
    for svc, blocks, trusted in routers.values():
        notes = svc["metadata"]["annotations"]
        assert notes[f"{_LB}subnets"].split(",") == [s["subnetId"] for s in PUBLIC]
        assert f"{_LB}private-ipv4-addresses" not in notes
        assert blocks == trusted == {s["cidr"] for s in PUBLIC}


def test_gates_pass_on_the_private_only_vpc(synth):
    if _declared_private_only():
        pytest.skip("a declared environment: tests/stacks/test_gates.py gates it")
    report = json.loads((synth.outdir / "validation-report.json").read_text())
    for rep in report["pluginReports"]:
        assert rep["conclusion"] == "success", (rep["pluginName"], rep["violations"][:3])
    paths = sorted(str(p) for p in synth.outdir.glob("*.template.json"))
    assert len(paths) == len(synth.templates)
    proc = CfnLint((synth.cfg.region,), paths).result()
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_slots_depend_on_the_name_alone_and_a_clash_is_one_line():
    cfg = resolve_environment(_context())
    net = cfg.network
    assert load_balancer_addresses(net, "alpha") == load_balancer_addresses(net, "alpha")
    names = [f"ep{i}" for i in range(LB_SLOTS + 1)]      # more names than slots: a clash
    first = {}
    clash = next((first[lb_slot(n)], n) for n in names if first.setdefault(lb_slot(n), n) != n)
    check_load_balancer_slots(cfg.name, net, [clash[0]])
    with pytest.raises(ConfigError) as info:
        check_load_balancer_slots(cfg.name, net, list(clash))
    assert info.value.field == "endpoints" and clash[0] in info.value.allowed


def _bad(edit):
    def apply(ctx):
        edit(ctx["environments"]["dev"])
        return ctx
    return apply


def _private(i, **change):
    def edit(raw):
        raw["existingVpc"]["privateSubnets"][i].update(change)
    return edit


@pytest.mark.parametrize("edit, field, allowed", [
    (_bad(lambda r: r["existingVpc"].update(vpcId="vpc-12")), "existingVpc.vpcId", "a VPC id"),
    (_bad(lambda r: r["existingVpc"].pop("cidr")), "existingVpc.cidr", "the VPC's IPv4 CIDR"),
    (_bad(lambda r: r["existingVpc"].update(privateSubnetIds=PRIVATE_IDS)),
     "existingVpc.privateSubnetIds", "known fields"),
    (_bad(_private(1, cidr="10.30.0.0/20")), "existingVpc.privateSubnets[1].cidr",
     "inside the VPC's 10.20.0.0/16"),
    (_bad(_private(0, cidr="10.20.64.0/25")), "existingVpc.privateSubnets[0].cidr",
     "a /24 or larger"),
    (_bad(_private(2, zone="us-west-2d")), "existingVpc.privateSubnets[2].zone",
     "one of the environment's zones"),
    (_bad(_private(0, routeTableId="rtb-x")), "existingVpc.privateSubnets[0].routeTableId",
     "route table id"),
    (_bad(_private(0, name="a")), "existingVpc.privateSubnets[0].name", "known fields"),
    (_bad(lambda r: r["existingVpc"]["privateSubnets"].pop()), "existingVpc.privateSubnets",
     "each of the environment's zones"),
    (_bad(_private(1, zone="us-west-2a")), "existingVpc.privateSubnets", "one subnet per zone"),
    (_bad(lambda r: r["existingVpc"].update(loadBalancerSubnets=[
        dict(PRIVATE[0], subnetId="subnet-09c1b2c3d4e5f6071", cidr="10.20.64.0/24")])),
     "existingVpc.loadBalancerSubnets", "hold no node"),
    (_bad(lambda r: r.update(publicListener=True)), "publicListener", "private-only"),
    (_bad(lambda r: r.update(natGateways=1)), "natGateways", "existingVpc"),
])
def test_bad_existing_vpc_is_one_clear_line(edit, field, allowed):
    with pytest.raises(ConfigError) as info:
        resolve_environment(edit(_context()))
    assert info.value.field == field and allowed in info.value.allowed, str(info.value)
