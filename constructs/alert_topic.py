"""The SNS topic alerts are delivered to, in both variants, and who hears them.

KMS-encrypted with its own key (AMP cannot use the AWS-managed SNS key), TLS-only publishing,
one subscription per `alerts.subscriptions` entry with a filter on the `severity` message
attribute the Alertmanager routes set. Publishers are granted by the stacks: AMP's service
principal (global) or the in-cluster Alertmanager's Pod Identity role (China).
"""
from __future__ import annotations

from dataclasses import dataclass

from aws_cdk import (
    ArnFormat, RemovalPolicy, Stack, aws_iam as iam, aws_kms as kms, aws_sns as sns,
    aws_sns_subscriptions as subs,
)
from constructs import Construct

from config import AlertSubscription
from constructs.nag import acknowledge, wildcard_action
from observability.alerting import SEVERITY_ATTRIBUTE

AMP_PRINCIPAL = "aps.amazonaws.com"


@dataclass(frozen=True)
class AlertTopicProps:
    subscriptions: tuple[AlertSubscription, ...]
    removal_policy: RemovalPolicy


class AlertTopic(Construct):
    def __init__(self, scope: Construct, id: str, *, props: AlertTopicProps) -> None:
        super().__init__(scope, id)
        self.key = kms.Key(self, "Key", enable_key_rotation=True,
                           removal_policy=props.removal_policy,
                           description="Alert topic encryption")
        self.topic = sns.Topic(self, "Topic", display_name="kvcache alerts",
                               master_key=self.key, enforce_ssl=True)
        for sub in props.subscriptions:
            policy = {SEVERITY_ATTRIBUTE: sns.SubscriptionFilter.string_filter(
                allowlist=list(sub.severities))}
            if sub.protocol == "email":
                self.topic.add_subscription(subs.EmailSubscription(
                    sub.endpoint, filter_policy=policy))
            else:
                self.topic.add_subscription(subs.UrlSubscription(
                    sub.endpoint, protocol=sns.SubscriptionProtocol.HTTPS,
                    filter_policy=policy))

    def allow_amp(self) -> None:
        """AMP's alert manager publishes as `aps.amazonaws.com`: on the topic and its key, only
        for workspaces of this account in this region (confused-deputy conditions)."""
        stack = Stack.of(self)
        workspaces = stack.format_arn(service="aps", resource="workspace", resource_name="*",
                                      arn_format=ArnFormat.SLASH_RESOURCE_NAME)
        conditions = {"StringEquals": {"aws:SourceAccount": stack.account},
                      "ArnLike": {"aws:SourceArn": workspaces}}
        principal = iam.ServicePrincipal(AMP_PRINCIPAL)
        self.topic.add_to_resource_policy(iam.PolicyStatement(
            actions=["sns:Publish", "sns:GetTopicAttributes"], principals=[principal],
            resources=[self.topic.topic_arn], conditions=conditions))
        self.key.add_to_resource_policy(iam.PolicyStatement(
            actions=["kms:GenerateDataKey*", "kms:Decrypt"], principals=[principal],
            resources=["*"], conditions=conditions))

    def grant_publish(self, role: iam.IRole) -> None:
        """sns:Publish on the topic and, for its encryption, the key's data-key calls."""
        self.topic.grant_publish(role)
        acknowledge(role, {wildcard_action("kms:GenerateDataKey*"): (
            "SNS encryption needs the GenerateDataKey family on this topic's key; the "
            "statement names only that key.")})

