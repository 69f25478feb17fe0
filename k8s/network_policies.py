"""Default-deny ingress in a namespace we own, then exactly the flows the charts declare.

The VPC CNI's network policy agent enforces these (the vpc-cni add-on runs with
`enableNetworkPolicy`). Only ingress is restricted: every flow is allowed where it arrives, so
one list of flows (k8s/flows.py) is the whole contract, and the policy test checks it both ways.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Iterable

from cdk8s import Chart
from constructs import Construct

from k8s.flows import Flow, Peer
from k8s.objects import k8s_object, standard_labels

NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"   # set by the API server on every namespace
COMPONENT = "network-policy"


@dataclass(frozen=True)
class NetworkPoliciesProps:
    namespace: str
    flows: tuple[Flow, ...]     # only those whose destination is in `namespace` are used


def _peers(source: Peer, namespace: str) -> list[dict]:
    if source.cidrs:
        return [{"ipBlock": {"cidr": cidr}} for cidr in source.cidrs]
    peer: dict = {"podSelector": {"matchLabels": dict(source.labels)}}
    if source.namespace != namespace:
        peer["namespaceSelector"] = {"matchLabels": {NAMESPACE_NAME_LABEL: source.namespace}}
    return [peer]


def ingress_rules(flows: Iterable[Flow], namespace: str) -> list[dict]:
    """One rule per source, with every port that source may reach on the destination."""
    ports: dict[Peer, set[int]] = defaultdict(set)
    for f in flows:
        ports[f.source].add(f.port)
    return [{"from": _peers(src, namespace),
             "ports": [{"protocol": "TCP", "port": p} for p in sorted(ports[src])]}
            for src in sorted(ports, key=lambda s: s.name)]


class NetworkPoliciesChart(Chart):
    def __init__(self, scope: Construct, id: str, *, props: NetworkPoliciesProps) -> None:
        super().__init__(scope, id, namespace=props.namespace)
        ns = props.namespace
        labels = standard_labels(COMPONENT, ns)
        k8s_object(self, "DefaultDeny", api_version="networking.k8s.io/v1",
                   kind="NetworkPolicy", name="default-deny-ingress", namespace=ns,
                   labels=labels, body={"spec": {"podSelector": {},
                                                 "policyTypes": ["Ingress"]}})
        by_destination: dict[Peer, list[Flow]] = defaultdict(list)
        for f in props.flows:
            if f.destination.namespace == ns:
                by_destination[f.destination].append(f)
        for dest in sorted(by_destination, key=lambda d: d.name):
            k8s_object(self, f"Allow-{dest.name}", api_version="networking.k8s.io/v1",
                       kind="NetworkPolicy", name=f"allow-to-{dest.name}", namespace=ns,
                       labels=labels, body={"spec": {
                           "podSelector": {"matchLabels": dict(dest.labels)},
                           "policyTypes": ["Ingress"],
                           "ingress": ingress_rules(by_destination[dest], ns)}})
