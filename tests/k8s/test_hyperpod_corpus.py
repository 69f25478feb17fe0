"""Published HyperPod `InferenceEndpointConfig` files deploy unmodified, global and China.

The corpus (tests/fixtures/hyperpod/, each file headed by where AWS published it) is the files
users already have. Every vLLM file is served by one environment per variant, synthesized once
for this module: the whole CDK app with cdk-nag and CDK's validation, cfn-lint per region,
strict Kubernetes schemas for every manifest, and the China-ECR-only rule. Files that are not
vLLM (DJL, TGI) or not v1 get one clear line.

Placeholders the publications tell the reader to fill (`$SAGEMAKER_ENDPOINT_NAME`,
`<PLACEHOLDER_L2_CACHE_LOCAL_URL>` ...) are filled as a reader would; every other byte is as
published, and a file without placeholders is loaded byte for byte.
"""
from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass
from pathlib import Path

import cdk8s
import kubernetes_validate
import pytest
import yaml

from config import ConfigError, EnvironmentConfig, resolve_environment
from config.endpoint_spec import ROUTING_POLICIES
from config.notices import ack_id
from k8s.serving import (
    build_charts, load_endpoints, placeholder_facts, worker_service_account,
)
from tests.conftest import ROOT, context_for
from tests.k8s.crds import is_custom_resource, validate_custom_resources
from tests.lint import CfnLint

CORPUS = ROOT / "tests" / "fixtures" / "hyperpod"
FILES = sorted(CORPUS.glob("*.yaml"))

# Refused, each with one line naming the field and what is allowed.
REFUSED = {
    "hpcli-sample-s3-deepseek15b-djl.yaml": ("spec.worker.image", "a vLLM image"),
    "hpcli-sample-s3-llama70b-tgi.yaml": ("spec.worker.image", "a vLLM image"),
    "awsdocs-rev-deploy-ftm-fsx-tgi.yaml": ("spec.worker.image", "a vLLM image"),
    "awsdocs-rev-deploy-ftm-s3-v1alpha1-djl.yaml": ("apiVersion", "/v1"),
    "awssamples-genai-hosting-s3-deepseek15b-v1alpha1.yaml": ("apiVersion", "/v1"),
    "awssamples-genai-hosting-fsx-deepseek15b-v1alpha1.yaml": ("apiVersion", "/v1"),
    # GPU request 4, limit 8: Kubernetes refuses a pod whose extended-resource request differs
    # from its limit, so which one was meant is the user's to say (an unmerged sample).
    "hpcli-pr413-sample-llama70b-l1-l2-tieredstorage.yaml": (
        "spec.worker.resources.requests.nvidia.com/gpu", "only equal to limits"),
    # Its required node affinity names zones of us-east-2: no node of the environment has one,
    # so its workers would wait Pending forever (as on HyperPod outside us-east-2).
    "hpcli-pr413-sample-qwen3-8b-node-affinity.yaml": (
        "spec.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution",
        "topology.kubernetes.io/zone=us-west-2a"),
    # Its required node affinity names one node (kubernetes.io/hostname): node groups start
    # nodes on demand, whose names no one knows before deploy, so none would ever match.
    "hpcli-pr413-v1-nvme-k8s-volume-service-account.yaml": (
        "spec.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution",
        "node names are not known before deploy"),
}
SERVED = [f for f in FILES if f.name not in REFUSED]

# Placeholders a reader must fill for the file to mean anything: names, the model's place, the
# L2 URL, the image, the service account. Placeholders in fields we ignore or replace
# (bucketName, tlsConfig's S3 URI, the namespace, a model loader's script) stay as published.
# Endpoint names are made per file.
FILLS = {
    "S3_MODEL_LOCATION": "models/my-model", "MODEL_LOCATION": "models/my-model",
    "LOCATION_OF_MODEL_WITHIN_S3": "models/my-model",
    # The file's own comment: "e.g.: redis://redis.ns-team-a.svc.cluster.local:6379"
    "PLACEHOLDER_L2_CACHE_LOCAL_URL": "redis://redis.ns-team-a.svc.cluster.local:6379",
    "ACCOUNT_ID": "111111111111", "REGION": "us-west-2",
    "YOUR_LMCACHE_IMAGE": "lmcache/vllm-openai:v0.3.7",
    "YOUR_HYPERPOD_NODE": "ip-10-0-1-23.compute.internal",   # a node of the reader's cluster
}
_NAME_VARS = ("SAGEMAKER_ENDPOINT_NAME", "MY_DEPLOYMENT_NAME")
_ACCOUNT_VARS = ("YOUR_SERVICE_ACCOUNT",)   # the reader's own account, one per endpoint
_PLACEHOLDER = re.compile(r"\\?\$\{?([A-Z][A-Z0-9_]*)\}?|<([A-Z][A-Z0-9_]*)>")

