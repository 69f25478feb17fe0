"""Turns an environment and its endpoint files into the serving charts.

`load_endpoints` checks everything that can be wrong with the combination before jsii starts;
`build_charts` only assembles charts from facts (registry, bucket, cache connection).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Iterable

from cdk8s import ApiObject, App, Chart

from config import ConfigError, EnvironmentConfig, pod_fields
from config.bandwidth import IN_CLUSTER_NODE_TYPES
from config.environment import NodeGroupConfig
from config.contracts import (
    CACHE_PORT, IN_CLUSTER_PROMETHEUS_URL, LONGEST_REQUEST_S, SERVING_NAMESPACE,
)
from config.endpoint_spec import (
    DEFAULT_WAITING_PER_WORKER, AutoScaling, EndpointSpec, PrometheusTrigger, RoleSpec, _cores,
    _gib, arg_value, default_trigger, load_endpoint, promql_string,
)
from config.instances import gpu_shape
from config.images import (
    IMAGES, KV_EVENTS_SINCE, Image, built_from_stated, carries_glide, deployed_images,
    image_family, image_for, image_release, lmcache_version, lock_records, vllm_version,
)
from config.models import FAMILIES, RECORDED, ModelShape
from config.network import (
    check_load_balancer_slots, existing_load_balancer_subnets, load_balancer_addresses,
    router_load_balancer_cidrs,
)
from config.notices import changed
from config.regions import instance_types_in
from k8s.cache import VALKEY, CacheProps, SharedCacheChart
from k8s.l2 import (
    ELASTICACHE, GIB, GPU_MEMORY_UTILIZATION, IN_CLUSTER, MARGIN, OWN, REDIS, REDISS,
    VALKEY as VALKEY_CONNECTOR, L2Verdict, choose_in_cluster, connector_for, elasticache_server,
    gpu_kv_gib, in_cluster_host, in_cluster_refusal, in_cluster_server, l2_verdict,
    server_gbs,
)
from k8s.gateway import (
    GatewayProps, InferenceGatewayChart, InferencePoolCrdChart, gateway_check, joins_gateway,
    routes_check,
)
from k8s.pd import BODY_BYTES_PER_TOKEN, pd_verdict, refusal as pd_refusal
from k8s.certificate import dns_names
from k8s.router_front import fair_share
from k8s.lmcache_server import mp_refusal
from k8s.network_policies import NetworkPoliciesChart, NetworkPoliciesProps
from k8s.objects import pod_security_labels, standard_labels
from k8s.placeholders import token
from k8s.router import (
    POD_READINESS_GATE_LABEL, PDRouting, RouterChart, RouterProps, context_tokens,
    decode_policy, router_name,
)
from k8s.secret_fetch import ApiKey
from k8s.workers import (
    CHUNK_TOKENS, KV_BLOCK_SIZE, LMCACHE_QUIET, L2_SCHEMES, L2Connection,
    L2_IMAGES, MetricsSource, WorkerScaling, WorkerProps, WorkersChart, kv_event_endpoints,
    l1_budget, l2_refusal, limits_share_refusal, parallel_ranks, served_model_names,
    worker_urls, LIMITS_MEMORY, LIMITS_MEMORY_MIB,
    COMPONENT as WORKER_COMPONENT, PDWorker, pd_selector,
)
from config.instances import efa
from k8s.objects import selector_labels


def load_endpoints(cfg: EnvironmentConfig, root: Path) -> tuple[EndpointSpec, ...]:
    lock_records()   # a bad images.lock.json is one line here, before anything reads it
    served = tuple(t for g in cfg.gpu_node_groups for t in g.instance_types)
    specs = tuple(load_endpoint(cfg.name, f, root, f"endpoints[{i}]",
                                instance_type_map=cfg.instance_type_map,
                                node_instance_types=served)
                  for i, f in enumerate(cfg.endpoint_files))
    names = [s.name for s in specs]
    if len(set(names)) != len(names):
        raise ConfigError(cfg.name, "endpoints", names, "endpoint files with distinct names")
    check_load_balancer_slots(cfg.name, cfg.network, names)
    taken = {router_name(s.name) for s in specs}
    for s in specs:
        account = worker_service_account(s.name, s.pod.service_account)
        if account in taken:
            raise ConfigError(cfg.name, f"{s.source_file}: spec.kubernetes.serviceAccountName",
                              account, "a name no other endpoint's workers or router use "
                              "(each is bound to its own role)")
        taken.add(account)
    specs = _shared_l2_check(cfg, tuple(fit_endpoint(cfg, s) for s in specs))
    for s in specs:
        multi_process_check(cfg, s)
        gateway_check(cfg, s)
    routes_check(cfg, specs)
    return specs


def multi_process_check(cfg: EnvironmentConfig, s: EndpointSpec) -> None:
    """`lmcache.mode: MultiProcess` with an L2 the image's LMCache server cannot reach is one
    line before deploy (k8s/lmcache_server.py mp_refusal), not a server that fails at start."""
    if s.lmcache_mode != "MultiProcess":
        return
    plan = l2_plan(cfg, s)
    url = secret = None
    if plan and plan.target == OWN:
        url = s.l2_url
    elif plan and plan.target == ELASTICACHE:
        url, secret = "rediss://elasticache", True
    why = mp_refusal(s.name, url, bool(secret))
    if why:
        raise ConfigError(cfg.name, f"{s.source_file}: spec.lmcache.mode", "MultiProcess",
                          why.split("MultiProcess: ", 1)[1])


def _shared_l2_check(cfg: EnvironmentConfig, specs: tuple[EndpointSpec, ...]
                     ) -> tuple[EndpointSpec, ...]:
    """Each endpoint's verdict counted its own fleet; endpoints sharing the one in-cluster
    Valkey share its network and CPU too: say so where together they need more than it has."""
    plans = {s.name: p for s in specs if (p := l2_plan(cfg, s)) and p.target == IN_CLUSTER}
    node = in_cluster_node(cfg, specs)
    if len(plans) < 2 or node is None:
        return specs
    gpus = sum(p.verdict.gpus_reading for p in plans.values())
    share = min(server_gbs(node, 1)) / gpus
    memory = shared_valkey_gib(plans.values())
    out = []
    for s in specs:
        p = plans.get(s.name)
        if p and memory > node.memory_gib:
            s = replace(s, warnings=(*s.warnings, (
                f"{s.source_file}: spec.kvCacheSpec.workingSetTokens: the in-cluster Valkey "
                f"({node.node_type}, maxmemory {node.memory_gib:,.0f} GiB) is shared by "
                f"{len(plans)} endpoints, which together must hold {memory:,.0f} GiB: each "
                "verdict sized it for its own fleet only (cache.inClusterNodeType, or the "
                "managed L2, gives more)")))
        if p and p.verdict.need_gbs and share < MARGIN * p.verdict.need_gbs:
            s = replace(s, warnings=(*s.warnings, (
                f"{s.source_file}: spec.kvCacheSpec.enableL2Cache: the in-cluster Valkey "
                f"({node.node_type}) is shared by {len(plans)} endpoints' {gpus} GPUs: "
                f"{share:.2f} GB/s each, under {MARGIN:g}x this endpoint's break-even "
                f"({p.verdict.need_gbs:.2f} GB/s per GPU); each verdict counted its own "
                "fleet only (cache.inClusterNodeType, or the managed L2, gives more)")))
        out.append(s)
    return tuple(out)


def node_groups(cfg: EnvironmentConfig) -> tuple[pod_fields.NodeGroupFacts, ...]:
    """The environment's GPU node groups as their nodes carry them (labels, taints)."""
    return tuple(pod_fields.gpu_group_facts(g.name, g.instance_types, g.ami_type, cfg.region,
                                            cfg.availability_zones)
                 for g in cfg.gpu_node_groups)


