"""Benchmark any OpenAI-compatible endpoint (the router's) with the scenarios HyperPod users run.

    python -m tools bench --url http://ROUTER:8000 --label prefixaware --out runs/prefixaware \\
        --worker-metrics http://W1:8000/metrics http://W2:8000/metrics --env dev
    python -m tools bench-compare runs/roundrobin/results.json runs/prefixaware/results.json

Scenarios (each a phase, one after the other, so metric deltas belong to one scenario):
- cold / warm: distinct long prompts, each sent once (cold), then all again (warm);
- shared-prefix / distinct-prefix: one long system prompt shared by every request, or one each;
- multi-turn: chat sessions whose history grows turn after turn (X-Session-ID set);
- document-<N>k: long-document Q&A, several questions per document, one document per context
  size (8K and 64K tokens by default; tokens are approximated by common English words).

Without aliasing: the request plan (which prompts, in which order, with which delays) comes from
`--seed` alone, so two strategies measured with the same seed get the same sequence; sessions and
documents are shuffled, every request waits a seeded jitter (closed loop, `--concurrency` clients)
or arrives as a Poisson process (`--request-rate`), session counts default to a number that no
power-of-two worker count divides, and a warm-up of distinct prompts before each repeat is left
out of the figures. `--repeats N` runs the plan N times with fresh prompt salts: every figure is
the median of the repeats, with its min-max beside it.

Streams every response and reports TTFT P50/P90/P95/P99, inter-token latency, output tokens/s,
request throughput, errors, the prefix cache hit rate from the workers' `/metrics`
(`vllm:prefix_cache_hits_total` / `vllm:prefix_cache_queries_total` deltas) where reachable,
and the cost per 1K tokens from the instance price. Every repeat salts its prompts, so one run's
cache never warms the next. Writes results.json, summary.md and PNG plots (`bench_report`).
"""
from __future__ import annotations

import argparse
import http.client
import json
import math
import random
import ssl
import threading
import time
import urllib.parse
import urllib.request
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Sequence

from config.arguments import (
    ToolError, add_command, base_url, check_output_dir, err_console, finite_float, http_url,
    key_from_env, out_console,
)
from bench.loopback import metric_sum, sse_chunks

SCENARIO_GROUPS = ("cold-warm", "prefix", "multi-turn", "document")
PERCENTILES = (50, 90, 95, 99)
HIT_METRICS = ("vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total")
EXTERNAL_HIT_METRICS = ("vllm:external_prefix_cache_hits_total",
                        "vllm:external_prefix_cache_queries_total")

# Common English words: about one token each in Llama/GPT-style vocabularies.
_WORDS = (
    "the of and to in is was for on that with as by at from his her they this have are be "
    "not had but one all were when there can an which their said if do will each about how up "
    "out them then she many some so these would other into has more two like him see time "
    "could no make than first been its who now people my made over did down only way find use "
    "may water long little very after words called just where most know get through back much "
    "before go good new write our used me man too any day same right look think also around "
    "another came come work three word must because does part even place well such here take "
    "why things help put years different away again off went old number great tell men say "
    "small every found still between name should home big give air line set own under read "
    "last never us left end along while might next sound below saw something thought both few "
    "those always looked show large often together asked house world going want school "
    "important until form food keep children feet land side without boy once animals life "
    "enough took sometimes four head above kind began almost live page got earth need far hand "
    "high year mother light parts country father let night following picture being study "
    "second eyes soon times story boys since white days ever paper hard near sentence better "
    "best across during today others however sure means knew try told young miles sun ways "
    "thing whole hear example heard several change answer room sea against top turned learn "
    "point city play toward five using himself usually money seen car morning river table"
).split()


def words(seed: str, n: int) -> str:
    rng = random.Random(seed)
    return " ".join(rng.choice(_WORDS) for _ in range(n))


# --------------------------------------------------------------------------- workload


@dataclass(frozen=True)
class Job:
    """One client's sequence of requests, sent one after the other; before request i it waits
    delays[i] seconds (jitter, think time or, for the first, the arrival offset)."""

    session: str
    system: str | None
    users: tuple[str, ...]
    history: bool = False  # multi-turn: each request carries the previous turns
    delays: tuple[float, ...] = ()
    arrival_s: float | None = None  # open loop: start this long after the phase started


@dataclass(frozen=True)
class Phase:
    scenario: str
    jobs: tuple[Job, ...]
    prompt_words: int  # approximate prompt size of one request (for the report)


@dataclass(frozen=True)
class BenchConfig:
    url: str
    model: str | None = None
    label: str = ""
    scenarios: tuple[str, ...] = SCENARIO_GROUPS
    contexts: tuple[int, ...] = (8192, 65536)
    concurrency: int = 8
    requests: int = 16          # cold-warm and prefix scenarios
    prefix_words: int = 2000    # their prompt size, and the multi-turn system prompt
    sessions: int = 13          # no power-of-two worker count divides it
    turns: int = 5
    user_words: int = 40
    documents: int = 5
    questions: int = 4
    max_tokens: int = 64
    timeout_s: float = 300.0
    time_limit_s: float = 600.0  # per scenario: no new request after it
    worker_metrics: tuple[str, ...] = ()
    direct_url: str | None = None
    overhead_requests: int = 40
    overhead_prompt_words: int = 2000
    hourly_usd: float | None = None
    instances: float = 1.0
    # wall seconds per served second: an emulated fleet (bench/loopback_bench.py) runs at
    # `time_scale`; the cost counts the fleet's hours over the served (modelled) time
    time_scale: float = 1.0
    ignore_eos: bool = True
    api_key: str | None = field(default=None, repr=False)
    ca_file: str | None = None      # the front's own certificate (k8s/certificate.py)
    salt: str = ""
    seed: int = 1                 # the request plan: order, jitter, arrivals
    repeats: int = 3
    request_rate: float | None = None   # requests/s, Poisson; None: closed loop
    scenario_rates: tuple[tuple[str, float], ...] = ()  # per-scenario request_rate
    jitter_s: float = 0.05        # closed loop: uniform 0..jitter before each request
    think_s: float = 0.0          # open loop: mean think time between turns (exponential)
    warmup: int = 8               # requests before each repeat, not in the figures
    session_header: bool = True   # send X-Session-ID (the session strategy's key)


