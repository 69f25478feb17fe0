"""Worker rollouts and scale-downs end no accepted request (issue 29): the vLLM container's preStop
hook waits until the worker's requests are done, as long as the router lets a request run, and
the grace period covers it; a worker whose vLLM takes `--shutdown-timeout` is also told to drain
that long; an image whose vLLM lacks the flag (or is unknown) never gets it, since vLLM refuses
a flag it does not know. The liveness probe of a known image checks the engine's progress (a
stalled engine answers /health with 200). tests/e2e/test_rollouts.py runs the hook and the probe
against fake workers."""
from __future__ import annotations

import copy

import cdk8s
import pytest

from config import resolve_environment
from constructs.cluster_scaling import MAX_GRACEFUL_TERMINATION_S
from config.endpoint_spec import arg_value, parse_endpoint
from config.images import KUBERNETES_VERSIONS, image_for, image_family, image_release
from k8s.serving import build_charts
from k8s.workers import DRAIN_HOOK, FIND_PYTHON, SHUTDOWN_TIMEOUT_SINCE, STALL_PROBE
from tests.conftest import DECLARED, ENVIRONMENTS, context_for
from tests.k8s.test_charts import SEED, _facts

# vLLM 0.10.2 and unknown (moving tag) in the LMCache family, both sides of 0.18.0 in vLLM's,
# and an image of no family we know (v0.5.4, vLLM 0.27.1: the last test)
IMAGES = ["lmcache/vllm-openai:v0.3.7", "lmcache/vllm-openai:latest", "vllm/vllm-openai:v0.17.1",
          "vllm/vllm-openai:v0.19.1", "registry.example.com/team/my-inference-image:1.0"]


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


def _drain_and_grace(pod: dict) -> tuple[int | None, int, int, int]:
    """(--shutdown-timeout or None, the preStop hook's least and longest wait, the grace)"""
    (vllm,) = pod["containers"]
    drain = arg_value(vllm["args"], "--shutdown-timeout")
    hook = vllm["lifecycle"]["preStop"]
    if "sleep" in hook:
        least = most = hook["sleep"]["seconds"]
    else:   # PYTHON... -c SCRIPT port least most stall_s state (after the script)
        command = hook["exec"]["command"]
        least, most = command[command.index(DRAIN_HOOK) + 2:][:2]
    return ((None if drain is None else int(drain)), int(least), int(most),
            pod["terminationGracePeriodSeconds"])


@pytest.mark.parametrize("env", ENVIRONMENTS)
def test_every_environments_workers_wait_for_the_longest_request(env):
    """The shipped endpoint files as each environment deploys them."""
    from k8s.serving import load_endpoints
    from tests.conftest import ROOT
    from tests.k8s.test_charts import render

    cfg = resolve_environment(context_for(**DECLARED[env]))
    for spec in load_endpoints(cfg, ROOT):
        docs = render(cfg, spec)
        longest = max(int(arg_value(c["args"], "--request-timeout-secs")) for d in docs
                      if d["kind"] == "Deployment" for c in d["spec"]["template"]["spec"][
                          "containers"] if c["name"] == "router")
        for d in docs:
            if d["kind"] in ("Deployment", "StatefulSet") and d["metadata"]["name"].endswith(
                    "-workers"):
                _, least, most, grace = _drain_and_grace(d["spec"]["template"]["spec"])
                assert most - least >= longest and grace > most, (spec.name, least, most)
                # a Cluster Autoscaler scale-down caps the grace period at its maximum
                assert MAX_GRACEFUL_TERMINATION_S >= grace


