"""A file for today's HyperPod operator (v3.7) deploys in every environment, and its pod-level
fields (tolerations, nodeAffinity, spec.kubernetes, maxDeployTimeInSeconds) do on EKS what they
do on HyperPod, under the gates our own pods pass (config/pod_fields.py)."""
from __future__ import annotations

import math

import cdk8s
import kubernetes_validate
import pytest
import yaml

from config import ConfigError, resolve_environment
from config.contracts import GPU_TAINT_KEY
from config.hyperpod_fields import FIELDS
from config.pod_fields import OUR_INIT_CONTAINERS, OUR_VOLUMES
from k8s.placeholders import token
from k8s.serving import build_charts, load_endpoints, placeholder_facts
from tests.conftest import ROOT
from tests.k8s.crds import is_custom_resource, validate_custom_resources
from tests.k8s.test_hyperpod_corpus import _corpus_env

EVERY_FIELD = ROOT / "tests" / "fixtures" / "hyperpod-today" / "every-field.yaml"
# Rows the file leaves out: another issue's (pdSpec), one place of two (autoScalingSpec), and
# this project's own apiVersion/kind/metadata rows it writes under other names.
# spec.kvCacheSpec.lmcache: the other spelling of spec.lmcache (which the file sets), accepted
# until the v3.7 CRD says which one the operator reads
NOT_IN_FILE = {"spec.pdSpec", "spec.intelligentRoutingSpec.autoScalingSpec",
               "spec.kvCacheSpec.lmcache"}


def _paths(node, prefix=""):
    if isinstance(node, dict):
        for k, v in node.items():
            path = f"{prefix}.{k}" if prefix else k
            yield path
            yield from _paths(v, path)
    elif isinstance(node, list):
        for v in node:
            yield from _paths(v, prefix + "[]")


def test_the_file_sets_every_row_of_the_table():
    paths = set(_paths(yaml.safe_load(EVERY_FIELD.read_text())))
    # pdSpec and its rows: the HyperPod docs' P/D example is held in tests/k8s/test_pd.py
    missing = [row for row in FIELDS
               if not any(row == n or row.startswith(n + ".") for n in NOT_IN_FILE)
               and not any(p == row or p.startswith(row + ".") or p.startswith(row + "[")
                           for p in paths)]
    assert missing == []


def _load(tmp_path, variant, raw=None):
    name = EVERY_FIELD.name
    ctx = _corpus_env(tmp_path, variant, [EVERY_FIELD])
    if raw is not None:
        (tmp_path / name).write_text(yaml.safe_dump(raw))
    cfg = resolve_environment(ctx)
    specs = load_endpoints(cfg, tmp_path)
    return cfg, specs


def _raw():
    return yaml.safe_load(EVERY_FIELD.read_text())


@pytest.fixture(scope="module", params=["dev", "china"])
def rendered(request, tmp_path_factory):
    cfg, specs = _load(tmp_path_factory.mktemp(request.param), request.param)
    docs = [d for c in build_charts(cdk8s.App(), cfg, specs, placeholder_facts(cfg, specs))
            for d in c.to_json()]
    return cfg, specs[0], docs


def _workers(docs):
    return next(d for d in docs if d["kind"] in ("Deployment", "StatefulSet")
                and d["metadata"]["name"] == "every-field-workers")


def test_every_field_file_synthesizes_with_strict_schemas(rendered):
    cfg, spec, docs = rendered
    for doc in docs:
        if not is_custom_resource(doc):
            kubernetes_validate.validate(doc, cfg.kubernetes_version + ".0", strict=True)
    validate_custom_resources([d for d in docs if is_custom_resource(d)])
    ignored = [w for w in spec.warnings if ": ignored:" in w]
    assert ignored and all(w.startswith("every-field.yaml: ") for w in ignored)


