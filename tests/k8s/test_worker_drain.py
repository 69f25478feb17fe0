"""Worker rollouts and scale-downs end no accepted request (issue 29): a worker whose vLLM takes
`--shutdown-timeout` is told to drain for as long as the router lets a request run, and its
grace period covers the preStop sleep and that drain; an image whose vLLM lacks the flag (or is
unknown) never gets it, since vLLM refuses a flag it does not know. The liveness probe of a
known image checks the engine's progress (a stalled engine answers /health with 200);
tests/e2e/test_rollouts.py runs it against a stalled worker."""
from __future__ import annotations

import copy

import cdk8s
import pytest

from config import resolve_environment
from config.endpoint_spec import arg_value, parse_endpoint
from config.images import image_for, image_family, image_release
from k8s.serving import build_charts
from k8s.workers import SHUTDOWN_TIMEOUT_SINCE, STALL_PROBE
from tests.conftest import DECLARED, ENVIRONMENTS, context_for
from tests.k8s.test_charts import SEED, _facts

IMAGES = ["lmcache/vllm-openai:v0.3.7", "lmcache/vllm-openai:v0.5.4",
          "lmcache/vllm-openai:latest", "vllm/vllm-openai:v0.17.1", "vllm/vllm-openai:v0.19.1",
          "registry.example.com/team/my-inference-image:1.0"]


def _pods(cfg, image: str | None = None, args: list[str] | None = None):
    raw = copy.deepcopy(SEED)
    if image:
        raw["spec"]["worker"]["image"] = image
    if args:
        raw["spec"]["worker"]["args"] = [*raw["spec"]["worker"]["args"], *args]
    spec = parse_endpoint(cfg.name, "endpoints/test.yaml", raw)
    docs = [d for c in build_charts(cdk8s.App(), cfg, (spec,), _facts(cfg, spec))
            for d in c.to_json()]
    router = next(d for d in docs if d["kind"] == "Deployment"
                  and d["metadata"]["name"].endswith("-router"))
    worker = next(d for d in docs if d["kind"] in ("Deployment", "StatefulSet")
                  and d["metadata"]["name"].endswith("-workers"))
    rc = next(c for c in router["spec"]["template"]["spec"]["containers"] if c["name"] == "router")
    return worker["spec"]["template"]["spec"], int(arg_value(rc["args"], "--request-timeout-secs"))


def _drain_and_grace(pod: dict) -> tuple[int | None, int, int]:
    (vllm,) = pod["containers"]
    drain = arg_value(vllm["args"], "--shutdown-timeout")
    sleep = vllm["lifecycle"]["preStop"]["sleep"]["seconds"]
    return (None if drain is None else int(drain)), sleep, pod["terminationGracePeriodSeconds"]


@pytest.mark.parametrize("env", ENVIRONMENTS)
def test_every_environments_workers_drain_the_longest_request(env):
    cfg = resolve_environment(context_for(**DECLARED[env]))
    pod, longest = _pods(cfg)
    drain, sleep, grace = _drain_and_grace(pod)
    assert drain is not None and drain >= longest, (drain, longest)
    assert grace > sleep + drain


@pytest.mark.parametrize("image", IMAGES)
def test_only_a_vllm_that_has_the_flag_gets_it(image):
    cfg = resolve_environment(context_for(env="dev"))
    pod, longest = _pods(cfg, image)
    drain, sleep, grace = _drain_and_grace(pod)
    vllm = image_release(image_for(image)).vllm
    if vllm is not None and vllm >= SHUTDOWN_TIMEOUT_SINCE:
        assert drain is not None and drain >= longest and grace > sleep + drain
    else:
        assert drain is None and grace > sleep, (image, vllm)
    (container,) = pod["containers"]
    probe = container["livenessProbe"]
    family = image_family(image_for(image))
    if family is None:   # no python we know of: the HTTP check alone
        assert "httpGet" in probe
    else:
        assert probe["exec"]["command"][:3] == [family.python, "-c", STALL_PROBE]


def test_a_files_own_shutdown_timeout_is_kept_and_covered():
    cfg = resolve_environment(context_for(env="dev"))
    pod, _ = _pods(cfg, "lmcache/vllm-openai:v0.5.4", ["--shutdown-timeout", "900"])
    (container,) = pod["containers"]
    assert container["args"].count("--shutdown-timeout") == 1
    drain, sleep, grace = _drain_and_grace(pod)
    assert drain == 900 and grace > sleep + 900