def vllm_memory_gib(s: EndpointSpec) -> float:
    """What vLLM's container keeps of the worker's memory, which its L1 is sized from: the
    request-limit sidecar's share comes out of it (k8s/workers.py), so the pod still fits."""
    return _gib(s.memory) - (LIMITS_MEMORY_MIB / 1024 if s.request_limits else 0.0)


def endpoint_group(cfg: EnvironmentConfig, s: EndpointSpec) -> NodeGroupConfig | None:
    """The GPU node group an endpoint's workers run on: of the groups carrying its instance
    type, the first whose nodes its nodeAffinity admits (two groups of one type: the file
    names one with `kvcache.io/node-group`, docs/serving.md); the first of them otherwise."""
    groups = [g for g in cfg.gpu_node_groups if s.instance_type in g.instance_types]
    if s.node_affinity and groups:
        facts = {f.name: f for f in node_groups(cfg)}
        admitted = [g for g in groups if not pod_fields.unsatisfied(s.node_affinity,
                                                                    facts[g.name])]
        groups = admitted or groups    # none: placement_notices says so in one line
    return groups[0] if groups else None


def idle_groups(cfg: EnvironmentConfig, specs: tuple[EndpointSpec, ...]
                ) -> list[NodeGroupConfig]:
    """GPU node groups no endpoint runs on: billed at their minimum for nothing."""
    used = {g.name for s in specs if (g := endpoint_group(cfg, s))}
    return [g for g in cfg.gpu_node_groups if g.name not in used]


def placement_notices(cfg: EnvironmentConfig, s: EndpointSpec) -> list[str]:
    """The file's node affinity must let its workers onto their node group (an error, not a
    Pending pod); each toleration should be for a taint some node group has (a warning)."""
    where = f"{s.source_file}: spec"
    group = next(g for g in node_groups(cfg) if g.name == endpoint_group(cfg, s).name)
    if s.node_affinity and pod_fields.unsatisfied(s.node_affinity, group):
        labels = "; ".join(f"{k}={'|'.join(v)}" for k, v in sorted(group.labels.items()))
        raise ConfigError(cfg.name, f"{where}.nodeAffinity.requiredDuringSchedulingIgnored"
                          "DuringExecution", "no term the workers' node group satisfies",
                          f"a term the {group.name} node group's nodes satisfy (the workers "
                          f"run on {s.instance_type} there; its nodes' labels: {labels}; "
                          "node names are not known before deploy)")
    taints = {t for g in (*node_groups(cfg), *pod_fields.other_groups()) for t in g.taints}
    return [f"{where}.tolerations[{i}]: {t} matches no node group's taint "
            f"({', '.join(f'{k}={v}:{e}' for k, v, e in sorted(taints))}): it changes nothing"
            for i, t in enumerate(s.tolerations)
            if not any(pod_fields.tolerates(t, taint) for taint in taints)]


def dns_record(cfg: EnvironmentConfig, s: EndpointSpec):
    """(the environment's hosted zone, the record's name) for dnsConfig, or None: the zone the
    file names must be one the environment names; the name is customCertificateConfig's
    domainName where it lies in the zone, else <endpoint>.<zone>."""
    zone = next((z for z in cfg.hosted_zones if z.id == s.dns_zone_id), None)
    if zone is None:
        return None
    name = s.domain_name
    if not name or not (name == zone.name or name.endswith("." + zone.name)):
        name = f"{s.name}.{zone.name}"
    return zone, name