def test_tolerations_affinity_and_annotations_reach_the_worker_pod(rendered):
    cfg, spec, docs = rendered
    pod = _workers(docs)["spec"]["template"]
    tolerations = pod["spec"]["tolerations"]
    assert tolerations[0]["key"] == GPU_TAINT_KEY                  # ours first, then the file's
    assert {"key": "example.com/dedicated", "operator": "Equal", "value": "search",
            "effect": "NoSchedule"} in tolerations
    # a toleration for a taint no node group has: said, and harmless
    assert any("tolerations[1]" in w and "matches no node group's taint" in w
               for w in spec.warnings)
    assert not any("tolerations[0]" in w for w in spec.warnings)
    term = pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    # HyperPod's ml. type reads as the EC2 type the environment serves it on
    assert term["nodeSelectorTerms"][0]["matchExpressions"][0]["values"] == [spec.instance_type]
    # the file's, beside ours (the request-limit sidecar's config hash: the file sets limits)
    assert pod["metadata"]["annotations"].items() >= {"example.com/cost-center": "search"}.items()
    assert set(pod["metadata"]["annotations"]) - {"example.com/cost-center"} <= {
        "kvcache.io/limits-config"}
    assert any("safe-to-evict: not rendered" in w for w in spec.warnings)


def test_the_files_init_container_volumes_and_account_run_under_our_gates(rendered):
    cfg, spec, docs = rendered
    pod = _workers(docs)["spec"]["template"]["spec"]
    names = [c["name"] for c in pod["initContainers"]]
    # the file's runs after our init containers (weights staged first); only our native
    # sidecars (restartPolicy Always: they start and keep running) may follow it
    after = pod["initContainers"][names.index("warm-scratch") + 1:]
    assert names.index("stage-model") < names.index("warm-scratch")
    assert all(c.get("restartPolicy") == "Always" for c in after), after
    theirs = pod["initContainers"][names.index("warm-scratch")]
    ctx = theirs["securityContext"]
    assert ctx["runAsUser"] == 1000 and ctx["runAsNonRoot"] and not ctx["allowPrivilegeEscalation"]
    assert ctx["capabilities"] == {"drop": ["ALL"]} and theirs["resources"]["limits"]
    if cfg.facts.china:   # mirrored like the worker image
        assert theirs["image"].startswith(f"{cfg.account}.dkr.ecr.{cfg.region}.amazonaws.com.cn/")
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["scratch"] == {"name": "scratch", "emptyDir": {"sizeLimit": "1Gi"}}
    assert volumes["nvme-cache"] == {"name": "nvme-cache", "emptyDir": {}}   # not hostPath
    assert any("nvme-cache is an emptyDir" in w for w in spec.warnings)
    # the file's account is the workers' and the ServiceAccount object we make
    assert pod["serviceAccountName"] == "every-field-reader"
    assert any(d["kind"] == "ServiceAccount" and d["metadata"]["name"] == "every-field-reader"
               for d in docs)
    # the names we give ourselves are the ones config/pod_fields.py keeps files from taking
    assert {v for v in volumes if v not in ("scratch", "nvme-cache")} <= set(OUR_VOLUMES)
    assert set(names) - {"warm-scratch"} <= set(OUR_INIT_CONTAINERS)


def test_cloudwatch_triggers_are_kedas_aws_cloudwatch_scaler_with_pod_identity(rendered):
    cfg, spec, docs = rendered
    scaled = next(d for d in docs if d["kind"] == "ScaledObject")
    by_type = {}
    for t in scaled["spec"]["triggers"]:
        by_type.setdefault(t["type"], []).append(t)
    (cw,) = by_type["aws-cloudwatch"]          # the list wins over the single trigger
    assert cw["metadata"]["awsRegion"] == cfg.region
    assert (cw["metadata"]["namespace"], cw["metadata"]["metricName"],
            cw["metadata"]["targetMetricValue"]) == ("AWS/SageMaker", "ModelLatency", "500")
    auth = next(d for d in docs if d["kind"] == "TriggerAuthentication"
                and d["metadata"]["name"] == cw["authenticationRef"]["name"])
    assert auth["spec"]["podIdentity"]["provider"] == "aws"
    assert len(by_type["prometheus"]) == 1     # the file's Prometheus list, beside it