def build_phases(c: BenchConfig, max_model_len: int | None = None) -> tuple[list[Phase],
                                                                           list[str]]:
    """The phases of a run, and notes on scenarios left out (contexts beyond the model).

    The texts come from `c.seed`, each prompt led by `c.salt` (a cache buster that changes no
    length); job order and delays come from `c.seed` and the scenario name only."""
    phases, notes = _phases(replace(c, salt=f"{c.seed}"), max_model_len)
    salted = f"Run {c.salt}. " if c.salt else ""
    return [_shuffled(p, c, salted) for p in phases], notes


def _shuffled(phase: Phase, c: BenchConfig, salted: str) -> Phase:
    """The phase's jobs in a seeded order with seeded delays; document questions become jobs
    of their own (same session id), so one document's questions interleave with the others'."""
    rng = random.Random(f"{c.seed}/{phase.scenario}")
    rate = dict(c.scenario_rates).get(phase.scenario, c.request_rate)
    jobs = list(phase.jobs)
    if phase.scenario.startswith("document"):  # one session per document, as a user's
        jobs = [Job(j.session, j.system, (u,)) for j in jobs for u in j.users]
    rng.shuffle(jobs)
    out, clock = [], 0.0
    per_job = sum(len(j.users) for j in jobs) / max(1, len(jobs))
    for j in jobs:
        arrival = None
        if rate:
            clock += rng.expovariate(rate / per_job)
            arrival = clock
            delays = tuple([0.0] + [rng.expovariate(1 / c.think_s) if c.think_s else 0.0
                                    for _ in j.users[1:]])
        else:
            delays = tuple(rng.uniform(0, c.jitter_s) for _ in j.users)
        system = (salted + j.system) if j.system else None
        users = j.users if system else tuple(salted + u for u in j.users)
        session = f"{c.salt}-{j.session}" if c.salt else j.session
        out.append(replace(j, session=session, system=system, users=users, delays=delays,
                           arrival_s=arrival))
    return replace(phase, jobs=tuple(out))


def _phases(c: BenchConfig, max_model_len: int | None) -> tuple[list[Phase], list[str]]:
    salt = c.salt
    phases: list[Phase] = []
    notes: list[str] = []

    def q(tag: str) -> str:
        return f"Question {tag}: " + words(f"{salt}-q-{tag}", c.user_words)

    if "cold-warm" in c.scenarios:
        jobs = tuple(Job(f"cw{i}", f"Document {salt}-cw-{i}. " + words(f"{salt}-cw-{i}",
                                                                        c.prefix_words),
                         (q(f"cw{i}"),)) for i in range(c.requests))
        phases += [Phase("cold", jobs, c.prefix_words), Phase("warm", jobs, c.prefix_words)]
    if "prefix" in c.scenarios:
        # `concurrency` clients, each asking in turn: after the first wave, a shared prefix
        # can be in cache; distinct ones never are.
        clients = max(1, min(c.concurrency, c.requests))
        ids = [list(range(k, c.requests, clients)) for k in range(clients)]
        shared = f"Instructions {salt}. " + words(f"{salt}-shared", c.prefix_words)
        phases.append(Phase("shared-prefix", tuple(
            Job(f"sp{k}", shared, tuple(q(f"sp{i}") for i in mine))
            for k, mine in enumerate(ids)), c.prefix_words))
        phases.append(Phase("distinct-prefix", tuple(
            Job(f"dp{k}", None, tuple(
                f"Instructions {salt}-{i}. " + words(f"{salt}-dp-{i}", c.prefix_words)
                + "\n\n" + q(f"dp{i}") for i in mine)) for k, mine in enumerate(ids)),
            c.prefix_words))
    if "multi-turn" in c.scenarios:
        phases.append(Phase("multi-turn", tuple(
            Job(f"mt{s}", f"You are assistant {salt}-{s}. " + words(f"{salt}-mt-{s}",
                                                                    c.prefix_words),
                tuple(q(f"mt{s}-{t}") for t in range(c.turns)), history=True)
            for s in range(c.sessions)), c.prefix_words + c.turns * c.user_words))
    if "document" in c.scenarios:
        for ctx in c.contexts:
            name = f"document-{ctx // 1024}k" if ctx % 1024 == 0 else f"document-{ctx}"
            if max_model_len and ctx + c.user_words + c.max_tokens + 64 > max_model_len:
                notes.append(f"{name} left out: {ctx} tokens exceed the model's max_model_len "
                             f"{max_model_len}")
                continue
            phases.append(Phase(name, tuple(
                Job(f"{name}-d{d}", f"Document {salt}-{ctx}-{d}. "
                    + words(f"{salt}-doc-{ctx}-{d}", ctx),
                    tuple(q(f"{ctx}-{d}-{i}") for i in range(c.questions)))
                for d in range(c.documents)), ctx))
    return phases, notes


