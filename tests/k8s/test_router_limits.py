"""The router's bounds are derived, not defaults: the payload limit from the model's context,
the prefix tree from the container's memory and the most workers it can see; and the settings
that keep one client's or one worker's trouble from reaching everyone."""
from __future__ import annotations

import pytest

from k8s.router import (
    BODY_BYTES_PER_TOKEN, BODY_ENVELOPE_BYTES, TREE_BYTES_PER_CHAR, TREE_MEMORY_SHARE,
    RouterProps, context_tokens, memory_bytes, router_args, router_env,
)
from config.endpoint_spec import arg_value


def _props(**kw) -> RouterProps:
    return RouterProps(**{"endpoint": "e", "namespace": "n", "image": "i", "policy": "cache_aware",
                          "worker_selector": {"a": "b"}, **kw})


@pytest.mark.parametrize("args, tokens", [
    (["--max-model-len", "32768"], 32768), (["--max-model-len=4096"], 4096),
    (["--max-model-len", "32k"], 32000), (["--max-model-len", "32K"], 32768),
    (["--max-model-len", "1.5k"], 1500), ([], None), (["--max-model-len", "auto"], None)])
def test_context_comes_from_vllms_max_model_len(args, tokens):
    assert context_tokens(args) == ({"context_tokens": tokens} if tokens else {})


@pytest.mark.parametrize("implementation", ["sglang-router", "vllm-router"])
@pytest.mark.parametrize("context, memory, workers", [(4096, "1Gi", 16), (131072, "2Gi", 2)])
def test_payload_and_tree_follow_the_model_and_the_container(implementation, context, memory,
                                                             workers):
    args = router_args(_props(implementation=implementation, context_tokens=context,
                              memory=memory, max_workers=workers))
    payload = int(arg_value(args, "--max-payload-size"))
    tree = int(arg_value(args, "--max-tree-size"))
    assert payload == context * BODY_BYTES_PER_TOKEN + BODY_ENVELOPE_BYTES
    assert payload < 4 * 2**20            # was 512 MB
    # every worker's tree at its budget, at the worst measured bytes per character, fits the
    # memory share, and the share leaves the rest of the container to the router
    assert tree * workers * TREE_BYTES_PER_CHAR <= memory_bytes(memory) * TREE_MEMORY_SHARE
    assert tree * workers * TREE_BYTES_PER_CHAR > memory_bytes(memory) * TREE_MEMORY_SHARE * 0.99


def test_tree_flags_only_for_cache_aware():
    args = router_args(_props(policy="round_robin"))
    assert "--max-tree-size" not in args and "--max-payload-size" in args


@pytest.mark.parametrize("implementation", ["sglang-router", "vllm-router"])
def test_client_port_health_breaker_retries_and_log_level(implementation):
    args = router_args(_props(implementation=implementation))
    assert (arg_value(args, "--host"), arg_value(args, "--port")) == ("127.0.0.1", "8001")
    assert int(arg_value(args, "--health-check-interval-secs")) <= 1
    # a breaker counts what clients provoke (sglang-router 0.3.2: a client's 4xx; vllm-router
    # 0.1.17: a worker's 500 on a client's input): off in both
    assert "--disable-circuit-breaker" in args
    # a 500 a client provokes costs at most two worker calls, and the second attempt waits
    # until a dead worker is out (every health check failing, each after its timeout)
    assert int(arg_value(args, "--retry-max-retries")) <= 2
    removal_ms = 1000 * (int(arg_value(args, "--health-check-interval-secs"))
                         * int(arg_value(args, "--health-failure-threshold"))
                         + int(arg_value(args, "--health-check-timeout-secs")))
    assert int(arg_value(args, "--retry-initial-backoff-ms")) * (
        1 - float(arg_value(args, "--retry-jitter-factor"))) >= removal_ms * 0.8
    # no line per good request: sglang-router reads its flag; vllm-router 0.1.17's launcher
    # offers only `warning`, which its Rust side parses to INFO, so RUST_LOG decides
    # (k8s.router.router_env) and no flag pretends otherwise
    if implementation == "sglang-router":
        assert arg_value(args, "--log-level") == "warn"
    else:
        assert "--log-level" not in args
        assert router_env(implementation) == {"env": [{"name": "RUST_LOG", "value": "warn"}]}


@pytest.mark.parametrize("bad", ["1G", "512M", "1.5Gi", "Gi", ""])
def test_router_memory_must_be_a_binary_quantity(bad):
    with pytest.raises(ValueError, match="Ki, Mi or Gi"):
        memory_bytes(bad)
