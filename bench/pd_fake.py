"""A fake vLLM worker speaking NixlConnector's P/D protocol, on 127.0.0.1, for the loopback proof
of vllm-router's P/D mode (tests/e2e/test_pd.py).

What vLLM does, and so what this fake does (vLLM's NixlConnector, `request_finished` and
`get_num_new_matched_tokens`; the proxy contract in its docs/features/nixl_connector_usage.md):
- a request whose body carries `kv_transfer_params.do_remote_decode: true` is a prefill: the
  engine computes the prompt's KV, keeps its blocks for the decode worker to read (a lease),
  and answers one token with `kv_transfer_params` naming where they are (`do_remote_prefill:
  true`, `remote_engine_id`, `remote_block_ids`, `remote_host`, `remote_port`, `tp_size`);
- a request carrying `kv_transfer_params.do_remote_prefill: true` is a decode: the engine reads
  those blocks (over NIXL) and generates; with `kv_load_failure_policy: fail` a read that fails
  ends the request with an error;
- a request with no `kv_transfer_params` is served whole, prefill included (what the decode-only
  path relies on).
Every request is recorded (path, body, Authorization header), so a test asserts what the router
sent. Standard library only; bounded; stopped by its context manager.
"""
from __future__ import annotations

import http.server
import json
import threading
import uuid
from typing import Any

LOOPBACK = "127.0.0.1"


class PDWorker:
    """One fake worker: `role` names it in answers (any worker answers any request, as vLLM's
    kv_both does). `blocks_gone`: a decode that names unknown blocks fails as vLLM's `fail`
    policy makes it (HTTP 500)."""

    def __init__(self, role: str, name: str, model: str = "fake-model") -> None:
        self.role, self.name, self.model = role, name, model
        self.engine_id = f"engine-{name}-{uuid.uuid4().hex[:8]}"
        self.seen: list[dict[str, Any]] = []
        self.leased: set[int] = set()
        self._lock = threading.Lock()
        self._server: http.server.ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://{LOOPBACK}:{self._server.server_address[1]}"

    def __enter__(self) -> "PDWorker":
        worker = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True     # (FACTS.md: the 40 ms delayed-ACK trap)

            def log_message(self, *args: Any) -> None:
                pass

            def _send(self, status: int, body: Any, ctype: str = "application/json") -> None:
                data = body if isinstance(body, bytes) else json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:   # noqa: N802
                if self.path in ("/health", "/liveness", "/readiness"):
                    self._send(200, {})
                elif self.path == "/v1/models":
                    self._send(200, {"object": "list", "data": [
                        {"id": worker.model, "object": "model"}]})
                else:
                    self._send(404, {"error": "not found"})

            def do_POST(self) -> None:  # noqa: N802
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length)
                if not self.path.startswith(("/v1/chat/completions", "/v1/completions")) or \
                        self.path.endswith(("/render", "/tokenize")):
                    self._send(404, {"error": "not found"})
                    return
                body = json.loads(raw or b"{}")
                with worker._lock:
                    worker.seen.append({"path": self.path, "body": body,
                                        "authorization": self.headers.get("Authorization"),
                                        "request_id": self.headers.get("X-Request-Id")})
                params = body.get("kv_transfer_params") or {}
                if params.get("do_remote_decode"):
                    self._prefill(body)
                elif params.get("do_remote_prefill"):
                    self._decode(body, params)
                else:
                    self._answer(body, {"served": "whole", "by": worker.name})

            def _prefill(self, body: dict) -> None:
                blocks = [hash((worker.name, len(worker.seen), i)) & 0xFFFF for i in range(3)]
                with worker._lock:
                    worker.leased.update(blocks)
                params = {"do_remote_prefill": True, "do_remote_decode": False,
                          "remote_engine_id": worker.engine_id, "remote_block_ids": blocks,
                          "remote_host": LOOPBACK, "remote_port": 5600, "tp_size": 1}
                self._send(200, {"id": "cmpl-p", "object": "chat.completion",
                                 "model": worker.model, "choices": [{
                                     "index": 0, "finish_reason": "length",
                                     "message": {"role": "assistant", "content": "x"}}],
                                 "usage": {"prompt_tokens": 10, "completion_tokens": 1,
                                           "total_tokens": 11},
                                 "kv_transfer_params": params})

            def _decode(self, body: dict, params: dict) -> None:
                owner = next((w for w in PDWorker.registry
                              if w.engine_id == params.get("remote_engine_id")), None)
                blocks = set(params.get("remote_block_ids") or ())
                if owner is None or not blocks <= owner.leased:
                    # kv_load_failure_policy fail: the request ends with an error
                    self._send(500, {"error": {"message": "KV load failed",
                                               "type": "InternalServerError"}})
                    return
                with owner._lock:
                    owner.leased -= blocks
                self._answer(body, {"served": "decode", "by": worker.name,
                                    "from": params.get("remote_engine_id")})

            def _answer(self, body: dict, what: dict) -> None:
                text = json.dumps(what)
                if body.get("stream"):
                    chunks = [{"id": "cmpl-d", "object": "chat.completion.chunk",
                               "model": worker.model, "choices": [{
                                   "index": 0, "delta": {"content": text},
                                   "finish_reason": None}]},
                              {"id": "cmpl-d", "object": "chat.completion.chunk",
                               "model": worker.model, "choices": [{
                                   "index": 0, "delta": {}, "finish_reason": "stop"}]}]
                    data = b"".join(b"data: " + json.dumps(c).encode() + b"\n\n"
                                    for c in chunks) + b"data: [DONE]\n\n"
                    self._send(200, data, "text/event-stream")
                    return
                self._send(200, {"id": "cmpl-d", "object": "chat.completion",
                                 "model": worker.model, "choices": [{
                                     "index": 0, "finish_reason": "stop",
                                     "message": {"role": "assistant", "content": text}}],
                                 "usage": {"prompt_tokens": 10, "completion_tokens": 2,
                                           "total_tokens": 12}})

        self._server = http.server.ThreadingHTTPServer((LOOPBACK, 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        PDWorker.registry.append(self)
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self in PDWorker.registry:
            PDWorker.registry.remove(self)

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    registry: list["PDWorker"] = []


_PD_DROP = {"--service-discovery": 0, "--prefill-selector": -1, "--decode-selector": -1,
            "--service-discovery-namespace": 1, "--service-discovery-port": 1}
_PD_SET = ("--host", "--port", "--prometheus-host", "--prometheus-port")


def localize_pd_args(args: list[str], prefill: list[str], decode: list[str], port: int,
                     prometheus_port: int) -> list[str]:
    """A rendered P/D router's args that run here: discovery by selectors becomes static
    `--prefill URL` / `--decode URL` lists, the addresses and ports are loopback's; every other
    flag passes through unchanged, in order."""
    wanted = {"--host": LOOPBACK, "--port": str(port), "--prometheus-host": LOOPBACK,
              "--prometheus-port": str(prometheus_port)}
    out, i = [], 0
    while i < len(args):
        tok = args[i]
        if tok in _PD_DROP:
            i += 1
            if _PD_DROP[tok] == -1:
                while i < len(args) and not args[i].startswith("--"):
                    i += 1
            else:
                i += _PD_DROP[tok]
            continue
        if tok in wanted:
            out += [tok, wanted.pop(tok)]
            i += 2
            continue
        out.append(tok)
        i += 1
    for flag, value in wanted.items():
        out += [flag, value]
    for url in prefill:
        out += ["--prefill", url]
    for url in decode:
        out += ["--decode", url]
    return out
