"""The serving charts: strict schemas, registries, strategies, L2 backends, bad endpoint files."""
from __future__ import annotations

import copy
import re
import json
from dataclasses import replace

import cdk8s
import kubernetes_validate
import pytest
import yaml

from config import ConfigError, resolve_environment
from config.contracts import GPU_RESOURCE, GPU_TAINT_KEY, SESSION_HEADER
from config.endpoint_spec import parse_endpoint
from config.instances import gpu_shape, pod_share
from k8s.serving import (
    ServingFacts, build_charts, fit_endpoint, load_endpoints, worker_service_account,
)
from k8s.workers import L2Connection, MetricsSource
from config.contracts import IN_CLUSTER_PROMETHEUS_URL
from tests.conftest import ROOT, context_for, normalise
from tests.k8s.crds import is_custom_resource, validate_custom_resources

SEED = yaml.safe_load((ROOT / "tests" / "fixtures" / "endpoint-seed.yaml").read_text())
STRATEGIES = ["prefixaware", "kvaware", "session", "roundrobin"]
BACKENDS = ["redis", "valkey", "lmcache-server", "tieredstorage", None]


def _env(name: str, **over):
    ctx = context_for(env=name)
    ctx["environments"][name].update(over)
    return resolve_environment(ctx)


def on_its_gpus(cfg, raw: dict) -> dict:
    """The seed (g5.24xlarge, TP 4) where the environment runs that type; elsewhere on its
    first GPU group's type, with as many of its GPUs as 4 or fewer and a share of its CPU and
    memory: these tests are about what is rendered, for any environment a team declares."""
    itype = raw["spec"]["instanceType"]
    served = cfg.instance_type_map.get(itype, itype.removeprefix("ml."))
    if cfg.gpu_group_for(served) is not None:
        return raw
    return worker_on(raw, cfg.gpu_node_groups[0].instance_types[0], cpu=16, memory_gib=96)


def worker_on(raw: dict, instance_type: str, *, cpu: int, memory_gib: int) -> dict:
    """`raw` served on `instance_type`: as many of its GPUs as 4 or fewer per worker (TP as
    many), and that worker's share of the node's CPU and memory, at most `cpu` and
    `memory_gib`."""
    shape = gpu_shape(instance_type)
    gpus = max(g for g in (1, 2, 4) if g <= shape.gpus and shape.gpus % g == 0)
    share_cpu, share_gib = pod_share(instance_type, shape.gpus // gpus)
    raw["spec"]["instanceType"] = f"ml.{instance_type}"
    worker = raw["spec"]["worker"]
    worker["args"] = [a for a in worker["args"] if not a.startswith("--tensor-parallel-size")]
    worker["args"].append(f"--tensor-parallel-size={gpus}")
    worker["resources"] = {"limits": {"nvidia.com/gpu": gpus}, "requests": {
        "cpu": str(min(share_cpu, cpu)), "memory": f"{min(share_gib, memory_gib)}Gi",
        "nvidia.com/gpu": gpus}}
    return raw


def _spec(cfg, strategy="prefixaware", backend="redis", image=None, **spec_over):
    raw = on_its_gpus(cfg, copy.deepcopy(SEED))
    raw["spec"]["intelligentRoutingSpec"]["routingStrategy"] = strategy
    if image:
        raw["spec"]["worker"]["image"] = image
    if backend is None:
        raw["spec"]["kvCacheSpec"] = {"enableL1Cache": True, "enableL2Cache": False}
    else:
        raw["spec"]["kvCacheSpec"]["l2CacheSpec"]["l2CacheBackend"] = backend
    raw["spec"].update(spec_over)
    return parse_endpoint(cfg.name, "endpoints/test.yaml", raw)


def render(cfg, spec) -> list[dict]:
    return [doc for chart in build_charts(cdk8s.App(), cfg, (spec,), _facts(cfg, spec))
            for doc in chart.to_json()]


def _facts(cfg, spec) -> ServingFacts:
    return ServingFacts(
        router_image=f"{cfg.account}.{cfg.facts.ecr_host_suffix}/cdk-assets:router",
        model_bucket="models-bucket",
        managed_l2=L2Connection("rediss://l2.example.internal:6379",
                                f"arn:{cfg.facts.partition}:secretsmanager:{cfg.region}:"
                                f"{cfg.account}:secret:l2"),
        service_account={spec.name: worker_service_account(spec.name)},
        metrics=(MetricsSource("https://aps-workspaces.example/workspaces/ws-1", cfg.region)
                 if cfg.observability == "managed" else MetricsSource(IN_CLUSTER_PROMETHEUS_URL)))


def _all(docs, kind):
    return [d for d in docs if d["kind"] == kind]


def _images(docs) -> set[str]:
    out = set()
    for d in docs:
        pod = d.get("spec", {}).get("template", {}).get("spec", {})
        for c in pod.get("containers", []) + pod.get("initContainers", []):
            out.add(c["image"])
    return out


CASES = [(env, strat, "redis") for env in ("dev", "china") for strat in STRATEGIES] + [
    (env, "prefixaware", b) for env in ("dev", "china") for b in BACKENDS if b != "redis"]


@pytest.fixture(scope="module")
def rendered():
    envs = {"dev": _env("dev"), "china": _env("china")}
    return {(e, s, b): (envs[e], render(envs[e], _spec(envs[e], s, b))) for e, s, b in CASES}


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)))
def test_every_manifest_passes_strict_schema_at_the_cluster_version(rendered, case):
    cfg, docs = rendered[case]
    for doc in docs:
        if not is_custom_resource(doc):
            kubernetes_validate.validate(doc, cfg.kubernetes_version + ".0", strict=True)