# The corpus's instance types served on node groups each variant has (g5 exists in both).
NODE_GROUPS = [
    {"name": "g5", "instanceTypes": ["g5.24xlarge"], "minSize": 0, "maxSize": 4,
     "desiredSize": 0, "diskSizeGiB": 300},
    {"name": "g5x8", "instanceTypes": ["g5.48xlarge"], "minSize": 0, "maxSize": 2,
     "desiredSize": 0, "diskSizeGiB": 500},
]
TYPE_MAP = {"ml.g5.8xlarge": "g5.24xlarge", "ml.g5.12xlarge": "g5.24xlarge",
            "ml.p5.48xlarge": "g5.48xlarge", "ml.p6-b300.48xlarge": "g5.48xlarge"}


def filled(path: Path) -> tuple[str, bool]:
    """The file as a reader has it once the publication's placeholders are filled in."""
    text = path.read_text()
    body = "".join(line for line in text.splitlines(keepends=True) if not line.startswith("#"))
    stem = re.sub(r"[^a-z0-9]+", "-", path.stem.lower())[:40].strip("-")

    def fill(match: re.Match) -> str:
        name = match.group(1) or match.group(2)
        if name in _NAME_VARS:
            return stem
        if name in _ACCOUNT_VARS:
            return f"{stem}-sa"
        return FILLS.get(name, match.group(0))

    out = _PLACEHOLDER.sub(fill, body)
    return out, out != body


def test_corpus_is_real_and_varied():
    assert len(SERVED) >= 8
    prefixes = {f.name.split("-")[0] for f in SERVED}
    assert prefixes >= {"awsdocs", "hpcli", "awssamples"}, prefixes   # three publishers
    assert all(f.read_text().startswith("# Source: ") for f in FILES)
    shapes = "".join(f.read_text() for f in SERVED)
    # (the one published tieredstorage file is refused for its GPU request: test_charts.py
    # covers that backend)
    for shape in ("l2CacheLocalUrl", "routingStrategy: "
                  "prefixaware", "tlsConfig", "modelSourceType: fsx", "modelSourceType: "
                  "huggingface", "modelSourceType: kubernetesVolume", "namespace: default",
                  '"--model"', "environmentVariables", "loadBalancer", "metrics:", "command:"):
        assert shape in shapes, shape


def _corpus_env(tmp: Path, variant: str, files: list[Path]) -> dict:
    for f in files:
        (tmp / f.name).write_text(filled(f)[0])
    ctx = context_for(env=variant)
    env = ctx["environments"][variant]
    env["nodeGroups"] = {**env["nodeGroups"], "gpu": NODE_GROUPS}
    env["instanceTypeMap"] = TYPE_MAP
    env["endpoints"] = [f.name for f in files]
    env["listener"] = {"certificateArn": _certificate(env)}
    return ctx


def _certificate(env: dict) -> str:
    """The environment's own ACM certificate (a published file's is in another account)."""
    partition = "aws-cn" if env["region"].startswith("cn-") else "aws"
    return (f"arn:{partition}:acm:{env['region']}:{env['account']}:certificate/"
            "0a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d")


@functools.cache
def _yaml(f: Path) -> dict:
    """The file as filled, parsed once (the tests only read it)."""
    return yaml.safe_load(filled(f)[0])