# --------------------------------------------------------------------------- client


@dataclass
class Sample:
    scenario: str
    session: str
    turn: int
    ok: bool = False
    status: int = 0
    error: str | None = None
    start_s: float = 0.0            # since the phase started
    ttft_s: float | None = None
    e2e_s: float = 0.0
    itl_s: list[float] = field(default_factory=list)
    output_tokens: int = 0
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    worker: str | None = None       # when the server names it (fake workers do)


class Client:
    """Streams chat completions over http.client (http or https), one connection per request."""

    def __init__(self, url: str, model: str | None, *, api_key: str | None = None,
                 timeout_s: float = 300.0, max_tokens: int = 64, ignore_eos: bool = True,
                 ca_file: str | None = None):
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ToolError.bad_input("--url", url, "an http:// or https:// base URL")
        self.parts, self.model, self.timeout_s = parts, model, timeout_s
        self.base = parts.path.rstrip("/")
        if self.base.endswith("/v1/chat/completions"):
            self.base = self.base[: -len("/v1/chat/completions")]
        self.headers = {"Content-Type": "application/json"}
        if api_key:
            self.headers["Authorization"] = f"Bearer {api_key}"
        self.max_tokens, self.ignore_eos = max_tokens, ignore_eos
        # https: the system's CAs, or the endpoint's own certificate (--ca-file)
        self.tls = ssl.create_default_context(cafile=ca_file) \
            if parts.scheme == "https" else None

    def _conn(self) -> http.client.HTTPConnection:
        if self.tls is not None:
            return http.client.HTTPSConnection(self.parts.hostname, self.parts.port,
                                               timeout=self.timeout_s, context=self.tls)
        return http.client.HTTPConnection(self.parts.hostname, self.parts.port,
                                          timeout=self.timeout_s)

    def get_json(self, path: str) -> Any:
        conn = self._conn()
        try:
            conn.request("GET", self.base + path, headers=self.headers)
            resp = conn.getresponse()
            body = resp.read()
            if resp.status != 200:
                raise OSError(f"HTTP {resp.status}")
            return json.loads(body)
        finally:
            conn.close()

    def chat(self, messages: list[dict], sample: Sample, session: str | None = None) -> str:
        """Fills `sample` from one streamed completion; returns the answer text."""
        body = {"model": self.model, "messages": messages, "max_tokens": self.max_tokens,
                "stream": True, "stream_options": {"include_usage": True}, "temperature": 0}
        if self.ignore_eos:
            body["ignore_eos"] = True  # vLLM: always generate max_tokens, comparable runs
        headers = dict(self.headers, Accept="text/event-stream")
        if session:
            headers["X-Session-ID"] = session
        text: list[str] = []
        conn = self._conn()
        t0 = time.perf_counter()
        last = None
        try:
            conn.request("POST", self.base + "/v1/chat/completions",
                         body=json.dumps(body).encode(), headers=headers)
            resp = conn.getresponse()
            sample.status = resp.status
            if resp.status != 200:
                sample.error = f"HTTP {resp.status}: " + resp.read(300).decode(
                    errors="replace").strip()
                return ""
            for chunk in sse_chunks(resp):
                if chunk is None:
                    sample.ok = True
                    break
                sample.worker = sample.worker or chunk.get("worker_id")
                usage = chunk.get("usage")
                if usage:
                    sample.prompt_tokens = usage.get("prompt_tokens")
                    sample.output_tokens = usage.get("completion_tokens") or sample.output_tokens
                    sample.cached_tokens = (usage.get("prompt_tokens_details") or {}).get(
                        "cached_tokens")
                for choice in chunk.get("choices") or []:
                    piece = (choice.get("delta") or {}).get("content")
                    if not piece:
                        continue
                    now = time.perf_counter()
                    if last is None:
                        sample.ttft_s = now - t0
                    else:
                        sample.itl_s.append(now - last)
                    last = now
                    text.append(piece)
            if not sample.ok and sample.error is None:
                sample.error = "stream ended without [DONE]"
        except (OSError, http.client.HTTPException, ValueError) as exc:
            sample.error = f"{type(exc).__name__}: {exc}"
            sample.ok = False
        finally:
            conn.close()
            sample.e2e_s = time.perf_counter() - t0
        if sample.ok and not sample.output_tokens:
            sample.output_tokens = len(sample.itl_s) + (sample.ttft_s is not None)
        return "".join(text)


# --------------------------------------------------------------------------- metrics


def scrape(urls: Sequence[str], timeout: float = 5.0) -> tuple[dict[str, float] | None,
                                                                list[str]]:
    """Sums of the cache counters over every worker; None if any worker did not answer."""
    totals = dict.fromkeys(HIT_METRICS + EXTERNAL_HIT_METRICS, 0.0)
    failed = []
    direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # as the chat client
    for url in urls:
        try:
            with direct.open(url, timeout=timeout) as resp:
                text = resp.read().decode(errors="replace")
        except (OSError, ValueError) as exc:
            failed.append(f"{url}: {exc}")
            continue
        for name in totals:
            totals[name] += metric_sum(text, name)
    return (None if failed or not urls else totals), failed


def hit_rate(before: dict | None, after: dict | None, names: tuple[str, str]) -> float | None:
    if before is None or after is None:
        return None
    queries = after[names[1]] - before[names[1]]
    return None if queries <= 0 else (after[names[0]] - before[names[0]]) / queries


# --------------------------------------------------------------------------- stats


