"""Run the real router in front of fake workers, all on 127.0.0.1.

Used by the end-to-end tests and by benchmark tools:

    with FakeWorkerPool(4) as pool:
        args = localize_router_args(rendered_args, pool.urls, free_port(), free_port())
        with RouterProcess(args) as router:
            result = chat(router.url, [{"role": "user", "content": "hi"}], session_id="s1")
            result.worker_id, result.ttft_s

``localize_router_args`` takes the exact argument list of the router's Kubernetes Deployment
and changes only what cannot work off-cluster (discovery, bind addresses, ports); everything
else, the policy included, reaches the router as rendered.

Standard library only. Every wait here is bounded by a deadline.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import http.client
import json
import os
import random
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

from config.endpoint_spec import arg_value  # noqa: F401  (the harness's and the tests' too)
from bench import router_fork   # before our atexit below: its server stops after the routers
from bench.fake_worker import FakeWorker

__all__ = [
    "LOOPBACK",
    "free_port",
    "FakeWorkerPool",
    "localize_router_args",
    "router_binary",
    "router_launch",
    "RouterProcess",
    "RouterStartError",
    "ChatResult",
    "chat",
    "http_json",
]

LOOPBACK = "127.0.0.1"
_ANSI = re.compile(r"\x1b\[[0-9;]*m")  # the router colours its log whatever NO_COLOR says

# Flags whose values only make sense inside the cluster: (flag, how many values).
# -1 = every following value up to the next flag.
_DROP = {
    "--service-discovery": 0,
    "--selector": -1,
    "--service-discovery-namespace": 1,
    "--service-discovery-port": 1,
}
_SET = ("--host", "--port", "--prometheus-host", "--prometheus-port")
_KV_SOURCE_FLAGS = ("--kv-event-source", "--kv-event-replay-source")


_HANDED_OUT: set[int] = set()
_HANDED_OUT_LOCK = threading.Lock()


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago and that this process has not
    handed out before: tests start several routers side by side, each on ports it has not
    bound yet, and the kernel may offer a just-released port again."""
    with _HANDED_OUT_LOCK:
        if len(_HANDED_OUT) > 16384:   # a long benchmark: start over (the kernel's range ~28K)
            _HANDED_OUT.clear()
        for _ in range(100):
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                s.bind((LOOPBACK, 0))
                port = s.getsockname()[1]
            if port not in _HANDED_OUT:
                _HANDED_OUT.add(port)
                return port
    raise RuntimeError("no new free port on 127.0.0.1 in 100 tries")


def port_clash(exc: BaseException) -> bool:
    """A start that failed because something else took its port between `free_port` and the
    bind (another process, or a port-0 bind that the kernel gave the same number)."""
    return isinstance(exc, RouterStartError) and "already in use" in str(exc).lower()


# --------------------------------------------------------------------------- workers


class FakeWorkerPool:
    """``n`` FakeWorkers on free ports, ids ``w0..w{n-1}``; a context manager.

    ``worker_opts`` go to every FakeWorker (timings, block size, cache size, model, ...).
    """

    def __init__(self, n: int, *, id_prefix: str = "w", **worker_opts: Any) -> None:
        if n < 1:
            raise ValueError("n must be >= 1")
        self.workers = [FakeWorker(0, f"{id_prefix}{i}", **worker_opts) for i in range(n)]

    def start(self) -> "FakeWorkerPool":
        try:
            for w in self.workers:
                w.start()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        for w in self.workers:
            w.stop()

    def __enter__(self) -> "FakeWorkerPool":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def __len__(self) -> int:
        return len(self.workers)

    def __iter__(self) -> Iterator[FakeWorker]:
        return iter(self.workers)

    @property
    def urls(self) -> list[str]:
        return [w.url for w in self.workers]

    @property
    def ids(self) -> list[str]:
        return [w.worker_id for w in self.workers]

    def by_id(self, worker_id: str) -> FakeWorker:
        for w in self.workers:
            if w.worker_id == worker_id:
                return w
        raise KeyError(worker_id)

    def by_url(self, url: str) -> FakeWorker:
        for w in self.workers:
            if w.url == url.rstrip("/"):
                return w
        raise KeyError(url)

    def stats(self) -> dict[str, dict]:
        return {w.worker_id: w.stats() for w in self.workers}

    def reset(self) -> None:
        """Zero every counter and empty every prefix cache."""
        for w in self.workers:
            w.reset_stats()
            w.cache.clear()

    def wait_kv_subscribers(self, n: int = 1, timeout: float = 5.0) -> None:
        """Wait until every live worker's KV event stream has ``n`` subscribers (one per
        kv_aware router): events published before a router subscribes never reach it."""
        wait_kv_subscribers(lambda: {w.worker_id: w.kv_subscribers() for w in self.workers
                                     if w.alive}, n, timeout)