def test_keda_objects_pass_the_keda_crd_schemas(rendered):
    docs = [d for _, ds in rendered.values() for d in ds if is_custom_resource(d)]
    assert {d["kind"] for d in docs} == {"ScaledObject", "TriggerAuthentication"}
    validate_custom_resources(docs)


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)))
def test_manifest_snapshot(rendered, case, snapshot):
    _, docs = rendered[case]
    assert normalise(yaml.safe_dump_all(docs, sort_keys=True)) == snapshot


@pytest.mark.parametrize("case", [c for c in CASES if c[0] == "china"],
                         ids=lambda c: "-".join(map(str, c)))
def test_china_manifests_pull_only_from_the_china_ecr(rendered, case):
    cfg, docs = rendered[case]
    registry = f"{cfg.account}.dkr.ecr.cn-northwest-1.amazonaws.com.cn/"
    images = _images(docs)
    assert images and all(i.startswith(registry) for i in images), images
    assert all("@sha256:" in i or i.endswith(":router") or ":v0.5.4" in i for i in images)


def test_no_pod_asks_the_vpc_cni_for_other_network_cards(rendered):
    """config/bandwidth.py gives a pod network card 0's bandwidth: the VPC CNI (v1.20.0+)
    attaches a pod to the others only when annotated so."""
    docs = [d for _, ds in rendered.values() for d in ds]
    assert any(d["kind"] == "Deployment" for d in docs)
    assert all("k8s.amazonaws.com/nicConfig" not in json.dumps(d) for d in docs)


