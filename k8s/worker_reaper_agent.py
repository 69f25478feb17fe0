"""Takes workers whose pod is gone or not ready out of sglang-router 0.3.2, and puts a not-ready
one back once it is ready again (a sidecar in the router pod).

sglang-router 0.3.2 discovers workers from the Kubernetes API and keeps, per pod it added, the
pod's name, IP, phase and Ready condition; on a pod's deletion it removes only an entry equal
to the pod as it is then. A pod that turned not ready (a lost node, a failing readiness probe)
before its deletion never equals its entry, and the watcher drops DELETED events, so its URL
stays in the router for the router's life: the health check keeps failing
(KvcacheWorkerUnhealthy) and, once the VPC CNI gives the IP to another pod serving the same
port, the router sends that pod requests (docs/upstream.md, "sglang-router keeps deleted
workers").

Every --interval seconds this reads the router's workers (`GET /workers`), then lists the
endpoint's pods, and deletes (`DELETE /workers/{id}`) every worker on the discovery port whose
IP no pod of the selector holds any more, or only a pod being deleted: the same rule the
router applies to a ready pod. In that order, so a worker the router added from a pod event is
always in the later list. The router keeps a pod that turned not ready too, and its health
checks (`/health`) do not take out a stalled engine, which answers 200 while it produces
nothing (k8s/workers.py: its readiness probe fails on the stall): so a worker whose pod is not
ready is deleted as well and remembered, and added back (`POST /workers`) once its pod is
ready again, since the router's discovery, which still holds the pod's entry, never would.

Standard library only: it runs with the router image's Python from a ConfigMap
(k8s/worker_reaper.py renders it); the loopback tests run this same file.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import ssl
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

SERVICE_ACCOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"
TIMEOUT_S = 5.0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--router", required=True, help="the router's base URL (its loopback port)")
    ap.add_argument("--namespace", required=True)
    ap.add_argument("--selector", required=True, help="k=v[,k=v...]: the workers' pod labels")
    ap.add_argument("--port", type=int, required=True, help="the router's discovery port")
    ap.add_argument("--interval", type=float, default=5.0, help="seconds between sweeps")
    ap.add_argument("--key-file", help="the endpoint key (the router's control routes need it)")
    ap.add_argument("--api", help="the Kubernetes API (default: in-cluster, with the pod's "
                                  "service account)")
    ap.add_argument("--heartbeat", help="a file touched after every sweep, failed or not (the "
                                        "container's liveness probe reads its age)")
    return ap.parse_args(argv)


class Reaper:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.router = args.router.rstrip("/")
        self.last_error = ""
        self.benched: set[str] = set()    # removed while their pod was not ready
        if args.api:
            self.api, self.context = args.api.rstrip("/"), None
        else:
            host = os.environ["KUBERNETES_SERVICE_HOST"]
            host = f"[{host}]" if ":" in host else host
            self.api = f"https://{host}:{os.environ.get('KUBERNETES_SERVICE_PORT', '443')}"
            self.context = ssl.create_default_context(cafile=f"{SERVICE_ACCOUNT}/ca.crt")

    def _call(self, method: str, url: str, headers: dict[str, str],
              body: object = None) -> object:
        """JSON of a GET's answer; any other method's answer is only checked for success."""
        data = None if body is None else json.dumps(body).encode()
        if data is not None:
            headers = {**headers, "Content-Type": "application/json"}
        req = urllib.request.Request(url, data=data, method=method, headers=headers)
        context = self.context if url.startswith(self.api) else None
        with urllib.request.urlopen(req, timeout=TIMEOUT_S, context=context) as resp:
            body = resp.read()
        return json.loads(body) if method == "GET" else None

    def _router_headers(self) -> dict[str, str]:
        if not self.args.key_file:
            return {}
        with open(self.args.key_file) as f:
            return {"Authorization": f"Bearer {f.read().strip()}"}

    def _api_headers(self) -> dict[str, str]:
        if self.args.api:
            return {}
        with open(f"{SERVICE_ACCOUNT}/token") as f:   # re-read: bound tokens rotate
            return {"Authorization": f"Bearer {f.read().strip()}"}

    def pod_ips(self) -> tuple[set[str], set[str]]:
        """(IPs held by pods of the selector that are not being deleted and not finished, those
        of them whose pod is Ready)."""
        query = urllib.parse.urlencode({"labelSelector": self.args.selector})
        pods = self._call("GET", f"{self.api}/api/v1/namespaces/"
                          f"{urllib.parse.quote(self.args.namespace)}/pods?{query}",
                          self._api_headers())
        ips: set[str] = set()
        ready: set[str] = set()
        for pod in pods.get("items") or []:
            status = pod.get("status") or {}
            if (pod.get("metadata") or {}).get("deletionTimestamp") or \
                    status.get("phase") in ("Succeeded", "Failed"):
                continue
            held = {a["ip"] for a in status.get("podIPs") or [] if a.get("ip")}
            if status.get("podIP"):
                held.add(status["podIP"])
            ips |= held
            if any(c.get("type") == "Ready" and c.get("status") == "True"
                   for c in status.get("conditions") or []):
                ready |= held
        return ips, ready

    def sweep(self) -> list[str]:
        """One pass; the URLs it removed."""
        headers = self._router_headers()
        workers = (self._call("GET", f"{self.router}/workers", headers) or {}).get("workers")
        live, ready = self.pod_ips()    # after the router's list: see the module's docstring
        removed = []
        for w in workers or []:
            url = urllib.parse.urlsplit(w.get("url", ""))
            if url.port != self.args.port or url.hostname in ready or not w.get("id"):
                continue
            self._call("DELETE", f"{self.router}/workers/"
                       f"{urllib.parse.quote(str(w['id']), safe='')}", headers)
            removed.append(w["url"])
            if url.hostname in live:
                self.benched.add(w["url"])
                log(event="removed", worker=w["url"], reason="its pod is not ready")
            else:
                log(event="removed", worker=w["url"], reason="no live pod holds its IP")
        listed = {w.get("url") for w in workers or []}
        for back in sorted(self.benched):
            host = urllib.parse.urlsplit(back).hostname
            if host not in live:
                self.benched.discard(back)       # gone: the router's discovery adds its successor
            elif host in ready and back not in listed:
                self._call("POST", f"{self.router}/workers", headers, {"url": back})
                self.benched.discard(back)
                log(event="added back", worker=back, reason="its pod is ready again")
        return removed

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                self.sweep()
                if self.last_error:
                    log(event="recovered")
                self.last_error = ""
            except (OSError, ValueError, KeyError, urllib.error.URLError) as exc:
                error = f"{type(exc).__name__}: {exc}"
                if error != self.last_error:   # one line per new failure, not per sweep
                    log(event="sweep failed", error=error)
                self.last_error = error
            if self.args.heartbeat:
                with open(self.args.heartbeat, "w"):
                    pass
            stop.wait(self.args.interval)


def log(**fields: object) -> None:
    print(json.dumps({"time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), **fields}),
          flush=True)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    Reaper(args).run(stop)
    return 0


if __name__ == "__main__":
    sys.exit(main())
