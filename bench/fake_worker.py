"""A fake vLLM worker: OpenAI-compatible HTTP, a real prefix cache, vLLM metric names.

It stands in for a vLLM (+LMCache) pod when the router is exercised on 127.0.0.1: the router
health-checks it, renders/tokenizes prompts through it, routes completions to it and scrapes
nothing from it, while tests and benchmarks read which worker answered and how much of each
prompt was already cached.

Run one:   python -m bench.fake_worker --port 8001 --worker-id w0 [--kv-events-port 0]
Embed one: FakeWorker(port=0, worker_id="w0", kv_events_port=0).start() ... .stop()

Model of a worker (deliberately simple, deterministic, standard library only but for the
optional KV events, which need pyzmq and msgpack):
- Tokens: every whitespace-separated word maps to a stable id (blake2b of the word, mod
  50,000), so the same text gives the same ids on every worker and in every process; chat
  messages are rendered with role and end markers (ids >= 50,000) the way a chat template is.
- Prefix cache: token ids grouped into blocks of ``block_size``; each block's hash is chained on
  the previous block's, as in vLLM's automatic prefix caching; only full blocks are cached, at
  most ``len(prompt) - 1`` tokens can hit (the last prompt token is always computed), and the
  cache is an LRU bounded to ``cache_blocks`` blocks. Prompt blocks are cached after prefill,
  prompt+output blocks when the request ends.
- Time: time to first token = ``overhead_ms`` + ``prefill_ms_per_token`` x uncached prompt
  tokens; then one token every ``decode_ms_per_token``. ``max_num_seqs`` > 0 bounds concurrent
  requests; the rest wait (``vllm:num_requests_waiting``).
- Or, with ``profile`` (``bench.emulator.PROFILES``, e.g. ``g5.24xlarge``), a calibrated
  emulation instead: the prefix cache holds the replica's KV capacity, requests share one
  emulated GPU step by step (continuous batching, chunked prefill), render/tokenize cost what a
  real API server's tokenizer does (real time), GPU durations times ``time_scale``; the cache
  is looked up when the engine schedules the request and filled chunk by chunk, as vLLM's
  scheduler does.
- Output: ``max_tokens`` words (default 16) drawn deterministically from the prompt, so every
  worker gives the same answer to the same prompt (like greedy decoding on one model).
- KV events (``kv_events_port`` not None): every change of the prefix cache is published at
  once, as vLLM's ZMQ publisher does, on ``tcp://127.0.0.1:PORT``: ``BlockStored`` for newly
  cached blocks (their chained hashes, parent hash and token ids, the same ids the render and
  tokenize endpoints return), ``BlockRemoved`` on LRU eviction, ``AllBlocksCleared`` on reset.
  Prompt blocks are published before the first token, output blocks before the response ends.
  ``stop()`` closes the publisher with the worker; ``start()`` rebinds it on the same port and
  continues the sequence numbers (the fake's cache survives a restart too).
- Every response names the worker: header ``X-Worker-Id``, and a top-level ``"worker_id"`` in
  JSON bodies and in each stream chunk.

Endpoints: GET /health /ping /v1/models /metrics /get_load /version; POST /tokenize
/v1/completions /v1/chat/completions /v1/completions/render /v1/chat/completions/render
/reset_prefix_cache.
"""

from __future__ import annotations

import argparse
import collections
import functools
import hashlib
import json
import signal
import socket
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Iterable, Sequence

from bench.emulator import PROFILES, KvBlocks

__all__ = [
    "FakeWorker",
    "PrefixCache",
    "KvCache",
    "WORD_VOCAB_SIZE",
    "SPECIAL_TOKENS",
    "word_token",
    "tokenize_text",
    "render_chat",
    "render_prompt",
    "generate_words",
    "expected_chat_text",
    "expected_completion_text",
    "serve",
    "main",
]

LOOPBACK = "127.0.0.1"
WORD_VOCAB_SIZE = 50_000
# Prompt ids kept per arrival (FakeWorker.arrivals): within a chat's system message, so they
# tell its conversations apart
ARRIVAL_HEAD = 32
SPECIAL_TOKENS = {
    "bos": 50_000,
    "system": 50_001,
    "user": 50_002,
    "assistant": 50_003,
    "tool": 50_004,
    "developer": 50_005,
    "other_role": 50_006,
    "end": 50_007,
}
# Words the fake "model" answers with.
_OUTPUT_WORDS = (
    "alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november "
    "oscar papa quebec romeo sierra tango uniform victor whiskey xray yankee zulu amber basil "
    "cedar dune ember fjord garnet harbor iris jade kelp lagoon maple nectar onyx pebble quartz "
    "river saffron thistle umber violet willow xenon yarrow zephyr acorn birch clover dahlia "
    "elm fern ginger hazel"
).split()

# vLLM's histogram buckets for these two metrics.
_TTFT_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
    10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)
_E2E_BUCKETS = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
    240.0, 480.0, 960.0, 1920.0, 7680.0,
)


# --------------------------------------------------------------------------- tokens


