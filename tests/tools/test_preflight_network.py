"""preflight on an existing VPC, with a botocore Stubber: the private subnets are the file's,
and each reaches every service nodes and pods call (VPC endpoints or a default route), one case
per way it can fail, each naming what is missing."""
from __future__ import annotations

import copy
from types import SimpleNamespace

import boto3
import pytest
from botocore.stub import Stubber

from config import resolve_environment
from tests.conftest import context_for
from tools.cli import Aws
from tools.preflight import FAIL, NODE_SERVICES, PASS, Preflight, Row

REGION = "cn-northwest-1"
VPC = "vpc-0c4e1a2b3d5f60789"
ZONES = [f"{REGION}{z}" for z in "abc"]
SUBNETS = [{"subnetId": f"subnet-0{i}11c0ffee000000{i}", "zone": z,
            "cidr": f"10.48.{32 + 64 * i}.0/20", "routeTableId": f"rtb-0{i}11c0ffee000000{i}"}
           for i, z in enumerate(ZONES)]
# China names some endpoint services cn.com.amazonaws.REGION.NAME, others com.amazonaws...
PREFIX = {"s3": "com.amazonaws"}


def _cfg():
    ctx = copy.deepcopy(context_for(env="dev", china="true"))
    raw = ctx["environments"]["dev"]
    raw.pop("natGateways", None)
    raw["existingVpc"] = {"vpcId": VPC, "cidr": "10.48.0.0/16", "privateSubnets": SUBNETS}
    return resolve_environment(ctx)


CFG = _cfg()
EC2 = boto3.client("ec2", region_name=REGION, aws_access_key_id="x",
                   aws_secret_access_key="y")


def subnets(**change) -> dict:
    return {"Subnets": [{"SubnetId": s["subnetId"], "VpcId": VPC, "AvailabilityZone": s["zone"],
                         "CidrBlock": s["cidr"], **change.get(s["subnetId"], {})}
                        for s in SUBNETS]}


def tables(default: dict | None = None, associate: bool = True) -> dict:
    """One route table per subnet (the file's), `default` its 0.0.0.0/0 route if any; without
    `associate` the subnets fall back to the main table, which is none of the file's."""
    out = []
    for s in SUBNETS:
        routes = [{"DestinationCidrBlock": "10.48.0.0/16", "GatewayId": "local",
                   "State": "active"}]
        if default:
            routes.append({"DestinationCidrBlock": "0.0.0.0/0", **default})
        out.append({"RouteTableId": s["routeTableId"], "Routes": routes, "Associations": [
            {"SubnetId": s["subnetId"], "Main": False}] if associate else []})
    out.append({"RouteTableId": "rtb-0fffffffffffffff0", "Routes": [],
                "Associations": [{"Main": True}]})
    return {"RouteTables": out}


def endpoint(name: str, **over) -> dict:
    kind = "Gateway" if name == "s3" else "Interface"
    e = {"VpcEndpointId": f"vpce-0{abs(hash(name)) % 10**16:016d}", "VpcId": VPC,
         "ServiceName": f"{PREFIX.get(name, 'cn.com.amazonaws')}.{REGION}.{name}",
         "VpcEndpointType": kind, "State": "available"}
    if kind == "Gateway":
        e["RouteTableIds"] = [s["routeTableId"] for s in SUBNETS]
    else:
        e["PrivateDnsEnabled"] = True
    e.update(over)
    return e


def run(subnet_answer: dict, table_answer: dict, endpoints: list[dict]):
    vpc = [{"Name": "vpc-id", "Values": [VPC]}]
    calls = [("describe_subnets", subnet_answer, {"Filters": [
                 {"Name": "subnet-id", "Values": [s["subnetId"] for s in SUBNETS]}]}),
             ("describe_route_tables", table_answer, {"Filters": vpc}),
             ("describe_vpc_endpoints", {"VpcEndpoints": endpoints}, {"Filters": vpc})]
    with Stubber(EC2) as stub:     # one client for the module: building one costs ~0.1 s
        for method, answer, params in calls:
            stub.add_response(method, answer, params)
        aws = Aws(CFG, factory=lambda service: EC2 if service == "ec2" else pytest.fail(
            f"asked {service}"))
        rows = Preflight(aws, (), images=()).network_reach()
        stub.assert_no_pending_responses()
    return rows


ALL = [endpoint(n) for n in NODE_SERVICES]


@pytest.mark.parametrize("default", [
    {"NatGatewayId": "nat-0a11c0ffee0000001", "State": "active"},
    {"TransitGatewayId": "tgw-0a11c0ffee0000001", "State": "active"},
])
def test_a_default_route_through_a_nat_or_transit_gateway_reaches_everything(default):
    rows = run(subnets(), tables(default), [])
    assert [r.status for r in rows] == [PASS] * len(SUBNETS)
    assert all(next(iter(default.values())) in r.detail for r in rows)


def test_endpoints_for_every_service_reach_everything():
    rows = run(subnets(), tables(), ALL)
    assert [r.status for r in rows] == [PASS] * len(SUBNETS)