def percentiles(values: Sequence[float], ps: Sequence[int] = PERCENTILES) -> dict[str, float]:
    """Linear-interpolated percentiles (numpy's default), plus mean; {} when empty."""
    xs = sorted(values)
    if not xs:
        return {}
    out = {}
    for p in ps:
        k = (len(xs) - 1) * p / 100
        lo, hi = math.floor(k), math.ceil(k)
        out[f"p{p}"] = xs[lo] + (xs[hi] - xs[lo]) * (k - lo)
    out["mean"] = sum(xs) / len(xs)
    return out


def summarise(phase: Phase, samples: list[Sample], wall_s: float, skipped: int,
              hits: dict[str, float | None], c: BenchConfig) -> dict:
    ok = [s for s in samples if s.ok]
    out_tokens = sum(s.output_tokens for s in ok)
    prompt = [s.prompt_tokens for s in ok if s.prompt_tokens is not None]
    cached = [(s.cached_tokens, s.prompt_tokens) for s in ok
              if s.cached_tokens is not None and s.prompt_tokens]
    total_tokens = out_tokens + sum(prompt)
    tpot = [(s.e2e_s - s.ttft_s) / (s.output_tokens - 1) for s in ok
            if s.ttft_s is not None and s.output_tokens > 1]
    fleet_usd_per_s = (c.hourly_usd * c.instances / 3600) if c.hourly_usd else None

    served_s = wall_s / c.time_scale

    def per_1k(tokens: int) -> float | None:
        return fleet_usd_per_s * served_s / tokens * 1000 if fleet_usd_per_s and tokens else None

    errors: dict[str, int] = {}
    for s in samples:
        if not s.ok:
            errors[s.error or "?"] = errors.get(s.error or "?", 0) + 1
    return {
        "scenario": phase.scenario, "prompt_words": phase.prompt_words,
        "requests": len(samples), "ok": len(ok), "errors": len(samples) - len(ok),
        "skipped_after_time_limit": skipped, "error_kinds": errors,
        "wall_s": wall_s,
        "ttft_s": percentiles([s.ttft_s for s in ok if s.ttft_s is not None]),
        "itl_s": percentiles([x for s in ok for x in s.itl_s]),
        "tpot_s": percentiles(tpot),
        "e2e_s": percentiles([s.e2e_s for s in ok]),
        "output_tokens": out_tokens, "prompt_tokens": sum(prompt) if prompt else None,
        "request_throughput_rps": len(ok) / wall_s if wall_s else 0.0,
        "output_tokens_per_s": out_tokens / wall_s if wall_s else 0.0,
        "total_tokens_per_s": total_tokens / wall_s if wall_s and prompt else None,
        "cache_hit_rate": hits.get("local"),
        "external_cache_hit_rate": hits.get("external"),
        "usage_cached_fraction": (sum(a for a, _ in cached) / sum(b for _, b in cached)
                                  if cached else None),
        "cost_per_1k_output_tokens_usd": per_1k(out_tokens),
        "cost_per_1k_tokens_usd": per_1k(total_tokens) if prompt else None,
        "workers": _spread(ok),
        "ttft_samples_s": [s.ttft_s for s in ok if s.ttft_s is not None],
    }


def _spread(samples: list[Sample]) -> dict[str, int]:
    out: dict[str, int] = {}
    for s in samples:
        if s.worker:
            out[s.worker] = out.get(s.worker, 0) + 1
    return dict(sorted(out.items()))


# --------------------------------------------------------------------------- runner


def run_phase(client: Client, phase: Phase, c: BenchConfig,
              on_request: Callable[[], None] = lambda: None) -> dict:
    before, failed = scrape(c.worker_metrics)
    deadline = time.monotonic() + c.time_limit_s
    t0 = time.perf_counter()
    lock = threading.Lock()
    samples: list[Sample] = []
    skipped = 0
    stop = threading.Event()  # Ctrl-C: every client stops after its current request

    def run_job(job: Job) -> None:
        nonlocal skipped
        history: list[dict] = []
        if job.arrival_s is not None:
            stop.wait(max(0.0, job.arrival_s - (time.perf_counter() - t0)))
        for turn, user in enumerate(job.users):
            if turn < len(job.delays) and job.delays[turn]:
                stop.wait(job.delays[turn])
            if time.monotonic() > deadline or stop.is_set():
                with lock:
                    skipped += len(job.users) - turn
                return
            messages = ([{"role": "system", "content": job.system}] if job.system else [])
            messages += history + [{"role": "user", "content": user}]
            sample = Sample(phase.scenario, job.session, turn,
                            start_s=time.perf_counter() - t0)
            answer = client.chat(messages, sample,
                                 session=job.session if c.session_header else None)
            with lock:
                samples.append(sample)
            on_request()
            if job.history and sample.ok:
                history += [{"role": "user", "content": user},
                            {"role": "assistant", "content": answer}]

    # closed loop: `concurrency` clients take jobs in the plan's order; open loop: every job
    # has its own client, started at its arrival time
    open_loop = any(j.arrival_s is not None for j in phase.jobs)
    clients = len(phase.jobs) if open_loop else min(c.concurrency, len(phase.jobs))
    with ThreadPoolExecutor(max(1, clients)) as pool:
        try:
            list(pool.map(run_job, phase.jobs))
        except KeyboardInterrupt:
            stop.set()
            raise
    wall = time.perf_counter() - t0
    after, failed_after = scrape(c.worker_metrics)
    hits = {"local": hit_rate(before, after, HIT_METRICS),
            "external": hit_rate(before, after, EXTERNAL_HIT_METRICS)}
    summary = summarise(phase, samples, wall, skipped, hits, c)
    summary["metrics_unreachable"] = sorted(set(failed + failed_after))
    summary["samples"] = [_compact(s) for s in samples]
    return summary


