"""Environment config: `cdk.json` context becomes frozen, validated dataclasses here, once.

Nothing below `app.py` reads context. Every rule a user can break is checked in this module and
reported as one `ConfigError` naming environment, field, value and what is allowed.
"""
from __future__ import annotations

import ipaddress
import math
import re
import unicodedata
from dataclasses import dataclass, field, replace
from typing import Any, Mapping

from .contracts import (
    DEREGISTER_S_DEFAULT, DEREGISTER_S_MAX, DEREGISTER_S_MIN, ROUTER_STRATEGIES, default_router,
)
from .errors import ConfigError, allowed_for, type_name
from .bandwidth import CACHE_NODES, IN_CLUSTER_NODE_TYPES
from .images import (
    IMAGES, KUBERNETES_VERSIONS, ImageResolver, catalogue_key_for, image_family, image_for,
    lock_key,
)
from .instances import (
    DAEMONSET_ROOM_M, DAEMONSET_ROOM_MIB, EFA, GPU_SHAPES, accelerator_label, allocatable,
    architecture, gpu_direct_efa_in, gpu_shape,
)
from .notices import ACK_PATTERN
from .prices import PSEUDO_TYPES, Prices, PriceTable, region_currency
from .network import DEFAULT_VPC_CIDR, NetworkConfig, created_network, existing_network
from .regions import (
    AMP_TYPE, CACHE_ENGINE_FAMILIES, GRAFANA_TYPE, RegionFacts, cache_engine_versions_in,
    cache_node_types_in, families, instance_types_in, known_regions, region_facts,
    resource_types_in,
)

GPU_AMI_TYPES = ("AL2023_X86_64_NVIDIA", "BOTTLEROCKET_X86_64_NVIDIA")
SYSTEM_AMI_TYPES = ("AL2023_X86_64_STANDARD", "AL2023_ARM_64_STANDARD", "BOTTLEROCKET_X86_64")
CAPACITY_TYPES = ("ON_DEMAND", "SPOT")
CACHE_KINDS = ("elasticache", "self-hosted", "none")
CACHE_ENGINES = ("valkey", "redis")
OBSERVABILITY_KINDS = ("managed", "self-hosted")
GRAFANA_KINDS = ("managed", "none")   # with managed observability: AMG needs IAM Identity Center
BUCKET_ENCRYPTION = ("kms", "s3-managed")
REMOVAL = ("retain", "destroy")
ALERT_SEVERITIES = ("critical", "warning")   # the `severity` label every shipped alert carries
ALERT_PROTOCOLS = ("email", "https")
LOG_RETENTION_DAYS = (1, 3, 5, 7, 14, 30, 60, 90, 120, 150, 180, 365, 400, 545, 731, 1096, 1827,
                      2192, 2557, 2922, 3288, 3653)


@dataclass(frozen=True)
class NodeGroupConfig:
    name: str
    instance_types: tuple[str, ...]
    min_size: int
    max_size: int
    desired_size: int
    disk_size_gib: int
    ami_type: str
    capacity_type: str = "ON_DEMAND"
    gpu: bool = False
    # EFA with GPUDirect RDMA (disaggregated prefill/decode, k8s/pd.py): a launch template with
    # the type's EFA interfaces, a cluster placement group, one zone, a self-referencing
    # security group (constructs/gpu_cluster.py)
    efa: bool = False

    @property
    def gpus_per_node(self) -> int:
        shape = gpu_shape(self.instance_types[0]) if self.gpu else None
        return shape.gpus if shape else 0


@dataclass(frozen=True)
class CacheConfig:
    """The L2 KV cache shared by workers: managed ElastiCache, in-cluster, or none. Nothing is
    provisioned unless an endpoint's L2 verdict deploys one (k8s/l2.py); ElastiCache then gets
    the shards that verdict needs (at most `max_shards`), the in-cluster Valkey a node of its
    own (`in_cluster_node_type`, or the smallest that lets the L2 pay)."""

    kind: str
    engine: str = "valkey"
    engine_version: str = "9.0"      # what is rendered: offered in the region (config/regions.py)
    node_type: str = "cache.r7g.4xlarge"
    replicas: int = 1                # per shard
    multi_az: bool = True
    snapshot_retention_days: int = 1
    max_shards: int = 16
    in_cluster_node_type: str | None = None
    # the file's engineVersion where the region does not offer it (engine_version is then the
    # newest it offers, said at synth); None where it is served as asked
    requested_engine_version: str | None = None

    @property
    def parameter_group_family(self) -> str:
        return CACHE_ENGINE_FAMILIES[self.engine][self.engine_version]


@dataclass(frozen=True)
class AlertSubscription:
    """One subscriber of the alert topic; it receives only the listed severities."""

    protocol: str                              # ALERT_PROTOCOLS
    endpoint: str                              # an e-mail address or an https:// URL
    severities: tuple[str, ...] = ALERT_SEVERITIES


@dataclass(frozen=True)
class EndpointAccessConfig:
    public: bool
    public_cidrs: tuple[str, ...] = ()


@dataclass(frozen=True)
class ListenerConfig:
    """The router's load balancer listener: TLS with an ACM certificate of the environment's
    region (ACM exists in both China regions), and the client CIDRs it accepts."""

    certificate_arn: str | None = None
    source_ranges: tuple[str, ...] = ()
    # Without an ACM certificate, the router's front serves HTTPS with a certificate made in
    # the cluster (k8s/certificate.py), as HyperPod does; false: plain HTTP inside the VPC.
    generated_certificate: bool = True
    # what a router pod's front waits for its NLB to stop sending before it drains
    deregistration_wait_s: int = DEREGISTER_S_DEFAULT


