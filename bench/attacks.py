"""One hostile client against the router pod, full size, on 127.0.0.1: the real front (HAProxy)
with the rendered config, the real router with the rendered args and environment, fake
workers. While each attack runs, a well-behaved client from another address sends 20 chats,
spread over the attack; the figures are its chats (answered, within 5 s) and the router's
memory (RSS, sampled every 0.25 s) against the container's rendered limit.

    python -m bench.attacks                          # every attack, both cases, ~10 minutes
    python -m bench.attacks --only parked,slots --cases default
    python -m bench.attacks --out bench/data/front_attacks.json --label after

Attacks (the client holds the endpoint key, as every client does):
  h2      100 connections x 100 HTTP/2 (h2c) streams, each declaring a body at the router's
          payload limit and sending 1 KB of it
  parked  2,000 connections, each sending a body one byte short of its Content-Length, at the
          router's payload limit
  sse     20 streamed chats of up to 1M tokens whose client never reads (the fake worker
          generating as fast as it can, `--sse-decode-ms`)
  slots   4,200 connections: a third idle, a third sending its headers a line a second
          (slowloris), a third sending its body a byte a second
  5xx     4 loops of chats that make a worker answer 500 (an input its engine fails on)

Cases: `default` (the default environment's prefixaware: sglang-router) and `session`
(vllm-router). Where the front expects the NLB's PROXY header, both clients come through the
fake NLB with addresses of their own; otherwise from two loopback addresses of their own.
Figures, not assertions. Standard library and the project only.
"""
from __future__ import annotations

import argparse
import json
import socket
import statistics
import struct
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable

from bench.loopback import (
    FAKE_NLB, FakeWorkerPool, FrontProcess, LOOPBACK, RouterProcess, arg_value, chat,
    proxy_v2_header,
)
from bench.router_checks import (
    AUTH, KEY, WORKER_OPTS, Background, RenderedRouter, rendered, router_pod, rss_mib,
)
GOOD_CHATS, GOOD_WITHIN_S = 20, 5.0
FAIL_MARKER = "provoke-a-worker-500"
CASES = {"default": (None, None), "session": ("session", "vllm-router")}
ATTACKS = ("h2", "parked", "sse", "slots", "5xx")


class Source:
    """A client address. Through the NLB (when the front expects its PROXY header) it is the
    address in that header; otherwise a loopback address of its own."""

    def __init__(self, client: str, loopback: str, nlb: bool) -> None:
        self.client, self.loopback, self.nlb = client, loopback, nlb

    def connect(self, port: int, timeout: float = 10.0, n: int = 0) -> socket.socket:
        sock = socket.socket()
        sock.settimeout(timeout)
        sock.bind((FAKE_NLB if self.nlb else self.loopback, 0))
        sock.connect((LOOPBACK, port))
        if self.nlb:
            sock.sendall(proxy_v2_header(self.client, self.port(n)))
        return sock

    @staticmethod
    def port(n: int) -> int:
        return 1024 + n % 60000

    def log_key(self, sock: socket.socket, n: int) -> str:
        """How the front's log names this connection: the address it sees, and its port."""
        if self.nlb:
            return f"{self.client}:{self.port(n)} "
        return f"{self.loopback}:{sock.getsockname()[1]} "


def _payload_limit(r: RenderedRouter) -> int:
    """The router's rendered request body limit (bytes)."""
    return int(arg_value(r.args, "--max-payload-size"))


def _limit_mib(r: RenderedRouter) -> float:
    from k8s.router import memory_bytes

    return memory_bytes(r.memory_limit) / 2**20


class Sampler(Background):
    """Peak RSS of the router and the front, every 0.25 s, while running."""

    def __init__(self, router: RouterProcess, front: FrontProcess) -> None:
        super().__init__()
        self.pids = {"router": router.pid, "front": front.proc.pid}
        self.peak = {k: rss_mib(p) for k, p in self.pids.items()}
        self.start_rss = dict(self.peak)

    def _run(self) -> None:
        while not self._stop.wait(0.25):
            for k, pid in self.pids.items():
                try:
                    self.peak[k] = max(self.peak[k], rss_mib(pid))
                except (FileNotFoundError, ProcessLookupError):
                    pass