@pytest.mark.parametrize("service", list(NODE_SERVICES))
def test_each_missing_endpoint_is_named_on_each_subnet(service):
    rows = run(subnets(), tables(), [e for e in ALL if not e["ServiceName"].endswith(
        f".{service}")])
    assert [r.status for r in rows] == [FAIL] * len(SUBNETS)
    for r in rows:
        named = [n for n in NODE_SERVICES if f"{n} ({NODE_SERVICES[n]})" in r.detail]
        assert named == [service], r.detail


@pytest.mark.parametrize("case, edit, missing", [
    ("interface endpoint without private DNS", lambda e: e.update(PrivateDnsEnabled=False)
     if e["ServiceName"].endswith(".sts") else None, "sts"),
    ("endpoint not available", lambda e: e.update(State="pendingAcceptance")
     if e["ServiceName"].endswith(".ecr.dkr") else None, "ecr.dkr"),
    ("S3 gateway endpoint on other route tables", lambda e: e.update(
        RouteTableIds=["rtb-0fffffffffffffff0"]) if e["VpcEndpointType"] == "Gateway" else None,
     "s3"),
])
def test_an_endpoint_that_does_not_serve_the_subnets_counts_as_missing(case, edit, missing):
    endpoints = copy.deepcopy(ALL)
    for e in endpoints:
        edit(e)
    rows = run(subnets(), tables(), endpoints)
    assert all(r.status == FAIL and f"{missing} (" in r.detail for r in rows), case
    if missing == "s3":   # says which route table wants it
        assert all(s["routeTableId"] in r.detail for r, s in zip(rows, SUBNETS))


def test_a_blackhole_default_route_is_no_route():
    rows = run(subnets(), tables({"NatGatewayId": "nat-0a11c0ffee0000001",
                                  "State": "blackhole"}), [])
    assert [r.status for r in rows] == [FAIL] * len(SUBNETS)
    assert all(f"{n} ({NODE_SERVICES[n]})" in r.detail for r in rows for n in NODE_SERVICES)


def test_subnets_and_route_tables_unlike_the_file_are_named():
    first, second = SUBNETS[0]["subnetId"], SUBNETS[1]["subnetId"]
    rows = run(subnets(**{first: {"CidrBlock": "10.48.0.0/20"},
                          second: {"VpcId": "vpc-0fffffffffffffff0"}}),
               tables({"NatGatewayId": "nat-0a11c0ffee0000001", "State": "active"},
                      associate=False), [])
    failed = [r for r in rows if r.status == FAIL]
    assert any(first in r.check and "10.48.0.0/20" in r.detail and "(cidr)" in r.detail
               for r in failed)
    assert any(second in r.check and "(existingVpc.vpcId)" in r.detail for r in failed)
    # unassociated subnets use the main table: not the file's routeTableId
    assert sum("(routeTableId)" in r.detail for r in failed) == len(SUBNETS)


def test_a_vpc_this_app_creates_is_not_asked_about():
    ctx = copy.deepcopy(context_for(env="dev", china="true"))
    aws = Aws(resolve_environment(ctx), factory=lambda s: pytest.fail(f"called {s}"))
    assert Preflight(aws, (), images=()).network_reach() == []


def _addresses(held: dict[str, dict]) -> list[Row]:
    from config.network import load_balancer_addresses

    wanted = sorted(load_balancer_addresses(CFG.network, "alpha"))
    answer = {"NetworkInterfaces": [{"NetworkInterfaceId": f"eni-0{i:016x}", **eni,
                                     "PrivateIpAddresses": [{"PrivateIpAddress": a}]}
                                    for i, (a, eni) in enumerate(held.items())]}
    with Stubber(EC2) as stub:
        stub.add_response("describe_network_interfaces", answer, {"Filters": [
            {"Name": "vpc-id", "Values": [VPC]},
            {"Name": "addresses.private-ip-address", "Values": wanted}]})
        aws = Aws(CFG, factory=lambda service: EC2)
        rows = Preflight(aws, (SimpleNamespace(name="alpha"),),
                         images=()).load_balancer_addresses()
        stub.assert_no_pending_responses()
    return rows


def test_the_load_balancer_addresses_free_or_its_own_pass():
    from config.network import load_balancer_addresses

    own = {a: {"InterfaceType": "network_load_balancer", "Description": "ELB net/k8s-x/1"}
           for a in load_balancer_addresses(CFG.network, "alpha")[:1]}
    assert [r.status for r in _addresses({})] == [PASS]
    assert [r.status for r in _addresses(own)] == [PASS]


def test_a_load_balancer_address_a_pod_holds_is_named():
    from config.network import load_balancer_addresses

    address = load_balancer_addresses(CFG.network, "alpha")[1]
    (row,) = _addresses({address: {"InterfaceType": "interface",
                                   "Description": "aws-K8S-i-0123456789abcdef0"}})
    assert row.status == FAIL and row.check == "load balancer: alpha-router"
    assert address in row.detail and "aws-K8S-i-0123456789abcdef0" in row.detail


def test_managed_metrics_add_amp_to_what_the_subnets_must_reach():
    from tools.preflight import node_services

    ctx = context_for(env="dev")
    ctx["environments"]["dev"].update(observability="managed", grafana="none")
    managed = resolve_environment(ctx)
    assert "aps-workspaces" in node_services(managed)
    assert "aps-workspaces" not in node_services(CFG)
