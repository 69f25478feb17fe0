"""Per-region facts, in one table: partition, registries, and what each region offers.

Instance and cache node offerings come from cfn-lint's region data (refreshed with each pinned
cfn-lint release) so the check does not rot as a hand-kept list would. Neither CloudFormation nor
CDK validates `AWS::EKS::Nodegroup` instance types or cache node types, so we must.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from importlib.util import find_spec
from pathlib import Path

CHINA_REGIONS = ("cn-north-1", "cn-northwest-1")

# EKS add-on and controller images (aws-load-balancer-controller etc.) are published per region
# by AWS. Source: EKS user guide "Amazon container image registries".
_EKS_ADDON_ACCOUNTS = {
    "cn-north-1": "918309763551",
    "cn-northwest-1": "961992271922",
}
_EKS_ADDON_ACCOUNT_DEFAULT = "602401143452"


@dataclass(frozen=True)
class RegionFacts:
    """What constructs need to know about a region, so none of them asks "is this China?"."""

    region: str
    partition: str
    domain_suffix: str
    china: bool

    @property
    def ecr_host_suffix(self) -> str:
        return f"dkr.ecr.{self.region}.{self.domain_suffix}"

    @property
    def eks_addon_registry(self) -> str:
        account = _EKS_ADDON_ACCOUNTS.get(self.region, _EKS_ADDON_ACCOUNT_DEFAULT)
        return f"{account}.{self.ecr_host_suffix}"

    @property
    def ec2_service_principals(self) -> tuple[str, ...]:
        """`iam:PassedToService` must name the .com.cn principal in China (IAM user guide, China partitions)."""
        if self.china:
            return ("ec2.amazonaws.com", "ec2.amazonaws.com.cn")
        return ("ec2.amazonaws.com",)

    @property
    def managed_observability(self) -> bool:
        """AMP and Amazon Managed Grafana exist in global regions only."""
        return not self.china


def region_facts(region: str) -> RegionFacts:
    china = region in CHINA_REGIONS
    return RegionFacts(
        region=region,
        partition="aws-cn" if china else "aws",
        domain_suffix="amazonaws.com.cn" if china else "amazonaws.com",
        china=china,
    )


def _cfnlint_enum(resource_dir: str, file: str) -> dict[str, tuple[str, ...]]:
    # cfn-lint's data file, found without importing cfn-lint (whose import pulls in sympy: ~1
    # CPU-s in every process that resolves an environment, for a JSON file)
    (package,) = find_spec("cfnlint").submodule_search_locations
    base = Path(package) / "data" / "schemas" / "extensions" / resource_dir / file
    data = json.loads(base.read_text())
    out = {}
    for region, value in data.items():
        values = value.get("enum", []) if isinstance(value, dict) else value
        out[region] = tuple(values)
    return out


@lru_cache(maxsize=None)
def _ec2_offerings() -> dict[str, tuple[str, ...]]:
    return _cfnlint_enum("aws_ec2_instance", "instancetype_enum.json")


@lru_cache(maxsize=None)
def _cache_offerings() -> dict[str, tuple[str, ...]]:
    return _cfnlint_enum("aws_elasticache_cachecluster", "cachenodetype_enum.json")


@lru_cache(maxsize=None)
def resource_types_in(region: str) -> frozenset[str]:
    """The CloudFormation resource types the region has (cfn-lint's per-region provider
    schemas): Amazon Managed Grafana and AMP are in some global regions only."""
    (package,) = find_spec("cfnlint").submodule_search_locations
    path = Path(package) / "data" / "schemas" / "providers" / f"{region}.json"
    return frozenset(json.loads(path.read_text())) if path.exists() else frozenset()


AMP_TYPE, GRAFANA_TYPE = "AWS::APS::Workspace", "AWS::Grafana::Workspace"


def known_regions() -> tuple[str, ...]:
    """The regions an environment may name: the commercial partition's and China's (the
    GovCloud partition, aws-us-gov, has its own ARNs, endpoints and service set, which
    nothing here models)."""
    return tuple(sorted(r for r in _ec2_offerings()
                        if r != "all" and not r.startswith("us-gov-")))


def instance_types_in(region: str) -> frozenset[str]:
    return frozenset(_ec2_offerings().get(region, ()))


def cache_node_types_in(region: str) -> frozenset[str]:
    return frozenset(_cache_offerings().get(region, ()))


def families(types: frozenset[str], prefix: str = "") -> str:
    """A short 'allowed' list for messages: the families, not hundreds of sizes."""
    fams = sorted({t.removeprefix(prefix).split(".")[0] for t in types if t.startswith(prefix)})
    return ", ".join(f"{prefix}{f}.*" for f in fams)


# ElastiCache engine versions -> their parameter group family (the L2's own group sets
# allkeys-lru, so the family must match the version exactly: `aws elasticache
# describe-cache-engine-versions`). Oldest first.
CACHE_ENGINE_FAMILIES = {
    "valkey": {"7.2": "valkey7", "8.0": "valkey8", "8.1": "valkey8", "8.2": "valkey8",
               "9.0": "valkey9", "9.1": "valkey9"},
    "redis": {"6.0": "redis6.x", "6.2": "redis6.x", "7.0": "redis7", "7.1": "redis7"},
}
# What a region offers, where it is less than every version above. Read 2026-11-27 in the
# ElastiCache developer guides: the global one (docs.aws.amazon.com/AmazonElastiCache/latest/dg/
# engine-versions.html, ParameterGroups.Engine.html) describes Valkey 7.2 to 9.1 and a valkey9
# family; the China one (docs.amazonaws.cn/en_us/AmazonElastiCache/latest/dg/
# ParameterGroups.Engine.html) lists Valkey parameter groups only to 8.2, though its
# engine-versions page describes 9.0 (and not 9.1). The L2 needs a parameter group of its own,
# so a version counts as offered only with its family: the China regions stop at 8.2 until
# `DescribeCacheEngineVersions` there lists valkey9 (`python -m tools preflight` asks, and
# says when this table is behind). Global regions are assumed to offer every version above
# (preflight asks those too). Redis OSS: 6.0 to 7.1 everywhere (both guides).
_CACHE_ENGINE_VERSIONS_IN = {
    region: {"valkey": ("7.2", "8.0", "8.1", "8.2")} for region in CHINA_REGIONS
}


def cache_engine_versions_in(region: str, engine: str) -> tuple[str, ...]:
    """The `engine` versions ElastiCache offers in `region` with their parameter group
    family, oldest first."""
    return _CACHE_ENGINE_VERSIONS_IN.get(region, {}).get(
        engine, tuple(CACHE_ENGINE_FAMILIES[engine]))


# Interface endpoints private GPU nodes need (names of CDK's InterfaceVpcEndpointAwsService
# constants, which carry the China `cn.com.amazonaws` service-name prefix where it applies).
_ENDPOINTS_EVERYWHERE = ("ECR", "ECR_DOCKER", "STS", "CLOUDWATCH_LOGS", "EC2",
                         "ELASTIC_LOAD_BALANCING", "SECRETS_MANAGER", "KMS")
_ENDPOINTS_GLOBAL_ONLY = ("EKS", "EKS_AUTH")


def interface_endpoints(facts: RegionFacts) -> tuple[str, ...]:
    """EKS and EKS Auth endpoints are not confirmed in China: traffic takes the NAT there."""
    return _ENDPOINTS_EVERYWHERE + (() if facts.china else _ENDPOINTS_GLOBAL_ONLY)
