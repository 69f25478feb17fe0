"""LMCache's own config code, the release a worker image carries, run on what we render.

Each release we know an image to carry is installed apart (`make` builds .lmcache-parsers/
from requirements-lmcache-parsers.txt) and imported with .venv-lmcache's python ahead of the
release installed there (0.5.6, the newest, which also reads configs of images whose LMCache
is not known). LMCache ignores unknown keys with a warning and turns bad values into None, so
callers assert the values it read and that it warned about no key.
"""
from __future__ import annotations

import json
import os
import subprocess

from tests.conftest import ROOT

LMCACHE_PY = ROOT / ".venv-lmcache" / "bin" / "python"
PARSERS = ROOT / ".lmcache-parsers"
NEWEST = "venv"   # the release in .venv-lmcache itself

_PARSE = """
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
out = []
for path in sys.argv[1:]:
    del unknown[:]
    c = LMCacheEngineConfig.from_file(path)
    out.append({"file": lmcache.__file__, "unknown": list(unknown),
                "values": {k: getattr(c, k) for k in _CONFIG_DEFINITIONS
                           if isinstance(getattr(c, k), (str, int, float, bool, dict,
                                                         type(None)))}})
print("PARSED" + json.dumps(out))
"""


def parser_versions() -> list[str]:
    lines = (ROOT / "requirements-lmcache-parsers.txt").read_text().splitlines()
    return [line.split("==", 1)[1] for line in lines if line.startswith("lmcache==")]


def parse(version: str, paths: list[str], env: dict | None = None) -> list[dict]:
    """Parse config files with one LMCache release ("0.3.7", ... or NEWEST)."""
    assert LMCACHE_PY.exists(), "run `make test` (it creates .venv-lmcache)"
    extra = {}
    if version != NEWEST:
        where = PARSERS / version
        assert where.is_dir(), "run `make test` (it creates .lmcache-parsers)"
        extra["PYTHONPATH"] = str(where)
    proc = subprocess.run([str(LMCACHE_PY), "-c", _PARSE, *paths], capture_output=True,
                          text=True, timeout=180, env={**os.environ, **(env or {}), **extra})
    assert proc.returncode == 0, proc.stderr[-2000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("PARSED"))
    return json.loads(line.removeprefix("PARSED"))