@functools.cache
def _groups() -> list[list[Path]]:
    """As few environments as hold the corpus: two published files may share a name
    (`my-model`), and one environment's endpoints need distinct names (one error if not)."""
    groups: list[dict[str, Path]] = []   # per environment: metadata.name -> file
    for f in SERVED:
        name = _yaml(f)["metadata"]["name"]
        group = next((g for g in groups if name not in g), None)
        if group is None:
            groups.append(group := {})
        group[name] = f
    return [list(g.values()) for g in groups]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """Every vLLM file of the corpus served per variant: one synth per group of files."""
    import aws_cdk as cdk

    from stacks.app_builder import build

    out = {}
    for variant in ("dev", "china"):
        specs, docs, synths, by_file = [], [], [], {}
        for i, files in enumerate(_groups()):
            tmp = tmp_path_factory.mktemp(f"corpus-{variant}-{i}")
            ctx = _corpus_env(tmp, variant, files)
            cfg = resolve_environment(ctx)
            group_specs = load_endpoints(cfg, tmp)
            app = cdk.App(context=ctx, outdir=str(tmp / "cdk.out"))
            stacks = build(app, cfg, group_specs)
            assembly = app.synth()
            group_docs = [d for chart in stacks.serving.charts for d in chart.to_json()]
            specs += group_specs
            docs += group_docs
            synths.append((stacks, Path(assembly.directory)))
            by_file.update({f.name: group_docs for f in files})
        # linted in the background from here on (the next variant synthesizes meanwhile); a
        # stack both groups render alike (Network, Cluster) is linted once (tests/lint.py)
        lint = CfnLint((cfg.region,), sorted(str(p) for _, outdir in synths
                                             for p in outdir.glob("*.template.json")))
        out[variant] = Corpus(cfg, specs, synths, docs, by_file, lint)
    return out


@dataclass
class Corpus:
    cfg: EnvironmentConfig
    specs: list             # EndpointSpec of every served file
    synths: list            # (EnvironmentStacks, cdk.out directory) per group
    docs: list              # every rendered Kubernetes object
    docs_by_file: dict      # file name -> the objects of its group's synth
    cfn_lint: CfnLint       # cfn-lint over every group's templates, in the variant's region

    def spec(self, path: Path):
        return next(s for s in self.specs if s.source_file == path.name)


def test_files_without_placeholders_are_read_byte_for_byte():
    untouched = [f.name for f in SERVED if not filled(f)[1]]
    assert len(untouched) >= 5, untouched


@pytest.mark.parametrize("variant", ["dev", "china"])
def test_every_file_synthesizes_with_nag_and_cdk_validation_clean(corpus, variant):
    c = corpus[variant]
    assert len(c.specs) == len(SERVED)
    for _, outdir in c.synths:
        report = json.loads((outdir / "validation-report.json").read_text())
        assert "AwsSolutions" in {r["pluginName"] for r in report["pluginReports"]}
        for rep in report["pluginReports"]:
            assert rep["conclusion"] == "success", (rep["pluginName"], rep["violations"][:3])
            # Only our own warnings (fields not acted on, images without a digest) are listed.
            findings = [v for v in rep["violations"]
                        if not v["ruleName"].startswith("Annotation::kvcache:")]
            assert findings == [], rep["pluginName"]


@pytest.mark.parametrize("variant", ["dev", "china"])
def test_every_manifest_passes_strict_schemas(corpus, variant):
    c = corpus[variant]
    for doc in c.docs:
        if not is_custom_resource(doc):
            kubernetes_validate.validate(doc, c.cfg.kubernetes_version + ".0", strict=True)
    validate_custom_resources([d for d in c.docs if is_custom_resource(d)])


def test_china_pulls_every_image_from_its_own_ecr(corpus):
    c = corpus["china"]
    registry = f"{c.cfg.account}.dkr.ecr.{c.cfg.region}.amazonaws.com.cn/"
    images = {c["image"] for d in c.docs
              for c in d.get("spec", {}).get("template", {}).get("spec", {}).get("containers", [])
              + d.get("spec", {}).get("template", {}).get("spec", {}).get("initContainers", [])}
    router_asset = {i for i in images if "cdk-" in i or "Token" in i}
    assert images - router_asset and all(i.startswith(registry) for i in images - router_asset)
    # ... and the Storage stack holds a repository for each endpoint image (the mirror target).
    repos = {r for stacks, _ in c.synths for r in stacks.storage.repositories}
    for s in c.specs:
        assert s.image.mirror_repository in repos, s.worker_image


def _worker(docs, name):
    return next(d for d in docs if d["kind"] in ("Deployment", "StatefulSet")
                and d["metadata"]["name"] == f"{name}-workers")


def _router_args(docs, name):
    router = next(d for d in docs if d["kind"] == "Deployment"
                  and d["metadata"]["name"] == f"{name}-router")
    return router["spec"]["template"]["spec"]["containers"][0]["args"]


