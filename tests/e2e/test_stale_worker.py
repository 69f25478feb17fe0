"""A worker pod that goes not ready before it is deleted (a lost node: Ready=False, then the
eviction) must leave the default router, before its IP serves anything else.

The stale-worker fault drill (3b), scaled down from minutes to seconds: the
rendered router pod's sglang-router with its rendered Kubernetes discovery (pointed at
bench.fake_kube_api), and every other container the pod renders that takes part in discovery
(the worker reaper, run from its ConfigMap's text with its rendered args), two fake vLLM workers
on two loopback "pod IPs"; one worker dies, its pod turns not ready, is deleted, and another
endpoint's worker (another model) takes its IP and port. With sglang-router 0.3.2 alone the
deleted worker stayed listed and, healthy again at the new owner, got 82 of 120 requests (404:
another model); here none may reach it."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from bench.fake_kube_api import FakeKubeApi
from bench.fake_worker import FakeWorker
from bench.loopback import (
    RouterProcess, chat, container_env, free_port, localize_discovery_args, router_launch,
    stop_process,
)
from tests.e2e.conftest import WORKER_OPTS, _rendered_docs

pytestmark = pytest.mark.e2e
KEY = "endpoint-key"
IPS = ("127.0.0.41", "127.0.0.42")   # the two worker pods' IPs
REQUESTS = 24
SWEEP_S = 0.2                        # the reaper's interval, scaled down from the rendered one


def _router_pod() -> dict:
    docs = _rendered_docs("prefixaware")
    pod = next(d for d in docs if d["kind"] == "Deployment"
               and d["metadata"]["name"].endswith("-router"))["spec"]["template"]["spec"]
    configmaps = {d["metadata"]["name"]: d["data"] for d in docs if d["kind"] == "ConfigMap"}
    return {"pod": pod, "configmaps": configmaps}


def _shared_port() -> int:
    for _ in range(50):
        port = free_port()
        try:
            for ip in IPS:
                with socket.socket() as s:
                    s.bind((ip, port))
            return port
        except OSError:
            continue
    raise RuntimeError(f"no port free on all of {IPS}")


def _discovery_sidecars(rendered: dict, router_url: str, api_url: str, worker_port: int,
                        tmp_path) -> list:
    """The pod's other containers that read the Kubernetes API (the worker reaper), as local
    processes: their script from the ConfigMap they mount, their rendered args pointed at the
    local router, the fake API, the local workers' port and a local key file, and a short
    interval."""
    procs = []
    volumes = {v["name"]: v for v in rendered["pod"]["volumes"]}
    for c in rendered["pod"]["containers"]:
        if c["name"] not in _sidecar_names(rendered):
            continue
        script_path, *_ = c["command"][1:]
        mount = next(m for m in c["volumeMounts"] if script_path.startswith(m["mountPath"]))
        data = rendered["configmaps"][volumes[mount["name"]]["configMap"]["name"]]
        script = tmp_path / f"{c['name']}.py"
        script.write_text(data[script_path.rsplit("/", 1)[1]])
        key = tmp_path / "api-key"
        key.write_text(KEY)
        args = list(c["args"])
        for flag, value in (("--router", router_url), ("--key-file", str(key)),
                            ("--port", str(worker_port)), ("--interval", str(SWEEP_S)),
                            ("--heartbeat", str(tmp_path / f"{c['name']}.alive"))):
            args[args.index(flag) + 1] = value
        log = open(tmp_path / f"{c['name']}.log", "wb")
        procs.append(subprocess.Popen([sys.executable, str(script), *args, "--api", api_url],
                                      stdout=log, stderr=subprocess.STDOUT))
        log.close()
    return procs


def _sidecar_names(rendered: dict) -> list[str]:
    return [c["name"] for c in rendered["pod"]["containers"] if c["name"] not in
            ("router", "front")]


def _wait(cond, timeout: float) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.05)
    return False


def test_a_worker_deleted_after_going_not_ready_gets_no_request(tmp_path, report_figure):
    rendered = _router_pod()
    container = next(c for c in rendered["pod"]["containers"] if c["name"] == "router")
    implementation = container["command"][-1]
    args = container["args"]
    selector = args[args.index("--selector") + 1:]
    selector = dict(s.split("=", 1) for s in selector[:next(
        i for i, s in enumerate(selector) if s.startswith("--"))])
    api = FakeKubeApi(args[args.index("--service-discovery-namespace") + 1], selector)
    port = _shared_port()
    workers = [FakeWorker(port, f"w{i}", host=ip, **WORKER_OPTS).start()
               for i, ip in enumerate(IPS)]
    sidecars: list[subprocess.Popen] = []
    router = other = None
    try:
        for i, ip in enumerate(IPS):
            api.add(f"w{i}")
            api.set(f"w{i}", ip=ip, phase="Running", ready=True)
        binary, argv = router_launch(implementation, localize_discovery_args(
            args, free_port(), free_port(), port))
        env = {**container_env(container), "KUBECONFIG": api.kubeconfig(
            str(tmp_path / "kubeconfig"))}
        env.pop("KUBERNETES_SERVICE_HOST", None)
        router = RouterProcess([*argv, "--api-key", KEY], binary=binary, api_key=KEY, env=env,
                               expect_workers=2, log_path=tmp_path / "router.log").start()
        sidecars = _discovery_sidecars(rendered, router.url, f"http://127.0.0.1:{api.port}",
                                       port, tmp_path)
        stale = workers[0].url
        # w0's node is lost: the engine stops answering, the pod turns not ready, is evicted
        workers[0].stop()
        api.set("w0", ready=False)
        api.terminate("w0", 30)
        api.delete("w0")
        listed = lambda: {w["url"]: w.get("is_healthy") for w in router.workers()}  # noqa: E731
        # The IP is handed out again later (the VPC CNI's cool-down): once the router has
        # either dropped the worker or seen it dead
        assert _wait(lambda: stale not in listed() or not listed()[stale], 20), listed()
        # its IP and port go to another endpoint's worker
        other = FakeWorker(port, "other-endpoint", host=IPS[0], model="another-model",
                           **WORKER_OPTS).start()
        # decided: either out of the router, or healthy again at its new owner
        assert _wait(lambda: stale not in listed() or listed()[stale], 20), listed()

        def one(i: int):
            return chat(router.url, [{"role": "system", "content": f"session {i} " * 40},
                                     {"role": "user", "content": f"question {i}"}],
                        stream=False, max_tokens=2, headers={"Authorization": f"Bearer {KEY}"})

        with ThreadPoolExecutor(6) as ex:
            answers = list(ex.map(one, range(REQUESTS)))
        misrouted = sum(a.status == 404 for a in answers)
        report_figure(f"stale worker (sglang-router, its IP reused): {misrouted}/{REQUESTS} "
                      f"requests went to the other endpoint's worker (404), "
                      f"{sum(a.ok for a in answers)} ok")
        assert misrouted == 0, [(a.status, a.error) for a in answers if not a.ok][:3]
        assert all(a.ok for a in answers)
        assert stale not in listed()
        assert list(listed()) == [workers[1].url]
        # what the reaper's liveness probe reads: it keeps sweeping
        assert all(p.poll() is None for p in sidecars)
        assert all((tmp_path / f"{c}.alive").exists() for c in _sidecar_names(rendered))
    finally:
        for proc in sidecars:
            stop_process(proc)
        if router:
            router.stop()
        for w in (*workers, other):
            if w:
                w.stop()
        api.close()