def wait_kv_subscribers(counts: Callable[[], dict[str, int]], n: int, timeout: float) -> None:
    """Poll ``counts()`` (worker -> KV event subscribers) until every one is at least ``n``."""
    deadline = time.monotonic() + timeout
    while True:
        got = counts()
        if all(c >= n for c in got.values()):
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"KV event subscribers after {timeout}s: {got}, want {n}")
        time.sleep(0.02)


# --------------------------------------------------------------------------- router args


def _is_flag(token: str) -> bool:
    return token.startswith("--")


def _flag_name(token: str) -> str:
    return token.split("=", 1)[0]


def localize_router_args(
    args: Sequence[str],
    worker_urls: Sequence[str],
    port: int,
    prometheus_port: int,
    *,
    kv_worker_map: Mapping[str, str] | None = None,
    kv_endpoint_map: Mapping[str, str] | None = None,
) -> list[str]:
    """Turn a router Deployment's args into args that run on this machine.

    Changes only what must change off-cluster:
    - drops ``--service-discovery``, ``--selector`` (with all its values),
      ``--service-discovery-namespace X`` and ``--service-discovery-port X``;
    - sets ``--host``/``--prometheus-host`` to 127.0.0.1 and ``--port``/``--prometheus-port`` to
      the given ports, replacing values that are there and adding the flags that are not;
    - replaces any ``--worker-urls`` with ``worker_urls`` (appended last);
    - in ``--kv-event-source`` / ``--kv-event-replay-source WORKER=ENDPOINT[,ENDPOINT...]``
      maps the in-cluster WORKER through ``kv_worker_map`` (a worker already in
      ``worker_urls`` may stay) and each ENDPOINT through ``kv_endpoint_map`` if given.
      An in-cluster worker with no local counterpart is an error, not a silent pass.
    Everything else passes through unchanged, in order. Leading non-flag words (a rendered
    ``command`` such as ``vllm-router``) are dropped: the caller chooses the binary.
    ``--flag=value`` spellings are understood.
    """
    if not worker_urls:
        raise ValueError("worker_urls must not be empty")
    kv_worker_map = {k.rstrip("/"): v.rstrip("/") for k, v in (kv_worker_map or {}).items()}
    kv_endpoint_map = dict(kv_endpoint_map or {})
    local = {u.rstrip("/") for u in worker_urls}
    wanted = {"--host": LOOPBACK, "--port": str(int(port)),
              "--prometheus-host": LOOPBACK, "--prometheus-port": str(int(prometheus_port))}
    seen: set[str] = set()

    tokens = list(args)
    i = 0
    while i < len(tokens) and not _is_flag(tokens[i]):
        i += 1  # the rendered command, if any
    out: list[str] = []
    while i < len(tokens):
        tok = tokens[i]
        name = _flag_name(tok) if _is_flag(tok) else None
        inline = "=" in tok if name else False
        if name in _DROP or name == "--worker-urls":
            count = -1 if name == "--worker-urls" else _DROP[name]
            i += 1
            if not inline:
                if count == -1:
                    while i < len(tokens) and not _is_flag(tokens[i]):
                        i += 1
                else:
                    i += count
            continue
        if name in wanted:
            out += [name, wanted[name]]
            seen.add(name)
            i += 1 if inline else 2
            continue
        if name in _KV_SOURCE_FLAGS:
            if inline:
                value, i = tok.split("=", 1)[1], i + 1
            else:
                if i + 1 >= len(tokens):
                    raise ValueError(f"{name} needs WORKER=ENDPOINT")
                value, i = tokens[i + 1], i + 2
            out += [name, _map_kv_source(value, kv_worker_map, kv_endpoint_map, local, name)]
            continue
        out.append(tok)
        i += 1
    for name in _SET:
        if name not in seen:
            out += [name, wanted[name]]
    out += ["--worker-urls", *worker_urls]
    return out


def localize_discovery_args(args: Sequence[str], port: int, prometheus_port: int,
                            discovery_port: int) -> list[str]:
    """A router Deployment's args with its Kubernetes discovery kept (pointed at a fake API by
    the caller's KUBECONFIG): only the listening addresses become loopback ones and the
    discovery port ``discovery_port`` (every fake pod listens there, as every worker pod does
    on the rendered port). The leading non-flag words (sglang-router's `launch`) are dropped
    as in ``localize_router_args``."""
    out = list(args)
    while out and not _is_flag(out[0]):
        out.pop(0)
    for flag, value in (("--host", LOOPBACK), ("--port", str(port)),
                        ("--prometheus-host", LOOPBACK), ("--prometheus-port", str(prometheus_port)),
                        ("--service-discovery-port", str(discovery_port))):
        out[out.index(flag) + 1] = value
    return out


