"""One-GPU check of P/D as rendered (docs/pd-one-gpu.md): the rendered vllm-router in P/D mode
in front of two real vLLM servers with NixlConnector on one GPU, against one colocated server.

It shows that what we render works (same greedy text as colocated; the prefill sees
max_tokens 1 and hands its KV to the decode server) and how long the handoff takes by prompt
length. It cannot show that P/D pays: on one GPU the two servers share the compute and the
"link" is the GPU's own memory.

    python -m bench.pd_gpu_check --prefill http://127.0.0.1:8100 --decode http://127.0.0.1:8200 \\
        --colocated http://127.0.0.1:8300 --model m --out pd-check.json

Standard library and this repository only; every wait bounded.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import time
from pathlib import Path

from bench.loopback import RouterProcess, free_port, http_json, router_binary
from bench.pd_fake import localize_pd_args
from bench.pd_render import rendered

LENGTHS = (512, 2048, 8192, 16384)
WORDS = ("alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike "
         "november oscar papa quebec romeo sierra tango uniform victor whiskey xray").split()


def prompt(tokens: int, seed: int) -> str:
    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) for _ in range(tokens))   # ~1 token a word


def complete(url: str, model: str, text: str, max_tokens: int = 32) -> tuple[float, str]:
    t0 = time.monotonic()
    status, body = http_json("POST", url + "/v1/completions", {
        "model": model, "prompt": text, "max_tokens": max_tokens, "temperature": 0,
        "seed": 0}, timeout=600)
    if status != 200:
        raise RuntimeError(f"{url}: HTTP {status}: {str(body)[:300]}")
    return time.monotonic() - t0, body["choices"][0]["text"]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--prefill", required=True)
    p.add_argument("--decode", required=True)
    p.add_argument("--colocated", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--repeats", type=int, default=3)
    a = p.parse_args(argv)
    r = rendered("dev", "p5.48xlarge")
    router = r.container(f"{r.spec.name}-router", "router")
    args = localize_pd_args(router["args"], [a.prefill], [a.decode], free_port(), free_port())
    env = {**os.environ, "NO_PROXY": "127.0.0.1,localhost"}
    results = []
    with RouterProcess(args, binary=router_binary(), env=env, expect_workers=2,
                       startup_timeout=60) as rp:
        for n in LENGTHS:
            for i in range(a.repeats):
                text = prompt(n, seed=1000 * n + i)
                pd_s, pd_text = complete(rp.url, a.model, text)
                co_s, co_text = complete(a.colocated, a.model, text)
                results.append({"tokens": n, "repeat": i, "pd_s": pd_s, "colocated_s": co_s,
                                "same_text": pd_text == co_text})
                print(f"{n:>6} tokens: P/D {pd_s * 1e3:8.1f} ms, colocated "
                      f"{co_s * 1e3:8.1f} ms, same text: {pd_text == co_text}")
    metrics = {}
    for name, url in (("prefill", a.prefill), ("decode", a.decode)):
        status, text = http_json("GET", url + "/metrics", raw=True, timeout=10)
        metrics[name] = [line for line in text.splitlines() if "nixl" in line.lower()
                         or "kv_transfer" in line.lower()] if status == 200 else []
    a.out.write_text(json.dumps({"results": results, "metrics": metrics}, indent=1))
    print(f"all greedy texts equal: {all(x['same_text'] for x in results)}; wrote {a.out}")


if __name__ == "__main__":
    main()
