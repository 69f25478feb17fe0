from __future__ import annotations

from aws_cdk import CfnOutput, Fn, Stack
from constructs import Construct

from config import EnvironmentConfig
from constructs.alert_topic import AlertTopic, AlertTopicProps
from constructs.managed_observability import ManagedObservability, ManagedObservabilityProps
from observability.alerting import amp_alert_manager_definition
from observability.rules import render as render_rules
from stacks.common import removal_policy


class ObservabilityStack(Stack):
    """AMP + Amazon Managed Grafana, and the SNS topic AMP's alert manager delivers to; only
    built where the region offers them (China: MonitoringStack holds the topic)."""

    def __init__(self, scope: Construct, id: str, *, cfg: EnvironmentConfig, **kwargs) -> None:
        super().__init__(scope, id, **kwargs)
        self.alerts = AlertTopic(self, "Alerts", props=AlertTopicProps(
            subscriptions=cfg.alert_subscriptions, removal_policy=removal_policy(cfg)))
        self.alerts.allow_amp()
        self.managed = ManagedObservability(self, "Managed", props=ManagedObservabilityProps(
            removal_policy=removal_policy(cfg), alert_rules=render_rules(cfg),
            grafana=cfg.managed_grafana,
            alert_manager_definition=amp_alert_manager_definition(
                topic_arn=self.alerts.topic.topic_arn, region=cfg.region)))
        # AMP checks it may publish when the definition is set: policies first.
        self.managed.workspace.node.add_dependency(self.alerts)
        CfnOutput(self, "AlertTopicArn", value=self.alerts.topic.topic_arn)
        # what the GitOps YAML's AMP placeholders are filled with (python -m tools fill)
        CfnOutput(self, "AmpQueryUrl", value=self.managed.query_url)
        CfnOutput(self, "AmpRemoteWriteUrl", value=Fn.join("", [
            self.managed.workspace.attr_prometheus_endpoint, "api/v1/remote_write"]))