def fit_endpoint(cfg: EnvironmentConfig, s: EndpointSpec) -> EndpointSpec:
    """What can only be judged with the environment; returns the spec with its warnings."""
    where = f"{s.source_file}: spec"
    warnings = list(s.warnings)
    if s.image:     # the team's image, built FROM a catalogue one (imageBases)
        s = replace(s, image=built_from_stated(s.image, cfg.image_bases))
    if endpoint_group(cfg, s) is None:
        raise ConfigError(cfg.name, f"{where}.instanceType", s.instance_type,
                          "an instance type of one of the environment's GPU node groups: "
                          + ", ".join(t for g in cfg.gpu_node_groups for t in g.instance_types)
                          + " (or map it with the environment's instanceTypeMap)")
    if (fit := weights_fit_notice(s)) is not None:
        warnings.append(fit)
    if s.model is None and not s.l2_enabled:   # with an L2 asked, model_shape refuses instead
        warnings.append(f"{where}.modelName: {s.model_name}'s shape is not known ({FAMILIES}: "
                        "config/models.py), so nothing checks that its weights fit "
                        f"{s.gpus} GPU(s) of {s.instance_type}, nor can an L2 be judged for "
                        f"it: record its config.json (`python -m tools upload-model` writes "
                        f"{RECORDED.format(location=s.model_location)}) or name it in "
                        "spec.kvCacheSpec.modelShape")
    warnings += placement_notices(cfg, s)
    if joins_gateway(cfg, s) and s.routing_strategy == "kvaware":
        warnings.append(f"{where}.intelligentRoutingSpec.routingStrategy: kvaware on the "
                        "gateway path is the endpoint picker's prefix scoring, predicted from "
                        "its own routing history (no KV events in GAIE v1.5.0); requests "
                        "through the router keep kvaware's KV events (docs/gateway.md)")
    if s.hub and cfg.facts.china:
        warnings.append(f"{where}.modelSourceConfig.huggingFaceModel: the Hugging Face Hub is "
                        "not reachable from China: the weights are staged from the model "
                        f"bucket at <bucket>/{s.model_location}/; put them there with "
                        f"python -m tools upload-model (from a copy of {s.hub.model_id})")
        s = replace(s, hub=None)
    elif s.hub and s.hub.token:
        warnings.append(f"{where}.modelSourceConfig.huggingFaceModel.tokenSecretRef: the Hub "
                        "token is read from Secrets Manager (the serving stack's "
                        "HuggingFaceTokenSecretArn output: put the token there), not from a "
                        "Kubernetes Secret")
    if s.dns_zone_id and dns_record(cfg, s) is None:
        warnings.append(f"{where}.dnsConfig.hostedZoneId: {s.dns_zone_id} is not a zone the "
                        "environment names (hostedZones: "
                        + (", ".join(z.id for z in cfg.hosted_zones) or "none")
                        + "): no record is made; clients use the load balancer's name")
    refusal = l2_refusal_for(s)
    if refusal and not s.l2_forced:
        warnings.append(changed(
            f"{where}.kvCacheSpec.enableL2Cache: true, but no L2 is deployed for "
            f"{s.worker_image}: {refusal}. L1 stays on; {L2_IMAGES} gets the L2 "
            "(docs/serving.md, 'KV cache tiers')", s.name, "kvCacheSpec.enableL2Cache"))
    if refusal:   # forced: refused below, once the image is known to be vLLM at all
        s = replace(s, l2_enabled=False, l2_backend=None, l2_url=None)
    client = (in_cluster_refusal(lmcache_version(s.image))
              if s.l2_enabled and _shared_kind(cfg, s) else None)
    if client:    # forced too: a client that answers wrongly or never is no L2 to force
        warnings.append(changed(
            f"{where}.kvCacheSpec.l2CacheSpec.l2CacheBackend: {s.l2_backend}, but no "
            f"in-cluster L2 is deployed for {s.worker_image}: in its LMCache "
            f"{'.'.join(map(str, lmcache_version(s.image)))}, {client} "
            "(docs/upstream.md). L1 stays on",
            s.name, "kvCacheSpec.l2CacheSpec.l2CacheBackend"))
        s = replace(s, l2_enabled=False, l2_backend=None, l2_url=None)
    if s.pd is not None:
        s = _pd_fit(cfg, s, where, warnings)
    plan = l2_plan(cfg, s)
    if plan is not None:
        v = plan.verdict
        if not s.l2_forced and not v.deploys:
            need = f"{v.need_gbs:.2f}" if v.need_gbs is not None else "an unknown rate"
            warnings.append(changed(
                f"{where}.kvCacheSpec.enableL2Cache: true, but no L2 is deployed: on "
                f"{s.instance_type} ({v.gpu}) recomputing {v.model.name}'s KV at a "
                f"{v.prefix_tokens}-token prefix (kvCacheSpec.prefixTokens) moves "
                f"{need} GB/s per GPU ({shape_said(v.model)}), and an L2 must read at least "
                f"{MARGIN:g}x that; with {v.replicas} replica(s) x {v.ranks} GPU(s) reading at "
                f"once ({fleet_replicas(cfg, s)[1]}) it gets {v.deliver_gbs:.2f} GB/s per GPU, "
                f"the least of: {v.explain()}. "
                "L1 stays on. kvCacheSpec.forceL2Cache: true deploys it anyway "
                "(docs/serving.md, 'The tier configuration, and why')", s.name,
                "kvCacheSpec.enableL2Cache"))
            s = replace(s, l2_enabled=False, l2_backend=None, l2_url=None)
        else:
            warnings.append(l2_size_notice(cfg, s, plan))
            warnings.append(f"{where}.worker.image: the L2 verdict assumes {s.worker_image} "
                            f"carries {image_release(s.image).said()}")
            if s.l2_backend_asked == "tieredstorage":
                warnings.append(f"{where}.kvCacheSpec.l2CacheSpec.l2CacheBackend: tieredstorage "
                                "is HyperPod-only; the L2 is the in-cluster Valkey (bounded, "
                                "LRU), the self-hosted equivalent")
            if plan.target == ELASTICACHE and v.connector is REDISS:
                warnings.append(
                    f"{where}.kvCacheSpec.l2CacheSpec.l2CacheBackend: the environment's "
                    f"ElastiCache is reached by rediss:// (redis.asyncio, TLS, one shard, "
                    f"cluster mode off): {s.worker_image} carries no valkey-glide-sync, which "
                    f"LMCache's valkey:// (TLS, AUTH, cluster mode) needs; it reads "
                    f"{v.deliver_gbs:.2f} GB/s per GPU (the least of: {v.explain()}); an image "
                    "that adds it (config/images.py GLIDE_IMAGES) gets valkey:// and the shards "
                    "it needs")
    family = next((f for f in NOT_VLLM if f in s.image.source), None)
    if family:
        raise ConfigError(cfg.name, f"{where}.worker.image", s.worker_image,
                          f"a vLLM image carrying LMCache (vllm/vllm-openai, "
                          f"lmcache/vllm-openai, AWS DLC vllm): {NOT_VLLM[family]} cannot "
                          "hold the KV cache (HyperPod's caching and routing are vLLM-only too)")
    version = vllm_version(s.image)
    if s.routing_strategy == "kvaware":
        if version is not None and version < KV_EVENTS_SINCE:
            raise ConfigError(cfg.name, f"{where}.intelligentRoutingSpec.routingStrategy",
                              "kvaware", "prefixaware, session or roundrobin: "
                              f"{s.worker_image} carries vLLM {version[0]}.{version[1]}, which "
                              "cannot publish KV events (vLLM 0.9 or later can)")
        if version is None:
            warnings.append(f"{where}.intelligentRoutingSpec.routingStrategy: kvaware needs "
                            f"KV events (vLLM 0.9 or later); the vLLM version of "
                            f"{s.worker_image} is not known here: check it publishes them")
    if refusal and s.l2_forced:
        raise ConfigError(cfg.name, f"{where}.kvCacheSpec.forceL2Cache", True,
                          f"false (L1 only), or a worker.image whose LMCache reports a failed "
                          f"L2 read to vLLM, {L2_IMAGES}: {s.worker_image} cannot have an L2: "
                          f"{refusal}")
    # LMCache lets its LMCACHE_* variables override the rendered config file (0.3.7 and 0.5.4:
    # update_config_from_env after from_file), so a file's own LMCACHE_REMOTE_URL is an L2 too
    own = next((i for i, e in enumerate(s.worker_env) if e["name"] == "LMCACHE_REMOTE_URL"), None)
    if own is not None and (why := image_l2_refusal(s)):
        raise ConfigError(cfg.name, f"{where}.worker.environmentVariables[{own}].name",
                          "LMCACHE_REMOTE_URL", f"no LMCACHE_REMOTE_URL on {s.worker_image} "
                          f"(L1 only), or a worker.image whose LMCache reports a failed L2 read "
                          f"to vLLM, {L2_IMAGES}: the variable gives LMCache an L2 past the "
                          f"rendered config, and {why}")
    certificate = s.tls_certificate_arn
    if certificate:
        _, partition, _, region, account, _ = certificate.split(":", 5)
        if (partition, region, account) != (cfg.facts.partition, cfg.region, cfg.account):
            if cfg.listener.certificate_arn is None:
                raise ConfigError(cfg.name, f"{where}.tlsConfig.customCertificateConfig.acmArn",
                                  certificate, f"an ACM certificate of account {cfg.account} in "
                                  f"{cfg.region} (arn:{cfg.facts.partition}:acm:{cfg.region}:"
                                  f"{cfg.account}:certificate/<id>), or the environment's "
                                  "listener.certificateArn in its environment file")
            warnings.append(changed(
                f"{where}.tlsConfig.customCertificateConfig.acmArn: a certificate of {account} "
                f"in {region} cannot serve a load balancer of {cfg.account} in {cfg.region}: "
                "the environment's listener.certificateArn does", s.name, "tlsConfig"))
            certificate = None
    if image_family(s.image) is None and not s.worker_command:
        warnings.append(f"{where}.worker.image: {s.worker_image} is not an image family we "
                        "know (lmcache/vllm-openai, vllm/vllm-openai, AWS DLC vllm): the "
                        "worker starts the first `vllm` on its PATH or in /opt/venv/bin")
    if s.l1_enabled:
        budget = l1_budget(vllm_memory_gib(s), parallel_ranks(s.worker_args), s.l1_size_gib)
        if budget.l1_per_rank_gib < 1 or not budget.fits:
            need = replace(budget, l1_per_rank_gib=max(budget.l1_per_rank_gib, 1)).total_gib
            need = math.ceil(need + _gib(s.memory) - vllm_memory_gib(s))   # the sidecar's too
            raise ConfigError(cfg.name, f"{where}.worker.resources.requests.memory", s.memory,
                              f"at least {need:g}Gi: "
                              f"{budget.ranks} GPU processes each pin their own L1 "
                              f"({max(budget.l1_per_rank_gib, 1)} GiB), beside vLLM "
                              f"({budget.vllm_host_gib} GiB) and /dev/shm ({budget.shm_gib} GiB)"
                              + (f" and the request-limit sidecar ({LIMITS_MEMORY})"
                                 if s.request_limits else "")
                              + " (or a smaller kvCacheSpec.l1CacheSizeGiB)")
    # after the L1's floor, which counts the sidecar too: the larger figure is said first
    if s.request_limits and (short := limits_share_refusal(s.cpu, s.memory)):
        field, allowed = short
        raise ConfigError(cfg.name, f"{where}.worker.resources.requests.{field}",
                          s.cpu if field == "cpu" else s.memory, allowed)
    if s.l2_enabled and s.l2_backend == "lmcache-server" and s.l2_url is None:
        warnings.append(changed(
            f"{where}.kvCacheSpec.l2CacheSpec.l2CacheBackend: lmcache-server is served by the "
            "in-cluster Valkey: LMCache's own server has no eviction and makes lookups wait "
            "behind writes (docs/serving.md)", s.name, "kvCacheSpec.l2CacheSpec.l2CacheBackend"))
    if s.l2_url and not s.l2_url.startswith(L2_SCHEMES):
        warnings.append(f"{where}.kvCacheSpec.l2CacheSpec.l2CacheLocalUrl: an lm:// LMCache "
                        "server has no eviction and serializes lookups behind writes on one "
                        "socket; a Redis or Valkey URL does neither (docs/serving.md)")
    if s.image.digest is None and s.image.key not in IMAGES:
        warnings.append(f"{where}.worker.image: {s.worker_image} has no digest: pin it "
                        "(image@sha256:...; `python -m tools mirror --resolve` prints it)")
    if s.autoscaling is not None:
        scaling_path = f"{where}.autoScalingSpec"
        if s.routing_strategy == "kvaware":
            raise ConfigError(cfg.name, scaling_path, "set with kvaware",
                              "no autoScalingSpec: kvaware's KV event sources are a fixed "
                              "list of workers (or choose prefixaware/session/roundrobin)")
        capacity = worker_capacity(cfg, s)
        if s.autoscaling.max_replicas > capacity:
            group = endpoint_group(cfg, s)
            raise ConfigError(cfg.name, f"{scaling_path}.maxReplicaCount",
                              s.autoscaling.max_replicas,
                              f"at most {capacity} (node group {group.name}: maxSize "
                              f"{group.max_size} x {group.gpus_per_node // s.gpus} "
                              "workers per node)")
    if (s.l2_enabled and s.l2_url is None and _shared_kind(cfg, s) is None
            and any(e["name"] == LMCACHE_QUIET[0] for e in s.worker_env)):
        raise ConfigError(cfg.name, f"{where}.worker.environmentVariables",
                          LMCACHE_QUIET[0], "no LMCACHE_LOG_LEVEL with the managed L2: "
                          "LMCache logs its URL, with the AUTH token, below WARNING")
    if s.l2_enabled and s.l2_url is None and s.l2_backend == "redis" \
            and cfg.cache.kind == "none":
        raise ConfigError(cfg.name, f"{where}.kvCacheSpec.l2CacheSpec.l2CacheBackend",
                          "redis", "no L2 (enableL2Cache: false), valkey, lmcache-server or an "
                          "l2CacheLocalUrl: the environment's cache.kind is none")
    return replace(s, warnings=tuple(warnings), tls_certificate_arn=certificate)