def _map_kv_source(value: str, worker_map: Mapping[str, str], endpoint_map: Mapping[str, str],
                   local: set[str], flag: str) -> str:
    worker, sep, endpoints = value.partition("=")
    if not sep:
        raise ValueError(f"{flag} {value!r}: expected WORKER_URL=ENDPOINT[,ENDPOINT...]")
    worker = worker.rstrip("/")
    mapped = worker_map.get(worker, worker if worker in local else None)
    if mapped is None:
        raise ValueError(
            f"{flag} names in-cluster worker {worker!r}; pass kv_worker_map={{{worker!r}: "
            f"<one of the local worker urls>}}"
        )
    eps = [endpoint_map.get(e, e) for e in endpoints.split(",")]
    return f"{mapped}={','.join(eps)}"


def localize_for_pool(
    rendered_args: Sequence[str],
    pool: FakeWorkerPool,
    port: int | None = None,
    prometheus_port: int | None = None,
    *,
    kv_endpoints: Sequence[str] | None = None,
) -> list[str]:
    """``localize_router_args`` onto ``pool``, the KV event sources included.

    A rendered kv_aware router lists in-cluster workers (``--worker-urls``) and one
    ``--kv-event-source WORKER=ENDPOINT`` each: the i-th rendered worker becomes
    ``pool.workers[i]`` and its endpoint that worker's publisher (``kv_endpoints[i]`` instead,
    if given, e.g. a port where nothing publishes). Ports default to free ones.
    """
    rendered_workers = _arg_values(rendered_args, "--worker-urls")
    sources = [v.partition("=")[0] for f, v in zip(rendered_args, rendered_args[1:])
               if f == "--kv-event-source"]
    in_cluster = rendered_workers or sources
    worker_map: dict[str, str] = {}
    endpoint_map: dict[str, str] = {}
    if sources:
        if len(in_cluster) > len(pool):
            raise ValueError(f"{len(in_cluster)} rendered workers, {len(pool)} local ones")
        for remote, worker in zip(in_cluster, pool):
            worker_map[remote] = worker.url
        for flag, value in zip(rendered_args, rendered_args[1:]):
            if flag != "--kv-event-source":
                continue
            remote, _, endpoint = value.partition("=")
            i = in_cluster.index(remote)
            local = kv_endpoints[i] if kv_endpoints is not None else \
                pool.workers[i].kv_events_endpoint
            if not local:
                raise ValueError(f"worker {pool.workers[i].worker_id} publishes no KV events "
                                 "(start the pool with kv_events_port=0)")
            endpoint_map[endpoint] = local
    urls = [worker_map[r] for r in in_cluster] if sources else pool.urls
    return localize_router_args(
        rendered_args, urls, port or free_port(), prometheus_port or free_port(),
        kv_worker_map=worker_map, kv_endpoint_map=endpoint_map,
    )


def _arg_values(args: Sequence[str], flag: str) -> list[str]:
    for i, tok in enumerate(args):
        if tok == flag:
            vals = []
            for t in args[i + 1:]:
                if _is_flag(t):
                    break
                vals.append(t)
            return vals
    return []


# --------------------------------------------------------------------------- router process


def router_binary(implementation: str = "vllm-router") -> str:
    """The router's console script (``vllm-router``, ``sglang-router``) of the running
    interpreter's environment."""
    candidate = Path(sys.executable).parent / implementation
    if candidate.exists():
        return str(candidate)
    raise FileNotFoundError(
        f"{implementation} not found next to {sys.executable}; install the pinned "
        f"{implementation} (requirements.txt)"
    )


def container_env(container: Mapping[str, Any]) -> dict[str, str]:
    """This process's environment plus the literal ``env`` of a rendered container (what the
    pod gives the router, e.g. its log filter); values from Secrets or fields are skipped."""
    env = dict(os.environ)
    env.update({e["name"]: e["value"] for e in container.get("env", []) if "value" in e})
    return env


def router_launch(implementation: str, args: Sequence[str]) -> tuple[str, list[str]]:
    """(binary, argv) that start ``implementation`` with localized ``args`` (which lost the
    rendered leading words): sglang-router takes its ``launch`` subcommand first."""
    lead = ["launch"] if implementation == "sglang-router" else []
    return router_binary(implementation), [*lead, *args]


class RouterStartError(RuntimeError):
    pass


_LIVE_ROUTERS: "set[RouterProcess]" = set()  # started and not yet stopped


@atexit.register
def _stop_live_routers() -> None:
    """No router outlives the interpreter that started it (e.g. an interrupted test run)."""
    for router in list(_LIVE_ROUTERS):
        router.stop()


