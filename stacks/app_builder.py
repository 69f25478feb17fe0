"""Composes one environment's stacks in dependency order and attaches the quality gates."""
from __future__ import annotations

from dataclasses import dataclass

import aws_cdk as cdk
from cdk_nag import AwsSolutionsChecks

from config import EnvironmentConfig
from stacks.cache_stack import CacheStack
from stacks.cluster_stack import ClusterStack
from stacks.network_stack import NetworkStack
from stacks.observability_stack import ObservabilityStack
from stacks.storage_stack import StorageStack


@dataclass
class EnvironmentStacks:
    network: NetworkStack
    storage: StorageStack
    cluster: ClusterStack
    cache: CacheStack | None
    observability: ObservabilityStack | None

    def all(self) -> list[cdk.Stack]:
        return [s for s in (self.network, self.storage, self.cluster, self.cache,
                            self.observability) if s is not None]


def build(app: cdk.App, cfg: EnvironmentConfig) -> EnvironmentStacks:
    env = cdk.Environment(account=cfg.account, region=cfg.region)
    p = cfg.stack_prefix
    network = NetworkStack(app, f"{p}-Network", cfg=cfg, env=env)
    storage = StorageStack(app, f"{p}-Storage", cfg=cfg, env=env)
    cluster = ClusterStack(app, f"{p}-Cluster", cfg=cfg, vpc=network.vpc, env=env)
    cache = (CacheStack(app, f"{p}-Cache", cfg=cfg, vpc=network.vpc,
                        client_security_group=cluster.cluster.cluster_security_group, env=env)
             if cfg.cache.kind == "elasticache" else None)
    observability = (ObservabilityStack(app, f"{p}-Observability", cfg=cfg, env=env)
                     if cfg.observability == "managed" else None)
    stacks = EnvironmentStacks(network, storage, cluster, cache, observability)

    cdk.Tags.of(app).add("kvcache:environment", cfg.name)
    for key, value in sorted(cfg.tags.items()):
        cdk.Tags.of(app).add(key, value)
    cdk.Validations.of(app).add_plugins(AwsSolutionsChecks(app))
    return stacks