def _pd_fit(cfg: EnvironmentConfig, s: EndpointSpec, where: str, warnings: list[str]
            ) -> EndpointSpec:
    """k8s/pd.py's verdict on the endpoint's pdSpec: kept where it renders, dropped (colocated,
    one warning naming the failing term) where it does not."""
    assert s.pd is not None
    v = pd_verdict(instance_type=s.instance_type, region=cfg.region, model=s.model,
                   image=s.image, vllm=image_release(s.image).vllm,
                   prefix_tokens=s.prefix_tokens, strategy=s.routing_strategy,
                   node_group=(group.name, group.efa)
                   if (group := endpoint_group(cfg, s)) else None)
    if not v.renders(s.pd.forced):
        warnings.append(changed(pd_refusal(v, where, s.pd.forced), s.name, "pdSpec"))
        return replace(s, pd=None)
    warnings.append(f"{where}.pdSpec: disaggregated ({s.pd.prefill.replicas} prefill x "
                    f"{s.pd.prefill.gpus} GPUs, {s.pd.decode.replicas} decode x "
                    f"{s.pd.decode.gpus} GPUs; routingThreshold {s.pd.routing_threshold}: "
                    + (f"bodies under {s.pd.routing_threshold * BODY_BYTES_PER_TOKEN:,} bytes "
                       "go to a decode worker alone" if s.pd.routing_threshold else
                       "every request") + f"): {v.explain()}"
                    + ("; forced (pdSpec.forceDisaggregation)" if not v.renders() else "")
                    + "; routed by vllm-router's P/D mode (the one router here that speaks "
                    "vLLM's NIXL protocol)")
    context = context_tokens(s.worker_args).get("context_tokens")
    if context and s.pd.routing_threshold > context:
        warnings.append(f"{where}.pdSpec.routingThreshold: {s.pd.routing_threshold} is above "
                        f"the model's context ({context} tokens, --max-model-len): no request "
                        "is disaggregated")
    if s.l2_enabled:
        warnings.append(changed(f"{where}.kvCacheSpec.enableL2Cache: no L2 on a disaggregated "
                                "endpoint: LMCache's L2 beside NIXL in vLLM's MultiConnector is "
                                "not proven on a GPU here; L1 stays on the prefill workers",
                                s.name, "kvCacheSpec.enableL2Cache"))
        s = replace(s, l2_enabled=False, l2_backend=None, l2_url=None)
    if s.autoscaling is not None:
        warnings.append(changed(f"{where}.autoScalingSpec: ignored on a disaggregated endpoint: "
                                "pdSpec.autoScalingSpec.prefillAutoScaling and "
                                "decodingAutoScaling scale each role", s.name, "autoScalingSpec"))
        s = replace(s, autoscaling=None)
    group = endpoint_group(cfg, s)
    prefill = s.pd.prefill
    budget = l1_budget(_gib(prefill.memory), parallel_ranks(prefill.args), s.l1_size_gib)
    if s.l1_enabled and (budget.l1_per_rank_gib < 1 or not budget.fits):
        raise ConfigError(cfg.name, f"{where}.pdSpec.prefillSpec.resources.requests.memory",
                          prefill.memory, f"room for L1 on the prefill workers: {budget.ranks} "
                          f"GPU processes each pin their own L1 beside vLLM "
                          f"({budget.vllm_host_gib} GiB) and /dev/shm ({budget.shm_gib} GiB) "
                          "(or kvCacheSpec.enableL1Cache: false)")
    for r in s.pd.roles:
        if r.autoscaling and r.autoscaling.max_replicas * r.gpus > group.max_size * group.gpus_per_node:
            raise ConfigError(cfg.name, f"{where}.pdSpec.autoScalingSpec", r.autoscaling.max_replicas,
                              f"at most {group.max_size * group.gpus_per_node // r.gpus} {r.role} "
                              f"workers (node group {group.name}: maxSize {group.max_size})")
    return s


def role_scaling(s: EndpointSpec, role: RoleSpec) -> AutoScaling | None:
    """A role's KEDA spec; its default trigger counts that role's pods' waiting requests."""
    spec = role.autoscaling
    if spec is None or spec.triggers:
        return spec
    query = (f"sum(vllm:num_requests_waiting{{model_name={promql_string(s.model_name)},"
             f'pod=~"{s.name}-{role.role}-.+"}})')
    return replace(spec, triggers=(PrometheusTrigger(query, DEFAULT_WAITING_PER_WORKER,
                                                     name=f"{role.role}-waiting-requests"),))