GATEWAY_NAME_LABEL = "gateway.networking.k8s.io/gateway-name"   # GEP-1762: on a Gateway's pods
FAILURE_MODES = ("FailOpen", "FailClose")
# docs/gateway.md's table; `other`: a conformant gateway that needs nothing rendered for it
GATEWAY_IMPLEMENTATIONS = ("istio", "agentgateway", "nginx-gateway-fabric", "other")
ROUTE_BY = ("none", "model", "hostname")


@dataclass(frozen=True)
class InferenceGatewayConfig:
    """`inferenceGateway`: the team's own Gateway API gateway (Istio, agentgateway, NGINX Gateway
    Fabric) that endpoints join with an InferencePool and an endpoint picker (k8s/gateway.py,
    docs/gateway.md). `proxy_labels` in `proxy_namespace` select the gateway's proxy pods, which
    the workers and the picker admit; by default the label GEP-1762 has in-cluster gateways put
    on the pods of the Gateway they serve. `all_endpoints`: every endpoint joins, not only those
    whose file sets `inferenceGateway.enabled`."""

    name: str
    namespace: str
    proxy_namespace: str
    proxy_labels: tuple[tuple[str, str], ...]
    # which gateway serves the Gateway: what it needs to reach the picker (Istio: a
    # DestinationRule for the picker's TLS, k8s/gateway.py)
    implementation: str = "other"
    all_endpoints: bool = False
    failure_mode: str = "FailOpen"     # the InferencePool's; why in k8s/gateway.py
    # the picker's request (memory limit twice it), upstream's chart's by default
    picker_cpu: int = 4
    picker_memory_gib: int = 8
    # how one Gateway tells its endpoints apart (k8s/gateway.py route_matches): `none` (one
    # endpoint takes every request), `model` (the body-based router's model header) or
    # `hostname` (<endpoint>.<domain>)
    route_by: str = "none"
    domain: str | None = None
    # false where the cluster has the InferencePool CRD already (the gateway's install put it
    # there): ours would replace it, and take every pool with it when the stack is deleted
    install_crd: bool = True


@dataclass(frozen=True)
class HostedZone:
    """A Route 53 hosted zone endpoint files may put their record in (dnsConfig.hostedZoneId);
    Route 53 serves both partitions."""

    id: str
    name: str        # the zone's domain, e.g. models.example.com


@dataclass(frozen=True)
class EnvironmentConfig:
    name: str
    account: str
    region: str
    facts: RegionFacts
    availability_zones: tuple[str, ...]
    network: NetworkConfig
    kubernetes_version: str
    nat_gateways: int
    cluster_endpoint: EndpointAccessConfig
    admin_role_names: tuple[str, ...]
    system_nodes: NodeGroupConfig
    gpu_node_groups: tuple[NodeGroupConfig, ...]
    cache: CacheConfig
    observability: str
    public_listener: bool
    listener: ListenerConfig
    use_ecr_images: bool
    retain_data: bool
    bucket_encryption: str
    log_retention_days: int
    endpoint_files: tuple[str, ...]
    instance_hourly_usd: Mapping[str, float]
    # `instancePrices`: the environment's own hourly prices in its region's currency (the
    # synth plan's cost, stacks/plan.py), over config/prices.py's table; None: the table's
    instance_prices: PriceTable | None = None
    # HyperPod instance type (`ml.p5.48xlarge`) -> the EC2 type of a GPU node group serving it
    instance_type_map: Mapping[str, str] = field(default_factory=dict)
    # `imageBases`: a team's worker image (registry/repository:tag) -> the catalogue key of
    # the image it is built FROM, stated offline (config/images.py Image.based_on)
    image_bases: Mapping[str, str] = field(default_factory=dict)
    tags: Mapping[str, str] = field(default_factory=dict)
    # HyperPod strategy -> router implementation, where it differs from contracts.DEFAULT_ROUTER
    router_implementations: Mapping[str, str] = field(default_factory=dict)
    ttft_objective_seconds: float | None = None   # None: observability/rules.py's default
    alert_subscriptions: tuple[AlertSubscription, ...] = ()
    managed_grafana: bool = True      # `grafana: managed|none`; only with managed observability
    hosted_zones: tuple[HostedZone, ...] = ()   # `hostedZones`: where dnsConfig records go
    # synth warnings the team has read and accepts (config/notices.py ids)
    acknowledged_warnings: tuple[str, ...] = ()
    # the EKS-optimized AL2023 AMI release every node group runs; None: the latest of
    # kubernetes_version (when a group is created or its version moves)
    ami_release_version: str | None = None
    inference_gateway: InferenceGatewayConfig | None = None   # `inferenceGateway`

    @property
    def images(self) -> ImageResolver:
        """Where this environment's pods pull each catalogue image from (decided here, once)."""
        return ImageResolver(self.use_ecr_images, self.account, self.facts)

    @property
    def stack_prefix(self) -> str:
        return f"KvCache-{self.name}"

    def router_implementation(self, strategy: str) -> str:
        """The router an endpoint with HyperPod routing `strategy` runs behind."""
        return self.router_implementations.get(strategy) or default_router(strategy)

    def prices(self) -> Prices:
        """The one price list everything reads (the plan, `bench`, the cost panels): the
        region's table under the file's `instancePrices` (and `instanceHourlyUsd`)."""
        return Prices(self.region, self.instance_prices, self.instance_hourly_usd)

    def gpu_group_for(self, instance_type: str) -> NodeGroupConfig | None:
        return next((g for g in self.gpu_node_groups if instance_type in g.instance_types), None)


