"""Virtual-time benchmarks: emulated vLLM workers on a discrete-event clock, routed by the real
router.

Why: sweeps to saturation with 64K prompts take hours of GPU time at life size and are noise on
two shared cores in real time. Here emulated time only advances from event to event, so a run
costs what its events cost, and the figures do not depend on the machine's load.

Routing stays real (`RealRouter`): every request goes through the router binary the chart
deploys, started with the args `k8s/router.py` renders, to fake workers that hold the request
open until it completes in virtual time ("lockstep"). The clock waits at each arrival until the
router has handed the request to a worker, and at each completion until the router has passed
the answer back, so the router sees exactly the requests in flight that it would see live, and
decides on them. Its own hop is added as modelled time (a measured constant, or the render
fan-out's tokenizer cost for vllm-router's cache_aware and kv_aware). `ModelRouter` routes
in-process (round robin, a session hash, and an approximation of cache_aware) for fast tests
only: no figure in docs/benchmarks.md comes from it.

Per worker: `bench.emulator`'s step model (continuous batching, chunked prefill, front end)
and vLLM's scheduler over the GPU's KV blocks (`fake_worker.KvCache`, the profile's KV capacity:
running requests hold their blocks, a shared prefix block once, admission only when a prompt's
blocks are free, preemption when a running request cannot grow) and, when configured, LMCache's
L1/L2 (`bench.tiers`). Engines that share one GPU (the real A/B's two
servers on one H100) share it by processor sharing at a measured efficiency.

The workload is `bench.benchmark`'s own request plan (`build_phases`: same seed, same prompts,
same Poisson arrivals and session order as the real bench), run open loop (arrivals) or closed
loop (N requests in flight).
"""
from __future__ import annotations

import hashlib
import heapq
import json
import random
import threading
import time
import zlib
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Sequence

from bench.benchmark import BenchConfig, Phase, aggregate, build_phases, percentiles, words
from bench.emulator import GpuProfile, Sequence_, apply_step, plan_step
from bench.fake_worker import KvCache, generate_words, render_chat, word_token
from bench.tiers import (
    L2Store, LMCacheWorker, LookupResult, TierConfig, lookup_seconds, pipelined,
)

ROUTER_HOP_S = 0.001   # round_robin / consistent_hash / sglang cache_aware add ~1 ms (docs/benchmarks.md)


class Sim:
    """A discrete-event clock: callbacks at virtual times, in time order (FIFO at ties)."""

    def __init__(self) -> None:
        self.now = 0.0
        self._heap: list[tuple[float, int, Callable[[], None]]] = []
        self._n = 0

    def at(self, t: float, fn: Callable[[], None]) -> None:
        heapq.heappush(self._heap, (max(t, self.now), self._n, fn))
        self._n += 1

    def after(self, dt: float, fn: Callable[[], None]) -> None:
        self.at(self.now + dt, fn)

    def run(self, stop: Callable[[], bool] = lambda: False) -> None:
        while self._heap and not stop():
            t, _, fn = heapq.heappop(self._heap)
            self.now = t
            fn()


class SharedGpu:
    """Weighted processor sharing of one GPU between the engines on it (time-slicing between
    processes): with several engines busy, engine i runs at `efficiency` x w_i / sum(w) of full
    speed, where w is `prefill_weight` for a step with a prefill chunk and 1 for a decode-only
    step (whose process leaves the GPU idle between its short kernels). One busy engine: full
    speed. A GPU per engine: never shared."""

    def __init__(self, sim: Sim, efficiency: float = 1.0, prefill_weight: float = 1.0) -> None:
        self.sim, self.efficiency, self.prefill_weight = sim, efficiency, prefill_weight
        self.active: dict[int, list] = {}     # engine id -> [remaining s, done, weight]
        self._last = 0.0
        self._version = 0

    def _rate(self, weight: float) -> float:
        if len(self.active) <= 1:
            return 1.0
        return self.efficiency * weight / sum(w[2] for w in self.active.values())

    def _advance(self) -> None:
        dt = self.sim.now - self._last
        if dt > 0 and self.active:
            rates = {e: self._rate(w[2]) for e, w in self.active.items()}
            for e, work in self.active.items():
                work[0] = max(0.0, work[0] - dt * rates[e])
        self._last = self.sim.now

    def run(self, engine: int, seconds: float, done: Callable[[], None],
            prefill: bool = False) -> None:
        self._advance()
        self.active[engine] = [seconds, done, self.prefill_weight if prefill else 1.0]
        self._reschedule()

    def _reschedule(self) -> None:
        self._version += 1
        if not self.active:
            return
        version = self._version
        rem = min(w[0] / self._rate(w[2]) for w in self.active.values())
        self.sim.after(rem, lambda: self._complete(version))

    def _complete(self, version: int) -> None:
        if version != self._version:
            return
        self._advance()
        finished = [e for e, w in self.active.items() if w[0] <= 1e-9]
        callbacks = [self.active.pop(e)[1] for e in finished]
        self._reschedule()
        for cb in callbacks:
            cb()