def good_client(front: FrontProcess, source: Source, spread_s: float) -> list[dict]:
    """20 chats, one after another, spread over ``spread_s``; each judged by its answer.
    Through the NLB it has an address of its own; without, it is 127.0.0.1 (the attacker
    binds another)."""
    out = []
    t0 = time.monotonic()
    for i in range(GOOD_CHATS):
        res = chat(front.url, [{"role": "user", "content": f"a good question {i}"}], f"good-{i}",
                   False, 8, headers=AUTH, timeout=30,
                   via_nlb=source.client if source.nlb else None)
        out.append({"status": res.status, "s": round(res.total_s, 3), "ok": res.ok})
        time.sleep(max(0.0, t0 + (i + 1) * spread_s / GOOD_CHATS - time.monotonic()))
    return out


# --------------------------------------------------------------------------- attacks


def _hpack_literal(name: str, value: str) -> bytes:
    """HPACK literal header field without indexing, new name, no Huffman (RFC 7541 6.2.2)."""
    def string(s: str) -> bytes:
        b = s.encode()
        if len(b) >= 127:
            raise ValueError("short strings only")
        return bytes([len(b)]) + b
    return b"\x00" + string(name) + string(value)


def _h2_frame(kind: int, flags: int, stream: int, payload: bytes) -> bytes:
    return struct.pack("!I", len(payload))[1:] + bytes([kind, flags]) + \
        struct.pack("!I", stream) + payload


class Fleet:
    """``n`` attack connections kept open: every ``every`` seconds the ones the front closed
    are opened again (a persistent attacker), and ``tick`` runs on each open one (a slow
    client's next byte). A connection counts as closed when its TCP state says so, or, for one
    that reads nothing (the front's FIN waits behind unread data), when ``cut(log_key)`` says
    the front's log ended it. Counts what it opened, what was refused and what the front
    closed."""

    def __init__(self, n: int, open_one: Callable[[int], socket.socket],
                 tick: Callable[[socket.socket], None] | None = None, *,
                 key: Callable[[socket.socket, int], str] | None = None,
                 cut: Callable[[str], bool] | None = None) -> None:
        self.n, self.open_one, self.tick, self.key, self.cut = n, open_one, tick, key, cut
        self.socks: dict[int, socket.socket] = {}
        self.keys: dict[int, str] = {}
        self.opened = self.refused = self.closed_by_front = 0
        self._serial = 0
        self._lock = threading.Lock()

    def _open(self, i: int) -> None:
        with self._lock:
            serial, self._serial = self._serial, self._serial + 1
        try:
            sock = self.open_one(serial)
        except OSError:
            with self._lock:
                self.refused += 1
            return
        with self._lock:
            self.socks[i] = sock
            if self.key:
                self.keys[i] = self.key(sock, serial)
            self.opened += 1

    def _closed(self, i: int, sock: socket.socket) -> bool:
        return _peer_closed(sock) or bool(self.cut and self.cut(self.keys.get(i, "")))

    def fill(self) -> None:
        missing = [i for i in range(self.n) if i not in self.socks]
        with ThreadPoolExecutor(32) as ex:
            list(ex.map(self._open, missing))

    def hold(self, stop: threading.Event, every: float = 2.0) -> None:
        while not stop.wait(every):
            for i, sock in list(self.socks.items()):
                if self._closed(i, sock):
                    sock.close()
                    del self.socks[i]
                    self.closed_by_front += 1
                elif self.tick:
                    try:
                        self.tick(sock)
                    except OSError:
                        sock.close()
                        del self.socks[i]
                        self.closed_by_front += 1
            self.fill()

    def close(self) -> dict:
        open_at_end = len(self.socks)
        for sock in self.socks.values():
            sock.close()
        return {"kept": self.n, "opened": self.opened, "refused_at_connect": self.refused,
                "closed_by_the_front": self.closed_by_front, "open_at_end": open_at_end}


def _peer_closed(sock: socket.socket) -> bool:
    """The peer closed or reset the connection (TCP state CLOSE_WAIT or CLOSE), without
    reading anything from it."""
    try:
        state = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 1)[0]
    except OSError:
        return True
    return state in (7, 8)