def test_a_zone_the_environment_does_not_name_gets_no_record_and_a_warning(rendered):
    _, spec, _ = rendered
    assert any("dnsConfig.hostedZoneId: Z0123456789ABCDEFGHIJ is not a zone the environment "
               "names" in w for w in spec.warnings)


def test_max_deploy_time_is_the_startup_budget(rendered):
    _, spec, docs = rendered
    container = _workers(docs)["spec"]["template"]["spec"]["containers"][0]
    probe = container["startupProbe"]
    assert spec.startup_budget_s == 2400
    assert probe["failureThreshold"] * probe["periodSeconds"] == 2400
    assert math.ceil(spec.startup_budget_s / probe["periodSeconds"]) == probe["failureThreshold"]


@pytest.mark.parametrize("change, field, allowed", [
    (lambda s: s["kubernetes"]["initContainers"][0].setdefault("securityContext", {}).update(
        privileged=True),
     "spec.kubernetes.initContainers[warm-scratch].securityContext.privileged",
     "restricted pod security"),
    (lambda s: s["kubernetes"]["initContainers"][0]["securityContext"].update(runAsUser=0),
     "spec.kubernetes.initContainers[warm-scratch].securityContext.runAsUser", "non-zero"),
    (lambda s: s["kubernetes"]["initContainers"][0].update(image="busybox:latest"),
     "spec.kubernetes.initContainers[warm-scratch].image", "pinned"),
    (lambda s: s["kubernetes"]["volumes"].append({"name": "sock", "nfs": {"server": "x"}}),
     "spec.kubernetes.volumes[2].nfs", "restricted pod security"),
    (lambda s: s["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"][0]["matchExpressions"].append(
            {"key": "node.kubernetes.io/instance-type", "operator": "In",
             "values": ["ml.p5.48xlarge"]}),
     "spec.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution", "g5.24xlarge"),
    (lambda s: s["dataCapture"]["modelPod"].update(enabled=True),
     "spec.dataCapture.modelPod.enabled", "not captured"),
    (lambda s: s["tolerations"].append({"key": "a", "operator": "Exists", "value": "b"}),
     "spec.tolerations[2].value", "Exists"),
    (lambda s: s["kubernetes"]["initContainers"][0].update(
        env=[{"name": "HF_TOKEN", "value": "hf_abc"}]),
     "spec.kubernetes.initContainers[warm-scratch].env.HF_TOKEN", "secretKeyRef"),
], ids=["privileged-init", "root-init", "latest-image", "nfs-volume", "affinity-no-group",
        "data-capture", "bad-toleration", "literal-token"])
def test_what_the_namespace_or_the_nodes_would_refuse_is_one_line_at_synth(
        tmp_path, change, field, allowed):
    raw = _raw()
    change(raw["spec"])
    with pytest.raises(ConfigError) as info:
        _load(tmp_path, "dev", raw)
    assert info.value.field == f"{EVERY_FIELD.name}: {field}"
    assert allowed in str(info.value.allowed) and "\n" not in str(info.value)
    assert "hf_abc" not in str(info.value)


def test_a_loader_of_the_model_volume_is_replaced_by_our_staging(tmp_path):
    raw = _raw()
    raw["spec"]["kubernetes"]["volumes"].append(
        {"name": "model-weights", "hostPath": {"path": "/opt/dlami/nvme/m"}})
    raw["spec"]["kubernetes"]["initContainers"].append(
        {"name": "smart-loader", "image": "public.ecr.aws/aws-cli/aws-cli:2.22.0",
         "volumeMounts": [{"name": "model-weights", "mountPath": "/model"}]})
    _, (spec,) = _load(tmp_path, "dev", raw)
    assert [c["name"] for c in spec.pod.init_containers] == ["warm-scratch"]
    assert [v["name"] for v in spec.pod.volumes] == ["scratch", "nvme-cache"]
    assert any("smart-loader" in w and "stages the weights" in w for w in spec.warnings)


