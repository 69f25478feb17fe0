"""LMCache's own config code, the release a worker image carries, run on what we render.

Each release we know an image to carry is installed apart (`make` builds .lmcache-parsers/
from requirements-lmcache-parsers.txt) and imported with .venv-lmcache's python ahead of the
release installed there (0.5.6, the newest, which also reads configs of images whose LMCache
is not known). LMCache ignores unknown keys with a warning and turns bad values into None, so
callers assert the values it read and that it warned about no key.
"""
from __future__ import annotations

import atexit
import json
import os
import socket
import subprocess
import tempfile
from pathlib import Path

from tests.conftest import ROOT

LMCACHE_PY = ROOT / ".venv-lmcache" / "bin" / "python"
PARSERS = ROOT / ".lmcache-parsers"
NEWEST = "venv"   # the release in .venv-lmcache itself

# One process per release serves every parse of the session: importing LMCache (and the torch
# it imports) costs seconds of CPU, parsing a file milliseconds; a release is started only when
# a session needs it, and a caller that needs several starts them together (`start`), so that
# they import side by side. Requests are JSON lists of paths on
# stdin; each answer is one PARSED line on stdout (LMCache's own log lines go to a file).
_SERVE = """
import json, logging, sys
import lmcache
from lmcache.v1.config import LMCacheEngineConfig, _CONFIG_DEFINITIONS
unknown = []
class Catch(logging.Handler):
    def emit(self, record):
        if "Unknown configuration key" in record.getMessage():
            unknown.append(record.getMessage())
logging.getLogger("lmcache").addHandler(Catch())
for lg in list(logging.root.manager.loggerDict):
    if lg.startswith("lmcache"):
        logging.getLogger(lg).addHandler(Catch())
def server(argv):
    # `lmcache server`'s own parser (lmcache/cli/commands/server.py), which skips its arguments
    # silently when an import fails: a parser without --l1-size-gb is an error here
    import argparse
    from lmcache.cli.commands.server import ServerCommand
    from lmcache.v1.distributed.config import parse_args_to_config
    from lmcache.v1.multiprocess.config import (
        parse_args_to_http_frontend_config, parse_args_to_mp_server_config)
    parser = argparse.ArgumentParser(prog="lmcache", exit_on_error=False)
    ServerCommand().register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(argv)
    if not hasattr(args, "l1_size_gb"):
        raise SystemExit("lmcache server registered no arguments (an import failed)")
    sm, mp = parse_args_to_config(args), parse_args_to_mp_server_config(args)
    http = parse_args_to_http_frontend_config(args)
    mem = sm.l1_manager_config.memory_config
    return {"host": mp.host, "port": mp.port, "chunk_size": mp.chunk_size,
            "transfer": mp.supported_transfer_mode, "shm_name": mem.shm_name,
            "l1_bytes": mem.size_in_bytes, "eviction": sm.eviction_config.eviction_policy,
            "http": [http.http_host, http.http_port],
            "l2": [dict(vars(a), type=type(a).__name__) for a in sm.l2_adapter_config.adapters]}
for request in sys.stdin:
    out = []
    asked = json.loads(request)
    if isinstance(asked, dict):
        print("PARSED" + json.dumps([server(asked["server_args"])], default=str), flush=True)
        continue
    for path in asked:
        del unknown[:]
        c = LMCacheEngineConfig.from_file(path)
        out.append({"file": lmcache.__file__, "unknown": list(unknown),
                    "values": {k: getattr(c, k) for k in _CONFIG_DEFINITIONS
                               if isinstance(getattr(c, k), (str, int, float, bool, dict,
                                                             type(None)))}})
    print("PARSED" + json.dumps(out), flush=True)
"""
# Every release imports torch, which is most of the seconds: one process imports it and forks
# a parser per release, which puts its release first on sys.path (where PYTHONPATH would) and
# imports that LMCache. It takes {"path", "log"} lines with the parser's socket attached
# (SCM_RIGHTS) on its stdin, a socket; a fork's stdin and stdout are that socket.
_FORK_SERVER = """
import json, os, signal, socket, sys
import torch   # what each release imports first (LMCache's own modules come after the fork)
signal.signal(signal.SIGCHLD, signal.SIG_IGN)   # the parsers are reaped as they exit
ctrl = socket.socket(fileno=0)
while True:
    msg, fds, _, _ = socket.recv_fds(ctrl, 4096, 1)
    if not msg:
        break
    asked = json.loads(msg)
    if os.fork() == 0:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        ctrl.close()
        os.dup2(fds[0], 0)
        os.dup2(fds[0], 1)
        os.close(fds[0])
        log = os.open(asked["log"], os.O_WRONLY)
        os.dup2(log, 2)
        os.close(log)
        if asked["path"]:
            sys.path.insert(1, asked["path"])
        code = 0
        try:
            exec(compile(sys.argv[1], "<lmcache-parser>", "exec"), {"__name__": "__main__"})
        except BaseException:
            import traceback
            traceback.print_exc()
            code = 1
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    os.close(fds[0])
"""
_FORK: tuple[subprocess.Popen, socket.socket, Path] | None = None
_SERVERS: dict[str, tuple["_Parser", Path]] = {}


