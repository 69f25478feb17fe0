"""Valid environments a team could write, drawn from the schema itself, seeded.

The samples are not our users: the next team brings a region, a network, node groups, a cache,
images, observability, a gateway, TLS and prices we did not list. `draw(seed)` writes one such
team's files: an environment and its endpoint files (HyperPod InferenceEndpointConfig, the
seed's shape with the team's model, type, routing, tiers, limits and image). Every choice is
drawn from what the code accepts, read where the code keeps it (regions and their offerings
from cfn-lint's data as config/regions.py reads them, GPU types from config/instances.py,
models from config/models.py, Kubernetes minors, cache kinds, gateway implementations and
routing strategies from config/), never from a list written here; the draw only keeps the
combinations the documentation calls valid (a model whose weights fit the worker's GPUs,
`efa` where the type has GPUDirect RDMA over EFA in the region, no managed observability in
China, a public listener only with a certificate and client ranges).

A red gate on a drawn environment is our bug (tests/test_new_environment.py runs every gate
on `GENERATED` of them; `KVCACHE_GENERATED=N` draws N, `KVCACHE_GENERATED_SEED` moves the
seeds). `python -m tests.generated_environments SEED` prints one.
"""
from __future__ import annotations

import copy
import ipaddress
import json
import os
import random
import string
import sys
from pathlib import Path

import yaml

from config.contracts import DEREGISTER_S_MAX, DEREGISTER_S_MIN, NODE_GROUP_LABEL
from config.endpoint_spec import L2_BACKENDS, ROUTING_POLICIES
from config.environment import CACHE_KINDS, GATEWAY_IMPLEMENTATIONS
from k8s.gateway import STRATEGY_PROFILES as GATEWAY_STRATEGIES
from config.images import IMAGES, KUBERNETES_VERSIONS
from config.instances import GPU_SHAPES, gpu_direct_efa_in, pod_share
from config.models import KNOWN_MODELS
from config.prices import region_currency
from config.network import lb_slot
from config.regions import (
    AMP_TYPE, CHINA_REGIONS, GRAFANA_TYPE, instance_types_in, known_regions, resource_types_in,
)

ROOT = Path(__file__).resolve().parents[1]
SEED_FILE = ROOT / "tests" / "fixtures" / "endpoint-seed.yaml"
GENERATED = int(os.environ.get("KVCACHE_GENERATED", "1"))
FIRST_SEED = int(os.environ.get("KVCACHE_GENERATED_SEED", "0"))
SYSTEM_FAMILIES = ("m5", "m6i", "m7i", "m6a", "c6i", "r6i", "m7g", "c7g")   # x86 and Graviton
SYSTEM_SIZES = ("xlarge", "2xlarge", "4xlarge")


def _regions() -> list[str]:
    """Regions whose offerings hold a GPU type we size and a system type."""
    out = []
    for region in known_regions():
        offered = instance_types_in(region)
        if offered & set(GPU_SHAPES) and any(f"{f}.xlarge" in offered for f in SYSTEM_FAMILIES):
            out.append(region)
    return sorted(out)


def _name(rng: random.Random, lo: int, hi: int) -> str:
    """A DNS label a team might choose: lowercase, digits and '-', starting with a letter."""
    n = rng.randint(lo, hi)
    body = "".join(rng.choice(string.ascii_lowercase + string.digits + "-") for _ in range(n - 2))
    return rng.choice(string.ascii_lowercase) + body.strip("-").replace("--", "-") + \
        rng.choice(string.ascii_lowercase + string.digits)


def _network(rng: random.Random, zones: list[str]) -> dict:
    """A created VPC, or one the team has (private-only, or with load balancer subnets)."""
    if rng.random() < 0.5:
        prefix = rng.choice((16, 18, 20))
        base = rng.choice(("10.0.0.0", "172.16.0.0", "192.168.0.0"))
        net = ipaddress.ip_network(f"{base}/{prefix}")
        if base == "10.0.0.0":     # clear of EKS's Service range 10.100.0.0/16
            net = ipaddress.ip_network(f"10.{rng.choice((20, 48, 64, 120))}.0.0/{prefix}")
        return {"vpcCidr": str(net), "natGateways": rng.randint(1, len(zones))}
    second = rng.choice((30, 48, 88, 140))
    cidr = ipaddress.ip_network(f"10.{second}.0.0/16")
    blocks = list(cidr.subnets(new_prefix=19))
    ident = "".join(rng.choice("0123456789abcdef") for _ in range(17))

    def subnets(kind: str, nets) -> list[dict]:
        return [{"subnetId": f"subnet-{kind}{i}{ident[:15]}", "zone": z, "cidr": str(n),
                 "routeTableId": f"rtb-{kind}{i}{ident[:15]}"}
                for i, (z, n) in enumerate(zip(zones, nets))]
    existing = {"vpcId": f"vpc-{ident[:17]}", "cidr": str(cidr),
                "privateSubnets": subnets("a", blocks[:len(zones)])}
    if rng.random() < 0.5:       # load balancer subnets of its own (public ones where global)
        lb = list(blocks[-1].subnets(new_prefix=24))
        existing["loadBalancerSubnets"] = subnets("b", lb[:len(zones)])
    return {"existingVpc": existing}