class _Reader:
    """Reads one mapping of context, tracking the field path for error messages."""

    def __init__(self, env: str, data: Any, path: str):
        self.env, self.path = env, path
        if not isinstance(data, Mapping):
            raise ConfigError(env, path or "<environment>", data, "a JSON object")
        self.data = data
        self.used: set[str] = set()

    def fail(self, key: str, value: Any, allowed: Any) -> ConfigError:
        return ConfigError(self.env, self._p(key), value, allowed)

    def _p(self, key: str) -> str:
        return f"{self.path}.{key}" if self.path else key

    def get(self, key: str, kind: type | tuple, default: Any = ..., allowed: str = "") -> Any:
        self.used.add(key)
        if key not in self.data:
            if default is ...:
                raise ConfigError(self.env, self._p(key), None,
                                  f"a required field ({allowed or _type_name(kind)})")
            return default
        value = self.data[key]
        if isinstance(value, bool) and kind in (int, float, (int, float)):
            raise self.fail(key, value, allowed or _type_name(kind))
        if not isinstance(value, kind):
            raise self.fail(key, value,
                            allowed_for(allowed or _type_name(kind), value, kind is str))
        return value

    def choice(self, key: str, choices: tuple, default: Any = ...) -> Any:
        value = self.get(key, type(choices[0]), default, allowed=", ".join(map(str, choices)))
        if value not in choices:
            raise self.fail(key, value, choices)
        return value

    def integer(self, key: str, lo: int, hi: int, default: Any = ...) -> int:
        value = self.get(key, int, default, allowed=f"an integer from {lo} to {hi}")
        if not lo <= value <= hi:
            raise self.fail(key, value, f"an integer from {lo} to {hi}")
        return value

    def strings(self, key: str, default: Any = ..., pattern: str | None = None,
                allowed: str = "a list of strings", min_len: int = 0) -> tuple[str, ...]:
        value = self.get(key, list, default, allowed=allowed)
        for i, item in enumerate(value):
            if not isinstance(item, str) or (pattern and not re.fullmatch(pattern, item, re.A)):
                raise ConfigError(self.env, f"{self._p(key)}[{i}]", item, allowed)
        if len(value) < min_len:
            raise self.fail(key, value, allowed)
        return tuple(value)

    def child(self, key: str, default: Any = ...) -> "_Reader":
        value = self.get(key, Mapping, default, allowed="a JSON object")
        return _Reader(self.env, value, self._p(key))

    def done(self) -> None:
        """Unknown keys are typos until proven otherwise: fail rather than ignore."""
        extra = sorted(set(self.data) - self.used)
        if extra:
            raise ConfigError(self.env, self._p(extra[0]), self.data[extra[0]],
                              "known fields: " + ", ".join(sorted(self.used)))


def _type_name(kind: Any) -> str:
    return "a JSON object" if kind is Mapping else type_name(kind)


# Client CIDRs: dotted quad and prefix length only (`0.0.0.0/0.0.0.0` is a netmask spelling of
# the whole internet), and together at most a /8's worth of public addresses: two /1 halves are
# the whole internet too. Private, shared and reserved space is not counted.
_CIDR = re.compile(r"(?:[0-9]{1,3}\.){3}[0-9]{1,3}/[0-9]{1,2}", re.A)
MAX_PUBLIC_ADDRESSES = 1 << 24
_NOT_PUBLIC = tuple(ipaddress.IPv4Network(n) for n in (
    "0.0.0.0/8", "10.0.0.0/8", "100.64.0.0/10", "127.0.0.0/8", "169.254.0.0/16",
    "172.16.0.0/12", "192.168.0.0/16", "224.0.0.0/3"))


def _cidrs(r: _Reader, key: str, public: bool) -> tuple[str, ...]:
    """A list of client CIDRs; `public`: they guard an internet-facing endpoint."""
    ranges = r.strings(key, (), allowed="a list of IPv4 CIDRs")
    nets = []
    for i, cidr in enumerate(ranges):
        try:
            if not _CIDR.fullmatch(cidr):
                raise ValueError(cidr)
            nets.append(ipaddress.IPv4Network(cidr))
        except ValueError:
            raise ConfigError(r.env, f"{r._p(key)}[{i}]", cidr, "an IPv4 CIDR a.b.c.d/n "
                              "without host bits, e.g. 203.0.113.0/24") from None
    reached = sum(public_addresses(n) for n in ipaddress.collapse_addresses(nets))
    if public and reached > MAX_PUBLIC_ADDRESSES:
        raise r.fail(key, list(ranges), f"client CIDRs narrower than 0.0.0.0/0: at most "
                     f"{MAX_PUBLIC_ADDRESSES:,} public addresses together (a /8); these "
                     f"reach {reached:,}")
    return ranges


def public_addresses(net: ipaddress.IPv4Network) -> int:
    """Addresses of `net` outside private, shared and reserved space (CIDRs nest or are
    disjoint, so an overlap is the smaller of the two)."""
    hidden = sum(min(n.num_addresses, net.num_addresses) for n in _NOT_PUBLIC if n.overlaps(net))
    return net.num_addresses - hidden


# Tags every AWS service takes (the Tagging guide's common rule), and CloudFormation stack tags
# (a value of at least 1 character; 50 tags, one of them ours: kvcache:environment).
_TAG_SYMBOLS = frozenset("_.:/=+-@")
MAX_TAGS = 49


def _tag_text(text: str, lo: int, hi: int) -> bool:
    return lo <= len(text) <= hi and all(
        unicodedata.category(c)[0] in "LZN" or c in _TAG_SYMBOLS for c in text)


def _tags(r: _Reader) -> dict[str, str]:
    tags = r.get("tags", Mapping, {}, allowed="an object of string -> string")
    if len(tags) > MAX_TAGS:
        raise r.fail("tags", f"{len(tags)} tags", f"at most {MAX_TAGS} (CloudFormation takes "
                     "50 stack tags; kvcache:environment is one)")
    text = "letters, digits, spaces and _ . : / = + - @"
    for k, v in tags.items():
        if not _tag_text(k, 1, 128) or k.lower().startswith("aws:"):
            raise ConfigError(r.env, "tags", k, f"keys of 1 to 128 {text}, not starting "
                              "with aws:")
        if not isinstance(v, str) or not _tag_text(v, 1, 256):
            raise ConfigError(r.env, f"tags.{k}", v, f"a string of 1 to 256 {text}")
    return dict(tags)