def test_seed_renders_the_hyperpod_shape():
    cfg = _env("dev")
    spec = _spec(cfg)
    assert (spec.instance_type, spec.gpus, spec.router_policy, spec.l2_backend) == (
        "g5.24xlarge", 4, "cache_aware", "redis")
    docs = render(cfg, spec)
    (worker,) = _all(docs, "Deployment")[:1]
    pod = worker["spec"]["template"]["spec"]
    vllm = pod["containers"][0]
    assert vllm["resources"]["limits"][GPU_RESOURCE] == "4"
    assert {"key": GPU_TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    assert pod["nodeSelector"]["kvcache.io/node-group"] == "g5"
    env = {e["name"]: e["value"] for e in vllm["env"]}
    assert env["HF_HUB_OFFLINE"] == "1" and env["PYTHONHASHSEED"] == "123"
    assert "LMCacheConnectorV1" in " ".join(vllm["args"])
    # No model in the file's args: the image's own vllm serve (lmcache/vllm-openai v0.5.4 keeps
    # it in /opt/venv) gets the mount path as its positional model, after the start-up shell.
    assert vllm["command"][:2] == ["/bin/sh", "-c"]
    assert vllm["command"][3:] == ["vllm", "/opt/venv/bin/vllm", "serve"]
    assert vllm["args"][0] == "/opt/ml/model"
    assert [c["name"] for c in pod["initContainers"]] == ["stage-model", "fetch-l2-secret"]
    assert "s3://models-bucket/models/Llama-3.1-8B-Instruct/" in pod["initContainers"][0]["command"]
    text = json.dumps(docs)
    assert "rediss://l2.example.internal:6379" in text and "password" not in text.lower()


def test_shipped_sample_is_the_published_file_and_keeps_its_shape():
    published = (ROOT / "tests/fixtures/hyperpod/hpcli-sample-llama31-8b-intelligent-routing.yaml")
    body = b"".join(line for line in published.read_bytes().splitlines(keepends=True)
                    if not line.startswith((b"# Source:", b"# Published as:", b"# Shape:")))
    shipped = (ROOT / "endpoints/llama-8b-intel-routing.yaml").read_bytes()
    assert shipped == body.rstrip(b"\n")       # published without a final newline
    cfg = _env("dev")
    (spec,) = load_endpoints(cfg, ROOT)
    assert (spec.instance_type, spec.gpus, spec.router_policy, spec.l2_enabled) == (
        "g5.24xlarge", 1, "cache_aware", False)          # ml.g5.8xlarge via instanceTypeMap
    assert any("ml.g5.8xlarge is served on g5.24xlarge" in w for w in spec.warnings)
    docs = render(cfg, spec)
    worker = next(d for d in _all(docs, "Deployment") if d["metadata"]["name"].endswith("-workers"))
    pod = worker["spec"]["template"]["spec"]
    vllm = pod["containers"][0]
    # The file names its model positionally: kept as written, no second positional added.
    # v0.3.7 keeps vLLM in /opt/venv, off PATH: its own binary, by absolute path.
    assert vllm["command"][4:] == ["/opt/venv/bin/vllm", "serve"]
    assert vllm["args"][:3] == ["/opt/ml/model", "--max-model-len", "4096"]
    assert sum(1 for a in vllm["args"] if not a.startswith("-") and a.startswith("/")) == 1
    assert vllm["image"] == "lmcache/vllm-openai:v0.3.7"
    assert vllm["resources"]["requests"] == {"cpu": "6", "memory": "30Gi", GPU_RESOURCE: "1"}
    mounts = {m["mountPath"]: m for m in vllm["volumeMounts"]}
    assert mounts["/opt/ml/model"]["readOnly"] is True
    assert [c["name"] for c in pod["initContainers"]] == ["stage-model"]
    assert "s3://models-bucket/llama31_8b/" in pod["initContainers"][0]["command"]


def test_router_deployment_is_hardened_and_discovers_its_workers():
    cfg = _env("dev")
    docs = render(cfg, _spec(cfg))
    router = next(d for d in _all(docs, "Deployment") if "router" in d["metadata"]["name"])
    spec = router["spec"]
    assert spec["replicas"] >= 2
    c = spec["template"]["spec"]["containers"][0]
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert c["securityContext"]["runAsNonRoot"] is True
    assert {"readinessProbe", "livenessProbe", "resources"} <= set(c)
    args = c["args"]
    assert args[args.index("--policy") + 1] == "cache_aware"
    assert "--service-discovery" in args
    worker = next(d for d in docs if d["kind"] == "Deployment" and d is not router)
    labels = worker["spec"]["template"]["metadata"]["labels"]
    sel = args[args.index("--selector") + 1: args.index("--service-discovery-namespace")]
    assert all(labels[k] == v for k, v in (s.split("=", 1) for s in sel))
    # (the other Role is the certificate Job's: tests/k8s/test_front_tls.py)
    (role,) = [r for r in _all(docs, "Role") if r["metadata"]["name"] == router["metadata"]["name"]]
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"],
                              "verbs": ["get", "list", "watch"]}]
    assert len(_all(docs, "PodDisruptionBudget")) == 2
    svc = next(d for d in _all(docs, "Service") if d["spec"].get("type") == "LoadBalancer")
    assert svc["metadata"]["annotations"][
        "service.beta.kubernetes.io/aws-load-balancer-scheme"] == "internal"


