"""The AMG provisioning function against a stand-in Grafana on 127.0.0.1 and stubbed AWS APIs:
data source, folder and dashboards are upserted, the token is always deleted, CloudFormation
always gets an answer."""
from __future__ import annotations

import importlib.util
import io
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import boto3
import pytest
from botocore.stub import Stubber

from constructs.managed_grafana_dashboards import HANDLER_DIR

_spec = importlib.util.spec_from_file_location("grafana_provisioner", HANDLER_DIR / "index.py")
provisioner = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(provisioner)

WS, SA, TOKEN = "g-abc123", "7", {"id": "tok-1", "name": "cfn", "key": "glsa_secret"}


class FakeGrafana(BaseHTTPRequestHandler):
    calls: list = []
    existing: set = set()
    fail_dashboards = False

    def _reply(self, status: int, body: dict | None = None) -> None:
        data = json.dumps(body or {}).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _handle(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length) or b"{}") if length else None
        type(self).calls.append((self.command, self.path, body, self.headers.get("Authorization")))
        if self.path.startswith("/cfn"):
            return self._reply(200)
        if self.command == "GET":
            return self._reply(200 if self.path in self.existing else 404)
        if self.path == "/api/dashboards/db" and self.fail_dashboards:
            return self._reply(500, {"message": "boom"})
        return self._reply(200)

    do_GET = do_POST = do_PUT = do_DELETE = _handle

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def grafana():
    FakeGrafana.calls, FakeGrafana.existing, FakeGrafana.fail_dashboards = [], set(), False
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeGrafana)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                              daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()


@pytest.fixture
def aws(monkeypatch):
    clients = {name: boto3.client(name, region_name="us-west-2", aws_access_key_id="x",
                                  aws_secret_access_key="x") for name in ("grafana", "s3")}
    stubs = {name: Stubber(client) for name, client in clients.items()}
    monkeypatch.setattr(provisioner.boto3, "client", lambda name, **_: clients[name])
    for stub in stubs.values():
        stub.activate()
    yield stubs
    for stub in stubs.values():
        stub.assert_no_pending_responses()


def _expect(stubs, dashboards, existing_account=True):
    g = stubs["grafana"]
    accounts = [{"id": SA, "name": provisioner.SERVICE_ACCOUNT, "grafanaRole": "ADMIN",
                 "isDisabled": "false"}] if existing_account else []
    g.add_response("list_workspace_service_accounts",
                   {"serviceAccounts": accounts, "workspaceId": WS}, {"workspaceId": WS})
    if not existing_account:
        g.add_response("create_workspace_service_account",
                       {"id": SA, "name": provisioner.SERVICE_ACCOUNT, "grafanaRole": "ADMIN",
                        "workspaceId": WS},
                       {"workspaceId": WS, "name": provisioner.SERVICE_ACCOUNT,
                        "grafanaRole": "ADMIN"})
    stubs["s3"].add_response("get_object", {"Body": io.BytesIO(json.dumps(
        {"dashboards": dashboards}).encode())}, {"Bucket": "assets", "Key": "bundle.json"})
    g.add_response("create_workspace_service_account_token",
                   {"serviceAccountToken": TOKEN, "serviceAccountId": SA, "workspaceId": WS})
    g.add_response("delete_workspace_service_account_token",
                   {"tokenId": TOKEN["id"], "serviceAccountId": SA, "workspaceId": WS},
                   {"workspaceId": WS, "serviceAccountId": SA, "tokenId": TOKEN["id"]})


def _event(url: str, request: str = "Create") -> dict:
    return {"RequestType": request, "ResponseURL": f"{url}/cfn/response", "StackId": "stack",
            "RequestId": "req", "LogicalResourceId": "Dashboards",
            "ResourceProperties": {
                "WorkspaceId": WS, "WorkspaceUrl": url, "Region": "us-west-2",
                "PrometheusUrl": "https://aps-workspaces.us-west-2.amazonaws.com/workspaces/ws-1/",
                "BundleBucket": "assets", "BundleKey": "bundle.json",
                "DatasourceUid": "kvcache-amp", "DatasourceName": "AMP",
                "FolderUid": "kvcache", "FolderTitle": "kvcache"}}


def _answer() -> dict:
    (call,) = [c for c in FakeGrafana.calls if c[1] == "/cfn/response"]
    return call[2]


def test_create_upserts_data_source_folder_and_dashboards(grafana, aws):
    _expect(aws, [{"uid": "kvcache-serving", "title": "x", "id": 3}], existing_account=False)
    provisioner.handler(_event(grafana), None)
    api = [(m, p) for m, p, _, auth in FakeGrafana.calls if p.startswith("/api")]
    assert api == [("GET", "/api/datasources/uid/kvcache-amp"), ("POST", "/api/datasources"),
                   ("GET", "/api/folders/kvcache"), ("POST", "/api/folders"),
                   ("POST", "/api/dashboards/db")]
    assert all(auth == "Bearer glsa_secret" for _, p, _, auth in FakeGrafana.calls
               if p.startswith("/api"))
    source = FakeGrafana.calls[1][2]
    assert source["jsonData"]["sigV4Auth"] is True and source["isDefault"] is True
    assert source["url"].endswith("/workspaces/ws-1")
    posted = FakeGrafana.calls[4][2]
    assert posted["overwrite"] is True and posted["folderUid"] == "kvcache"
    assert posted["dashboard"]["id"] is None
    assert _answer()["Status"] == "SUCCESS"


def test_update_replaces_the_existing_data_source(grafana, aws):
    FakeGrafana.existing = {"/api/datasources/uid/kvcache-amp", "/api/folders/kvcache"}
    _expect(aws, [{"uid": "kvcache-serving"}])
    provisioner.handler(_event(grafana, "Update"), None)
    methods = [(m, p) for m, p, *_ in FakeGrafana.calls if p.startswith("/api")]
    assert ("PUT", "/api/datasources/uid/kvcache-amp") in methods
    assert ("POST", "/api/folders") not in methods


def test_a_grafana_error_fails_the_resource_and_still_deletes_the_token(grafana, aws):
    FakeGrafana.fail_dashboards = True
    _expect(aws, [{"uid": "kvcache-serving"}])
    provisioner.handler(_event(grafana), None)
    answer = _answer()
    assert answer["Status"] == "FAILED" and "HTTP 500" in answer["Reason"]
    assert "glsa_secret" not in answer["Reason"]


def test_delete_never_blocks_the_stack(grafana, monkeypatch):
    def broken(*_args, **_kwargs):
        raise RuntimeError("no credentials")
    monkeypatch.setattr(provisioner.boto3, "client", broken)
    provisioner.handler(_event(grafana, "Delete"), None)
    assert _answer()["Status"] == "SUCCESS"
