"""A team's own environments get every gate with no edit to tests/.

In a scratch copy of the repository, a team adds what the samples do not have, as README.md
says (its own files: an environment, an endpoint file): `prod-cn`, China under a name of its
own, on an existing private-only VPC described in its file (docs/existing-vpc.md: no public
subnet and no load balancer subnet, so each router's internal NLB takes fixed addresses in the
node subnets), the in-cluster L2 (`cache.kind: self-hosted`) that its own endpoint's L2 asks
for, beside the sample's endpoint: two models on one cluster.

The suite runs there narrowed to it (`--environment`, `-k`: the gates' parameters come from
the copy's declarations), recording its snapshots as a team does (`--snapshot-update -k
snapshot`, what `make snapshots ENV=NAME` runs). Each gate must have run on it and passed, its
snapshots must be in its own folder, and no other file of the copy may have changed. That run
starts with the session, beside the rest of it.

Beside it run the two environments of issue 42's team (tests/team_fleet.py: its own VPC
with public subnets, two regions, Llama-3.3-70B on p5 with an L2 and KEDA, gpt-oss-120b on p4d
with kvaware and request limits, both behind one Istio Gateway, its own ECR image built FROM
LMCache's) and environments drawn from the schema (tests/generated_environments.py, GENERATED
of them, seeded; `KVCACHE_GENERATED=N` draws more, `KVCACHE_GENERATED_SEED` moves the seeds):
a red gate on any of them is our bug.

`KVCACHE_MORE_ENVIRONMENTS=1` adds three more (about 10 s of CPU each, outside the suite's
budget): `team-us` (existing VPC with load balancer subnets of its own, Kubernetes 1.34, AMP, a
team endpoint's L2 on ElastiCache, an internet-facing listener, Arm system nodes, a Bottlerocket
Spot GPU group, `removalPolicy: destroy`, S3-managed encryption), `edge-eu` (a created /20,
Kubernetes 1.36, self-hosted observability in a global region, `cache.kind: none`, kvaware
routing of a Mistral endpoint) and `research` (cn-north-1, Kubernetes 1.33, ElastiCache declared
while the only L2 asked for is a team endpoint's in-cluster Valkey).
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import yaml

from config.images import image_for, lmcache_version
from config.network import existing_network, load_balancer_addresses
from k8s.l2 import in_cluster_refusal
from tests.background import Background
from tests.conftest import ROOT
from tests.generated_environments import draw, seeds, write
from tests.team_fleet import fleet

CN_ZONES = ["cn-northwest-1a", "cn-northwest-1b"]
US_ZONES = ["us-east-1a", "us-east-1b", "us-east-1c"]
CN_VPC, US_VPC = "vpc-0c1d2e3f4a5b60718", "vpc-0d1e2f3a4b5c60718"


def _subnets(kind: str, zones: list[str], cidrs: list[str]) -> list[dict]:
    return [{"subnetId": f"subnet-0{i}{kind}1a2b3c4d5e6f70", "zone": z, "cidr": c,
             "routeTableId": f"rtb-0{i}{kind}1a2b3c4d5e6f70"}
            for i, (z, c) in enumerate(zip(zones, cidrs))]


# The VPCs as their network teams describe them (docs/existing-vpc.md): a private-only
# corporate one in China (nodes in /19s, no other subnet), a standard one in us (its load
# balancers in /24s of their own).
CN_EXISTING = {"vpcId": CN_VPC, "cidr": "10.88.0.0/16",
               "privateSubnets": _subnets("a", CN_ZONES, ["10.88.0.0/19", "10.88.32.0/19"])}
US_EXISTING = {"vpcId": US_VPC, "cidr": "172.18.0.0/16",
               "privateSubnets": _subnets("e", US_ZONES,
                                          [f"172.18.{64 + 32 * i}.0/19" for i in range(3)]),
               "loadBalancerSubnets": _subnets("f", US_ZONES,
                                               [f"172.18.{i}.0/24" for i in range(3)])}
SAMPLE_ENDPOINT = "endpoints/llama-8b-intel-routing.yaml"   # ml.g5.8xlarge, L1 only
# The teams' own endpoints: other models, an image that may have an L2; where one asks for
# an L2 it is forced (the verdict would keep L1 only on an A10G or a T4).
TEAM_ENDPOINT = "endpoints/qwen-7b-l2.yaml"        # its L2 on the environment's cache
KVAWARE_ENDPOINT = "endpoints/mistral-kv.yaml"     # L1 only, kvaware routing
VALKEY_ENDPOINT = "endpoints/qwen3-tiered.yaml"    # its L2 on the in-cluster Valkey
ENDPOINTS = {
    TEAM_ENDPOINT: {"name": "qwen-7b-l2", "modelName": "Qwen2.5-7B-Instruct",
                    "instanceType": "ml.g5.12xlarge", "modelLocation": "qwen25_7b", "l2": "redis"},
    KVAWARE_ENDPOINT: {"name": "mistral-kv", "modelName": "Mistral-7B-Instruct-v0.3",
                       "instanceType": "ml.g4dn.12xlarge", "modelLocation": "mistral7b",
                       "routing": "kvaware"},
    VALKEY_ENDPOINT: {"name": "qwen3-tiered", "modelName": "Qwen3-8B",
                      "instanceType": "ml.g4dn.12xlarge", "modelLocation": "qwen3_8b",
                      "l2": "valkey"},
}
TEAM_IMAGE = "lmcache/vllm-openai:v0.5.4"
MORE = os.environ.get("KVCACHE_MORE_ENVIRONMENTS") == "1"
ALL_ENVIRONMENTS = {
    "prod-cn": {
        "account": "444444444444", "region": "cn-northwest-1", "availabilityZones": CN_ZONES,
        "kubernetesVersion": "1.35",
        "existingVpc": CN_EXISTING,
        "clusterEndpoint": {"public": False}, "adminRoleNames": ["MlPlatformAdmin"],
        "nodeGroups": {"system": {"instanceTypes": ["m6i.xlarge"], "minSize": 2, "maxSize": 4},
                       "gpu": [{"name": "a10g", "instanceTypes": ["g5.12xlarge"], "minSize": 1,
                                "maxSize": 3, "diskSizeGiB": 300}]},
        "cache": {"kind": "self-hosted"},
        "endpoints": [SAMPLE_ENDPOINT, TEAM_ENDPOINT],
        "instanceTypeMap": {"ml.g5.8xlarge": "g5.12xlarge", "ml.g5.12xlarge": "g5.12xlarge"},
        "tags": {"team": "ml-platform"},
    },
    "team-us": {
        "account": "555555555555", "region": "us-east-1", "availabilityZones": US_ZONES,
        "kubernetesVersion": "1.34",
        "existingVpc": US_EXISTING,
        "clusterEndpoint": {"public": False}, "adminRoleNames": ["MlPlatformAdmin"],
        "nodeGroups": {"system": {"instanceTypes": ["m7g.large"], "minSize": 2, "maxSize": 4,
                                  "amiType": "AL2023_ARM_64_STANDARD"},
                       "gpu": [{"name": "a10g", "instanceTypes": ["g5.12xlarge"], "minSize": 1,
                                "maxSize": 2, "diskSizeGiB": 300},
                               {"name": "t4", "instanceTypes": ["g4dn.12xlarge"], "minSize": 0,
                                "maxSize": 2, "amiType": "BOTTLEROCKET_X86_64_NVIDIA",
                                "capacityType": "SPOT"}]},
        "cache": {"kind": "elasticache", "nodeType": "cache.r7g.xlarge", "replicas": 1},
        "observability": "managed", "grafana": "none",
        "publicListener": True, "listener": {
            "certificateArn": "arn:aws:acm:us-east-1:555555555555:certificate/"
                              "0f7b1c2d-3e4f-4a5b-8c6d-7e8f9a0b1c2d",
            "sourceRanges": ["198.51.100.0/24"]},
        "removalPolicy": "destroy", "bucketEncryption": "s3-managed", "logRetentionDays": 30,
        "endpoints": [SAMPLE_ENDPOINT, TEAM_ENDPOINT],
        "instanceTypeMap": {"ml.g5.8xlarge": "g5.12xlarge", "ml.g5.12xlarge": "g5.12xlarge"},
        "alerts": {"subscriptions": [{"protocol": "email", "endpoint": "oncall@example.com"}]},
    },
    "edge-eu": {
        "account": "666666666666", "region": "eu-west-1",
        "availabilityZones": ["eu-west-1a", "eu-west-1b"], "kubernetesVersion": "1.36",
        "vpcCidr": "192.168.0.0/20", "natGateways": 2,
        "clusterEndpoint": {"public": True, "publicCidrs": ["198.51.100.0/24"]},
        "adminRoleNames": ["Ops"],
        "nodeGroups": {"system": {"instanceTypes": ["m6i.large"], "minSize": 2, "maxSize": 3},
                       "gpu": [{"name": "a10g", "instanceTypes": ["g5.12xlarge"], "minSize": 0,
                                "maxSize": 2, "diskSizeGiB": 200},
                               {"name": "t4", "instanceTypes": ["g4dn.12xlarge"], "minSize": 0,
                                "maxSize": 2, "diskSizeGiB": 200}]},
        "cache": {"kind": "none"}, "observability": "self-hosted", "ttftObjectiveSeconds": 1.0,
        "endpoints": [SAMPLE_ENDPOINT, KVAWARE_ENDPOINT],
        "instanceTypeMap": {"ml.g5.8xlarge": "g5.12xlarge"}, "tags": {"cost-center": "edge 42"},
    },
    "research": {
        "account": "777777777777", "region": "cn-north-1",
        "availabilityZones": ["cn-north-1a", "cn-north-1b"], "kubernetesVersion": "1.33",
        "vpcCidr": "10.200.0.0/16", "natGateways": 1,
        "clusterEndpoint": {"public": False}, "adminRoleNames": ["Ops"],
        "nodeGroups": {"system": {"instanceTypes": ["m5.xlarge"], "minSize": 2, "maxSize": 3},
                       "gpu": [{"name": "t4", "instanceTypes": ["g4dn.12xlarge"], "minSize": 1,
                                "maxSize": 2, "diskSizeGiB": 200}]},
        "cache": {"kind": "elasticache"},
        "endpoints": [SAMPLE_ENDPOINT, VALKEY_ENDPOINT],
        "instanceTypeMap": {"ml.g5.8xlarge": "g4dn.12xlarge"},
    },
}
ENVIRONMENTS = {k: v for k, v in ALL_ENVIRONMENTS.items() if MORE or k == "prod-cn"}
# The fleet of issue 42's team (tests/team_fleet.py), and environments drawn from the schema
# (tests/generated_environments.py: GENERATED of them, `KVCACHE_GENERATED=N` for more)
FLEET, FLEET_FILES = fleet()
ENVIRONMENTS.update(FLEET)
GENERATED_NAMES = [draw(seed)[0] for seed in seeds()]
# Every per-environment gate, by test: each must have run on each new environment and passed.
GATES = {
    "tests/stacks/test_gates.py": ["test_cdk_nag_and_cdk_validation_report_no_unacknowledged_"
                                   "findings", "test_cfn_lint_has_no_errors_or_warnings"],
    "tests/test_checkov.py": ["test_no_failed_check_outside_the_reasoned_skips"],
    "tests/stacks/test_scheduling.py": ["test_every_pod_of_the_shipped_environments_fits_a_"
                                        "node_group", "test_config_groups_match_the_templates"],
    "tests/stacks/test_deploy_order.py": ["test_every_in_cluster_object_waits_for_what_it_"
                                          "needs"],
    "tests/k8s/test_worker_gates.py": ["test_shipped_workers_reach_vllm_in_their_images_layout",
                                       "test_shipped_workers_fit_their_memory"],
    "tests/k8s/test_delivery.py": ["test_dist_yaml_is_written_valid_and_token_free"],
    "tests/k8s/test_monitoring.py": ["test_every_manifest_is_valid_at_the_cluster_version",
                                     "test_monitoring_manifests_and_values_snapshot"],
    "tests/k8s/test_lmcache_config.py": ["test_every_environments_workers_config_is_read_by_"
                                         "their_lmcache"],
    "tests/stacks/test_snapshots.py": ["test_template_snapshot"],
    "tests/stacks/test_plan.py": ["test_the_plan_lists_every_node_group_and_endpoint_of_the_"
                                  "app"],
    "tests/observability/test_delivery.py": ["test_monitoring_template_snapshot"],
    "tests/stacks/test_stacks.py": ["test_network", "test_load_balancer_subnets_hold_no_pod",
                                    "test_cluster", "test_serving_stack_applies_every_chart_"
                                    "and_grants_read_only_model_access"],
    "tests/observability/test_alert_routing.py": ["test_every_alert_reaches_the_receiver_of_"
                                                  "its_severity", "test_topic_is_encrypted_"
                                                  "subscribed_from_config_and_publishable_by_"
                                                  "the_alertmanager"],
}
_SHARED = (".venv", "node_modules", ".venv-lmcache", ".lmcache-parsers", ".venv-checkov")


def _team_endpoint(path: str) -> str:
    """A team's endpoint file: the sample's shape, its own model, name, routing and L2."""
    e = ENDPOINTS[path]
    raw = yaml.safe_load((ROOT / SAMPLE_ENDPOINT).read_text())
    raw["metadata"]["name"] = e["name"]
    spec = raw["spec"]
    spec.update(endpointName=e["name"], modelName=e["modelName"], instanceType=e["instanceType"])
    spec["modelSourceConfig"]["modelLocation"] = e["modelLocation"]
    spec["intelligentRoutingSpec"]["routingStrategy"] = e.get("routing", "prefixaware")
    if "l2" in e:
        spec["kvCacheSpec"] = {"enableL1Cache": True, "enableL2Cache": True,
                               "forceL2Cache": True, "l2CacheSpec": {"l2CacheBackend": e["l2"]}}
    spec["worker"]["image"] = TEAM_IMAGE
    return yaml.safe_dump(raw, sort_keys=False)


def _scratch_copy(dest):
    """The repository as a clone has it (tracked and untracked, not ignored), with the
    installed toolchains linked."""
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others",
                            "--exclude-standard"], cwd=ROOT, capture_output=True, check=True,
                           timeout=60).stdout.decode().split("\0")
    for rel in filter(None, files):
        src = ROOT / rel
        if src.is_file() and not src.is_symlink() and not rel.startswith(_SHARED):
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    for name in _SHARED:
        (dest / name).symlink_to((ROOT / name).resolve())


def _digests(repo: Path) -> dict[str, str]:
    """Every file of the copy outside its toolchains, by content."""
    return {str(p.relative_to(repo)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in repo.rglob("*") if p.is_file() and not p.is_symlink()
            and not str(p.relative_to(repo)).startswith((*_SHARED, "cdk.out", "dist"))
            and "__pycache__" not in p.parts}


def ALL_NEW() -> list[str]:   # noqa: N802 (reads as the constant it is)
    """Every environment the scratch copy adds: the teams' and the drawn ones."""
    return [*ENVIRONMENTS, *GENERATED_NAMES]