@dataclass
class Req:
    """One request of the plan, and what happened to it."""

    rid: int
    scenario: str
    session: str
    turn: int
    messages: list
    ids: list
    max_tokens: int
    measured: bool = True
    t_send: float = 0.0            # the client sends (virtual)
    t_worker: float = 0.0          # the worker has it (after the router's hop)
    t_first: float | None = None
    t_done: float | None = None
    token_times: list = field(default_factory=list)
    worker: str | None = None
    gpu_hit: int = 0
    l1_tokens: int = 0
    l2_tokens: int = 0
    lookup_timeout: bool = False
    lmcache_hit: int = 0
    error: str | None = None
    on_done: Callable[["Req"], None] | None = None
    # lockstep with the real router
    registered: threading.Event = field(default_factory=threading.Event)
    completed: threading.Event = field(default_factory=threading.Event)
    delivered: threading.Event = field(default_factory=threading.Event)

    @property
    def prompt_tokens(self) -> int:
        return len(self.ids)

    @property
    def cached(self) -> int:
        return self.gpu_hit + self.l1_tokens + self.l2_tokens


def answer_words(ids: Sequence[int], max_tokens: int) -> list[str]:
    return generate_words(ids, max_tokens)


def prompt_key(ids: Sequence[int]) -> str:
    return hashlib.blake2b(repr(tuple(ids)).encode(), digest_size=12).hexdigest()


