"""Metrics collection in the cluster: kube-prometheus-stack from the pinned chart, the DCGM
exporter, and (in-cluster variant) rules, dashboards and Grafana's admin credentials.

Two modes, one chart and one set of scrape jobs (k8s/monitoring.py):
- remote write (AMP exists): Prometheus in agent mode signs remote writes with SigV4; its
  service account gets `aps:RemoteWrite` on the workspace through EKS Pod Identity.
- in cluster (China): Prometheus server, Alertmanager and Grafana on gp3 volumes. Grafana's
  admin password is generated in Secrets Manager and read at pod start by an init container
  running as Grafana's service account (Pod Identity): no manifest or template carries it.
"""
from __future__ import annotations

from dataclasses import dataclass

import cdk8s
from aws_cdk import (
    Duration, Fn, RemovalPolicy, aws_aps as aps, aws_eks_v2 as eks, aws_iam as iam,
    aws_secretsmanager as sm,
)
from constructs import Construct

from config.contracts import HELM_TIMEOUT_MINUTES, MONITORING_NAMESPACE
from config.images import CHARTS, ImageResolver
from constructs.alert_topic import AlertTopic
from constructs.nag import acknowledge
from constructs.pod_identity import PodIdentityRole, PodIdentityRoleProps
from k8s.monitoring import (
    ALERTMANAGER_SERVICE_ACCOUNT, CHART_KEY, GRAFANA_SERVICE_ACCOUNT, PROMETHEUS_SERVICE_ACCOUNT,
    RELEASE, GrafanaProps, MonitoringCharts, MonitoringValuesProps, RemoteWrite,
    kube_prometheus_stack_values,
)
from observability.alerting import alertmanager_config


@dataclass(frozen=True)
class ClusterMonitoringProps:
    cluster: eks.ICluster
    images: ImageResolver
    region: str
    charts: MonitoringCharts             # cdk8s charts from k8s.monitoring
    scrape_configs: list[dict]
    removal_policy: RemovalPolicy
    amp_workspace: aps.CfnWorkspace | None = None   # set: agent mode remote-writing here
    alert_topic: AlertTopic | None = None   # in cluster: the Alertmanager publishes here
    namespace: str = MONITORING_NAMESPACE


class ClusterMonitoring(Construct):
    def __init__(self, scope: Construct, id: str, *, props: ClusterMonitoringProps) -> None:
        super().__init__(scope, id)
        p = props
        base = self._apply("Base", p.cluster, p.charts.base)
        dcgm = self._apply("DcgmExporter", p.cluster, p.charts.dcgm)
        dcgm.node.add_dependency(base)
        policies = self._apply("NetworkPolicies", p.cluster, p.charts.network_policies)
        policies.node.add_dependency(base)

        prometheus = PodIdentityRole(self, "PrometheusIdentity", props=PodIdentityRoleProps(
            cluster=p.cluster, namespace=p.namespace,
            service_account=PROMETHEUS_SERVICE_ACCOUNT))
        identities = [prometheus]
        self.admin_secret: sm.Secret | None = None
        if p.amp_workspace is not None:
            prometheus.role.add_to_policy(iam.PolicyStatement(
                actions=["aps:RemoteWrite"], resources=[p.amp_workspace.attr_arn]))
            mode = dict(remote_write=RemoteWrite(
                url=Fn.join("", [p.amp_workspace.attr_prometheus_endpoint, "api/v1/remote_write"]),
                region=p.region))
        else:
            self.admin_secret = sm.Secret(
                self, "GrafanaAdmin", description="Admin password of the in-cluster Grafana",
                generate_secret_string=sm.SecretStringGenerator(
                    password_length=32, exclude_punctuation=True),
                removal_policy=p.removal_policy)
            acknowledge(self.admin_secret, {
                "AwsSolutions::AwsSolutions-SMG4": "Grafana reads the admin password only when "
                "it first creates its database; rotating the secret would not change it. "
                "Rotate in Grafana, then put the new value here (docs/observability.md)."})
            grafana = PodIdentityRole(self, "GrafanaIdentity", props=PodIdentityRoleProps(
                cluster=p.cluster, namespace=p.namespace,
                service_account=GRAFANA_SERVICE_ACCOUNT))
            self.admin_secret.grant_read(grafana.role)
            identities.append(grafana)
            if p.alert_topic is None:
                raise ValueError("an in-cluster Alertmanager needs an alert topic")
            alertmanager = PodIdentityRole(
                self, "AlertmanagerIdentity", props=PodIdentityRoleProps(
                    cluster=p.cluster, namespace=p.namespace,
                    service_account=ALERTMANAGER_SERVICE_ACCOUNT))
            p.alert_topic.grant_publish(alertmanager.role)
            identities.append(alertmanager)
            mode = dict(grafana=GrafanaProps(
                admin_secret_arn=self.admin_secret.secret_arn, region=p.region,
                fetch_image=p.images.uri("aws-cli")),
                alertmanager_config=alertmanager_config(
                    topic_arn=p.alert_topic.topic.topic_arn, region=p.region, in_cluster=True))

        chart = CHARTS[CHART_KEY]
        repository, name = p.images.chart_source(CHART_KEY)
        self.values = kube_prometheus_stack_values(MonitoringValuesProps(
            images=p.images, scrape_configs=p.scrape_configs, **mode))
        self.stack = eks.HelmChart(
            self, "KubePrometheusStack", cluster=p.cluster, chart=name, repository=repository,
            version=chart.version, namespace=p.namespace, create_namespace=False,
            release=RELEASE, values=self.values, wait=True, atomic=True,
            timeout=Duration.minutes(HELM_TIMEOUT_MINUTES))
        self.stack.node.add_dependency(base)
        for identity in identities:  # credentials exist before the pods that use them
            self.stack.node.add_dependency(identity)

        # The PrometheusRule needs the operator's CRDs, which the chart installs.
        for attr in ("rules", "dashboards"):
            chart8s = getattr(p.charts, attr)
            if chart8s is not None:
                manifest = self._apply(attr.capitalize(), p.cluster, chart8s)
                manifest.node.add_dependency(self.stack)

    def _apply(self, id: str, cluster: eks.ICluster,
               chart: cdk8s.Chart) -> eks.KubernetesManifest:
        return eks.KubernetesManifest(self, id, cluster=cluster, manifest=chart.to_json(),
                                      overwrite=True)
