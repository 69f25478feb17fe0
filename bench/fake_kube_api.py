"""A minimal Kubernetes API on 127.0.0.1 for pod discovery on loopback: list and watch of pods
in one namespace, as kube-rs's watcher (the routers' `--service-discovery`) uses them (GET
.../pods, then GET .../pods?watch=true&resourceVersion=N, newline-delimited watch events), and
a list with an equality `labelSelector` (k8s/worker_reaper_agent.py). From the fault drills
(../shared/drills/faults/fake_kube_api.py). Pods change the way the kubelet and the Deployment
controller change them: `add` (Pending, no IP), `set` (Running, an IP, Ready true/false),
`terminate` (deletionTimestamp set, as a graceful delete does), `delete` (the object gone:
DELETED); each change is one ADDED/MODIFIED/DELETED event with a new resourceVersion.
`kubeconfig(path)` writes a kubeconfig that points a client here (plain HTTP, a dummy token).
"""
from __future__ import annotations

import copy
import json
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class FakeKubeApi:
    def __init__(self, namespace: str, labels: dict[str, str]) -> None:
        self.namespace, self.labels = namespace, dict(labels)
        self.pods: dict[str, dict] = {}
        self.rv = 100
        self.events: list[tuple[int, str, dict]] = []   # (rv, type, object)
        self.cond = threading.Condition()
        self.requests: list[tuple[float, str]] = []
        api = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a: Any) -> None:
                pass

            def do_GET(self) -> None:  # noqa: N802
                api.requests.append((time.time(), self.path))
                u = urllib.parse.urlsplit(self.path)
                q = dict(urllib.parse.parse_qsl(u.query))
                if not u.path.endswith("/pods"):
                    self._json(404, {"kind": "Status", "apiVersion": "v1", "status": "Failure",
                                     "message": "not found", "reason": "NotFound", "code": 404})
                    return
                if q.get("watch") in ("true", "1"):
                    self._watch(int(q.get("resourceVersion") or 0),
                                float(q.get("timeoutSeconds") or 290))
                    return
                wanted = dict(kv.split("=", 1) for kv in q.get("labelSelector", "").split(",")
                              if "=" in kv)
                with api.cond:
                    items = [copy.deepcopy(p) for p in api.pods.values()
                             if wanted.items() <= p["metadata"]["labels"].items()]
                    rv = api.rv
                self._json(200, {"kind": "PodList", "apiVersion": "v1",
                                 "metadata": {"resourceVersion": str(rv)}, "items": items})

            def _json(self, code: int, obj: Any) -> None:
                body = json.dumps(obj).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _watch(self, since: int, timeout: float) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                end = time.monotonic() + min(timeout, 290)
                sent = since
                try:
                    while time.monotonic() < end and not api.closed:
                        with api.cond:
                            pending = [e for e in api.events if e[0] > sent]
                            if not pending:
                                api.cond.wait(0.5)
                                pending = [e for e in api.events if e[0] > sent]
                        for rv, kind, obj in pending:
                            line = json.dumps({"type": kind, "object": obj}).encode() + b"\n"
                            self.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))
                            self.wfile.flush()
                            sent = rv
                    self.wfile.write(b"0\r\n\r\n")
                except OSError:
                    pass
                self.close_connection = True

        self.closed = False
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.1},
                         daemon=True).start()

    # ------------------------------------------------------------------ pod changes

    def _emit(self, kind: str, pod: dict) -> None:
        self.rv += 1
        pod["metadata"]["resourceVersion"] = str(self.rv)
        self.events.append((self.rv, kind, copy.deepcopy(pod)))
        self.cond.notify_all()

    def add(self, name: str) -> None:
        """A new pod, scheduled but not started (no IP yet)."""
        with self.cond:
            pod = {"apiVersion": "v1", "kind": "Pod",
                   "metadata": {"name": name, "namespace": self.namespace, "uid": f"uid-{name}",
                                "labels": dict(self.labels)},
                   "spec": {"containers": [{"name": "vllm"}]},
                   "status": {"phase": "Pending", "conditions": [
                       {"type": "Ready", "status": "False"}]}}
            self.pods[name] = pod
            self._emit("ADDED", pod)

    def set(self, name: str, *, ip: str | None = None, phase: str | None = None,
            ready: bool | None = None) -> None:
        with self.cond:
            pod = self.pods[name]
            st = pod["status"]
            if ip is not None:
                st["podIP"] = ip
                st["podIPs"] = [{"ip": ip}]
            if phase is not None:
                st["phase"] = phase
            if ready is not None:
                st["conditions"] = [{"type": "Ready", "status": "True" if ready else "False"}]
            self._emit("MODIFIED", pod)

    def terminate(self, name: str, grace_s: int) -> None:
        """A graceful delete as the API server records it: deletionTimestamp set, the status
        untouched (the kubelet reports the pod not ready in a later update: `set(ready=False)`).
        The endpoints controller takes the pod out of the Service at this moment."""
        with self.cond:
            pod = self.pods[name]
            pod["metadata"]["deletionTimestamp"] = time.strftime(
                "%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + grace_s))
            pod["metadata"]["deletionGracePeriodSeconds"] = grace_s
            self._emit("MODIFIED", pod)

    def delete(self, name: str) -> None:
        with self.cond:
            pod = self.pods.pop(name)
            self._emit("DELETED", pod)

    def close(self) -> None:
        self.closed = True
        with self.cond:
            self.cond.notify_all()
        self.server.shutdown()
        self.server.server_close()

    def kubeconfig(self, path: str) -> str:
        text = f"""apiVersion: v1
kind: Config
clusters:
- name: drill
  cluster:
    server: http://127.0.0.1:{self.port}
contexts:
- name: drill
  context:
    cluster: drill
    user: drill
    namespace: {self.namespace}
current-context: drill
users:
- name: drill
  user:
    token: drill-token
"""
        with open(path, "w") as f:
            f.write(text)
        return path