@pytest.mark.parametrize("variant", ["dev", "china"])
@pytest.mark.parametrize("path", SERVED, ids=lambda p: p.stem)
def test_router_and_workers_keep_the_files_strategy_gpus_image_args_and_env(
        corpus, variant, path):
    c = corpus[variant]
    cfg, docs = c.cfg, c.docs_by_file[path.name]
    raw = _yaml(path)["spec"]
    spec = c.spec(path)
    name = spec.name
    routing = raw.get("intelligentRoutingSpec") or {}
    strategy = routing.get("routingStrategy", "prefixaware") if routing.get("enabled") \
        else "roundrobin"
    args = _router_args(docs, name)
    assert args[args.index("--policy") + 1] == ROUTING_POLICIES[strategy]

    container = _worker(docs, name)["spec"]["template"]["spec"]["containers"][0]
    w = raw["worker"]
    gpus = str((w.get("resources", {}).get("limits") or {}).get("nvidia.com/gpu")
               or (w.get("resources", {}).get("requests") or {}).get("nvidia.com/gpu"))
    assert container["resources"]["limits"]["nvidia.com/gpu"] == gpus
    image = w["image"]
    if cfg.facts.china:
        assert container["image"] == (f"{cfg.account}.{cfg.facts.ecr_host_suffix}/"
                                      f"{spec.image.mirror_repository}:{spec.image.pin}")
    else:
        assert container["image"] == image
    file_args = [str(a) for a in w.get("args", [])]
    got = container["args"]
    assert got[got.index(file_args[0]) if file_args else 0:][:len(file_args)] == file_args
    if w.get("command"):   # as written (after the shell that reads the API key, if any)
        assert container["command"][-len(w["command"]):] == w["command"]
    env = {e["name"]: e for e in container["env"]}
    for var in w.get("environmentVariables", []):
        if var["name"] not in ("LMCACHE_CONFIG_FILE", "PROMETHEUS_MULTIPROC_DIR"):  # ours
            assert env[var["name"]].get("value") == (str(var["value"]) if "value" in var
                                                     else None), var["name"]
    # The model is where the file mounts it, once: no second positional model argument.
    mount = w.get("modelVolumeMount", {}).get("mountPath", "/opt/ml/model")
    assert mount in {m["mountPath"] for m in container["volumeMounts"]}
    first_flag = next((i for i, a in enumerate(got) if a.startswith("-")), len(got))
    assert first_flag <= 1


def test_fields_not_acted_on_are_each_a_warning_at_synth(corpus):
    c = corpus["dev"]
    warnings = [str(m.data) for stacks, _ in c.synths for m in stacks.serving.node.metadata
                if m.type == "aws:cdk:warning"]
    for s in c.specs:
        for w in s.warnings:
            assert f"{w} [ack: {ack_id(w)}]" in warnings, w   # each under its kind's id
    tls = c.spec(CORPUS / "awsdocs-custom-certs-tls-acm.yaml")
    assert any("spec.modelSourceConfig.s3Storage: ignored" in w for w in tls.warnings)
    # its domainName names the Route 53 record where the file asks for one (dnsConfig)
    assert not any("domainName" in w for w in tls.warnings)
    nvme = c.spec(CORPUS / "awsdocs-nvme-k8s-volume-fallback.yaml")
    # its NVMe loader fills the model volume: our staging does that instead, and says so
    assert any(w.startswith("awsdocs-nvme-k8s-volume-fallback.yaml: spec.kubernetes."
                            "initContainers[smart-loader]: loads the model volume")
               for w in nvme.warnings)
    assert any("spec.kubernetes.volumes[0]: model-weights is the model volume" in w
               for w in nvme.warnings)


@pytest.mark.parametrize("variant", ["dev", "china"])
def test_tls_certificate_from_the_file_or_the_environment(corpus, variant):
    """The published file's ACM certificate is another account's: the environment's serves,
    and a warning says so. The router's NLB terminates TLS with it."""
    c = corpus[variant]
    path = CORPUS / "awsdocs-custom-certs-tls-acm.yaml"
    spec = c.spec(path)
    assert spec.tls_certificate_arn is None
    assert any("cannot serve a load balancer" in w for w in spec.warnings)
    svc = next(d for d in c.docs_by_file[path.name] if d["kind"] == "Service"
               and d["metadata"]["name"] == f"{spec.name}-router")
    annotations = svc["metadata"]["annotations"]
    assert annotations["service.beta.kubernetes.io/aws-load-balancer-ssl-cert"] == \
        c.cfg.listener.certificate_arn