def _compact(s: Sample) -> dict:
    d = asdict(s)
    d.pop("itl_s")
    return d


def router_overhead(c: BenchConfig, model: str) -> dict:
    """Median time to first token and end-to-end time of the same warm request, sent in turn
    to the endpoint and straight to one worker (`--direct-url`): the router's added latency."""
    prompt = [{"role": "system", "content": f"Overhead probe {c.salt}. "
               + words(f"{c.salt}-overhead", c.overhead_prompt_words)},
              {"role": "user", "content": "Say something."}]
    routes = {"endpoint": Client(c.url, model, api_key=c.api_key, timeout_s=c.timeout_s,
                                 max_tokens=8, ignore_eos=c.ignore_eos, ca_file=c.ca_file),
              "direct": Client(c.direct_url, model, api_key=c.api_key, timeout_s=c.timeout_s,
                               max_tokens=8, ignore_eos=c.ignore_eos)}
    warmups = 2 * len(c.worker_metrics) or 8  # enough for every worker the endpoint may pick
    for client in routes.values():
        for _ in range(warmups):
            client.chat(prompt, Sample("overhead", "warm", 0))
    got: dict[str, list[Sample]] = {k: [] for k in routes}
    for i in range(c.overhead_requests):
        for name, client in (routes.items() if i % 2 else reversed(routes.items())):
            s = Sample("overhead", name, i)
            client.chat(prompt, s)
            got[name].append(s)
    out: dict[str, Any] = {"prompt_words": c.overhead_prompt_words, "requests_each":
                           c.overhead_requests, "direct_url": c.direct_url}
    for name, samples in got.items():
        ok = [s for s in samples if s.ok and s.ttft_s is not None]
        out[name] = {"ok": len(ok), "ttft_s": percentiles([s.ttft_s for s in ok]),
                     "e2e_s": percentiles([s.e2e_s for s in ok])}
    for metric in ("ttft_s", "e2e_s"):
        a, b = out["endpoint"][metric], out["direct"][metric]
        out[f"added_{metric}_p50"] = a["p50"] - b["p50"] if a and b else None
    return out


def warm_up(client: Client, c: BenchConfig, salt: str) -> None:
    """Requests that are not measured: connections, the router's tables and the workers' first
    steps settle before the figures start (prompts of their own, sharing no prefix)."""
    for i in range(c.warmup):
        client.chat([{"role": "user", "content": f"Warm-up {salt}-{i}. "
                      + words(f"{salt}-warm-{i}", 64)}], Sample("warmup", "warmup", i))


# What sglang-router 0.3.2 lists from GET /v1/models in front of vLLM (docs/serving.md).
UNKNOWN_MODEL = "unknown"


