"""The fleet of a platform team leaving HyperPod (issue 42): two regions, its own VPC with public
subnets, an Istio gateway in front of both models, its own ECR worker image, Llama-3.3-70B with
an L2 and KEDA 2..6, gpt-oss-120b with kvaware and request limits of 32.

- `prod-usw2` (us-west-2): a p5 group for the 70B and a p4d group for gpt-oss.
- `prod-euc1` (eu-central-1, where the offerings table has no p5): two p4d groups, one per
  model, each endpoint naming its own by nodeAffinity.

Both route by model through the one Gateway and price their plan from the environment's own
`instancePrices`. tests/test_new_environment.py runs every gate on them.
"""
from __future__ import annotations

import copy

import yaml

from config.contracts import NODE_GROUP_LABEL
from tests.generated_environments import SEED_FILE

US_ZONES = ["us-west-2a", "us-west-2b", "us-west-2c"]
EU_ZONES = ["eu-central-1a", "eu-central-1b", "eu-central-1c"]


def _vpc(zones: list[str], second: int, ident: str) -> dict:
    def subnets(kind: str, third: int, size: int) -> list[dict]:
        return [{"subnetId": f"subnet-0{kind}{i}{ident[:14]}", "zone": z,
                 "cidr": f"10.{second}.{third + i * (1 << (24 - size))}.0/{size}",
                 "routeTableId": f"rtb-0{kind}{i}{ident[:14]}"} for i, z in enumerate(zones)]
    return {"vpcId": f"vpc-0{ident}", "cidr": f"10.{second}.0.0/16",
            "privateSubnets": subnets("a", 64, 19),
            "loadBalancerSubnets": subnets("b", 0, 24)}    # its public subnets


def _endpoint(name: str, model: str, itype: str, image: str, *, gpus: int, group: str | None,
              **spec) -> str:
    raw = yaml.safe_load(SEED_FILE.read_text())
    raw["metadata"]["name"] = name
    s = raw["spec"]
    s.update(modelName=model, instanceType=f"ml.{itype}", replicas=2,
             inferenceGateway={"enabled": True})
    s["modelSourceConfig"]["modelLocation"] = f"models/{name}"
    s["worker"]["image"] = image
    s["worker"]["args"] = ["--max-model-len=32768", f"--tensor-parallel-size={gpus}",
                           "--gpu-memory-utilization=0.9"]
    s["worker"]["resources"] = {"limits": {"nvidia.com/gpu": gpus},
                                "requests": {"cpu": "40", "memory": "400Gi",
                                             "nvidia.com/gpu": gpus}}
    if group:
        s["nodeAffinity"] = {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [
                {"key": NODE_GROUP_LABEL, "operator": "In", "values": [group]}]}]}}
    for key, value in spec.items():
        if isinstance(value, dict) and isinstance(s.get(key), dict):
            s[key] = {**s[key], **value}
        else:
            s[key] = value
    return yaml.safe_dump(raw, sort_keys=False)


def fleet() -> tuple[dict[str, dict], dict[str, str]]:
    """({environment name: its file's fields}, {endpoint file path: its text})."""
    envs, files = {}, {}
    for name, region, zones, second, ident, account, groups in (
            ("prod-usw2", "us-west-2", US_ZONES, 40, "4b1c2d3e4f5a6b7c", "888888888888",
             [("p5", "p5.48xlarge"), ("p4d", "p4d.24xlarge")]),
            ("prod-euc1", "eu-central-1", EU_ZONES, 41, "5c2d3e4f5a6b7c8d", "888888888888",
             [("p4d-llama", "p4d.24xlarge"), ("p4d-oss", "p4d.24xlarge")])):
        image = f"{account}.dkr.ecr.{region}.amazonaws.com/ml/vllm-serving:2026.11"
        big, oss = groups[0], groups[1]
        llama = f"endpoints/{name}/llama-3-3-70b.yaml"
        gpt = f"endpoints/{name}/gpt-oss-120b.yaml"
        files[llama] = _endpoint(
            "llama-3-3-70b", "Llama-3.3-70B-Instruct", big[1], image, gpus=8,
            group=big[0] if big[1] == oss[1] else None,
            kvCacheSpec={"enableL1Cache": True, "enableL2Cache": True, "forceL2Cache": True,
                         "l2CacheSpec": {"l2CacheBackend": "redis"}},
            autoScalingSpec={"minReplicaCount": 2, "maxReplicaCount": 6})
        files[gpt] = _endpoint(
            "gpt-oss-120b", "gpt-oss-120b", oss[1], image, gpus=4,
            group=oss[0] if big[1] == oss[1] else None,
            intelligentRoutingSpec={"enabled": True, "routingStrategy": "kvaware"})
        gpt_raw = yaml.safe_load(files[gpt])
        gpt_raw["spec"]["worker"]["requestLimits"] = {"maxConcurrentRequests": 32}
        gpt_raw["spec"]["kvCacheSpec"] = {"enableL1Cache": True, "enableL2Cache": False}
        files[gpt] = yaml.safe_dump(gpt_raw, sort_keys=False)
        envs[name] = {
            "account": account, "region": region, "availabilityZones": zones,
            "kubernetesVersion": "1.35",
            "existingVpc": _vpc(zones, second, ident),
            "clusterEndpoint": {"public": False}, "adminRoleNames": ["MlPlatformAdmin"],
            "nodeGroups": {
                "system": {"instanceTypes": ["m6i.2xlarge"], "minSize": 2, "maxSize": 4},
                "gpu": [{"name": g, "instanceTypes": [t], "minSize": 1,
                         "maxSize": 6 if g == big[0] else 2, "diskSizeGiB": 500}
                        for g, t in groups]},
            "cache": {"kind": "elasticache", "nodeType": "cache.r7g.xlarge", "replicas": 1},
            "observability": "managed",
            "inferenceGateway": {"gateway": {"name": "inference", "namespace": "istio-ingress"},
                                 "implementation": "istio", "routeBy": "model"},
            "endpoints": sorted(p for p in files if p.startswith(f"endpoints/{name}/")),
            "tags": {"team": "ml-platform"},
            # its image is built FROM LMCache's release image (its Dockerfile says so)
            "imageBases": {image: "lmcache/vllm-openai:v0.5.4"},
            # what no kept table prices (ElastiCache nodes), from the team's own bill
            "instancePrices": {"currency": "USD", "hourly": {"cache.r7g.xlarge": 0.437},
                               "source": "the team's 2026-11 bill"},
        }
    return copy.deepcopy(envs), files