def l2_size_notice(cfg: EnvironmentConfig, s: EndpointSpec, plan: "L2Plan") -> str:
    """What the L2 holds, why, and (in the cluster) what its node costs beside the GPUs."""
    v = plan.verdict
    where = f"{s.source_file}: spec.kvCacheSpec.workingSetTokens"
    if plan.target == OWN or v.server is None:
        return (f"{where}: the L2 is the endpoint's own ({s.l2_url}): size it to hold "
                f"{v.capacity_gib:,.0f} GiB of KV ({v.size_reason()}, for {v.replicas} "
                f"replica(s): {fleet_replicas(cfg, s)[1]})")
    if plan.target == IN_CLUSTER:
        node = v.server.node_type
        prices = cfg.prices()
        price, gpu_price = prices.get(node), prices.get(s.instance_type)
        shape = gpu_shape(s.instance_type)
        instances = math.ceil(v.replicas * s.gpus / shape.gpus) if shape else v.replicas
        cost = (f", {prices.said(price)}/h on demand" if price else
                f", its {prices.currency} price unknown (instancePrices)") + (
            f": {price / (instances * gpu_price):.0%} of the {instances} x {s.instance_type} "
            f"it serves ({prices.said(instances * gpu_price)}/h)"
            if price and gpu_price else "") + (
            f" (prices: {'; '.join(prices.sources)})" if price else "")
        what = f"the in-cluster Valkey on a {node} of its own{cost}"
    else:
        what = (f"ElastiCache: {v.shards} shard(s) of {v.server.node_type}, each with "
                f"{cfg.cache.replicas} replica(s)")
    line = (f"{where}: the L2 is {what}; it keeps {min(v.kv_gib, 1e9):,.0f} GiB of KV and must "
            f"hold {v.size_reason()}, for {v.replicas} replica(s) "
            f"({fleet_replicas(cfg, s)[1]})")
    if (s.working_set_tokens and v.working_set_gib <= v.fleet_gib
            and s.routing_strategy != "roundrobin"):
        line += (f"; with {s.routing_strategy} routing each prefix stays on one replica, whose "
                 "GPU and L1 hold a working set this small: the L2 serves what routing moves "
                 "(scale-out, restarts, load spilled to another replica)")
    return line + f"; the model: {shape_said(v.model)} (docs/serving.md, 'How big the L2 is')"


@dataclass(frozen=True)
class L2Plan:
    """Where an endpoint's L2 is, how LMCache reaches it, and the verdict on it."""

    target: str              # k8s/l2.py IN_CLUSTER, ELASTICACHE or OWN
    verdict: L2Verdict

    @property
    def connector(self):
        return self.verdict.connector


def model_shape(cfg: EnvironmentConfig, s: EndpointSpec) -> ModelShape:
    """The endpoint's model shape (config/models.py), its KV in the dtype the args ask vLLM
    for (--kv-cache-dtype fp8: a byte), or one line naming what to provide."""
    if s.model is not None:
        kv_dtype = arg_value(s.worker_args, "--kv-cache-dtype") or "auto"
        if kv_dtype.startswith("fp8") and s.model.dtype_bytes != 1:
            return replace(s.model, dtype_bytes=1,
                           weight_bits=s.model.weight_bits or 8 * s.model.dtype_bytes)
        return s.model
    raise ConfigError(cfg.name, f"{s.source_file}: spec.modelName", s.model_name,
                      f"a model whose shape we know ({FAMILIES}: config/models.py), or its "
                      "config.json: `python -m tools upload-model` records it at "
                      f"{RECORDED.format(location=s.model_location)}, or "
                      "spec.kvCacheSpec.modelShape names a copy of it in the repository "
                      "(the L2 verdict needs the model's layers, heads and sizes)")


def gpu_memory_utilization(s: EndpointSpec) -> float:
    """vLLM's share of each GPU: the args' --gpu-memory-utilization, else vLLM's default."""
    given = arg_value(s.worker_args, "--gpu-memory-utilization")
    return (float(given) if given and given.replace(".", "", 1).isdigit()
            else GPU_MEMORY_UTILIZATION)


def weights_fit_notice(s: EndpointSpec) -> str | None:
    """Where the model's weights alone fill vLLM's share of the worker's GPUs, vLLM cannot
    start: say so at synth (a warning: a checkpoint may be smaller than its shape's dtype)."""
    shape = gpu_shape(s.instance_type)
    if s.model is None or shape is None or arg_value(s.worker_args, "--quantization"):
        return None
    ranks, utilization = parallel_ranks(s.worker_args), gpu_memory_utilization(s)
    if gpu_kv_gib(s.instance_type, s.model, ranks, utilization) > 0:
        return None
    room = ranks * shape.gpu_memory_gib * utilization
    return (f"{s.source_file}: spec.worker.resources.limits.nvidia.com/gpu: {s.model.name}'s "
            f"weights ({s.model.weight_bytes / GIB:,.0f} GiB; {shape_said(s.model)}) fill "
            f"the {room:,.0f} GiB vLLM may use of {ranks} GPU(s) of {s.instance_type} "
            f"(--gpu-memory-utilization {utilization:g}): vLLM cannot start; give each worker "
            "more GPUs (and --tensor-parallel-size), or serve a quantized checkpoint")


def shape_said(model: ModelShape) -> str:
    """The shape a verdict used, and where it comes from, as a synth line says it."""
    return (f"{model.name}: {model.kv_bytes_per_token / 1024:g} KiB of KV per token, "
            f"{model.params / 1e9:.1f}B parameters, from {model.source}")


def image_l2_refusal(s: EndpointSpec) -> str | None:
    """Why the endpoint's worker image may not have an L2 at all; None where it may."""
    release = image_release(s.image) if s.image else None
    return l2_refusal(release.vllm if release else None, release.lmcache if release else None)


def l2_refusal_for(s: EndpointSpec) -> str | None:
    """Why the endpoint's worker image may not have the L2 it asks for; None where it may
    (or asks for none)."""
    return image_l2_refusal(s) if s.l2_enabled else None


def reads_managed_l2(cfg: EnvironmentConfig, s: EndpointSpec) -> bool:
    """Does the endpoint's worker read the environment's ElastiCache (and so its AUTH token)?
    Not where its L2 is the in-cluster Valkey, its own URL, refused or absent."""
    plan = l2_plan(cfg, s)
    return plan is not None and plan.target == ELASTICACHE