def _port_is_free(port: int) -> bool:
    """Nothing listens on ``port``. With SO_REUSEADDR, as both routers (tokio) and HAProxy bind:
    a killed router's connections in TIME_WAIT do not keep its successor off the port."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((LOOPBACK, port))
        except OSError:
            return False
        return True


def stop_process(proc: subprocess.Popen, timeout: float = 5.0) -> None:
    """SIGTERM, then SIGKILL after `timeout`: every child process the harness starts."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=timeout)


class RouterProcess:
    """The real router as a child process (its console script forked from bench.router_fork's
    server where it can be, else exec'd); a context manager.

    ``args`` are already localized (see ``localize_router_args``). On enter it starts the
    router, then waits (bounded by ``startup_timeout``) until ``/health`` answers and
    ``/workers`` lists ``expect_workers`` healthy workers (default: every ``--worker-urls``
    value). Its stdout+stderr go to ``log_path`` (a temp file unless given). On exit it is
    sent SIGTERM, then SIGKILL after ``stop_timeout``.
    """

    def __init__(
        self,
        args: Sequence[str],
        *,
        expect_workers: int | None = None,
        startup_timeout: float = 30.0,
        stop_timeout: float = 5.0,
        log_path: str | os.PathLike | None = None,
        env: Mapping[str, str] | None = None,
        binary: str | None = None,
        api_key: str | None = None,
    ) -> None:
        self.args = list(args)
        # sglang-router started with --api-key answers /workers only to that key
        self.control_headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        port = arg_value(self.args, "--port")
        if port is None:
            raise ValueError("args must carry --port (use localize_router_args)")
        host = arg_value(self.args, "--host") or LOOPBACK
        if host not in (LOOPBACK, "localhost"):
            raise ValueError(f"router must bind 127.0.0.1 here, not {host!r}")
        self.port = int(port)
        prom = arg_value(self.args, "--prometheus-port")
        self.prometheus_port = int(prom) if prom else None
        self.worker_urls = _arg_values(self.args, "--worker-urls")
        self.expect_workers = len(self.worker_urls) if expect_workers is None else expect_workers
        self.startup_timeout = startup_timeout
        self.stop_timeout = stop_timeout
        self.binary = binary or router_binary()
        self._own_log_dir: tempfile.TemporaryDirectory | None = None
        if log_path is None:
            self._own_log_dir = tempfile.TemporaryDirectory(prefix="vllm-router-")
            log_path = Path(self._own_log_dir.name) / "router.log"
        self.log_path = Path(log_path)
        self.env = dict(os.environ if env is None else env)
        # Loopback traffic must never go through a proxy, ours or the router's (reqwest).
        no_proxy = ",".join(filter(None, [self.env.get("NO_PROXY"), "127.0.0.1,localhost"]))
        self.env["NO_PROXY"] = self.env["no_proxy"] = no_proxy
        self.proc: subprocess.Popen | router_fork.ForkedProcess | None = None
        self.startup_seconds: float | None = None

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    @property
    def metrics_url(self) -> str | None:
        return f"http://{LOOPBACK}:{self.prometheus_port}/metrics" if self.prometheus_port else None

    @property
    def implementation(self) -> str:
        """`vllm-router` or `sglang-router`: the binary's name."""
        return Path(self.binary).name

    def served(self) -> float:
        """Requests the router received, by its own counter (observability.ROUTER_METRICS)."""
        from observability.metrics import router_metric

        return self.metric(router_metric("requests", self.implementation))

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def log_text(self) -> str:
        """The router's log so far, colour codes removed."""
        try:
            return _ANSI.sub("", self.log_path.read_text(errors="replace"))
        except FileNotFoundError:
            return ""

    def _log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])

    def start(self) -> "RouterProcess":
        if self.proc is not None:
            return self
        # Something already answering on our port would pass the readiness checks for us.
        busy = [p for p in (self.port, self.prometheus_port) if p and not _port_is_free(p)]
        if busy:
            raise RouterStartError(f"port(s) {busy} on {LOOPBACK} already in use")
        t0 = time.monotonic()
        with self._open_log() as log:   # the console script, forked where it can be
            self.proc = router_fork.spawn(self.binary, self.args, self.env, log.fileno())
        _LIVE_ROUTERS.add(self)
        try:
            self._wait_ready(t0 + self.startup_timeout)
        except BaseException:
            self.stop()
            raise
        self.startup_seconds = time.monotonic() - t0
        return self

    def _open_log(self):
        """The log file: new on the first start; a restart appends after a marker line, so
        what the killed process wrote stays readable."""
        self.starts = getattr(self, "starts", 0) + 1
        if self.starts == 1:
            return open(self.log_path, "wb")
        log = open(self.log_path, "ab")
        log.write(f"--- restart {self.starts - 1} ---\n".encode())
        log.flush()
        return log

    def _wait_ready(self, deadline: float) -> None:
        last = "no answer yet"
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RouterStartError(
                    f"{self.implementation} exited with {self.proc.returncode} during "
                    f"startup; log "
                    f"{self.log_path}:\n{self._log_tail()}"
                )
            try:
                status, _ = http_json("GET", self.url + "/health", timeout=1.0)
                if status == 200:
                    healthy = set(self.healthy_workers())
                    ours = healthy & {u.rstrip("/") for u in self.worker_urls}
                    if len(ours if self.worker_urls else healthy) >= self.expect_workers:
                        if self.proc.poll() is None:
                            return
                        continue  # exited meanwhile: reported at the top of the loop
                    last = f"/workers lists {len(healthy)} healthy of {self.expect_workers}"
                else:
                    last = f"/health answered {status}"
            except (OSError, http.client.HTTPException, ValueError) as exc:
                last = f"{type(exc).__name__}: {exc}"
            time.sleep(0.05)
        raise RouterStartError(
            f"{self.implementation} not ready after {self.startup_timeout:.0f}s ({last}); log "
            f"{self.log_path}:\n{self._log_tail()}"
        )

    def workers(self) -> list[dict]:
        """The router's own view: ``GET /workers`` -> ``{"workers": [{url, is_healthy, load,
        model_id, ...}], "total": N, "stats": {...}}``."""
        status, body = http_json("GET", self.url + "/workers", timeout=2.0,
                                 headers=self.control_headers)
        if status != 200 or not isinstance(body, dict):
            return []
        return list(body.get("workers") or [])

    def healthy_workers(self) -> list[str]:
        return [w["url"] for w in self.workers() if w.get("is_healthy")]

    def metrics_text(self) -> str:
        if not self.metrics_url:
            return ""
        status, body = http_json("GET", self.metrics_url, timeout=2.0, raw=True)
        return body if status == 200 else ""

    def metric(self, name: str, **labels: str) -> float:
        """Sum of the samples of ``name`` whose labels include ``labels`` (0 if none)."""
        return metric_sum(self.metrics_text(), name, **labels)

    def stop(self) -> None:
        if self.proc is None:
            return
        stop_process(self.proc, self.stop_timeout)
        self.proc = None
        _LIVE_ROUTERS.discard(self)

    def restart(self, port_timeout: float = 30.0) -> "RouterProcess":
        """Stop, then start again on the same ports with the same args: a router with no
        learned state (cache_aware's prefix tree, kv_aware's index, load counts)."""
        self.stop()
        deadline = time.monotonic() + port_timeout
        while not all(_port_is_free(p) for p in (self.port, self.prometheus_port) if p):
            if time.monotonic() > deadline:
                raise RouterStartError(f"ports of {self.url} still busy after {port_timeout}s")
            time.sleep(0.2)
        return self.start()

    def __enter__(self) -> "RouterProcess":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()
        if self._own_log_dir is not None and exc[0] is None:
            self._own_log_dir.cleanup()
            self._own_log_dir = None


