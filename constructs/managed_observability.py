"""AMP workspace and Amazon Managed Grafana reading it: global regions only (neither exists in
China, where the in-cluster Prometheus and Grafana replace them)."""
from __future__ import annotations

from dataclasses import dataclass

from aws_cdk import RemovalPolicy, Stack, aws_aps as aps, aws_grafana as grafana, aws_iam as iam
from constructs import Construct
from constructs.nag import acknowledge, wildcard


@dataclass(frozen=True)
class ManagedObservabilityProps:
    removal_policy: RemovalPolicy
    alert_rules: str | None = None   # a Prometheus rule file (YAML) AMP evaluates
    alert_manager_definition: str | None = None   # AMP's alert manager (routes to SNS)
    grafana: bool = True             # Amazon Managed Grafana (needs IAM Identity Center)


class ManagedObservability(Construct):
    def __init__(self, scope: Construct, id: str, *, props: ManagedObservabilityProps) -> None:
        super().__init__(scope, id)
        self.workspace = aps.CfnWorkspace(
            self, "Prometheus", alert_manager_definition=props.alert_manager_definition)
        self.workspace.apply_removal_policy(props.removal_policy)
        self.rules = (aps.CfnRuleGroupsNamespace(
            self, "AlertRules", workspace=self.workspace.attr_arn, name="kvcache",
            data=props.alert_rules) if props.alert_rules else None)
        self.grafana: grafana.CfnWorkspace | None = None
        if props.grafana:
            self._grafana(props)

    def _grafana(self, props: ManagedObservabilityProps) -> None:
        self.grafana_role = iam.Role(
            self, "GrafanaRole", assumed_by=iam.ServicePrincipal("grafana.amazonaws.com"),
            description="Amazon Managed Grafana reads the AMP workspace")
        self.grafana_role.add_to_policy(iam.PolicyStatement(
            actions=["aps:QueryMetrics", "aps:GetSeries", "aps:GetLabels",
                     "aps:GetMetricMetadata", "aps:DescribeWorkspace"],
            resources=[self.workspace.attr_arn]))
        self.grafana_role.add_to_policy(iam.PolicyStatement(
            actions=["aps:ListWorkspaces"], resources=["*"]))
        acknowledge(self.grafana_role, {wildcard("*"): (
            "aps:ListWorkspaces supports no resource-level permissions; every other action is "
            "scoped to this workspace.")})
        self.grafana = grafana.CfnWorkspace(
            self, "Grafana",
            account_access_type="CURRENT_ACCOUNT",
            authentication_providers=["AWS_SSO"],
            permission_type="CUSTOMER_MANAGED",
            role_arn=self.grafana_role.role_arn,
            data_sources=["PROMETHEUS"],
            description="KV cache and routing dashboards",
        )
        self.grafana.apply_removal_policy(props.removal_policy)

    @property
    def query_url(self) -> str:
        """The workspace's Prometheus-compatible base URL (KEDA appends /api/v1/query)."""
        stack = Stack.of(self)
        return (f"https://aps-workspaces.{stack.region}.{stack.url_suffix}/workspaces/"
                f"{self.workspace.attr_workspace_id}")