def run_benchmark(c: BenchConfig, *, progress: bool = True,
                  between_repeats: Callable[[int], None] = lambda r: None) -> dict:
    """`c.repeats` runs of the same plan (fresh salts), aggregated: see `aggregate`."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, \
        TimeElapsedColumn

    client = Client(c.url, c.model, api_key=c.api_key, timeout_s=c.timeout_s,
                    max_tokens=c.max_tokens, ignore_eos=c.ignore_eos, ca_file=c.ca_file)
    model, max_len = c.model, None
    try:
        card = (client.get_json("/v1/models").get("data") or [{}])[0]
        model, max_len = model or card.get("id"), card.get("max_model_len")
    except (OSError, http.client.HTTPException, ValueError) as exc:
        if not model and isinstance(exc, ConnectionError):   # no --model would help
            raise ToolError(f"cannot reach {c.url}: {exc.strerror or exc}: check the URL and "
                            "that this machine reaches it (an internal load balancer answers "
                            "only inside its VPC)") from None
        if not model:   # with --model, every request says it in the results
            raise ToolError.bad_input("--model", None, f"a model name (GET {c.url}/v1/models "
                                      f"did not answer: {exc})")
    if model == UNKNOWN_MODEL and not c.model:
        # sglang-router (prefixaware) cannot read vLLM's model name and lists `unknown`,
        # which vLLM refuses: the served name must come from the user
        raise ToolError.bad_input("--model", None, f"the served model name (GET {c.url}/v1/models "
                                  f"lists `{UNKNOWN_MODEL}`: sglang-router does not know it)")
    client.model = model
    base = c.salt or uuid.uuid4().hex[:8]
    salts = [f"{base}r{r}" for r in range(c.repeats)]
    phases, notes = build_phases(replace(c, salt=salts[0]), max_len)
    result: dict[str, Any] = {
        "meta": {"label": c.label, "url": c.url, "model": model, "max_model_len": max_len,
                 "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "salt": base,
                 "seed": c.seed, "repeats": c.repeats,
                 "config": {k: v for k, v in asdict(c).items() if k != "api_key"},
                 "notes": notes},
        "scenarios": {}, "router_overhead": None, "runs": [],
    }
    total = c.repeats * (sum(len(j.users) for p in phases for j in p.jobs) + c.warmup)
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=err_console, disable=not progress) as bar:
        task = bar.add_task("bench", total=total)
        for r, salt in enumerate(salts):
            between_repeats(r)
            bar.update(task, description=f"repeat {r + 1}/{c.repeats}: warm-up")
            warm_up(client, c, salt)
            bar.advance(task, c.warmup)
            run: dict[str, dict] = {}
            for phase in build_phases(replace(c, salt=salt), max_len)[0]:
                bar.update(task, description=f"repeat {r + 1}/{c.repeats}: {phase.scenario}")
                run[phase.scenario] = run_phase(client, phase, c,
                                                on_request=lambda: bar.advance(task))
            result["runs"].append(run)
        if c.direct_url:
            bar.update(task, description="router overhead")
            result["router_overhead"] = router_overhead(replace(c, salt=base), model)
    result["scenarios"] = aggregate(result["runs"])
    return result


# Figures of one repeat that are reported as the median of the repeats, with min-max.
SPREAD_KEYS = ("request_throughput_rps", "output_tokens_per_s", "total_tokens_per_s",
               "cache_hit_rate", "external_cache_hit_rate", "usage_cached_fraction",
               "cost_per_1k_output_tokens_usd", "cost_per_1k_tokens_usd", "wall_s")
SPREAD_STATS = ("ttft_s", "itl_s", "tpot_s", "e2e_s")
SUMMED_KEYS = ("requests", "ok", "errors", "skipped_after_time_limit", "output_tokens",
               "prompt_tokens")


def median(xs: Sequence[float]) -> float:
    ys = sorted(xs)
    n = len(ys)
    return ys[n // 2] if n % 2 else (ys[n // 2 - 1] + ys[n // 2]) / 2


def aggregate(runs: list[dict[str, dict]]) -> dict[str, dict]:
    """Per scenario: every figure of `SPREAD_KEYS`/`SPREAD_STATS` is the median over the
    repeats, and `spread[figure] = [min, max]` (figure "ttft_s.p50" etc.); counts are summed;
    samples and per-worker counts pooled. One repeat: its figures, spread min = max."""
    out: dict[str, dict] = {}
    names = [n for n in runs[0]] if runs else []
    for name in names:
        reps = [run[name] for run in runs if name in run]
        agg = dict(reps[0])
        spread: dict[str, list[float]] = {}

        def fold(key: str, values: list[float | None]) -> float | None:
            got = [v for v in values if v is not None]
            if not got:
                return None
            spread[key] = [min(got), max(got)]
            return median(got)

        for key in SPREAD_KEYS:
            agg[key] = fold(key, [r.get(key) for r in reps])
        for key in SPREAD_STATS:
            agg[key] = {}
            for stat in reps[0].get(key) or {}:
                value = fold(f"{key}.{stat}", [(r.get(key) or {}).get(stat) for r in reps])
                if value is not None:
                    agg[key][stat] = value
        for key in SUMMED_KEYS:
            values = [r.get(key) for r in reps]
            agg[key] = None if any(v is None for v in values) else sum(values)
        workers: dict[str, int] = {}
        kinds: dict[str, int] = {}
        for r in reps:
            for w, n in (r.get("workers") or {}).items():
                workers[w] = workers.get(w, 0) + n
            for k, n in (r.get("error_kinds") or {}).items():
                kinds[k] = kinds.get(k, 0) + n
        agg["workers"], agg["error_kinds"] = dict(sorted(workers.items())), kinds
        agg["ttft_samples_s"] = [x for r in reps for x in r.get("ttft_samples_s", [])]
        agg["samples"] = [dict(s, repeat=i) for i, r in enumerate(reps)
                          for s in r.get("samples", [])]
        agg["metrics_unreachable"] = sorted({u for r in reps
                                             for u in r.get("metrics_unreachable", [])})
        agg["repeats"] = len(reps)
        agg["spread"] = spread
        out[name] = agg
    return out


# --------------------------------------------------------------------------- command


def register(sub: argparse._SubParsersAction) -> None:
    p = add_command(sub, "bench", main, "measure an OpenAI-compatible endpoint", __doc__,
                    formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--url", required=True, type=base_url,
                   help="endpoint base URL (the router's)")
    p.add_argument("--model", help="model name (default: the first of GET /v1/models)")
    p.add_argument("--label", default="", help="name of this run in reports (e.g. the policy)")
    p.add_argument("--out", type=Path, default=Path("bench-results"), help="output directory")
    p.add_argument("--scenarios", nargs="+", default=list(SCENARIO_GROUPS),
                   metavar="GROUP", help=f"of {', '.join(SCENARIO_GROUPS)}")
    p.add_argument("--contexts", nargs="+", type=int, default=[8192, 65536],
                   metavar="TOKENS", help="document sizes (tokens ~ words)")
    d = BenchConfig("")
    for name, help_text in (("concurrency", "requests in flight at most"),
                            ("requests", "requests of the cold/warm and prefix scenarios"),
                            ("prefix-words", "their prompt size; multi-turn system prompt"),
                            ("sessions", "multi-turn sessions"), ("turns", "turns per session"),
                            ("user-words", "words of each question / user turn"),
                            ("documents", "documents per context size"),
                            ("questions", "questions per document"),
                            ("max-tokens", "tokens generated per request"),
                            ("overhead-requests", "requests each way for --direct-url"),
                            ("repeats", "runs of the same plan (fresh salts): median, min-max"),
                            ("seed", "the request plan: texts, order, jitter, arrivals"),
                            ("warmup", "unmeasured requests before each repeat")):
        p.add_argument(f"--{name}", type=int, default=getattr(d, name.replace("-", "_")),
                       help=help_text)
    p.add_argument("--timeout", type=finite_float, default=d.timeout_s,
                   help="per request, seconds")
    p.add_argument("--time-limit", type=finite_float, default=d.time_limit_s,
                   help="per scenario, seconds: no new request after it")
    p.add_argument("--worker-metrics", nargs="+", default=[], metavar="URL", type=http_url,
                   help="every worker's /metrics URL, for cache hit rates")
    p.add_argument("--direct-url", type=base_url,
                   help="one worker's base URL: measure the router's added "
                   "latency against it")
    p.add_argument("--hourly-usd", type=finite_float, help="price of one instance per hour")
    p.add_argument("--instances", type=finite_float, help="instances serving the endpoint")
    p.add_argument("--endpoint", help="with --env: price and instance count from the "
                   "environment (instanceHourlyUsd x replicas)")
    p.add_argument("--api-key-env", metavar="VAR", help="environment variable holding a "
                   "bearer token")
    p.add_argument("--ca-file", metavar="PEM", help="the certificate to trust for https:// "
                   "(the endpoint's own, from its tlsCertificateOutputS3Uri or Secret)")
    p.add_argument("--no-ignore-eos", action="store_true",
                   help="do not send vLLM's ignore_eos (for non-vLLM servers)")
    p.add_argument("--request-rate", type=finite_float,
                   help="open loop: requests per second, Poisson "
                   "arrivals (default: closed loop, --concurrency clients)")
    p.add_argument("--jitter", type=finite_float, default=d.jitter_s,
                   help="closed loop: each request "
                   "waits a seeded uniform 0..JITTER seconds (no lockstep)")
    p.add_argument("--think-time", type=finite_float, default=d.think_s, help="open loop: mean "
                   "seconds between a session's turns (exponential)")
    p.add_argument("--no-session-header", action="store_true",
                   help="do not send X-Session-ID (the session strategy's key)")
    p.add_argument("--in-flight", type=int, metavar="N", help="closed loop that keeps N "
                   "requests in flight (no jitter, no arrival rate)")
    p.add_argument("--peak", action="store_true", help="find the peak throughput: closed "
                   f"loop at {', '.join(map(str, PEAK_WIDTHS))} requests in flight until "
                   "requests/s grow less than 3%%; writes peak.json and peak.md")

    c = add_command(sub, "bench-compare", compare_main, "two bench runs side by side "
                    "(Markdown + PNG)", env=False)
    c.add_argument("baseline", type=Path, help="results.json of run A (e.g. roundrobin)")
    c.add_argument("candidate", type=Path, help="results.json of run B (e.g. prefixaware)")
    c.add_argument("--out", type=Path, help="directory for compare.md and compare.png "
                   "(default: beside B)")


def config_from_args(a: argparse.Namespace) -> BenchConfig:
    for name in ("concurrency", "requests", "prefix_words", "sessions", "turns", "user_words",
                 "documents", "questions", "max_tokens", "overhead_requests", "repeats"):
        value = getattr(a, name)
        if not 1 <= value <= 100_000:
            raise ToolError.bad_input(f"--{name.replace('_', '-')}", value, "1 to 100000")
    if not 0 <= a.warmup <= 100_000:
        raise ToolError.bad_input("--warmup", a.warmup, "0 to 100000")
    if a.request_rate is not None and not 0 < a.request_rate <= 100_000:
        raise ToolError.bad_input("--request-rate", a.request_rate,
                                  "a positive number of requests per second")
    for name in ("jitter", "think_time"):
        if getattr(a, name) < 0:
            raise ToolError.bad_input(f"--{name.replace('_', '-')}", getattr(a, name),
                                      "0 or more seconds")
    for ctx in a.contexts:
        if not 16 <= ctx <= 2_000_000:
            raise ToolError.bad_input("--contexts", ctx, "16 to 2000000 tokens")
    for s in a.scenarios:
        if s not in SCENARIO_GROUPS:
            raise ToolError.bad_input("--scenarios", s, SCENARIO_GROUPS)
    for name in ("timeout", "time_limit"):
        if getattr(a, name) <= 0:
            raise ToolError.bad_input(f"--{name.replace('_', '-')}", getattr(a, name),
                                      "a positive number of seconds")
    hourly, instances = a.hourly_usd, a.instances
    if a.endpoint or a.env:
        hourly, instances = _env_price(a, hourly, instances)
    if hourly is not None and hourly <= 0:
        raise ToolError.bad_input("--hourly-usd", hourly, "a positive price")
    if instances is not None and instances <= 0:
        raise ToolError.bad_input("--instances", instances, "a positive number of instances")
    api_key = key_from_env(a.api_key_env) if a.api_key_env else None
    Client(a.url, None)  # validates the URL
    if a.direct_url:
        Client(a.direct_url, None)
    return BenchConfig(
        url=a.url, model=a.model, label=a.label or urllib.parse.urlsplit(a.url).netloc,
        scenarios=tuple(dict.fromkeys(a.scenarios)), contexts=tuple(a.contexts),
        concurrency=a.concurrency, requests=a.requests, prefix_words=a.prefix_words,
        sessions=a.sessions, turns=a.turns, user_words=a.user_words, documents=a.documents,
        questions=a.questions, max_tokens=a.max_tokens, timeout_s=a.timeout,
        time_limit_s=a.time_limit, worker_metrics=tuple(a.worker_metrics),
        direct_url=a.direct_url, overhead_requests=a.overhead_requests, hourly_usd=hourly,
        instances=instances or 1.0, ignore_eos=not a.no_ignore_eos, api_key=api_key,
        ca_file=a.ca_file,
        seed=a.seed, repeats=a.repeats, request_rate=a.request_rate, jitter_s=a.jitter,
        think_s=a.think_time, warmup=a.warmup, session_header=not a.no_session_header)


def _env_price(a: argparse.Namespace, hourly: float | None,
               instances: float | None) -> tuple[float | None, float | None]:
    """The endpoint's instance type's hourly price as the plan counts it (the region's table
    under the file's instancePrices: EnvironmentConfig.prices), in USD, which the report is
    in; replicas x GPUs / GPUs per node."""
    from config.instances import gpu_shape
    from config.arguments import load_environment, pick_endpoint
    from config.context import ROOT
    from k8s.serving import load_endpoints

    cfg = load_environment(a)
    spec = pick_endpoint(cfg, load_endpoints(cfg, ROOT), a.endpoint)
    if hourly is None:
        prices = cfg.prices()
        hourly = prices.get(spec.instance_type)
        if prices.currency != "USD" or hourly is None:
            raise ToolError.bad_input("--hourly-usd", None, f"a price in USD: environment "
                                      f"'{cfg.name}' prices {spec.instance_type} "
                                      + (f"in {prices.currency}" if hourly is not None
                                         else "nowhere (instancePrices, or `python -m tools "
                                              "prices`)"))
    if instances is None:
        instances = spec.replicas * spec.gpus / gpu_shape(spec.instance_type).gpus
    return hourly, instances


PEAK_WIDTHS = (1, 2, 4, 8, 16, 32, 64, 128)


def in_flight_config(c: BenchConfig, n: int) -> BenchConfig:
    """Closed loop with `n` requests in flight: n clients, no jitter, no arrival rate."""
    return replace(c, concurrency=n, jitter_s=0.0, request_rate=None, scenario_rates=())


def peak_sweep(c: BenchConfig, widths: Sequence[int] = PEAK_WIDTHS,
               run: Callable[[BenchConfig], dict] | None = None) -> dict:
    """Per scenario, throughput at growing in-flight counts, and the peak: the sweep stops
    once no scenario's requests/s grew by 3% or more (saturation)."""
    run = run or (lambda cfg: run_benchmark(cfg, progress=False))
    points: dict[str, list[dict]] = {}
    for n in widths:
        result = run(in_flight_config(c, n))
        grew = False
        for name, s in result["scenarios"].items():
            rps = s.get("request_throughput_rps") or 0.0
            prev = max((p["rps"] for p in points.get(name, [])), default=0.0)
            grew = grew or rps >= 1.03 * prev
            points.setdefault(name, []).append({
                "in_flight": n, "rps": rps, "output_tokens_per_s": s.get("output_tokens_per_s"),
                "ttft_p50_s": (s.get("ttft_s") or {}).get("p50"),
                "ttft_p90_s": (s.get("ttft_s") or {}).get("p90"),
                "cost_per_1k_output_tokens_usd": s.get("cost_per_1k_output_tokens_usd"),
                "errors": s.get("errors")})
        if not grew:
            break
    return {"label": c.label, "url": c.url,
            "scenarios": {name: {"points": pts, "peak": max(pts, key=lambda p: p["rps"])}
                          for name, pts in points.items()}}


def peak_markdown(peak: dict) -> str:
    lines = [f"# Peak throughput: {peak['label']}", "", "| scenario | in flight | req/s | "
             "out tok/s | TTFT P50 ms | P90 ms | $/1K out | errors |", "|---|---|---|---|---|---|---|---|"]
    for name, s in peak["scenarios"].items():
        for p in s["points"]:
            star = " (peak)" if p is s["peak"] or p == s["peak"] else ""
            lines.append(f"| {name} | {p['in_flight']}{star} | {p['rps']:.2f} | "
                         f"{p['output_tokens_per_s'] or 0:.0f} | "
                         f"{(p['ttft_p50_s'] or 0) * 1e3:.0f} | {(p['ttft_p90_s'] or 0) * 1e3:.0f}"
                         f" | {p['cost_per_1k_output_tokens_usd'] or 0:.4f} | {p['errors']} |")
    return "\n".join(lines) + "\n"


def main(args: argparse.Namespace) -> int:
    from bench import report as bench_report
    from bench.checks import failed_run

    c = config_from_args(args)
    check_output_dir("--out", args.out)   # before the run, not after it
    if getattr(args, "in_flight", None) is not None:
        if not 1 <= args.in_flight <= 100_000:
            raise ToolError.bad_input("--in-flight", args.in_flight, "1 to 100000")
        c = in_flight_config(c, args.in_flight)
    if getattr(args, "peak", False):
        peak = peak_sweep(c)
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "peak.json").write_text(json.dumps(peak, indent=1))
        (args.out / "peak.md").write_text(peak_markdown(peak))
        out_console.print(peak_markdown(peak), markup=False)
        err_console.print(f"wrote {args.out / 'peak.json'}, {args.out / 'peak.md'}")
        return 0
    result = run_benchmark(c)
    paths = bench_report.write_run(result, args.out)
    out_console.print(bench_report.summary_markdown(result), markup=False)
    err_console.print("wrote " + ", ".join(str(p) for p in paths))
    failure = failed_run(result)
    if failure:
        raise ToolError(f"{failure}: the errors are in {paths[1]}")
    return 0


def compare_main(args: argparse.Namespace) -> int:
    from bench import report as bench_report
    from bench.checks import load_result

    runs = [load_result(field, path) for field, path in (("baseline", args.baseline),
                                                          ("candidate", args.candidate))]
    out = args.out or args.candidate.parent
    check_output_dir("--out", out)
    md, paths = bench_report.write_compare(runs[0], runs[1], out)
    out_console.print(md, markup=False)
    err_console.print("wrote " + ", ".join(str(p) for p in paths))
    return 0
