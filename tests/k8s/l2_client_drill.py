"""The L2 client's fault drill: LMCache's own RemoteBackend, built from the lmcache.yaml we
render, against a real Redis-protocol server that evicts, stops and starts again empty.

Run with .venv-lmcache's python and the worker image's LMCache release on PYTHONPATH
(tests/k8s/test_l2_client_faults.py does); nothing here imports the project. It drives the
calls the engine makes on a retrieve (lmcache/v1/cache_engine.py `_process_tokens_internal`:
`StorageManager.get_block_mapping` -> `RemoteBackend.batched_contains`, then
`StorageManager.batched_get` -> `RemoteBackend.batched_get_blocking` of the prefix the lookup
found), with the read placed where a real fleet puts it: after a lookup that said "hit", the
server stalls, stops, or evicts the chunk (other writers fill it past maxmemory), and only then
the read.

Every buffer LMCache allocates for a read is filled with a poison byte first, as a reused
buffer of the engine holds another chunk's KV: a read that writes nothing comes back wrong,
never right by chance. Each call gets `--bound` seconds (run in a thread); one that has not
returned by then is counted hung and left behind. Prints one JSON line: per phase, the chunks
read right, read wrong (bytes other than those put), missing (None: a miss the engine
recomputes), hung, and the slowest call.

    python l2_client_drill.py --config lmcache.yaml --server redis-server --bound 5
"""
from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import types
from concurrent.futures import Future, TimeoutError as FutureTimeout
from pathlib import Path

