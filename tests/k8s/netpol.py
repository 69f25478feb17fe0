"""A small evaluator of Kubernetes NetworkPolicy ingress semantics (networking.k8s.io/v1).

No maintained PyPI library answers "may A reach B on port P" from manifests alone (kube-netpol
generates and lints; the rest are Cilium/Calico tools needing a cluster), so this follows the
API reference: a pod selected by no Ingress policy accepts everything; a selected pod accepts a
connection if any selecting policy has a rule whose `from` (empty: anyone) matches the source
(podSelector in the policy's namespace, namespaceSelector [+ podSelector], ipBlock with except)
and whose `ports` (empty: all) match (number or the destination's named port, protocol TCP by
default, `endPort` ranges). Selectors support matchLabels and matchExpressions.
"""
from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from typing import Mapping

NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"


@dataclass(frozen=True)
class Endpoint:
    """A pod (namespace set) or an address outside the cluster (namespace None)."""

    name: str
    ip: str
    namespace: str | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    ports: Mapping[str, int] = field(default_factory=dict)    # container port name -> number

    def __hash__(self) -> int:
        return hash(self.name)


def selector_matches(selector: Mapping | None, labels: Mapping[str, str]) -> bool:
    if selector is None:
        return False
    for k, v in (selector.get("matchLabels") or {}).items():
        if labels.get(k) != v:
            return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr["key"], expr["operator"], expr.get("values", [])
        if op == "In" and labels.get(key) not in values:
            return False
        if op == "NotIn" and labels.get(key) in values:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
    return True


def _peer_matches(peer: Mapping, policy_ns: str, src: Endpoint) -> bool:
    if "ipBlock" in peer:
        block = peer["ipBlock"]
        ip = ipaddress.ip_address(src.ip)
        return (ip in ipaddress.ip_network(block["cidr"]) and
                not any(ip in ipaddress.ip_network(e) for e in block.get("except", [])))
    if src.namespace is None:          # an outside address only matches ipBlocks
        return False
    if "namespaceSelector" in peer:
        ns_ok = selector_matches(peer["namespaceSelector"],
                                 {NAMESPACE_NAME_LABEL: src.namespace})
    else:
        ns_ok = src.namespace == policy_ns
    pod_ok = selector_matches(peer.get("podSelector", {}), src.labels)
    return ns_ok and pod_ok


def _port_matches(rule_port: Mapping, dst: Endpoint, port: int) -> bool:
    if rule_port.get("protocol", "TCP") != "TCP":
        return False
    want = rule_port.get("port")
    if want is None:
        return True
    if isinstance(want, str):
        want = dst.ports.get(want)
        return want == port
    return want <= port <= rule_port.get("endPort", want)


def allowed(policies: list[Mapping], src: Endpoint, dst: Endpoint, port: int) -> bool:
    selecting = [p for p in policies
                 if p["metadata"]["namespace"] == dst.namespace
                 and "Ingress" in p["spec"].get("policyTypes", ["Ingress"])
                 and selector_matches(p["spec"]["podSelector"], dst.labels)]
    if not selecting:
        return True
    for policy in selecting:
        ns = policy["metadata"]["namespace"]
        for rule in policy["spec"].get("ingress") or []:
            peers = rule.get("from") or []
            if peers and not any(_peer_matches(p, ns, src) for p in peers):
                continue
            ports = rule.get("ports") or []
            if ports and not any(_port_matches(p, dst, port) for p in ports):
                continue
            return True
    return False
