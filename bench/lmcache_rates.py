"""What LMCache's own client code costs, measured on this machine and written as data the
emulator reads (bench/data/lmcache_rates.json):

- `--client redis-py|resp`: GET/SET throughput of LMCache's Redis clients against a local
  redis-server, for the value sizes LMCache stores (one 256-token chunk per TP rank, or one
  layer of it with `use_layerwise`);
- `--client lookup`: the scheduler-side lookup of one prompt, as LMCacheLookupClient does it
  (lookup_client/lmcache_lookup_client.py: the prompt's chunk hashes by
  ChunkedTokenDatabase.process_tokens, sent by ZmqReqRepClientTransport to the worker's lookup
  server and answered), against a server process that checks the hashes in a dict as L1 does.

Why: an L2 hit pays only if reading a token's KV is cheaper than recomputing it, and on an H100
that is a race against ~25 us per token. The rate is the client's, not the network's: LMCache's
`redis://` connector (storage_backend/connector/redis_connector.py, 0.3.7 and 0.5.4) runs
`redis.asyncio` (redis-py) with whatever reply parser the image has, and neither LMCache
(`Requires-Dist: redis`) nor vLLM (requirements/common.txt) asks for hiredis, so the images run
redis-py's pure-Python parser. LMCache 0.5.4 also ships a C++ RESP client (`resp://`,
`lmcache.lmcache_redis`, native_clients/resp_client.py) that reads straight into the chunk's
buffer on its own threads.

Each client is measured with the python that has it (this file needs only the standard library
and the client), LMCache's own call pattern:
- `redis-py` sync: SET key+"kv_bytes", SET key+"metadata" per chunk; GET both, copy into a
  preallocated buffer (RedisConnector._put/_get);
- `redis-py` asyncio: the same coroutines, 4 at a time (AsyncPQExecutor's 4 workers);
- `resp`: RESPClient.batch_set/batch_get of one chunk per call, `--threads` native workers
  (LMCache's default `resp_num_threads` 8), 4 calls in flight.

    /work/scratch/venv-redis-pure/bin/python bench/lmcache_rates.py --client redis-py
    /work/scratch/venv-redis/bin/python bench/lmcache_rates.py --client redis-py   # + hiredis
    .venv-lmcache/bin/python bench/lmcache_rates.py --client resp --lmcache .lmcache-parsers/0.5.4
    .venv-lmcache/bin/python bench/lmcache_rates.py --client lookup --lmcache .lmcache-parsers/0.5.4

Figures, not assertions: loopback on this machine (no network, 2 shared cores); repeated.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# Bytes of one LMCache chunk per rank: 256 tokens x 2 (K, V) x layers x KV heads x head dim x
# 2 bytes / TP ranks; `/L`: one layer of it (use_layerwise stores a key per layer).
SIZES = {
    "llama-8b-tp1": 256 * 131072,            # 33.5 MB: h100-8b
    "llama-8b-tp4": 256 * 131072 // 4,       # 8.4 MB: g5.24xlarge
    "llama-70b-tp8": 256 * 327680 // 8,      # 10.5 MB: p4d / p5
    "llama-8b-tp1/L": 256 * 131072 // 32,    # 1.0 MB: one of 32 layers
    "llama-70b-tp8/L": 256 * 327680 // 8 // 80,   # 131 KB: one of 80 layers
}
BATCH_BYTES = 320 * 2 ** 20     # per trial and direction
IN_FLIGHT = 4                   # AsyncPQExecutor(max_workers=4)
META = b"m" * 64                # RemoteMetadata: a few ints, shapes and dtype


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self) -> None:
        binary = shutil.which("valkey-server") or shutil.which("redis-server")
        if not binary:
            raise SystemExit("redis-server not found (Debian redis-server)")
        self.port = free_port()
        self.dir = tempfile.TemporaryDirectory(prefix="redis-rates-")
        self.proc = subprocess.Popen(
            [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", self.dir.name], stdout=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), 0.2).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise SystemExit("redis-server did not start") from None
                time.sleep(0.05)
        self.version = subprocess.run([binary, "--version"], capture_output=True,
                                      text=True).stdout.strip()

    def cpu_s(self) -> float:
        """The server's CPU seconds so far (user + system, /proc)."""
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)
        self.dir.cleanup()


class Clock:
    """Wall, client CPU (this process, all threads) and server CPU seconds of one phase."""

    def __init__(self, server: "Server") -> None:
        self.server = server

    def __enter__(self) -> "Clock":
        self.t, self.c, self.s = time.perf_counter(), time.process_time(), self.server.cpu_s()
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall = time.perf_counter() - self.t
        self.client = time.process_time() - self.c
        self.srv = self.server.cpu_s() - self.s


