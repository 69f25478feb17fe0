"""The endpoint API key through each real router, started by the rendered Deployment's own
command (the shell that appends `--api-key` from the secret file) and args, in front of a
worker that checks `Authorization: Bearer` on /v1 routes as vLLM's --api-key does.

vllm-router 0.1.17 does not check clients itself: the worker's 401 reaches the client; the
router's own calls (cache_aware's render/tokenize) carry the router's key. sglang-router 0.3.2
checks the client's key itself (a client without it never reaches a worker) and sends its own
key to the worker. In the pod the front checks the key before either router sees the request
(tests/e2e/test_router_front.py); these are the routers alone, what vLLM's check backs up.
"""
from __future__ import annotations

import http.server
import json
import os
import threading
from pathlib import Path

import pytest
import requests

from k8s.secret_fetch import API_KEY_FILE
from tests.e2e.conftest import _container
from bench.loopback import (
    RouterProcess, free_port, localize_router_args, router_binary, router_launch,
)

pytestmark = pytest.mark.e2e
KEY = "k3y-from-secrets-manager"


class _VllmLike(http.server.BaseHTTPRequestHandler):
    """vLLM's AuthenticationMiddleware: /v1/* needs the Bearer key; /health etc. do not."""

    disable_nagle_algorithm = True
    seen: list = []

    def log_message(self, *args) -> None:
        pass

    def _reply(self, code: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _authorized(self) -> bool:
        auth = self.headers.get("Authorization")
        self.seen.append((self.path, auth))
        return not self.path.startswith("/v1") or auth == f"Bearer {KEY}"

    def do_GET(self) -> None:
        if not self._authorized():
            return self._reply(401, {"error": "Unauthorized"})
        self._reply(200, {"object": "list", "data": [{"id": "m"}]})

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if not self._authorized():
            return self._reply(401, {"error": "Unauthorized"})
        if self.path.endswith("/render") or self.path == "/tokenize":
            return self._reply(200, {"tokens": [11, 22, 33], "count": 3, "max_model_len": 4096})
        self._reply(200, {"id": "x", "object": "chat.completion", "model": "m", "choices": [{
            "index": 0, "message": {"role": "assistant", "content": "ok"},
            "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}})


@pytest.fixture()
def worker():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _VllmLike)
    _VllmLike.seen = []
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                              daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


@pytest.mark.parametrize("router", ["sglang-router", "vllm-router"])
def test_only_clients_with_the_key_get_answers(worker, tmp_path, router):
    """prefixaware on each implementation (sglang-router is the default)."""
    container = _container("prefixaware", None, "Deployment", "-router", router)
    key_file = tmp_path / "api-key"
    key_file.write_text(KEY)
    shell, flag, script, name = container["command"]
    assert API_KEY_FILE in script and name == router and f"exec {router} " in script
    args = localize_router_args(container["args"], [worker], free_port(), free_port())
    _, args = router_launch(router, args)   # sglang-router's `launch` subcommand first
    # the rendered command, with the secret volume's path moved to this machine
    wrapped = [flag, script.replace(API_KEY_FILE, str(key_file)), name, *args]
    body = {"model": "m", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4}
    env = {**os.environ, "PATH": f"{Path(router_binary(router)).parent}:{os.environ['PATH']}"}
    with RouterProcess(wrapped, binary=shell, expect_workers=1, env=env,
                       api_key=KEY) as process:
        url = f"{process.url}/v1/chat/completions"
        assert requests.post(url, json=body, timeout=10).status_code == 401
        assert requests.post(url, json=body, timeout=10, headers={
            "Authorization": "Bearer wrong"}).status_code == 401
        ok = requests.post(url, json=body, timeout=10, headers={"Authorization": f"Bearer {KEY}"})
        assert ok.status_code == 200, ok.text
        log = process.log_path.read_text()
    chats = [auth for path, auth in _VllmLike.seen if path == "/v1/chat/completions"]
    renders = [auth for path, auth in _VllmLike.seen if path.endswith("/render")]
    if router == "sglang-router":   # it turned the keyless and wrong-key clients away itself
        assert chats == [f"Bearer {KEY}"] and not renders, _VllmLike.seen
    else:                           # the worker turned them away; renders carry the router's key
        assert len(chats) == 3 and renders and set(renders) == {f"Bearer {KEY}"}, _VllmLike.seen
    assert KEY not in log                                   # never in the router's log