def front_binary() -> str:
    """HAProxy, the router pod's front (Debian's package, as in the router image)."""
    import shutil

    found = shutil.which("haproxy") or shutil.which("haproxy", path="/usr/sbin:/usr/local/sbin")
    if not found:
        raise FileNotFoundError("haproxy not found: apt-get install haproxy (scripts/debian-tools)")
    return found


class FrontProcess:
    """The router pod's front (HAProxy) with the rendered config text, on 127.0.0.1 in front
    of the router on ``router_port``; a context manager. The config reads its addresses and
    files from the environment (k8s.router_front), so the rendered text runs unchanged: the
    load balancer is ``FAKE_NLB`` (connections from it must start with a PROXY header, see
    ``nlb_connection``), and the key digest file holds ``api_key``'s, as the pod's init
    container writes it."""

    def __init__(self, config_text: str, router_port: int, *, port: int | None = None,
                 api_key: str | None = None, startup_timeout: float = 10.0,
                 decode_router_port: int | None = None) -> None:
        from k8s.router_front import (
            BIND_ENV, DECODE_ROUTER_ENV, KEY_DIGEST_ENV, LOAD_BALANCER_ENV, ROUTER_ENV,
            key_digest,
        )

        self.port = port or free_port()
        self._dir = tempfile.TemporaryDirectory(prefix="router-front-")
        self.config_path = Path(self._dir.name) / "haproxy.cfg"
        self.config_path.write_text(config_text)
        self.log_path = Path(self._dir.name) / "front.log"
        digest = Path(self._dir.name) / "api-key.sha256"
        digest.write_text(key_digest(api_key) if api_key else "")
        self.env = {**os.environ, BIND_ENV: f"{LOOPBACK}:{self.port}",
                    ROUTER_ENV: f"{LOOPBACK}:{router_port}",
                    LOAD_BALANCER_ENV: f"{FAKE_NLB}/32", KEY_DIGEST_ENV: str(digest)}
        if decode_router_port:   # a disaggregated endpoint's decode-only router
            self.env[DECODE_ROUTER_ENV] = f"{LOOPBACK}:{decode_router_port}"
        self.startup_timeout = startup_timeout
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def start(self) -> "FrontProcess":
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [front_binary(), "-db", "-f", str(self.config_path)], stdout=log,
                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=self.env)
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RouterStartError(f"haproxy exited with {self.proc.returncode}:\n"
                                       f"{self.log_text()}")
            with socket.socket() as s:
                if s.connect_ex((LOOPBACK, self.port)) == 0:
                    return self
            time.sleep(0.02)
        self.stop()
        raise RouterStartError(f"haproxy not listening after {self.startup_timeout}s")

    def stop(self) -> None:
        if self.proc is not None:
            stop_process(self.proc)
        self.proc = None

    def __enter__(self) -> "FrontProcess":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()
        self._dir.cleanup()