def _listener(r: _Reader, facts: RegionFacts, account: str, public: bool) -> ListenerConfig:
    arn = r.get("certificateArn", str, None, allowed="an ACM certificate ARN")
    pattern = (rf"arn:{re.escape(facts.partition)}:acm:{re.escape(facts.region)}:{account}:"
               r"certificate/[0-9a-f-]{36}")
    if arn is not None and not re.fullmatch(pattern, arn):
        raise r.fail("certificateArn", arn, f"an ACM certificate ARN of account {account} in "
                     f"{facts.region} (arn:{facts.partition}:acm:{facts.region}:{account}:"
                     "certificate/<uuid>)")
    ranges = _cidrs(r, "sourceRanges", public)
    generated = r.get("generatedCertificate", bool, True)
    wait = r.integer("deregistrationWaitSeconds", DEREGISTER_S_MIN, DEREGISTER_S_MAX,
                     DEREGISTER_S_DEFAULT)
    if public and (arn is None or not ranges):
        missing = "certificateArn" if arn is None else "sourceRanges"
        raise r.fail(missing, None, "a value when publicListener is true: an internet-facing "
                     "listener needs TLS (listener.certificateArn) and client CIDRs "
                     "(listener.sourceRanges)")
    r.done()
    return ListenerConfig(arn, ranges, generated, wait)