CN_CERT = "arn:aws-cn:acm:cn-northwest-1:222222222222:certificate/" + "0" * 8 + "-0000-4000-8000-" + "0" * 12


def test_public_listener_only_when_the_environment_opts_in():
    cfg = _env("china", publicListener=True, listener={
        "certificateArn": CN_CERT, "sourceRanges": ["198.51.100.0/24"]})
    docs = render(cfg, _spec(cfg))
    svc = next(d for d in _all(docs, "Service") if d["spec"].get("type") == "LoadBalancer")
    notes = svc["metadata"]["annotations"]
    lb = "service.beta.kubernetes.io/aws-load-balancer-"
    assert notes[lb + "scheme"] == "internet-facing"
    # TLS on the NLB listener with the environment's ACM certificate, TLS 1.2+ only
    assert notes[lb + "ssl-cert"] == CN_CERT and notes[lb + "ssl-ports"] == "8000"
    assert notes[lb + "ssl-negotiation-policy"].startswith("ELBSecurityPolicy-TLS13")
    assert svc["spec"]["loadBalancerSourceRanges"] == ["198.51.100.0/24"]


def test_api_key_from_secrets_manager_at_pod_start_never_in_a_manifest():
    cfg = _env("dev")
    spec = _spec(cfg)
    arn = f"arn:aws:secretsmanager:{cfg.region}:{cfg.account}:secret:api-key"
    facts = replace(_facts(cfg, spec), api_key_secret_arn=arn)
    docs = [d for c in build_charts(cdk8s.App(), cfg, (spec,), facts) for d in c.to_json()]
    for doc in docs:
        kubernetes_validate.validate(doc, cfg.kubernetes_version + ".0", strict=True) \
            if not is_custom_resource(doc) else None
    pods = {d["metadata"]["name"]: d["spec"]["template"]["spec"] for d in docs
            if d["kind"] in ("Deployment", "StatefulSet")}
    for name, pod in pods.items():
        init = {c["name"]: c for c in pod["initContainers"]}["fetch-api-key"]
        assert {"name": "SECRET_ARN", "value": arn} in init["env"]
        main = pod["containers"][0]
        assert main["command"][:2] == ["/bin/sh", "-c"]
        assert any(m["name"] == "api-key" and m["readOnly"] for m in main["volumeMounts"])
        vol = next(v for v in pod["volumes"] if v["name"] == "api-key")
        assert vol["emptyDir"]["medium"] == "Memory"
    router = pods[f"{spec.name}-router"]["containers"][0]
    assert "--api-key" not in router["args"] and "--api-key" in router["command"][2]
    worker = pods[f"{spec.name}-workers"]["containers"][0]
    assert "VLLM_API_KEY" in worker["command"][2] and "--api-key" not in worker["args"]


@pytest.mark.parametrize("strategy, policy", [("prefixaware", "cache_aware"),
                                              ("roundrobin", "round_robin"),
                                              ("session", "consistent_hash"),
                                              ("kvaware", "kv_aware")])
