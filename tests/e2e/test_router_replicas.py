"""Issue 6: routing stays consistent across router replicas, and survives a worker's death.

Two real routers, started from the same rendered Deployment args (each on its own ports), in
front of the same fake workers; every conversation alternates its turns between them. Then a
worker dies mid-run under each strategy. All on 127.0.0.1.
"""
from __future__ import annotations

import collections
import contextlib
import math
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from observability.metrics import router_metric
from bench.fake_worker import ARRIVAL_HEAD, render_chat
from bench.loopback import Conversation, FakeWorkerPool, arg_value, run_conversations

pytestmark = pytest.mark.e2e

SESSIONS, TURNS = 8, 4
# consistent_hash places a session id by hashing it onto a ring of the workers' URLs, which
# change every run (free ports): 8 ids land on <= 2 of 4 workers ~2% of the time, 16 ids ~0.01%.
HASHED_SESSIONS = 16
ROUTER_DEFAULTS = {"--retry-max-retries": 5, "--cb-failure-threshold": 10,
                   "--health-check-interval-secs": 60, "--health-failure-threshold": 3}


def setting(args: list[str], flag: str) -> int:
    """A router setting as the rendered args set it, else vllm-router 0.1.17's default."""
    value = arg_value(args, flag)
    return int(value) if value is not None else ROUTER_DEFAULTS[flag]


