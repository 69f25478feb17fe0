"""Router rollouts and scale-downs behind the NLB end no accepted request (issues 16, 29): the load
balancer controller's pod readiness gate on the serving namespace; on termination the front (the
container behind the Service's port) keeps serving while the NLB deregisters it (about two
minutes, whatever the deregistration delay says), then drains for as long as the longest request
the router lets run; the router waits for the front to be done; the grace period and the NLB's
deregistration delay cover all of it (the drain itself runs on loopback, scaled down:
tests/e2e/test_rollouts.py)."""
from __future__ import annotations

import re

import pytest

from config import resolve_environment
from constructs.cluster_scaling import max_graceful_termination_s
from config import ConfigError
from k8s.gateway import gateway_check
from tests.conftest import DECLARED, ENVIRONMENTS, context_for
from config.contracts import DEREGISTER_S_MAX, DEREGISTER_S_MIN
from k8s.router_front import DRAIN_S
from tests.k8s.test_charts import _env, _spec, render

NLB_DEREGISTRATION_S = 120    # aws-load-balancer-controller #2366, #3270: ~2 min, measured


def _arg(args: list[str], flag: str) -> str:
    return args[args.index(flag) + 1]


@pytest.mark.parametrize("env", ENVIRONMENTS)
@pytest.mark.parametrize("strategy", ["prefixaware", "roundrobin"])
def test_a_terminating_router_pod_finishes_the_longest_request_it_accepted(env, strategy):
    cfg = resolve_environment(context_for(**DECLARED[env]))
    spec = _spec(cfg, strategy)
    try:   # an environment whose endpoints all join its gateway refuses what the EPP lacks
        gateway_check(cfg, spec)
    except ConfigError as refused:
        pytest.skip(f"{env} refuses {strategy}: {refused}")
    docs = render(cfg, spec)
    (ns,) = [d for d in docs if d["kind"] == "Namespace"]
    assert ns["metadata"]["labels"]["elbv2.k8s.aws/pod-readiness-gate-inject"] == "enabled"
    (svc,) = [d for d in docs if d["kind"] == "Service" and d["spec"].get("type") ==
              "LoadBalancer"]
    # the readiness gate applies to IP targets in the namespace the label is on
    annotations = svc["metadata"]["annotations"]
    assert annotations["service.beta.kubernetes.io/aws-load-balancer-nlb-target-type"] == "ip"
    assert svc["metadata"]["namespace"] == ns["metadata"]["name"]
    (router,) = [d for d in docs if d["kind"] == "Deployment"
                 and d["spec"]["selector"]["matchLabels"] == svc["spec"]["selector"]]
    pod = router["spec"]["template"]["spec"]
    by_port = {p["name"]: c for c in pod["containers"] for p in c.get("ports", [])}
    front, router_c = by_port[svc["spec"]["ports"][0]["targetPort"]], by_port["metrics"]
    assert front is not router_c
    (config,) = [d["data"]["haproxy.cfg"] for d in docs if d["kind"] == "ConfigMap"
                 and "haproxy.cfg" in d.get("data", {})]
    longest = int(_arg(router_c["args"], "--request-timeout-secs"))
    drain = int(re.search(r"hard-stop-after (\d+)s", config)[1])
    *_, deregister, front_done = front["lifecycle"]["preStop"]["exec"]["command"]
    *_, router_waits_for, router_at_most = router_c["lifecycle"]["preStop"]["exec"]["command"]
    assert int(deregister) >= NLB_DEREGISTRATION_S      # the NLB stops sending new connections
    assert drain >= longest                             # a request accepted last still ends
    # the router outlives the front's drain: it waits for the file the front's hook leaves
    assert router_waits_for == front_done
    assert int(router_at_most) >= int(deregister) + drain
    mounts = {c["name"]: {m["mountPath"] for m in c["volumeMounts"]} for c in pod["containers"]}
    assert all(front_done.rsplit("/", 1)[0] in m for m in mounts.values()), mounts
    assert pod["terminationGracePeriodSeconds"] > int(router_at_most)
    # a Cluster Autoscaler scale-down evicts with the grace period capped at its own maximum
    assert max_graceful_termination_s(cfg.listener.deregistration_wait_s) >= \
        pod["terminationGracePeriodSeconds"]
    # the NLB keeps the pod's open connections as long as the pod drains
    attributes = dict(kv.split("=", 1) for kv in annotations[
        "service.beta.kubernetes.io/aws-load-balancer-target-group-attributes"].split(","))
    assert int(attributes["deregistration_delay.timeout_seconds"]) >= int(deregister) + drain
    assert router["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0


@pytest.mark.parametrize("wait", [DEREGISTER_S_MIN, 240, DEREGISTER_S_MAX])
def test_the_deregistration_wait_is_the_environments(wait):
    """`listener.deregistrationWaitSeconds`: the front serves that long after its NLB target
    starts deregistering (a balancer that keeps sending past the wait refuses the excess: the
    round-5 drill lost 7 of 323 at 170 s against 150, docs/runbook.md), and everything after
    it follows: the router's wait, the grace period, the NLB's own delay, Cluster
    Autoscaler's cap."""
    cfg = _env("dev", listener={"deregistrationWaitSeconds": wait})
    docs = render(cfg, _spec(cfg, "prefixaware"))
    (router,) = [d for d in docs if d["kind"] == "Deployment"
                 and d["metadata"]["name"].endswith("-router")]
    pod = router["spec"]["template"]["spec"]
    by_name = {c["name"]: c for c in pod["containers"]}
    front_hook = by_name["front"]["lifecycle"]["preStop"]["exec"]["command"]
    router_hook = by_name["router"]["lifecycle"]["preStop"]["exec"]["command"]
    assert int(front_hook[-2]) == wait
    assert int(router_hook[-1]) == wait + DRAIN_S
    assert pod["terminationGracePeriodSeconds"] > wait + DRAIN_S
    (svc,) = [d for d in docs if d["kind"] == "Service" and d["spec"].get("type") ==
              "LoadBalancer"]
    attributes = dict(kv.split("=", 1) for kv in svc["metadata"]["annotations"][
        "service.beta.kubernetes.io/aws-load-balancer-target-group-attributes"].split(","))
    assert int(attributes["deregistration_delay.timeout_seconds"]) >= wait + DRAIN_S
    assert max_graceful_termination_s(wait) >= pod["terminationGracePeriodSeconds"]


@pytest.mark.parametrize("wait", [DEREGISTER_S_MIN - 1, DEREGISTER_S_MAX + 1, "150"])
def test_a_deregistration_wait_out_of_range_is_one_line(wait):
    with pytest.raises(ConfigError) as err:
        _env("dev", listener={"deregistrationWaitSeconds": wait})
    assert err.value.field == "listener.deregistrationWaitSeconds" and "\n" not in str(err.value)