def test_strategy_maps_to_router_policy(rendered, strategy, policy):
    _, docs = rendered[("dev", strategy, "redis")]
    router = next(d for d in docs if d["kind"] == "Deployment" and "router" in d["metadata"]["name"])
    args = router["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--policy") + 1] == policy


@pytest.mark.parametrize("env", ["dev", "china"])
@pytest.mark.parametrize("strategy, binary", [("prefixaware", "sglang-router"),
                                              ("roundrobin", "vllm-router"),
                                              ("session", "vllm-router"),
                                              ("kvaware", "vllm-router")])
def test_each_strategy_runs_its_measured_router(rendered, env, strategy, binary):
    """The one router image carries both binaries; the command picks one, the args are that
    binary's (sglang-router's start with its `launch` subcommand)."""
    _, docs = rendered[(env, strategy, "redis")]
    router = next(d for d in _all(docs, "Deployment") if "router" in d["metadata"]["name"])
    container = router["spec"]["template"]["spec"]["containers"][0]
    assert container["command"] == [binary]
    assert (container["args"][0] == "launch") is (binary == "sglang-router")


def test_an_environment_can_bring_vllm_routers_cache_aware_back():
    cfg = replace(_env("dev"), router_implementations={"prefixaware": "vllm-router"})
    docs = render(cfg, _spec(cfg, "prefixaware"))
    container = next(d for d in _all(docs, "Deployment") if "router" in d["metadata"]["name"])[
        "spec"]["template"]["spec"]["containers"][0]
    assert container["command"] == ["vllm-router"] and container["args"][0] == "--host"
    assert container["args"][container["args"].index("--policy") + 1] == "cache_aware"


def test_kvaware_workers_publish_events_the_router_subscribes_to(rendered):
    _, docs = rendered[("dev", "kvaware", "redis")]
    (sts,) = _all(docs, "StatefulSet")
    vllm = sts["spec"]["template"]["spec"]["containers"][0]
    cfg = json.loads(vllm["args"][vllm["args"].index("--kv-events-config") + 1])
    assert cfg["publisher"] == "zmq" and cfg["topic"] == "" and cfg["endpoint"].endswith(":5557")
    router = next(d for d in _all(docs, "Deployment") if "router" in d["metadata"]["name"])
    args = router["spec"]["template"]["spec"]["containers"][0]["args"]
    urls = args[args.index("--worker-urls") + 1: args.index("--kv-event-source")]
    sources = [args[i + 1] for i, a in enumerate(args) if a == "--kv-event-source"]
    assert len(urls) == sts["spec"]["replicas"] == len(sources)
    assert [s.split("=", 1)[0] for s in sources] == urls  # exact match, as the router needs
    assert args[args.index("--kv-event-block-size") + 1] == vllm["args"][
        vllm["args"].index("--block-size") + 1]


@pytest.mark.parametrize("backend, url_prefix", [
    ("redis", "rediss://l2.example.internal"), ("valkey", "resp://kvcache-valkey."),
    ("lmcache-server", "resp://kvcache-valkey."), ("tieredstorage", "resp://kvcache-valkey.")])
def test_l2_backend_mapping(rendered, backend, url_prefix):
    _, docs = rendered[("dev", "prefixaware", backend)]
    cm = next(d for d in _all(docs, "ConfigMap") if "lmcache" in d["metadata"]["name"])
    cfg = yaml.safe_load(cm["data"]["lmcache.yaml"])
    if backend == "redis":  # the secret-bearing URL is written at pod start, not here
        assert "remote_url" not in cfg
        assert url_prefix in json.dumps(docs) and "socket_timeout=1" in json.dumps(docs)
    else:
        assert cfg["remote_url"].startswith(url_prefix)
        if url_prefix.startswith("redis"):
            assert "socket_timeout=1" in cfg["remote_url"]
    assert cfg["local_cpu"] is True and cfg["max_local_cpu_size"] > 0
    # a dead or slow L2 costs a bounded miss, and L1 keeps serving (LMCache 0.5.6 keys)
    assert cfg["blocking_timeout_secs"] <= 5 and cfg["lookup_timeout_ms"] <= 200
    assert cfg["extra_config"]["fallback_policy"] == "local_cpu"


