"""Loopback proof of P/D as rendered (issue 33): the real vllm-router 0.1.17 started with the
rendered command and args of the HyperPod docs' DPD example (p5.48xlarge), its decode-only
router beside it, and the rendered front (real HAProxy) before both, in front of fake prefill
and decode workers that speak NixlConnector's protocol (bench/pd_fake.py). Discovery by role
selectors becomes static --prefill/--decode URLs; everything else runs as rendered."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from bench.loopback import FrontProcess, RouterProcess, container_env, free_port, http_json, \
    localize_router_args, router_binary
from bench.pd_fake import PDWorker, localize_pd_args
from k8s.pd import BODY_BYTES_PER_TOKEN
from k8s.router_front import FRONT_CONFIG
from k8s.secret_fetch import API_KEY_FILE
from bench.pd_render import rendered

pytestmark = pytest.mark.e2e
KEY = "endpoint-key"
AUTH = {"Authorization": f"Bearer {KEY}"}


def _start(container: dict, args: list[str], key_file: Path, workers: int) -> RouterProcess:
    """The rendered container's command (its shell reads the key file we wrote), the
    localized args, the rendered environment."""
    sh, flag, script, name = container["command"]
    script = script.replace(API_KEY_FILE, str(key_file))
    env = container_env(container)
    env["PATH"] = f"{Path(router_binary()).parent}{os.pathsep}{env.get('PATH', '')}"
    return RouterProcess([flag, script, name, *args], binary=sh, env=env,
                         expect_workers=workers).start()


@pytest.fixture(scope="module")
def pd(tmp_path_factory):
    r = rendered("dev", "p5.48xlarge")
    name = f"{r.spec.name}-router"
    router, decode_router = r.container(name, "router"), r.container(name, "router-decode")
    front = next(d for d in r.docs if d["kind"] == "ConfigMap"
                 and d["metadata"]["name"] == f"{name}-front")["data"][FRONT_CONFIG]
    key_file = tmp_path_factory.mktemp("pd") / "api-key"
    key_file.write_text(KEY)
    threshold = r.spec.pd.routing_threshold * BODY_BYTES_PER_TOKEN
    with PDWorker("prefill", "p0") as p, PDWorker("decode", "d0") as d:
        a = _start(router, localize_pd_args(router["args"], [p.url], [d.url], free_port(),
                                            free_port()), key_file, 2)
        b = _start(decode_router, localize_router_args(decode_router["args"], [d.url],
                                                       free_port(), free_port()), key_file, 1)
        try:
            with FrontProcess(front, a.port, api_key=KEY, decode_router_port=b.port) as f:
                yield {"front": f, "prefill": p, "decode": d, "threshold": threshold,
                       "router": router, "routers": (a, b)}
        finally:
            a.stop()
            b.stop()


def _ask(pd, text: str, stream: bool = False, headers=AUTH, timeout: float = 30.0):
    body = {"model": "fake-model", "messages": [{"role": "user", "content": text}],
            "max_tokens": 64, "stream": stream}
    return http_json("POST", pd["front"].url + "/v1/chat/completions", body,
                     headers=headers, timeout=timeout, raw=stream)


def _new(worker: PDWorker, since: int) -> list[dict]:
    return worker.seen[since:]


def test_a_long_prompt_is_prefilled_then_decoded_with_the_prefills_transfer_params(pd):
    p, d = pd["prefill"], pd["decode"]
    n_p, n_d = len(p.seen), len(d.seen)
    status, body = _ask(pd, "word " * (pd["threshold"] // 5 + 100))
    assert status == 200, body
    (pre,), (dec,) = _new(p, n_p), _new(d, n_d)
    assert pre["body"]["max_tokens"] == 1 and pre["body"]["stream"] is False
    assert pre["body"]["kv_transfer_params"]["do_remote_decode"] is True
    sent = dec["body"]["kv_transfer_params"]
    assert sent["do_remote_prefill"] is True and sent["remote_engine_id"] == p.engine_id
    assert dec["body"]["max_tokens"] == 64           # the client's, not the prefill's 1
    assert f'"from": "{p.engine_id}"' in body["choices"][0]["message"]["content"]
    # vLLM checks the endpoint key on both (VLLM_API_KEY): the router sends it
    assert pre["authorization"] == dec["authorization"] == f"Bearer {KEY}"


def test_a_long_streamed_prompt_streams_from_the_decode_worker(pd):
    p, d = pd["prefill"], pd["decode"]
    n_p = len(p.seen)
    status, text = _ask(pd, "word " * (pd["threshold"] // 5 + 100), stream=True)
    assert status == 200 and "data: [DONE]" in text and "decode" in text
    assert _new(p, n_p)[0]["body"]["stream"] is False


def test_a_short_prompt_skips_prefill(pd):
    p, d = pd["prefill"], pd["decode"]
    n_p, n_d = len(p.seen), len(d.seen)
    status, body = _ask(pd, "hi")
    assert status == 200, body
    assert _new(p, n_p) == []
    (dec,) = _new(d, n_d)
    assert "kv_transfer_params" not in dec["body"] and dec["authorization"] == f"Bearer {KEY}"


def test_the_key_and_the_fronts_limits_hold(pd):
    p, d = pd["prefill"], pd["decode"]
    n_p, n_d = len(p.seen), len(d.seen)
    assert _ask(pd, "word " * 5000, headers={})[0] == 401
    assert _ask(pd, "hi", headers={"Authorization": "Bearer wrong"})[0] == 401
    assert _ask(pd, "x" * 400_000)[0] == 413          # over the router's payload limit
    assert http_json("POST", pd["front"].url + "/add_worker?url=http://10.0.0.1:8000",
                     headers=AUTH)[0] == 403
    assert _new(p, n_p) == [] and _new(d, n_d) == []


def test_a_dead_prefill_worker_is_a_clean_error_not_a_hang(pd):
    p = pd["prefill"]
    p.stop()
    status, body = _ask(pd, "word " * (pd["threshold"] // 5 + 100), timeout=60)
    assert status >= 500, body
    assert _ask(pd, "hi")[0] == 200     # the decode-only path still serves short prompts