def l2_plan(cfg: EnvironmentConfig, s: EndpointSpec) -> L2Plan | None:
    """The L2 an endpoint asking for one would get, and whether it pays (k8s/l2.py), for its
    largest fleet (fleet_replicas), every replica reading at once. None where it asks for
    none or its image may not have one."""
    if not s.l2_enabled or l2_refusal_for(s):
        return None
    target = OWN if s.l2_url else IN_CLUSTER if _shared_kind(cfg, s) else ELASTICACHE
    connector = ((REDISS if s.l2_url.startswith("rediss://") else REDIS) if target == OWN else
                 connector_for(target, lmcache_version(s.image), carries_glide(s.image)))
    ranks = parallel_ranks(s.worker_args)
    replicas, _ = fleet_replicas(cfg, s)
    l1 = l1_budget(vllm_memory_gib(s), ranks, s.l1_size_gib).l1_per_rank_gib if s.l1_enabled else 0
    model = model_shape(cfg, s)
    gpu = gpu_kv_gib(s.instance_type, model, ranks, gpu_memory_utilization(s))
    args = dict(instance_type=s.instance_type, model=model,
                ranks=ranks, replicas=replicas,
                fleet_gib=replicas * (gpu + ranks * l1),
                working_set_gib=(s.working_set_tokens * model.kv_bytes_per_token / GIB
                                 if s.working_set_tokens else None),
                chunk_tokens=CHUNK_TOKENS,
                connector=connector, prefix_tokens=s.prefix_tokens,
                cpu_per_rank=_cores(s.cpu) / ranks)
    if target == IN_CLUSTER:
        verdict = choose_in_cluster(instance_types_in(cfg.region),
                                    cfg.cache.in_cluster_node_type, **args)
    elif target == ELASTICACHE and cfg.cache.kind == "elasticache":
        shards = cfg.cache.max_shards if connector is VALKEY_CONNECTOR else 1
        verdict = l2_verdict(server=elasticache_server(cfg.cache.node_type, shards), **args)
    else:
        verdict = l2_verdict(server=None, **args)
    return L2Plan(target, verdict)


# Image repositories known not to be vLLM: their files cannot get the KV cache.
NOT_VLLM = {"djl-inference": "DJL Serving (LMI)", "tgi-inference": "TGI",
            "text-generation-inference": "TGI", "tensorrt-llm": "TensorRT-LLM"}


def effective_scaling(cfg: EnvironmentConfig, s: EndpointSpec) -> AutoScaling | None:
    """The file's autoScalingSpec, its triggers defaulting to waiting requests per worker; None
    without one: as on HyperPod, `replicas` alone is exactly that many workers, no autoscaler.
    kvaware keeps a fixed worker set (fit_endpoint refuses an autoScalingSpec with it)."""
    if s.routing_strategy == "kvaware" or s.autoscaling is None:
        return None
    spec = s.autoscaling
    if not spec.triggers and not spec.cloudwatch:   # the file's CloudWatch triggers alone
        spec = replace(spec, triggers=(default_trigger(s.model_name),))
    return spec


def per_source_requests(cfg: EnvironmentConfig, s: EndpointSpec) -> int | None:
    """With request limits: what one client address may have in flight through the router pod
    (router_front.fair_share of the slots at the fewest workers the endpoint runs)."""
    limits = s.request_limits
    if limits is None:
        return None
    scaling = effective_scaling(cfg, s)
    fewest = scaling.min_replicas if scaling else s.replicas
    return fair_share((limits.max_concurrent + limits.max_queue) * max(1, fewest))


def fleet_replicas(cfg: EnvironmentConfig, s: EndpointSpec) -> tuple[int, str]:
    """The workers the L2 and the cost are computed for, and why that many: the file's
    `replicas` where they are all that will run, autoScalingSpec's maximum where it scales."""
    scaling = effective_scaling(cfg, s)
    if scaling is None:
        return s.replicas, "spec.replicas, no autoScalingSpec: no autoscaler"
    return scaling.max_replicas, "autoScalingSpec.maxReplicaCount, the autoscaler's maximum"