def test_no_l2_means_no_remote():
    docs = render(_env("dev"), _spec(_env("dev"), backend=None))
    cm = next(d for d in _all(docs, "ConfigMap") if "lmcache" in d["metadata"]["name"])
    assert "remote_url" not in yaml.safe_load(cm["data"]["lmcache.yaml"])


def test_tieredstorage_is_the_in_cluster_valkey():
    """Said by synth only where the L2 is deployed (tests/tools/test_image_pair.py)."""
    spec = _spec(_env("dev"), backend="tieredstorage")
    assert spec.l2_backend == "valkey" and spec.l2_backend_asked == "tieredstorage"
    assert not any("tieredstorage" in w for w in spec.warnings)


@pytest.mark.parametrize("edit, field, allowed", [
    (lambda r: r["spec"]["intelligentRoutingSpec"].update(routingStrategy="fastest"),
     "spec.intelligentRoutingSpec.routingStrategy", "prefixaware"),
    (lambda r: r.update(apiVersion="v2"), "apiVersion", "inference.sagemaker.aws.amazon.com/v1"),
    (lambda r: r["spec"].update(instanceType="ml.m5.large"), "spec.instanceType", "GPU"),
    (lambda r: r["spec"].update(bogusField=1), "spec.bogusField",
     "fields of InferenceEndpointConfig v1 here"),
    # a field of a later operator (issue 42: l2CacheSizeGiB) is told which operator we read
    (lambda r: r["spec"]["kvCacheSpec"]["l2CacheSpec"].update(l2CacheSizeGiB=64),
     "spec.kvCacheSpec.l2CacheSpec.l2CacheSizeGiB", "HyperPod inference operator v3.7"),
    (lambda r: r["spec"]["modelSourceConfig"].update(modelSourceType="nfs"),
     "spec.modelSourceConfig.modelSourceType", "s3, fsx, huggingface, kubernetesVolume"),
    (lambda r: r["spec"]["kvCacheSpec"]["l2CacheSpec"].update(
        l2CacheLocalUrl="memcached://cache:11211"),
     "spec.kvCacheSpec.l2CacheSpec.l2CacheLocalUrl", "redis://HOST[:PORT]"),
    (lambda r: r["spec"]["kvCacheSpec"]["l2CacheSpec"].update(
        l2CacheLocalUrl="rediss://:hunter2@cache.example.internal:6379"),
     "spec.kvCacheSpec.l2CacheSpec.l2CacheLocalUrl", "Secrets Manager"),
    (lambda r: r["spec"]["kvCacheSpec"]["l2CacheSpec"].update(l2CacheLocalUrl="lm://server"),
     "spec.kvCacheSpec.l2CacheSpec.l2CacheLocalUrl", "lm://HOST:PORT"),
    (lambda r: r["spec"]["worker"].update(image="Vllm/VLLM-openai:v0.9.2"), "spec.worker.image",
     "lowercase"),
    (lambda r: r["spec"]["worker"].update(args=["--port", "9000"]), "spec.worker.args",
     "--port 8000"),
    (lambda r: r["spec"]["worker"]["modelVolumeMount"].update(mountPath="/dev/shm"),
     "spec.worker.modelVolumeMount.mountPath", "an absolute path other than"),
    (lambda r: r["spec"].update(tlsConfig={"customCertificateConfig": {"acmArn": "cert-1"}}),
     "spec.tlsConfig.customCertificateConfig.acmArn", "an ACM certificate ARN"),
    (lambda r: r["spec"]["kvCacheSpec"]["l2CacheSpec"].update(l2CacheBackend="memcached"),
     "spec.kvCacheSpec.l2CacheSpec.l2CacheBackend", "redis"),
    (lambda r: [r["spec"]["worker"]["resources"][k].update({"nvidia.com/gpu": 3})
                for k in ("limits", "requests")],
     "spec.worker.resources.limits.nvidia.com/gpu", "a divisor of 4"),
    (lambda r: r["spec"]["kvCacheSpec"].update(l1CacheSizeGiB=500),
     "spec.kvCacheSpec.l1CacheSizeGiB", "less 8 GiB"),
    (lambda r: r["spec"]["worker"]["environmentVariables"].append({"value": "x"}),
     "spec.worker.environmentVariables[1]", "{name: string, value: string}"),
    (lambda r: r["spec"].pop("worker"), "spec.worker", "required"),
])
def test_bad_endpoint_file_is_one_clear_error(edit, field, allowed):
    raw = copy.deepcopy(SEED)
    edit(raw)
    with pytest.raises(ConfigError) as info:
        parse_endpoint("dev", "endpoints/x.yaml", raw)
    assert info.value.field == f"endpoints/x.yaml: {field}"
    assert allowed in info.value.allowed