def attack_h2(port: int, attacker: Source, stop: threading.Event, r: RenderedRouter,
              scale: float, **_: Any) -> dict:
    conns, streams = int(100 * scale) or 1, 100
    limit = str(_payload_limit(r))
    headers = b"".join(_hpack_literal(k, v) for k, v in (
        (":method", "POST"), (":scheme", "http"), (":path", "/v1/chat/completions"),
        (":authority", "router"), ("content-type", "application/json"),
        ("content-length", limit), ("authorization", f"Bearer {KEY}")))

    def open_one(c: int) -> socket.socket:
        sock = attacker.connect(port, n=c)
        sock.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + _h2_frame(4, 0, 0, b""))
        for i in range(streams):
            sid = 2 * i + 1
            sock.sendall(_h2_frame(1, 0x4, sid, headers) +
                         _h2_frame(0, 0, sid, b'{"messages": [' + b" " * 1000))
        return sock

    fleet = Fleet(conns, open_one)
    fleet.fill()
    fleet.hold(stop)
    return {"streams_each": streams, "declared": int(limit), **fleet.close()}


def attack_parked(port: int, attacker: Source, stop: threading.Event, r: RenderedRouter,
                  scale: float, **_: Any) -> dict:
    limit = _payload_limit(r)
    body = (b'{"model": "fake-model", "messages": [{"role": "user", "content": "' +
            b"x" * limit)[:limit - 1]
    head = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: router\r\nContent-Type: "
            b"application/json\r\nAuthorization: Bearer " + KEY.encode() +
            b"\r\nContent-Length: %d\r\n\r\n" % limit)
    def open_one(i: int) -> socket.socket:
        sock = attacker.connect(port, n=i)
        sock.sendall(head + body)
        return sock

    fleet = Fleet(int(2000 * scale) or 1, open_one)
    fleet.fill()
    fleet.hold(stop)
    return {"body_bytes": limit - 1, "declared": limit, **fleet.close()}


def attack_sse(port: int, attacker: Source, stop: threading.Event, r: RenderedRouter,
               scale: float, front: FrontProcess | None = None, **_: Any) -> dict:
    body = json.dumps({"model": "fake-model", "stream": True, "max_tokens": 1_000_000,
                       "messages": [{"role": "user", "content": "a very long story"}]}).encode()

    def open_one(i: int) -> socket.socket:
        sock = attacker.connect(port, n=i)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: router\r\nContent-Type: "
                     b"application/json\r\nAuthorization: Bearer " + KEY.encode() +
                     b"\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
        return sock

    def cut(key: str) -> bool:   # the front's log line for a stream it ended (cD: client side)
        return any(line.startswith(key) and " cD" in line
                   for line in front.log_text().splitlines())

    fleet = Fleet(int(20 * scale) or 1, open_one, key=attacker.log_key, cut=cut)
    fleet.fill()
    fleet.hold(stop, every=0.5)
    return fleet.close()


