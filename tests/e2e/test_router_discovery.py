"""The rendered router pod with its Kubernetes discovery, on loopback: what the official OpenAI
client sees through it, and what happens when a worker pod goes not ready before it is deleted.

The pod as rendered for the default strategy: sglang-router with its rendered args (only the
listening addresses changed; its discovery reads bench.fake_kube_api through KUBECONFIG),
every other container that reads the Kubernetes API (the worker reaper, run from its ConfigMap's
text with its rendered args) and the front (real HAProxy, the rendered config); two fake vLLM
workers on two loopback "pod IPs" (one port, as every worker pod listens on the rendered one),
serving the name the rendered vLLM args give them. vllm-router, the other implementation,
behind its own front with static workers, for the client's comparison.

- `/v1/models`: sglang-router 0.3.2 lists `unknown` for vLLM workers (docs/upstream.md); a
  client that takes its model from that list (chat UIs, SDK model discovery) asked for it.
- The stale-worker fault drill (3b), scaled down from minutes to seconds: a worker dies, its
  pod turns not ready, is deleted, and another endpoint's worker (another model) takes its IP
  and port. With sglang-router 0.3.2 alone the deleted worker stayed listed and, healthy again
  at its new owner, got 82 of 120 requests in the drill (18-20 of 24 here; 404, another
  model); none may reach it. It runs last: it takes one worker away.
"""
from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import openai
import pytest

from bench.fake_kube_api import FakeKubeApi
from bench.fake_worker import FakeWorker
from bench.loopback import (
    FakeWorkerPool, FrontProcess, RouterProcess, chat, container_env, free_port,
    localize_discovery_args, localize_for_pool, router_launch, stop_process,
)
from config.contracts import default_router
from k8s.router_front import FRONT_CONFIG
from tests.e2e.conftest import WORKER_OPTS, _rendered_docs, _rendered_worker_args

pytestmark = pytest.mark.e2e
KEY = "endpoint-key"
STRATEGY = "prefixaware"
DEFAULT = default_router(STRATEGY)
IPS = ("127.0.0.41", "127.0.0.42")   # the two worker pods' IPs
REQUESTS = 24
SWEEP_S = 0.2                        # the reaper's interval, scaled down from the rendered one


def served_names() -> list[str]:
    """`--served-model-name`'s values in the rendered vLLM args (one or more)."""
    args = _rendered_worker_args(STRATEGY)
    names = []
    for tok in args[args.index("--served-model-name") + 1:]:
        if tok.startswith("-"):
            break
        names.append(tok)
    return names


def _rendered(router: str) -> dict:
    """The router pod's spec and the ConfigMaps' data, as rendered with ``router``."""
    docs = _rendered_docs(STRATEGY, None, None if router == DEFAULT else router)
    pod = next(d for d in docs if d["kind"] == "Deployment"
               and d["metadata"]["name"].endswith("-router"))["spec"]["template"]["spec"]
    return {"pod": pod, "containers": {c["name"]: c for c in pod["containers"]},
            "configmaps": {d["metadata"]["name"]: d["data"] for d in docs
                           if d["kind"] == "ConfigMap"}}


def _front_text(rendered: dict) -> str:
    return next(data[FRONT_CONFIG] for name, data in rendered["configmaps"].items()
                if name.endswith("-router-front"))


def _sidecars(rendered: dict) -> list[dict]:
    """The containers beside the router and its front (the worker reaper)."""
    return [c for name, c in rendered["containers"].items() if name not in ("router", "front")]


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


def _wait(cond, timeout: float) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.05)
    return False


class DiscoveredPod:
    """The default router's pod with its discovery, its sidecars and its front (see above)."""

    def __init__(self, tmp: Path, **worker_opts: float) -> None:
        self.tmp, self.rendered = tmp, _rendered(DEFAULT)
        router = self.rendered["containers"]["router"]
        args = router["args"]
        selector = args[args.index("--selector") + 1:]
        selector = selector[:next(i for i, s in enumerate(selector) if s.startswith("--"))]
        self.api = FakeKubeApi(args[args.index("--service-discovery-namespace") + 1],
                               dict(s.split("=", 1) for s in selector))
        self.port = _shared_port()
        self.workers = [FakeWorker(self.port, f"w{i}", host=ip, model=served_names()[0],
                                   **{**WORKER_OPTS, **worker_opts})
                        for i, ip in enumerate(IPS)]
        binary, argv = router_launch(router["command"][-1], localize_discovery_args(
            args, free_port(), free_port(), self.port))
        env = {**container_env(router),
               "KUBECONFIG": self.api.kubeconfig(str(tmp / "kubeconfig"))}
        env.pop("KUBERNETES_SERVICE_HOST", None)
        self.router = RouterProcess([*argv, "--api-key", KEY], binary=binary, api_key=KEY,
                                    env=env, expect_workers=len(IPS),
                                    log_path=tmp / "router.log")
        self.sidecars: list[subprocess.Popen] = []
        self.front: FrontProcess | None = None

    def start(self) -> "DiscoveredPod":
        for i, (worker, ip) in enumerate(zip(self.workers, IPS)):
            worker.start()
            self.api.add(f"w{i}")
            self.api.set(f"w{i}", ip=ip, phase="Running", ready=True)
        self.router.start()
        self.sidecars = [self._run(c) for c in _sidecars(self.rendered)]
        self.front = FrontProcess(_front_text(self.rendered), self.router.port,
                                  api_key=KEY).start()
        return self

    def _run(self, c: dict) -> subprocess.Popen:
        """A sidecar as a local process: its script from the ConfigMap it mounts, its rendered
        args pointed at the local router, fake API, workers' port, key file and heartbeat
        file, and a short interval."""
        volumes = {v["name"]: v for v in self.rendered["pod"]["volumes"]}
        script_path = c["command"][1]
        mount = next(m for m in c["volumeMounts"] if script_path.startswith(m["mountPath"]))
        data = self.rendered["configmaps"][volumes[mount["name"]]["configMap"]["name"]]
        script = self.tmp / f"{c['name']}.py"
        script.write_text(data[script_path.rsplit("/", 1)[1]])
        key = self.tmp / "api-key"
        key.write_text(KEY)
        args = list(c["args"])
        for flag, value in (("--router", self.router.url), ("--key-file", str(key)),
                            ("--port", str(self.port)), ("--interval", str(SWEEP_S)),
                            ("--heartbeat", str(self.tmp / f"{c['name']}.alive"))):
            args[args.index(flag) + 1] = value
        with open(self.tmp / f"{c['name']}.log", "wb") as log:
            return subprocess.Popen([sys.executable, str(script), *args,
                                     "--api", f"http://127.0.0.1:{self.api.port}"],
                                    stdout=log, stderr=subprocess.STDOUT)

    def stop(self) -> None:
        if self.front:
            self.front.stop()
        for proc in self.sidecars:
            stop_process(proc)
        self.router.stop()
        for w in self.workers:
            w.stop()
        self.api.close()