@pytest.mark.parametrize("edit, field, allowed", [
    (lambda r: r["spec"].update(instanceType="ml.g4dn.12xlarge"), "spec.instanceType",
     "GPU node groups: g5.24xlarge"),
    (lambda r: r["spec"]["worker"].update(
        image="763104351884.dkr.ecr.us-west-2.amazonaws.com/djl-inference:0.32.0-lmi14.0.0-cu124"),
     "spec.worker.image", "a vLLM image carrying LMCache"),
    (lambda r: r["spec"]["worker"].update(image="vllm/vllm-openai:v0.8.5") or
     r["spec"]["intelligentRoutingSpec"].update(routingStrategy="kvaware"),
     "spec.intelligentRoutingSpec.routingStrategy", "cannot publish KV events"),
    (lambda r: r["spec"]["worker"]["environmentVariables"].append(
        {"name": "LMCACHE_LOG_LEVEL", "value": "INFO"}), "spec.worker.environmentVariables",
     "no LMCACHE_LOG_LEVEL with the managed L2"),
])
def test_endpoint_must_fit_the_environment(tmp_path, edit, field, allowed):
    raw = copy.deepcopy(SEED)
    edit(raw)
    (tmp_path / "e.yaml").write_text(yaml.safe_dump(raw))
    ctx = context_for(env="dev")
    ctx["environments"]["dev"]["endpoints"] = ["e.yaml"]
    cfg = resolve_environment(ctx)
    with pytest.raises(ConfigError) as info:
        load_endpoints(cfg, tmp_path)
    assert info.value.field == f"e.yaml: {field}" and allowed in info.value.allowed


def test_malformed_yaml_and_missing_file(tmp_path):
    (tmp_path / "bad.yaml").write_text("spec: [unclosed\n")
    ctx = context_for(env="dev")
    ctx["environments"]["dev"]["endpoints"] = ["bad.yaml", "missing.yaml"]
    cfg = resolve_environment(ctx)
    with pytest.raises(ConfigError) as info:
        load_endpoints(cfg, tmp_path)
    # the whole problem, where it is, and what is allowed: nothing cut mid-sentence
    assert info.value.field == "bad.yaml: line 2, column 1", info.value.field
    assert "..." not in str(info.value) and str(info.value).endswith("quotes)")
    assert info.value.allowed.startswith("well-formed YAML")
    ctx["environments"]["dev"]["endpoints"] = ["missing.yaml"]
    with pytest.raises(ConfigError) as info:
        load_endpoints(resolve_environment(ctx), tmp_path)
    assert info.value.field == "endpoints[0]" and info.value.value == "missing.yaml"


def test_session_header_is_the_one_the_router_hashes_first():
    assert SESSION_HEADER.lower() == "x-session-id"


@pytest.mark.parametrize("strategy, sticky", [("prefixaware", True), ("session", False),
                                              ("kvaware", True), ("roundrobin", False)])
