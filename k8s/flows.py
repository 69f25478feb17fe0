"""The network flows our pods take part in, declared by the charts that create the pods.

Each chart lists the connections its pods accept (`Flow`); k8s/network_policies.py turns the
list into default-deny plus exactly those allowances, and tests/k8s/test_network_policies.py
evaluates the rendered policies against the same list. Peers of charts we do not render
(kube-prometheus-stack, KEDA) are described here once, by the labels their pods carry.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from config.contracts import (
    KEDA_NAMESPACE, LABEL_INSTANCE, LABEL_NAME, MONITORING_NAMESPACE, MONITORING_RELEASE,
    PROMETHEUS_PORT,
)

CONFIG_RELOADER_PORT = 8080      # prometheus-config-reloader's reloader-web
ALERTMANAGER_PORT = 9093
GRAFANA_PORT = 3000
KUBE_STATE_METRICS_PORT = 8080
OPERATOR_PORT = 8080             # prometheus-operator's http (its TLS is off)


@dataclass(frozen=True)
class Peer:
    """Pods selected by `labels` in `namespace`, or (`cidrs`) addresses outside the cluster."""

    name: str
    namespace: str | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    cidrs: tuple[str, ...] = ()

    def __hash__(self) -> int:
        return hash((self.name, self.namespace, tuple(sorted(self.labels.items())), self.cidrs))


@dataclass(frozen=True)
class Flow:
    source: Peer
    destination: Peer        # always pods
    port: int
    why: str


def _operator_managed(name: str) -> Mapping[str, str]:
    """Pods of a Prometheus/PrometheusAgent/Alertmanager object carry its name as instance."""
    return {LABEL_INSTANCE: f"{MONITORING_RELEASE}-{name}"}


def load_balancer(cidrs: tuple[str, ...]) -> Peer:
    """The Network Load Balancer (IP targets, client IP preservation off): its nodes' addresses
    in the environment's load balancer subnets, where no pod lives (config/network.py)."""
    return Peer("load-balancer", cidrs=tuple(cidrs))


PROMETHEUS = Peer("prometheus", MONITORING_NAMESPACE, _operator_managed("prometheus"))
ALERTMANAGER = Peer("alertmanager", MONITORING_NAMESPACE, _operator_managed("alertmanager"))
GRAFANA = Peer("grafana", MONITORING_NAMESPACE,
               {LABEL_NAME: "grafana", LABEL_INSTANCE: MONITORING_RELEASE})
KUBE_STATE_METRICS = Peer("kube-state-metrics", MONITORING_NAMESPACE,
                          {LABEL_NAME: "kube-state-metrics", LABEL_INSTANCE: MONITORING_RELEASE})
PROMETHEUS_OPERATOR = Peer("prometheus-operator", MONITORING_NAMESPACE,
                           {"app": "kube-prometheus-stack-operator",
                            "release": MONITORING_RELEASE})
KEDA_OPERATOR = Peer("keda-operator", KEDA_NAMESPACE, {LABEL_NAME: "keda-operator"})

# The pods kube-prometheus-stack 88.5.2 runs (as our values configure it), with the ports
# they listen on: what the policy test builds its universe of pods from.
HELM_PODS: dict[str, tuple[Peer, tuple[int, ...]]] = {
    "prometheus": (PROMETHEUS, (PROMETHEUS_PORT, CONFIG_RELOADER_PORT)),
    "alertmanager": (ALERTMANAGER, (ALERTMANAGER_PORT, CONFIG_RELOADER_PORT)),
    "grafana": (GRAFANA, (GRAFANA_PORT,)),
    "kube-state-metrics": (KUBE_STATE_METRICS, (KUBE_STATE_METRICS_PORT,)),
    "prometheus-operator": (PROMETHEUS_OPERATOR, (OPERATOR_PORT,)),
    "keda-operator": (KEDA_OPERATOR, ()),
}


def monitoring_stack_flows(in_cluster: bool) -> tuple[Flow, ...]:
    """What kube-prometheus-stack's pods accept. Agent mode (AMP): Prometheus scrapes and
    remote-writes, nothing queries it. In-cluster (China): KEDA and Grafana query it, it sends
    alerts to Alertmanager, Grafana reads Alertmanager's alerts; every part is scraped."""
    scrape = [Flow(PROMETHEUS, PROMETHEUS, PROMETHEUS_PORT, "self-monitoring"),
              Flow(PROMETHEUS, PROMETHEUS, CONFIG_RELOADER_PORT, "config-reloader metrics"),
              Flow(PROMETHEUS, KUBE_STATE_METRICS, KUBE_STATE_METRICS_PORT, "cluster state"),
              Flow(PROMETHEUS, PROMETHEUS_OPERATOR, OPERATOR_PORT, "operator metrics")]
    if not in_cluster:
        return tuple(scrape)
    return tuple(scrape + [
        Flow(KEDA_OPERATOR, PROMETHEUS, PROMETHEUS_PORT, "autoscaling queries"),
        Flow(GRAFANA, PROMETHEUS, PROMETHEUS_PORT, "dashboards"),
        Flow(PROMETHEUS, ALERTMANAGER, ALERTMANAGER_PORT, "alerts, and its metrics"),
        Flow(PROMETHEUS, ALERTMANAGER, CONFIG_RELOADER_PORT, "config-reloader metrics"),
        Flow(GRAFANA, ALERTMANAGER, ALERTMANAGER_PORT, "the Alertmanager datasource"),
        Flow(PROMETHEUS, GRAFANA, GRAFANA_PORT, "Grafana metrics"),
    ])