def _gates_run(tmp: Path) -> Background:
    """The suite in a scratch copy with the new environments, narrowed to them (a subprocess
    that starts with the session: tests/background.py)."""
    repo = tmp / "repo"
    _scratch_copy(repo)
    for path in ENDPOINTS:
        (repo / path).write_text(_team_endpoint(path))
    for path, text in FLEET_FILES.items():
        (repo / path).parent.mkdir(parents=True, exist_ok=True)
        (repo / path).write_text(text)
    for name, raw in ENVIRONMENTS.items():
        (repo / "environments" / f"{name}.json").write_text(json.dumps(raw, indent=2))
    assert [write(repo, seed) for seed in seeds()] == GENERATED_NAMES
    (tmp / "before.json").write_text(json.dumps(_digests(repo)))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "CDK_"))}
    env["PATH"] = f"{repo / '.venv' / 'bin'}:{repo / 'node_modules' / '.bin'}:{env['PATH']}"
    narrow = [arg for name in ALL_NEW() for arg in ("--environment", name)]
    # `-k snapshot` as `make snapshots` selects (a sample's snapshot test named by another
    # parameter must not lose its snapshots), and every gate of the new environments
    return Background(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *narrow,
         "-k", " or ".join(["snapshot", *ALL_NEW()]), "--snapshot-update",
         f"--junitxml={tmp / 'junit.xml'}", *sorted(GATES)],
        cwd=repo, env=env, timeout=900)


