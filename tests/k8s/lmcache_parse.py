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
_SERVERS: dict[str, tuple[subprocess.Popen, Path]] = {}


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
            return json.loads(line.removeprefix("PARSED"))
    raise AssertionError(f"LMCache {version} parser exited: {log.read_text()[-2000:]}")


def parse_server_args(version: str, argv: list[str]) -> dict:
    """`lmcache server`'s arguments as that release's own CLI reads them."""
    proc, log = _server(version)
    proc.stdin.write(json.dumps({"server_args": argv}) + "\n")
    proc.stdin.flush()
    for line in proc.stdout:
        if line.startswith("PARSED"):
            return json.loads(line.removeprefix("PARSED"))[0]
    raise AssertionError(f"LMCache {version} parser exited: {log.read_text()[-2000:]}")


def start(*versions: str) -> None:
    """Start these releases' parsers now, side by side (a caller about to parse with several
    of them: each imports while the others do)."""
    for version in versions:
        _server(version)


def _server(version: str) -> tuple[subprocess.Popen, Path]:
    if version in _SERVERS and _SERVERS[version][0].poll() is None:
        return _SERVERS[version]
    return _start(version)


def _start(version: str) -> tuple[subprocess.Popen, Path]:
    assert LMCACHE_PY.exists(), "run `make test` (it creates .venv-lmcache)"
    extra = {}
    if version != NEWEST:
        where = PARSERS / version
        assert where.is_dir(), "run `make test` (it creates .lmcache-parsers)"
        extra["PYTHONPATH"] = str(where)
    log = Path(tempfile.mkstemp(prefix=f"lmcache-{version}-", suffix=".log")[1])
    proc = subprocess.Popen([str(LMCACHE_PY), "-c", _SERVE], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=log.open("w"), text=True,
                            env={**os.environ, **extra})
    atexit.register(_stop, proc, log)
    _SERVERS[version] = (proc, log)
    return proc, log


def _stop(proc: subprocess.Popen, log: Path) -> None:
    proc.stdin.close()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
    log.unlink(missing_ok=True)
