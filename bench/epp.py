"""The Gateway API Inference Extension endpoint picker's default scheduling (v1.5.0), in-process on
the virtual clock: the arm `epp` of `bench.tiered`'s llm-d-shaped run, to tell whether our
prefix-aware router's policy or our model is why that run falls short of llm-d's figures.

Read in kubernetes-sigs/gateway-api-inference-extension v1.5.0
(df9f8909fe06fe2dfd4a6fc0bd0c01a0acabf849), pkg/epp/framework/plugins/ unless said:
- profile `default` of config/charts/epplib/templates/_config.yaml: queue-scorer x 2,
  kv-cache-utilization-scorer x 2, prefix-cache-scorer x 3, max-score picker (the default picker
  when a profile names none);
- scheduling/scorer/queuedepth/queue.go: (max - q) / (max - min) over the candidates' waiting
  queues (vllm:num_requests_waiting), 1 for all when they are equal;
- scheduling/scorer/kvcacheutilization: 1 - KV usage (vllm:kv_cache_usage_perc);
- scheduling/scorer/prefix/plugin.go: matched blocks / total blocks, from the
  approx-prefix-cache-producer (requestcontrol/dataproducer/approximateprefix): the chat
  messages as JSON cut into blocks of blockSizeTokens x 4 characters (autoTune: the server's block
  size, 16), at most 256 blocks, each hash chained to the previous one; a server's match is the
  number of leading blocks it holds; after each pick (PreRequest) the picked server's LRU of
  hashes gets the request's blocks, its capacity the server's GPU blocks (autoTune);
- scheduling/picker/max_score_picker.go: shuffle, stable sort by score: ties broken at random;
- the metrics the scorers read are scraped every 50 ms (pkg/epp/server/options.go,
  --refresh-metrics-interval).

Not modelled: admission (pkg/epp/requestcontrol/admission.go: the saturation detector sheds
only requests of priority < 0; these have the default, 0, so all pass), Envoy's ext-proc hop (the driver's 1 ms hop stands for it), and the real
JSON the gateway sees (`json.dumps` of the same messages, Go's compact form).
"""
from __future__ import annotations

import hashlib
import json
import random
from collections import OrderedDict
from typing import Any, Sequence

WEIGHTS = {"queue-scorer": 2.0, "kv-cache-utilization-scorer": 2.0, "prefix-cache-scorer": 3.0}
BLOCK_TOKENS = 16          # autoTune: vLLM's block size, as the server reports it
CHARS_PER_TOKEN = 4        # averageCharactersPerToken
MAX_BLOCKS = 256           # defaultMaxPrefixBlocks
REFRESH_S = 0.05           # --refresh-metrics-interval default


def queue_scores(waiting: Sequence[int]) -> list[float]:
    lo, hi = min(waiting), max(waiting)
    if hi == lo:
        return [1.0] * len(waiting)
    return [(hi - q) / (hi - lo) for q in waiting]


def kv_scores(usage: Sequence[float]) -> list[float]:
    return [1.0 - u for u in usage]


def prefix_scores(matched: Sequence[int], total: int) -> list[float]:
    return [m / total if total else 0.0 for m in matched]


def total_scores(waiting: Sequence[int], usage: Sequence[float], matched: Sequence[int],
                 total: int) -> list[float]:
    """The profile's weighted sum per candidate, as the scheduler adds its scorers' scores."""
    parts = ((WEIGHTS["queue-scorer"], queue_scores(waiting)),
             (WEIGHTS["kv-cache-utilization-scorer"], kv_scores(usage)),
             (WEIGHTS["prefix-cache-scorer"], prefix_scores(matched, total)))
    return [sum(w * s[i] for w, s in parts) for i in range(len(waiting))]


def max_score_pick(scores: Sequence[float], rng: random.Random) -> int:
    """max-score-picker: the highest score, ties at random (its shuffle before a stable sort)."""
    best = max(scores)
    return rng.choice([i for i, s in enumerate(scores) if s == best])


def block_hashes(text: str, model: str = "", block_tokens: int = BLOCK_TOKENS,
                 max_blocks: int = MAX_BLOCKS) -> list[bytes]:
    """hashPrompt: blocks of block_tokens x 4 characters of the request's messages, at most
    max_blocks, each hash over the block and the previous hash (the first seeded by the model)."""
    size = block_tokens * CHARS_PER_TOKEN
    data = text.encode()[:size * max_blocks]
    prev = hashlib.blake2b(model.encode(), digest_size=8).digest()
    out = []
    for i in range(0, len(data) - size + 1, size):
        prev = hashlib.blake2b(data[i:i + size] + prev, digest_size=8).digest()
        out.append(prev)
    return out


class PrefixIndex:
    """The approximate prefix indexer: per server an LRU of block hashes."""

    def __init__(self, servers: int, capacity: int) -> None:
        self.capacity = capacity
        self.lru: list[OrderedDict[bytes, None]] = [OrderedDict() for _ in range(servers)]

    def matched(self, hashes: Sequence[bytes]) -> list[int]:
        """matchLongestPrefix: per server, leading blocks held, stopping at the first block
        no server holds (a server that misses one block early still counts later ones it holds,
        as upstream's greedy loop does)."""
        res = [0] * len(self.lru)
        for h in hashes:
            held = [i for i, lru in enumerate(self.lru) if h in lru]
            if not held:
                break
            for i in held:
                res[i] += 1
        return res

    def add(self, hashes: Sequence[bytes], server: int) -> None:
        lru = self.lru[server]
        for h in hashes:
            lru[h] = None
            lru.move_to_end(h)
            if len(lru) > self.capacity:
                lru.popitem(last=False)


class EppRouter:
    """Routes like ModelRouter (route/done/restart) with the EPP's default profile, reading the
    emulated engines' gauges as a 50 ms scrape would."""

    def __init__(self, fleet: Any, seed: int = 1) -> None:
        self.fleet = fleet
        self.n = len(fleet.workers)
        self.rng = random.Random(f"epp/{seed}")
        # autoTune: the LRU holds as many hashes as the server has GPU blocks
        self.index = PrefixIndex(self.n, fleet.workers[0].cache.capacity_blocks)
        self._scraped_at = -1.0
        self._waiting = [0] * self.n
        self._usage = [0.0] * self.n
        self.picks = [0] * self.n

    def _scrape(self) -> None:
        now = self.fleet.sim.now
        if now - self._scraped_at < REFRESH_S:
            return
        self._scraped_at = now
        for i, w in enumerate(self.fleet.workers):
            self._waiting[i] = w.counts()[1]
            self._usage[i] = w.cache.usage()

    def route(self, req: Any, session_header: bool) -> int:
        self._scrape()
        hashes = block_hashes(json.dumps(req.messages, separators=(",", ":")))
        scores = total_scores(self._waiting, self._usage, self.index.matched(hashes),
                              len(hashes))
        i = max_score_pick(scores, self.rng)
        self.index.add(hashes, i)
        self.picks[i] += 1
        return i

    def done(self, i: int) -> None:
        pass

    def restart(self) -> None:
        self.index = PrefixIndex(self.n, self.index.capacity)
        self._scraped_at = -1.0
