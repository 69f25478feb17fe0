"""Composes one environment's stacks in dependency order and attaches the quality gates."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import aws_cdk as cdk
from cdk_nag import AwsSolutionsChecks

from config import EnvironmentConfig
from config.contracts import IN_CLUSTER_PROMETHEUS_URL
from config.images import unpinned_images
from config.endpoint_spec import EndpointSpec
from k8s.workers import MetricsSource
from k8s.serving import in_cluster_node, managed_l2_plans
from stacks.cache_stack import CacheStack, L2Needs
from stacks.cluster_stack import ClusterStack
from stacks.monitoring_stack import MonitoringStack
from stacks.network_stack import NetworkStack
from stacks.observability_stack import ObservabilityStack
from stacks.serving_stack import ServingStack
from stacks.storage_stack import StorageStack


@dataclass
class EnvironmentStacks:
    network: NetworkStack
    storage: StorageStack
    cluster: ClusterStack
    cache: CacheStack | None
    observability: ObservabilityStack | None
    serving: ServingStack
    monitoring: MonitoringStack | None = None

    def all(self) -> list[cdk.Stack]:
        return [s for s in (self.network, self.storage, self.cluster, self.cache,
                            self.observability, self.serving, self.monitoring) if s is not None]


def build(app: cdk.App, cfg: EnvironmentConfig,
          endpoints: tuple[EndpointSpec, ...]) -> EnvironmentStacks:
    # Stack tags too (`@aws-cdk/core:explicitStackTags`): CloudFormation propagates them to what
    # the Tags aspect below cannot reach.
    stack_tags = {"kvcache:environment": cfg.name, **cfg.tags}
    common = {"env": cdk.Environment(account=cfg.account, region=cfg.region),
              "tags": stack_tags}
    p = cfg.stack_prefix
    network = NetworkStack(app, f"{p}-Network", cfg=cfg, **common)
    storage = StorageStack(app, f"{p}-Storage", cfg=cfg,
                           endpoint_images=tuple(s.image for s in endpoints), **common)
    observability = (ObservabilityStack(app, f"{p}-Observability", cfg=cfg, **common)
                     if cfg.observability == "managed" else None)
    cluster = ClusterStack(
        app, f"{p}-Cluster", cfg=cfg, vpc=network.vpc, **common,
        amp_workspace_arn=observability.managed.workspace.attr_arn if observability else None)
    needs = l2_needs(cfg, endpoints)
    cache = (CacheStack(app, f"{p}-Cache", cfg=cfg, vpc=network.vpc,
                        client_security_group=cluster.cluster.cluster_security_group,
                        needs=needs, cluster=cluster.cluster,
                        node_role=cluster.gpu_cluster.node_role,
                        **common)
             if needs.any else None)
    l2 = cache.cache if cache else None
    serving = ServingStack(
        app, f"{p}-Serving", cfg=cfg, endpoints=endpoints, cluster=cluster.cluster,
        model_bucket=storage.model_bucket, model_key=storage.model_key,
        l2_url=l2.url_without_credentials if l2 else None,
        l2_secret_arn=l2.auth_secret.secret_arn if l2 else None, l2_key=l2.key if l2 else None,
        router_base_image=cfg.images.uri("python"),
        metrics=(MetricsSource(observability.managed.query_url, cfg.region) if observability
                 else MetricsSource(IN_CLUSTER_PROMETHEUS_URL)),
        **common)
    monitoring = MonitoringStack(
        app, f"{p}-Monitoring", cfg=cfg, endpoints=endpoints, cluster=cluster.cluster,
        amp_workspace=observability.managed.workspace if observability else None,
        grafana_workspace=observability.managed.grafana if observability else None, **common)
    stacks = EnvironmentStacks(network, storage, cluster, cache, observability, serving,
                               monitoring=monitoring)

    for key, value in stack_tags.items():
        cdk.Tags.of(app).add(key, value)
    cdk.Validations.of(app).add_plugins(AwsSolutionsChecks(app))
    for image in unpinned_images():
        cdk.Annotations.of(serving).add_warning_v2(
            "kvcache:image-without-digest",
            f"{image.source}:{image.tag} has no digest in config/images.py: run "
            f"`python -m tools mirror --resolve --only {image.key}` and pin it")
    for spec in endpoints:  # every field we do not act on, and every guess, said at synth
        for warning in spec.warnings:
            cdk.Annotations.of(serving).add_warning_v2("kvcache:endpoint-file", warning)
    if cfg.cache.kind == "elasticache" and needs.elasticache_shards is None:
        cdk.Annotations.of(serving).add_warning_v2("kvcache:cache-not-provisioned", (
            f"cache.kind: elasticache in environment {cfg.name}, but no ElastiCache is "
            "provisioned: no endpoint's L2 uses it (none asks for an L2 with l2CacheBackend "
            "redis, or the L2 verdict left it out: the endpoint warnings say why)"))
    return stacks


def l2_needs(cfg: EnvironmentConfig, endpoints: tuple[EndpointSpec, ...]) -> L2Needs:
    """What the endpoints' L2 plans ask to be provisioned (k8s/serving.py l2_plan): the
    shards of every endpoint on ElastiCache add up; cluster mode only where all of them reach
    it by valkey:// (a rediss:// client cannot follow a cluster's redirects: one shard)."""
    managed = managed_l2_plans(cfg, endpoints) if cfg.cache.kind == "elasticache" else []
    node = in_cluster_node(cfg, endpoints)
    cluster_mode = bool(managed) and all(p.connector.cluster for p in managed)
    shards = (min(sum(p.verdict.shards for p in managed), cfg.cache.max_shards)
              if cluster_mode else 1)
    return L2Needs(elasticache_shards=shards if managed else None,
                   elasticache_cluster_mode=cluster_mode,
                   in_cluster_node_type=node.node_type if node else None)