def _gpu_groups(rng: random.Random, region: str) -> list[dict]:
    offered = sorted(t for t in instance_types_in(region) & set(GPU_SHAPES))
    groups, names = [], set()
    for _ in range(rng.randint(1, 3)):
        itype = rng.choice(offered)
        name = f"{itype.split('.')[0].replace('-', '')}-{len(groups)}"
        names.add(name)
        group = {"name": name, "instanceTypes": [itype], "minSize": rng.randint(0, 1),
                 "maxSize": rng.randint(2, 6), "diskSizeGiB": rng.choice((200, 300, 500))}
        if rng.random() < 0.25:
            group["capacityType"] = "SPOT"
        if gpu_direct_efa_in(itype, region) and rng.random() < 0.5:
            group["efa"] = True
        groups.append(group)
    return groups


def _model_for(rng: random.Random, itype: str) -> tuple[str, int]:
    """(a model name, GPUs per worker) whose bf16 weights leave room for KV on those GPUs."""
    shape = GPU_SHAPES[itype]
    sizes = [g for g in (1, 2, 4, 8) if g <= shape.gpus and shape.gpus % g == 0]
    fits = [(m.name, g) for m in KNOWN_MODELS.values() for g in sizes
            if m.weight_bytes / 2**30 < 0.6 * g * shape.gpu_memory_gib]
    return rng.choice(sorted(fits))


def _endpoint(rng: random.Random, name: str, group: dict, groups: list[dict], account: str,
              region: str, in_china: bool, bucket_uri: str, cache_kind: str) -> dict:
    raw = yaml.safe_load(SEED_FILE.read_text())
    itype = group["instanceTypes"][0]
    model, gpus = _model_for(rng, itype)
    shape = GPU_SHAPES[itype]
    raw["metadata"]["name"] = name
    spec = raw["spec"]
    spec.update(modelName=model, instanceType=f"ml.{itype}", replicas=rng.randint(1, 2))
    spec["modelSourceConfig"]["modelLocation"] = f"models/{name}"
    spec["modelSourceConfig"]["s3Storage"]["region"] = region
    strategy = rng.choice(sorted(ROUTING_POLICIES))
    spec["intelligentRoutingSpec"]["routingStrategy"] = strategy
    l2 = rng.random() < 0.5
    spec["kvCacheSpec"] = {"enableL1Cache": rng.random() < 0.8, "enableL2Cache": l2}
    if l2:
        # lmcache-server needs a URL of the team's; redis and tieredstorage are the
        # environment's cache, which `cache.kind: none` does not have
        spec["kvCacheSpec"]["l2CacheSpec"] = {"l2CacheBackend": rng.choice(
            [b for b in L2_BACKENDS if b != "lmcache-server"
             and (cache_kind != "none" or b == "valkey")])}
    worker = spec["worker"]
    if rng.random() < 0.4:       # the team's own image, in its own ECR
        suffix = "amazonaws.com.cn" if in_china else "amazonaws.com"
        worker["image"] = f"{account}.dkr.ecr.{region}.{suffix}/ml/vllm-serving:2026.11"
    worker["args"] = [f"--max-model-len={rng.choice((8192, 16384, 32768))}",
                      f"--tensor-parallel-size={gpus}", "--gpu-memory-utilization=0.9"]
    per_node = shape.gpus // gpus
    cpu, memory = pod_share(itype, per_node)        # what each worker may take of a node
    cpu, memory = max(1, cpu // rng.choice((1, 2))), max(10, memory // rng.choice((1, 2)))
    worker["resources"] = {"limits": {"nvidia.com/gpu": gpus},
                           "requests": {"cpu": str(cpu), "memory": f"{memory}Gi",
                                        "nvidia.com/gpu": gpus}}
    if rng.random() < 0.3:
        worker["requestLimits"] = {"maxConcurrentRequests": rng.choice((8, 32, 64)),
                                   "overflowStatusCode": 429}
        # its sidecar takes 250m of the worker's request: vLLM keeps at least a CPU
        worker["resources"]["requests"]["cpu"] = str(max(2, cpu))
    if rng.random() < 0.3:
        spec["tlsConfig"] = {"tlsCertificateOutputS3Uri": f"{bucket_uri}/{name}"}
    capacity = group["maxSize"] * per_node          # what the group can hold
    # kvaware's KV event sources are a fixed list of workers: no autoscaling with it
    if rng.random() < 0.3 and capacity >= 2 and strategy != "kvaware":
        lo = rng.randint(1, min(2, capacity - 1))
        spec["autoScalingSpec"] = {"minReplicaCount": lo,
                                   "maxReplicaCount": rng.randint(lo + 1, capacity)}
    spec["replicas"] = min(spec["replicas"], capacity)
    if sum(g["instanceTypes"] == group["instanceTypes"] for g in groups) > 1:
        # another group has the type: the team names this one (k8s/serving.py endpoint_group)
        spec["nodeAffinity"] = {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [
                {"key": NODE_GROUP_LABEL, "operator": "In", "values": [group["name"]]}]}]}}
    if strategy in GATEWAY_STRATEGIES and not spec.get("pdSpec") and rng.random() < 0.4:
        spec["inferenceGateway"] = {"enabled": True}
    return raw