def test_a_service_account_two_endpoints_share_is_refused(tmp_path):
    raw = _raw()
    raw["spec"]["kubernetes"]["serviceAccountName"] = "every-field-router"
    with pytest.raises(ConfigError) as info:
        _load(tmp_path, "dev", raw)
    assert info.value.field == f"{EVERY_FIELD.name}: spec.kubernetes.serviceAccountName"


@pytest.mark.parametrize("variant", ["dev", "china"])
def test_every_field_file_synthesizes_the_whole_app(tmp_path, variant):
    """The CDK app too: the file's service account gets the worker role's Pod Identity, and
    cdk-nag and CDK's validation pass."""
    import json

    import aws_cdk as cdk

    from stacks.app_builder import build
    ctx = _corpus_env(tmp_path, variant, [EVERY_FIELD])
    ctx["environments"][variant]["hostedZones"] = [{"id": "Z0123456789ABCDEFGHIJ",
                                                    "name": "example.com"}]
    cfg = resolve_environment(ctx)
    specs = load_endpoints(cfg, tmp_path)
    app = cdk.App(context=ctx, outdir=str(tmp_path / "cdk.out"))
    stacks = build(app, cfg, specs)
    out = tmp_path / "cdk.out"
    app.synth()
    report = json.loads((out / "validation-report.json").read_text())
    assert all(r["conclusion"] == "success" for r in report["pluginReports"])
    template = json.loads((out / f"{stacks.serving.artifact_id}.template.json").read_text())
    # the node groups carry the labels and taints the placement checks assume
    from k8s.serving import node_groups
    cluster = json.loads((out / f"{stacks.cluster.artifact_id}.template.json").read_text())
    facts = {g.name: g for g in node_groups(cfg)}
    gpu = [r["Properties"] for r in cluster["Resources"].values()
           if r["Type"] == "AWS::EKS::Nodegroup"
           and r["Properties"].get("Labels", {}).get("kvcache.io/node-role") == "gpu"]
    assert gpu
    for group in gpu:
        have = facts[group["Labels"]["kvcache.io/node-group"]]
        assert all(v in have.labels[k] for k, v in group["Labels"].items()), group["Labels"]
        assert {(t["Key"], t["Value"], t["Effect"]) for t in group["Taints"]} == {
            (k, v, e.upper().replace("NOSCHEDULE", "NO_SCHEDULE")) for k, v, e in have.taints}
    accounts = {r["Properties"]["ServiceAccount"] for r in template["Resources"].values()
                if r["Type"] == "AWS::EKS::PodIdentityAssociation"}
    assert "every-field-reader" in accounts
    # the KEDA operator may read CloudWatch: granted here, not in the cluster stack
    statements = [st for r in template["Resources"].values() if r["Type"] == "AWS::IAM::Policy"
                  for st in r["Properties"]["PolicyDocument"]["Statement"]]
    assert any(st["Action"] == "cloudwatch:GetMetricData" for st in statements)
    # the Hub's token secret where the Hub is staged from (global), none in China
    secrets = [r for r in template["Resources"].values()
               if r["Type"] == "AWS::SecretsManager::Secret"
               and "Hugging Face" in r["Properties"].get("Description", "")]
    assert len(secrets) == (0 if cfg.facts.china else 1)
    # dnsConfig: a CNAME named as the certificate, in the zone the environment names, to the
    # hostname the load balancer controller writes on the router's Service
    (record,) = [r["Properties"] for r in template["Resources"].values()
                 if r["Type"] == "AWS::Route53::RecordSet"]
    assert (record["Name"], record["Type"], record["HostedZoneId"]) == (
        "every-field.example.com.", "CNAME", "Z0123456789ABCDEFGHIJ")
    (lookup,) = [r["Properties"] for r in template["Resources"].values()
                 if r["Type"] == "Custom::AWSCDK-EKS-KubernetesObjectValue"]
    assert (lookup["ObjectName"], lookup["JsonPath"]) == (
        "every-field-router", ".status.loadBalancer.ingress[0].hostname")