@functools.lru_cache(maxsize=1 << 16)
def word_token(word: str) -> int:
    """Stable id of one word: the same in every worker, process and run."""
    digest = hashlib.blake2b(word.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big") % WORD_VOCAB_SIZE


def tokenize_text(text: str) -> list[int]:
    """Ids of a text: one per whitespace-separated word (no special tokens)."""
    return [word_token(w) for w in text.split()]


def _content_text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # OpenAI content parts
        texts = []
        for part in content:
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                texts.append(part["text"])
            elif isinstance(part, str):
                texts.append(part)
        return " ".join(texts)
    return str(content)


def render_chat(
    messages: Sequence[dict],
    *,
    add_generation_prompt: bool = True,
    continue_final_message: bool = False,
) -> list[int]:
    """Prompt ids of a chat, as a chat template would lay it out.

    ``[bos] ( <role> words... <end> )* <assistant>`` — so the prompt of turn k (plus the
    answer) is a true prefix of the prompt of turn k+1.
    """
    if not messages:
        raise ValueError("messages must be a non-empty list")
    ids = [SPECIAL_TOKENS["bos"]]
    last = len(messages) - 1
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise ValueError("each message must be an object")
        role = message.get("role", "user")
        ids.append(SPECIAL_TOKENS.get(role, SPECIAL_TOKENS["other_role"]))
        ids.extend(tokenize_text(_content_text(message.get("content"))))
        if not (continue_final_message and i == last):
            ids.append(SPECIAL_TOKENS["end"])
    if add_generation_prompt and not continue_final_message:
        ids.append(SPECIAL_TOKENS["assistant"])
    return ids


def render_prompt(prompt: Any, *, add_special_tokens: bool = True) -> list[list[int]]:
    """Prompt ids of a /v1/completions ``prompt``: str, [int], [str] or [[int]] -> a batch."""
    if isinstance(prompt, str):
        prompts: list[Any] = [prompt]
    elif isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
        prompts = [prompt]
    elif isinstance(prompt, list) and prompt:
        prompts = prompt
    else:
        raise ValueError("prompt must be a string, a list of token ids, or a non-empty batch")
    out = []
    for p in prompts:
        if isinstance(p, str):
            ids = ([SPECIAL_TOKENS["bos"]] if add_special_tokens else []) + tokenize_text(p)
        elif isinstance(p, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in p):
            ids = list(p)
        else:
            raise ValueError("each prompt must be a string or a list of token ids")
        if not ids:
            raise ValueError("prompt must not be empty")
        out.append(ids)
    return out


def generate_words(prompt_ids: Sequence[int], n: int) -> list[str]:
    """The fake model's answer: ``n`` words picked deterministically from the prompt."""
    seed = hashlib.blake2b(
        repr((len(prompt_ids), tuple(prompt_ids[-64:]))).encode(), digest_size=8
    ).hexdigest()
    words = []
    for i in range(n):
        h = hashlib.blake2b(f"{seed}:{i}".encode(), digest_size=4).digest()
        words.append(_OUTPUT_WORDS[int.from_bytes(h, "big") % len(_OUTPUT_WORDS)])
    return words


def expected_chat_text(messages: Sequence[dict], max_tokens: int) -> str:
    """What any fake worker answers to this chat (message content, all chunks joined)."""
    return " ".join(generate_words(render_chat(messages), max_tokens))


def expected_completion_text(prompt: str, max_tokens: int) -> str:
    """What any fake worker answers to this completion prompt (text, all chunks joined)."""
    return "".join(" " + w for w in generate_words(render_prompt(prompt)[0], max_tokens))


# --------------------------------------------------------------------------- prefix cache


class PrefixCache:
    """vLLM-style automatic prefix cache over token ids: chained block hashes, LRU-bounded.

    ``on_events``, if set, is called with the KV cache events of every change (``BlockStored``
    per contiguous run of newly cached blocks, ``BlockRemoved`` for LRU evictions,
    ``AllBlocksCleared``), inside the cache's lock so that events leave in the order the cache
    changed. Events are dicts in vLLM's tagged-map shape (see ``_KvEventPublisher``).
    """

    def __init__(self, block_size: int = 16, capacity_blocks: int = 8192) -> None:
        if block_size < 1 or capacity_blocks < 1:
            raise ValueError("block_size and capacity_blocks must be >= 1")
        self.block_size = block_size
        self.capacity_blocks = capacity_blocks
        self._blocks: "collections.OrderedDict[int, None]" = collections.OrderedDict()
        self._lock = threading.Lock()
        self.on_events: "Callable[[list[dict]], None] | None" = None

    def block_hashes(self, ids: Sequence[int], max_tokens: int | None = None) -> list[int]:
        """Hashes of the full blocks of ``ids[:max_tokens]``, each chained on its parent."""
        limit = len(ids) if max_tokens is None else min(len(ids), max_tokens)
        bs = self.block_size
        hashes = []
        parent = 0
        for start in range(0, limit - limit % bs, bs):
            parent = hash((parent, tuple(ids[start:start + bs])))
            hashes.append(parent)
        return hashes

    def lookup(self, ids: Sequence[int]) -> int:
        """Cached tokens at the start of ``ids`` (block-aligned, at most ``len(ids) - 1``)."""
        hashes = self.block_hashes(ids, max(0, len(ids) - 1))
        hit = 0
        with self._lock:
            for h in hashes:
                if h not in self._blocks:
                    break
                self._blocks.move_to_end(h)
                hit += 1
        return hit * self.block_size

    def insert(self, ids: Sequence[int]) -> None:
        hashes = self.block_hashes(ids)
        bs = self.block_size
        with self._lock:
            new: list[int] = []  # indexes of newly cached blocks
            for i, h in enumerate(hashes):
                if h in self._blocks:
                    self._blocks.move_to_end(h)
                else:
                    self._blocks[h] = None
                    new.append(i)
            evicted = []
            while len(self._blocks) > self.capacity_blocks:
                evicted.append(self._blocks.popitem(last=False)[0])
            if self.on_events is None or not (new or evicted):
                return
            events = []
            for run in _runs(new):  # one BlockStored per contiguous chain, as vLLM emits
                first, last = run[0], run[-1]
                events.append({
                    "type": "BlockStored",
                    "block_hashes": [_wire_hash(hashes[i]) for i in run],
                    "parent_block_hash": _wire_hash(hashes[first - 1]) if first else None,
                    "token_ids": list(ids[first * bs:(last + 1) * bs]),
                    "block_size": bs, "lora_id": None, "medium": "GPU", "lora_name": None,
                })
            if evicted:
                events.append({"type": "BlockRemoved", "medium": "GPU",
                               "block_hashes": [_wire_hash(h) for h in evicted]})
            self.on_events(events)

    def clear(self) -> None:
        with self._lock:
            self._blocks.clear()
            if self.on_events is not None:
                self.on_events([{"type": "AllBlocksCleared"}])

    def __len__(self) -> int:
        return len(self._blocks)

    def usage(self) -> float:
        """Fraction of the capacity in use (what vLLM reports as kv_cache_usage_perc)."""
        return len(self._blocks) / self.capacity_blocks


class KvCache(PrefixCache):
    """vLLM 0.24's KV block pool with prefix caching, as its scheduler sees it
    (`vllm/v1/core/block_pool.py`, `kv_cache_manager.py`, `single_type_kv_cache_manager.py`):

    - `capacity_blocks` blocks of `block_size` tokens. A block a running request holds has a
      reference count; a cached block (a full block, named by its chained hash) shared by N
      running requests is one block with count N. Blocks whose count is 0 stay cached and are
      evictable, least recently freed first; blocks no request holds and no hash names are
      empty and are handed out before any cached block is evicted.
    - Free blocks = empty + evictable (`get_num_free_blocks`); usage = 1 - free / capacity
      (what `vllm:kv_cache_usage_perc` reports).
    - A request's blocks are cached as they are scheduled (`cache_blocks` runs inside
      `allocate_slots`), so a request scheduled in the next step hits them; a block whose hash
      is already cached stays the request's own (vLLM keeps a second copy too). A request's
      blocks are freed last block first, so its tail is evicted before its prefix.

    `lookup` and `insert` keep `PrefixCache`'s meaning (the cached prefix; a finished
    sequence's blocks cached, evictable), so the fake worker, the router's KV events and
    LMCache's tiers see the same cache."""

    def __init__(self, block_size: int = 16, capacity_blocks: int = 8192) -> None:
        super().__init__(block_size, capacity_blocks)
        self.ref: dict[int, int] = {}      # cached block -> running requests holding it
        self.lru: "collections.OrderedDict[int, None]" = collections.OrderedDict()
        self.private = 0                    # held blocks no hash names
        self.preemptions = 0

    # -- what vLLM's scheduler asks

    @property
    def used(self) -> int:
        return len(self.ref) - len(self.lru) + self.private

    def free_blocks(self) -> int:
        return self.capacity_blocks - self.used

    def usage(self) -> float:
        return self.used / self.capacity_blocks

    def __len__(self) -> int:
        return len(self.ref)

    def match(self, hashes: Sequence[int]) -> int:
        """How many of `hashes`, from the first, are cached (no LRU touch: vLLM's
        find_longest_cache_hit)."""
        n = 0
        for h in hashes:
            if h not in self.ref:
                break
            n += 1
        return n

    def lookup(self, ids: Sequence[int]) -> int:
        bs = self.block_size
        return self.match(self.block_hashes(ids, max(0, len(ids) - 1))) * bs

    def _take(self, n: int, events: list) -> None:
        """Hand out `n` blocks (the caller checked they are free): empty ones first, then the
        least recently freed cached ones, whose hashes are forgotten."""
        empty = self.capacity_blocks - len(self.ref) - self.private
        evicted = []
        for _ in range(max(0, n - empty)):
            h, _ = self.lru.popitem(last=False)
            del self.ref[h]
            evicted.append(h)
        self.private += n
        if evicted and self.on_events is not None:
            events.append({"type": "BlockRemoved", "medium": "GPU",
                           "block_hashes": [_wire_hash(h) for h in evicted]})

    def admit(self, held: KvBlocks, hashes: Sequence[int], hit_blocks: int, total: int,
              upto: int) -> bool:
        """A waiting request: its first `hit_blocks` blocks hit the cache; admitted only if
        the blocks its whole sequence of `total` tokens still needs are free (vLLM 0.24's
        `scheduler_reserve_full_isl`, on by default; cached hits with no holder count, as
        taking them off the free list), then given the blocks up to token `upto`."""
        bs = self.block_size
        hits = hashes[:hit_blocks]
        evictable = sum(1 for h in hits if self.ref[h] == 0)
        if -(-total // bs) - hit_blocks + evictable > self.free_blocks():
            return False
        with self._lock:
            events: list = []
            for h in hits:
                if self.ref[h] == 0:
                    del self.lru[h]
                self.ref[h] += 1
            held.blocks.extend(hits)
            held.committed = hit_blocks
            need = -(-upto // bs) - hit_blocks
            if need > 0:
                self._take(need, events)
                held.blocks.extend([None] * need)
            self._emit(events)
        return True

    def grow(self, held: KvBlocks, tokens: int) -> bool:
        """Slots for `tokens` tokens of a running request; False when the blocks are not
        free (the scheduler then preempts)."""
        need = -(-tokens // self.block_size) - len(held.blocks)
        if need <= 0:
            return True
        if need > self.free_blocks():
            return False
        with self._lock:
            events: list = []
            self._take(need, events)
            held.blocks.extend([None] * need)
            self._emit(events)
        return True

    def commit(self, held: KvBlocks, hashes: Sequence[int], ids: Sequence[int],
               blocks: int) -> None:
        """Cache the request's full blocks up to `blocks` (of `hashes`, the chained hashes of
        `ids`)."""
        end = min(blocks, len(hashes), len(held.blocks))
        if end <= held.committed:
            return
        with self._lock:
            new = []
            for i in range(held.committed, end):
                h = hashes[i]
                if held.blocks[i] is None and h not in self.ref:
                    self.ref[h] = 1
                    self.private -= 1
                    held.blocks[i] = h
                    new.append(i)
            held.committed = end
            if new and self.on_events is not None:
                self._emit(self._stored(new, hashes, ids))

    def release(self, held: KvBlocks) -> None:
        """A finished or preempted request's blocks: its cached ones become evictable (its
        last block first), the rest empty."""
        with self._lock:
            for h in reversed(held.blocks):
                if h is None:
                    self.private -= 1
                else:
                    self.ref[h] -= 1
                    if self.ref[h] == 0:
                        self.lru[h] = None
            held.blocks = []
            held.committed = 0

    # -- PrefixCache's interface

    def insert(self, ids: Sequence[int]) -> None:
        """A finished sequence's full blocks, cached and evictable: those already cached are
        touched, the others take a free block (evicting the least recent) while one is."""
        hashes = self.block_hashes(ids)
        with self._lock:
            events: list = []
            new = []
            for i, h in enumerate(hashes):
                if h in self.ref:
                    if self.ref[h] == 0:
                        self.lru.move_to_end(h)
                    continue
                if self.free_blocks() < 1:
                    break
                self._take(1, events)
                self.private -= 1
                self.ref[h] = 0
                self.lru[h] = None
                new.append(i)
            if self.on_events is not None:
                events[:0] = self._stored(new, hashes, ids) if new else []
                self._emit(events)

    def clear(self) -> None:
        with self._lock:
            if self.used:
                raise RuntimeError("KvCache.clear with requests still holding blocks")
            self.ref.clear()
            self.lru.clear()
            if self.on_events is not None:
                self.on_events([{"type": "AllBlocksCleared"}])

    def _stored(self, new: list[int], hashes: Sequence[int], ids: Sequence[int]) -> list:
        bs = self.block_size
        return [{"type": "BlockStored",
                 "block_hashes": [_wire_hash(hashes[i]) for i in run],
                 "parent_block_hash": _wire_hash(hashes[run[0] - 1]) if run[0] else None,
                 "token_ids": list(ids[run[0] * bs:(run[-1] + 1) * bs]),
                 "block_size": bs, "lora_id": None, "medium": "GPU", "lora_name": None}
                for run in _runs(new)]

    def _emit(self, events: list) -> None:
        if events and self.on_events is not None:
            self.on_events(events)


def _runs(indexes: Sequence[int]) -> list[list[int]]:
    """``[1, 2, 3, 7, 8]`` -> ``[[1, 2, 3], [7, 8]]``."""
    runs: list[list[int]] = []
    for i in indexes:
        if runs and runs[-1][-1] == i - 1:
            runs[-1].append(i)
        else:
            runs.append([i])
    return runs


def _wire_hash(h: int) -> int:
    """A block hash as the router accepts it: an unsigned 64-bit int (Python's is signed)."""
    return h & 0xFFFF_FFFF_FFFF_FFFF


# --------------------------------------------------------------------------- KV events


class _KvEventPublisher:
    """vLLM's ZMQ KV event stream, as vllm-router 0.1.17 subscribes to it.

    Each batch is one 3-frame message: the topic (``""`` unless configured, the only topic the
    router 0.1.17 subscribes to), the sequence number (8 bytes, big-endian, from 0, +1 per
    batch), and msgpack ``[ts, [event, ...], data_parallel_rank]`` with every event a map
    tagged by ``"type"`` (vLLM's ``EventBatch(array_like=True)`` of ``KVCacheEvent(tag=True)``).
    The socket is an XPUB (a PUB to its subscribers) bound on 127.0.0.1, so the worker can count
    subscriptions and tests can wait until a router listens. Needs pyzmq and msgpack, imported
    only when a worker publishes.
    """

    def __init__(self, port: int, topic: str = "") -> None:
        import msgpack
        import zmq

        self._zmq = zmq
        self._pack = msgpack.Packer(use_bin_type=True).pack
        self._lock = threading.Lock()  # one thread at a time on the socket
        self._closed = False
        self._ctx = zmq.Context()
        self._sock = self._ctx.socket(zmq.XPUB)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.setsockopt(zmq.XPUB_VERBOSER, 1)  # every (un)subscription, duplicates too
        self._sock.setsockopt(zmq.SNDHWM, 100_000)
        try:
            if port:
                self._sock.bind(f"tcp://{LOOPBACK}:{port}")
                self.port = port
            else:
                self.port = self._sock.bind_to_random_port(f"tcp://{LOOPBACK}")
        except BaseException:
            self.close()
            raise
        self.topic = topic.encode()
        self.seq = 0
        self.batches = 0
        self.events = collections.Counter()
        self._subscribers = 0

    def publish(self, events: list[dict]) -> None:
        payload = self._pack([time.time(), events, 0])
        with self._lock:
            if self._closed:  # a request still finishing as its worker dies
                return
            seq = self.seq.to_bytes(8, "big", signed=True)
            self._sock.send_multipart([self.topic, seq, payload])
            self.seq += 1
            self.batches += 1
            self.events.update(e["type"] for e in events)

    def subscribers(self) -> int:
        """Live subscriptions (a router's SUB socket subscribes once per connection)."""
        zmq = self._zmq
        with self._lock:
            if self._closed:
                return 0
            for _ in range(10_000):  # drain what has arrived; bounded
                try:
                    msg = self._sock.recv(zmq.NOBLOCK)
                except zmq.Again:
                    break
                if msg[:1] == b"\x01":
                    self._subscribers += 1
                elif msg[:1] == b"\x00":
                    self._subscribers -= 1
            return self._subscribers

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._sock.close(linger=0)
            self._ctx.term()


# --------------------------------------------------------------------------- metrics


class _Histogram:
    def __init__(self, buckets: Iterable[float]) -> None:
        self.buckets = tuple(buckets)
        self.counts = [0] * len(self.buckets)
        self.total = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        for i, bound in enumerate(self.buckets):
            if value <= bound:
                self.counts[i] += 1
        self.total += value
        self.count += 1

    def lines(self, name: str, labels: str) -> list[str]:
        out = []
        for bound, c in zip(self.buckets, self.counts):
            out.append(f'{name}_bucket{{{labels},le="{bound}"}} {c}')
        out.append(f'{name}_bucket{{{labels},le="+Inf"}} {self.count}')
        out.append(f"{name}_count{{{labels}}} {self.count}")
        out.append(f"{name}_sum{{{labels}}} {self.total!r}")
        return out


def _label_value(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


class _BadRequest(Exception):
    def __init__(self, message: str, code: int = 400) -> None:
        super().__init__(message)
        self.code = code


class _Gone(Exception):
    """The client went away mid-stream."""


# --------------------------------------------------------------------------- HTTP


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A peer that hangs up (the router's health checker, a killed client, stop()) is
        # normal here; anything else is still reported.
        import sys

        exc = sys.exc_info()[1]
        if isinstance(exc, (ConnectionError, TimeoutError)):
            return
        super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "fake-vllm"
    sys_version = ""
    # http.server writes headers and body in separate sends; without this every response
    # waits for the peer's delayed ACK (~40 ms).
    disable_nagle_algorithm = True
    worker: "FakeWorker"  # bound per worker by FakeWorker._handler_class()

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        if self.worker.verbose:
            super().log_message(format, *args)

    def setup(self) -> None:
        super().setup()
        self.worker._track(self.connection, True)

    def parse_request(self) -> bool:
        ok = super().parse_request()
        if ok:
            self.worker._hold_while_hung(self.path)
        return ok

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            self.worker._track(self.connection, False)

    # -- plumbing

    def _send_bytes(self, code: int, body: bytes, content_type: str) -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("X-Worker-Id", self.worker.worker_id)
        self.end_headers()
        if body and self.command != "HEAD":
            self.wfile.write(body)

    def _send_json(self, code: int, obj: Any) -> None:
        self._send_bytes(code, json.dumps(obj).encode(), "application/json")

    def _send_error_json(self, code: int, message: str) -> None:
        kind = {400: "BadRequestError", 404: "NotFoundError", 503: "ServiceUnavailableError"}
        self._send_json(code, {
            "object": "error", "message": message, "type": kind.get(code, "InternalServerError"),
            "param": None, "code": code, "worker_id": self.worker.worker_id,
        })

    def _read_json(self) -> Any:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            raw = bytearray()
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    break
                raw += self.rfile.read(size)
                self.rfile.readline()
        else:
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if not raw:
            return {}
        try:
            return json.loads(raw)
        except ValueError as exc:
            raise _BadRequest(f"invalid JSON body: {exc}") from exc

    def _path(self) -> str:
        return self.path.split("?", 1)[0].rstrip("/") or "/"

    # -- verbs

    def do_HEAD(self) -> None:  # noqa: N802 - stdlib naming
        self.do_GET()

    def do_GET(self) -> None:  # noqa: N802
        w = self.worker
        path = self._path()
        if path in ("/health", "/ping"):
            if w.healthy:
                self._send_bytes(200, b"", "application/json")
            else:
                self._send_error_json(503, "worker marked unhealthy")
        elif path == "/v1/models":
            self._send_json(200, w.models_payload())
        elif path == "/metrics":
            self._send_bytes(200, w.metrics_text().encode(), "text/plain; version=0.0.4")
        elif path == "/get_load":
            with w._lock:
                load = w._running + w._waiting
            self._send_json(200, {"load": load, "worker_id": w.worker_id})
        elif path == "/version":
            self._send_json(200, {"version": "fake-vllm", "worker_id": w.worker_id})
        elif path == "/kv_subscribers":   # the harness's (not vLLM's): who listens to KV events
            self._send_json(200, {"subscribers": w.kv_subscribers(), "worker_id": w.worker_id})
        else:
            self._send_error_json(404, f"no route GET {path}")

    def do_POST(self) -> None:  # noqa: N802
        w = self.worker
        path = self._path()
        try:
            body = self._read_json()
            if not isinstance(body, dict):
                raise _BadRequest("body must be a JSON object")
            if path == "/tokenize":
                self._send_json(200, w.tokenize_payload(body))
            elif path == "/v1/chat/completions/render":
                self._send_json(200, w.render_payload(body, chat=True))
            elif path == "/v1/completions/render":
                self._send_json(200, w.render_payload(body, chat=False))
            elif path == "/v1/chat/completions":
                w._serve_generation(self, body, chat=True)
            elif path == "/v1/completions":
                w._serve_generation(self, body, chat=False)
            elif path == "/reset_prefix_cache":
                w.cache.clear()
                self._send_bytes(200, b"", "application/json")
            else:
                self._send_error_json(404, f"no route POST {path}")
        except _BadRequest as exc:
            self._send_error_json(exc.code, str(exc))
        except (_Gone, BrokenPipeError, ConnectionResetError):
            self.close_connection = True


# --------------------------------------------------------------------------- worker


class FakeWorker:
    """One fake vLLM worker on 127.0.0.1, served from a background thread.

    ``start()`` binds (``port=0`` picks a free port) and returns self; ``stop()`` makes it die:
    the listener closes and every open connection is cut, as when a pod is killed.
    ``start()`` again brings it back on the same port.
    """

    def __init__(
        self,
        port: int = 0,
        worker_id: str | None = None,
        *,
        model: str = "fake-model",
        prefill_ms_per_token: float = 0.05,
        decode_ms_per_token: float = 0.5,
        overhead_ms: float = 1.0,
        block_size: int = 16,
        cache_blocks: int = 8192,
        default_max_tokens: int = 16,
        max_model_len: int = 32768,
        max_num_seqs: int = 0,
        verbose: bool = False,
        kv_events_port: int | None = None,
        kv_events_topic: str = "",
        profile: str | None = None,
        time_scale: float = 1.0,
        virtual: Any = None,
        fail_marker: str | None = None,
        host: str = LOOPBACK,
        prompt_tokens_details: bool = True,
    ) -> None:
        if min(prefill_ms_per_token, decode_ms_per_token, overhead_ms) < 0:
            raise ValueError("timings must be >= 0")
        if default_max_tokens < 1 or max_model_len < 1 or max_num_seqs < 0:
            raise ValueError("default_max_tokens, max_model_len >= 1 and max_num_seqs >= 0")
        self.port = int(port)
        self.host = host       # another loopback address plays another pod's IP
        self.worker_id = worker_id or f"worker-{uuid.uuid4().hex[:6]}"
        self.model = model
        self.prefill_ms_per_token = float(prefill_ms_per_token)
        self.decode_ms_per_token = float(decode_ms_per_token)
        self.overhead_ms = float(overhead_ms)
        self.default_max_tokens = int(default_max_tokens)
        self.max_model_len = int(max_model_len)
        self.max_num_seqs = int(max_num_seqs)
        self.verbose = verbose
        # vLLM reports usage.prompt_tokens_details (the cached tokens) only when started with
        # --enable-prompt-tokens-details; False plays a worker started without it
        self.prompt_tokens_details = prompt_tokens_details
        if kv_events_port is not None and kv_events_port < 0:
            raise ValueError("kv_events_port must be None (off), 0 (any free port) or a port")
        self.kv_events_port = kv_events_port
        self.kv_events_topic = kv_events_topic
        self._kv: _KvEventPublisher | None = None
        self._kv_seq = 0
        self.gpu = self.engine = None
        if profile:
            from bench.emulator import Engine, profile as gpu_profile

            self.gpu = gpu_profile(profile)
            self.engine = Engine(self.gpu, time_scale)
            cache_blocks = self.gpu.kv_tokens // block_size
        self.cache = PrefixCache(block_size, cache_blocks)
        # bench.vtime: generation runs on a virtual clock (the hook serves and times it)
        self.virtual = virtual
        # A prompt carrying this text gets 500, as vLLM answers an input its engine fails on
        # (a client can provoke that); counted in ``failed``.
        self.fail_marker = fail_marker
        self.healthy = True
        self._lock = threading.Lock()
        self._slots = threading.Semaphore(max_num_seqs) if max_num_seqs > 0 else None
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self._conns: set[socket.socket] = set()
        self._awake = threading.Event()  # cleared by hang()
        self._awake.set()
        self._engine = threading.Event()  # cleared by stall()
        self._engine.set()
        self.held: collections.Counter = collections.Counter()  # path -> arrivals while hung
        self._created = time.time()
        self._running = 0
        self._waiting = 0
        self.reset_stats()

    # -- lifecycle

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def alive(self) -> bool:
        return self._server is not None

    @property
    def kv_events_endpoint(self) -> str | None:
        """``tcp://127.0.0.1:PORT`` of the KV event publisher once started, else None."""
        return f"tcp://{LOOPBACK}:{self.kv_events_port}" if self.kv_events_port else None

    def start(self) -> "FakeWorker":
        if self._server is not None:
            return self
        if self.kv_events_port is not None:
            self._kv = _KvEventPublisher(self.kv_events_port, self.kv_events_topic)
            self.kv_events_port, self._kv.seq = self._kv.port, self._kv_seq
            self.cache.on_events = self._kv.publish
        handler = type("FakeWorkerHandler", (_Handler,), {"worker": self})
        try:
            self._server = _Server((self.host, self.port), handler)
        except BaseException:
            self._stop_kv_events()
            raise
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
            name=f"fake-worker-{self.worker_id}", daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Die: stop accepting, close the listener and cut every open connection."""
        server, self._server = self._server, None
        if server is None:
            return
        server.shutdown()
        server.server_close()
        with self._lock:
            conns = list(self._conns)
        for conn in conns:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._stop_kv_events()

    def _stop_kv_events(self) -> None:
        kv, self._kv = self._kv, None
        if kv is not None:
            self.cache.on_events = None
            self._kv_seq = kv.seq  # a restart continues the stream (the cache survives too)
            kv.close()

    def kv_subscribers(self) -> int:
        """Subscriptions to this worker's KV events right now (0 when it publishes none)."""
        kv = self._kv
        return kv.subscribers() if kv is not None else 0

    def __enter__(self) -> "FakeWorker":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def hang(self, seconds: float | None = None) -> None:
        """Freeze, as a worker whose engine or event loop is stuck: connections are still
        accepted, but every request that arrives (health checks included) waits without an
        answer until ``thaw()``, or for ``seconds`` if given. Counted by path in ``held``."""
        self._awake.clear()
        if seconds is not None:
            timer = threading.Timer(seconds, self.thaw)
            timer.daemon = True
            timer.start()

    def thaw(self) -> None:
        """End ``hang()``: held requests are answered, in arrival order as far as threads go."""
        self._awake.set()

    def _hold_while_hung(self, path: str) -> None:
        if not self._awake.is_set():
            with self._lock:
                self.held[path.split("?", 1)[0]] += 1
            while self._server is not None and not self._awake.wait(0.1):
                pass

    def stall(self) -> None:
        """Stall the engine, not the server: no token is produced (streams in flight stop
        without closing, new requests get no first token), while /health still answers 200
        and /metrics shows them running, as a vLLM server over a stuck engine does."""
        self._engine.clear()

    def unstall(self) -> None:
        self._engine.set()

    def _produced(self, req: "_Request", token_at: Callable[[int], None]) -> Callable[[int], None]:
        """``token_at`` that waits while the engine is stalled and counts the tokens as they
        are produced (vLLM's vllm:generation_tokens_total moves every engine step)."""
        def produced(i: int) -> None:
            token_at(i)
            while self._server is not None and not self._engine.wait(0.05):
                pass
            n = (i + 1) * len(req.prompts)
            with self._lock:
                self._generation_tokens += max(0, n - req.counted)
            req.counted = max(req.counted, n)
        return produced

    def set_healthy(self, healthy: bool) -> None:
        """False: /health answers 503 (completions are still served)."""
        self.healthy = bool(healthy)

    def _track(self, conn: socket.socket, add: bool) -> None:
        with self._lock:
            (self._conns.add if add else self._conns.discard)(conn)

    # -- counters

    def reset_stats(self) -> None:
        """Zero the counters and histograms (the in-flight gauges and the cache stay)."""
        with self._lock:
            self._requests = 0
            self._aborted = 0
            self._prompt_tokens = 0
            self._generation_tokens = 0
            self._query_tokens = 0
            self._hit_tokens = 0
            self._render_calls = 0
            self._tokenize_calls = 0
            self._failed = 0
            self._finished = collections.Counter()
            self._ttft = _Histogram(_TTFT_BUCKETS)
            self._e2e = _Histogram(_E2E_BUCKETS)
            self.recent: collections.deque = collections.deque(maxlen=512)
            # (monotonic time, the prompt's first ids) of each request as it arrives: which
            # conversations reached this worker, finished or not (a test kills it mid-answer)
            self._arrived: collections.deque = collections.deque(maxlen=4096)

    def _usage(self, req: "_Request") -> dict:
        usage = req.usage()
        if not self.prompt_tokens_details:
            usage["prompt_tokens_details"] = None
        return usage

    def arrivals(self) -> list[tuple[float, tuple[int, ...]]]:
        """(monotonic time, the prompt's first ARRIVAL_HEAD ids) of each request received."""
        with self._lock:
            return list(self._arrived)

    def stats(self) -> dict:
        """In-process counters (no HTTP): requests served, token counts, cache hits."""
        with self._lock:
            return {
                "worker_id": self.worker_id,
                "requests": self._requests,
                "aborted": self._aborted,
                "running": self._running,
                "waiting": self._waiting,
                "prompt_tokens": self._prompt_tokens,
                "generation_tokens": self._generation_tokens,
                "query_tokens": self._query_tokens,
                "hit_tokens": self._hit_tokens,
                "hit_rate": self._hit_tokens / self._query_tokens if self._query_tokens else 0.0,
                "render_calls": self._render_calls,
                "failed": self._failed,
                "tokenize_calls": self._tokenize_calls,
                "cache_blocks_used": len(self.cache),
                "kv_event_batches": self._kv.batches if self._kv else 0,
                "kv_events": dict(self._kv.events) if self._kv else {},
            }

    @property
    def requests_served(self) -> int:
        return self._requests

    @property
    def hit_tokens(self) -> int:
        return self._hit_tokens

    @property
    def query_tokens(self) -> int:
        return self._query_tokens

    # -- payloads

    def models_payload(self) -> dict:
        return {"object": "list", "data": [{
            "id": self.model, "object": "model", "created": int(self._created),
            "owned_by": "vllm", "root": self.model, "parent": None,
            "max_model_len": self.max_model_len, "permission": [],
        }]}

    def _check_model(self, body: dict) -> None:
        model = body.get("model")
        if model not in (None, "", self.model):
            raise _BadRequest(f"The model `{model}` does not exist.", 404)

    def _prompts(self, body: dict, chat: bool) -> list[list[int]]:
        try:
            if chat:
                messages = body.get("messages")
                if not isinstance(messages, list):
                    raise ValueError("messages must be a list")
                return [render_chat(
                    messages,
                    add_generation_prompt=bool(body.get("add_generation_prompt", True)),
                    continue_final_message=bool(body.get("continue_final_message", False)),
                )]
            return render_prompt(
                body.get("prompt"), add_special_tokens=bool(body.get("add_special_tokens", True))
            )
        except ValueError as exc:
            raise _BadRequest(str(exc)) from exc

    def _max_tokens(self, body: dict, chat: bool) -> int:
        value = body.get("max_completion_tokens") if chat else None
        if value is None:
            value = body.get("max_tokens")
        if value is None:
            return self.default_max_tokens
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise _BadRequest("max_tokens must be a positive integer")
        return value

    def tokenize_payload(self, body: dict) -> dict:
        """vLLM's /tokenize: ``{"prompt": ...}`` or ``{"messages": [...]}``."""
        self._check_model(body)
        with self._lock:
            self._tokenize_calls += 1
        self._render_cost(body, chat="messages" in body)
        if "messages" in body:
            ids = self._prompts(body, chat=True)[0]
        else:
            prompt = body.get("prompt")
            if not isinstance(prompt, str):
                raise _BadRequest("prompt must be a string")
            special = bool(body.get("add_special_tokens", True))
            ids = render_prompt(prompt, add_special_tokens=special)[0] if prompt else []
        return {"count": len(ids), "max_model_len": self.max_model_len, "tokens": ids,
                "token_strs": None}

    def _render_cost(self, body: dict, chat: bool) -> None:
        """An emulated API server tokenizes on its CPU: what the router's render call waits."""
        if self.engine is not None:
            try:
                n = sum(len(ids) for ids in self._prompts(body, chat))
            except _BadRequest:
                return
            time.sleep(self.gpu.render_seconds(n))  # CPU time: real, never scaled

    def render_payload(self, body: dict, chat: bool) -> Any:
        """vLLM's /v1/{chat/}completions/render: the request as token ids, not run."""
        self._check_model(body)
        with self._lock:
            self._render_calls += 1
        self._render_cost(body, chat)
        max_tokens = self._max_tokens(body, chat)
        out = []
        for ids in self._prompts(body, chat):
            out.append({
                "request_id": f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}",
                "token_ids": ids,
                "features": None,
                "sampling_params": {"max_tokens": max_tokens},
                "model": body.get("model") or self.model,
                "stream": bool(body.get("stream", False)),
                "cache_salt": None,
                "priority": 0,
                "kv_transfer_params": None,
            })
        # A chat renders to one request; a completion prompt may be a batch.
        return out[0] if chat else out

    def metrics_text(self) -> str:
        labels = f'engine="0",model_name="{_label_value(self.model)}"'
        # on the virtual clock the emulated engine knows what runs and what waits (its KV
        # admission); this server only holds the requests open
        running, waiting = (self.virtual.gauges(self) if self.virtual is not None
                            else (self._running, self._waiting))
        with self._lock:
            gauges = [
                ("vllm:num_requests_running", "Number of requests in model execution batches.",
                 running),
                ("vllm:num_requests_waiting", "Number of requests waiting to be processed.",
                 waiting),
                ("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.",
                 self.cache.usage()),
            ]
            counters = [
                ("vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of "
                 "queried tokens.", self._query_tokens),
                ("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached "
                 "tokens.", self._hit_tokens),
                ("vllm:prompt_tokens", "Number of prefill tokens processed.",
                 self._prompt_tokens),
                ("vllm:generation_tokens", "Number of generation tokens processed.",
                 self._generation_tokens),
            ]
            lines: list[str] = []
            for name, help_text, value in gauges:
                lines += [f"# HELP {name} {help_text}", f"# TYPE {name} gauge",
                          f"{name}{{{labels}}} {float(value)!r}"]
            for name, help_text, value in counters:
                lines += [f"# HELP {name}_total {help_text}", f"# TYPE {name}_total counter",
                          f"{name}_total{{{labels}}} {float(value)!r}"]
            name = "vllm:request_success_total"
            lines += [f"# HELP {name} Count of successfully processed requests.",
                      f"# TYPE {name} counter"]
            for reason in ("stop", "length", "abort"):
                lines.append(f'{name}{{{labels},finished_reason="{reason}"}} '
                             f"{float(self._finished[reason])!r}")
            for name, help_text, hist in (
                ("vllm:time_to_first_token_seconds", "Histogram of time to first token in "
                 "seconds.", self._ttft),
                ("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in "
                 "seconds.", self._e2e),
            ):
                lines += [f"# HELP {name} {help_text}", f"# TYPE {name} histogram"]
                lines += hist.lines(name, labels)
        lines += self._cache_config_lines(labels)
        if self.virtual is not None:
            lines += self.virtual.metrics_lines(self, labels)
        return "\n".join(lines) + "\n"

    def _cache_config_lines(self, labels: str) -> list[str]:
        """vLLM's `vllm:cache_config_info` (an info gauge): the KV cache's size, which
        `python -m tools calibrate` reads."""
        name = "vllm:cache_config_info"
        bs, blocks = self.cache.block_size, self.cache.capacity_blocks
        return [f"# HELP {name} Information of the LLMEngine CacheConfig",
                f"# TYPE {name} gauge",
                f'{name}{{{labels},block_size="{bs}",enable_prefix_caching="True",'
                f'num_gpu_blocks="{blocks}",kv_cache_size_tokens="{bs * blocks}"}} 1.0']

    # -- generation

    def _serve_generation(self, handler: _Handler, body: dict, chat: bool) -> None:
        self._check_model(body)
        if self.fail_marker and self.fail_marker in json.dumps(body):
            with self._lock:
                self._failed += 1
            raise _BadRequest("EngineCore encountered an issue.", 500)
        prompts = self._prompts(body, chat)
        with self._lock:
            self._arrived.append((time.monotonic(), tuple(prompts[0][:ARRIVAL_HEAD])))
        max_tokens = self._max_tokens(body, chat)
        for ids in prompts:
            if len(ids) + max_tokens > self.max_model_len:
                raise _BadRequest(
                    f"This model's maximum context length is {self.max_model_len} tokens. "
                    f"However, you requested {len(ids) + max_tokens} tokens "
                    f"({len(ids)} in the messages, {max_tokens} in the completion)."
                )
        req = _Request(
            chat=chat, stream=bool(body.get("stream", False)), prompts=prompts,
            max_tokens=max_tokens, model=body.get("model") or self.model,
            rid=f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}",
            session=handler.headers.get("X-Session-ID"),
        )
        if self._slots is not None:
            with self._lock:
                self._waiting += 1
            self._slots.acquire()
            with self._lock:
                self._waiting -= 1
        try:
            with self._lock:
                self._running += 1
            words = [generate_words(ids, max_tokens) for ids in prompts]
            token_at = self._produced(req, self._timeline(req, max_tokens))
            token_at(0)
            for ids in prompts if self.virtual is None else ():
                self.cache.insert(ids)
            if req.stream:
                self._stream(handler, req, words, token_at)
            else:
                req.ttft = time.perf_counter() - req.t0
                token_at(max_tokens - 1)
                req.outputs = [list(w) for w in words]
                choices = []
                for i, w in enumerate(words):
                    if chat:
                        choices.append({"index": i, "message": {
                            "role": "assistant", "content": " ".join(w),
                            "reasoning_content": None, "tool_calls": []},
                            "logprobs": None, "finish_reason": "length", "stop_reason": None})
                    else:
                        choices.append({"index": i, "text": "".join(" " + x for x in w),
                                        "logprobs": None, "finish_reason": "length",
                                        "stop_reason": None, "prompt_logprobs": None})
                payload = {
                    "id": req.rid, "object": "chat.completion" if chat else "text_completion",
                    "created": req.created, "model": req.model, "choices": choices,
                    "usage": self._usage(req), "prompt_logprobs": None,
                    "worker_id": self.worker_id,
                }
                self._finish(req, "length")  # counters settle before the client has the answer
                handler._send_json(200, payload)
        finally:
            self._finish(req, "abort")
            if self._slots is not None:
                self._slots.release()

    def _count_hits(self, req: "_Request") -> int:
        req.cached = [self.cache.lookup(ids) for ids in req.prompts]
        with self._lock:
            self._query_tokens += req.prompt_tokens
            self._hit_tokens += sum(req.cached)
        return sum(req.cached)

    def _timeline(self, req: "_Request", max_tokens: int) -> Callable[[int], None]:
        """A function that returns once output token ``i`` exists: fixed rates, or the
        emulated GPU's steps (the prefix cache is looked up when the engine schedules the
        request, and fills chunk by chunk)."""
        if self.virtual is not None:
            self.virtual.serve(self, req)   # returns once it is done in virtual time
            return lambda i: None
        if self.engine is not None:
            ids = req.prompts[0] if len(req.prompts) == 1 else \
                [t for p in req.prompts for t in p]
            seq = self.engine.submit(req.prompt_tokens, 0, max_tokens,
                                     lookup=lambda: self._count_hits(req),
                                     on_progress=lambda done: self.cache.insert(ids[:done]))
            return lambda i: self.engine.wait_token(seq, i) and None
        self._count_hits(req)
        uncached = req.prompt_tokens - sum(req.cached)
        first_at = req.t0 + (self.overhead_ms + self.prefill_ms_per_token * uncached) / 1e3
        decode_s = self.decode_ms_per_token / 1e3
        return lambda i: _sleep_until(first_at + decode_s * i)

    def _finish(self, req: "_Request", reason: str) -> None:
        """Account for a request once: caches, counters, histograms, the recent log."""
        if req.finished:
            return
        req.finished = True
        e2e = time.perf_counter() - req.t0
        for ids, out in zip(req.prompts, req.outputs):
            if out and self.virtual is None:   # on the virtual clock the simulation caches
                self.cache.insert(list(ids) + [word_token(x) for x in out])
        with self._lock:
            self._running -= 1
            self._finished[reason] += 1
            self._prompt_tokens += req.prompt_tokens
            self._generation_tokens += max(0, sum(len(o) for o in req.outputs) - req.counted)
            if reason == "abort":
                self._aborted += 1
            else:
                self._requests += 1
                self._e2e.observe(e2e)
            if req.ttft is not None:
                self._ttft.observe(req.ttft)
            self.recent.append({
                "id": req.rid, "chat": req.chat, "stream": req.stream,
                "session_id": req.session, "prompt_tokens": req.prompt_tokens,
                "cached_tokens": sum(req.cached), "ttft_s": req.ttft, "e2e_s": e2e,
                "finish_reason": reason,
            })

    def _stream(self, handler: _Handler, req: "_Request", words: list[list[str]],
                token_at: Callable[[int], None]) -> None:
        """Send the SSE body: a role chunk (chat), one chunk per token, usage, [DONE]."""
        obj = "chat.completion.chunk" if req.chat else "text_completion"

        def send(payload: bytes) -> None:
            try:
                handler.wfile.write(b"%x\r\n%s\r\n" % (len(payload), payload))
            except OSError as exc:
                raise _Gone() from exc

        def event(choices: list, extra: dict | None = None) -> None:
            chunk = {"id": req.rid, "object": obj, "created": req.created, "model": req.model,
                     "choices": choices, "worker_id": self.worker_id}
            if extra:
                chunk.update(extra)
            send(b"data: " + json.dumps(chunk).encode() + b"\n\n")

        handler.send_response(200)
        handler.send_header("Content-Type", "text/event-stream; charset=utf-8")
        handler.send_header("Cache-Control", "no-cache")
        handler.send_header("Transfer-Encoding", "chunked")
        handler.send_header("X-Worker-Id", self.worker_id)
        handler.end_headers()
        if req.chat:
            event([{"index": i, "delta": {"role": "assistant", "content": ""},
                    "logprobs": None, "finish_reason": None} for i in range(len(words))])
        req.outputs = [[] for _ in words]
        last_step = req.max_tokens - 1
        for step in range(req.max_tokens):
            token_at(step)
            choices = []
            for i, w in enumerate(words):
                piece = w[step] if (req.chat and step == 0) else " " + w[step]
                reason = "length" if step == last_step else None
                if req.chat:
                    choices.append({"index": i, "delta": {"content": piece}, "logprobs": None,
                                    "finish_reason": reason})
                else:
                    choices.append({"index": i, "text": piece, "logprobs": None,
                                    "finish_reason": reason, "stop_reason": None})
            event(choices)
            for i, w in enumerate(words):
                req.outputs[i].append(w[step])
            if req.ttft is None:
                req.ttft = time.perf_counter() - req.t0
        event([], {"usage": self._usage(req)})
        self._finish(req, "length")  # counters settle before the client sees [DONE]
        send(b"data: [DONE]\n\n")
        send(b"")  # the zero-length chunk ends the body


class _Request:
    """One generation request in flight."""

    def __init__(self, *, chat: bool, stream: bool, prompts: list[list[int]], max_tokens: int,
                 model: str, rid: str, session: str | None) -> None:
        self.chat, self.stream, self.prompts = chat, stream, prompts
        self.max_tokens, self.model, self.rid, self.session = max_tokens, model, rid, session
        self.t0 = time.perf_counter()
        self.created = int(time.time())
        self.prompt_tokens = sum(len(ids) for ids in prompts)
        self.cached = [0] * len(prompts)
        self.outputs: list[list[str]] = [[] for _ in prompts]
        self.ttft: float | None = None
        self.finished = False
        self.counted = 0      # output tokens already in the generation counter

    def usage(self) -> dict:
        done = sum(len(o) for o in self.outputs)
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": done,
            "total_tokens": self.prompt_tokens + done,
            "prompt_tokens_details": {"cached_tokens": sum(self.cached)},
        }


def _sleep_until(deadline: float) -> None:
    delay = deadline - time.perf_counter()
    if delay > 0:
        time.sleep(delay)


# --------------------------------------------------------------------------- CLI


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.fake_worker",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--port", type=int, required=True, help="port on 127.0.0.1 (0 = any free)")
    p.add_argument("--worker-id", required=True, help="name reported in X-Worker-Id/worker_id")
    p.add_argument("--model", default="fake-model", help="served model name")
    p.add_argument("--prefill-ms-per-token", type=float, default=0.05)
    p.add_argument("--decode-ms-per-token", type=float, default=0.5)
    p.add_argument("--overhead-ms", type=float, default=1.0, help="fixed part of TTFT")
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--cache-blocks", type=int, default=8192, help="prefix cache capacity")
    p.add_argument("--default-max-tokens", type=int, default=16)
    p.add_argument("--max-model-len", type=int, default=32768)
    p.add_argument("--max-num-seqs", type=int, default=0, help="0 = unbounded concurrency")
    p.add_argument("--verbose", action="store_true", help="log every request to stderr")
    p.add_argument("--kv-events-port", type=int, default=None,
                   help="publish KV cache events (ZMQ, vLLM's wire format) on "
                        "tcp://127.0.0.1:PORT (0 = any free port); needs pyzmq and msgpack")
    p.add_argument("--kv-events-topic", default="", help="ZMQ topic of the KV events")
    p.add_argument("--profile", default=None, choices=list(PROFILES),
                   help="emulate this GPU profile (bench.emulator.PROFILES): KV capacity, "
                        "batching, prefill/decode rates")
    p.add_argument("--time-scale", type=float, default=1.0,
                   help="with --profile: wall seconds per emulated second")
    return p


def serve(argv: Sequence[str] | None = None) -> int:
    """Run one worker in the foreground until SIGINT/SIGTERM."""
    a = _parser().parse_args(argv)
    worker = FakeWorker(
        a.port, a.worker_id, model=a.model, prefill_ms_per_token=a.prefill_ms_per_token,
        decode_ms_per_token=a.decode_ms_per_token, overhead_ms=a.overhead_ms,
        block_size=a.block_size, cache_blocks=a.cache_blocks,
        default_max_tokens=a.default_max_tokens, max_model_len=a.max_model_len,
        max_num_seqs=a.max_num_seqs, verbose=a.verbose, kv_events_port=a.kv_events_port,
        kv_events_topic=a.kv_events_topic, profile=a.profile, time_scale=a.time_scale,
    ).start()
    done = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: done.set())
    events = f", KV events on {worker.kv_events_endpoint}" if worker.kv_events_endpoint else ""
    print(f"fake worker {worker.worker_id} serving {worker.model} on {worker.url}{events}",
          flush=True)
    try:
        while not done.wait(0.2):
            pass
    finally:
        worker.stop()
    return 0


main = serve

if __name__ == "__main__":
    raise SystemExit(serve())
