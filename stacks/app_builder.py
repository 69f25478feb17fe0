"""Composes one environment's stacks in dependency order and attaches the quality gates."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import aws_cdk as cdk
from cdk_nag import AwsSolutionsChecks

from config import EnvironmentConfig
from config.contracts import IN_CLUSTER_PROMETHEUS_URL
from config.images import unpinned_images
from config.notices import CHANGED, CHECK, IGNORED, IMAGE_WITHOUT_DIGEST, KINDS, Notice, \
    ack_id, kind_of
from config.endpoint_spec import EndpointSpec
from k8s.serving import (
    environment_images, environment_notices, in_cluster_node, managed_l2_plans,
)
from k8s.workers import MetricsSource
from stacks.cache_stack import CacheStack, L2Needs
from stacks.cluster_stack import ClusterStack
from stacks.monitoring_stack import MonitoringStack
from stacks.network_stack import NetworkStack
from stacks.observability_stack import ObservabilityStack
from stacks.serving_stack import ServingStack
from stacks.storage_stack import StorageStack


@dataclass
class EnvironmentStacks:
    network: NetworkStack | None      # None: the environment's existing VPC
    storage: StorageStack
    cluster: ClusterStack
    cache: CacheStack | None
    observability: ObservabilityStack | None
    serving: ServingStack
    monitoring: MonitoringStack | None = None
    notices: list[str] = field(default_factory=list)   # the synth warnings (config/notices.py)

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
    network = (None if cfg.network.existing
               else NetworkStack(app, f"{p}-Network", cfg=cfg, **common))
    images = tuple(environment_images(cfg, endpoints))
    storage = StorageStack(app, f"{p}-Storage", cfg=cfg, images=images, **common)
    observability = (ObservabilityStack(app, f"{p}-Observability", cfg=cfg, **common)
                     if cfg.observability == "managed" else None)
    cluster = ClusterStack(
        app, f"{p}-Cluster", cfg=cfg, vpc=network.vpc if network else None, **common,
        amp_workspace_arn=observability.managed.workspace.attr_arn if observability else None)
    needs = l2_needs(cfg, endpoints)
    cache = (CacheStack(app, f"{p}-Cache", cfg=cfg, vpc=cluster.vpc,
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
        metrics=(MetricsSource(observability.managed.query_url, cfg.region) if observability
                 else MetricsSource(IN_CLUSTER_PROMETHEUS_URL)),
        keda_role=cluster.scaling.keda_role, l2_nodes=cache.l2_nodes if cache else None,
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
    # Every change to the request, every field we do not act on, every guess, said at synth,
    # each under the id of its kind (config/notices.py); the environment acknowledges ids.
    stacks.notices = notices(cfg, endpoints)
    annotate(serving, stacks.notices, cfg.acknowledged_warnings)
    return stacks


def annotate(scope: cdk.Stack, warnings: list[str], acknowledged: tuple[str, ...]) -> None:
    for warning in warnings:
        cdk.Annotations.of(scope).add_warning_v2(ack_id(warning), warning)
    for ack in acknowledged:
        cdk.Annotations.of(scope).acknowledge_warning(ack, "acknowledged in the environment "
                                                      "file")


def notices(cfg: EnvironmentConfig, endpoints: tuple[EndpointSpec, ...]) -> list[str]:
    """The synth warnings of an environment: the images it deploys still without a digest, the
    endpoint files' own, and the environment's."""
    deployed = environment_images(cfg, endpoints)
    unpinned = [Notice(f"{i.source}:{i.tag} has no digest in config/images.py: run `python -m "
                       f"tools mirror --resolve --only {i.key}` and pin it", CHECK,
                       IMAGE_WITHOUT_DIGEST) for i in unpinned_images() if i in deployed]
    return [*unpinned, *(w for s in endpoints for w in s.warnings),
            *environment_notices(cfg, endpoints)]


SUMMARY_FILE = "kvcache-warnings.txt"   # the summary line, in the cloud assembly (app.py)


def warning_summary(cfg: EnvironmentConfig, warnings: list[str]) -> str:
    """The line synth ends with: how many warnings of each kind are not acknowledged."""
    acked = set(cfg.acknowledged_warnings)
    open_ = [w for w in warnings if ack_id(w) not in acked]
    count = {k: sum(kind_of(w) == k for w in open_) for k in KINDS}
    changed_ids = sorted({ack_id(w) for w in open_ if kind_of(w) == CHANGED})
    text = (f"kvcache: {count[CHANGED]} change(s) to your request, {count[IGNORED]} field(s) "
            f"ignored, {count[CHECK]} to check; {len(warnings) - len(open_)} acknowledged")
    if changed_ids:
        text += (f". Changed: {', '.join(changed_ids)}: accept each in the environment "
                 "file's acknowledgedWarnings, or change the request (docs/operations.md, "
                 "Warnings)")
    return text


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
    """Plain YAML per chart for review and GitOps, with placeholders (k8s/placeholders.py)
    where AWS assigns a value; `python -m tools fill` fills them from the stacks' outputs.

    A file's name is its apply phase and its chart (`20-<endpoint>-router.yaml`): applied in
    name order, namespace and caches come first, then the endpoints, their policies, the
    monitoring base; adding or removing an endpoint adds or removes its own files and renames
    none. The kube-prometheus-stack release is `helm/kube-prometheus-stack.values.yaml` (a
    values file, not an object, so a tool applying the folder skips it), installed after the
    4x files and before the 5x ones, whose CRDs and sidecar it brings."""
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
    names = {charts[0].node.id: "00", charts[-1].node.id: "30"}
    names.update({c.node.id: "10" for c in charts[1:-1] if c.node.id.startswith("cache-")
                  and not c.node.id.endswith(("-workers", "-router"))})
    names.update({c.node.id: f"4{i}" for i, c in enumerate(before_chart)})
    names.update({c.node.id: f"5{i}" for i, c in enumerate(after_chart)})
    helm_dir = outdir / "helm"
    helm_dir.mkdir(parents=True, exist_ok=True)
    for old in (*outdir.glob("*.yaml"), *helm_dir.glob("*.yaml")):
        old.unlink()
    written = []
    for chart in [*charts, *before_chart, *after_chart]:
        path = outdir / f"{names.get(chart.node.id, '20')}-{chart.node.id}.yaml"
        assert not path.exists(), path   # two charts may not share a file
        path.write_text(yaml.safe_dump_all(chart.to_json(), sort_keys=False))
        written.append(path)
    repository, name = cfg.images.chart_source(CHART_KEY)
    source = (repository if repository.startswith("oci://")   # the chart ref itself
              else f"{name} --repo {repository}")
    values = helm_dir / f"{CHART_KEY}.values.yaml"
    values.write_text(
        f"# helm upgrade --install {RELEASE} {source} --version {CHARTS[CHART_KEY].version} "
        f"--namespace {MONITORING_NAMESPACE} -f {values.name}\n"
        "# Install after the 4x files, before the 5x ones.\n"
        + yaml.safe_dump(placeholder_values(cfg, endpoints), sort_keys=False, width=1000))
    written.append(values)
    return written