# --------------------------------------------------------------------------- load balancer

# The loopback tests' network load balancer: connections from this address carry a PROXY
# protocol v2 header naming the real client, as an AWS NLB's do with proxy protocol on
# (FrontProcess tells the front so); 127.0.0.1 plays an in-cluster client or the kubelet.
FAKE_NLB = "127.0.0.2"


def proxy_v2_header(client: str | None, client_port: int = 40000, *,
                    destination: str = "10.0.0.10", destination_port: int = 8000) -> bytes:
    """The PROXY protocol v2 header an AWS NLB prepends to a connection (haproxy.org
    proxy-protocol.txt, section 2.2): command PROXY, TCP over IPv4 or IPv6, the client's and
    the target's address. ``client=None``: command LOCAL with no address, what the NLB sends
    on its own health checks."""
    import ipaddress
    import struct

    signature = b"\r\n\r\n\x00\r\nQUIT\n"
    if client is None:
        return signature + bytes([0x20, 0x00]) + struct.pack("!H", 0)
    src, dst = ipaddress.ip_address(client), ipaddress.ip_address(destination)
    if src.version != dst.version:
        dst = ipaddress.ip_address("::ffff:" + str(dst)) if src.version == 6 else dst
    family = 0x11 if src.version == 4 else 0x21
    body = src.packed + dst.packed + struct.pack("!HH", client_port, destination_port)
    return signature + bytes([0x21, family]) + struct.pack("!H", len(body)) + body


def nlb_connection(port: int, client: str | None, *, timeout: float = 10.0,
                   client_port: int = 40000) -> socket.socket:
    """A TCP connection to ``port`` as the NLB opens it for ``client`` (None: a health
    check): from FAKE_NLB, the PROXY v2 header already sent."""
    sock = socket.create_connection((LOOPBACK, port), timeout=timeout,
                                    source_address=(FAKE_NLB, 0))
    try:
        sock.sendall(proxy_v2_header(client, client_port))
    except OSError:
        sock.close()
        raise
    return sock