@pytest.mark.starts_early(start=_gates_run)
def test_new_environments_run_every_gate_without_touching_tests(early):
    repo, report = early.tmp / "repo", early.tmp / "junit.xml"
    proc = early.run.result()
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
    ran: dict[tuple[str, str, str], list[str]] = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        outcome = ("failed" if case.find("failure") is not None or case.find("error") is not None
                   else "skipped" if case.find("skipped") is not None else "passed")
        module = case.get("classname", "").replace(".", "/") + ".py"
        name = case.get("name", "")
        if "[" not in name:   # test_snapshots' own checks, which `-k snapshot` selects
            assert outcome == "passed", name
            continue
        (env,) = [e for e in ALL_NEW() if f"[{e}]" in name or f"-{e}]" in name
                  or f"[{e}-" in name]   # only the new environments
        ran.setdefault((module, name.split("[")[0], env), []).append(outcome)
    for module, tests in GATES.items():
        for test in tests:
            for env in ALL_NEW():
                outcomes = ran.get((module, test, env))
                # passed (a China environment has no Observability stack to snapshot: skipped)
                assert outcomes and "passed" in outcomes and "failed" not in outcomes, (
                    module, test, env, outcomes)
    # their snapshots are in their own folders, and nothing else of the copy changed
    before = json.loads((early.tmp / "before.json").read_text())
    after = _digests(repo)
    new = {p for p in after if p not in before}
    assert {p.split("/")[2] for p in new} == set(ALL_NEW()), sorted(new)
    assert all(p.startswith("environments/snapshots/") for p in new), sorted(new)
    assert {p: d for p, d in after.items() if p in before} == before
    cn = (repo / "environments/snapshots/prod-cn/test_snapshots.ambr").read_text()
    # private-only: each router's internal NLB in the node subnets, at its fixed addresses
    network = existing_network("prod-cn", CN_EXISTING, tuple(CN_ZONES))
    for path in (SAMPLE_ENDPOINT, TEAM_ENDPOINT):
        name = yaml.safe_load((repo / path).read_text())["metadata"]["name"]
        addresses = load_balancer_addresses(network, name)
        assert addresses and ",".join(addresses) in cn, (name, addresses)
    assert ",".join(s["subnetId"] for s in CN_EXISTING["privateSubnets"]) in cn
    # The in-cluster Valkey is deployed exactly where the team image's LMCache has a client
    # that passes the fault drill (k8s/l2.py CLIENT_FAULTS; LMCache 0.5.4's does not): a
    # subprocess cannot take the `sound_l2_client` fixture, so the Valkey path itself is
    # gated by the tests that take it (tests/stacks/test_scheduling.py,
    # tests/k8s/test_valkey_exporter.py).
    refused = in_cluster_refusal(lmcache_version(image_for(TEAM_IMAGE)))
    assert ("kvcache-valkey" in cn) == (refused is None), refused
