"""`python -m tools smoke` against a router stand-in on 127.0.0.1: one streamed request, and a
one-line diagnosis for each way it fails."""
from __future__ import annotations

import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tools.__main__ import main

KEY = "k3y-for-the-test"


class _Router(BaseHTTPRequestHandler):
    status = 200
    disable_nagle_algorithm = True

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        seen.append((self.path, self.headers.get("Authorization"), body))
        code = 401 if self.headers.get("Authorization") != f"Bearer {KEY}" else self.status
        self.send_response(code)
        if code != 200:
            payload = json.dumps({"error": {"message": f"status {code}"}}).encode()
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)
            return
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        for word in ("Hel", "lo"):
            self.wfile.write(f"data: {json.dumps({'choices': [{'delta': {'content': word}}]})}"
                             "\n\n".encode())
        self.wfile.write(b"data: [DONE]\n\n")

    def log_message(self, *args):
        pass


seen: list = []


@pytest.fixture
def router():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Router)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                     daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()
    server.server_close()
    _Router.status = 200
    seen.clear()


def _smoke(url, monkeypatch, key=KEY):
    monkeypatch.setenv("SMOKE_KEY", key)
    return main(["smoke", "--env", "dev", "--url", url, "--api-key-env", "SMOKE_KEY",
                 "--timeout", "5"])


def test_a_streamed_answer_is_ok(router, monkeypatch, capsys):
    assert _smoke(router, monkeypatch) == 0
    assert capsys.readouterr().out.startswith("ok: llama-8b-intel-routing")
    ((path, auth, body),) = seen
    assert path == "/v1/chat/completions" and auth == f"Bearer {KEY}" and body["stream"]
    from config import resolve_environment
    from k8s.serving import load_endpoints
    from tests.conftest import ROOT, context_for
    (spec,) = load_endpoints(resolve_environment(context_for(env="dev")), ROOT)
    assert body["model"] == spec.model_name   # what vLLM serves (--served-model-name)


@pytest.mark.parametrize("status, key, says", [
    (200, "wrong", "refused the key (HTTP 401)"),
    (404, KEY, "modelName must be what vLLM serves"),
    (503, KEY, "no worker answered (HTTP 503)"),
])
def test_each_failure_is_one_line_naming_its_cause(router, monkeypatch, capsys, status, key,
                                                    says):
    _Router.status = status
    assert _smoke(router, monkeypatch, key) == 1
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and says in err and KEY not in err


def test_an_unreachable_load_balancer_says_where_it_answers(monkeypatch, capsys):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert _smoke(f"http://127.0.0.1:{port}", monkeypatch) == 1
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "inside the VPC" in err


def test_https_with_the_endpoints_own_certificate(monkeypatch, capsys, tmp_path):
    """The front's own certificate (k8s/certificate.py): trusted with --ca-file, one line
    saying where to get it without."""
    import ssl
    import subprocess

    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                    "ec_paramgen_curve:P-256", "-nodes", "-keyout", str(tmp_path / "key"),
                    "-out", str(tmp_path / "crt"), "-days", "1", "-subj", "/CN=localhost",
                    "-addext", "subjectAltName=DNS:localhost"], check=True, capture_output=True)
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Router)
    tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    tls.load_cert_chain(tmp_path / "crt", tmp_path / "key")
    server.socket = tls.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                     daemon=True).start()
    url = f"https://localhost:{server.server_port}"
    monkeypatch.setenv("SMOKE_KEY", KEY)
    try:
        args = ["smoke", "--env", "dev", "--url", url, "--api-key-env", "SMOKE_KEY",
                "--timeout", "5"]
        assert main([*args, "--ca-file", str(tmp_path / "crt")]) == 0
        assert main(args) == 1
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0 and "--ca-file" in err and "router-tls" in err
    finally:
        server.shutdown()
        server.server_close()
        seen.clear()