@pytest.mark.parametrize("image", IMAGES)
def test_only_a_vllm_that_has_the_flag_gets_it(image):
    cfg = resolve_environment(context_for(env="dev"))
    pod, longest = _pods(cfg, image)
    drain, least, most, grace = _drain_and_grace(pod)
    vllm = image_release(image_for(image)).vllm
    if vllm is not None and vllm >= SHUTDOWN_TIMEOUT_SINCE:
        assert drain is not None and drain >= longest and grace > least + drain
    else:
        assert drain is None, (image, vllm)
    (container,) = pod["containers"]
    probe, hook = container["livenessProbe"], container["lifecycle"]["preStop"]
    family = image_family(image_for(image))
    live, drain_cmd = probe["exec"]["command"], hook["exec"]["command"]
    ready = container["readinessProbe"]["exec"]["command"]
    # the image's python: its family's, else the first one FIND_PYTHON finds in the image
    for command, script in ((live, STALL_PROBE), (ready, STALL_PROBE), (drain_cmd, DRAIN_HOOK)):
        at = command.index(script)
        assert command[at - 1] == "-c"
        assert command[:at - 1] == ([family.python] if family else
                                    ["/bin/sh", "-c", FIND_PYTHON, "find-python",
                                     str(least if script == DRAIN_HOOK else 0)]), image
    live, ready = live[live.index(STALL_PROBE):], ready[ready.index(STALL_PROBE):]
    drain_args = drain_cmd[drain_cmd.index(DRAIN_HOOK):]
    assert most - least >= longest and grace > most
    # readiness reads the same rule from a state file of its own; the drain hook reads the
    # liveness probe's, and gives up after the same stall window
    assert ready[2] == live[2] and ready[3] != live[3]
    assert drain_args[4:] == live[2:4]
    # a stalled engine's clients are told within a minute of the first failed probe, whatever
    # the pod's grace (645 s) or the drain would wait for
    told = (probe["failureThreshold"] - 1) * probe["periodSeconds"] + \
        probe["terminationGracePeriodSeconds"]
    assert told <= 60 and probe["terminationGracePeriodSeconds"] < grace


def test_every_kubernetes_an_environment_may_run_honours_the_probes_grace():
    """The liveness probe's own terminationGracePeriodSeconds (ProbeTerminationGracePeriod) is
    GA from Kubernetes 1.28; an older kubelet would ignore it and wait the pod's 645 s."""
    assert min(tuple(map(int, v.split("."))) for v in KUBERNETES_VERSIONS) >= (1, 28)


def test_a_files_own_shutdown_timeout_is_kept_and_covered():
    cfg = resolve_environment(context_for(env="dev"))
    pod, _ = _pods(cfg, "lmcache/vllm-openai:v0.5.4", ["--shutdown-timeout", "900"])
    (container,) = pod["containers"]
    assert container["args"].count("--shutdown-timeout") == 1
    drain, least, _, grace = _drain_and_grace(pod)
    assert drain == 900 and grace > least + 900


def test_an_image_of_no_family_we_know_runs_the_checks_with_a_python_it_has(tmp_path):
    """FIND_PYTHON as the rendered hook runs it (`sh -c`, the image's PATH): the python beside
    the image's `vllm` first, else a python3 on PATH; the script and its arguments reach it."""
    import subprocess
    import sys

    cfg = resolve_environment(context_for(env="dev"))
    pod, _ = _pods(cfg, IMAGES[-1])
    (container,) = pod["containers"]
    hook = container["lifecycle"]["preStop"]["exec"]["command"]
    prefix = hook[:hook.index(DRAIN_HOOK) - 1]
    show = "import sys; print(sys.executable, *sys.argv[1:])"
    venv, other = tmp_path / "venv" / "bin", tmp_path / "other"
    for d in (venv, other):
        d.mkdir(parents=True)
    (venv / "vllm").write_text("#!/bin/sh\n")
    (venv / "vllm").chmod(0o755)
    (venv / "python3").symlink_to(sys.executable)
    (other / "python3").symlink_to(sys.executable)

    def run(path: str) -> str:
        return subprocess.run([*prefix, "-c", show, "8000", "15"], capture_output=True,
                              text=True, timeout=30, env={"PATH": path}).stdout.strip()
    assert run(f"{other}:{venv}:/bin") == f"{venv}/python3 8000 15"     # vLLM's own first
    assert run(f"{other}:/bin") == f"{other}/python3 8000 15"           # else PATH's
