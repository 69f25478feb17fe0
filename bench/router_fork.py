"""Start the real routers' console scripts without paying their imports each time.

``vllm-router`` and ``sglang-router`` are Python entry points whose first act is importing their
debugging-only Python load balancer (``mini_lb``: fastapi, pydantic, aiohttp): ~1 s of CPU per
start, before the Rust router runs. The loopback tests start dozens of routers. Here one server
process imports those modules once and forks a child per router start; the child sets the
requested argv, environment, working directory and stdout/stderr (the log file's descriptor,
passed over the socket), then runs the console script file itself (``runpy``), as the
kernel's exec of it would: the same script, the same ``main()``, the same args. Only imports
already done are skipped. The server is single-threaded, so forking it is safe.

``LOOPBACK_ROUTER_EXEC=1`` turns this off (every start an exec, as before).

Run as a script by ``ForkServer``; standard library only.
"""
from __future__ import annotations

import atexit
import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Mapping, Sequence

# What the console scripts import before main() runs; a missing package is skipped.
PRELOAD = ("vllm_router.launch_router", "sglang_router.cli", "sglang_router.launch_router")


# --------------------------------------------------------------------------- server side


def _child(request: dict, log_fd: int, sock: socket.socket, wake_r: int, wake_w: int) -> None:
    """In the forked child: become the console script's process, run it, never return."""
    code = 1
    try:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        sock.close()
        os.close(wake_r)
        os.close(wake_w)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.dup2(log_fd, 1)
        os.dup2(log_fd, 2)
        os.close(devnull)
        os.close(log_fd)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        sys.argv = [request["script"], *request["args"]]
        sys.path[0] = os.path.dirname(request["script"])   # as for a script the kernel runs
        import runpy

        try:
            runpy.run_path(request["script"], run_name="__main__")
            code = 0
        except SystemExit as exc:   # as the interpreter itself turns it into an exit status
            if exc.code is None:
                code = 0
            elif isinstance(exc.code, int):
                code = exc.code
            else:
                print(exc.code, file=sys.stderr)
                code = 1
        except BaseException:
            import traceback

            traceback.print_exc()
            code = 1
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        os._exit(code & 0xFF)


def serve(sock: socket.socket) -> None:
    """Answer start requests on ``sock`` until it closes; then stop every child left."""
    for name in PRELOAD:
        try:
            __import__(name)
        except ImportError:
            pass
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    children: set[int] = set()
    buffer, fd_queue = b"", []

    def send(message: dict) -> None:
        sock.sendall(json.dumps(message).encode() + b"\n")

    def reap() -> None:
        for pid in list(children):
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                children.discard(pid)
                send({"pid": pid, "exit": os.waitstatus_to_exitcode(status)})

    try:
        while True:
            try:
                ready, _, _ = select.select([sock, wake_r], [], [])
            except InterruptedError:
                continue
            if wake_r in ready:
                os.read(wake_r, 512)
            reap()
            if sock not in ready:
                continue
            data, fds, _, _ = socket.recv_fds(sock, 1 << 20, 4)
            if not data:
                return
            buffer += data
            fd_queue += fds
            while b"\n" in buffer:
                line, buffer = buffer.split(b"\n", 1)
                request = json.loads(line)
                log_fd = fd_queue.pop(0)
                sys.stdout.flush()
                sys.stderr.flush()
                pid = os.fork()
                if pid == 0:
                    _child(request, log_fd, sock, wake_r, wake_w)
                os.close(log_fd)
                children.add(pid)
                send({"id": request["id"], "pid": pid})
    finally:
        for pid in children:
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 5
        for pid in children:
            while os.waitpid(pid, os.WNOHANG) == (0, 0) and time.monotonic() < deadline:
                time.sleep(0.05)
            try:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
            except (ProcessLookupError, ChildProcessError):
                pass


# --------------------------------------------------------------------------- client side


def forkable(binary: str) -> bool:
    """``binary`` is a console script this interpreter runs (its shebang names the same
    python), and forking is not turned off."""
    if os.environ.get("LOOPBACK_ROUTER_EXEC") == "1":
        return False
    try:
        with open(binary, "rb") as f:
            first = f.readline(512)
    except OSError:
        return False
    if not first.startswith(b"#!"):
        return False
    interpreter = first[2:].strip().split(b" ")[0].decode(errors="replace")
    try:
        return os.path.samefile(interpreter, sys.executable)
    except OSError:
        return False