def attack_slots(port: int, attacker: Source, stop: threading.Event, r: RenderedRouter,
                 scale: float, **_: Any) -> dict:
    n = int(4200 * scale) or 3
    partial_head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: router\r\n"
    slow_body = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: router\r\nContent-Type: "
                 b"application/json\r\nAuthorization: Bearer " + KEY.encode() +
                 b"\r\nContent-Length: 1000\r\n\r\n{")

    def opener(first: bytes) -> Callable[[int], socket.socket]:
        def open_one(i: int) -> socket.socket:
            sock = attacker.connect(port, n=i)
            if first:
                sock.sendall(first)
            return sock
        return open_one

    # a byte a second keeps each inactivity timer fresh; what the front closes is reopened
    fleets = {"idle": Fleet(n // 3, opener(b"")),
              "slowloris": Fleet(n // 3, opener(partial_head), lambda s: s.sendall(b"X-a: b\r\n")),
              "slow-body": Fleet(n - 2 * (n // 3), opener(slow_body), lambda s: s.sendall(b" "))}
    for fleet in fleets.values():
        fleet.fill()
    with ThreadPoolExecutor(3) as ex:
        list(ex.map(lambda f: f.hold(stop, every=1.0), fleets.values()))
    return {k: f.close() for k, f in fleets.items()}


def attack_5xx(port: int, attacker: Source, stop: threading.Event, r: RenderedRouter,
               scale: float, pool: FakeWorkerPool | None = None, **_: Any) -> dict:
    sent: list[int] = []

    def loop(k: int) -> None:
        i = 0
        while not stop.is_set():
            res = chat(f"http://{LOOPBACK}:{port}",
                       [{"role": "user", "content": f"{FAIL_MARKER} {k} {i}"}], f"bad-{k}",
                       False, 4, headers=AUTH, timeout=30,
                       via_nlb=attacker.client if attacker.nlb else None)
            sent.append(res.status)
            i += 1

    loops = max(1, int(4 * scale))
    with ThreadPoolExecutor(loops) as ex:
        list(ex.map(loop, range(loops)))
    calls = sum(w.stats()["failed"] for w in pool) if pool else None
    return {"bad_requests": len(sent), "statuses": sorted(set(sent)), "worker_calls": calls,
            "worker_calls_per_bad_request": round(calls / max(1, len(sent)), 2)
            if calls is not None else None}


ATTACK_FNS: dict[str, Callable[..., dict]] = {
    "h2": attack_h2, "parked": attack_parked, "sse": attack_sse, "slots": attack_slots,
    "5xx": attack_5xx}


def run_attack(name: str, case: str, a: argparse.Namespace) -> dict:
    strategy, router = CASES[case]
    r = rendered(strategy, router, context_tokens=a.context_tokens)
    opts = {**WORKER_OPTS, **r.kv_worker_opts, "fail_marker": FAIL_MARKER}
    if name == "sse":
        opts.update(decode_ms_per_token=a.sse_decode_ms, max_model_len=10**7)
    nlb = "expect-proxy" in r.front_config
    attacker = Source("198.51.100.66", "127.0.0.66", nlb)
    good = Source("203.0.113.7", "127.0.0.77", nlb)
    with FakeWorkerPool(2, **opts) as pool, router_pod(r, pool) as (router_proc, front):
        stop = threading.Event()
        with Sampler(router_proc, front) as sampler, ThreadPoolExecutor(1) as ex:
            attack = ex.submit(ATTACK_FNS[name], front.port, attacker, stop, r, a.scale,
                               pool=pool, front=front)
            time.sleep(a.settle)      # the attack in place before the good client starts
            chats = good_client(front, good, a.hold)
            stop.set()
            detail = attack.result()
        served = [c for c in chats if c["ok"] and c["s"] <= GOOD_WITHIN_S]
        times = [c["s"] for c in chats if c["ok"]]
        limit = _limit_mib(r)
        return {
            "attack": name, "case": f"{strategy or 'prefixaware'}@{r.implementation}",
            "payload_limit": _payload_limit(r),
            "good_chats": f"{len(served)}/{GOOD_CHATS}",
            "good_statuses": sorted({c["status"] for c in chats}),
            "good_p50_s": round(statistics.median(times), 3) if times else None,
            "good_max_s": max(times) if times else None,
            "router_rss_peak_mib": round(sampler.peak["router"]),
            "router_rss_start_mib": round(sampler.start_rss["router"]),
            "router_limit_mib": round(limit),
            "router_peak_of_limit": round(sampler.peak["router"] / limit, 3),
            "front_rss_peak_mib": round(sampler.peak["front"]),
            "router_alive": router_proc.proc is not None and router_proc.proc.poll() is None,
            "detail": detail,
        }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.attacks", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", default=",".join(ATTACKS),
                   help=f"comma-separated: {', '.join(ATTACKS)}")
    p.add_argument("--cases", default=",".join(CASES), help="comma-separated: default,session")
    p.add_argument("--hold", type=float, default=30.0,
                   help="seconds the attack runs while the good client chats")
    p.add_argument("--settle", type=float, default=3.0,
                   help="seconds between the attack's start and the good client's first chat")
    p.add_argument("--scale", type=float, default=1.0, help="attack size (1.0: the full size)")
    p.add_argument("--context-tokens", type=int,
                   help="the model's context (vLLM --max-model-len), which sets the payload "
                        "limit; default: the endpoint's own")
    p.add_argument("--sse-decode-ms", type=float, default=0.0,
                   help="the fake worker's decode time per token during the sse attack")
    p.add_argument("--out", type=Path, help="append the results to this JSON file")
    p.add_argument("--label", default="", help="stored with the results (e.g. before, after)")
    a = p.parse_args(argv)
    results = []
    for name in a.only.split(","):
        for case in a.cases.split(","):
            res = run_attack(name, case, a)
            results.append({"label": a.label, **res})
            print(json.dumps(results[-1]), flush=True)
    if a.out:
        old = json.loads(a.out.read_text()) if a.out.exists() else []
        a.out.write_text(json.dumps(old + results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