def test_client_affinity_only_where_router_state_is_per_replica(rendered, strategy, sticky):
    _, docs = rendered[("dev", strategy, "redis")]
    svc = next(d for d in _all(docs, "Service") if d["spec"].get("type") == "LoadBalancer")
    attrs = svc["metadata"]["annotations"].get(
        "service.beta.kubernetes.io/aws-load-balancer-target-group-attributes", "")
    assert ("stickiness.type=source_ip" in attrs) is sticky


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)))
def test_every_serving_pod_meets_pod_security_restricted(rendered, case):
    """What PSA `restricted` checks, on every pod, init containers included; the namespace
    enforces it."""
    _, docs = rendered[case]
    (ns,) = _all(docs, "Namespace")
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    pods = [d["spec"]["template"]["spec"] for d in docs
            if d["kind"] in ("Deployment", "StatefulSet", "DaemonSet")]
    assert pods
    for pod in pods:
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        assert pod["securityContext"]["runAsNonRoot"] is True
        for c in pod.get("initContainers", []) + pod["containers"]:
            sc = c["securityContext"]
            assert sc["allowPrivilegeEscalation"] is False and sc["capabilities"] == {
                "drop": ["ALL"]}, c["name"]
            assert sc["readOnlyRootFilesystem"] is True, c["name"]
            assert sc.get("runAsUser", pod["securityContext"].get("runAsUser")) != 0
        for v in pod.get("volumes", []):
            assert set(v) - {"name"} <= {"emptyDir", "configMap", "secret", "projected"}, v


def test_the_files_container_port_is_where_everything_reaches_the_workers():
    cfg = _env("dev")
    raw = copy.deepcopy(SEED)
    raw["spec"]["worker"]["modelInvocationPort"]["containerPort"] = 8080
    raw["spec"]["worker"]["args"] = ["--port", "8080", *raw["spec"]["worker"]["args"]]
    spec = parse_endpoint(cfg.name, "endpoints/test.yaml", raw)
    docs = render(cfg, spec)
    worker = next(d for d in docs if d["kind"] == "Deployment"
                  and d["metadata"]["name"].endswith("-workers"))
    vllm = worker["spec"]["template"]["spec"]["containers"][0]
    assert vllm["ports"][0]["containerPort"] == 8080
    assert vllm["args"].count("--port") == 1           # the file's, not a second one
    router = next(d for d in docs if d["kind"] == "Deployment"
                  and d["metadata"]["name"].endswith("-router"))
    args = router["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--service-discovery-port") + 1] == "8080"
    policies = [d for d in docs if d["kind"] == "NetworkPolicy"
                and d["spec"]["podSelector"].get("matchLabels", {}).get(
                    "app.kubernetes.io/name") == "vllm-worker"]
    ports = {p["port"] for pol in policies for r in pol["spec"].get("ingress", [])
             for p in r.get("ports", [])}
    assert ports == {8080}


@pytest.mark.parametrize("limits", [False, True])
def test_the_memory_floor_a_refusal_names_is_one_that_passes(limits):
    """`at least NGi` is true: that much is accepted, with or without the request-limit
    sidecar, whose share comes out of the worker's memory (issue 42: 8Gi was refused with
    `at least 8Gi`)."""
    cfg = _env("dev")
    raw = copy.deepcopy(SEED)
    raw["spec"]["worker"]["resources"]["requests"]["memory"] = "1Gi"
    if limits:
        raw["spec"]["worker"]["requestLimits"] = {"maxConcurrentRequests": 8}
    with pytest.raises(ConfigError) as err:
        fit_endpoint(cfg, parse_endpoint(cfg.name, "endpoints/test.yaml", raw))
    floor = re.search(r"at least (\d+)Gi", err.value.allowed)[1]
    assert ("sidecar" in err.value.allowed) == limits
    raw["spec"]["worker"]["resources"]["requests"]["memory"] = f"{floor}Gi"
    fit_endpoint(cfg, parse_endpoint(cfg.name, "endpoints/test.yaml", raw))