class ForkedProcess:
    """A router started by the fork server; the part of ``subprocess.Popen`` the harness and
    the tests use (``pid``, ``returncode``, ``poll``, ``wait``, ``send_signal``,
    ``terminate``, ``kill``). Its exit status comes from the server, its parent."""

    def __init__(self, pid: int, args: list[str]) -> None:
        self.pid, self.args = pid, args
        self.returncode: int | None = None
        self._exited = threading.Event()

    def _set_exit(self, code: int) -> None:
        self.returncode = code
        self._exited.set()

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if not self._exited.wait(timeout):
            raise subprocess.TimeoutExpired(self.args, timeout)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class ForkServer:
    """The server process and its socket; ``start(...)`` -> a ForkedProcess. Thread-safe."""

    def __init__(self) -> None:
        ours, theirs = socket.socketpair()
        self._sock = ours
        self._proc = subprocess.Popen(
            [sys.executable, __file__, str(theirs.fileno()), str(Path(sys.executable).parent)],
            pass_fds=[theirs.fileno()],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
        theirs.close()
        self._lock = threading.Lock()
        self._ids = 0
        self._replies: dict[int, list] = {}
        self._live: dict[int, ForkedProcess] = {}
        self._early: dict[int, int] = {}   # exits read before the start's reply was handled
        self._cond = threading.Condition()
        self._closed = False
        threading.Thread(target=self._read, daemon=True, name="router-fork-server").start()

    def _read(self) -> None:
        buffer = b""
        while True:
            try:
                data = self._sock.recv(65536)
            except OSError:
                data = b""
            if not data:
                break
            buffer += data
            while b"\n" in buffer:
                line, buffer = buffer.split(b"\n", 1)
                message = json.loads(line)
                with self._cond:
                    if "id" in message:
                        self._replies[message["id"]] = message["pid"]
                    else:
                        proc = self._live.pop(message["pid"], None)
                        if proc is None:
                            self._early[message["pid"]] = message["exit"]
                        else:
                            proc._set_exit(message["exit"])
                    self._cond.notify_all()
        with self._cond:   # the server is gone (it stops its children when it can): no router
            self._closed = True   # outlives it unseen
            for proc in self._live.values():
                proc.kill()
                proc._set_exit(-signal.SIGKILL)
            self._live.clear()
            self._cond.notify_all()

    def start(self, script: str, args: Sequence[str], env: Mapping[str, str], log_fd: int,
              timeout: float = 30.0) -> ForkedProcess:
        with self._lock:
            self._ids += 1
            ident = self._ids
            request = {"id": ident, "script": script, "args": list(args), "env": dict(env),
                       "cwd": os.getcwd()}
            data = json.dumps(request).encode() + b"\n"
            sent = socket.send_fds(self._sock, [data], [log_fd])
            if sent < len(data):
                self._sock.sendall(data[sent:])
        with self._cond:
            if not self._cond.wait_for(lambda: ident in self._replies or self._closed,
                                       timeout):
                raise RuntimeError("router fork server did not answer")
            if ident not in self._replies:
                raise RuntimeError("router fork server exited")
            pid = self._replies.pop(ident)
            proc = ForkedProcess(pid, [script, *args])
            if pid in self._early:
                proc._set_exit(self._early.pop(pid))
            else:
                self._live[pid] = proc
        return proc

    def close(self) -> None:
        """Close the socket: the server stops whatever children are left, then exits."""
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._sock.close()
        try:
            self._proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()


_SERVER: ForkServer | None = None
_SERVER_LOCK = threading.Lock()


@atexit.register
def _shutdown_at_exit() -> None:
    shutdown()


def spawn(binary: str, args: Sequence[str], env: Mapping[str, str], log_fd: int):
    """``binary`` with ``args`` and ``env``, stdout and stderr on ``log_fd``, stdin empty: a
    ForkedProcess from the shared fork server where ``binary`` is forkable, else a Popen."""
    global _SERVER
    if forkable(binary):
        with _SERVER_LOCK:
            if _SERVER is None or _SERVER._closed:
                _SERVER = ForkServer()
            server = _SERVER
        return server.start(binary, args, env, log_fd)
    return subprocess.Popen([binary, *args], stdout=log_fd, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, env=dict(env))


def shutdown() -> None:
    """Stop the shared fork server (after the routers: see bench.loopback's atexit)."""
    global _SERVER
    with _SERVER_LOCK:
        server, _SERVER = _SERVER, None
    if server is not None:
        server.close()


if __name__ == "__main__":
    # The path a console script sees (its own folder first), not bench/: nothing here shadows
    # what the routers import.
    sys.path[0] = sys.argv[2]
    serve(socket.socket(fileno=int(sys.argv[1])))
