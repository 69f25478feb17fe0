"""Router rollouts behind the NLB drop nothing (issue 16): the load balancer controller's pod
readiness gate on the serving namespace, and a preStop delay before SIGTERM."""
from __future__ import annotations

import pytest

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
    (container,) = pod["containers"]
    delay = container["lifecycle"]["preStop"]["sleep"]["seconds"]
    assert delay >= 15 and pod["terminationGracePeriodSeconds"] >= delay + 60
    assert router["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