def test_a_certificate_of_the_environment_is_used_as_written(tmp_path):
    raw = yaml.safe_load(filled(CORPUS / "awsdocs-custom-certs-tls-acm.yaml")[0])
    mine = "arn:aws:acm:us-west-2:111111111111:certificate/11111111-2222-4333-8444-555555555555"
    raw["spec"]["tlsConfig"]["customCertificateConfig"]["acmArn"] = mine
    (tmp_path / "e.yaml").write_text(yaml.safe_dump(raw))
    ctx = context_for(env="dev")
    ctx["environments"]["dev"]["endpoints"] = ["e.yaml"]
    (spec,) = load_endpoints(resolve_environment(ctx), tmp_path)
    assert spec.tls_certificate_arn == mine
    del ctx["environments"]["dev"]["endpoints"]
    raw["spec"]["tlsConfig"]["customCertificateConfig"]["acmArn"] = mine.replace(
        "111111111111", "123456789012")
    (tmp_path / "e.yaml").write_text(yaml.safe_dump(raw))
    ctx["environments"]["dev"]["endpoints"] = ["e.yaml"]
    with pytest.raises(ConfigError) as info:
        load_endpoints(resolve_environment(ctx), tmp_path)
    assert info.value.field == "e.yaml: spec.tlsConfig.customCertificateConfig.acmArn"
    assert "listener.certificateArn" in info.value.allowed


def test_the_endpoints_own_l2_url_overrides_the_environments_cache(corpus, tmp_path):
    path = CORPUS / "hpcli-sample-llama31-8b-kv-cache-redis.yaml"
    served = corpus["dev"].spec(path)
    # as published, on lmcache/vllm-openai:v0.3.7, whose LMCache does not report a failed L2
    # read to vLLM: no L2 (k8s/workers.py l2_refusal), and the file is told why
    assert served.l2_url is None and not served.l2_enabled
    assert any("enableL2Cache: true, but no L2" in w and "vLLM 0.10.2 + LMCache 0.3.7" in w
               for w in served.warnings)
    cfg = resolve_environment(_corpus_env(tmp_path, "dev", [path]))
    raw = yaml.safe_load(filled(path)[0])
    raw["spec"]["worker"]["image"] = "lmcache/vllm-openai:v0.5.4"
    (tmp_path / path.name).write_text(yaml.safe_dump(raw))
    (s,) = load_endpoints(cfg, tmp_path)
    # on v0.5.4: LMCache's redis:// client (one asyncio loop, ~0.6 GB/s) reads under twice
    # what its A10Gs recompute at 8K, so no L2 (k8s/l2.py) unless forced
    assert s.l2_url is None
    assert any("enableL2Cache: true, but no L2" in w and "redis://" in w for w in s.warnings)
    raw["spec"]["kvCacheSpec"]["forceL2Cache"] = True
    (tmp_path / path.name).write_text(yaml.safe_dump(raw))
    (s,) = load_endpoints(cfg, tmp_path)
    docs = [d for c in build_charts(cdk8s.App(), cfg, (s,), placeholder_facts(cfg, (s,)))
            for d in c.to_json()]
    assert s.l2_url == "redis://redis.ns-team-a.svc.cluster.local:6379"
    cm = next(d for d in docs if d["kind"] == "ConfigMap"
              and d["metadata"]["name"] == f"{s.name}-workers-lmcache")
    cfg = yaml.safe_load(cm["data"]["lmcache.yaml"])
    assert cfg["remote_url"] == ("redis://redis.ns-team-a.svc.cluster.local:6379"
                                 "?socket_timeout=1&socket_connect_timeout=1")
    # the tier policy's bounds, as the image's LMCache reads them (k8s/workers.py TIER_POLICY)
    assert {k: cfg[k] for k in ("lookup_timeout_ms", "blocking_timeout_secs")} == {
        "lookup_timeout_ms": 200, "blocking_timeout_secs": 2}
    pod = _worker(docs, s.name)["spec"]["template"]["spec"]
    # No L2 token is fetched for the endpoint's own L2, and LMCache's URL is in its ConfigMap.
    assert not any("l2" in c["name"] for c in pod["initContainers"])
    assert any("this endpoint's L2 is redis://redis.ns-team-a" in w for w in s.warnings)


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_files_we_cannot_serve_are_one_clear_line(tmp_path, name):
    (tmp_path / name).write_text(filled(CORPUS / name)[0])
    ctx = context_for(env="dev")
    env = ctx["environments"]["dev"]
    env["nodeGroups"] = {**env["nodeGroups"], "gpu": NODE_GROUPS}
    env["instanceTypeMap"] = TYPE_MAP
    env["endpoints"] = [name]
    field, allowed = REFUSED[name]
    with pytest.raises(ConfigError) as info:
        load_endpoints(resolve_environment(ctx), tmp_path)
    assert info.value.field == f"{name}: {field}" and allowed in info.value.allowed
    assert "\n" not in str(info.value)