def _static_pod(router: str) -> tuple[contextlib.ExitStack, FrontProcess]:
    """``router``'s rendered pod with static workers (bench.loopback's swap) and its front."""
    rendered = _rendered(router)
    container = rendered["containers"]["router"]
    with contextlib.ExitStack() as stack:
        pool = stack.enter_context(FakeWorkerPool(2, model=served_names()[0], **WORKER_OPTS))
        binary, argv = router_launch(router, localize_for_pool(container["args"], pool))
        process = stack.enter_context(RouterProcess(
            [*argv, "--api-key", KEY], binary=binary, api_key=KEY, env=container_env(container)))
        front = stack.enter_context(FrontProcess(_front_text(rendered), process.port,
                                                 api_key=KEY))
        return stack.pop_all(), front


@pytest.fixture(scope="module")
def pods(tmp_path_factory):
    """{router: (its pod, its front)}: the default router discovered, vllm-router static;
    started side by side."""
    for router in (DEFAULT, "vllm-router"):   # render first: jsii serves one thread at a time
        _rendered(router)
    served_names()
    discovered = DiscoveredPod(tmp_path_factory.mktemp("discovered"))
    with contextlib.ExitStack() as stack, ThreadPoolExecutor(2) as starting:
        stack.callback(discovered.stop)
        started = starting.submit(discovered.start)
        static = starting.submit(_static_pod, "vllm-router")
        stack.push(static.result()[0])
        started.result()
        yield {DEFAULT: (discovered, discovered.front), "vllm-router": (None, static.result()[1])}


@pytest.mark.parametrize("router", [DEFAULT, "vllm-router"])
def test_the_openai_client_lists_the_served_model_and_chats_with_it(pods, router):
    front = pods[router][1]
    client = openai.OpenAI(base_url=f"{front.url}/v1", api_key=KEY, max_retries=0, timeout=30)
    listed = [m.id for m in client.models.list()]
    assert listed == served_names()
    answer = client.chat.completions.create(
        model=listed[0], max_tokens=4, messages=[{"role": "user", "content": "hello"}])
    assert answer.model == listed[0] and answer.choices[0].message.content
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{front.url}/v1", api_key="wrong", max_retries=0).models.list()


def test_a_worker_deleted_after_going_not_ready_gets_no_request(pods, report_figure):
    pod: DiscoveredPod = pods[DEFAULT][0]
    router, workers, api = pod.router, pod.workers, pod.api
    listed = lambda: {w["url"]: w.get("is_healthy") for w in router.workers()}  # noqa: E731
    assert sorted(listed()) == sorted(w.url for w in workers)
    stale = workers[0].url
    # w0's node is lost: the engine stops answering, the pod turns not ready, is evicted
    workers[0].stop()
    api.set("w0", ready=False)
    api.terminate("w0", 30)
    api.delete("w0")
    # The IP is handed out again later (the VPC CNI's cool-down): once the router has either
    # dropped the worker or seen it dead
    # (one look per try: the worker may leave the list between two)
    assert _wait(lambda: not listed().get(stale), 20), listed()
    other = FakeWorker(pod.port, "other-endpoint", host=IPS[0], model="another-model",
                       **WORKER_OPTS).start()
    try:
        # decided: either out of the router, or healthy again at its new owner
        assert _wait(lambda: listed().get(stale, True), 20), listed()

        def one(i: int):
            return chat(pod.front.url, [{"role": "system", "content": f"session {i} " * 40},
                                        {"role": "user", "content": f"question {i}"}],
                        stream=False, max_tokens=2, model=served_names()[0],
                        headers={"Authorization": f"Bearer {KEY}"})

        with ThreadPoolExecutor(6) as ex:
            answers = list(ex.map(one, range(REQUESTS)))
    finally:
        other.stop()
    misrouted = sum(a.status == 404 for a in answers)
    report_figure(f"stale worker (sglang-router, its IP reused): {misrouted}/{REQUESTS} "
                  f"requests went to the other endpoint's worker (404), "
                  f"{sum(a.ok for a in answers)} ok")
    assert misrouted == 0, [(a.status, a.error) for a in answers if not a.ok][:3]
    assert all(a.ok for a in answers)
    assert list(listed()) == [workers[1].url]
    # what the reaper's liveness probe reads: it keeps sweeping
    assert all(p.poll() is None for p in pod.sidecars)
    assert all((pod.tmp / f"{c['name']}.alive").exists() for c in _sidecars(pod.rendered))