def worker_capacity(cfg: EnvironmentConfig, s: EndpointSpec) -> int:
    group = endpoint_group(cfg, s)
    return group.max_size * (group.gpus_per_node // s.gpus)


@dataclass(frozen=True)
class ServingFacts:
    """What the charts need from AWS, as plain strings (CloudFormation tokens in the stack,
    readable placeholders in the GitOps YAML)."""

    router_image: str
    model_bucket: str
    managed_l2: L2Connection | None
    service_account: dict[str, str]   # endpoint -> worker service account name
    metrics: MetricsSource            # what KEDA queries
    api_key_secret_arn: str | None = None   # the endpoints' API key (Secrets Manager)
    load_balancer_subnets: str | None = None   # the NLBs' subnet ids, comma-separated
    hub_token_secret_arn: str | None = None    # the Hugging Face Hub token (Secrets Manager)


def worker_service_account(endpoint: str, given: str | None = None) -> str:
    """The workers' service account: the file's (spec.kubernetes.serviceAccountName) or ours;
    Pod Identity binds it to the worker role either way."""
    return given or f"{endpoint}-worker"


def placeholder_facts(cfg: EnvironmentConfig, specs: tuple[EndpointSpec, ...]) -> ServingFacts:
    """Placeholders (k8s/placeholders.py) where AWS assigns the value at deploy (the stacks'
    outputs): for the GitOps YAML, and wherever charts are rendered without a CDK app. What
    config already knows (an existing VPC's load balancer subnets) is written as it is."""
    lb_subnets = (existing_load_balancer_subnets(cfg.network) if cfg.network.existing
                  else token("LB_SUBNETS"))
    return ServingFacts(
        router_image=cfg.images.uri("router"), model_bucket=token("MODEL_BUCKET"),
        managed_l2=(L2Connection(url=f"rediss://{token('L2_ENDPOINT')}:{CACHE_PORT}",
                                 secret_arn=token("L2_SECRET_ARN"))
                    if cfg.cache.kind == "elasticache" else None),
        service_account={s.name: worker_service_account(s.name, s.pod.service_account)
                         for s in specs},
        metrics=(MetricsSource(token("AMP_QUERY_URL"), cfg.region)
                 if cfg.observability == "managed" else MetricsSource(IN_CLUSTER_PROMETHEUS_URL)),
        api_key_secret_arn=token("API_KEY_SECRET_ARN"), load_balancer_subnets=lb_subnets,
        hub_token_secret_arn=token("HUB_TOKEN_SECRET_ARN") if needs_hub_token(specs) else None)


def needs_hub_token(specs: tuple[EndpointSpec, ...]) -> bool:
    """An endpoint stages a gated or private model from the Hub (fit_endpoint dropped the Hub
    in China)."""
    return any(s.hub and s.hub.token for s in specs)


def build_charts(app: App, cfg: EnvironmentConfig, specs: tuple[EndpointSpec, ...],
                 facts: ServingFacts) -> list[Chart]:
    images = cfg.images
    ns = Chart(app, "namespace")
    ApiObject(ns, "Namespace", api_version="v1", kind="Namespace", metadata={
        "name": SERVING_NAMESPACE, "labels": {
            **standard_labels("serving", cfg.name),
            # every serving pod runs non-root, read-only, seccomp'd, without capabilities
            # (a disaggregated endpoint's workers add IPC_LOCK, which only `privileged`
            # admits: then enforce that, audit and warn on restricted: docs/security.md)
            **pod_security_labels("privileged" if any(s.pd for s in specs) else "restricted",
                                  cfg.kubernetes_version, "restricted"),
            # the load balancer controller gates router pods on their NLB target health
            POD_READINESS_GATE_LABEL: "enabled"}})
    charts: list[Chart] = [ns]
    if any(joins_gateway(cfg, s) for s in specs) and cfg.inference_gateway.install_crd:
        crd = InferencePoolCrdChart(app, "inference-pool-crd")   # before any pool
        crd.add_dependency(ns)
        charts.append(crd)
    api_key = (ApiKey(facts.api_key_secret_arn, cfg.region, images.uri("aws-cli"))
               if facts.api_key_secret_arn else None)
    shared: dict[str, CacheProps] = {}
    node = in_cluster_node(cfg, specs)
    for kind in sorted({_shared_kind(cfg, s) for s in specs} - {None}):
        assert node is not None
        host = in_cluster_host(node.node_type)
        props = CacheProps.on_node(SERVING_NAMESPACE, images.uri(VALKEY), host.vcpus, host.gib,
                                   node.threads, exporter_image=images.uri("redis-exporter"))
        shared[kind] = props
        chart = SharedCacheChart(app, f"cache-{kind}", props=props)
        chart.add_dependency(ns)
        charts.append(chart)
    for s in specs:
        l2 = None
        plan = l2_plan(cfg, s)
        if plan and plan.target == OWN:
            l2 = L2Connection(url=s.l2_url)
        elif plan and plan.target == ELASTICACHE:
            l2 = connection(plan, facts.managed_l2) if facts.managed_l2 else None
        elif plan:
            l2 = connection(plan, L2Connection(url=shared[_shared_kind(cfg, s)].url))
        kvaware = s.routing_strategy == "kvaware"
        budget = l1_budget(vllm_memory_gib(s), parallel_ranks(s.worker_args), s.l1_size_gib)
        wp = WorkerProps(
            endpoint=s.name, namespace=SERVING_NAMESPACE,
            service_account=facts.service_account[s.name],
            image=images.resolve(s.image), port=s.port, command=s.worker_command,
            working_dir=s.working_dir,
            staging_image=images.uri("aws-cli"), region=cfg.region,
            model_bucket=facts.model_bucket, model_location=s.model_location,
            model_name=s.model_name, replicas=s.replicas, gpus=s.gpus, cpu=s.cpu,
            memory=s.memory, node_group=endpoint_group(cfg, s).name,
            l1_enabled=s.l1_enabled, l1_size_gib=budget.l1_per_rank_gib, l2=l2,
            family=image_family(s.image), lmcache=lmcache_version(s.image),
            vllm=image_release(s.image).vllm,
            ranks=budget.ranks, shm_gib=budget.shm_gib,
            publish_kv_events=kvaware, health_check_path=s.health_check_path,
            model_mount_path=s.model_mount_path, extra_args=s.worker_args,
            extra_env=s.worker_env, stateful=kvaware,
            scaling=(WorkerScaling(scaling, facts.metrics)
                     if (scaling := effective_scaling(cfg, s)) else None),
            api_key=api_key, tolerations=s.tolerations, node_affinity=s.node_affinity,
            pod_annotations=s.pod.annotations, extra_volumes=s.pod.volumes,
            extra_init=tuple({**c, "image": images.resolve(image_for(c["image"]))}
                             for c in s.pod.init_containers),
            startup_budget_s=s.startup_budget_s, hub=s.hub,
            hub_token_arn=facts.hub_token_secret_arn if s.hub and s.hub.token else None,
            request_limits=s.request_limits,
            sidecar_image=facts.router_image if s.request_limits else None,
            lmcache_mode=s.lmcache_mode)
        if s.pd is not None:
            roles = _pd_charts(app, s, wp, facts.metrics)
            workers = roles[0]
        else:
            roles = [workers := WorkersChart(app, f"{s.name}-workers", props=wp)]
        router = RouterChart(app, f"{s.name}-router", props=replace(RouterProps(
            endpoint=s.name, namespace=SERVING_NAMESPACE, image=facts.router_image,
            policy=s.router_policy, implementation=cfg.router_implementation(s.routing_strategy),
            worker_selector=workers.selector, worker_port=wp.router_port,
            health_check_path=s.health_check_path, public_listener=cfg.public_listener,
            static_workers=worker_urls(wp) if kvaware else (),
            kv_event_sources=tuple(zip(worker_urls(wp), kv_event_endpoints(wp)))
            if kvaware else (),
            kv_event_block_size=KV_BLOCK_SIZE, model_name=s.model_name, api_key=api_key,
            served_models=served_model_names(wp),
            metrics=facts.metrics,
            max_workers=scaling.max_replicas if scaling else s.replicas,
            **context_tokens(s.worker_args),
            tls_certificate_arn=s.tls_certificate_arn or cfg.listener.certificate_arn,
            **generated_tls(cfg, s),
            source_ranges=cfg.listener.source_ranges,
            load_balancer_subnets=facts.load_balancer_subnets,
            load_balancer_cidrs=router_load_balancer_cidrs(cfg.network, s.name),
            deregister_s=cfg.listener.deregistration_wait_s,
            overflow_status=s.request_limits.status if s.request_limits else None,
            per_source_requests=per_source_requests(cfg, s),
            load_balancer_addresses=load_balancer_addresses(cfg.network, s.name),
            vpc_cidr=cfg.network.vpc_cidr), **_pd_routing(s)))
        gateway = []
        if joins_gateway(cfg, s):
            assert cfg.inference_gateway is not None
            gateway = [InferenceGatewayChart(app, f"{s.name}-gateway", props=GatewayProps(
                endpoint=s.name, namespace=SERVING_NAMESPACE, strategy=s.routing_strategy,
                worker_selector=workers.selector, worker_port=wp.gateway_port,
                image=images.uri("epp"), gateway=cfg.inference_gateway,
                longest_request_s=LONGEST_REQUEST_S, model=s.model_name))]
        for chart in (*roles, router, *gateway):
            chart.add_dependency(ns)
            charts.append(chart)
    policies = NetworkPoliciesChart(app, "serving-network-policies", props=NetworkPoliciesProps(
        namespace=SERVING_NAMESPACE,
        flows=tuple(f for c in charts for f in getattr(c, "flows", ()))))
    policies.add_dependency(ns)
    return charts + [policies]


def _pd_charts(app: App, s: EndpointSpec, wp: WorkerProps, metrics: MetricsSource
               ) -> list[WorkersChart]:
    """A disaggregated endpoint's prefill and decode workers: each role's replicas, merged
    args, resources, node selector and KEDA; NIXL over the type's EFA; L1 on prefill only."""
    assert s.pd is not None
    shape = gpu_shape(s.instance_type)
    zone = ((("topology.kubernetes.io/zone", s.pd.availability_zone),)
            if s.pd.availability_zone else ())
    charts = []
    for r in s.pd.roles:
        l1 = s.l1_enabled and r.role == "prefill"
        budget = l1_budget(_gib(r.memory), parallel_ranks(r.args), s.l1_size_gib)
        scaling = role_scaling(s, r)
        props = replace(
            wp, replicas=r.replicas, gpus=r.gpus, cpu=r.cpu, memory=r.memory, extra_args=r.args,
            l1_enabled=l1, l1_size_gib=budget.l1_per_rank_gib if l1 else 0, l2=None,
            ranks=budget.ranks, shm_gib=budget.shm_gib, node_gpus=shape.gpus,
            owns_service_account=r.role == "prefill",
            scaling=WorkerScaling(scaling, metrics) if scaling else None,
            pd=PDWorker(r.role, efa(s.instance_type).interfaces,
                        node_selector=(*r.node_selector, *zone),
                        same_zone_as="decode" if r.role == "prefill" and s.pd.same_az
                        else None))
        charts.append(WorkersChart(app, f"{s.name}-{r.role}", props=props))
    return charts


def _pd_routing(s: EndpointSpec) -> dict:
    """RouterProps for a disaggregated endpoint: vllm-router (the P/D router), both roles'
    pods as its workers, and the decode-only router below routingThreshold."""
    if s.pd is None:
        return {}
    threshold = s.pd.routing_threshold
    return {"implementation": "vllm-router",
            "worker_selector": selector_labels(WORKER_COMPONENT, s.name),
            "max_workers": sum(r.autoscaling.max_replicas if r.autoscaling else r.replicas
                               for r in s.pd.roles),
            "pd": PDRouting(pd_selector(s.name, "prefill"), pd_selector(s.name, "decode"),
                            threshold * BODY_BYTES_PER_TOKEN if threshold else None,
                            decode_policy(s.pd.decode.autoscaling.max_replicas
                                          if s.pd.decode.autoscaling else s.pd.decode.replicas))}


def generated_tls(cfg: EnvironmentConfig, s: EndpointSpec) -> dict:
    """RouterProps for the front's own certificate (k8s/certificate.py): every endpoint without
    an ACM certificate, unless the environment turns it off; a file's
    tlsCertificateOutputS3Uri asks for it whatever the environment says."""
    if s.tls_certificate_arn or cfg.listener.certificate_arn:
        return {}
    if not (cfg.listener.generated_certificate or s.tls_certificate_s3_uri):
        return {}
    return {"generated_tls": True, "certificate_s3_uri": s.tls_certificate_s3_uri,
            "tls_names": dns_names(router_name(s.name), SERVING_NAMESPACE, cfg.region,
                                   cfg.facts.domain_suffix),
            "aws_cli_image": cfg.images.uri("aws-cli"), "region": cfg.region}


def environment_notices(cfg: EnvironmentConfig, specs: tuple[EndpointSpec, ...]) -> list[str]:
    """Warnings about the environment's own request, judged with its endpoints."""
    out: list[str] = []
    if cfg.cache.kind == "self-hosted" and not any(_shared_kind(cfg, s) for s in specs):
        out.append(changed(
            "environment: cache.kind: self-hosted, but no endpoint uses an L2 (none sets "
            "kvCacheSpec.enableL2Cache with a redis or valkey backend, or the L2 would not pay "
            "on its GPU): no in-cluster Valkey is deployed", "environment", "cache.kind"))
    c = cfg.cache
    if c.kind == "elasticache" and c.requested_engine_version and managed_l2_plans(cfg, specs):
        out.append(changed(
            f"environment: cache.engineVersion: {c.engine} {c.requested_engine_version} is not "
            f"offered in {cfg.region} (config/regions.py); the ElastiCache L2 runs {c.engine} "
            f"{c.engine_version} (parameter group family {c.parameter_group_family}), the "
            "newest offered there", "environment", "cache.engineVersion"))
    if cfg.cache.kind == "elasticache" and not managed_l2_plans(cfg, specs):
        out.append(changed(
            "environment: cache.kind: elasticache, but no ElastiCache is provisioned: no "
            "endpoint's L2 uses it (none asks for an L2 with l2CacheBackend redis, or the L2 "
            "verdict left it out: the endpoint warnings say why)", "environment", "cache.kind"))
    currency = cfg.prices().currency
    if cfg.instance_hourly_usd and currency != "USD":
        out.append(f"environment: instanceHourlyUsd: ignored: {cfg.region} bills in {currency}; "
                   "the plan, bench and the cost panels read the region's table under "
                   f"instancePrices {{currency: {currency}, hourly, source}}")
    return out


def environment_images(cfg: EnvironmentConfig, specs: tuple[EndpointSpec, ...]) -> list[Image]:
    """The images this environment deploys (config/images.py deployed_images): what the mirror
    copies or builds, what ECR keeps repositories for, what preflight looks for."""
    endpoint_images = [*(s.image for s in specs),
                       *(image_for(c["image"]) for s in specs for c in s.pod.init_containers)]
    return deployed_images(endpoint_images, kubernetes_version=cfg.kubernetes_version,
                           self_hosted_observability=cfg.observability == "self-hosted",
                           in_cluster_cache=any(_shared_kind(cfg, s) for s in specs),
                           efa_nodes=any(g.efa for g in cfg.gpu_node_groups),
                           inference_gateway=any(joins_gateway(cfg, s) for s in specs))


def in_cluster_node(cfg: EnvironmentConfig, specs: tuple[EndpointSpec, ...]):
    """The node the in-cluster Valkey gets (they share one server): the dearest any endpoint's
    plan chose, or where several share it the cheapest offered after it whose maxmemory holds
    what they must hold together (_shared_l2_check says where none does); None where no
    endpoint's L2 is in the cluster."""
    order = [n.type for n in IN_CLUSTER_NODE_TYPES]
    plans = [p for s in specs if (p := l2_plan(cfg, s)) and p.target == IN_CLUSTER
             and p.verdict.server and p.verdict.server.node_type in order]
    if not plans:
        return None
    chosen = max((p.verdict.server for p in plans), key=lambda x: order.index(x.node_type))
    if len(plans) < 2 or cfg.cache.in_cluster_node_type:
        return chosen
    memory = shared_valkey_gib(plans)
    offered = instance_types_in(cfg.region)
    for n in IN_CLUSTER_NODE_TYPES[order.index(chosen.node_type):]:
        server = in_cluster_server(n.type, n.vcpus, n.gib)
        if n.type in offered and server.memory_gib >= memory and server.gbps >= chosen.gbps:
            return server
    return chosen


def shared_valkey_gib(plans: Iterable[L2Plan]) -> float:
    """What endpoints sharing the in-cluster Valkey must hold together, in Valkey's memory
    (each endpoint's chunks counted as Valkey counts them): against a node's maxmemory."""
    return sum(p.verdict.capacity_gib * p.verdict.value_overhead for p in plans)


def managed_l2_plans(cfg: EnvironmentConfig, specs: tuple[EndpointSpec, ...]
                     ) -> list[L2Plan]:
    """The plans of endpoints whose L2 is the environment's ElastiCache."""
    return [p for s in specs if (p := l2_plan(cfg, s)) and p.target == ELASTICACHE]


def connection(plan: L2Plan, base: L2Connection) -> L2Connection:
    """`base` (the cache's address as redis:// or rediss://) as the plan's connector reaches
    it: its scheme, its extra_config keys, and a blocking timeout that outlasts a whole
    retrieve of the endpoint's prefix."""
    c = plan.connector
    address = base.url.split("://", 1)[1]
    if c in (REDIS, REDISS):
        return replace(base, blocking_timeout_s=plan.verdict.blocking_timeout_s)
    extra: dict = {"save_chunk_meta": False}     # one key per chunk (both adapters require it)
    if c.name == "resp":
        extra["resp_num_threads"] = c.connections
    else:
        extra.update(valkey_num_workers=c.connections, tls_enable=True,
                     valkey_mode="cluster")
    return L2Connection(url=f"{c.scheme}{address}", secret_arn=base.secret_arn,
                        extra=tuple(sorted(extra.items())),
                        password_key=c.password_key if base.secret_arn else None,
                        blocking_timeout_s=plan.verdict.blocking_timeout_s)


def _shared_kind(cfg: EnvironmentConfig, s: EndpointSpec) -> str | None:
    """None: the managed ElastiCache (or no L2); otherwise the in-cluster cache to deploy."""
    if not s.l2_enabled or s.l2_url or l2_refusal_for(s):
        return None
    # tieredstorage and lmcache-server: the in-cluster Valkey too (k8s/workers.py TIER_POLICY).
    if s.l2_backend in ("valkey", "lmcache-server") or (
            s.l2_backend == "redis" and cfg.cache.kind == "self-hosted"):
        return VALKEY
    return None
