"""The NetworkPolicies we render, evaluated against the flows the charts declare: every declared
flow is allowed, nothing else reaches a pod in a namespace we own (default deny).

The universe: every pod the serving and monitoring charts render (two endpoints, so one
endpoint's router must not reach the other's workers), the kube-prometheus-stack and KEDA pods
(k8s/flows.py HELM_PODS), an intruder pod in each namespace, an address inside the VPC (the
load balancer, in the public subnets), one in a private subnet, and one on the internet. Pods
take private-subnet addresses (VPC CNI), as in the cluster. In a private-only existing VPC the
load balancers are each router's own fixed address in the node subnets, and a pod sits in the
block beside them.
"""
from __future__ import annotations

import copy
import ipaddress
import itertools

import cdk8s
import kubernetes_validate
import pytest

from config.contracts import MONITORING_NAMESPACE, SERVING_NAMESPACE
from config.endpoint_spec import parse_endpoint
from config import resolve_environment
from config.network import load_balancer_addresses
from k8s.flows import HELM_PODS, Peer, monitoring_stack_flows
from k8s.monitoring import build_monitoring_charts
from k8s.serving import build_charts, placeholder_facts
from tests.k8s.netpol import Endpoint, allowed
from tests.conftest import context_for
from tests.k8s.test_charts import SEED, _env

OWNED = (SERVING_NAMESPACE, MONITORING_NAMESPACE)
CASES = [("dev", "prefixaware", "redis"), ("dev", "kvaware", "valkey"),
         ("china", "session", "lmcache-server"), ("china", "roundrobin", None),
         # a team's own range: the load balancer's ipBlock follows it
         ("dev@172.24.0.0/18", "prefixaware", None),
         # a private-only existing VPC: the NLBs share the node subnets, admitted by address
         ("china@private-only", "kvaware", "valkey"),
         # alpha joins the team's Gateway (k8s/gateway.py), beta does not
         ("dev+gateway", "prefixaware", "redis")]
# the dev sample's system nodes (m6i.xlarge) hold 2 of upstream's 4 picker CPUs
GATEWAY = {"gateway": {"name": "inference", "namespace": "istio-ingress"},
           "implementation": "istio", "picker": {"cpu": 2}}
# A private-only existing VPC in the China sample's zones (config/network.py).
PRIVATE_ONLY = {"vpcId": "vpc-0c4e1a2b3d5f60789", "cidr": "10.48.0.0/16", "privateSubnets": [
    {"subnetId": f"subnet-0{i}11c0ffee000000{i}", "zone": f"cn-northwest-1{z}",
     "cidr": f"10.48.{32 + 64 * i}.0/20", "routeTableId": f"rtb-0{i}11c0ffee000000{i}"}
    for i, z in enumerate("abc")]}


def _specs(cfg, strategy, backend):
    specs = []
    for name in ("alpha", "beta"):
        raw = copy.deepcopy(SEED)
        if cfg.inference_gateway and name == "alpha":
            raw["spec"]["inferenceGateway"] = {"enabled": True}
        raw["metadata"]["name"] = name
        raw["spec"]["intelligentRoutingSpec"]["routingStrategy"] = strategy
        if backend is None:
            raw["spec"]["kvCacheSpec"] = {"enableL1Cache": True, "enableL2Cache": False}
        else:
            raw["spec"]["kvCacheSpec"]["l2CacheSpec"]["l2CacheBackend"] = backend
        specs.append(parse_endpoint(cfg.name, f"endpoints/{name}.yaml", raw))
    return tuple(specs)


def private_subnet(cfg) -> ipaddress.IPv4Network:
    """The first private subnet of the environment's layout (tests/stacks check the layout)."""
    if cfg.network.existing:
        return ipaddress.ip_network(cfg.network.private_subnets[0].cidr)
    net = ipaddress.ip_network(cfg.network.vpc_cidr)
    return list(net.subnets(new_prefix=cfg.network.private_subnet_mask))[1]


