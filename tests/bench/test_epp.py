"""The endpoint picker's default scheduling as bench.epp models it (v1.5.0's scorers, weights and
picker): the arithmetic its plugins do, on hand-made candidates."""
from __future__ import annotations

import json
import random

from bench.epp import (
    MAX_BLOCKS, PrefixIndex, WEIGHTS, block_hashes, kv_scores, max_score_pick, prefix_scores,
    queue_scores, total_scores,
)


def test_weights_are_the_default_profile_of_the_rendered_config() -> None:
    pinned = json.loads(open("tests/fixtures/gateway/epp-v1.5.0.json").read())
    assert WEIGHTS == {k: float(v) for k, v in pinned["default_profile"].items()}


def test_queue_score_spans_min_to_max_and_is_neutral_when_equal() -> None:
    assert queue_scores([0, 5, 10]) == [1.0, 0.5, 0.0]
    assert queue_scores([3, 3, 3]) == [1.0, 1.0, 1.0]
    s = queue_scores([7, 2, 9, 4])
    assert max(s) == 1.0 and min(s) == 0.0 and s.index(1.0) == 1 and s.index(0.0) == 2


def test_kv_and_prefix_scores() -> None:
    assert kv_scores([0.0, 0.25, 1.0]) == [1.0, 0.75, 0.0]
    assert prefix_scores([0, 3, 4], 4) == [0.0, 0.75, 1.0]
    assert prefix_scores([0, 0], 0) == [0.0, 0.0]


def test_total_is_the_weighted_sum() -> None:
    # server 0: shortest queue, emptiest KV, no prefix; server 1: full prefix, longest queue
    got = total_scores([0, 4], [0.1, 0.5], [0, 10], 10)
    assert got == [2 * 1.0 + 2 * 0.9 + 0.0, 2 * 0.0 + 2 * 0.5 + 3 * 1.0]
    assert max_score_pick(got, random.Random(0)) == 1


def test_ties_go_to_every_tied_candidate_and_never_to_a_lower_one() -> None:
    rng = random.Random(0)
    picks = {max_score_pick([1.0, 3.0, 3.0, 2.0], rng) for _ in range(200)}
    assert picks == {1, 2}


def test_prefix_blocks_chain_and_truncate() -> None:
    a = block_hashes("x" * 64 * 3 + "y" * 64)
    b = block_hashes("x" * 64 * 3 + "z" * 64)
    assert len(a) == 4 and a[:3] == b[:3] and a[3] != b[3]
    assert block_hashes("x" * 63) == []                    # under one block: nothing to match
    assert len(block_hashes("x" * 64 * (MAX_BLOCKS + 10))) == MAX_BLOCKS
    # the same block after a different one hashes differently (the chain)
    assert block_hashes("y" * 64 + "x" * 64)[1] != block_hashes("z" * 64 + "x" * 64)[1]


def test_index_matches_leading_blocks_and_evicts_least_recent() -> None:
    idx = PrefixIndex(2, capacity=4)
    h = block_hashes("a" * 64 * 4)
    idx.add(h, 0)
    assert idx.matched(h) == [4, 0]
    assert idx.matched(h[:2] + block_hashes("b" * 64 * 2)) == [2, 0]
    idx.add(block_hashes("c" * 64 * 2), 0)             # capacity 4: the two oldest go
    assert idx.matched(h) == [0, 0]


class _Worker:
    def __init__(self, waiting: int = 0, usage: float = 0.0) -> None:
        self.waiting, self.u = waiting, usage
        self.cache = self

    capacity_blocks = 1000

    def counts(self) -> tuple[int, int]:
        return 0, self.waiting

    def usage(self) -> float:
        return self.u


class _Fleet:
    def __init__(self, n: int) -> None:
        self.workers = [_Worker() for _ in range(n)]
        self.sim = self
        self.now = 0.0


class _Req:
    def __init__(self, text: str) -> None:
        self.messages = [{"role": "system", "content": text}]


def test_a_full_prefix_match_outweighs_the_queue_alone_but_not_queue_and_a_kv_gap() -> None:
    from bench.epp import REFRESH_S, EppRouter
    fleet = _Fleet(3)
    router = EppRouter(fleet)
    doc = "shared context " * 400
    first = router.route(_Req(doc), False)
    assert router.route(_Req(doc), False) == first          # all idle: the prefix decides
    fleet.workers[first].waiting = 50                         # its queue the longest: 3 > 2
    fleet.now += REFRESH_S
    assert router.route(_Req(doc), False) == first
    fleet.workers[first].u = 0.8                              # and KV 0.8 fuller: 3 + 0.4 < 2 + 2
    fleet.now += REFRESH_S
    moved = router.route(_Req(doc), False)
    assert moved != first
    fleet.workers[moved].waiting = 10          # both hold it now: the emptier holder wins
    fleet.now += REFRESH_S
    assert router.route(_Req(doc), False) == moved
    # metrics are what the last scrape saw: within 50 ms a change is not seen
    fleet.workers[first].u = 0.0
    fleet.workers[first].waiting = 0
    assert router._usage[first] == 0.8


def test_the_verdict_past_saturation_needs_more_output_and_a_lower_mean_ttft() -> None:
    from bench.tiered import epp_verdict, render_epp

    def arm(out: float, mean: float) -> dict:
        st = {f"qps-{q}": {"output_tok_s": out, "ttft_mean_s": mean, "ttft_p90_s": 2 * mean}
              for q in (30, 40, 60)}
        return {"stages": st | {"all": {"output_tok_s": out, "ttft_mean_s": mean,
                                        "ttft_p90_s": 2 * mean}},
                "waiting_mean_per_pod": 1.0, "waiting_max_per_pod": 3, "preemptions": 0}
    setup = {"setup": {"stages": [["warmup", 15, 50], ["qps-30", 30, 10], ["qps-40", 40, 10],
                                  ["qps-60", 60, 10]], "output_len": 1000}}
    d = setup | {"random": arm(4000, 50), "prefixaware": arm(6000, 3), "epp": arm(7000, 0.3)}
    v = epp_verdict(d)
    assert v is not None and v["stages"] == ["qps-40", "qps-60"] and v["wins"]
    assert any("wins past saturation" in line for line in render_epp(d))
    d["epp"] = arm(7000, 5)          # more output, but slower to first token: no win
    assert not epp_verdict(d)["wins"]
    assert render_epp(setup) == []   # no epp arm: no section