def parser_versions() -> list[str]:
    lines = (ROOT / "requirements-lmcache-parsers.txt").read_text().splitlines()
    return [line.split("==", 1)[1] for line in lines if line.startswith("lmcache==")]


def parse(version: str, paths: list[str]) -> list[dict]:
    """Parse config files with one LMCache release ("0.3.7", ... or NEWEST)."""
    proc, log = _server(version)
    proc.stdin.write(json.dumps([str(p) for p in paths]) + "\n")
    proc.stdin.flush()
    for line in proc.stdout:
        if line.startswith("PARSED"):
            parsed = json.loads(line.removeprefix("PARSED"))
            # the release asked for read them, not another one on the path
            where = (LMCACHE_PY.parents[1] if version == NEWEST else PARSERS / version).resolve()
            assert all(Path(p["file"]).resolve().is_relative_to(where) for p in parsed), (
                version, {p["file"] for p in parsed})
            return parsed
    raise _exited(version, proc, log)


def parse_server_args(version: str, argv: list[str]) -> dict:
    """`lmcache server`'s arguments as that release's own CLI reads them."""
    proc, log = _server(version)
    proc.stdin.write(json.dumps({"server_args": argv}) + "\n")
    proc.stdin.flush()
    for line in proc.stdout:
        if line.startswith("PARSED"):
            return json.loads(line.removeprefix("PARSED"))[0]
    raise _exited(version, proc, log)


def start(*versions: str) -> None:
    """Start these releases' parsers now, side by side (a caller about to parse with several
    of them: each imports while the others do)."""
    for version in versions:
        _server(version)


def _server(version: str) -> tuple[_Parser, Path]:
    if version in _SERVERS and _SERVERS[version][0].alive:
        return _SERVERS[version]
    return _start(version)


class _Parser:
    """One release's parser: the socket to the process forked for it (`stdin` and `stdout`
    as a subprocess's pipes)."""

    def __init__(self, sock: socket.socket):
        self.sock, self.alive = sock, True
        self.stdin, self.stdout = sock.makefile("w"), sock.makefile("r")

    def close(self) -> None:
        self.alive = False
        self.stdin.close()
        self.stdout.close()
        self.sock.close()


def _fork_server() -> tuple[subprocess.Popen, socket.socket, Path]:
    """The parent of every release's parser (started once, with the first)."""
    global _FORK
    if _FORK is None or _FORK[0].poll() is not None:
        assert LMCACHE_PY.exists(), "run `make test` (it creates .venv-lmcache)"
        ours, theirs = socket.socketpair()
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        log = Path(tempfile.mkstemp(prefix="lmcache-fork-", suffix=".log")[1])
        proc = subprocess.Popen([str(LMCACHE_PY), "-c", _FORK_SERVER, _SERVE],
                                stdin=theirs.fileno(), stdout=subprocess.DEVNULL,
                                stderr=log.open("w"), env=env)
        theirs.close()
        atexit.register(_stop_fork_server, proc, ours, log)
        _FORK = (proc, ours, log)
    return _FORK


def _start(version: str) -> tuple[_Parser, Path]:
    where = ""
    if version != NEWEST:
        assert (PARSERS / version).is_dir(), "run `make test` (it creates .lmcache-parsers)"
        where = str(PARSERS / version)
    log = Path(tempfile.mkstemp(prefix=f"lmcache-{version}-", suffix=".log")[1])
    ours, theirs = socket.socketpair()
    socket.send_fds(_fork_server()[1], [json.dumps({"path": where, "log": str(log)}).encode()],
                    [theirs.fileno()])
    theirs.close()   # the forked parser holds the only other end: its exit is our EOF
    parser = _Parser(ours)
    atexit.register(_stop, parser, log)
    _SERVERS[version] = (parser, log)
    return parser, log


def _stop(parser: _Parser, log: Path) -> None:
    if parser.alive:
        try:
            parser.sock.shutdown(socket.SHUT_WR)   # its request loop ends; it exits
            parser.sock.settimeout(10)
            parser.stdout.read()
        except OSError:
            pass
        parser.close()
    log.unlink(missing_ok=True)


def _stop_fork_server(proc: subprocess.Popen, ctrl: socket.socket, log: Path) -> None:
    ctrl.close()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    log.unlink(missing_ok=True)


def _exited(version: str, parser: _Parser, log: Path) -> AssertionError:
    parser.close()
    fork_log = _FORK[2].read_text()[-1000:] if _FORK else ""
    return AssertionError(f"LMCache {version} parser exited: {log.read_text()[-2000:]}"
                          f"{fork_log}")
