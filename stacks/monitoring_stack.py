from __future__ import annotations

import cdk8s
from aws_cdk import CfnOutput, Stack, aws_aps as aps, aws_eks_v2 as eks, aws_grafana as grafana
from constructs import Construct

from config import EnvironmentConfig
from constructs.alert_topic import AlertTopic, AlertTopicProps
from constructs.cluster_monitoring import ClusterMonitoring, ClusterMonitoringProps
from constructs.managed_grafana_dashboards import (
    ManagedGrafanaDashboards, ManagedGrafanaDashboardsProps,
)
from config.endpoint_spec import EndpointSpec
from k8s.monitoring import (
    build_monitoring_charts, scrape_configs, scrape_intervals, scraped_endpoints,
)
from observability.dashboards import build_dashboards
from stacks.common import log_retention, removal_policy


class MonitoringStack(Stack):
    """Collection in the cluster, and dashboards where they are drawn.

    With AMP (global): a Prometheus agent remote-writes to the workspace and the dashboards go
    to Amazon Managed Grafana. Without (China): Prometheus, Alertmanager and Grafana in the
    cluster, with the rules and dashboards as Kubernetes objects.
    """

    def __init__(self, scope: Construct, id: str, *, cfg: EnvironmentConfig,
                 endpoints: tuple[EndpointSpec, ...], cluster: eks.ICluster,
                 amp_workspace: aps.CfnWorkspace | None = None,
                 grafana_workspace: grafana.CfnWorkspace | None = None, **kwargs) -> None:
        super().__init__(scope, id, **kwargs)
        self.charts_app = cdk8s.App()
        self.charts = build_monitoring_charts(self.charts_app, cfg, endpoints)
        # Without AMP the in-cluster Alertmanager delivers; its topic lives with it.
        self.alerts = (AlertTopic(self, "Alerts", props=AlertTopicProps(
            subscriptions=cfg.alert_subscriptions, removal_policy=removal_policy(cfg)))
            if amp_workspace is None else None)
        self.collector = ClusterMonitoring(self, "Collector", props=ClusterMonitoringProps(
            cluster=cluster, images=cfg.images,
            region=cfg.region, charts=self.charts,
            scrape_configs=scrape_configs(endpoints=scraped_endpoints(endpoints),
                                          intervals=scrape_intervals(endpoints)),
            removal_policy=removal_policy(cfg), amp_workspace=amp_workspace,
            alert_topic=self.alerts))
        self.dashboards = None
        if amp_workspace is not None and grafana_workspace is not None:
            self.dashboards = ManagedGrafanaDashboards(
                self, "ManagedGrafana", props=ManagedGrafanaDashboardsProps(
                    workspace=grafana_workspace,
                    prometheus_endpoint=amp_workspace.attr_prometheus_endpoint,
                    region=cfg.region, dashboards=build_dashboards(cfg, endpoints),
                    log_retention=log_retention(cfg), removal_policy=removal_policy(cfg)))
        if self.alerts is not None:
            CfnOutput(self, "AlertTopicArn", value=self.alerts.topic.topic_arn)
        if self.collector.admin_secret is not None:
            CfnOutput(self, "GrafanaAdminSecretArn", value=self.collector.admin_secret.secret_arn)