_DNS_LABEL = r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?"
_LABEL_KEY = (r"([a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?/)?"
              r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")
_LABEL_VALUE = r"([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?"


def _inference_gateway(r: _Reader, system: NodeGroupConfig) -> InferenceGatewayConfig:
    gw = r.child("gateway")
    names = {}
    for key in ("name", "namespace"):
        value = gw.get(key, str, allowed="a DNS label (the Gateway's)")
        if not re.fullmatch(_DNS_LABEL, value, re.A):
            raise gw.fail(key, value, "a DNS label: lowercase letters, digits and '-', at most "
                          "63")
        names[key] = value
    gw.done()
    implementation = r.choice("implementation", GATEWAY_IMPLEMENTATIONS)
    proxy = r.child("proxyPods", {})
    proxy_ns = proxy.get("namespace", str, names["namespace"], allowed="a DNS label")
    if not re.fullmatch(_DNS_LABEL, proxy_ns, re.A):
        raise proxy.fail("namespace", proxy_ns, "a DNS label")
    labels = proxy.get("labels", Mapping, {GATEWAY_NAME_LABEL: names["name"]},
                       allowed="an object of label -> value selecting the gateway's proxy pods")
    for key, value in labels.items():
        if not (isinstance(value, str) and re.fullmatch(_LABEL_KEY, key, re.A)
                and re.fullmatch(_LABEL_VALUE, value, re.A)):
            raise ConfigError(r.env, f"{proxy._p('labels')}.{key}", value,
                              "Kubernetes label keys and values")
    if not labels:
        raise proxy.fail("labels", labels, "at least one label: an empty selector would "
                         "admit every pod of the namespace")
    proxy.done()
    picker = r.child("picker", {})
    cpu, memory = picker.integer("cpu", 1, 64, 4), picker.integer("memoryGiB", 1, 256, 8)
    # the picker runs on the system nodes (k8s/gateway.py): it must fit one beside DaemonSets
    room = min(allocatable(t) for t in system.instance_types)
    cpu_room = int((room.cpu_m - DAEMONSET_ROOM_M) // 1000)
    gib_room = int((room.memory_mib - DAEMONSET_ROOM_MIB) // 1024)
    for key, value, most in (("cpu", cpu, cpu_room), ("memoryGiB", memory, gib_room)):
        if value > most:
            raise picker.fail(key, value, f"at most {most} beside the DaemonSets of a system "
                              f"node ({', '.join(system.instance_types)}): a larger "
                              "nodeGroups.system.instanceTypes, or a smaller picker (upstream "
                              "sizes it 4 CPU, 8 GiB)")
    picker.done()
    route_by = r.choice("routeBy", ROUTE_BY, "none")
    domain = None
    if route_by == "hostname":
        domain = r.get("domain", str, allowed="the DNS domain under which each endpoint's "
                       "hostname <endpoint>.<domain> points at the Gateway")
        if not re.fullmatch(rf"{_DNS_LABEL}(\.{_DNS_LABEL})+", domain, re.A) or len(domain) > 200:
            raise r.fail("domain", domain, "a DNS domain, e.g. models.example.com")
    cfg = InferenceGatewayConfig(
        names["name"], names["namespace"], proxy_ns, tuple(sorted(labels.items())),
        implementation=implementation,
        all_endpoints=r.get("allEndpoints", bool, False),
        failure_mode=r.choice("failureMode", FAILURE_MODES, "FailOpen"),
        install_crd=r.get("installCrd", bool, True), picker_cpu=cpu, picker_memory_gib=memory,
        route_by=route_by, domain=domain)
    r.done()
    return cfg


def _ami_type(r: "_Reader", types: tuple[str, ...], ami_types: tuple[str, ...]) -> str:
    """The group's AMI type, of its instance types' architecture (EKS, and CDK at synth, refuse
    a mismatch): by default the first of that architecture; Graviton and x86 types never mix."""
    arches = {architecture(t) for t in types}
    if len(arches) > 1:
        raise r.fail("instanceTypes", list(types), "types of one architecture (Graviton, e.g. "
                     "m7g, or x86): one AMI type serves the group")
    arch = arches.pop()
    fits = [a for a in ami_types if ("ARM_64" in a) == (arch == "arm64")]
    if not fits:
        raise r.fail("instanceTypes", list(types), f"x86_64 types: no {arch} AMI type here "
                     f"({', '.join(ami_types)})")
    ami = r.choice("amiType", ami_types, fits[0])
    if ami not in fits:
        raise r.fail("amiType", ami, f"an AMI type of the group's {arch} instance types: "
                     + ", ".join(fits))
    return ami


def _node_group(r: _Reader, facts: RegionFacts, gpu: bool, default_name: str) -> NodeGroupConfig:
    name = r.get("name", str, default_name)
    if not re.fullmatch(r"[a-z][a-z0-9-]{0,30}", name):
        raise r.fail("name", name, "lowercase letters, digits and '-', starting with a letter")
    offered = instance_types_in(facts.region)
    types = r.strings("instanceTypes", allowed="a non-empty list of EC2 instance types",
                      min_len=1)
    for i, itype in enumerate(types):
        if gpu and itype not in GPU_SHAPES:
            raise ConfigError(r.env, f"{r.path}.instanceTypes[{i}]", itype,
                              "GPU types we can size: " + families(frozenset(GPU_SHAPES)))
        if itype not in offered:
            allowed = (families(frozenset(t for t in offered if t in GPU_SHAPES)) if gpu
                       else f"instance types offered in {facts.region}")
            raise ConfigError(r.env, f"{r.path}.instanceTypes[{i}]", itype,
                              f"{allowed} (offered in {facts.region})")
    if gpu and len({gpu_shape(t).gpus for t in types}) > 1:
        raise r.fail("instanceTypes", list(types), "types with the same GPU count per node")
    if gpu and len({accelerator_label(t) for t in types}) > 1:   # one node label per group
        raise r.fail("instanceTypes", list(types), "types with the same GPU model")
    min_size = r.integer("minSize", 0, 1000)
    max_size = r.integer("maxSize", 1, 1000)
    if min_size > max_size:
        raise r.fail("minSize", min_size, f"at most maxSize ({max_size})")
    desired = r.integer("desiredSize", min_size, max_size, default=min_size)
    ami_types = GPU_AMI_TYPES if gpu else SYSTEM_AMI_TYPES
    efa = r.get("efa", bool, False) if gpu else False
    for i, itype in enumerate(types if efa else ()):
        if not gpu_direct_efa_in(itype, facts.region):
            raise ConfigError(r.env, f"{r.path}.instanceTypes[{i}]", itype,
                              f"with efa: true, a type with GPUDirect RDMA over EFA in "
                              f"{facts.region}: " + ", ".join(sorted(
                                  t for t in EFA if gpu_direct_efa_in(t, facts.region))))
    if efa and len({EFA[t].interfaces for t in types}) > 1:
        raise r.fail("instanceTypes", list(types), "types with the same EFA interfaces (one "
                     "launch template)")
    ng = NodeGroupConfig(
        name=name, instance_types=types, min_size=min_size, max_size=max_size,
        desired_size=desired, disk_size_gib=r.integer("diskSizeGiB", 20, 16384, 200 if gpu else 50),
        ami_type=_ami_type(r, types, ami_types),
        capacity_type=r.choice("capacityType", CAPACITY_TYPES, "ON_DEMAND"), gpu=gpu,
        efa=efa,
    )
    r.done()
    return ng


def _cache(r: _Reader, facts: RegionFacts) -> CacheConfig:
    kind = r.choice("kind", CACHE_KINDS)
    in_cluster = r.get("inClusterNodeType", str, None,
                       allowed="an EC2 instance type for the in-cluster Valkey's node")
    if in_cluster is not None:
        nodes = {n.type for n in IN_CLUSTER_NODE_TYPES} & instance_types_in(facts.region)
        if in_cluster not in nodes:
            raise r.fail("inClusterNodeType", in_cluster,
                         f"{', '.join(sorted(nodes))} (offered in {facts.region}, with a "
                         "published sustained bandwidth)")
    if kind != "elasticache":
        r.done()
        return CacheConfig(kind=kind, in_cluster_node_type=in_cluster)
    node_type = r.get("nodeType", str, CacheConfig.node_type)
    offered = cache_node_types_in(facts.region) & frozenset(CACHE_NODES)
    if node_type not in offered:
        raise r.fail("nodeType", node_type,
                     f"{families(offered, 'cache.')} (offered in {facts.region}, "
                     "non-burstable, with a published sustained bandwidth)")
    cfg = CacheConfig(
        kind=kind, engine=r.choice("engine", CACHE_ENGINES, "valkey"),
        engine_version=r.get("engineVersion", str, CacheConfig.engine_version),
        node_type=node_type, replicas=r.integer("replicas", 0, 5, 1),
        multi_az=r.get("multiAz", bool, True),
        snapshot_retention_days=r.integer("snapshotRetentionDays", 0, 35, 1),
        max_shards=r.integer("maxShards", 1, 250, CacheConfig.max_shards),
        in_cluster_node_type=in_cluster,
    )
    if cfg.multi_az and cfg.replicas < 1:
        raise r.fail("replicas", cfg.replicas, "at least 1 when multiAz is true")
    versions = CACHE_ENGINE_FAMILIES[cfg.engine]
    if cfg.engine_version not in versions:
        raise r.fail("engineVersion", cfg.engine_version,
                     f"{', '.join(versions)} (ElastiCache {cfg.engine})")
    offered = cache_engine_versions_in(facts.region, cfg.engine)
    if cfg.engine_version not in offered:   # the newest the region has, said at synth
        cfg = replace(cfg, engine_version=offered[-1],
                      requested_engine_version=cfg.engine_version)
    r.done()
    return cfg


def _ami_release_version(r: _Reader, kubernetes_version: str,
                         groups: tuple[NodeGroupConfig, ...]) -> str | None:
    """`amiReleaseVersion`: an EKS-optimized AL2023 AMI release of the cluster's minor
    (`1.35.2-20260115`: kubelet version, then the release date), so a node group's AMI moves
    only when the file says so; a bump of kubernetesVersion must bring a release of the new
    minor. Bottlerocket numbers its releases differently: not with this field."""
    release = r.get("amiReleaseVersion", str, None, allowed="an EKS AMI release version")
    if release is None:
        return None
    if not re.fullmatch(re.escape(kubernetes_version) + r"\.[0-9]{1,3}-20[0-9]{6}", release):
        raise r.fail("amiReleaseVersion", release, f"an EKS-optimized AL2023 AMI release of "
                     f"Kubernetes {kubernetes_version}, {kubernetes_version}.<patch>-<YYYYMMDD> "
                     f"(aws ssm get-parameter --name /aws/service/eks/optimized-ami/"
                     f"{kubernetes_version}/amazon-linux-2023/x86_64/standard/recommended/"
                     "release_version), or no value for the latest")
    for i, group in enumerate(groups):
        if not group.ami_type.startswith("AL2023"):
            where = "nodeGroups.system" if i == 0 else f"nodeGroups.gpu[{i - 1}]"
            raise ConfigError(r.env, f"{where}.amiType", group.ami_type,
                              "an AL2023 AMI type with amiReleaseVersion (it names an AL2023 "
                              "release; Bottlerocket numbers its own), or no amiReleaseVersion")
    return release


_EMAIL = re.compile(r"[!-?A-~]+@[!-?A-~]+\.[!-?A-~]+")           # printable ASCII, no '@'
_HTTPS = re.compile(r"https://[A-Za-z0-9.-]+(:[0-9]{1,5})?(/[!-~]*)?")


def _alert_subscriptions(r: _Reader) -> tuple[AlertSubscription, ...]:
    """`alerts.subscriptions`: who the alert topic (SNS) delivers to, by severity."""
    raw = r.get("subscriptions", list, [], allowed="a list of {protocol, endpoint, severities}")
    subs = []
    for i, item in enumerate(raw):
        s = _Reader(r.env, item, f"{r.path}.subscriptions[{i}]")
        protocol = s.choice("protocol", ALERT_PROTOCOLS)
        endpoint = s.get("endpoint", str, allowed="an e-mail address or an https:// URL")
        if protocol == "email" and not _EMAIL.fullmatch(endpoint):
            raise s.fail("endpoint", endpoint, "an e-mail address (protocol email)")
        if protocol == "https" and not _HTTPS.fullmatch(endpoint):
            raise s.fail("endpoint", endpoint, "an https:// URL (protocol https)")
        severities = s.strings("severities", ALERT_SEVERITIES, min_len=1,
                               allowed="a non-empty list of " + ", ".join(ALERT_SEVERITIES))
        bad = [v for v in severities if v not in ALERT_SEVERITIES]
        if bad:
            raise s.fail("severities", bad[0], ALERT_SEVERITIES)
        s.done()
        subs.append(AlertSubscription(protocol, endpoint, tuple(dict.fromkeys(severities))))
    keys = [(a.protocol, a.endpoint) for a in subs]
    if len(set(keys)) != len(keys):
        raise r.fail("subscriptions", [k[1] for k in keys], "each endpoint once")
    r.done()
    return tuple(subs)


def parse_environment(name: str, raw: Mapping[str, Any]) -> EnvironmentConfig:
    """Turn one environment's fields into an `EnvironmentConfig`, or raise ConfigError."""
    r = _Reader(name, raw, "")
    account = r.get("account", str)
    if not re.fullmatch(r"[0-9]{12}", account):
        raise r.fail("account", account, "a 12-digit AWS account id")
    region = r.get("region", str)
    if region not in known_regions():
        raise r.fail("region", region, "an AWS region name, e.g. us-west-2 or cn-northwest-1")
    facts = region_facts(region)
    azs = r.strings("availabilityZones", pattern=re.escape(region) + r"[a-z]",
                    allowed=f"2 to 6 zones of {region}, e.g. {region}a", min_len=2)
    if len(azs) > 6 or len(set(azs)) != len(azs):
        raise r.fail("availabilityZones", list(azs), f"2 to 6 distinct zones of {region}")
    if "existingVpc" in raw:
        for own in ("vpcCidr", "natGateways"):
            if own in raw:
                raise r.fail(own, raw[own], "no value with existingVpc (the VPC and its NAT "
                             "are the existing VPC's)")
        network = existing_network(name, r.get("existingVpc", Mapping), azs)
        nat = 0
    else:
        network = created_network(name, "vpcCidr", r.get("vpcCidr", str, DEFAULT_VPC_CIDR))
        nat = r.integer("natGateways", 1, len(azs), 1)

    ep = r.child("clusterEndpoint", {})
    public = ep.get("public", bool, False)
    cidrs = _cidrs(ep, "publicCidrs", public)
    if public and not cidrs:
        raise ep.fail("publicCidrs", [], "at least one CIDR when public is true")
    ep.done()

    nodes = r.child("nodeGroups")
    system = _node_group(nodes.child("system"), facts, gpu=False, default_name="system")
    gpu_raw = nodes.get("gpu", list, allowed="a non-empty list of GPU node groups")
    if not gpu_raw:
        raise nodes.fail("gpu", gpu_raw, "a non-empty list of GPU node groups")
    gpu_groups = tuple(
        _node_group(_Reader(name, g, f"nodeGroups.gpu[{i}]"), facts, gpu=True,
                    default_name=f"gpu{i}")
        for i, g in enumerate(gpu_raw)
    )
    nodes.done()
    names = [g.name for g in (system, *gpu_groups)]
    if len(set(names)) != len(names):
        raise ConfigError(name, "nodeGroups", names, "distinct node group names")

    public_listener = r.get("publicListener", bool, False)
    if public_listener and network.private_only:
        raise r.fail("publicListener", True, "false with an existingVpc that names no "
                     "loadBalancerSubnets (an internet-facing load balancer needs public "
                     "subnets; a private-only VPC's is internal, in the node subnets)")
    listener = _listener(r.child("listener", {}), facts, account, public_listener)
    cache = _cache(r.child("cache"), facts)
    offered = resource_types_in(region)
    has_amp = facts.managed_observability and AMP_TYPE in offered
    observability = r.choice("observability", OBSERVABILITY_KINDS,
                             "managed" if has_amp else "self-hosted")
    if observability == "managed" and not has_amp:
        raise r.fail("observability", observability, f"self-hosted (AMP and Amazon Managed "
                     f"Grafana do not exist in {region})" if not facts.managed_observability
                     else f"self-hosted (Amazon Managed Service for Prometheus does not exist "
                     f"in {region})")
    if observability == "managed":
        # Amazon Managed Grafana is in fewer regions than AMP: there, AMP alone by default
        has_grafana = GRAFANA_TYPE in offered
        managed_grafana = r.choice("grafana", GRAFANA_KINDS,
                                   "managed" if has_grafana else "none") == "managed"
        if managed_grafana and not has_grafana:
            raise r.fail("grafana", "managed", f"none (Amazon Managed Grafana does not exist "
                         f"in {region}: AMP, its alerts and KEDA's queries only; point a "
                         "Grafana of your own at the workspace), or observability self-hosted")
    else:
        managed_grafana = False
        if "grafana" in raw:
            raise r.fail("grafana", raw["grafana"], "no value with observability self-hosted "
                         "(Grafana runs in the cluster); managed or none with managed")
    use_ecr = r.get("useEcrImages", bool, facts.china)
    if facts.china and not use_ecr:
        raise r.fail("useEcrImages", use_ecr,
                     f"true (public registries are unreachable from {region})")
    prices = _hourly_prices(name, "instanceHourlyUsd", r.get(
        "instanceHourlyUsd", Mapping, {}, allowed="an object of type -> price"))
    own_prices = _instance_prices(name, region, r.child("instancePrices")
                                  if "instancePrices" in r.data else None)
    tags = _tags(r)
    ttft = r.get("ttftObjectiveSeconds", (int, float), None, allowed="seconds, e.g. 2.5")
    if ttft is not None and not 0 < ttft <= 600:
        raise r.fail("ttftObjectiveSeconds", ttft, "seconds above 0, at most 600")
    routers = r.get("routerImplementations", Mapping, {},
                    allowed="an object of routing strategy -> router implementation")
    for strategy, impl in routers.items():
        offers = [i for i, strategies in ROUTER_STRATEGIES.items() if strategy in strategies]
        if not offers:
            raise ConfigError(name, "routerImplementations", strategy,
                              "routing strategies as keys: " + ", ".join(
                                  dict.fromkeys(s for v in ROUTER_STRATEGIES.values() for s in v)))
        if impl not in offers:
            raise ConfigError(name, f"routerImplementations.{strategy}", impl,
                              "a router that offers it: " + ", ".join(offers))
    served = [t for g in gpu_groups for t in g.instance_types]
    type_map = r.get("instanceTypeMap", Mapping, {},
                     allowed="an object of HyperPod instance type -> EC2 instance type")
    for hyperpod_type, ec2 in type_map.items():
        if not re.fullmatch(r"ml\.[a-z0-9-]+\.[a-z0-9]+", hyperpod_type):
            raise ConfigError(name, "instanceTypeMap", hyperpod_type,
                              "HyperPod instance types as keys, e.g. ml.p5.48xlarge")
        if ec2 not in served:
            raise ConfigError(name, f"instanceTypeMap.{hyperpod_type}", ec2,
                              "an instance type of the environment's GPU node groups: "
                              + ", ".join(served))

    kubernetes_version = r.choice("kubernetesVersion", KUBERNETES_VERSIONS)
    ami_release = _ami_release_version(r, kubernetes_version, (system, *gpu_groups))
    cfg = EnvironmentConfig(
        name=name, account=account, region=region, facts=facts, availability_zones=azs,
        network=network, kubernetes_version=kubernetes_version,
        ami_release_version=ami_release,
        nat_gateways=nat, cluster_endpoint=EndpointAccessConfig(public, cidrs),
        admin_role_names=r.strings("adminRoleNames", (), pattern=r"[\w+=,.@-]{1,64}",
                                   allowed="IAM role names (not ARNs) in the account"),
        system_nodes=system, gpu_node_groups=gpu_groups, cache=cache,
        observability=observability,
        public_listener=public_listener, listener=listener,
        use_ecr_images=use_ecr,
        retain_data=r.choice("removalPolicy", REMOVAL, "retain") == "retain",
        bucket_encryption=r.choice("bucketEncryption", BUCKET_ENCRYPTION, "kms"),
        log_retention_days=r.choice("logRetentionDays", LOG_RETENTION_DAYS, 90),
        endpoint_files=r.strings("endpoints", (), allowed="a list of endpoint file paths"),
        instance_hourly_usd=dict(prices), instance_prices=own_prices, tags=tags, instance_type_map=dict(type_map),
        image_bases=_image_bases(name, r.get("imageBases", Mapping, {}, allowed="an object: "
                                             "your worker image -> the image it is built FROM")),
        ttft_objective_seconds=float(ttft) if ttft is not None else None,
        router_implementations=dict(routers),
        alert_subscriptions=_alert_subscriptions(r.child("alerts", {})),
        managed_grafana=managed_grafana,
        hosted_zones=_hosted_zones(name, r.get(
            "hostedZones", list, [], allowed="a list of {id: Z..., name: domain}")),
        acknowledged_warnings=r.strings(
            "acknowledgedWarnings", (), pattern=ACK_PATTERN, allowed="the id synth prints "
            "as Acknowledge with 'Annotation::ID', without 'Annotation::': "
            "kvcache:changed:<endpoint>:<field>, kvcache:ignored, "
            "kvcache:check, kvcache:image-without-digest"),
        inference_gateway=(_inference_gateway(r.child("inferenceGateway"), system)
                           if "inferenceGateway" in r.data else None),
    )
    r.done()
    return cfg


def _image_bases(env: str, bases: Mapping) -> dict[str, str]:
    """`imageBases`: each of the team's worker images and the catalogue worker image it is
    built FROM, so its layout and releases (the drain, the stall probe, layerwise, the L2's
    guard) are known offline, before `mirror` reads its layers."""
    workers = sorted(f"{i.source.split('/', 1)[1]}:{i.tag}" for i in IMAGES.values()
                     if image_family(i) is not None)
    out = {}
    for written, base in bases.items():
        try:
            key = lock_key(image_for(written))     # as the endpoint file's image is keyed
        except ValueError as err:
            raise ConfigError(env, f"imageBases.{written}", written,
                              f"an image reference ({err})") from None
        catalogue = catalogue_key_for(base) if isinstance(base, str) else None
        if catalogue is None or image_family(IMAGES[catalogue]) is None:
            raise ConfigError(env, f"imageBases.{written}", base,
                              f"the worker image it is built FROM, one of {', '.join(workers)}")
        out[key] = catalogue
    return out


def _hourly_prices(env: str, where: str, prices: Mapping) -> dict[str, float]:
    for itype, price in prices.items():
        # EC2 types, and ElastiCache node types (the plan counts both and names either
        # where no table prices it)
        if itype not in PSEUDO_TYPES and not re.fullmatch(
                r"(cache\.)?[a-z0-9-]+\.[a-z0-9]+", itype, re.A):
            raise ConfigError(env, where, itype, "EC2 instance types as keys, e.g. g5.24xlarge"
                              + (f", ElastiCache node types (cache.r7g.large), or "
                                 f"{', '.join(PSEUDO_TYPES)}" if where != "instanceHourlyUsd"
                                 else ""))
        if isinstance(price, bool) or not isinstance(price, (int, float)) or \
                not 0 < price < math.inf:
            raise ConfigError(env, f"{where}.{itype}", price, "a positive number")
    return dict(prices)


def _instance_prices(env: str, region: str, r: "_Reader | None") -> PriceTable | None:
    """`instancePrices`: {currency, hourly: {type: price}, source}: the region's own currency
    only (a CNY region's bill is not USD at another rate)."""
    if r is None:
        return None
    currency = r.choice("currency", (region_currency(region),))
    hourly = _hourly_prices(env, "instancePrices.hourly", r.get(
        "hourly", Mapping, allowed="an object of instance type -> hourly price"))
    source = r.get("source", str, "the environment file", allowed="where the prices come from")
    r.done()
    return PriceTable(currency, f"{source} (instancePrices)", "-", hourly)


def resolve_environment(context: Mapping[str, Any]) -> EnvironmentConfig:
    """Pick `-c env=NAME` (else cdk.json's `defaultEnvironment`, else the only one declared)
    and apply `-c china=true|false`.

    A China region implies the China variant. `china=true` on a global environment applies its
    `chinaVariant` overrides (region, account, zones, node types...); a flag that contradicts the
    resulting region is an error.
    """
    envs = context.get("environments")
    if not isinstance(envs, Mapping) or not envs:
        raise ConfigError("-", "environments", envs, "an object of environments (one file "
                          "each: environments/NAME.json)")
    name = context.get("env", context.get("defaultEnvironment"))
    if name is None and len(envs) == 1:
        name = next(iter(envs))
    if not isinstance(name, str) or name not in envs:
        raise ConfigError(str(name), "env", name, ", ".join(sorted(envs)) + " (environments/"
                          "NAME.json; pick one with -c env=NAME, make synth ENV=NAME, or the "
                          "tools' --env NAME)")
    if not isinstance(envs[name], Mapping):
        raise ConfigError(name, "<environment>", envs[name], "a JSON object of fields")
    raw = dict(envs[name])
    china_flag = _flag(name, context.get("china"))
    variant = raw.pop("chinaVariant", None)
    if variant is not None and not isinstance(variant, Mapping):
        raise ConfigError(name, "chinaVariant", variant, "a JSON object of overrides")
    if china_flag and variant is not None and not str(raw.get("region", "")).startswith("cn-"):
        raw = {**raw, **variant}
        name = f"{name}-cn"
    region = raw.get("region")
    is_china = isinstance(region, str) and region.startswith("cn-")
    if china_flag is True and not is_china:
        raise ConfigError(name, "china", True,
                          f"false for region {region!r}, or add a chinaVariant with a China region")
    if china_flag is False and is_china:
        raise ConfigError(name, "china", False, f"true (region {region} is in AWS China)")
    return parse_environment(name, raw)


def _flag(env: str, value: Any) -> bool | None:
    if value is None or isinstance(value, bool):
        return value
    text = str(value).lower()
    if text in ("true", "false"):
        return text == "true"
    raise ConfigError(env, "china", value, "true, false")


_ZONE_ID = re.compile(r"Z[A-Z0-9]{1,32}")
_DOMAIN = re.compile(r"([a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?\.)+[a-z]{2,63}")


def _hosted_zones(env: str, items: list) -> tuple[HostedZone, ...]:
    """`hostedZones`: the Route 53 zones endpoint files may name in dnsConfig.hostedZoneId."""
    out = []
    for i, z in enumerate(items):
        if not (isinstance(z, Mapping) and set(z) == {"id", "name"}
                and isinstance(z["id"], str) and _ZONE_ID.fullmatch(z["id"])
                and isinstance(z["name"], str) and _DOMAIN.fullmatch(z["name"].rstrip("."))):
            raise ConfigError(env, f"hostedZones[{i}]", z, "{id: a Route 53 hosted zone id "
                              "(Z...), name: its domain, e.g. models.example.com}")
        out.append(HostedZone(z["id"], z["name"].rstrip(".")))
    if len({z.id for z in out}) != len(out):
        raise ConfigError(env, "hostedZones", [z.id for z in out], "each zone once")
    return tuple(out)
