"""kv_aware: the real vllm-router routes on its own index of the workers' KV caches.

The router is started from the rendered ``kvaware`` Deployment args (static worker list, one
``--kv-event-source WORKER=tcp://...:5557`` per worker, ``--kv-event-block-size``,
``--kv-event-model``), localised onto fake workers that publish their cache changes the way
vLLM does (ZMQ, msgpack, tagged-map events). The fake workers take their block size and topic
from the rendered vLLM args, so a worker/router mismatch fails here. All on 127.0.0.1.
"""
from __future__ import annotations

import collections
import time

import msgpack
import pytest
import requests
import zmq

from bench.fake_worker import FakeWorker, render_chat
from bench.loopback import FakeWorkerPool, chat, filler, free_port, run_conversations

pytestmark = pytest.mark.e2e

LOOKUPS = "vllm_router_kv_placement_lookups_total"
SESSIONS, TURNS = 8, 4


def lookups(router) -> collections.Counter:
    return collections.Counter({r: router.metric(LOOKUPS, result=r)
                                for r in ("hit", "miss", "missing_tokens", "index_unavailable")})


def test_fake_worker_publishes_kv_events_in_vllm_wire_format():
    """The contract the router decodes: 3 frames (topic, 8-byte big-endian seq, msgpack
    ``[ts, [event maps], rank]``); BlockStored carries the render/tokenize ids of the newly
    cached full blocks chained on their parent; LRU evictions and resets are announced."""
    w = FakeWorker(0, "pub", kv_events_port=0, cache_blocks=40).start()
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sub.setsockopt(zmq.RCVTIMEO, 2000)
    sub.setsockopt(zmq.SUBSCRIBE, b"")

    def subscribed() -> None:
        deadline = time.monotonic() + 5
        while w.kv_subscribers() < 1 and time.monotonic() < deadline:
            sub.poll(10)  # a SUB resubscribes after a reconnect only when its owner calls in
        assert w.kv_subscribers() == 1

    try:
        sub.connect(w.kv_events_endpoint)
        subscribed()

        def batches() -> list:
            """What has been published: wait (2 s at most) for one batch, then drain."""
            out: list = []
            for _ in range(1000):
                try:
                    frames = sub.recv_multipart(zmq.NOBLOCK if out else 0)
                except zmq.Again:
                    break
                assert len(frames) == 3 and frames[0] == b"" and len(frames[1]) == 8, frames
                seq = int.from_bytes(frames[1], "big", signed=True)
                ts, events, rank = msgpack.unpackb(frames[2])
                assert ts > 0 and rank == 0
                out.append((seq, events))
                time.sleep(0.05)  # let the rest of this request's batches arrive
            return out

        messages = [{"role": "system", "content": filler("wire", 100)},
                    {"role": "user", "content": "first"}]
        ids = requests.post(w.url + "/tokenize", json={"messages": messages}, timeout=5).json()
        ids = ids["tokens"]
        assert ids == render_chat(messages)
        res = chat(w.url, messages, stream=False, max_tokens=4, timeout=5)
        assert res.ok
        got = batches()
        assert [seq for seq, _ in got] == list(range(len(got)))
        stored = [e for _, events in got for e in events]
        assert stored[0] == {
            "type": "BlockStored", "block_hashes": stored[0]["block_hashes"],
            "parent_block_hash": None, "token_ids": ids[:len(ids) // 16 * 16], "block_size": 16,
            "lora_id": None, "medium": "GPU", "lora_name": None}
        assert len(stored[0]["block_hashes"]) == len(ids) // 16
        assert all(0 <= h < 2**64 for e in stored for h in e["block_hashes"])

        # The next turn stores only the new blocks, chained on the last cached one.
        known = [h for e in stored for h in e["block_hashes"]]
        messages += [{"role": "assistant", "content": res.text},
                     {"role": "user", "content": filler("wire-2", 40)}]
        assert chat(w.url, messages, stream=False, max_tokens=4, timeout=5).ok
        nxt = [e for _, events in batches() for e in events]
        assert nxt and nxt[0]["type"] == "BlockStored"
        assert nxt[0]["parent_block_hash"] == known[-1]
        assert not set(nxt[0]["block_hashes"]) & set(known)
        first, n = len(known), len(nxt[0]["block_hashes"])  # turn 1 + its answer = a prefix
        assert nxt[0]["token_ids"] == render_chat(messages)[first * 16:(first + n) * 16]

        # 40 blocks hold 640 tokens: a longer unrelated prompt evicts every older block.
        assert chat(w.url, [{"role": "user", "content": filler("evict", 800)}], stream=False,
                    max_tokens=4, timeout=5).ok
        events = [e for _, evs in batches() for e in evs]
        removed = [h for e in events if e["type"] == "BlockRemoved" for h in e["block_hashes"]]
        assert removed[:len(known)] == known, "LRU: the first conversation's blocks go first"
        assert all(set(e) == {"type", "block_hashes", "medium"}
                   for e in events if e["type"] == "BlockRemoved")

        assert requests.post(w.url + "/reset_prefix_cache", timeout=5).status_code == 200
        cleared = batches()
        assert [evs for _, evs in cleared] == [[{"type": "AllBlocksCleared"}]]
        assert w.stats()["kv_events"]["AllBlocksCleared"] == 1

        # Dead and back: same endpoint, the subscriber reconnects, the sequence continues.
        endpoint = w.kv_events_endpoint
        w.stop()
        assert w.kv_subscribers() == 0
        w.start()
        assert w.kv_events_endpoint == endpoint
        subscribed()
        assert chat(w.url, messages, stream=False, max_tokens=4, timeout=5).ok
        assert batches()[0][0] == cleared[-1][0] + 1
    finally:
        sub.close(linger=0)
        ctx.term()
        w.stop()


def test_kvaware_pins_conversations_and_spreads_distinct_prefixes(kv_worker_pool,
                                                                 launch_routers):
    kv_worker_pool.reset()
    [router] = launch_routers("kvaware", kv_worker_pool)
    convs = run_conversations([router.url], SESSIONS, TURNS, name="kv")

    assert all(r.ok for c in convs for r in c.results), [r for c in convs for r in c.results]
    placement = {c.name: c.workers for c in convs}
    for name, workers in placement.items():
        assert len(set(workers)) == 1, f"{name} moved between workers: {placement}"
    per_worker = collections.Counter(w[0] for w in placement.values())
    assert len(per_worker) >= 3, f"distinct prefixes not spread: {placement}"
    assert max(per_worker.values()) <= SESSIONS // 2, per_worker
    # The router knew where each prefix was: every later turn is an index hit.
    found = lookups(router)
    assert found["hit"] == SESSIONS * (TURNS - 1), found
    assert found["miss"] == SESSIONS and found["missing_tokens"] == 0, found
    for c in convs:
        for prev, cur in zip(c.results, c.results[1:]):
            assert cur.cached_tokens >= prev.usage["prompt_tokens"] - 16, (c.name, cur.usage)
    assert "kv_index decode batch" not in router.log_text()


def test_kvaware_without_events_neither_pins_nor_hits(kv_worker_pool, launch_routers):
    """Negative control: the same router, its event sources pointed at ports where nothing
    publishes. Routing falls back to load only; conversations wander and no lookup hits, so
    the test above can only pass because events flow."""
    kv_worker_pool.reset()
    silent = [f"tcp://127.0.0.1:{free_port()}" for _ in kv_worker_pool]
    [router] = launch_routers("kvaware", kv_worker_pool, kv_endpoints=silent)
    convs = run_conversations([router.url], SESSIONS, TURNS, name="blind")

    assert all(r.ok for c in convs for r in c.results)
    found = lookups(router)
    assert found["hit"] == 0 and found["miss"] == SESSIONS * TURNS, found
    moved = [c.name for c in convs if len(set(c.workers)) > 1]
    assert moved, "conversations stayed put without KV events: the pinning test proves nothing"


def test_kvaware_forgets_evicted_and_cleared_blocks(kv_worker_opts, launch_routers):
    """BlockRemoved and AllBlocksCleared reach the index: a prefix the worker evicted or
    dropped stops being a hit, and the source keeps working afterwards."""
    with FakeWorkerPool(1, **kv_worker_opts(1), cache_blocks=24) as pool:
        [router] = launch_routers("kvaware", pool)
        w = pool.workers[0]
        prefix = [{"role": "system", "content": filler("forget", 120)}]  # ~8 blocks

        def ask(what: str, messages: list) -> str:
            before = lookups(router)
            res = chat(router.url, messages, stream=False, max_tokens=2, timeout=10)
            assert res.ok, res
            time.sleep(0.1)  # the router polls its event socket every 10 ms
            delta = lookups(router) - before
            assert sum(delta.values()) == 1, (what, delta)
            return next(iter(delta))

        question = prefix + [{"role": "user", "content": "q"}]
        assert ask("cold", question) == "miss"
        assert ask("cached", question) == "hit"
        # 30+ blocks of another prompt push every block of the prefix out of 24.
        ask("evicting", [{"role": "user", "content": filler("flood", 480)}])
        assert w.stats()["kv_events"].get("BlockRemoved"), w.stats()
        assert w.cache.lookup(render_chat(question)) == 0
        assert ask("evicted", question) == "miss"
        assert ask("cached again", question) == "hit"
        assert requests.post(w.url + "/reset_prefix_cache", timeout=5).status_code == 200
        time.sleep(0.1)
        assert ask("reset", question) == "miss"
        assert "kv_index decode batch" not in router.log_text()
