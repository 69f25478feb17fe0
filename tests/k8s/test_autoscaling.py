"""Autoscaling: KEDA ScaledObjects for workers, an HPA for routers, and impossible input."""
from __future__ import annotations

import copy

import pytest
import yaml

from config import ConfigError, resolve_environment
from config.contracts import IN_CLUSTER_PROMETHEUS_URL
from config.endpoint_spec import DEFAULT_WAITING_PER_WORKER, parse_endpoint
from k8s.serving import load_endpoints
from tests.conftest import context_for
from tests.k8s.test_charts import SEED, _env, _spec, render


def _kind(docs, kind):
    return [d for d in docs if d["kind"] == kind]


def _workers(docs, kind):
    """The workers' objects of `kind` (the router has its own ScaledObject)."""
    return [d for d in _kind(docs, kind) if "-router" not in d["metadata"]["name"]]


def _with_scaling(**scaling):
    raw = copy.deepcopy(SEED)
    raw["spec"]["autoScalingSpec"] = scaling
    return raw


@pytest.mark.parametrize("env", ["dev", "china"])
@pytest.mark.parametrize("strategy", ["prefixaware", "kvaware", "session", "roundrobin"])
@pytest.mark.parametrize("replicas", [1, 3])
def test_replicas_without_autoscaling_spec_is_exactly_that_many_workers(env, strategy,
                                                                       replicas):
    """HyperPod's semantics: no autoScalingSpec, no autoscaler; the workers are `replicas`."""
    cfg = _env(env)
    spec = _spec(cfg, strategy, replicas=replicas)
    assert spec.autoscaling is None
    docs = render(cfg, spec)
    assert not _workers(docs, "ScaledObject")
    (workers,) = [d for d in docs if d["kind"] in ("Deployment", "StatefulSet")
                  and "-router" not in d["metadata"]["name"]]
    assert workers["spec"]["replicas"] == replicas


def test_an_autoscaling_spec_without_triggers_scales_on_waiting_requests_per_worker():
    cfg = _env("dev")
    docs = render(cfg, parse_endpoint(cfg.name, "e.yaml", _with_scaling(
        minReplicaCount=2, maxReplicaCount=4)))
    (so,) = _workers(docs, "ScaledObject")
    spec = so["spec"]
    assert spec["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment",
                                      "name": "llama-3-1-8b-instruct-workers"}
    assert (spec["minReplicaCount"], spec["maxReplicaCount"]) == (2, 4)
    (trigger,) = spec["triggers"]
    assert trigger["type"] == "prometheus" and trigger["metricType"] == "AverageValue"
    assert trigger["metadata"]["query"] == (
        'sum(vllm:num_requests_waiting{model_name="Llama-3.1-8B-Instruct"})')
    assert trigger["metadata"]["threshold"] == f"{DEFAULT_WAITING_PER_WORKER:g}"


def test_global_queries_amp_with_sigv4_and_china_the_in_cluster_prometheus():
    dev, china = _env("dev"), _env("china")
    scaled = _with_scaling(minReplicaCount=1, maxReplicaCount=2)
    (so,) = _workers(render(dev, parse_endpoint("dev", "e.yaml", scaled)), "ScaledObject")
    meta = so["spec"]["triggers"][0]["metadata"]
    assert meta["serverAddress"].startswith("https://aps-workspaces.")
    assert meta["awsRegion"] == "us-west-2"
    assert so["spec"]["triggers"][0]["authenticationRef"]["name"]
    (ta,) = _workers(render(dev, parse_endpoint("dev", "e.yaml", scaled)),
                     "TriggerAuthentication")
    assert ta["spec"]["podIdentity"]["provider"] == "aws"
    docs = render(china, parse_endpoint("china", "e.yaml", scaled))
    (so,) = _workers(docs, "ScaledObject")
    meta = so["spec"]["triggers"][0]["metadata"]
    assert meta["serverAddress"] == IN_CLUSTER_PROMETHEUS_URL and "awsRegion" not in meta
    assert not _workers(docs, "TriggerAuthentication")