def write_manifests(cfg: EnvironmentConfig, endpoints: tuple[EndpointSpec, ...],
                    outdir: Path) -> list[Path]:
    """Plain YAML per chart for review and GitOps, with ${...} where AWS assigns a value.

    Serving charts, then monitoring: numbered files are Kubernetes objects in apply order; the
    kube-prometheus-stack release is `helm/kube-prometheus-stack.values.yaml` (a values file,
    not an object, so a tool applying the folder skips it) and must be installed after the
    monitoring base and before the rules and dashboards, whose CRDs and sidecar it brings."""
    import cdk8s
    import yaml

    from config.contracts import MONITORING_NAMESPACE
    from config.images import CHARTS
    from k8s.monitoring import CHART_KEY, RELEASE, build_monitoring_charts, placeholder_values
    from k8s.serving import build_charts, placeholder_facts

    charts = build_charts(cdk8s.App(), cfg, endpoints, placeholder_facts(cfg, endpoints))
    monitoring = build_monitoring_charts(cdk8s.App(), cfg, endpoints)
    before_chart = [monitoring.base, monitoring.dcgm, monitoring.network_policies]
    after_chart = [c for c in (monitoring.rules, monitoring.dashboards) if c is not None]
    helm_dir = outdir / "helm"
    helm_dir.mkdir(parents=True, exist_ok=True)
    for old in (*outdir.glob("*.yaml"), *helm_dir.glob("*.yaml")):
        old.unlink()
    written = []
    for i, chart in enumerate([*charts, *before_chart, *after_chart]):
        path = outdir / f"{i:02d}-{chart.node.id}.yaml"
        path.write_text(yaml.safe_dump_all(chart.to_json(), sort_keys=False))
        written.append(path)
    repository, name = cfg.images.chart_source(CHART_KEY)
    source = (repository if repository.startswith("oci://")   # the chart ref itself
              else f"{name} --repo {repository}")
    values = helm_dir / f"{CHART_KEY}.values.yaml"
    values.write_text(
        f"# helm upgrade --install {RELEASE} {source} --version {CHARTS[CHART_KEY].version} "
        f"--namespace {MONITORING_NAMESPACE} -f {values.name}\n"
        f"# Install after {written[len(charts) + len(before_chart) - 1].name}, before "
        f"{', '.join(p.name for p in written[len(charts) + len(before_chart):]) or 'nothing else'}"
        ".\n"
        + yaml.safe_dump(placeholder_values(cfg, endpoints), sort_keys=False, width=1000))
    written.append(values)
    return written