class _NlbConnection(http.client.HTTPConnection):
    """http.client through the fake NLB on behalf of ``client``."""

    def __init__(self, host: str, port: int, *, client: str, timeout: float) -> None:
        super().__init__(host, port, timeout=timeout)
        self.client = client

    def connect(self) -> None:
        self.sock = nlb_connection(self.port, self.client, timeout=self.timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def _connection(host: str, port: int, timeout: float,
                via_nlb: str | None) -> http.client.HTTPConnection:
    if via_nlb is None:
        return http.client.HTTPConnection(host, port, timeout=timeout)
    return _NlbConnection(host, port, client=via_nlb, timeout=timeout)


# --------------------------------------------------------------------------- client


def _split(url: str) -> tuple[str, int, str]:
    parts = urllib.parse.urlsplit(url)
    if parts.scheme != "http" or not parts.hostname:
        raise ValueError(f"expected an http:// url, got {url!r}")
    path = parts.path or "/"
    if parts.query:
        path += "?" + parts.query
    return parts.hostname, parts.port or 80, path


def http_json(method: str, url: str, body: Any = None, *, headers: Mapping[str, str] | None = None,
              timeout: float = 10.0, raw: bool = False,
              via_nlb: str | None = None) -> tuple[int, Any]:
    """One request; returns (status, parsed JSON body, or text when ``raw`` or not JSON).
    ``via_nlb``: sent through the fake NLB on behalf of that client address."""
    host, port, path = _split(url)
    conn = _connection(host, port, timeout, via_nlb)
    try:
        data = None if body is None else json.dumps(body).encode()
        hdrs = {"Content-Type": "application/json"} if data is not None else {}
        hdrs.update(headers or {})
        conn.request(method, path, body=data, headers=hdrs)
        resp = conn.getresponse()
        payload = resp.read().decode("utf-8", errors="replace")
        if raw:
            return resp.status, payload
        try:
            return resp.status, json.loads(payload) if payload else None
        except ValueError:
            return resp.status, payload
    finally:
        conn.close()


@dataclasses.dataclass
class ChatResult:
    status: int
    worker_id: str | None  # from the body's "worker_id" (every chunk when streaming)
    header_worker_id: str | None  # X-Worker-Id as it reached the client, if passed through
    ttft_s: float | None  # request sent -> first content token (whole response if not stream)
    total_s: float
    tokens: int  # content chunks received (stream) or usage.completion_tokens
    text: str
    usage: dict | None
    cached_tokens: int | None
    chunk_worker_ids: list[str]
    done: bool  # saw data: [DONE] (stream) or a complete JSON body
    error: str | None = None

    @property
    def ttft(self) -> float | None:
        return self.ttft_s

    @property
    def total(self) -> float:
        return self.total_s

    @property
    def ok(self) -> bool:
        return self.status == 200 and self.error is None and self.done


def chat(
    url: str,
    messages: Sequence[dict],
    session_id: str | None = None,
    stream: bool = True,
    max_tokens: int = 16,
    *,
    model: str | None = "fake-model",
    headers: Mapping[str, str] | None = None,
    timeout: float = 30.0,
    extra_body: Mapping[str, Any] | None = None,
    via_nlb: str | None = None,
) -> ChatResult:
    """One chat completion against a router or a worker at ``url`` (base url or full path).

    Sends ``X-Session-ID`` when ``session_id`` is given, and ``model`` (the fake workers'
    default name) as OpenAI clients must: sglang-router fills a missing one with `unknown`,
    which vLLM refuses. Never raises for HTTP-level failures: look at ``status``/``error``.
    ``via_nlb``: sent through the fake NLB on behalf of that client address (FrontProcess).
    """
    host, port, path = _split(url)
    if not path.rstrip("/").endswith("/chat/completions"):
        path = path.rstrip("/") + "/v1/chat/completions"
    body: dict[str, Any] = {"messages": list(messages), "max_tokens": max_tokens, "stream": stream}
    if model:
        body["model"] = model
    if stream:
        body["stream_options"] = {"include_usage": True}
    body.update(extra_body or {})
    hdrs = {"Content-Type": "application/json", "Accept": "text/event-stream" if stream else
            "application/json"}
    if session_id is not None:
        hdrs["X-Session-ID"] = session_id
    hdrs.update(headers or {})

    t0 = time.perf_counter()
    ttft = None
    text: list[str] = []
    chunk_ids: list[str] = []
    usage = None
    tokens = 0
    done = False
    status = 0
    header_id = None
    error = None
    conn = _connection(host, port, timeout, via_nlb)
    try:
        conn.request("POST", path, body=json.dumps(body).encode(), headers=hdrs)
        resp = conn.getresponse()
        status = resp.status
        header_id = resp.getheader("X-Worker-Id")
        if status != 200 or not stream:
            payload = resp.read()
            total = time.perf_counter() - t0
            try:
                obj = json.loads(payload)
            except ValueError:
                obj = None
            if status != 200 or not isinstance(obj, dict):
                error = payload.decode("utf-8", errors="replace")[:500] or f"HTTP {status}"
                return ChatResult(status, None, header_id, None, total, 0, "", None, None, [],
                                  False, error)
            usage = obj.get("usage")
            choice = (obj.get("choices") or [{}])[0]
            content = (choice.get("message") or {}).get("content") or ""
            return ChatResult(
                status, obj.get("worker_id"), header_id, total, total,
                (usage or {}).get("completion_tokens", 0), content, usage,
                _cached(usage), [obj["worker_id"]] if obj.get("worker_id") else [], True,
            )
        deadline = t0 + timeout
        for chunk in sse_chunks(resp):
            if time.perf_counter() > deadline:
                error = "stream exceeded timeout"
                break
            if chunk is None:
                done = True
                break
            if chunk.get("worker_id"):
                chunk_ids.append(chunk["worker_id"])
            if chunk.get("usage"):
                usage = chunk["usage"]
            for choice in chunk.get("choices") or []:
                piece = (choice.get("delta") or {}).get("content")
                if piece:
                    if ttft is None:
                        ttft = time.perf_counter() - t0
                    text.append(piece)
                    tokens += 1
    except (OSError, http.client.HTTPException, ValueError) as exc:
        error = f"{type(exc).__name__}: {exc}"
    finally:
        conn.close()
    total = time.perf_counter() - t0
    return ChatResult(
        status, chunk_ids[0] if chunk_ids else None, header_id, ttft, total, tokens,
        "".join(text), usage, _cached(usage), chunk_ids, done, error,
    )


def sse_chunks(lines: Iterable[bytes]) -> Iterator[dict | None]:
    """The JSON chunks of a streamed (SSE) completion body, then ``None`` for ``[DONE]``."""
    for raw in lines:
        line = raw.strip()
        if not line.startswith(b"data:"):
            continue
        data = line[5:].strip()
        if data == b"[DONE]":
            yield None
            return
        yield json.loads(data)


def _cached(usage: dict | None) -> int | None:
    details = (usage or {}).get("prompt_tokens_details") or {}
    return details.get("cached_tokens")


_SAMPLE = re.compile(r'^([A-Za-z_:][A-Za-z0-9_:]*)(?:\{(.*)\})?\s+(\S+)')
_LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"')


def metric_sum(text: str, name: str, **labels: str) -> float:
    """Sum of the Prometheus samples of ``name`` in ``text`` whose labels include ``labels``."""
    total = 0.0
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if not m or m.group(1) != name:
            continue
        have = dict(_LABEL.findall(m.group(2) or ""))
        if all(have.get(k) == v for k, v in labels.items()):
            total += float(m.group(3))
    return total


@contextlib.contextmanager
def loopback_router(rendered_args: Sequence[str], pool: FakeWorkerPool,
                    **router_opts: Any) -> Iterator[RouterProcess]:
    """Localize ``rendered_args`` onto ``pool`` (KV event sources included) and run the router
    for the block; a kv_aware router is subscribed to every worker before the block runs."""
    args = localize_for_pool(rendered_args, pool)
    with RouterProcess(args, **router_opts) as router:
        if "--kv-event-source" in args:
            pool.wait_kv_subscribers(1)
        yield router


# --------------------------------------------------------------------------- conversations


def filler(seed: str, words: int) -> str:
    """Deterministic filler text, distinct per seed."""
    rng = random.Random(seed)
    letters = "bcdfghjklmnprstvz"
    return " ".join(f"{rng.choice(letters)}{rng.randrange(10**6)}" for _ in range(words))


class Conversation:
    """One user's multi-turn chat: a long system prompt of its own (its prefix), then turns of
    ``user_words`` each. ``turn(url)`` sends the next turn wherever it is told; a failed turn
    is forgotten, so the next call sends it again, as a client retrying would."""

    def __init__(self, name: str, *, system_words: int = 400, user_words: int = 30,
                 max_tokens: int = 16) -> None:
        self.name = name
        self.user_words = user_words
        self.max_tokens = max_tokens
        self.messages = [{"role": "system", "content": filler(f"system-{name}", system_words)}]
        self.results: list[ChatResult] = []  # every attempt, failures included

    @property
    def turns_done(self) -> int:
        return sum(1 for r in self.results if r.ok)

    @property
    def workers(self) -> list[str | None]:
        """Who answered each successful turn, in order."""
        return [r.worker_id for r in self.results if r.ok]

    def turn(self, url: str, *, session_header: bool = False, stream: bool = True,
             timeout: float = 10.0) -> ChatResult:
        turn = self.turns_done
        self.messages.append({"role": "user",
                              "content": filler(f"user-{self.name}-{turn}", self.user_words)})
        res = chat(url, self.messages, session_id=self.name if session_header else None,
                   stream=stream, max_tokens=self.max_tokens, timeout=timeout)
        self.results.append(res)
        if res.ok:
            self.messages.append({"role": "assistant", "content": res.text})
        else:
            self.messages.pop()
        return res


def run_conversations(urls: Sequence[str], sessions: int, turns: int, *,
                      session_header: bool = False, name: str = "conv",
                      timeout: float = 10.0, sticky: bool = False,
                      **conversation_opts: Any) -> list[Conversation]:
    """``sessions`` users arrive together and each holds ``turns`` turns, one after another;
    turn ``t`` of user ``s`` goes to ``urls[(s + t) % len(urls)]`` (with two routers, every
    conversation alternates between them and both carry load at every moment), or, with
    ``sticky`` (client affinity at the load balancer), always to ``urls[s % len(urls)]``."""
    convs = [Conversation(f"{name}-{s}", **conversation_opts) for s in range(sessions)]
    start = threading.Barrier(sessions, timeout=timeout)

    def run(s: int) -> None:
        start.wait()
        for t in range(turns):
            url = urls[s % len(urls)] if sticky else urls[(s + t) % len(urls)]
            convs[s].turn(url, session_header=session_header, timeout=timeout)

    with ThreadPoolExecutor(sessions) as pool:
        list(pool.map(run, range(sessions)))
    return convs


__all__ += ["arg_value", "loopback_router", "localize_for_pool", "metric_sum", "sse_chunks",
            "filler", "Conversation", "run_conversations", "FrontProcess", "front_binary",
            "FAKE_NLB", "proxy_v2_header", "nlb_connection", "container_env"]
