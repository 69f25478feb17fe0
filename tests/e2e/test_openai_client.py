"""The official OpenAI Python client through the rendered router pod: it lists the served model
and chats with the model it listed, on the default router and on vllm-router.

A client that takes its model from `GET /v1/models` (chat UIs, SDK model discovery) asked
sglang-router 0.3.2 for `unknown`: it registers vLLM workers under that id and lists it
(docs/upstream.md). The fake workers here serve the name the rendered vLLM args give them."""
from __future__ import annotations

import contextlib
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest

from bench.loopback import (
    FakeWorkerPool, FrontProcess, RouterProcess, container_env, localize_for_pool, router_launch,
)
from config.contracts import default_router
from k8s.router_front import FRONT_CONFIG
from tests.e2e.conftest import WORKER_OPTS, _rendered_docs, _rendered_worker_args

pytestmark = pytest.mark.e2e
KEY = "endpoint-key"
STRATEGY = "prefixaware"
ROUTERS = (default_router(STRATEGY), "vllm-router")


def served_names() -> list[str]:
    """`--served-model-name`'s values in the rendered vLLM args (one or more)."""
    args = _rendered_worker_args(STRATEGY)
    i = args.index("--served-model-name")
    names = []
    for tok in args[i + 1:]:
        if tok.startswith("-"):
            break
        names.append(tok)
    return names


def _rendered(router: str) -> tuple[dict, str]:
    """(the router container, the front's config) as rendered for ``router``."""
    docs = _rendered_docs(STRATEGY, None, None if router == default_router(STRATEGY) else router)
    container = next(d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"]
                     .endswith("-router"))["spec"]["template"]["spec"]["containers"][0]
    front = next(d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"]
                 .endswith("-router-front"))["data"][FRONT_CONFIG]
    return container, front


def _start(router: str, model: str) -> tuple[contextlib.ExitStack, FrontProcess]:
    container, front_text = _rendered(router)
    with contextlib.ExitStack() as stack:
        pool = stack.enter_context(FakeWorkerPool(2, model=model, **WORKER_OPTS))
        binary, argv = router_launch(router, localize_for_pool(container["args"], pool))
        process = stack.enter_context(RouterProcess(
            [*argv, "--api-key", KEY], binary=binary, api_key=KEY, env=container_env(container)))
        front = stack.enter_context(FrontProcess(front_text, process.port, api_key=KEY))
        return stack.pop_all(), front


@pytest.fixture(scope="module")
def fronts():
    names = served_names()
    for router in ROUTERS:   # render first: jsii serves one thread at a time
        _rendered(router)
    with contextlib.ExitStack() as stack, ThreadPoolExecutor(len(ROUTERS)) as starting:
        started = list(starting.map(lambda r: _start(r, names[0]), ROUTERS))
        for owned, _ in started:
            stack.push(owned)
        yield {router: front for router, (_, front) in zip(ROUTERS, started)}


@pytest.mark.parametrize("router", ROUTERS)
def test_the_openai_client_lists_the_served_model_and_chats_with_it(fronts, router):
    client = openai.OpenAI(base_url=f"{fronts[router].url}/v1", api_key=KEY, max_retries=0,
                           timeout=30)
    listed = [m.id for m in client.models.list()]
    assert listed == served_names()
    chat = client.chat.completions.create(
        model=listed[0], max_tokens=4, messages=[{"role": "user", "content": "hello"}])
    assert chat.model == listed[0] and chat.choices[0].message.content
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{fronts[router].url}/v1", api_key="wrong",
                      max_retries=0).models.list()
