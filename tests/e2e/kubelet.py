"""A kubelet stand-in for one worker container on loopback (there is no kubelet here), doing what
the kubelet does with the rendered probes and hook, in its order, every duration scaled:

- the readiness and the liveness probe, each on its own loop (the kubelet runs one worker per
  probe), every `periodSeconds`; the rendered exec command with this python for the image's, the
  fake worker's port, state files in the test's folder and the stall window scaled;
- `failureThreshold` readiness failures in a row: the pod's Ready condition goes false in the
  API (the routers' discovery watches it);
- `failureThreshold` liveness failures in a row: the container is killed as the kubelet kills
  it (kubernetes.io, Container Lifecycle Hooks and Pod Lifecycle): the preStop hook first, then
  SIGTERM, then SIGKILL once the grace period is over, counted from the start of the kill; the
  grace is the probe's own `terminationGracePeriodSeconds` where it has one (the kubelet's
  ProbeTerminationGracePeriod), else the pod's. vLLM answers SIGTERM with `--shutdown-timeout`
  as rendered: it waits for its running requests that long (a stalled engine's never end), and
  without the flag it aborts them at once. SIGKILL: FakeWorker.stop(), which cuts every
  connection.

The container's loopback is the fake pod's IP here (the workers of one test share a port on
addresses of their own): the scripts' `127.0.0.1` becomes the worker's host, the one
substitution in their text. Each step is timestamped in `events` (monotonic seconds)."""
from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable

from bench.fake_worker import FakeWorker
from config.endpoint_spec import arg_value

# A probe's exec starts a python: the kubelet's scaled timeoutSeconds would be shorter than
# that start on two busy cores, so each exec may take this long (its HTTP calls keep their
# scaled timeouts).
EXEC_TIMEOUT_S = 5.0


class Kubelet:
    def __init__(self, container: dict, pod_grace_s: int, worker: FakeWorker, scale: float,
                 state_dir: Path, on_not_ready: Callable[[], None]) -> None:
        self.c, self.worker, self.scale = container, worker, scale
        self.pod_grace_s, self.on_not_ready = pod_grace_s, on_not_ready
        self.states = {kind: str(state_dir / f"{kind}.json") for kind in ("readiness",
                                                                         "liveness")}
        self.events: list[tuple[float, str]] = []
        self._stop = threading.Event()
        self._killed = threading.Event()
        self._threads = [threading.Thread(target=self._loop, args=(kind,), daemon=True)
                         for kind in self.states]

    def event(self, what: str) -> None:
        self.events.append((time.monotonic(), what))

    def at(self, what: str) -> float | None:
        """When ``what`` first happened."""
        return next((t for t, w in self.events if w == what), None)

    def start(self) -> "Kubelet":
        for t in self._threads:
            t.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            if t.is_alive():
                t.join(10)

    def command(self, kind: str) -> list[str]:
        """The rendered probe's exec command, run here (see above)."""
        python, flag, script, _, stall, _, path, timeout = \
            self.c[f"{kind}Probe"]["exec"]["command"]
        return [sys.executable, flag, self._local(script), str(self.worker.port),
                str(float(stall) * self.scale), self.states[kind], path,
                str(max(0.2, float(timeout) * self.scale))]

    def passes(self, kind: str) -> bool:
        try:
            return subprocess.run(self.command(kind), capture_output=True,
                                  timeout=EXEC_TIMEOUT_S).returncode == 0
        except subprocess.TimeoutExpired:
            return False

    def _loop(self, kind: str) -> None:
        probe = self.c[f"{kind}Probe"]
        period = probe["periodSeconds"] * self.scale
        failures = 0
        while not self._stop.is_set() and not self._killed.is_set():
            began = time.monotonic()
            if self.passes(kind):
                failures = 0
            else:
                failures += 1
                if failures == 1:
                    self.event(f"{kind} failed")
                if failures == probe["failureThreshold"]:
                    if kind == "readiness":
                        self.event("not ready")
                        self.on_not_ready()
                    else:
                        self.kill(probe)
                        return
            self._stop.wait(max(0.0, period - (time.monotonic() - began)))

    def hook(self) -> list[str]:
        """The rendered preStop exec command, run here: its waits and stall window scaled, the
        liveness probe's state file (the same /tmp in the container)."""
        python, flag, script, _, least, most, *stall = \
            self.c["lifecycle"]["preStop"]["exec"]["command"]
        tail = [str(float(stall[0]) * self.scale), self.states["liveness"]] if stall else []
        return [sys.executable, flag, self._local(script), str(self.worker.port),
                str(float(least) * self.scale), str(float(most) * self.scale), *tail]

    def _local(self, script: str) -> str:
        assert script.count("http://127.0.0.1:") == 1, "the script reads one address"
        return script.replace("http://127.0.0.1:", f"http://{self.worker.host}:")

    def kill(self, probe: dict) -> None:
        self._killed.set()
        grace = probe.get("terminationGracePeriodSeconds", self.pod_grace_s) * self.scale
        start = time.monotonic()
        self.event("kill")
        try:
            subprocess.run(self.hook(), capture_output=True, timeout=grace)
            self.event("preStop returned")
        except subprocess.TimeoutExpired:
            self.event("preStop cut at the grace period")
        self.event("SIGTERM")
        drain = arg_value(self.c["args"], "--shutdown-timeout")
        if drain is not None:                 # vLLM waits for what it runs, at most that long
            until = min(start + grace, time.monotonic() + float(drain) * self.scale)
            while self.worker.stats()["running"] and time.monotonic() < until:
                time.sleep(0.01)
            if self.worker.stats()["running"] and time.monotonic() >= start + grace:
                self.event("SIGKILL")
        self.worker.stop()
        self.event("exited")