def _universe(cfg, docs) -> list[Endpoint]:
    hosts = private_subnet(cfg).hosts()   # pods take node-subnet addresses
    next(hosts)
    if cfg.network.private_only:   # alpha's NLB, at its fixed address in the node subnet
        nlb = load_balancer_addresses(cfg.network, "alpha")[0]
    else:
        nlb = next(ipaddress.ip_network(cfg.network.load_balancer_cidrs[0]).hosts())
    out = [Endpoint("nlb-node", str(nlb)),                        # the NLB's ENI
           Endpoint("vpc-node", str(next(hosts))),                # a node or VM in the VPC
           Endpoint("internet", "203.0.113.5")]
    if cfg.network.private_only:   # beta's own NLB; a pod beside alpha's NLB, in its block
        out.append(Endpoint("nlb-node-beta", load_balancer_addresses(cfg.network, "beta")[0]))
        block = ipaddress.ip_network(cfg.network.load_balancer_cidrs[0])
        out.append(Endpoint("neighbour", str(next(
            a for a in block.hosts() if str(a) != nlb)), "default", {"app": "intruder"}))
    for d in docs:
        if d["kind"] in ("Deployment", "StatefulSet", "DaemonSet"):
            pod = d["spec"]["template"]
            ports = {p.get("name", str(p["containerPort"])): p["containerPort"]
                     for c in pod["spec"]["containers"] for p in c.get("ports", [])}
            out.append(Endpoint(d["metadata"]["name"], str(next(hosts)),
                                d["metadata"]["namespace"], pod["metadata"]["labels"], ports))
    for name, (peer, ports) in HELM_PODS.items():
        out.append(Endpoint(name, str(next(hosts)), peer.namespace, peer.labels,
                            {str(p): p for p in ports}))
    g = cfg.inference_gateway
    for ns in (*OWNED, "default", *([g.proxy_namespace] if g else [])):
        out.append(Endpoint(f"intruder-{ns}", str(next(hosts)), ns, {"app": "intruder"}))
    if g:   # the team's gateway proxy (Istio's, say), labelled as GEP-1762 has it
        out.append(Endpoint("gateway-proxy", str(next(hosts)), g.proxy_namespace,
                            dict(g.proxy_labels), {"http": 80}))
    return out


def _matches(peer: Peer, e: Endpoint) -> bool:
    if peer.cidrs:
        return any(ipaddress.ip_address(e.ip) in ipaddress.ip_network(c) for c in peer.cidrs)
    return e.namespace == peer.namespace and all(
        e.labels.get(k) == v for k, v in peer.labels.items())


@pytest.fixture(scope="module", params=CASES, ids=lambda c: "-".join(map(str, c)))
def case(request):
    env, strategy, backend = request.param
    env, _, vpc = env.partition("@")
    env, gateway, _ = env.partition("+gateway")
    if gateway:
        cfg = _env(env, inferenceGateway=GATEWAY)
    elif vpc == "private-only":
        ctx = context_for(env=env)
        raw = ctx["environments"][env]
        raw.pop("natGateways", None)
        raw["existingVpc"] = PRIVATE_ONLY
        cfg = resolve_environment(ctx)
    else:
        cfg = _env(env, **({"vpcCidr": vpc} if vpc else {}))
    specs = _specs(cfg, strategy, backend)
    serving = build_charts(cdk8s.App(), cfg, specs, placeholder_facts(cfg, specs))
    monitoring = build_monitoring_charts(cdk8s.App(), cfg, specs)
    flows = tuple(f for c in [*serving, *monitoring.all()] for f in getattr(c, "flows", ()))
    flows += monitoring_stack_flows(cfg.observability == "self-hosted")
    docs = [d for c in [*serving, *monitoring.all()] for d in c.to_json()]
    universe = _universe(cfg, docs)
    if cfg.observability != "self-hosted":   # agent mode: no Alertmanager, no Grafana
        universe = [e for e in universe if e.name not in ("alertmanager", "grafana")]
    return cfg, docs, flows, universe


