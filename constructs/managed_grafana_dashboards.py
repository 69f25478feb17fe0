"""Dashboards as code into Amazon Managed Grafana (global regions).

AMG has no CloudFormation type for dashboards or data sources, so a small custom resource
(observability/grafana_provisioner) calls the workspace's HTTP API with a service account token
it creates for the call and deletes after. The dashboard JSON travels as an S3 asset, so a
changed dashboard is a changed asset key and CloudFormation runs an update.
"""
from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from aws_cdk import (
    ArnFormat, CustomResource, Duration, RemovalPolicy, Stack, aws_grafana as grafana,
    aws_iam as iam, aws_lambda as lambda_, aws_logs as logs, aws_s3_assets as s3_assets,
)
from constructs import Construct

from constructs.nag import acknowledge, managed_policy, wildcard, wildcard_action

HANDLER_DIR = Path(__file__).resolve().parent.parent / "observability" / "grafana_provisioner"


@dataclass(frozen=True)
class ManagedGrafanaDashboardsProps:
    workspace: grafana.CfnWorkspace
    prometheus_endpoint: str          # the AMP workspace's query endpoint
    region: str
    dashboards: Mapping[str, dict]    # uid -> dashboard JSON
    log_retention: logs.RetentionDays
    removal_policy: RemovalPolicy
    datasource_uid: str = "kvcache-amp"
    datasource_name: str = "Amazon Managed Service for Prometheus (kvcache)"
    folder_uid: str = "kvcache"
    folder_title: str = "kvcache"


class ManagedGrafanaDashboards(Construct):
    def __init__(self, scope: Construct, id: str, *,
                 props: ManagedGrafanaDashboardsProps) -> None:
        super().__init__(scope, id)
        stack = Stack.of(self)
        bundle_dir = Path(tempfile.mkdtemp(prefix="kvcache-dashboards-"))
        bundle = bundle_dir / "dashboards.json"
        bundle.write_text(json.dumps({"dashboards": [props.dashboards[k] for k in
                                                     sorted(props.dashboards)]},
                                     sort_keys=True, indent=1))
        self.bundle = s3_assets.Asset(self, "Bundle", path=str(bundle))
        log_group = logs.LogGroup(self, "Logs", retention=props.log_retention,
                                  removal_policy=props.removal_policy)
        self.function = lambda_.Function(
            self, "Provisioner", runtime=lambda_.Runtime.PYTHON_3_14,
            handler="index.handler",
            code=lambda_.Code.from_asset(str(HANDLER_DIR), exclude=["__pycache__", "*.pyc"]),
            timeout=Duration.minutes(5), memory_size=256, log_group=log_group,
            description="Provisions kvcache dashboards into Amazon Managed Grafana")
        self.bundle.grant_read(self.function)
        workspace_arn = stack.format_arn(
            service="grafana", resource="/workspaces", resource_name=props.workspace.attr_id,
            arn_format=ArnFormat.SLASH_RESOURCE_NAME)
        self.function.add_to_role_policy(iam.PolicyStatement(
            actions=["grafana:ListWorkspaceServiceAccounts",
                     "grafana:CreateWorkspaceServiceAccount",
                     "grafana:CreateWorkspaceServiceAccountToken",
                     "grafana:DeleteWorkspaceServiceAccountToken"],
            resources=[workspace_arn]))
        self.resource = CustomResource(
            self, "Dashboards", service_token=self.function.function_arn,
            resource_type="Custom::GrafanaDashboards",
            properties={
                "WorkspaceId": props.workspace.attr_id,
                "WorkspaceUrl": f"https://{props.workspace.attr_endpoint}",
                "PrometheusUrl": props.prometheus_endpoint,
                "Region": props.region,
                "BundleBucket": self.bundle.s3_bucket_name,
                "BundleKey": self.bundle.s3_object_key,
                "DatasourceUid": props.datasource_uid,
                "DatasourceName": props.datasource_name,
                "FolderUid": props.folder_uid, "FolderTitle": props.folder_title,
            })
        acknowledge(self.function, {
            managed_policy("service-role/AWSLambdaBasicExecutionRole"):
                "Writes its own log group only; the function runs once per deployment.",
            wildcard_action("s3:GetObject*"): "CDK asset grant_read on the dashboard bundle.",
            wildcard_action("s3:GetBucket*"): "CDK asset grant_read on the dashboard bundle.",
            wildcard_action("s3:List*"): "CDK asset grant_read on the dashboard bundle.",
            wildcard(f"arn:<AWS::Partition>:s3:::cdk-hnb659fds-assets-{stack.account}-"
                     f"{stack.region}/*"):
                "CDK's bootstrap asset bucket: the bundle's key is content-addressed.",
        })
