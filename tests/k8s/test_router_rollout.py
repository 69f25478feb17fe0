"""Router rollouts behind the NLB drop nothing (issue 16): the load balancer controller's pod
readiness gate on the serving namespace; on termination the front (the container behind the
Service's port) waits for the NLB, then drains, and the router outlives it (the drain itself
runs on loopback: tests/e2e/test_router_front.py)."""
from __future__ import annotations

import pytest

from k8s.router_front import DRAIN_S
from tests.k8s.test_charts import _env, _spec, render


@pytest.mark.parametrize("env", ["dev", "china"])
def test_router_pods_wait_for_their_nlb_target_and_leave_it_before_stopping(env):
    cfg = _env(env)
    docs = render(cfg, _spec(cfg))
    (ns,) = [d for d in docs if d["kind"] == "Namespace"]
    assert ns["metadata"]["labels"]["elbv2.k8s.aws/pod-readiness-gate-inject"] == "enabled"
    (svc,) = [d for d in docs if d["kind"] == "Service" and d["spec"].get("type") ==
              "LoadBalancer"]
    # the readiness gate applies to IP targets in the namespace the label is on
    assert svc["metadata"]["annotations"][
        "service.beta.kubernetes.io/aws-load-balancer-nlb-target-type"] == "ip"
    assert svc["metadata"]["namespace"] == ns["metadata"]["name"]
    (router,) = [d for d in docs if d["kind"] == "Deployment"
                 and d["spec"]["selector"]["matchLabels"] == svc["spec"]["selector"]]
    pod = router["spec"]["template"]["spec"]
    by_port = {p["name"]: c for c in pod["containers"] for p in c.get("ports", [])}
    front, router_c = by_port[svc["spec"]["ports"][0]["targetPort"]], by_port["metrics"]
    assert front is not router_c
    deregister = int(front["lifecycle"]["preStop"]["exec"]["command"][-1])
    router_stop = router_c["lifecycle"]["preStop"]["sleep"]["seconds"]
    assert deregister >= 15                          # the NLB stops sending new connections
    assert router_stop >= deregister + DRAIN_S       # the router outlives the front's drain
    assert pod["terminationGracePeriodSeconds"] > router_stop
    assert router["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
