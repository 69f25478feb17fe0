"""CloudFormation custom resource: dashboards (and the AMP data source) into Amazon Managed
Grafana, through the workspace's HTTP API with a service account token that lives minutes.

Create/Update: upsert the Prometheus data source (SigV4 with the workspace's IAM role), the
folder, and every dashboard of the JSON bundle in S3 (overwrite by uid). Delete: remove the
dashboards, best effort. The stdlib and boto3 only (both in the Lambda runtime).
"""
from __future__ import annotations

import json
import logging
import urllib.error
import urllib.request
import uuid

import boto3

LOG = logging.getLogger()
LOG.setLevel(logging.INFO)
SERVICE_ACCOUNT = "kvcache-provisioner"
TOKEN_SECONDS = 900


class Grafana:
    def __init__(self, url: str, token: str):
        self.url, self.token = url.rstrip("/"), token

    def call(self, method: str, path: str, body: dict | None = None) -> tuple[int, dict]:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(f"{self.url}{path}", data=data, method=method, headers={
            "Authorization": f"Bearer {self.token}", "Content-Type": "application/json",
            "Accept": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:  # noqa: S310 (https URL)
                return resp.status, json.loads(resp.read() or b"{}")
        except urllib.error.HTTPError as err:
            return err.code, json.loads(err.read() or b"{}")

    def must(self, method: str, path: str, body: dict | None = None,
             ok: tuple[int, ...] = (200,)) -> dict:
        status, payload = self.call(method, path, body)
        if status not in ok:
            raise RuntimeError(f"{method} {path}: HTTP {status} {payload}")
        return payload


def _service_account(client, workspace: str) -> str:
    pages = client.get_paginator("list_workspace_service_accounts").paginate(
        workspaceId=workspace)
    for page in pages:
        for account in page.get("serviceAccounts", []):
            if account["name"] == SERVICE_ACCOUNT:
                return account["id"]
    return client.create_workspace_service_account(
        workspaceId=workspace, name=SERVICE_ACCOUNT, grafanaRole="ADMIN")["id"]


def _with_api(props: dict, work) -> None:
    client = boto3.client("grafana")
    workspace = props["WorkspaceId"]
    account = _service_account(client, workspace)
    token = client.create_workspace_service_account_token(
        workspaceId=workspace, serviceAccountId=account, secondsToLive=TOKEN_SECONDS,
        name=f"cfn-{uuid.uuid4().hex[:12]}")["serviceAccountToken"]
    try:
        work(Grafana(props["WorkspaceUrl"], token["key"]))
    finally:
        client.delete_workspace_service_account_token(
            workspaceId=workspace, serviceAccountId=account, tokenId=token["id"])


def _bundle(props: dict) -> list[dict]:
    obj = boto3.client("s3").get_object(Bucket=props["BundleBucket"], Key=props["BundleKey"])
    return json.loads(obj["Body"].read())["dashboards"]


def provision(props: dict) -> None:
    dashboards = _bundle(props)
    uid = props["DatasourceUid"]
    source = {
        "uid": uid, "name": props["DatasourceName"], "type": "prometheus", "access": "proxy",
        "url": props["PrometheusUrl"].rstrip("/"), "isDefault": True,
        "jsonData": {"httpMethod": "POST", "sigV4Auth": True,
                     "sigV4AuthType": "ec2_iam_role", "sigV4Region": props["Region"]},
    }
    folder = props["FolderUid"]

    def work(api: Grafana) -> None:
        status, _ = api.call("GET", f"/api/datasources/uid/{uid}")
        if status == 200:
            api.must("PUT", f"/api/datasources/uid/{uid}", source)
        else:
            api.must("POST", "/api/datasources", source)
        status, _ = api.call("GET", f"/api/folders/{folder}")
        if status != 200:
            api.must("POST", "/api/folders", {"uid": folder, "title": props["FolderTitle"]})
        for dashboard in dashboards:
            api.must("POST", "/api/dashboards/db", {
                "dashboard": {**dashboard, "id": None}, "folderUid": folder,
                "overwrite": True, "message": "provisioned by CloudFormation"})
            LOG.info("dashboard %s provisioned", dashboard.get("uid"))

    _with_api(props, work)


def unprovision(props: dict) -> None:
    uids = [d["uid"] for d in _bundle(props)]

    def work(api: Grafana) -> None:
        for uid in uids:
            api.call("DELETE", f"/api/dashboards/uid/{uid}")

    _with_api(props, work)


def respond(event: dict, status: str, reason: str, physical_id: str) -> None:
    body = json.dumps({
        "Status": status, "Reason": reason or "see the function's log",
        "PhysicalResourceId": physical_id, "StackId": event["StackId"],
        "RequestId": event["RequestId"], "LogicalResourceId": event["LogicalResourceId"],
        "Data": {}}).encode()
    req = urllib.request.Request(event["ResponseURL"], data=body, method="PUT",
                                 headers={"Content-Type": "", "Content-Length": str(len(body))})
    with urllib.request.urlopen(req, timeout=30):  # noqa: S310 (CloudFormation's presigned URL)
        pass


def handler(event: dict, context) -> None:
    LOG.info("%s %s", event.get("RequestType"), event.get("LogicalResourceId"))
    physical = event.get("PhysicalResourceId") or "kvcache-grafana-dashboards"
    status, reason = "SUCCESS", ""
    try:
        props = event["ResourceProperties"]
        if event["RequestType"] == "Delete":
            try:
                unprovision(props)
            except Exception:  # never block a stack deletion on Grafana
                LOG.exception("dashboards not removed")
        else:
            provision(props)
    except Exception as err:
        LOG.exception("provisioning failed")
        status, reason = "FAILED", f"{type(err).__name__}: {err}"[:900]
    respond(event, status, reason, physical)