def test_an_endpoints_scrape_interval_gets_jobs_of_its_own():
    """metricsScrapeIntervalSeconds: the endpoint's workers and router are scraped that often,
    by jobs whose series keep the usual job label. (Debian's promtool is built without
    Kubernetes discovery, so it cannot check these jobs; test_monitoring.py's shape checks
    apply to them as to the others.)"""
    from k8s.monitoring import scrape_configs
    from observability.metrics import ROUTERS_JOB, WORKERS_JOB
    from tests.k8s.test_monitoring import _relabel_keep

    name_label = "__meta_kubernetes_service_label_app_kubernetes_io_instance"
    jobs = scrape_configs(endpoints=("a", "b"), intervals={"a": 15, "b": 30})
    by = {j["job_name"]: j for j in jobs}
    for job in (WORKERS_JOB, ROUTERS_JOB):
        own = by[f"{job}-30s"]
        assert (own["scrape_interval"], by[job]["scrape_interval"]) == ("30s", "15s")
        assert {"target_label": "job", "replacement": job} in own["relabel_configs"]
        keep = [r for r in own["relabel_configs"] if r.get("source_labels") == [name_label]
                and r.get("action") == "keep"]
        assert [r["regex"] for r in keep] == ["b"]
        usual = [r for r in by[job]["relabel_configs"]
                 if r.get("source_labels") == [name_label] and r.get("action") == "keep"]
        assert [r["regex"] for r in usual] == ["a"]
    # every endpoint at its own interval: the usual jobs keep nothing
    alone = {j["job_name"]: j for j in scrape_configs(endpoints=("b",), intervals={"b": 5})}
    assert not _relabel_keep(alone[WORKERS_JOB], {name_label: "b"})
    assert alone[f"{WORKERS_JOB}-5s"]["scrape_timeout"] == "5s"
    # the default interval changes nothing
    assert scrape_configs(endpoints=("a",), intervals={"a": 15}) == scrape_configs(
        endpoints=("a",))


def test_a_hosted_zone_of_the_environment_is_checked_where_it_is_read(tmp_path):
    ctx = _corpus_env(tmp_path, "dev", [EVERY_FIELD])
    ctx["environments"]["dev"]["hostedZones"] = [{"id": "zone-1", "name": "example.com"}]
    with pytest.raises(ConfigError) as info:
        resolve_environment(ctx)
    assert info.value.field == "hostedZones[0]" and "Z..." in str(info.value.allowed)


def _hub_file(tmp_path, variant):
    raw = _raw()
    source = raw["spec"]["modelSourceConfig"]
    source["modelSourceType"] = "huggingface"
    source["huggingFaceModel"] = {"modelId": "org/m", "commitSHA": "a" * 40,
                                  "tokenSecretRef": {"name": "hf", "key": "token"}}
    cfg, specs = _load(tmp_path, variant, raw)
    docs = [d for c in build_charts(cdk8s.App(), cfg, specs, placeholder_facts(cfg, specs))
            for d in c.to_json()]
    return specs[0], _workers(docs)["spec"]["template"]["spec"]