def redis_py_sync(server: Server, size: int, n: int) -> tuple[Clock, Clock]:
    import redis

    r = redis.Redis(port=server.port)
    value = os.urandom(size)
    buf = bytearray(size)
    with Clock(server) as put:
        for i in range(n):
            r.set(f"k{i}kv_bytes", value)
            r.set(f"k{i}metadata", META)
    with Clock(server) as get:
        for i in range(n):
            r.get(f"k{i}metadata")
            buf[:size] = r.get(f"k{i}kv_bytes")
    r.flushall()
    r.close()
    return put, get


def redis_py_async(server: Server, size: int, n: int) -> tuple[Clock, Clock]:
    import redis.asyncio as aredis

    async def run() -> tuple[Clock, Clock]:
        pool = aredis.ConnectionPool(host="127.0.0.1", port=server.port, max_connections=150)
        r = aredis.Redis.from_pool(pool)
        value = os.urandom(size)
        bufs = [bytearray(size) for _ in range(IN_FLIGHT)]
        sem = asyncio.Semaphore(IN_FLIGHT)

        async def put(i: int) -> None:
            async with sem:
                await r.set(f"k{i}kv_bytes", value)
                await r.set(f"k{i}metadata", META)

        async def get(i: int) -> None:
            async with sem:
                await r.get(f"k{i}metadata")
                data = await r.get(f"k{i}kv_bytes")
                bufs[i % IN_FLIGHT][:size] = data

        with Clock(server) as p:
            await asyncio.gather(*(put(i) for i in range(n)))
        with Clock(server) as g:
            await asyncio.gather(*(get(i) for i in range(n)))
        await r.flushall()
        await r.aclose()
        return p, g

    return asyncio.run(run())


def resp_native(server: Server, size: int, n: int, threads: int) -> tuple[Clock, Clock]:
    from lmcache.v1.storage_backend.native_clients.resp_client import RESPClient

    async def run() -> tuple[Clock, Clock]:
        client = RESPClient("127.0.0.1", server.port, threads, asyncio.get_running_loop())
        value = memoryview(bytearray(os.urandom(size)))
        bufs = [memoryview(bytearray(size)) for _ in range(IN_FLIGHT)]
        sem = asyncio.Semaphore(IN_FLIGHT)

        async def put(i: int) -> None:
            async with sem:
                await client.batch_set([f"k{i}"], [value])

        async def get(i: int) -> None:
            async with sem:
                await client.batch_get([f"k{i}"], [bufs[i % IN_FLIGHT]])

        with Clock(server) as p:
            await asyncio.gather(*(put(i) for i in range(n)))
        with Clock(server) as g:
            await asyncio.gather(*(get(i) for i in range(n)))
        client.close()
        return p, g

    return asyncio.run(run())


PROMPTS = (2048, 8192, 65536)


def _lookup_server(path: str, ready: "object", stop: "object") -> None:
    """The worker side: decode, check every hash in a dict (L1's index), answer the prefix
    length in tokens as LMCacheLookupServer does (int.to_bytes, big endian)."""
    from lmcache.v1.rpc.zmq_transport import ZmqRouterServerTransport

    server = ZmqRouterServerTransport(path, recv_timeout_ms=100)
    index: dict[int, bool] = {}
    ready.set()
    while not stop.is_set():
        got = server.recv_request()
        if got is None:
            continue
        identity, (hashes, offsets, _lookup_id, _cfg) = got
        hit = 0
        for h, n in zip(hashes, offsets):
            if h not in index:
                break
            hit += n
        server.send_response(identity, hit.to_bytes(4, "big"))
    server.close()


def lookup_cost(repeats: int) -> dict:
    """One prompt's scheduler-side lookup with LMCache's own classes, per prompt length."""
    import multiprocessing as mp
    import random

    from lmcache.v1.rpc.zmq_transport import SocketParams, ZmqReqRepClientTransport
    from lmcache.v1.token_database import ChunkedTokenDatabase

    out: dict = {"cells": {}}
    with tempfile.TemporaryDirectory(prefix="lmc-lookup-") as tmp:
        path = f"{tmp}/lookup.sock"
        ctx = mp.get_context("spawn")
        ready, stop = ctx.Event(), ctx.Event()
        proc = ctx.Process(target=_lookup_server, args=(path, ready, stop), daemon=True)
        proc.start()
        ready.wait(30)
        client = ZmqReqRepClientTransport([SocketParams(path, 0)], timeout_ms=5000)
        db = ChunkedTokenDatabase(None, None)
        rng = random.Random(1)
        try:
            for n in PROMPTS:
                hash_s, total_s = [], []
                for _ in range(repeats):
                    tokens = [rng.randrange(128000) for _ in range(n)]
                    best_hash = best_total = float("inf")
                    for _ in range(20):
                        t = time.perf_counter()
                        hashes, offsets = [], []
                        for start, end, key in db.process_tokens(tokens, make_key=False):
                            hashes.append(key)
                            offsets.append(end - start)
                        t1 = time.perf_counter()
                        client.send_and_recv_all([hashes, offsets, "req", ""])
                        t2 = time.perf_counter()
                        best_hash = min(best_hash, t1 - t)
                        best_total = min(best_total, t2 - t)
                    hash_s.append(best_hash)
                    total_s.append(best_total)
                out["cells"][str(n)] = {
                    "prompt_tokens": n, "hash_ms": [round(x * 1e3, 4) for x in hash_s],
                    "lookup_ms": [round(x * 1e3, 4) for x in total_s],
                    "lookup_ms_median": round(statistics.median(total_s) * 1e3, 4),
                    "hash_us_per_token_median": round(statistics.median(hash_s) / n * 1e6, 5)}
                print(f"lookup {n}: {out['cells'][str(n)]}", file=sys.stderr, flush=True)
        finally:
            client.close()
            stop.set()
            proc.join(10)
    out["method"] = ("best of 20 lookups per repeat (the machine is shared); builtin hash, as "
                     "LMCache falls back to when vLLM has no 'builtin' hash function")
    return out