POISON = 0xA5
LAYERS, HEADS, DIM, CHUNK = 2, 2, 64, 256     # one chunk: 256 KiB of bfloat16


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A Redis-protocol server as the in-cluster Valkey is rendered (no persistence,
    allkeys-lru), on a loopback port, with a small maxmemory."""

    def __init__(self, binary: str, maxmemory_mb: int) -> None:
        self.port = free_port()
        self.dir = tempfile.mkdtemp(prefix="l2drill-")
        self.args = [shutil.which(binary) or binary, "--port", str(self.port), "--bind",
                     "127.0.0.1", "--save", "", "--appendonly", "no", "--maxmemory",
                     f"{maxmemory_mb}mb", "--maxmemory-policy", "allkeys-lru",
                     "--protected-mode", "no", "--dir", self.dir]
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(self.args, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
        for _ in range(200):
            try:
                socket.create_connection(("127.0.0.1", self.port), 0.2).close()
                return
            except OSError:
                time.sleep(0.025)
        raise SystemExit(f"{self.args[0]} did not listen on {self.port}")

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(10)

    def evicted(self) -> int:
        out = subprocess.run([shutil.which("redis-cli") or "redis-cli", "-p", str(self.port),
                              "info", "stats"], capture_output=True, text=True, timeout=10)
        line = next((x for x in out.stdout.splitlines() if x.startswith("evicted_keys:")), "")
        return int(line.split(":")[1]) if line else -1


class Drill:
    def __init__(self, config_path: str, port: int, bound: float) -> None:
        import torch
        import yaml

        from lmcache.v1.config import LMCacheEngineConfig
        from lmcache.v1.memory_allocators.host_memory_allocator import HostMemoryAllocator
        from lmcache.v1.metadata import LMCacheMetadata
        from lmcache.v1.storage_backend.remote_backend import RemoteBackend

        cfg = yaml.safe_load(Path(config_path).read_text())
        scheme = cfg["remote_url"].split("://", 1)[0]
        cfg["remote_url"] = f"{scheme}://127.0.0.1:{port}"
        local = Path(tempfile.mkdtemp(prefix="l2drill-cfg-")) / "lmcache.yaml"
        local.write_text(yaml.safe_dump(cfg))
        self.config = LMCacheEngineConfig.from_file(str(local))
        self.meta = LMCacheMetadata(model_name="drill", world_size=1, local_world_size=1,
                                    worker_id=0, local_worker_id=0, kv_dtype=torch.bfloat16,
                                    kv_shape=(LAYERS, 2, CHUNK, HEADS, DIM))
        self.allocator = HostMemoryAllocator(256 * 2 ** 20)
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, daemon=True).start()
        # what the connector allocates its read buffers from (LocalCPUBackend.allocate)
        cpu = types.SimpleNamespace(config=self.config, metadata=self.meta,
                                    allocate=self._poisoned)
        self.backend = RemoteBackend(self.config, self.meta, self.loop, cpu, dst_device="cpu")
        self.bound = bound
        self.sums: dict[str, str] = {}
        self.n = 0

    def _poisoned(self, shapes, dtypes, fmt=None, *_a, **_k):
        import torch
        o = self.allocator.allocate(shapes, dtypes, fmt) if fmt is not None else \
            self.allocator.allocate(shapes, dtypes)
        if o is not None:
            o.tensor.view(-1).view(torch.uint8).fill_(POISON)
        return o

    def keys(self, n: int) -> list:
        import torch

        from lmcache.utils import CacheEngineKey
        out = [CacheEngineKey("drill", 1, 0, self.n + i, torch.bfloat16) for i in range(n)]
        self.n += n
        return out

    @staticmethod
    def digest(o) -> str:
        return hashlib.blake2b(bytes(o.byte_array), digest_size=16).hexdigest()

    def call(self, fn, *a) -> tuple[str, object, float]:
        """("ok"|"error"|"hung", value, seconds) for fn(*a), given `bound` s."""
        fut: Future = Future()

        def run() -> None:
            try:
                fut.set_result(fn(*a))
            except BaseException as e:  # noqa: BLE001
                fut.set_exception(e)
        t = time.monotonic()
        threading.Thread(target=run, daemon=True).start()
        try:
            v = fut.result(self.bound)
            return "ok", v, time.monotonic() - t
        except FutureTimeout:
            return "hung", None, time.monotonic() - t
        except Exception as e:  # noqa: BLE001
            return "error", f"{type(e).__name__}: {e}", time.monotonic() - t

    def put(self, keys: list) -> tuple[str, float]:
        """Store as the engine does (batched_submit_put_task), waiting for the write."""
        import torch
        objs = []
        for k in keys:
            o = self.allocator.allocate(self.meta.get_shapes(), self.meta.get_dtypes())
            o.tensor.view(-1).view(torch.uint8).random_(0, 255)
            self.sums[str(k)] = self.digest(o)
            objs.append(o)

        def store() -> None:
            left = threading.Semaphore(0)
            self.backend.batched_submit_put_task(keys, objs,
                                                 on_complete_callback=lambda _: left.release())
            for _ in keys:       # called per key once its write ended (failed ones too)
                left.acquire()
        state, _, dt = self.call(store)
        if state == "ok":     # a store still running keeps its buffers
            for o in objs:
                o.ref_count_down()
        return state, dt

    def lookup(self, keys: list) -> tuple[str, object, float]:
        return self.call(self.backend.batched_contains, keys)

    def read(self, keys: list, tally: dict) -> None:
        if not keys:
            return
        state, got, dt = self.call(self.backend.batched_get_blocking, keys)
        tally["slowest_s"] = round(max(tally["slowest_s"], dt), 3)
        if state != "ok":
            tally["hung" if state == "hung" else "error"] += len(keys)
            tally["hung_calls"] += state == "hung"
            return
        for k, o in zip(keys, got):
            if o is None:
                tally["missing"] += 1
                continue
            tally["right" if self.sums.get(str(k)) == self.digest(o) else "wrong"] += 1
            o.ref_count_down()

    def step(self, tally: dict, state: str, dt: float) -> None:
        tally["slowest_s"] = round(max(tally["slowest_s"], dt), 3)
        if state == "hung":
            tally["hung_calls"] += 1


def tally() -> dict:
    return {"right": 0, "wrong": 0, "missing": 0, "hung": 0, "error": 0, "hung_calls": 0,
            "slowest_s": 0.0, "lookup_hits": 0, "lookup_failed": 0}


def lookup(d: Drill, t: dict, keys: list) -> list:
    """The prefix of `keys` the lookup says is there: what the engine then reads."""
    state, hit, dt = d.lookup(keys)
    d.step(t, state, dt)
    if state != "ok":
        t["lookup_failed"] += 1
        return []
    t["lookup_hits"] += hit
    return keys[:hit]


def fits(d: Drill, server: Server, a, per: int) -> dict:
    """Below maxmemory: lookup, then read."""
    t = tally()
    keys = d.keys(per)
    d.step(t, *d.put(keys))
    d.read(lookup(d, t, keys), t)
    return t


def evicted_after_lookup(d: Drill, server: Server, a, per: int) -> dict:
    """The lookup says hit; other writers then fill the server past maxmemory (allkeys-lru
    evicts the chunk); then the read."""
    t = tally()
    fill = a.maxmemory_mb * 2 ** 20 * 2 // (LAYERS * 2 * CHUNK * HEADS * DIM * 2)
    for _ in range(a.rounds):
        keys = d.keys(per)
        d.step(t, *d.put(keys))
        hits = lookup(d, t, keys)
        for _ in range(0, fill, per):
            if t["hung_calls"] >= a.give_up:
                break
            d.step(t, *d.put(d.keys(per)))
        d.read(hits, t)
    t["server_evicted_keys"] = server.evicted()
    return t


def paused_after_lookup(d: Drill, server: Server, a, per: int) -> dict:
    """The server stalls (SIGSTOP) between the lookup and the read for longer than
    blocking_timeout_secs, then goes on; later stores, lookups and reads come back."""
    t = tally()
    t["round_trips_right"] = 0
    keys = d.keys(per)
    d.step(t, *d.put(keys))
    hits = lookup(d, t, keys)
    server.proc.send_signal(signal.SIGSTOP)
    try:
        d.read(hits, t)
        time.sleep(0.5)
    finally:
        server.proc.send_signal(signal.SIGCONT)
    round_trips(d, t, a, per)
    return t


def round_trips(d: Drill, t: dict, a, per: int) -> None:
    """Store, look up and read back fresh chunks: each round whose every chunk came back
    right counts."""
    for _ in range(a.rounds):
        if t["hung_calls"] >= a.give_up:
            break
        keys = d.keys(per)
        d.step(t, *d.put(keys))
        before = t["right"]
        d.read(lookup(d, t, keys), t)
        t["round_trips_right"] += t["right"] - before == per


def stopped_after_lookup(d: Drill, server: Server, a, per: int) -> dict:
    """The server goes away between the lookup and the read; then, while it is down, every
    call (store, lookup, read) ends."""
    t = tally()
    keys = d.keys(per)
    d.step(t, *d.put(keys))
    hits = lookup(d, t, keys)
    server.stop()
    d.read(hits, t)
    for _ in range(a.rounds):
        if t["hung_calls"] >= a.give_up:
            break
        keys = d.keys(per)
        d.step(t, *d.put(keys))
        d.read(lookup(d, t, keys), t)
    return t


def restarted(d: Drill, server: Server, a, per: int) -> dict:
    """Started again, empty, on its port: stores, lookups and reads come back."""
    if server.proc is None or server.proc.poll() is None:
        server.stop()
    server.start()
    t = tally()
    t["round_trips_right"] = 0
    round_trips(d, t, a, per)
    return t


PHASES = {f.__name__: f for f in (fits, paused_after_lookup, stopped_after_lookup, restarted,
                                   evicted_after_lookup)}


def drill(config: str, a) -> dict:
    """Every phase in order against one client and one server of its own."""
    server = Server(a.server, a.maxmemory_mb)
    server.start()
    out: dict = {}
    try:
        d = Drill(config, server.port, a.bound)
        out.update(url=d.config.remote_url.split("://")[0] + "://",
                   blocking_timeout_secs=d.config.blocking_timeout_secs, bound_s=a.bound)
        for name in a.phases.split(","):
            t = out[name] = PHASES[name](d, server, a, 4)     # 4 chunks per prefill
            if a.fail_fast and (t["wrong"] or t["hung_calls"]):
                break
    finally:
        server.stop()
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", action="append", required=True,
                    help="an lmcache.yaml; several run side by side, each with its server")
    ap.add_argument("--server", default="redis-server")
    ap.add_argument("--maxmemory-mb", type=int, default=16)
    ap.add_argument("--bound", type=float, default=5.0)
    ap.add_argument("--rounds", type=int, default=3, help="evict/stop rounds")
    ap.add_argument("--phases", default=",".join(PHASES),
                    help="in order, one client throughout")
    ap.add_argument("--fail-fast", action="store_true",
                    help="stop after the first phase with a wrong read or a hung call")
    a = ap.parse_args()
    a.give_up = 1 if a.fail_fast else 2    # hung calls after which a phase's loop stops
    results: dict = {}

    def run(config: str) -> None:
        try:
            results[config] = drill(config, a)
        except Exception as e:  # noqa: BLE001
            results[config] = {"failed": f"{type(e).__name__}: {e}"}
    threads = [threading.Thread(target=run, args=(c,), daemon=True) for c in a.config]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    print("DRILL " + json.dumps(results), flush=True)
    os._exit(0)    # hung calls leave threads (native or asyncio) that would block exit


if __name__ == "__main__":
    main()
