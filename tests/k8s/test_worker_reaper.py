"""The worker reaper beside sglang-router (k8s/worker_reaper.py) and the front's own model list,
as rendered; the reaper's rule against a fake API and a fake router. The loopback drill with the
real router is tests/e2e/test_router_discovery.py."""
from __future__ import annotations

import http.server
import json
import threading

import pytest

from bench.fake_kube_api import FakeKubeApi
from config.endpoint_spec import arg_value
from k8s import worker_reaper_agent as agent
from k8s.secret_fetch import API_KEY_FILE
from k8s.worker_reaper import REAPER_DIR, REAPER_SCRIPT, agent_hash, agent_text
from tests.k8s.test_router_front_config import _containers, _pod


def _pod_spec(strategy: str) -> dict:
    return _pod(strategy=strategy)["deployment"]["spec"]["template"]


def test_sglang_routers_discovery_has_the_reaper_on_the_same_pods():
    pod = _pod(strategy="prefixaware")
    containers = _containers(pod)
    router, reaper = containers["router"]["args"], containers["worker-reaper"]
    assert containers["router"]["command"][-1] == "sglang-router"
    selector = router[router.index("--selector") + 1:]
    selector = selector[:next(i for i, a in enumerate(selector) if a.startswith("--"))]
    assert arg_value(reaper["args"], "--selector") == ",".join(sorted(selector))
    for mine, theirs in (("--namespace", "--service-discovery-namespace"),
                         ("--port", "--service-discovery-port")):
        assert arg_value(reaper["args"], mine) == arg_value(router, theirs)
    assert arg_value(reaper["args"], "--router").endswith(f":{arg_value(router, '--port')}")
    # the key the router checks on its control routes, from the router's own mount
    key = arg_value(reaper["args"], "--key-file")
    assert key == API_KEY_FILE
    assert any(key.startswith(m["mountPath"]) for m in reaper["volumeMounts"])
    # the script the ConfigMap carries is this repository's agent, and a change rolls the pods
    assert reaper["command"][-1] == f"{REAPER_DIR}/{REAPER_SCRIPT}"
    template = _pod_spec("prefixaware")
    assert template["metadata"]["annotations"]["kvcache.io/worker-reaper"] == agent_hash()
    assert agent_text().startswith('"""')


@pytest.mark.parametrize("strategy", ["roundrobin", "kvaware"])
def test_no_reaper_where_the_router_needs_none(strategy):
    """vllm-router 0.1.17 keys discovered pods by name; kvaware lists its workers statically."""
    assert "worker-reaper" not in _containers(_pod(strategy=strategy))


def test_only_sglang_routers_front_lists_the_models_itself():
    """The names it lists are checked with the OpenAI client on loopback
    (tests/e2e/test_router_discovery.py)."""
    sglang, vllm = _pod(strategy="prefixaware")["config"], _pod(strategy="roundrobin")["config"]
    answer = [line for line in sglang.splitlines() if "path /v1/models" in line]
    assert len(answer) == 1 and "http-request return status 200" in answer[0]
    # after the key check: a client without the key gets 401, not the list
    assert sglang.index("deny deny_status 401") < sglang.index(answer[0])
    assert not [line for line in vllm.splitlines() if "path /v1/models" in line]


class _Router(http.server.BaseHTTPRequestHandler):
    workers: list = []
    deleted: list = []
    added: list = []

    def log_message(self, *args) -> None:
        pass

    def do_GET(self) -> None:   # noqa: N802
        body = json.dumps({"workers": self.workers}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:   # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.added.append((self.path, body))
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_DELETE(self) -> None:   # noqa: N802
        self.deleted.append(self.path)
        self.send_response(202)
        self.send_header("Content-Length", "0")
        self.end_headers()


def test_the_reaper_removes_workers_whose_pod_is_gone_or_not_ready_and_adds_them_back():
    labels = {"app": "w"}
    api = FakeKubeApi("ns", labels)
    router = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Router)
    threading.Thread(target=router.serve_forever, kwargs={"poll_interval": 0.05},
                     daemon=True).start()
    try:
        for name, ip, ready in (("ready", "10.0.0.1", True), ("not-ready", "10.0.0.2", False),
                                ("deleting", "10.0.0.3", True), ("v6", "fd00::4", True)):
            api.add(name)
            api.set(name, ip=ip, phase="Running", ready=ready)
        api.terminate("deleting", 30)
        api.add("finished")
        api.set("finished", ip="10.0.0.5", phase="Failed")
        _Router.workers = [{"id": f"id-{host}", "url": f"http://{host}:8000"} for host in
                           ("10.0.0.1", "10.0.0.2", "10.0.0.3", "[fd00::4]", "10.0.0.5",
                            "10.0.0.9")]
        _Router.workers.append({"id": "other-port", "url": "http://10.0.0.9:9000"})
        _Router.deleted = []
        reaper = agent.Reaper(agent.parse_args([
            "--router", f"http://127.0.0.1:{router.server_address[1]}", "--namespace", "ns",
            "--selector", "app=w", "--port", "8000", "--api", f"http://127.0.0.1:{api.port}"]))
        removed = reaper.sweep()
        # not ready (a stalled engine whose /health still answers), deleting, finished and
        # gone: removed; another port is not discovery's
        assert sorted(removed) == ["http://10.0.0.2:8000", "http://10.0.0.3:8000",
                                   "http://10.0.0.5:8000", "http://10.0.0.9:8000"]
        assert sorted(_Router.deleted) == ["/workers/id-10.0.0.2", "/workers/id-10.0.0.3",
                                           "/workers/id-10.0.0.5", "/workers/id-10.0.0.9"]
        _Router.workers = [w for w in _Router.workers if w["url"] not in removed]
        _Router.added, _Router.deleted = [], []
        assert reaper.sweep() == [] and _Router.added == []     # still not ready: left out
        api.set("not-ready", ready=True)      # the router's discovery would never add it back
        assert reaper.sweep() == []
        assert _Router.added == [("/workers", {"url": "http://10.0.0.2:8000"})]
        _Router.added = []
        assert reaper.sweep() == [] and _Router.added == []     # once
    finally:
        router.shutdown()
        api.close()


def test_the_liveness_probe_reads_the_heartbeat_the_agent_writes(tmp_path):
    """The rendered probe command, run on a heartbeat file the agent touched: fresh passes,
    older than the bound or missing fails."""
    import os
    import subprocess
    import sys
    import time

    from k8s.worker_reaper import HEARTBEAT, HEARTBEAT_STALE_S

    reaper = _containers(_pod(strategy="prefixaware"))["worker-reaper"]
    assert arg_value(reaper["args"], "--heartbeat") == HEARTBEAT
    probe = reaper["livenessProbe"]["exec"]["command"]
    beat = tmp_path / "alive"
    local = [sys.executable if probe[0] == "python3" else probe[0],
             *[a.replace(HEARTBEAT, str(beat)) for a in probe[1:]]]
    run = lambda: subprocess.run(local, capture_output=True).returncode  # noqa: E731
    assert run() != 0                      # nothing written yet
    args = agent.parse_args(["--router", "http://127.0.0.1:9", "--namespace", "ns",
                             "--selector", "a=b", "--port", "1", "--api", "http://127.0.0.1:9",
                             "--interval", "0", "--heartbeat", str(beat)])
    stop = threading.Event()
    threading.Timer(0.05, stop.set).start()
    agent.Reaper(args).run(stop)           # sweeps fail (nothing listens): it still beats
    assert run() == 0
    old = time.time() - HEARTBEAT_STALE_S - 5
    os.utime(beat, (old, old))
    assert run() != 0