def test_policies_pass_strict_schema(case):
    cfg, docs, _, _ = case
    policies = [d for d in docs if d["kind"] == "NetworkPolicy"]
    assert {p["metadata"]["namespace"] for p in policies} == set(OWNED)
    for doc in policies:
        kubernetes_validate.validate(doc, cfg.kubernetes_version + ".0", strict=True)
    for ns in OWNED:   # default deny in every namespace we own
        assert any(p["metadata"]["namespace"] == ns and p["spec"]["podSelector"] == {}
                   and p["spec"]["policyTypes"] == ["Ingress"] and not p["spec"].get("ingress")
                   for p in policies)


def test_every_declared_flow_lands_on_a_listening_port(case):
    _, _, flows, universe = case
    for f in flows:
        sources = [e for e in universe if _matches(f.source, e)]
        targets = [e for e in universe if e.namespace and _matches(f.destination, e)]
        assert sources and targets, f
        assert all(f.port in t.ports.values() for t in targets), f


def test_policies_allow_exactly_the_declared_flows(case):
    _, docs, flows, universe = case
    policies = [d for d in docs if d["kind"] == "NetworkPolicy"]
    declared = {(s.name, d.name, f.port) for f in flows
                for s in universe if _matches(f.source, s)
                for d in universe if d.namespace and _matches(f.destination, d)}
    ports = {f.port for f in flows} | {p for e in universe for p in e.ports.values()}
    owned = [e for e in universe if e.namespace in OWNED]
    actual = {(s.name, d.name, port) for s, d in itertools.product(universe, owned)
              for port in ports if allowed(policies, s, d, port)}
    assert not declared - actual, f"declared but blocked: {sorted(declared - actual)}"
    assert not actual - declared, f"allowed but not declared: {sorted(actual - declared)}"
    # and the shape of it: one endpoint's router never reaches the other's workers
    assert ("alpha-router", "beta-workers", 8000) not in actual
    assert ("intruder-default", "alpha-workers", 8000) not in actual
    assert ("internet", "alpha-router", 8000) not in actual
    assert ("nlb-node", "alpha-router", 8000) in actual
    assert ("neighbour", "alpha-router", 8000) not in actual   # private-only: by address
    assert ("nlb-node-beta", "alpha-router", 8000) not in actual  # one router, one NLB
    assert ("vpc-node", "alpha-router", 8000) not in actual     # pods and nodes: no
    assert ("intruder-default", "alpha-router", 8000) not in actual
    if any(e.name == "gateway-proxy" for e in universe):   # the gateway path, alpha only
        assert ("gateway-proxy", "alpha-workers", 8000) in actual
        assert ("gateway-proxy", "alpha-epp", 9002) in actual
        assert ("alpha-epp", "alpha-workers", 8000) in actual
        assert ("gateway-proxy", "beta-workers", 8000) not in actual
        assert ("gateway-proxy", "alpha-router", 8000) not in actual
        assert ("intruder-istio-ingress", "alpha-workers", 8000) not in actual
        assert ("intruder-istio-ingress", "alpha-epp", 9002) not in actual
        assert ("alpha-epp", "beta-workers", 8000) not in actual


def test_the_evaluator_sees_a_hole():
    """A policy allowing everything from everywhere makes the exact-flows check fail."""
    open_policy = {"metadata": {"namespace": SERVING_NAMESPACE}, "spec": {
        "podSelector": {}, "policyTypes": ["Ingress"], "ingress": [{}]}}
    deny = {"metadata": {"namespace": SERVING_NAMESPACE}, "spec": {
        "podSelector": {}, "policyTypes": ["Ingress"]}}
    intruder = Endpoint("x", "10.64.9.9", "default", {"app": "x"})
    worker = Endpoint("w", "10.64.9.10", SERVING_NAMESPACE, {"a": "b"}, {"http": 8000})
    assert allowed([deny, open_policy], intruder, worker, 8000)
    assert not allowed([deny], intruder, worker, 8000)
    named = {"metadata": {"namespace": SERVING_NAMESPACE}, "spec": {
        "podSelector": {"matchLabels": {"a": "b"}}, "policyTypes": ["Ingress"],
        "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {
            "kubernetes.io/metadata.name": "default"}}}], "ports": [{"port": "http"}]}]}}
    assert allowed([deny, named], intruder, worker, 8000)
    assert not allowed([deny, named], intruder, worker, 8001)
