"""TLS by default inside the VPC (k8s/certificate.py), as rendered: the certificate Job's own
script (the rendered text, with the router image's `openssl`) against a stand-in for the
Kubernetes API, then the real front (HAProxy, the rendered config and TLS words) with the
certificate it stored. A client that trusts the certificate written for clients (the S3 copy)
completes a chat through the front, by the Service's name and by an NLB's; one that does not,
fails. The key is in the Secret only: no manifest, no log line, no S3 copy carries it."""
from __future__ import annotations

import base64
import contextlib
import copy
import http.server
import json
import os
import socket
import ssl
import subprocess
import tempfile
import threading
from pathlib import Path

import cdk8s
import pytest

from bench.loopback import FakeWorkerPool, FrontProcess, RouterStartError, port_clash
from config.endpoint_spec import parse_endpoint
from k8s.certificate import API_ENV, PUBLIC_FILE, SECRET_KEYS, TOKEN_ENV
from k8s.router_front import FRONT_CONFIG, TLS_ENV
from k8s.serving import build_charts
from tests.k8s.test_charts import SEED, _env, _facts

S3_URI = "s3://client-certs/kvcache"


# The longest name config/endpoint_spec.py admits: its Service's name passes X.509's 64
# characters for a common name (the CN a previous Job wrote, and OpenSSL refused).
LONGEST_NAME = "e" * 39 + "x"


def _render(env: str, name: str | None = None, **listener) -> list[dict]:
    cfg = _env(env, **({"listener": listener} if listener else {}))
    raw = copy.deepcopy(SEED)
    if name:
        raw["metadata"]["name"] = name
    raw["spec"]["tlsConfig"] = {"tlsCertificateOutputS3Uri": S3_URI}
    spec = parse_endpoint(cfg.name, "endpoints/test.yaml", raw)
    return [d for chart in build_charts(cdk8s.App(), cfg, (spec,), _facts(cfg, spec))
            for d in chart.to_json()]


class _Api(http.server.BaseHTTPRequestHandler):
    """The Kubernetes API as the Job's script uses it: one Secret, one Deployment patch."""

    secret: dict = {}
    patches: list = []

    def log_message(self, *args) -> None:
        pass

    def _json(self, code: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _body(self) -> dict:
        return json.loads(self.rfile.read(int(self.headers["Content-Length"])))

    def do_GET(self) -> None:   # noqa: N802
        assert self.headers["Authorization"] == "Bearer job-token"
        self._json(200, self.secret)

    def do_PUT(self) -> None:   # noqa: N802
        type(self).secret = self._body()
        self._json(200, self.secret)

    def do_PATCH(self) -> None:   # noqa: N802
        self.patches.append((self.path, self._body()))
        self._json(200, {})


def _make_certificate(job: dict, out: Path) -> tuple[dict, str]:
    """Run the Job's make step as rendered; (the Secret it stored, its output)."""
    step = job["spec"]["template"]["spec"]["initContainers"][0]
    _Api.secret = {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
                   "metadata": {"name": "x", "resourceVersion": "1"}}
    _Api.patches = []
    api = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Api)
    threading.Thread(target=api.serve_forever, kwargs={"poll_interval": 0.05},
                     daemon=True).start()
    token = out / "token"
    token.write_text("job-token")
    env = {**os.environ, **{e["name"]: e["value"] for e in step["env"]},
           API_ENV: f"http://127.0.0.1:{api.server_address[1]}", TOKEN_ENV: str(token),
           "PUBLIC_OUT": str(out / "public.crt")}
    try:
        run = subprocess.run(step["command"], env=env, capture_output=True, text=True,
                             timeout=60)
    finally:
        api.shutdown()
    assert run.returncode == 0, run.stderr
    return _Api.secret, run.stdout + run.stderr


def _chat(port: int, name: str, context: ssl.SSLContext) -> int:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw, \
            context.wrap_socket(raw, server_hostname=name) as s:
        body = json.dumps({"model": "fake-model", "messages": [{"role": "user", "content": "hi"}],
                           "max_tokens": 4}).encode()
        s.sendall(f"POST /v1/chat/completions HTTP/1.1\r\nHost: {name}\r\nContent-Type: "
                  f"application/json\r\nContent-Length: {len(body)}\r\nConnection: close\r\n"
                  "\r\n".encode() + body)
        head = b""
        while b"\r\n" not in head:
            head += s.recv(4096)
        return int(head.split(b" ", 2)[1])