def prefix_hit_rate(convs: list[Conversation]) -> tuple[float, float]:
    """(cached / prompt tokens over turns 2+, the same if every turn found its whole history)."""
    cached = prompt = ideal = 0
    for c in convs:
        done = [r for r in c.results if r.ok]
        for prev, cur in zip(done, done[1:]):
            total = cur.usage["prompt_tokens"]
            cached += cur.cached_tokens
            prompt += total
            history = prev.usage["prompt_tokens"] + prev.usage["completion_tokens"]
            ideal += min(history // 16 * 16, (total - 1) // 16 * 16)
    return cached / prompt, ideal / prompt


# The mechanism each strategy ships with: session hashes a stable key and kvaware shares the
# workers' KV events, so turns may alternate between replicas; prefixaware relies on client
# affinity at the load balancer (the router Service's NLB keeps a client on one replica), so
# its clients split across the replicas and each replica sees every turn of its clients.
@pytest.mark.parametrize("strategy, sessions, sticky", [("session", HASHED_SESSIONS, False),
                                                       ("kvaware", SESSIONS, False),
                                                       ("prefixaware", SESSIONS, True)])
def test_two_replicas_keep_each_conversation_on_one_worker(strategy, sessions, sticky,
                                                           kv_worker_pool, launch_routers,
                                                           report_figure):
    kv_worker_pool.reset()
    routers = launch_routers(strategy, kv_worker_pool, n=2)
    convs = run_conversations([r.url for r in routers], sessions, TURNS, name=f"{strategy}-2r",
                              session_header=strategy == "session", sticky=sticky)

    assert all(r.ok for c in convs for r in c.results), [r for c in convs for r in c.results]
    where = {c.name: c.workers for c in convs}
    moved = {name: w for name, w in where.items() if len(set(w)) != 1}
    assert not moved, f"conversations moved between workers across replicas: {moved}"
    per_worker = collections.Counter(w[0] for w in where.values())
    assert len(per_worker) >= 3, f"load not spread: {where}"
    served = [r.served() for r in routers]
    assert served == [sessions * TURNS / 2] * 2, served  # both replicas carried half the turns
    hit, ideal = prefix_hit_rate(convs)
    assert hit == pytest.approx(ideal), (hit, ideal)
    if strategy == "kvaware":
        # Each replica subscribes to every worker: its index knows the turns the other
        # replica routed. Only each conversation's first turn is a miss.
        hits = [r.metric("vllm_router_kv_placement_lookups_total", result="hit") for r in routers]
        assert sum(hits) == sessions * (TURNS - 1), hits
    how = "client affinity" if sticky else "alternating turns"
    report_figure(f"2 router replicas, {strategy}: {sessions}x{TURNS} {how}, 0 "
                  f"conversations moved, workers used {dict(sorted(per_worker.items()))}, "
                  f"prefix hit rate on later turns {hit:.2f} (ideal {ideal:.2f})")


def test_two_prefixaware_replicas_bounce_conversations_measured(kv_worker_pool, launch_routers,
                                                               report_figure):
    """cache_aware keeps its prefix tree in each replica's memory: a replica routes a turn
    without knowing where the other one sent the previous turns. Measured, not asserted:
    how many conversations bounce between workers and what that costs in prefix hits."""
    rounds = 3
    bounced = moves = 0
    rates = []
    routers = launch_routers("prefixaware", kv_worker_pool, n=2)
    for rnd in range(rounds):
        kv_worker_pool.reset()
        convs = run_conversations([r.url for r in routers], SESSIONS, TURNS,
                                  name=f"prefix-2r-{rnd}")
        assert all(r.ok for c in convs for r in c.results)
        assert all(len(c.workers) == TURNS for c in convs)
        bounced += sum(len(set(c.workers)) > 1 for c in convs)
        moves += sum(a != b for c in convs for a, b in zip(c.workers, c.workers[1:]))
        rates.append(prefix_hit_rate(convs))
    served = [r.served() for r in routers]
    assert served == [rounds * SESSIONS * TURNS / 2] * 2, served
    hit = sum(h for h, _ in rates) / rounds
    ideal = sum(i for _, i in rates) / rounds
    assert 0 <= bounced <= rounds * SESSIONS and 0 < ideal <= 1
    report_figure(f"2 router replicas, prefixaware: {bounced}/{rounds * SESSIONS} conversations "
                  f"bounced, {moves}/{rounds * SESSIONS * (TURNS - 1)} turns moved worker; "
                  f"prefix hit rate on later turns {hit:.2f} (ideal {ideal:.2f}; per round "
                  + ", ".join(f"{h:.2f}" for h, _ in rates) + ")")


def test_kvaware_replica_that_joins_late_measured(kv_worker_pool, launch_routers,
                                                  report_figure):
    """A kv_aware replica added while conversations run (router HPA, rolling update, restart)
    subscribes cold: it never saw the blocks already cached, and later blocks of those
    conversations chain onto parents it does not know. Measured, not asserted: how many of
    the running conversations move once their turns also reach the new replica."""
    kv_worker_pool.reset()
    [first] = launch_routers("kvaware", kv_worker_pool)
    convs = [Conversation(f"late-{s}") for s in range(SESSIONS)]

    def talk(urls: list[str], turns: int) -> None:
        def user(s: int) -> None:
            for t in range(turns):
                convs[s].turn(urls[(s + t) % len(urls)])

        with ThreadPoolExecutor(SESSIONS) as users:
            list(users.map(user, range(SESSIONS)))

    talk([first.url], 1)
    # the first turns' KV events reach the router before the second turns do (it polls its
    # event socket every 10 ms; with both cores busy a turn can follow sooner than that)
    time.sleep(0.2)
    talk([first.url], 1)
    [late] = launch_routers("kvaware", kv_worker_pool)
    kv_worker_pool.wait_kv_subscribers(2)
    talk([first.url, late.url], TURNS)
    assert all(r.ok for c in convs for r in c.results)
    assert all(c.workers[0] == c.workers[1] for c in convs)  # pinned while one replica ran
    moved = sum(len(set(c.workers)) > 1 for c in convs)
    moves = sum(a != b for c in convs for a, b in zip(c.workers[1:], c.workers[2:]))
    found = {r: late.metric("vllm_router_kv_placement_lookups_total", result=r)
             for r in ("hit", "miss")}
    assert sum(found.values()) == SESSIONS * TURNS / 2, found  # half the later turns
    report_figure(f"kvaware replica joining late: {moved}/{SESSIONS} running conversations "
                  f"moved worker ({moves} moves in {SESSIONS * TURNS} later turns); the new "
                  f"replica's lookups: {found['hit']:.0f} hit, {found['miss']:.0f} miss")


# --------------------------------------------------------------------------- worker death

DEATH_USERS = 6
# The health checker marks a dead worker within interval x threshold (2 s rendered), and the
# traffic outlasts that by a health-check interval or two.
TRAFFIC_AFTER_KILL_S = 4.0
# The share of a conversation's later kvaware turns on one worker, at least
KVAWARE_KEPT = 0.75


class _Traffic:
    """Users holding conversations with one router until stopped: even users stream, odd
    ones do not. Every attempt is logged with its start and end time."""

    def __init__(self, url: str, name: str, session_header: bool) -> None:
        self.url, self.session_header = url, session_header
        self.convs = [Conversation(f"{name}-{i}", system_words=300) for i in range(DEATH_USERS)]
        self.log: list[tuple[float, float, int, object]] = []  # (t0, t1, user, result)
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._user, args=(i,), daemon=True)
                         for i in range(DEATH_USERS)]

    def _user(self, i: int) -> None:
        for _ in range(2000):
            if self._stop.is_set():
                return
            self.send(i)
            time.sleep(0.05)

    def send(self, i: int):
        t0 = time.monotonic()
        res = self.convs[i].turn(self.url, session_header=self.session_header,
                                 stream=i % 2 == 0, timeout=10)
        self.log.append((t0, time.monotonic(), i, res))
        return res

    def start(self) -> "_Traffic":
        for t in self._threads:
            t.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=15)

    def wait_turns(self, n: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while any(c.turns_done < n for c in self.convs):
            assert time.monotonic() < deadline, "conversations did not get going"
            time.sleep(0.02)


def _kill_mid_run(strategy: str, pool: FakeWorkerPool, router, args: list[str]) -> dict:
    """Kill the worker of user 0 while it serves, keep the users talking, (optionally) wait for
    the router's health checker to mark it, then have every user talk once more."""
    interval = setting(args, "--health-check-interval-secs")
    window = interval * setting(args, "--health-failure-threshold")
    traffic = _Traffic(router.url, f"death-{strategy}", strategy == "session").start()
    try:
        traffic.wait_turns(2, timeout=10)
        victim = pool.by_id(traffic.convs[0].workers[-1])
        deadline = time.monotonic() + 2
        while victim.stats()["running"] == 0 and time.monotonic() < deadline:
            time.sleep(0.002)  # die while serving: some requests are in flight
        on_victim = {i for i, c in enumerate(traffic.convs) if c.workers[-1] == victim.worker_id}
        t_kill = time.monotonic()
        victim.stop()  # dying takes a moment: requests may still arrive until it is gone
        t_dead = time.monotonic()
        # when each conversation reached it, a turn in flight included: a kvaware router that
        # has not read a worker's KV events yet can move a conversation by load
        heads = {tuple(render_chat(c.messages[:1])[:ARRIVAL_HEAD]): i
                 for i, c in enumerate(traffic.convs)}
        reached = [(t, heads[head]) for t, head in victim.arrivals()
                   if t <= t_dead and head in heads]
        failures, last_failure = 0.0, 0.0  # the router's failed attempts on the dead worker
        detected = None
        while time.monotonic() < t_kill + TRAFFIC_AFTER_KILL_S:
            now = router.metric(router_metric("worker_outcomes", router.implementation),
                                worker=victim.url, outcome="failure")
            if now != failures:
                failures, last_failure = now, time.monotonic() - t_kill
            if detected is None and victim.url not in router.healthy_workers():
                detected = time.monotonic() - t_kill
            time.sleep(0.05)
    finally:
        traffic.stop()
    while detected is None and time.monotonic() < t_kill + window + 3:
        if victim.url not in router.healthy_workers():
            detected = time.monotonic() - t_kill
        time.sleep(0.1)
    final = [traffic.send(i) for i in range(DEATH_USERS)]
    return {"traffic": traffic, "victim": victim.worker_id, "on_victim": on_victim,
            "reached": reached,
            "t_kill": t_kill, "t_dead": t_dead, "window": window, "detected": detected,
            "attempts_on_dead": failures, "last_attempt_on_dead": last_failure, "final": final,
            "retries": router.metric(router_metric("retries", router.implementation)),
            "allowed_errors": 0 if strategy == "kvaware" or "--disable-circuit-breaker" in args
            else math.floor(setting(args, "--cb-failure-threshold")
                            / setting(args, "--retry-max-retries"))}


def test_worker_death_moves_its_conversations_within_the_health_check_window(
        kv_worker_opts, router_args, launch_routers, report_figure):
    """One worker dies mid-run, under each strategy at once.

    The health checker marks it unhealthy within the rendered window (interval x failure
    threshold, 2 s); a request that hits it is tried again after the retry backoff (2.5 s),
    past the window, on a live worker (neither router runs a breaker: both counted what
    clients provoke). Its conversations continue on the other workers, and stay on one (session:
    every turn; kvaware: KVAWARE_KEPT of them, as it weighs load). The client sees errors
    only for requests in flight at the moment of death (streams cut mid-answer), plus, where
    a vllm-router breaker is rendered, at most floor(cb-failure-threshold / retry-max-retries)
    requests that exhaust their retries on it before its circuit opens.
    """
    strategies = ["prefixaware", "session", "kvaware"]
    rendered = {s: router_args(s, 4) for s in strategies}  # jsii: render in this thread only
    with contextlib.ExitStack() as stack, ThreadPoolExecutor(len(strategies)) as ex:
        pools = {s: stack.enter_context(FakeWorkerPool(4, **kv_worker_opts(4)))
                 for s in strategies}
        started = {s: ex.submit(launch_routers, s, pools[s]) for s in strategies}
        routers = {s: f.result(timeout=60)[0] for s, f in started.items()}
        killed = {s: ex.submit(_kill_mid_run, s, pools[s], routers[s], rendered[s])
                  for s in strategies}
        runs = {s: f.result(timeout=60) for s, f in killed.items()}

    for strategy, run in runs.items():
        t_kill, t_dead, victim = run["t_kill"], run["t_dead"], run["victim"]
        log = run["traffic"].log
        in_flight = [(t0, t1, i, r) for t0, t1, i, r in log if t0 < t_dead and t1 >= t_kill]
        after = [(t0, t1, i, r) for t0, t1, i, r in log if t0 >= t_dead]
        before = [r for t0, t1, i, r in log if t1 < t_kill]
        failed_after = [(i, round(t0 - t_kill, 3), round(t1 - t_kill, 3), r)
                        for t0, t1, i, r in after if not r.ok]
        where = f"{strategy}: {run}"
        assert all(r.ok for r in before), where
        # a turn cut by the death was on the victim: its conversation's last turn was, or the
        # turn itself reached it; a later failure is one of a conversation that reached it
        cut_here = [(i, t0) for t0, t1, i, r in in_flight if not r.ok
                    and i not in run["on_victim"]
                    and not any(j == i and t0 <= t for t, j in run["reached"])]
        touched = run["on_victim"] | {j for _, j in run["reached"]}
        assert not cut_here and all(i in touched for _, _, i, r in after if not r.ok), \
            f"{strategy}: a conversation on a live worker saw an error: {cut_here} {where}"
        assert len(failed_after) <= run["allowed_errors"], (strategy, failed_after)
        # The router stopped trying the dead worker: at the latest, its health checks.
        assert run["last_attempt_on_dead"] < run["window"] + \
            setting(rendered[strategy], "--health-check-interval-secs"), where
        assert run["detected"] is not None and run["detected"] <= run["window"] + 1, where
        # Its conversations carried on elsewhere, and everyone talks once more at the end.
        for i in run["on_victim"]:
            later = [r.worker_id for t0, t1, j, r in after if j == i and r.ok]
            assert later and victim not in later, (strategy, i, later)
            if strategy == "session":
                assert len(set(later[1:])) <= 1, (strategy, i, later)  # and stay there
            elif strategy == "kvaware" and later[1:]:
                # and stay with the worker that holds their cache, but not always: kv_aware
                # weighs a worker's in-flight prefill against the tokens it has cached
                # (vllm-router 0.1.17, src/policies/kv_aware.rs), so a turn may go elsewhere
                # while that worker prefills another conversation's
                kept = collections.Counter(later[1:]).most_common(1)[0][1]
                assert kept >= KVAWARE_KEPT * len(later[1:]), (strategy, i, later)
        assert all(r.ok and r.worker_id != victim for r in run["final"]), run["final"]
        cut = sum(not r.ok for _, _, _, r in in_flight)
        report_figure(
            f"worker death, {strategy}: attempts on the dead worker stop after "
            f"{run['last_attempt_on_dead']:.2f}s ({run['attempts_on_dead']:.0f} failed attempts,"
            f" {run['retries']:.0f} retries); "
            + f"health check marks it after {run['detected']:.1f}s"
            + f" (window {run['window']}s); in flight at death: {len(in_flight)} "
            f"({cut} failed: {sum(not r.ok for _, _, i, r in in_flight if i % 2 == 0)} of them "
            f"streams); sent after death: {len(after)}, failed {len(failed_after)} "
            f"(allowed {run['allowed_errors']})")