def draw(seed: int) -> tuple[str, dict, dict[str, str]]:
    """(environment name, its file's fields, {endpoint file path: its text}) for `seed`."""
    rng = random.Random(seed)
    name = f"gen-{seed}-{_name(rng, 3, 8)}"
    china = rng.random() < 0.35
    region = rng.choice(CHINA_REGIONS) if china else rng.choice(
        [r for r in _regions() if r not in CHINA_REGIONS])
    zones = [f"{region}{z}" for z in "abc"[:rng.randint(2, 3)]]
    account = "".join(rng.choice(string.digits[1:]) for _ in range(12))
    offered = instance_types_in(region)
    system = rng.choice(sorted(f"{f}.{s}" for f in SYSTEM_FAMILIES for s in SYSTEM_SIZES
                               if f"{f}.{s}" in offered))
    groups = _gpu_groups(rng, region)
    env: dict = {
        "account": account, "region": region, "availabilityZones": zones,
        "kubernetesVersion": rng.choice(KUBERNETES_VERSIONS),
        **_network(rng, zones),
        "clusterEndpoint": {"public": False}, "adminRoleNames": ["PlatformAdmin"],
        "nodeGroups": {"system": {"instanceTypes": [system], "minSize": 2, "maxSize": 4},
                       "gpu": groups},
        "cache": {"kind": rng.choice(CACHE_KINDS)},
        "observability": "managed" if AMP_TYPE in resource_types_in(region)
        and rng.random() < 0.5 else "self-hosted",
        "removalPolicy": rng.choice(("retain", "destroy")),
        "tags": {"team": _name(rng, 3, 10)},
    }
    if env["observability"] == "managed" and (rng.random() < 0.5 or GRAFANA_TYPE not in
                                              resource_types_in(region)):
        env["grafana"] = "none"
    if not china and rng.random() < 0.5:
        env["useEcrImages"] = True
    if rng.random() < 0.3:
        env["listener"] = {"sourceRanges": ["10.0.0.0/8"]}
    if rng.random() < 0.3:
        env.setdefault("listener", {})["deregistrationWaitSeconds"] = rng.randint(
            DEREGISTER_S_MIN, DEREGISTER_S_MAX)
    if rng.random() < 0.4:      # the team's own prices, in the region's currency
        types = sorted({g["instanceTypes"][0] for g in groups} | {system})
        env["instancePrices"] = {
            "currency": region_currency(region), "source": "the team's bill",
            "hourly": {t: round(rng.uniform(0.1, 120.0), 3)
                       for t in rng.sample(types, rng.randint(1, len(types)))}}
    bucket_uri = f"s3://{_name(rng, 5, 12)}-certs"
    endpoints: dict[str, str] = {}
    used: set[str] = set()
    slots: set[int] = set()
    for _ in range(rng.randint(1, 2)):
        group = rng.choice(groups)
        ep = _name(rng, 5, 40)
        # a private-only VPC gives each router's NLB fixed addresses by its name's slot: a
        # team whose two names share one renames (config/network.py says so in one line)
        while ep in used or ("existingVpc" in env and lb_slot(ep) in slots):
            ep = _name(rng, 5, 40)
        used.add(ep)
        slots.add(lb_slot(ep))
        raw = _endpoint(rng, ep, group, groups, account, region, china, bucket_uri,
                        env["cache"]["kind"])
        endpoints[f"endpoints/{name}/{ep}.yaml"] = yaml.safe_dump(raw, sort_keys=False)
    env["endpoints"] = sorted(endpoints)
    joining = sum("inferenceGateway" in yaml.safe_load(t)["spec"] for t in endpoints.values())
    if joining:     # the team's own gateway, which those endpoints ask to join
        env["inferenceGateway"] = {
            "gateway": {"name": "inference", "namespace": "gateway-system"},
            "implementation": rng.choice(GATEWAY_IMPLEMENTATIONS),
            "picker": {"cpu": 1, "memoryGiB": 2},
            **(rng.choice(({"routeBy": "hostname", "domain": "models.example.com"},
                           {"routeBy": "model"})) if joining > 1 else {})}
    return name, env, endpoints


def write(repo: Path, seed: int) -> str:
    """Write the drawn team's files into `repo`; its environment's name."""
    name, env, endpoints = draw(seed)
    for path, text in endpoints.items():
        (repo / path).parent.mkdir(parents=True, exist_ok=True)
        (repo / path).write_text(text)
    (repo / "environments" / f"{name}.json").write_text(json.dumps(env, indent=2) + "\n")
    return name


def seeds() -> range:
    return range(FIRST_SEED, FIRST_SEED + GENERATED)


if __name__ == "__main__":
    n, e, eps = draw(int(sys.argv[1]) if len(sys.argv) > 1 else 0)
    print(json.dumps({"name": n, "environment": e, "endpoints": eps}, indent=2))