def test_hyperpod_autoscaling_spec_maps_field_by_field():
    cfg = _env("dev")
    raw = _with_scaling(minReplicaCount=1, maxReplicaCount=3, pollingInterval=15,
                        cooldownPeriod=120, initialCooldownPeriod=600,
                        scaleUpStabilizationTime=30, scaleDownStabilizationTime=900,
                        prometheusTrigger={"query": "sum(rate(vllm:prompt_tokens_total[1m]))",
                                           "targetValue": 5000, "activationTargetValue": 10,
                                           "metricType": "Value", "name": "prompt-rate",
                                           "serverAddress": "http://ignored"})
    spec = parse_endpoint(cfg.name, "e.yaml", raw)
    assert any("serverAddress" in w for w in spec.warnings)
    (so,) = _workers(render(cfg, spec), "ScaledObject")
    s = so["spec"]
    assert (s["minReplicaCount"], s["maxReplicaCount"], s["pollingInterval"],
            s["cooldownPeriod"], s["initialCooldownPeriod"]) == (1, 3, 15, 120, 600)
    behavior = s["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
    assert behavior["scaleUp"]["stabilizationWindowSeconds"] == 30
    assert behavior["scaleDown"]["stabilizationWindowSeconds"] == 900
    (t,) = s["triggers"]
    assert (t["name"], t["metricType"], t["metadata"]["threshold"],
            t["metadata"]["activationThreshold"]) == ("prompt-rate", "Value", "5000", "10")


def test_routing_spec_nested_autoscaling_is_accepted_too():
    raw = copy.deepcopy(SEED)
    raw["spec"]["intelligentRoutingSpec"]["autoScalingSpec"] = {"minReplicaCount": 1,
                                                                "maxReplicaCount": 2}
    spec = parse_endpoint("dev", "e.yaml", raw)
    assert (spec.autoscaling.min_replicas, spec.autoscaling.max_replicas) == (1, 2)


def test_kvaware_keeps_a_fixed_worker_set():
    cfg = _env("dev")
    docs = render(cfg, _spec(cfg, strategy="kvaware"))
    assert not _workers(docs, "ScaledObject")


@pytest.mark.parametrize("env", ["dev", "china"])
def test_router_scales_with_keda_on_its_own_cpu(env):
    """No HorizontalPodAutoscaler on CPU: EKS installs no metrics-server, so it would read
    <unknown>. KEDA reads the router containers' CPU from cAdvisor in Prometheus/AMP."""
    from k8s.router import quantity_cores
    cfg = _env(env)
    docs = render(cfg, _spec(cfg))
    assert not _kind(docs, "HorizontalPodAutoscaler")
    (router,) = [d for d in _kind(docs, "Deployment") if d["metadata"]["name"].endswith("-router")]
    (so,) = [d for d in _kind(docs, "ScaledObject") if d["metadata"]["name"].endswith("-router")]
    spec = so["spec"]
    assert spec["scaleTargetRef"]["name"] == router["metadata"]["name"]
    assert 2 <= spec["minReplicaCount"] < spec["maxReplicaCount"]
    (trigger,) = spec["triggers"]
    meta = trigger["metadata"]
    assert trigger["type"] == "prometheus" and trigger["metricType"] == "AverageValue"
    container = router["spec"]["template"]["spec"]["containers"][0]
    assert f'container="{container["name"]}"' in meta["query"]
    assert f'pod=~"{router["metadata"]["name"]}-' in meta["query"]
    assert "container_cpu_usage_seconds_total" in meta["query"]
    cpu = quantity_cores(container["resources"]["requests"]["cpu"])
    assert float(meta["threshold"]) == pytest.approx(0.7 * cpu)
    if cfg.observability == "managed":
        assert meta["awsRegion"] == cfg.region and trigger["authenticationRef"]["name"] in {
            t["metadata"]["name"] for t in _kind(docs, "TriggerAuthentication")}
    else:
        assert meta["serverAddress"] == IN_CLUSTER_PROMETHEUS_URL


@pytest.mark.parametrize("scaling, field, allowed", [
    ({"minReplicaCount": 3, "maxReplicaCount": 2}, "spec.autoScalingSpec.maxReplicaCount",
     "at least minReplicaCount (3)"),
    ({"minReplicaCount": -1}, "spec.autoScalingSpec.minReplicaCount", "0 or more"),
    ({"prometheusTrigger": {"query": "up"}},
     "spec.autoScalingSpec.prometheusTrigger.targetValue", "required"),
    ({"prometheusTrigger": {"query": "up", "targetValue": 1, "metricType": "Max"}},
     "spec.autoScalingSpec.prometheusTrigger.metricType", "Average"),
    ({"pollingInterval": -5}, "spec.autoScalingSpec.pollingInterval", "seconds"),
])
def test_impossible_scaling_input_in_the_file(scaling, field, allowed):
    with pytest.raises(ConfigError) as info:
        parse_endpoint("dev", "e.yaml", _with_scaling(**scaling))
    assert info.value.field == f"e.yaml: {field}" and allowed in info.value.allowed


def test_cloudwatch_triggers_are_kedas_and_replace_the_default_trigger():
    """cloudWatchTrigger: a KEDA aws-cloudwatch trigger (tests/k8s/test_hyperpod_today.py
    renders it); with it alone, no waiting-requests trigger is added (as on HyperPod)."""
    spec = parse_endpoint("dev", "e.yaml", _with_scaling(
        minReplicaCount=1, maxReplicaCount=3, cloudWatchTrigger={
            "namespace": "AWS/SageMaker", "metricName": "Invocations", "targetValue": 10,
            "dimensions": [{"name": "EndpointName", "value": "e"}]}))
    (cw,) = spec.autoscaling.cloudwatch
    assert (cw.metric_name, cw.target_value, cw.dimensions) == (
        "Invocations", 10.0, (("EndpointName", "e"),))
    assert spec.autoscaling.triggers == () and not any("cloudWatch" in w for w in spec.warnings)
    with pytest.raises(ConfigError) as info:
        parse_endpoint("dev", "e.yaml", _with_scaling(
            minReplicaCount=1, maxReplicaCount=3, cloudWatchTrigger={"metricName": "x"}))
    assert info.value.field == "e.yaml: spec.autoScalingSpec.cloudWatchTrigger.targetValue"


@pytest.mark.parametrize("strategy, scaling, field, allowed", [
    ("prefixaware", {"minReplicaCount": 1, "maxReplicaCount": 9},
     "spec.autoScalingSpec.maxReplicaCount", "at most 4 (node group g5: maxSize 4"),
    ("kvaware", {"minReplicaCount": 1, "maxReplicaCount": 2}, "spec.autoScalingSpec",
     "kvaware's KV event sources are a fixed list"),
])
def test_impossible_scaling_for_the_environment(tmp_path, strategy, scaling, field, allowed):
    raw = _with_scaling(**scaling)
    raw["spec"]["intelligentRoutingSpec"]["routingStrategy"] = strategy
    (tmp_path / "e.yaml").write_text(yaml.safe_dump(raw))
    ctx = context_for(env="dev")
    ctx["environments"]["dev"]["endpoints"] = ["e.yaml"]
    with pytest.raises(ConfigError) as info:
        load_endpoints(resolve_environment(ctx), tmp_path)
    assert info.value.field == f"e.yaml: {field}" and allowed in info.value.allowed


def test_keda_queries_the_prometheus_service_the_monitoring_chart_creates():
    from config.contracts import MONITORING_NAMESPACE, PROMETHEUS_PORT
    from k8s.monitoring import RELEASE
    assert IN_CLUSTER_PROMETHEUS_URL == (
        f"http://{RELEASE}-prometheus.{MONITORING_NAMESPACE}.svc.cluster.local:{PROMETHEUS_PORT}")