class VirtualWorker:
    """One emulated vLLM replica on the virtual clock."""

    def __init__(self, sim: Sim, index: int, worker_id: str, gpu: GpuProfile,
                 cache: KvCache, tiers: TierConfig, l2: L2Store | None, shared: SharedGpu,
                 chat_render: bool = True) -> None:
        self.sim, self.index, self.worker_id, self.gpu = sim, index, worker_id, gpu
        self.cache, self.shared, self.chat_render = cache, shared, chat_render
        self.lmc = LMCacheWorker(tiers, gpu, l2) if tiers.enabled else None
        self.queue: list[Sequence_] = []
        self.busy = False
        self._wake_at: float | None = None
        self._stall = 0.0
        self._load = 0.0
        self._copy = 0.0
        self._step_start = 0.0             # the running step's start (async scheduling)
        self.reqs: dict[int, Req] = {}
        self.steps = 0
        self.stall_s = 0.0
        self.preempted = 0
        # (virtual time, waiting, running, KV usage) at every step planned: what vLLM's
        # gauges would show (vllm:num_requests_waiting, _running, kv_cache_usage_perc)
        self.samples: list[tuple[float, int, int, float]] = []

    def counts(self) -> tuple[int, int]:
        """Requests running and waiting in the engine (vLLM's num_requests_running and
        num_requests_waiting: a request still in the front end is in neither)."""
        now = self.sim.now
        running = sum(1 for s in self.queue if s.order is not None)
        waiting = sum(1 for s in self.queue if s.order is None and s.ready_at <= now)
        return running, waiting

    def submit(self, req: Req) -> None:
        now = self.sim.now
        req.t_worker = now
        req.worker = self.worker_id
        wait = self.gpu.frontend_seconds(len(req.ids))
        if self.chat_render:   # the API server tokenizes the chat request (its CPU)
            wait += self.gpu.render_seconds(len(req.ids))
        if self.lmc is not None:   # LMCache's lookup at scheduling (measured, its own code)
            wait += lookup_seconds(len(req.ids))
        seq = Sequence_(len(req.ids), 0, req.max_tokens, ready_at=now + wait)
        seq.lookup = self._lookup_fn(req, seq)
        seq.ids, seq.hashes = req.ids, self.cache.block_hashes(req.ids)
        self.reqs[id(seq)] = req
        self.queue.append(seq)
        self.sim.at(seq.ready_at, self._kick)

    def _lookup_fn(self, req: Req, seq: Sequence_) -> Callable[[], int | None]:
        def lookup() -> int | None:
            gpu_hit = self.cache.lookup(req.ids)
            res = (self.lmc.lookup(req.ids, gpu_hit, self.sim.now) if self.lmc is not None
                   else LookupResult(gpu_hit=gpu_hit))
            req.gpu_hit, req.l1_tokens, req.l2_tokens = res.gpu_hit, res.l1_tokens, res.l2_tokens
            req.lookup_timeout = res.timed_out
            req.lmcache_hit = res.lmcache_hit
            cached = min(res.cached, len(req.ids) - 1)
            if res.wait_s > 0:   # asynchronous lookup: the request waits, the engine goes on
                seq.ready_at = self.sim.now + res.wait_s
                seq.lookup = lambda: self._loaded(res, cached)
                self.sim.at(seq.ready_at, self._kick)
                return None
            return self._loaded(res, cached) + self._stalled(res)
        return lookup

    def _stalled(self, res: LookupResult) -> int:
        self._stall += res.stall_s
        return 0

    def _loaded(self, res: LookupResult, cached: int) -> int:
        self._load += res.load_s
        self._copy += res.copy_s
        return cached

    def _kick(self, planned_at: float | None = None) -> None:
        """Plan and start the next step: at `planned_at` (the step just done started then:
        vLLM planned this one meanwhile), or now when the engine was idle."""
        if self.busy:
            return
        now = self.sim.now
        self._stall = self._load = self._copy = 0.0
        preempted: list = []
        decode, chunks = plan_step(self.queue, self.gpu, now, planned_at, kv=self.cache,
                                   preempted=preempted)
        self.preempted += len(preempted)
        running, waiting = self.counts()
        self.samples.append((now, waiting, running, self.cache.usage()))
        if not decode and not chunks:
            later = [s.ready_at for s in self.queue if s.ready_at > now]
            if later and (self._wake_at is None or self._wake_at <= now
                          or min(later) < self._wake_at):
                self._wake_at = min(later)
                self.sim.at(self._wake_at, self._kick)
            return
        self.busy = True
        self._step_start = now
        # the step's host part (scheduling, sampling, launching attention between graph
        # pieces) does not occupy the GPU: it matters only where engines share one
        cpu = self.gpu.host_seconds(bool(chunks))
        compute = self.gpu.step_seconds([s.context for s in decode],
                                        [(s.done, n) for s, n in chunks]) - cpu
        load = self._load
        if self.lmc is not None and self.lmc.cfg.layerwise:   # the copy beside the layers
            load += pipelined(self._copy, compute, self.gpu.model.layers) - self._copy
        before = self._stall + load + cpu
        self.stall_s += self._stall
        self.sim.after(before, lambda: self.shared.run(
            self.index, compute, lambda: self._computed(decode, chunks, compute),
            prefill=bool(chunks)))

    def _computed(self, decode: list, chunks: list, compute: float) -> None:
        """LMCache's store at the end of the step (wait_for_save): the step waits for the
        GPU->CPU copy, all of it (a synchronous store) or what the layers could not hide."""
        store_s = 0.0
        if self.lmc is not None:
            for s, n in chunks:
                req = self.reqs[id(s)]
                store_s += self.lmc.store(req.rid, req.ids, s.done + n, self.sim.now,
                                          req.lmcache_hit)
            if self.lmc.cfg.layerwise and store_s:
                store_s = pipelined(store_s, compute, self.gpu.model.layers)
        self.sim.after(store_s, lambda: self._step_done(decode, chunks))

    def _step_done(self, decode: list, chunks: list) -> None:
        now = self.sim.now
        self.steps += 1
        apply_step(decode, chunks, now)
        keep = []
        for s in self.queue:
            req = self.reqs[id(s)]
            if s.produced and req.t_first is None:
                req.t_first = s.times[0]
            if s.produced >= s.max_tokens:
                self._finish(s, req)
            else:
                keep.append(s)
        self.queue = keep
        self.busy = False
        self._kick(planned_at=self._step_start)

    def _finish(self, s: Sequence_, req: Req) -> None:
        req.t_done = self.sim.now
        req.token_times = list(s.times)
        full = list(req.ids) + [word_token(w) for w in answer_words(req.ids, req.max_tokens)]
        bs = self.cache.block_size
        self.cache.commit(s.held, self.cache.block_hashes(full), full, len(full) // bs)
        self.cache.release(s.held)
        if self.lmc is not None:
            self.lmc.finish(req.rid)
        del self.reqs[id(s)]
        if req.on_done is not None:
            req.on_done(req)

    def reset(self) -> None:
        self.cache.clear()


# --------------------------------------------------------------------------- routers


class ModelRouter:
    """In-process routing for fast tests: round robin, a session hash, or an approximation of
    sglang-router's cache_aware (longest shared prefix if it covers > half the prompt, else the
    least-loaded worker, ties to the first). Not the real router: no published figure uses it."""

    def __init__(self, policy: str, workers: int) -> None:
        self.policy, self.n = policy, workers
        self.rr = 0
        self.rng = random.Random(f"model-router/{policy}/{workers}")
        self.inflight = [0] * workers
        self.trees: list[dict[int, None]] = [dict() for _ in range(workers)]

    def route(self, req: Req, session_header: bool) -> int:
        if self.policy == "roundrobin":
            i = self.rr % self.n
            self.rr += 1
        elif self.policy == "random":
            i = self.rng.randrange(self.n)
        elif self.policy == "session":
            key = req.session if session_header else ""
            i = zlib.crc32(key.encode()) % self.n
        elif self.policy == "prefixaware":
            blocks = _blocks(req.ids, 16)
            match = []
            for tree in self.trees:
                k = 0
                for b in blocks:
                    if b not in tree:
                        break
                    k += 1
                match.append(k)
            best = max(range(self.n), key=lambda j: (match[j], -j))
            if blocks and match[best] / len(blocks) > 0.5:
                i = best
            else:
                i = min(range(self.n), key=lambda j: (self.inflight[j], j))
            for b in blocks:
                self.trees[i][b] = None
        else:
            raise ValueError(f"ModelRouter has no policy {self.policy!r}")
        self.inflight[i] += 1
        return i

    def done(self, i: int) -> None:
        self.inflight[i] -= 1

    def restart(self) -> None:
        self.rr = 0
        self.inflight = [0] * self.n
        self.trees = [dict() for _ in range(self.n)]


def _blocks(ids: Sequence[int], bs: int) -> list[int]:
    out, parent = [], 0
    for start in range(0, len(ids) - len(ids) % bs, bs):
        parent = hash((parent, tuple(ids[start:start + bs])))
        out.append(parent)
    return out


class _LockstepHook:
    """Installed as `FakeWorker.virtual`: the worker's HTTP handler hands each request to the
    simulation and holds it open until it is done in virtual time."""

    def __init__(self, fleet: "Fleet") -> None:
        self.fleet = fleet

    def serve(self, worker: Any, req_http: Any) -> None:
        ids = req_http.prompts[0]
        key = prompt_key(ids)
        with self.fleet.lock:
            req = self.fleet.pending.pop(key, None)
        if req is None:
            raise RuntimeError(f"worker {worker.worker_id} got a request the plan did not send")
        req.worker = worker.worker_id
        req.registered.set()
        if not req.completed.wait(600):
            raise RuntimeError("virtual completion never came")
        req_http.cached = [req.cached]
        with worker._lock:
            worker._query_tokens += len(ids)
            worker._hit_tokens += req.gpu_hit

    def gauges(self, worker: Any) -> tuple[int, int]:
        """vllm:num_requests_running and _waiting of the emulated engine behind `worker`."""
        return self.fleet.by_id[worker.worker_id].counts()

    def metrics_lines(self, worker: Any, labels: str) -> list[str]:
        vw = self.fleet.by_id[worker.worker_id]
        if vw.lmc is None:
            return []
        c = vw.lmc.counters
        lines = []
        for name, value in (("vllm:external_prefix_cache_queries_total", c.requested_tokens),
                            ("vllm:external_prefix_cache_hits_total", c.hit_tokens)):
            lines += [f"# TYPE {name} counter", f"{name}{{{labels}}} {float(value)!r}"]
        return lines + vw.lmc.metrics_lines(labels)


class RealRouter:
    """The real router for `strategy` in front of in-process fake workers in lockstep mode."""

    def __init__(self, strategy: str, fleet: "Fleet", log_dir: Any = None) -> None:
        self.strategy, self.fleet, self.log_dir = strategy, fleet, log_dir
        self.router = None
        self.repeat = 0

    def __enter__(self) -> "RealRouter":
        from bench.loopback import (
            FakeWorker, RouterProcess, localize_router_args, router_launch,
        )
        from bench.loopback_bench import (
            distinct_ports, implementation, in_cluster_workers, rendered_router_args,
            router_strategy,
        )

        name, self.header = router_strategy(self.strategy)
        kv = name == "kvaware"
        hook = _LockstepHook(self.fleet)
        self.workers = []
        for vw in self.fleet.workers:
            fw = FakeWorker(0, vw.worker_id, model="fake-model", max_model_len=1 << 20,
                            cache_blocks=vw.cache.capacity_blocks,
                            kv_events_port=0 if kv else None, virtual=hook)
            fw.cache = vw.cache       # one GPU cache: the simulation's, seen by both
            fw.start()
            if kv:
                vw.cache.on_events = fw._kv.publish
            self.workers.append(fw)
        urls = [w.url for w in self.workers]
        # `random`: no HyperPod strategy, the cache-blind picker llm-d's published runs used
        # (their random-picker; a Kubernetes Service's kube-proxy also picks at random):
        # vllm-router's random policy with round robin's rendered args otherwise
        pick_random = name == "random"
        rendered = rendered_router_args("roundrobin" if pick_random else self.strategy,
                                        len(urls))
        if pick_random:
            i = rendered.index("--policy")
            rendered = rendered[:i + 1] + ["random"] + rendered[i + 2:]
        kv_map, ep_map = {}, {}
        if kv:
            remote_urls, remote_eps = in_cluster_workers(len(urls))
            kv_map = dict(zip(remote_urls, urls))
            ep_map = dict(zip(remote_eps, [w.kv_events_endpoint for w in self.workers]))
        taken = {w.port for w in self.workers}
        port, prom = distinct_ports(2, taken)
        args = localize_router_args(rendered, urls, port, prom, kv_worker_map=kv_map,
                                    kv_endpoint_map=ep_map)
        self.implementation = implementation("roundrobin" if pick_random else self.strategy)
        binary, args = router_launch(self.implementation, args)
        self.kv = kv
        log = self._log_path()
        self.router = RouterProcess(args, log_path=log, binary=binary).__enter__()
        self._subscribed()
        self.policy_args = args
        return self

    def _log_path(self) -> Any:
        if self.log_dir is None:
            return None
        self.log_dir.mkdir(parents=True, exist_ok=True)
        return self.log_dir / f"router-{self.strategy}-r{self.repeat}.log"

    def _subscribed(self) -> None:
        if self.kv:
            deadline = time.monotonic() + 10
            while any(w.kv_subscribers() < 1 for w in self.workers):
                if time.monotonic() > deadline:
                    raise RuntimeError("the router did not subscribe to KV events")
                time.sleep(0.05)

    def hop_s(self, req: Req) -> float:
        return self.hop_for(req, self.fleet.gpu)

    def hop_for(self, req: Req, gpu: GpuProfile) -> float:
        """The router's own hop, modelled: ~1 ms, plus for vllm-router's cache_aware and
        kv_aware the render/tokenize of the prompt on the workers (in parallel, one's
        cost: the workers are separate machines)."""
        from bench.loopback_bench import implementation

        if implementation(self.strategy) == "vllm-router" and self.strategy.split("@")[0] in (
                "prefixaware", "kvaware"):
            return ROUTER_HOP_S + gpu.render_seconds(len(req.ids))
        return ROUTER_HOP_S

    def restart(self) -> None:
        """A fresh router process (no learned placement), its log kept per repeat."""
        self.repeat += 1
        log = self._log_path()
        if log is not None:
            self.router.log_path = log
        self.router.restart()
        self._subscribed()

    def send(self, req: Req, session_header: bool) -> threading.Thread:
        from bench.loopback import http_json

        body = {"model": "fake-model", "messages": req.messages, "max_tokens": req.max_tokens,
                "stream": False, "temperature": 0}
        headers = {"X-Session-ID": req.session} if session_header and self.header else {}

        def go() -> None:
            try:
                status, resp = http_json("POST", self.router.url + "/v1/chat/completions", body,
                                         headers=headers, timeout=900)
                if status != 200:
                    req.error = f"HTTP {status}: {str(resp)[:200]}"
            except OSError as exc:
                req.error = f"{type(exc).__name__}: {exc}"
            finally:
                req.delivered.set()
                req.registered.set()

        t = threading.Thread(target=go, daemon=True)
        t.start()
        return t

    def __exit__(self, *exc: Any) -> None:
        if self.router is not None:
            self.router.__exit__(*exc)
        for w in self.workers:
            w.stop()


# --------------------------------------------------------------------------- the fleet


@dataclass(frozen=True)
class FleetSpec:
    gpu: GpuProfile
    workers: int
    tiers: TierConfig
    gpus_shared_by: int = 1         # engines per physical GPU (the A/B: 2)
    share_efficiency: float = 1.0   # processor-sharing efficiency when shared
    prefill_weight: float = 1.0     # a prefill step's share against a decode-only step
    chat_render: bool = True
    gpu_blocks: int | None = None   # vLLM's --num-gpu-blocks-override (None: from memory)


class Fleet:
    """The workers of one endpoint, their shared L2, and the router in front."""

    def __init__(self, spec: FleetSpec, sim: Sim, l2: L2Store | None) -> None:
        self.spec, self.sim, self.gpu = spec, sim, spec.gpu
        self.lock = threading.Lock()
        self.pending: dict[str, Req] = {}
        blocks = spec.gpu_blocks or spec.gpu.kv_tokens // 16
        if l2 is not None:     # a new clock: the last fleet's connections are gone
            l2.links.clear()
        gpus = [SharedGpu(sim, spec.share_efficiency, spec.prefill_weight)
                for _ in range(-(-spec.workers // spec.gpus_shared_by))]
        self.workers = [VirtualWorker(sim, i, f"w{i}", spec.gpu, KvCache(16, blocks),
                                      spec.tiers, l2, gpus[i // spec.gpus_shared_by],
                                      spec.chat_render)
                        for i in range(spec.workers)]
        self.by_id = {w.worker_id: w for w in self.workers}


# --------------------------------------------------------------------------- the driver


@dataclass
class RunConfig:
    """How the plan is driven: `BenchConfig`'s plan (scenarios, sizes, seed, rates) and either
    open loop (its rates) or `in_flight` requests kept in flight (closed loop)."""

    bench: BenchConfig
    in_flight: int = 0             # > 0: closed loop at that many requests in flight
    hourly_usd: float = 1.0
    instances: float = 1.0


class Driver:
    """Runs the plan's phases, one after another as the bench does, on the virtual clock."""

    def __init__(self, fleet: Fleet, router: Any, run: RunConfig) -> None:
        self.fleet, self.router, self.run = fleet, router, run
        self.sim = fleet.sim
        self._rid = 0
        self.lockstep = isinstance(router, RealRouter)
        self.threads: list[threading.Thread] = []

    # -- one request

    def _request(self, scenario: str, session: str, turn: int, messages: list,
                 measured: bool, on_done: Callable[[Req], None]) -> None:
        c = self.run.bench
        ids = render_chat(messages)
        self._rid += 1
        req = Req(self._rid, scenario, session, turn, messages, ids, c.max_tokens, measured,
                  t_send=self.sim.now, on_done=None)
        self.requests.append(req)
        header = c.session_header
        if self.lockstep:
            req.on_done = lambda r: self._lockstep_done(r, on_done)
            with self.fleet.lock:
                self.fleet.pending[prompt_key(ids)] = req
            self.threads.append(self.router.send(req, header))
            if not req.registered.wait(120) or req.error:
                req.error = req.error or "the router did not hand the request to a worker"
                with self.fleet.lock:
                    self.fleet.pending.pop(prompt_key(ids), None)
                self.sim.after(0, lambda: on_done(req))
                return
            vw = self.fleet.by_id[req.worker]
            if self.router.kv:   # KV events of the last step reach the router first
                time.sleep(0.003)
            self.sim.after(self.router.hop_s(req), lambda: vw.submit(req))
        else:
            i = self.router.route(req, header)
            vw = self.fleet.workers[i]

            def done(r: Req, i: int = i) -> None:
                self.router.done(i)
                on_done(r)
            req.on_done = done
            self.sim.after(ROUTER_HOP_S, lambda: vw.submit(req))

    def _lockstep_done(self, req: Req, on_done: Callable[[Req], None]) -> None:
        req.completed.set()
        if not req.delivered.wait(120):
            req.error = "the router did not pass the answer back"
        on_done(req)

    # -- a phase

    def run_phase(self, phase: Phase) -> list[Req]:
        c = self.run.bench
        self.requests: list[Req] = []
        start = self.sim.now
        jobs = list(phase.jobs)
        state = {"open": 0, "next": 0}

        def start_job(job: Any) -> None:
            state["open"] += 1
            history: list[dict] = []

            def turn(k: int) -> None:
                messages = ([{"role": "system", "content": job.system}] if job.system else [])
                messages += history + [{"role": "user", "content": job.users[k]}]

                def done(r: Req, k: int = k, messages: list = messages) -> None:
                    if job.history and not r.error:
                        history.extend([{"role": "user", "content": job.users[k]},
                                        {"role": "assistant", "content": " ".join(
                                            answer_words(r.ids, r.max_tokens))}])
                    if k + 1 < len(job.users):
                        delay = job.delays[k + 1] if k + 1 < len(job.delays) else 0.0
                        self.sim.after(delay, lambda: turn(k + 1))
                    else:
                        state["open"] -= 1
                        if closed:
                            take()
                self._request(phase.scenario, job.session, k, messages, True, done)
            first = job.delays[0] if job.delays else 0.0
            self.sim.after(first, lambda: turn(0))

        closed = self.run.in_flight > 0 or not any(j.arrival_s is not None for j in jobs)
        width = self.run.in_flight or c.concurrency

        def take() -> None:
            if state["next"] < len(jobs):
                job = jobs[state["next"]]
                state["next"] += 1
                start_job(job)

        if closed:
            for _ in range(min(width, len(jobs))):
                take()
        else:
            for job in jobs:
                self.sim.at(start + job.arrival_s, lambda job=job: start_job(job))
        self.sim.run(stop=lambda: False)
        for t in self.threads:
            t.join(timeout=30)
        self.threads = []
        return self.requests

    def warm_up(self, salt: str) -> None:
        c = self.run.bench
        self.requests = []
        for i in range(c.warmup):
            box: list[Req] = []
            self._request("warmup", "warmup", i, [{"role": "user", "content": f"Warm-up {salt}-"
                          f"{i}. " + words(f"{salt}-warm-{i}", 64)}], False, box.append)
            self.sim.run(stop=lambda: bool(box))
        self.sim.run()


def summarise(phase: Phase, reqs: list[Req], run: RunConfig) -> dict:
    """A phase's figures in `bench.benchmark.summarise`'s shape (virtual seconds), plus the
    share of prompt tokens each tier served."""
    ok = [r for r in reqs if r.error is None and r.t_done is not None]
    if ok:
        wall = max(r.t_done for r in ok) - min(r.t_send for r in ok)
    else:
        wall = 0.0
    out_tokens = sum(r.max_tokens for r in ok)
    prompt = sum(r.prompt_tokens for r in ok)
    itl = [b - a for r in ok for a, b in zip(r.token_times, r.token_times[1:])]
    usd_per_s = run.hourly_usd * run.instances / 3600

    def per_1k(tokens: int) -> float | None:
        return usd_per_s * wall / tokens * 1000 if tokens and wall else None

    def share(attr: str) -> float | None:
        return sum(getattr(r, attr) for r in ok) / prompt if prompt else None

    workers: dict[str, int] = {}
    for r in ok:
        workers[r.worker] = workers.get(r.worker, 0) + 1
    return {
        "scenario": phase.scenario, "prompt_words": phase.prompt_words,
        "requests": len(reqs), "ok": len(ok), "errors": len(reqs) - len(ok),
        "error_kinds": {e: sum(1 for r in reqs if r.error == e)
                        for e in {r.error for r in reqs if r.error}},
        "wall_s": wall,
        "ttft_s": percentiles([r.t_first - r.t_send for r in ok]),
        "e2e_s": percentiles([r.t_done - r.t_send for r in ok]),
        "itl_s": percentiles(itl),
        "output_tokens": out_tokens, "prompt_tokens": prompt,
        "request_throughput_rps": len(ok) / wall if wall else 0.0,
        "output_tokens_per_s": out_tokens / wall if wall else 0.0,
        "total_tokens_per_s": (out_tokens + prompt) / wall if wall else None,
        "cache_hit_rate": share("cached"),
        "gpu_hit_rate": share("gpu_hit"), "l1_hit_rate": share("l1_tokens"),
        "l2_hit_rate": share("l2_tokens"),
        "usage_cached_fraction": share("cached"),
        "lookup_timeouts": sum(r.lookup_timeout for r in ok),
        "cost_per_1k_output_tokens_usd": per_1k(out_tokens),
        "cost_per_1k_tokens_usd": per_1k(out_tokens + prompt),
        "workers": dict(sorted(workers.items())),
        "ttft_samples_s": [r.t_first - r.t_send for r in ok],
    }


TIER_KEYS = ("gpu_hit_rate", "l1_hit_rate", "l2_hit_rate", "lookup_timeouts")


def run_arm(spec: FleetSpec, strategy: str, run: RunConfig, *, real_router: bool = True,
            l2: L2Store | None = None, log_dir: Any = None,
            events: Sequence[tuple[float, Callable[[float], None]]] = (),
            phases: Callable[[BenchConfig], list[Phase]] | None = None,
            ticker: tuple[float, Callable[[float, Any], None]] | None = None,
            make_router: Callable[["Fleet"], Any] | None = None) -> dict:
    """One arm (a fleet and a routing strategy) over `run.bench.repeats` repeats of the plan:
    fresh salts, GPU caches emptied and the router restarted between repeats (L1 and L2 keep
    what they hold: the salts make it stale). Returns `bench`'s result shape. `phases`: another
    plan than `build_phases`; `events`: (virtual time, callback(now)) to run (a drill), times
    from the first measured phase's start like `ticker`'s:
    (period, callback(now, router)) every period of virtual time while requests run.
    `make_router`: an in-process router built on the fleet (ModelRouter's interface, e.g.
    `bench.epp`'s) in place of the real one."""
    import uuid

    sim = Sim()
    fleet = Fleet(spec, sim, l2)
    base = run.bench.salt or uuid.uuid4().hex[:8]
    salts = [f"{base}r{r}" for r in range(run.bench.repeats)]
    runs: list[dict] = []
    policy = strategy.split("@")[0]
    if make_router is not None:
        real_router = False
    router_cm: Any = (RealRouter(strategy, fleet, log_dir) if real_router
                      else make_router(fleet) if make_router is not None
                      else ModelRouter(policy.replace("-noheader", ""), spec.workers))
    t0 = time.perf_counter()
    started = []

    def start_clock(router: Any) -> None:
        """`events` and `ticker` count from the first measured phase's start."""
        if started:
            return
        started.append(sim.now)
        for t, fn in events:
            sim.at(sim.now + t, lambda fn=fn: fn(sim.now))
        if ticker is not None:
            period, tick = ticker

            def beat() -> None:
                tick(sim.now - started[0], router)
                if any(w.queue for w in fleet.workers) or sim._heap:
                    sim.after(period, beat)
            sim.at(sim.now, beat)

    with (router_cm if real_router else _nullcontext(router_cm)) as router:
        for r, salt in enumerate(salts):
            if r:
                for w in fleet.workers:
                    w.reset()
                router.restart()
            c = replace(run.bench, salt=salt,
                        session_header=run.bench.session_header
                        and not strategy.split("@")[0].endswith("-noheader"))
            driver = Driver(fleet, router, replace(run, bench=c))
            driver.warm_up(salt)
            out = {}
            for phase in (phases(c) if phases else build_phases(c)[0]):
                start_clock(router)
                reqs = driver.run_phase(phase)
                out[phase.scenario] = summarise(phase, reqs, run) | {
                    "samples": [{"scenario": q.scenario, "session": q.session, "turn": q.turn,
                                 "ttft_s": None if q.t_first is None else q.t_first - q.t_send,
                                 "prompt_tokens": q.prompt_tokens, "cached_tokens": q.cached,
                                 "gpu_hit": q.gpu_hit, "l1": q.l1_tokens, "l2": q.l2_tokens,
                                 "worker": q.worker,
                                 "start_s": q.t_send - (started[0] if started else 0.0),
                                 "done_s": None if q.t_done is None else
                                 q.t_done - (started[0] if started else 0.0),
                                 "error": q.error} for q in reqs]}
            runs.append(out)
    scen = aggregate(runs)
    for name, agg in scen.items():   # tier figures: median of the repeats, min-max
        reps = [run_[name] for run_ in runs if name in run_]
        for key in TIER_KEYS:
            got = sorted(v for v in (rep.get(key) for rep in reps) if v is not None)
            if got:
                agg[key] = got[len(got) // 2] if len(got) % 2 else \
                    (got[len(got) // 2 - 1] + got[len(got) // 2]) / 2
                agg["spread"][key] = [got[0], got[-1]]
    tiers = {}
    for w in fleet.workers:
        if w.lmc is not None:
            c = w.lmc.counters
            tiers[w.worker_id] = {k: getattr(c, k) for k in (
                "lookup_timeouts", "stall_s", "l1_alloc_failures", "get_blocking_failed",
                "put_failed", "remote_write_bytes", "remote_read_bytes", "stored_tokens")}
    t_zero = started[0] if started else 0.0
    engine = {w.worker_id: {"preemptions": w.preempted, "steps": w.steps,
                            "per_second": engine_seconds(w.samples, t_zero)}
              for w in fleet.workers}
    return {"meta": {"label": strategy, "strategy": strategy, "seed": run.bench.seed,
                     "repeats": run.bench.repeats, "virtual": True,
                     "router": "real" if real_router else "model",
                     "workers": spec.workers, "profile": spec.gpu.name,
                     "tiers": spec.tiers.label, "in_flight": run.in_flight,
                     "wall_seconds": round(time.perf_counter() - t0, 1),
                     "virtual_seconds": round(sim.now, 1),
                     "l2_oom_kills": l2.oom_kills if l2 is not None else 0},
            "scenarios": scen, "runs": runs, "tiers": tiers, "engine": engine}


def engine_seconds(samples: list[tuple[float, int, int, float]], t_zero: float
                   ) -> dict[int, list[float]]:
    """The engine's gauges per second of virtual time from `t_zero` (what a 1 s scrape of
    vllm:num_requests_waiting, _running and kv_cache_usage_perc sees): second -> [waiting,
    running, KV usage], the mean of the steps planned in it."""
    acc: dict[int, list[float]] = {}
    for t, waiting, running, usage in samples:
        a = acc.setdefault(int(t - t_zero), [0.0, 0.0, 0.0, 0])
        a[0] += waiting
        a[1] += running
        a[2] += usage
        a[3] += 1
    return {k: [round(a[0] / a[3], 2), round(a[1] / a[3], 2), round(a[2] / a[3], 4)]
            for k, a in sorted(acc.items())}


class _nullcontext:
    def __init__(self, value: Any) -> None:
        self.value = value

    def __enter__(self) -> Any:
        return self.value

    def __exit__(self, *exc: Any) -> None:
        return None


def dumps(result: dict) -> str:
    return json.dumps(result, indent=1, default=str)


__all__ = ["Sim", "SharedGpu", "VirtualWorker", "ModelRouter", "RealRouter", "Fleet",
           "FleetSpec", "RunConfig", "Driver", "run_arm", "summarise"]