@pytest.mark.parametrize("name", [SEED["metadata"]["name"], LONGEST_NAME])
def test_a_client_with_the_written_certificate_chats_through_the_front_and_one_without_fails(
        name):
    docs = _render("dev", name)
    assert len(f"{name}-router.kvcache-serving.svc.cluster.local") > 64 or name != LONGEST_NAME
    job = next(d for d in docs if d["kind"] == "Job")
    config = next(d for d in docs if d["kind"] == "ConfigMap"
                  and d["metadata"]["name"].endswith("-router-front"))["data"][FRONT_CONFIG]
    router = next(d for d in docs if d["kind"] == "Deployment"
                  and d["metadata"]["name"].endswith("-router"))
    front = next(c for c in router["spec"]["template"]["spec"]["containers"]
                 if c["name"] == "front")
    tls_words = next(e["value"] for e in front["env"] if e["name"] == TLS_ENV)
    upload = job["spec"]["template"]["spec"]["containers"][0]
    assert upload["command"][-2:] == [PUBLIC_FILE, f"{S3_URI}/{name}.pem"]
    names = next(e["value"] for e in job["spec"]["template"]["spec"]["initContainers"][0]["env"]
                 if e["name"] == "DNS_NAMES").split()
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        out = Path(tmp)
        secret, log = _make_certificate(job, out)
        assert set(secret["data"]) == set(SECRET_KEYS)
        pem = base64.b64decode(secret["data"]["front.pem"])
        key = pem.split(b"-----END CERTIFICATE-----", 1)[1].strip()
        assert b"PRIVATE KEY" in key
        public = (out / "public.crt").read_bytes()           # what goes to S3 for clients
        assert public == base64.b64decode(secret["data"]["tls.crt"])
        assert b"PRIVATE" not in public and key not in public
        assert "PRIVATE" not in log and key.decode() not in log
        (out / "front.pem").write_bytes(pem)
        pool = stack.enter_context(FakeWorkerPool(1))
        worker_port = int(pool.urls[0].rsplit(":", 1)[1])
        os.environ[TLS_ENV] = tls_words.replace(tls_words.split()[-1], str(out / "front.pem"))
        try:
            for attempt in range(3):   # again on a fresh port if another process took it
                try:
                    proc = stack.enter_context(FrontProcess(config, worker_port))
                    break
                except RouterStartError as exc:
                    if not port_clash(exc) or attempt == 2:
                        raise
        finally:
            del os.environ[TLS_ENV]
        trusted = ssl.create_default_context(cafile=str(out / "public.crt"))
        nlb = names[-1].replace("*", "k8s-kvcache-abc123")
        for name in (names[0], nlb):                          # the Service's, and an NLB's
            assert _chat(proc.port, name, trusted) == 200
        with pytest.raises(ssl.SSLCertVerificationError):
            _chat(proc.port, names[0], ssl.create_default_context())
        with pytest.raises(ssl.SSLCertVerificationError):     # a name it does not carry
            _chat(proc.port, "example.com", trusted)


@pytest.mark.parametrize("env", ["dev", "china"])
def test_the_key_is_in_no_manifest_and_the_job_may_touch_only_its_secret(env):
    docs = _render(env)
    text = json.dumps(docs)
    assert "PRIVATE KEY" not in text and "BEGIN CERTIFICATE" not in text
    secret = next(d for d in docs if d["kind"] == "Secret" and d["metadata"]["name"]
                  .endswith("-router-tls"))
    assert "data" not in secret and "stringData" not in secret
    role = next(d for d in docs if d["kind"] == "Role" and d["metadata"]["name"]
                .endswith("-router-cert"))
    rules = {r["resources"][0]: r for r in role["rules"]}
    assert rules["secrets"]["resourceNames"] == [secret["metadata"]["name"]]
    assert set(rules["secrets"]["verbs"]) <= {"get", "update"}
    assert rules["deployments"]["verbs"] == ["patch"]
    renewal = next(d for d in docs if d["kind"] == "CronJob")
    job = next(d for d in docs if d["kind"] == "Job")
    assert renewal["spec"]["jobTemplate"]["spec"] == job["spec"]


def test_an_environment_may_opt_out_and_an_acm_certificate_still_serves():
    """generatedCertificate false: no certificate unless the file asks for its S3 copy."""
    cfg = _env("dev", listener={"generatedCertificate": False})
    spec = parse_endpoint(cfg.name, "endpoints/test.yaml", copy.deepcopy(SEED))
    docs = [d for chart in build_charts(cdk8s.App(), cfg, (spec,), _facts(cfg, spec))
            for d in chart.to_json()]
    assert not any(d["kind"] == "Job" for d in docs)
    raw = copy.deepcopy(SEED)
    arn = f"arn:{cfg.facts.partition}:acm:{cfg.region}:{cfg.account}:certificate/abc"
    raw["spec"]["tlsConfig"] = {"customCertificateConfig": {"acmArn": arn},
                                "tlsCertificateOutputS3Uri": S3_URI}
    spec = parse_endpoint(cfg.name, "endpoints/test.yaml", raw)
    docs = [d for chart in build_charts(cdk8s.App(), cfg, (spec,), _facts(cfg, spec))
            for d in chart.to_json()]
    assert not any(d["kind"] == "Job" for d in docs)          # the NLB's ACM listener serves
    svc = next(d for d in docs if d["kind"] == "Service"
               and d["spec"].get("type") == "LoadBalancer")
    assert svc["metadata"]["annotations"][
        "service.beta.kubernetes.io/aws-load-balancer-ssl-cert"] == arn