def measure(client: str, sizes: dict[str, int], repeats: int, threads: int) -> dict:
    server = Server()
    out: dict = {"server": server.version, "cells": {}}
    try:
        modes = {"redis-py": ("sync", "asyncio"), "resp": ("asyncio",)}[client]
        for mode in modes:
            for name, size in sizes.items():
                n = max(8, BATCH_BYTES // size)
                runs: dict[str, list[float]] = {}
                for _ in range(repeats):
                    if client == "resp":
                        p, g = resp_native(server, size, n, threads)
                    elif mode == "sync":
                        p, g = redis_py_sync(server, size, n)
                    else:
                        p, g = redis_py_async(server, size, n)
                    gb = n * size / 1e9
                    for op, c in (("set", p), ("get", g)):
                        # wall: end to end here; client/server: GB per CPU second of each
                        # (what one core of its own would sustain)
                        runs.setdefault(f"{op}_gbs", []).append(gb / c.wall)
                        runs.setdefault(f"{op}_client_cpu_gbs", []).append(
                            gb / max(c.client, 1e-6))
                        runs.setdefault(f"{op}_server_cpu_gbs", []).append(
                            gb / max(c.srv, 1e-6))
                cell = {"mode": mode, "value": name, "value_bytes": size, "values": n}
                for k, xs in runs.items():
                    cell[k] = [round(x, 3) for x in xs]
                    cell[f"{k}_median"] = round(statistics.median(xs), 3)
                out["cells"][f"{mode}/{name}"] = cell
                print(f"{client} {mode} {name}: " + ", ".join(
                    f"{k} {cell[k + '_median']:.2f}" for k in runs), file=sys.stderr,
                    flush=True)
    finally:
        server.close()
    return out


def client_version(client: str) -> dict:
    if client in ("resp", "lookup"):
        import lmcache

        return {"lmcache": getattr(lmcache, "__version__", None) or _dist("lmcache")}
    import redis
    from redis.utils import HIREDIS_AVAILABLE

    info = {"redis-py": redis.__version__, "hiredis": None}
    if HIREDIS_AVAILABLE:
        import hiredis

        info["hiredis"] = hiredis.__version__
    return info


def _dist(name: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--client", choices=("redis-py", "resp", "lookup"), required=True)
    p.add_argument("--label", help="the row's name in --json (default: the client and parser)")
    p.add_argument("--lmcache", type=Path, help="folder holding the `lmcache` package (resp)")
    p.add_argument("--threads", type=int, default=8, help="resp: native worker threads")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--only", nargs="+", choices=list(SIZES), help="value sizes to run")
    p.add_argument("--json", type=Path, default=Path(__file__).parent / "data" /
                   "lmcache_rates.json", help="merged into, one row per label")
    a = p.parse_args(argv)
    if a.lmcache:
        sys.path.insert(0, str(a.lmcache.resolve()))
    version = client_version(a.client)
    label = a.label or {"resp": f"resp-native-{a.threads}t", "lookup": "lookup"}.get(
        a.client, f"redis-py-{'hiredis' if version.get('hiredis') else 'pure'}")
    sizes = {k: v for k, v in SIZES.items() if not a.only or k in a.only}
    row = (lookup_cost(a.repeats) if a.client == "lookup" else
           measure(a.client, sizes, a.repeats, a.threads))
    row.update(client=a.client, versions=version, python=platform.python_version(),
               machine=_cpu(), in_flight=IN_FLIGHT, repeats=a.repeats,
               threads=a.threads if a.client == "resp" else None,
               in_flight_note=None if a.client == "lookup" else "AsyncPQExecutor's 4 workers",
               measured=time.strftime("%Y-%m-%d"))
    data = json.loads(a.json.read_text()) if a.json.exists() else {}
    data.setdefault("about", __doc__.split("\n\n")[0])
    data.setdefault("clients", {})[label] = row
    a.json.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    return 0


def _cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return f"{line.split(':', 1)[1].strip()}, {os.cpu_count()} CPUs"
    except OSError:
        pass
    return platform.processor()


if __name__ == "__main__":
    raise SystemExit(main())