class _FakeHub:
    """The Hub's download API as huggingface_hub calls it (model info, tree, resolve), on
    127.0.0.1; it records what it was asked and with which Authorization."""

    FILES = {"config.json": b'{"model_type": "llama"}', "model.safetensors": b"w" * 4096}

    def __init__(self, sha):
        import hashlib
        import json
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
        hub, self.calls = self, []

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _answer(self, head):
                hub.calls.append((self.path, self.headers.get("Authorization")))
                extra, body = [], None
                if "/tree/" in self.path:
                    body = json.dumps([{"type": "file", "path": f, "size": len(d),
                                        "oid": hashlib.sha1(d).hexdigest()}
                                       for f, d in hub.FILES.items()]).encode()
                elif self.path.startswith("/api/models/"):
                    body = json.dumps({"id": "org/m", "sha": sha, "siblings": [
                        {"rfilename": f} for f in hub.FILES]}).encode()
                elif "/resolve/" in self.path and self.path.rsplit("/", 1)[1] in hub.FILES:
                    body = hub.FILES[self.path.rsplit("/", 1)[1]]
                    extra = [("X-Repo-Commit", sha),
                             ("ETag", f'"{hashlib.sha1(body).hexdigest()}"')]
                if body is None:
                    self.send_response(404)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                self.send_response(200)
                for k, v in extra:
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if not head:
                    self.wfile.write(body)

            def do_GET(self):
                self._answer(False)

            def do_HEAD(self):
                self._answer(True)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def test_a_hub_model_is_staged_from_the_hub_with_the_token_from_secrets_manager(tmp_path):
    """Global regions: the rendered staging container, run here with huggingface_hub against
    a loopback Hub, fetches the pinned revision into the model directory, sending the token
    it reads from the file the fetch-hub-token container writes (never an env var or arg)."""
    import subprocess
    import sys

    spec, pod = _hub_file(tmp_path, "dev")
    names = [c["name"] for c in pod["initContainers"]]
    assert names.index("fetch-hub-token") < names.index("stage-model")
    fetch = pod["initContainers"][names.index("fetch-hub-token")]
    assert {"name": "SECRET_ARN", "value": token("HUB_TOKEN_SECRET_ARN")} in fetch["env"]
    stage = pod["initContainers"][names.index("stage-model")]
    assert "s3" not in " ".join(stage["command"])
    env = {e["name"]: e["value"] for e in stage["env"]}
    assert env["HUB_REVISION"] == "a" * 40 and "HF_TOKEN" not in env
    hub = _FakeHub("a" * 40)
    try:
        (tmp_path / "token").write_text("hf_test_token\n")
        run_env = {**env, "HF_ENDPOINT": hub.url, "HF_HOME": str(tmp_path / "hf"),
                   "HOME": str(tmp_path), "TARGET": str(tmp_path / "model"),
                   "HUB_TOKEN_FILE": str(tmp_path / "token"), "PATH": "/usr/bin:/bin"}
        # the image's python, here the suite's (huggingface_hub's snapshot_download with these
        # arguments is the same since 0.14)
        proc = subprocess.run([sys.executable, *stage["command"][1:]], env=run_env,
                              capture_output=True, text=True, timeout=120)
    finally:
        hub.close()
    assert proc.returncode == 0, proc.stderr[-2000:]
    for name, data in _FakeHub.FILES.items():
        assert (tmp_path / "model" / name).read_bytes() == data
    resolved = [(p, auth) for p, auth in hub.calls if "/resolve/" in p]
    assert resolved and all(f"/resolve/{'a' * 40}/" in p for p, _ in resolved)
    assert {auth for _, auth in resolved} == {"Bearer hf_test_token"}


def test_a_hub_model_in_china_is_one_line_pointing_at_upload_model(tmp_path):
    spec, pod = _hub_file(tmp_path, "china")
    stage = next(c for c in pod["initContainers"] if c["name"] == "stage-model")
    assert stage["command"][:3] == ["aws", "s3", "sync"]
    assert "fetch-hub-token" not in [c["name"] for c in pod["initContainers"]]
    (line,) = [w for w in spec.warnings if "huggingFaceModel" in w]
    assert "not reachable from China" in line and "upload-model" in line