# --- First-deploy gates on the workers of every served file (tests/k8s/worker_gates.py) ---

@pytest.mark.parametrize("variant", ["dev", "china"])
def test_every_files_workers_reach_vllm_in_their_images_layout(corpus, variant, tmp_path):
    from tests.k8s.worker_gates import (
        assert_reaches_vllm, families_for, fake_root, run_container, worker_containers)
    c = corpus[variant]
    for spec in c.specs:
        docs = c.docs_by_file[spec.source_file]
        account = worker_service_account(spec.name, spec.pod.service_account)
        pod, container = next((p, w) for p, w in worker_containers(docs)
                              if w["args"] and p["serviceAccountName"] == account)
        api_key = any(i["name"] == "fetch-api-key" for i in pod["initContainers"])
        for family in families_for(spec.worker_image):
            root = fake_root(tmp_path / Path(spec.source_file).stem, family)
            assert_reaches_vllm(run_container(root, family, container, tmp_path), root,
                                family, container, api_key)


@pytest.mark.parametrize("variant", ["dev", "china"])
def test_every_files_workers_fit_their_memory(corpus, variant):
    from tests.k8s.worker_gates import memory_budget, worker_containers
    c = corpus[variant]
    budgets = [memory_budget(c.docs, pod, w) for pod, w in worker_containers(c.docs)]
    assert len(budgets) == len(SERVED)
    for b in budgets:
        assert b["used"] <= b["limit"] and b["l1_per_rank"] >= 1 and b["ranks"] <= b["gpus"], b
    assert any(b["ranks"] > 1 for b in budgets)   # the TP files are in the corpus


def test_every_files_workers_store_layerwise_only_with_the_guard(corpus):
    """Layerwise only where the image's vLLM, run with the file's args and ours, calls
    LMCache's layer hooks on every step (no full CUDA graph, no async scheduling)."""
    from tests.k8s.worker_gates import assert_layerwise_is_guarded
    assert assert_layerwise_is_guarded(corpus["dev"].docs)   # the gate saw layerwise workers


def test_every_files_lmcache_config_is_read_by_its_images_lmcache(corpus, tmp_path):
    """With the parser of the LMCache each file's image carries (all we have where no record
    pins it): every key read as written, none unknown."""
    from tests.k8s.lmcache_parse import parse, start
    from tests.k8s.test_lmcache_config import check_parsed, parsers_for
    from tests.k8s.worker_gates import lmcache_configs
    c = corpus["dev"]
    files: dict[str, list[tuple[str, str, dict]]] = {}
    for spec in c.specs:
        text = lmcache_configs(c.docs_by_file[spec.source_file])[f"{spec.name}-workers"]
        path = tmp_path / f"{Path(spec.source_file).stem}.yaml"   # names repeat across files
        path.write_text(text)
        for version in parsers_for(spec.worker_image):
            files.setdefault(version, []).append((str(path), spec.worker_image,
                                                  yaml.safe_load(text)))
    assert len(files) >= 3
    start(*files)
    for version, items in files.items():
        for (_, image, ours), got in zip(items, parse(version, [p for p, _, _ in items])):
            check_parsed(got, ours, image)


@pytest.mark.parametrize("variant", ["dev", "china"])
def test_every_pod_fits_a_node_group(corpus, variant):
    """First-deploy gate (a) on every served file (tests/stacks/test_scheduling.py): each
    worker and router, beside the environment's Helm release pods, fits a node group it may
    land on."""
    from tests.stacks.cluster_model import config_node_groups, pods_of_objects, unschedulable
    from tests.stacks.helm_pods import helm_release_pods

    c = corpus[variant]
    templates = {p.name: json.loads(p.read_text()) for _, outdir in c.synths[:1]
                 for p in outdir.glob("*.template.json")}
    pods = pods_of_objects(c.docs) + helm_release_pods(templates, variant)
    assert {p.owner.rsplit("/", 1)[1] for p in pods if p.owner.endswith("-workers")} == {
        f"{s.name}-workers" for s in c.specs}
    problems = unschedulable(pods, config_node_groups(c.cfg))
    assert problems == []


@pytest.mark.parametrize("variant", ["dev", "china"])
def test_cfn_lint_is_clean(corpus, variant):
    """Last in the module: each variant's lint has run in the background since its synth."""
    c = corpus[variant]
    assert len(c.cfn_lint.templates) == sum(len(stacks.all()) for stacks, _ in c.synths)
    proc = c.cfn_lint.result()
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
