"""The one pinned catalogue of images and charts. Charts, ECR repositories, the mirror tool and
preflight all read these entries, so what is mirrored is exactly what is deployed.

Every image is pinned by tag AND digest (the multi-arch index digest, which `skopeo copy --all`
preserves, so `repo:tag@digest` resolves in ECR too). Never `latest`.

A team's own pins live apart from this source, in `images.lock.json` at the repository root
(IMAGES_LOCK, below): digests for any image (catalogue or endpoint file), and the vLLM/LMCache
pair `python -m tools mirror` read from an image's own layers (tools/image_pair.py).
"""
from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, replace
from typing import Iterable, Mapping

from .context import ROOT
from .errors import ConfigError, excerpt
from .regions import RegionFacts

MIRROR_PREFIX = "kvcache"


# When an environment deploys an image (deployed_images): every environment; only with
# in-cluster Prometheus/Grafana (observability: self-hosted); only with the in-cluster L2
# (k8s/serving.py in_cluster_cache); only where an endpoint file names it; never as such (the
# base the router image is built on, whose layers it carries).
ALWAYS, SELF_HOSTED_OBSERVABILITY, IN_CLUSTER_CACHE, NAMED, BASE = (
    "always", "self-hosted observability", "in-cluster cache", "named", "base")
EFA_NODES = "efa nodes"   # only where a GPU node group has efa: true
INFERENCE_GATEWAY = "inference gateway"   # only where an endpoint joins inferenceGateway


# The Kubernetes minors an environment may run (`kubernetesVersion`): each is supported by EKS in
# both partitions in November 2026 (1.33 in extended support, 1.34 to 1.36 in standard support;
# the EKS user guide's version calendar), its CDK kubectl layer is a dependency
# (requirements.txt: aws-cdk.lambda-layer-kubectl-vNN), and Cluster Autoscaler runs the same
# minor (its compatibility rule). Tags: the newest patch of each minor that kubernetes/k8s.io
# promoted to registry.k8s.io by July 2026 (PR 9676: v1.36.0, v1.34.4, v1.33.5), 1.35's a later
# one. Only 1.35's digest has a public record here: the others are pinned by tag until
# `python -m tools mirror --resolve --only cluster-autoscaler-<minor>` prints theirs (synth
# warns for the one an environment deploys, as for every image without a digest).
AUTOSCALER: dict[str, tuple[str, str | None]] = {
    "1.33": ("v1.33.5", None),
    "1.34": ("v1.34.4", None),
    "1.35": ("v1.35.2", "sha256:aac369dc283927a623deb1af54696efcc722ae79255aa07788422e495bab887d"),
    "1.36": ("v1.36.0", None),
}
KUBERNETES_VERSIONS = tuple(AUTOSCALER)


def autoscaler_key(version: str) -> str:
    """The catalogue key of the Cluster Autoscaler image for Kubernetes `version` (a minor)."""
    return f"cluster-autoscaler-{version}"


def kubernetes(version: str) -> str:
    """`Image.deployed` of what only a cluster of this Kubernetes minor deploys."""
    return f"kubernetes {version}"


@dataclass(frozen=True)
class BuiltLayers:
    """What an image we build held when its digest was pinned, whatever compressed it: each
    platform's own layer by its uncompressed digest (its config's last diff_id), and the zlib
    whose gzip bytes the pinned digest covers. A build whose digest differs says from these
    whether an input changed or only the compressor (tools/image_build.py pin_mismatch)."""

    zlib: str                                  # zlib.ZLIB_RUNTIME_VERSION of the pinning build
    diff_ids: tuple[tuple[str, str], ...]      # (platform, sha256:<64 hex>)

    def __post_init__(self) -> None:
        for platform, diff_id in self.diff_ids:
            if not re.fullmatch(r"sha256:[0-9a-f]{64}", diff_id):
                raise ValueError(f"BuiltLayers {platform}: {diff_id!r} is not sha256:<64 hex>")


@dataclass(frozen=True)
class Image:
    key: str
    source: str     # registry/repository, e.g. docker.io/lmcache/vllm-openai
    tag: str
    digest: str | None  # sha256:<64 hex> of the multi-arch index
    purpose: str
    written: str | None = None  # an endpoint file's image, as the file writes it
    deployed: str = ALWAYS      # when an environment deploys it (above)
    built_from: str | None = None   # catalogue key of its base: built by `tools mirror`
    built_layers: BuiltLayers | None = None   # with `digest`, for an image we build
    # the team's statement (environment `imageBases`): its image is built FROM this catalogue
    # image, so it has that image's layout (family) and vLLM/LMCache releases, until mirror
    # reads the image's own layers (images.lock.json wins)
    based_on: str | None = None

    @property
    def mirror_repository(self) -> str:
        """ECR repository name: the source path under our prefix (registry host dropped)."""
        return f"{MIRROR_PREFIX}/{self.source.split('/', 1)[1]}"

    @property
    def pin(self) -> str:
        return f"{self.tag}@{self.digest}" if self.digest else self.tag

    @property
    def source_ref(self) -> str:
        return f"{self.source}:{self.pin}"


# The router image: built, not pulled (tools/router_image.py, by `python -m tools mirror`),
# from images/router/lock.json. Its tag names the router releases and the lock's hash, so a
# changed input is a new tag (ECR tags are immutable); its digest is the same wherever it is
# built with the same zlib (tools/image_build.py), printed by `python -m tools mirror --resolve
# --only router` with its BuiltLayers (its layers' uncompressed digests), to pin beside it.
ROUTER_LOCK = ROOT / "images" / "router" / "lock.json"


def router_tag(lock: bytes) -> str:
    """`<vllm-router>-<sglang-router>-<12 hex of the lock>`."""
    pins = dict(r.split("==", 1) for r in json.loads(lock)["requirements"])
    return (f"{pins['vllm-router']}-{pins['sglang-router']}-"
            f"{hashlib.sha256(lock).hexdigest()[:12]}")


IMAGES: dict[str, Image] = {i.key: i for i in (
    # No public record ties a digest to an lmcache/vllm-openai tag yet: `digest=None` makes
    # the mirror tool resolve and print it, and synth warns until it is filled in here.
    Image("vllm-lmcache", "docker.io/lmcache/vllm-openai", "v0.5.4", None,
          "vLLM 0.27.1 + LMCache 0.5.4: workers of the files that name it", deployed=NAMED),
    Image("valkey", "docker.io/valkey/valkey", "9.0.2-alpine",
          "sha256:68677f85c863830af7836ff07c4a13b7f085ebeff62f4dedb71499ca27d229f2",
          "self-hosted L2 cache", deployed=IN_CLUSTER_CACHE),
    # v1.89.0's digest as two independent public records pin it (a compose file pulling by
    # digest, an ops log of the running image); `mirror --resolve` prints it to re-check.
    Image("redis-exporter", "docker.io/oliver006/redis_exporter", "v1.89.0",
          "sha256:fed773ffd2bb2eac706e0ed9cc2fff41651193ee4977e2a4f6919658ad2313f4",
          "Valkey metrics: sidecar in the self-hosted L2 cache pod", deployed=IN_CLUSTER_CACHE),
    Image("aws-cli", "docker.io/amazon/aws-cli", "2.37.5",
          "sha256:fb7ccfc7b4e3a05017e6c9ded4ba959b99af622130e211fb976c68c2f4d3f224",
          "init containers: stage weights from S3, fetch the cache secret"),
    Image("python", "docker.io/library/python", "3.12.13-slim-bookworm",
          "sha256:8a7e7cc04fd3e2bd787f7f24e22d5d119aa590d429b50c95dfe12b3abe52f48b",
          "base of the router image", deployed=BASE),
    Image("router", "kvcache-eks/router", router_tag(ROUTER_LOCK.read_bytes()), None,
          "routers (vllm-router, sglang-router) and their HAProxy front", built_from="python"),
    Image("nvidia-device-plugin", "nvcr.io/nvidia/k8s-device-plugin", "v0.18.2",
          "sha256:b5788e29e7ae5272de8de863ebe386d6611e608421a6ecc5b4e7d5952aba637f",
          "exposes nvidia.com/gpu on AL2023 NVIDIA nodes"),
    # The EKS add-on registry's EFA device plugin (the eks-charts chart's image; the same image
    # in every region's registry). No public record pins its digest: `mirror --resolve`.
    Image("efa-device-plugin",
          "602401143452.dkr.ecr.us-west-2.amazonaws.com/eks/aws-efa-k8s-device-plugin",
          "v0.5.20", None, "exposes vpc.amazonaws.com/efa on EFA node groups (P/D)",
          deployed=EFA_NODES),
    # The Gateway API Inference Extension's endpoint picker at the release whose InferencePool
    # CRD and plugin names k8s/gateway.py renders (tests/fixtures/gateway/README.md). No digest
    # could be read where this was written: the mirror resolves and prints it, synth warns.
    Image("epp", "registry.k8s.io/gateway-api-inference-extension/epp", "v1.5.0", None,
          "endpoint picker (ext-proc) of an endpoint's InferencePool (k8s/gateway.py)",
          deployed=INFERENCE_GATEWAY),
    Image("keda", "ghcr.io/kedacore/keda", "2.20.2",
          "sha256:fe74c7b8849586a67ad2201bcb89e7f5ac221ff90399ecaa8fd28427f1ef11e6",
          "KEDA operator: scales workers on Prometheus/AMP queries"),
    Image("keda-metrics-apiserver", "ghcr.io/kedacore/keda-metrics-apiserver", "2.20.2",
          "sha256:27286536a8a775aeeee37a7e343f8ecebb27ebf680ee1181a4f99e82eefb253b",
          "KEDA external metrics API server"),
    Image("keda-admission-webhooks", "ghcr.io/kedacore/keda-admission-webhooks", "2.20.2",
          "sha256:41f74102aba7959c6e8d08b433ab8a5fd6cae7c5646c78f7fe3de40a52df3439",
          "KEDA admission webhooks"),
    *(Image(autoscaler_key(version), "registry.k8s.io/autoscaling/cluster-autoscaler", tag,
            digest, f"GPU and system node groups follow pending pods (Kubernetes {version})",
            deployed=kubernetes(version))
      for version, (tag, digest) in AUTOSCALER.items()),
    # Observability: kube-prometheus-stack 88.5.2's images (public lock of that chart version)
    # and NVIDIA's DCGM exporter. Tag@digest pairs from /tmp/research/images.md.
    Image("prometheus", "quay.io/prometheus/prometheus", "v3.14.0-distroless",
          "sha256:50c707e96da5ade383cb1707790576480485e93de06aa60ad8802cb5f744bd0a",
          "Prometheus: agent remote-writing to AMP (global), server (China)"),
    Image("alertmanager", "quay.io/prometheus/alertmanager", "v0.34.0",
          "sha256:690c7b525f4367aa91f73e2f91c632206d32e97c6384bdbf2fb7a861b420340d",
          "Alertmanager for the in-cluster Prometheus (China)",
          deployed=SELF_HOSTED_OBSERVABILITY),
    Image("prometheus-operator", "quay.io/prometheus-operator/prometheus-operator", "v0.93.1",
          "sha256:e52bb28fd41c98dd407c7a8cba8bdcfe7eabd7447e250afaf1fe7bb816dedbff",
          "Prometheus Operator (kube-prometheus-stack)"),
    Image("prometheus-config-reloader",
          "quay.io/prometheus-operator/prometheus-config-reloader", "v0.93.1",
          "sha256:428f088fe6fe07ab138bda92113664b04848a1dc408e4d3680a60ecdb55d1a65",
          "config reloader sidecar the operator adds to Prometheus and Alertmanager"),
    Image("node-exporter", "quay.io/prometheus/node-exporter", "v1.12.1-distroless",
          "sha256:8c9bac11973b94b59be88d6e11fee4429aa743c8846cdc75d65b18db33f6a106",
          "node metrics on every node"),
    Image("kube-state-metrics", "registry.k8s.io/kube-state-metrics/kube-state-metrics",
          "v2.20.0", "sha256:42cfe3723a5f058171c627537fb57a3ea0f26e4380fa18555a95cb1a1b4cfc5b",
          "Kubernetes object state (pod readiness, replicas)"),
    Image("grafana", "docker.io/grafana/grafana", "13.2.0",
          "sha256:3fd54ae1214669f8355f065ec9f6445d5279a3d77095ab048ca045685272429b",
          "in-cluster Grafana (China)", deployed=SELF_HOSTED_OBSERVABILITY),
    Image("k8s-sidecar", "quay.io/kiwigrid/k8s-sidecar", "2.10.1",
          "sha256:7eac5c4fed714a18d038fc9fea57d8744d113367935dac0ea4eb6a87cef704a3",
          "Grafana sidecar loading dashboards and data sources from ConfigMaps",
          deployed=SELF_HOSTED_OBSERVABILITY),
    Image("dcgm-exporter", "nvcr.io/nvidia/k8s/dcgm-exporter", "4.5.3-4.8.2-distroless",
          "sha256:60d3b00ac80b4ae77f94dae2f943685605585ad9e92fdccda3154d009ae317cc",
          "GPU metrics on GPU nodes"),
)}


# --- The team's file: images.lock.json. Not the project's source (an upstream update never
# touches it): the team commits it. One entry per image, keyed `registry/repository:tag`:
#   {"digest": "sha256:<64 hex>"}                          a pin, for any image (router too)
#   {"digest": ..., "vllm": "0.11.0", "lmcache": "0.3.9", "read": "<how, when>"}
#                                                          the pair mirror read from its layers
IMAGES_LOCK = ROOT / "images.lock.json"
LOCK_FIELDS = ("digest", "vllm", "lmcache", "read")
RECORDED, CATALOGUE, UNKNOWN = "recorded", "catalogue", "unknown"
_RELEASE = re.compile(r"(\d+)\.(\d+)(?:\.(\d+))?")


class LockError(ConfigError):
    """A bad images.lock.json entry: one line naming the file, entry, field and what is allowed."""

    def __init__(self, where: str, value: object, allowed: str):
        self.environment, self.field, self.value, self.allowed = IMAGES_LOCK.name, where, value, \
            allowed
        ValueError.__init__(self, f"{IMAGES_LOCK.name}: {where} = {excerpt(value)} is not valid; "
                                  f"allowed: {allowed}")


def release_of(version: str | None) -> "Version | None":
    """(major, minor, patch) of a PEP 440 version string (`0.3.9.post1` -> (0, 3, 9))."""
    m = _RELEASE.match(version or "")
    return (int(m[1]), int(m[2]), int(m[3] or 0)) if m else None


@dataclass(frozen=True)
class ImageRecord:
    reference: str          # registry/repository:tag
    digest: str
    vllm: str | None = None
    lmcache: str | None = None
    read: str | None = None   # how the pair was read; None: a pinned digest only

    @property
    def has_pair(self) -> bool:
        return self.read is not None


def load_lock(path) -> dict[str, ImageRecord]:
    """The records of `path` (absent: none), keyed `registry/repository:tag` as parse_reference
    normalizes it. Raises LockError for the first bad entry."""
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_text())
    except ValueError as err:
        raise LockError("(file)", str(err), "JSON: an object of image entries") from None
    if not isinstance(data, dict):
        raise LockError("(file)", type(data).__name__, "an object keyed registry/repository:tag")
    records: dict[str, ImageRecord] = {}
    for written, entry in data.items():
        try:
            registry, repo, tag, digest = parse_reference(written)
        except ValueError as err:
            raise LockError(repr(written), written, f"an image reference: {err}") from None
        if digest:
            raise LockError(repr(written), written, "registry/repository:tag (the digest goes "
                            "in its \"digest\" field)")
        if not isinstance(entry, dict):
            raise LockError(written, entry, 'an object with "digest" (and "vllm", "lmcache", '
                            '"read" where mirror read them)')
        for field in entry:
            if field not in LOCK_FIELDS:
                raise LockError(f"{written}.{field}", entry[field], ", ".join(LOCK_FIELDS))
        if not isinstance(entry.get("digest"), str) or not _DIGEST.fullmatch(entry["digest"]):
            raise LockError(f"{written}.digest", entry.get("digest"), "sha256:<64 hex>")
        pair = [f for f in ("vllm", "lmcache", "read") if f in entry]
        if pair and len(pair) != 3:
            raise LockError(f"{written}.{pair[0]}", entry[pair[0]], 'with "vllm", "lmcache" and '
                            '"read" together (null where the image has no such package)')
        for field in ("vllm", "lmcache"):
            value = entry.get(field)
            if value is not None and (not isinstance(value, str) or release_of(value) is None):
                raise LockError(f"{written}.{field}", value, "a version string (0.11.0) or null")
        if pair and not isinstance(entry["read"], str):
            raise LockError(f"{written}.read", entry["read"], "a string: how the pair was read")
        key = f"{registry}/{repo}:{tag}"
        records[key] = ImageRecord(key, entry["digest"], entry.get("vllm"),
                                   entry.get("lmcache"), entry.get("read"))
    return records


_LOCK: dict[tuple[str, int | None], dict[str, ImageRecord]] = {}


def lock_records() -> dict[str, ImageRecord]:
    """IMAGES_LOCK's records, read again only when the file changes (mirror writes it)."""
    key = (str(IMAGES_LOCK), IMAGES_LOCK.stat().st_mtime_ns if IMAGES_LOCK.exists() else None)
    if key not in _LOCK:
        _LOCK[key] = load_lock(IMAGES_LOCK)
    return _LOCK[key]


def lock_key(image: Image) -> str:
    """How images.lock.json names the image: `registry/repository:tag`, as Docker reads it
    (the router, built here as `kvcache-eks/router`, is `docker.io/kvcache-eks/router`)."""
    registry, path, tag, _ = parse_reference(f"{image.source}:{image.tag}")
    return f"{registry}/{path}:{tag}"


def built_from_stated(image: Image, bases: Mapping[str, str]) -> Image:
    """`image`, built FROM the catalogue image the environment's `imageBases` states for it
    (keyed as lock_key names images), where it states one."""
    base = bases.get(lock_key(image))
    return replace(image, based_on=base) if base else image


def record_for(image: Image) -> ImageRecord | None:
    """The team's record of this image, where one holds for it: same repository and tag, and
    the same digest where the image names one (a record of other bytes says nothing of these)."""
    record = lock_records().get(lock_key(image))
    if record is None or (image.digest and record.digest != image.digest
                          and image.key not in IMAGES):
        return None
    return record


def pinned(image: Image) -> Image:
    """The image with the team's recorded digest, where the record has one: a catalogue image
    without a digest gets it, one with a digest takes the team's (their pin overrides ours)."""
    record = lock_records().get(lock_key(image))
    if record is None or record.digest == image.digest:
        return image
    if image.key not in IMAGES and image.digest:   # the file's own pin wins over a record
        return image
    written = image.written and f"{image.written.partition('@')[0]}@{record.digest}"
    return replace(image, digest=record.digest, written=written)


def deployed_images(endpoint_images: Iterable[Image], *, kubernetes_version: str,
                    self_hosted_observability: bool, in_cluster_cache: bool,
                    efa_nodes: bool = False, inference_gateway: bool = False) -> list[Image]:
    """What one environment deploys: the catalogue images its parts use and every endpoint
    file's worker image. What the mirror copies (or builds), what ECR holds repositories for
    and what preflight checks, one entry per repository and tag."""
    wanted = {ALWAYS, kubernetes(kubernetes_version),
              *([SELF_HOSTED_OBSERVABILITY] if self_hosted_observability else []),
              *([IN_CLUSTER_CACHE] if in_cluster_cache else []),
              *([EFA_NODES] if efa_nodes else []),
              *([INFERENCE_GATEWAY] if inference_gateway else [])}
    seen: dict[tuple[str, str], Image] = {}
    for image in (*(i for i in IMAGES.values() if i.deployed in wanted), *endpoint_images):
        seen.setdefault((image.mirror_repository, image.tag), pinned(image))
    return list(seen.values())


def unpinned_images() -> list[Image]:
    """Images still waiting for a digest: synth warns about each until it is pinned."""
    return [i for i in map(pinned, IMAGES.values()) if not i.digest]


@dataclass(frozen=True)
class Chart:
    """A Helm chart the cluster installs: upstream repository in global regions, or the OCI
    copy the mirror tool pushes to `<account ECR>/kvcache/charts/<name>` (China)."""

    key: str
    name: str
    repository: str          # upstream https Helm repository
    version: str
    images: tuple[str, ...]  # catalogue keys of the images its values point at

    @property
    def mirror_repository(self) -> str:
        return f"{MIRROR_PREFIX}/charts/{self.name}"


CHARTS: dict[str, Chart] = {c.key: c for c in (
    Chart("keda", "keda", "https://kedacore.github.io/charts", "2.20.2",
          ("keda", "keda-metrics-apiserver", "keda-admission-webhooks")),
    Chart("cluster-autoscaler", "cluster-autoscaler", "https://kubernetes.github.io/autoscaler",
          "9.54.0", tuple(autoscaler_key(v) for v in AUTOSCALER)),
    # The chart CDK's AlbController installs for ALB_CONTROLLER_VERSION; its image comes from
    # the region's EKS add-on registry, its chart from the mirror where public repos are out.
    Chart("aws-load-balancer-controller", "aws-load-balancer-controller",
          "https://aws.github.io/eks-charts", "1.13.3", ()),
    # Operator v0.93.1, Prometheus v3.14.0, Grafana 13.2.0 (subchart grafana 12.11.1),
    # kube-state-metrics 2.20.0, node-exporter 1.12.1. Its admission-webhook certgen image is
    # not mirrored: k8s/monitoring.py turns the webhooks off.
    Chart("kube-prometheus-stack", "kube-prometheus-stack",
          "https://prometheus-community.github.io/helm-charts", "88.5.2",
          ("prometheus", "alertmanager", "prometheus-operator", "prometheus-config-reloader",
           "node-exporter", "kube-state-metrics", "grafana", "k8s-sidecar")),
)}


@dataclass(frozen=True)
class ImageResolver:
    """Turns a catalogue key into the reference a pod pulls: the account's ECR mirror where the
    environment uses it (always in China), otherwise the upstream registry; pinned either way."""

    use_ecr: bool
    account: str
    facts: RegionFacts

    @property
    def registry(self) -> str | None:
        return f"{self.account}.{self.facts.ecr_host_suffix}" if self.use_ecr else None

    def chart_source(self, key: str) -> tuple[str, str]:
        """(repository, chart) for eks.HelmChart: CDK's kubectl handler logs into ECR for oci://."""
        chart = CHARTS[key]
        if not self.use_ecr:
            return chart.repository, chart.name
        return f"oci://{self.registry}/{chart.mirror_repository}", chart.name

    def repository_of(self, key: str) -> str:
        """Registry/repository without tag, for charts that take image.repository + tag."""
        image = IMAGES[key]
        return f"{self.registry}/{image.mirror_repository}" if self.use_ecr else image.source

    def uri(self, key: str) -> str:
        return self.resolve(pinned(IMAGES[key]))

    def resolve(self, image: Image) -> str:
        """Upstream as written (endpoint files) or pinned (catalogue); the mirror in ECR. An
        image we build has no upstream: the account's ECR everywhere."""
        if image.built_from:
            return f"{self.account}.{self.facts.ecr_host_suffix}/{image.mirror_repository}:" \
                f"{image.pin}"
        if not self.use_ecr:
            return image.written or image.source_ref
        return f"{self.registry}/{image.mirror_repository}:{image.pin}"

# Installed by CDK's AlbController from the region's EKS add-on registry (not mirrored).
ALB_CONTROLLER_VERSION = "v2.13.3"

_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
_PATH = re.compile(r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*")
_TAG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")   # Docker's grammar (ASCII only)
# A registry host: DNS labels, or localhost, with an optional port.
_REGISTRY = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*"
                       r"[A-Za-z0-9])?)*(?::[0-9]{1,5})?")


def parse_reference(reference: str) -> tuple[str, str, str, str | None]:
    """(registry, path, tag, digest) of an image reference as Docker reads it: the first part is
    a registry only if it has a '.' or ':' or is localhost; Docker Hub paths of one part live
    under `library/`; no tag means `latest`. Raises ValueError saying what is wrong."""
    name, _, digest = reference.partition("@")
    if digest and not _DIGEST.fullmatch(digest):
        raise ValueError("a digest of the form sha256:<64 hex>")
    head, _, rest = name.partition("/")
    if rest and ("." in head or ":" in head or head == "localhost"):
        registry, remainder = head, rest
    else:
        registry, remainder = "docker.io", name
    path, _, tag = remainder.partition(":")
    if registry == "docker.io" and "/" not in path:
        path = f"library/{path}"
    port = registry.partition(":")[2]
    if not _REGISTRY.fullmatch(registry) or (port and not 0 < int(port) <= 65535):
        raise ValueError("a registry host[:port] of letters, digits, '.' and '-'")
    if not _PATH.fullmatch(path) or len(registry) + len(path) > 255:
        raise ValueError("a repository path of lowercase letters, digits and . _ - / (at most "
                         "255 characters with the registry)")
    tag = tag or "latest"
    if not _TAG.fullmatch(tag):
        raise ValueError("a tag of letters, digits, '_', '.' and '-'")
    return registry, path, tag, digest or None


def image_for(reference: str) -> Image:
    """The catalogue entry an endpoint file's image names, or a new entry for it. Mirror, ECR
    repositories and charts then treat both alike (`kvcache/<source path>:<tag>`)."""
    key = catalogue_key_for(reference)
    if key is not None:
        return pinned(IMAGES[key])
    registry, path, tag, digest = parse_reference(reference)
    if digest and ":" not in reference.partition("@")[0].rsplit("/", 1)[-1]:
        # digest only: the mirror's tag names the digest (`latest` would be every such
        # image's, and ECR's immutable tags refuse the second)
        tag = "sha256-" + digest.removeprefix("sha256:")
    return pinned(Image(f"{path}:{tag}", f"{registry}/{path}", tag, digest,
                        "worker image named by an endpoint file", written=reference))


# vLLM published KV events (`--kv-events-config`, which kvaware needs) from 0.9.0 on. Where an
# image's vLLM version is known, kvaware is allowed or refused; elsewhere it is only a warning.
KV_EVENTS_SINCE = (0, 9)


def vllm_version(image: Image) -> tuple[int, int] | None:
    """The vLLM (major, minor) an image carries, where we know it; None where we do not."""
    version = image_release(image).vllm
    return version[:2] if version else None


def catalogue_key_for(reference: str) -> str | None:
    """Match an image as HyperPod files write it (`lmcache/vllm-openai:v0.5.4`) to the catalogue."""
    repo, _, tag = reference.partition("@")[0].rpartition(":")
    for image in IMAGES.values():
        path = image.source.split("/", 1)[1]
        if tag == image.tag and repo in (image.source, path, f"docker.io/{path}"):
            return image.key
    return None


# --- Worker image families: where each image keeps vLLM, as its published Dockerfile lays it out.
# The workers chart replaces the image's ENTRYPOINT (it wraps vLLM in a shell that clears the
# metrics directory and reads the API key), so it must name a binary the image really has; the
# entrypoint gate (tests/k8s/test_worker_entrypoint.py) runs the rendered command in a fake root
# laid out from these facts. `lmcache` is the LMCache release the image carries, which decides
# what the LMCache config may say (k8s/workers.py TIER_POLICY); None where no public record
# pins it (the config then holds only what every LMCache release we know reads).

# PATH of an nvidia/cuda base image (ENV in its Dockerfile), which none of the families changes
# except where noted.
CUDA_BASE_PATH = ("/usr/local/nvidia/bin", "/usr/local/cuda/bin", "/usr/local/sbin",
                  "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin")


@dataclass(frozen=True)
class ImageFamily:
    key: str
    path: tuple[str, ...]        # PATH in the image
    vllm: str                    # the `vllm` console script (absolute)
    python: str                  # the python that imports vllm (absolute)
    entrypoint: tuple[str, ...]  # the image's ENTRYPOINT, as published
    other_pythons: tuple[str, ...]   # pythons on PATH WITHOUT vllm (a trap for `python3 -m`)
    on_path: frozenset[str]      # bare names that reach vLLM through PATH
    source: str                  # where the facts come from


LMCACHE_VENV = ImageFamily(
    "lmcache-venv", CUDA_BASE_PATH, "/opt/venv/bin/vllm", "/opt/venv/bin/python",
    ("/opt/venv/bin/vllm", "serve"), ("/usr/bin/python3",), frozenset(),
    "LMCache docker/Dockerfile, lmcache/vllm-openai v0.3.0 to v0.3.9post1: uv venv /opt/venv "
    "holds vLLM and LMCache, PATH not extended, ENTRYPOINT /opt/venv/bin/vllm serve (LMCache "
    "issue #1645, PR #1962; production-stack issue #676 and deployment-vllm-multi.yaml call "
    "/opt/venv/bin/vllm); the system python3 has no vllm")
LMCACHE_PATH = ImageFamily(
    "lmcache-path", ("/opt/venv/bin", *CUDA_BASE_PATH), "/opt/venv/bin/vllm",
    "/opt/venv/bin/python", ("/opt/venv/bin/vllm", "serve"), (),
    frozenset({"vllm", "python", "python3"}),
    "LMCache docker/Dockerfile from PR #1962 (tags after v0.3.9post1, latest): the same "
    "/opt/venv, with ENV PATH=/opt/venv/bin:$PATH and VIRTUAL_ENV=/opt/venv")
VLLM_OPENAI = ImageFamily(
    "vllm-openai", CUDA_BASE_PATH, "/usr/local/bin/vllm", "/usr/bin/python3",
    ("vllm", "serve"), (), frozenset({"vllm", "python3"}),
    "vllm docker/Dockerfile, target vllm-openai: `uv pip install --system` into the deadsnakes "
    "python3 (/usr/bin/python3, dist-packages under /usr/local/lib), console scripts in "
    "/usr/local/bin; ENTRYPOINT [\"vllm\", \"serve\"] (older tags: python3 -m "
    "vllm.entrypoints.openai.api_server, the same vLLM); LMCache from "
    "requirements/kv_connectors.txt (`lmcache >= ...`, unpinned) when INSTALL_KV_CONNECTORS")
DLC_VLLM = ImageFamily(
    "dlc-vllm", ("/opt/amazon/openmpi/bin", "/opt/amazon/efa/bin", "/usr/local/cuda/bin",
                 *CUDA_BASE_PATH), "/usr/local/bin/vllm", "/usr/bin/python3",
    ("/usr/local/bin/dockerd_entrypoint.sh",), (), frozenset({"vllm", "python3", "python"}),
    "aws/deep-learning-containers vllm/x86_64/gpu/Dockerfile: FROM vllm/vllm-openai:<ver> "
    "(so vLLM as there), PATH prefixed with /opt/amazon/openmpi/bin:/opt/amazon/efa/bin:"
    "/usr/local/cuda/bin, ENTRYPOINT /usr/local/bin/dockerd_entrypoint.sh, which runs "
    "`python3 -m vllm.entrypoints.openai.api_server \"$@\"` (vllm/x86_64/build_artifacts)")
IMAGE_FAMILIES = (LMCACHE_VENV, LMCACHE_PATH, VLLM_OPENAI, DLC_VLLM)

_LMCACHE_TAG = re.compile(r"v(\d+)\.(\d+)\.(\d+)(?:\.?post(\d+))?$")


def image_family(image: Image) -> ImageFamily | None:
    """The family an image belongs to, by repository (and for lmcache/vllm-openai, by tag);
    None for an image we know nothing about (the chart then probes for vLLM). An image the
    environment states is built FROM a catalogue image (`imageBases`) has that one's."""
    if image.based_on in IMAGES:
        return image_family(IMAGES[image.based_on])
    path = image.source.split("/", 1)[1]
    if path == "lmcache/vllm-openai":
        m = _LMCACHE_TAG.match(image.tag)
        if m and (int(m[1]), int(m[2]), int(m[3])) <= (0, 3, 9):
            return LMCACHE_VENV       # v0.3.0 ... v0.3.9post1
        return LMCACHE_PATH           # later releases, latest, nightly
    if path == "vllm/vllm-openai":
        return VLLM_OPENAI
    if path.endswith("deep-learning-containers/vllm") or image.source.endswith(
            ".amazonaws.com/vllm"):
        return DLC_VLLM
    return None


Version = tuple[int, int, int]


@dataclass(frozen=True)
class ImageRelease:
    """The vLLM and LMCache releases an image carries, as its published build files say; None
    where they leave it open (an unpinned install resolved when the image was built, of which no
    record keeps the result). What a config key or a flag does depends on this pair
    (k8s/workers.py: the tier settings, layerwise and its guard)."""

    vllm: Version | None
    lmcache: Version | None
    source: str
    origin: str = CATALOGUE   # RECORDED (images.lock.json), CATALOGUE (below) or UNKNOWN

    def said(self) -> str:
        """The pair as synth states it, with where it comes from."""
        pair = " + ".join(f"{name} {'.'.join(map(str, v)) if v else 'unknown'}"
                          for name, v in (("vLLM", self.vllm), ("LMCache", self.lmcache)))
        where = {RECORDED: f"{IMAGES_LOCK.name}, read from the image", CATALOGUE:
                 "the catalogue, config/images.py", UNKNOWN: "unknown"}[self.origin]
        return f"{pair} ({where}: {self.source})"


# lmcache/vllm-openai release tags. LMCache's docker/Dockerfile, target `image-release` (built by
# .github/workflows/publish.yml when a release is published): `uv pip install vllm[runai,
# tensorizer]`, unpinned, so the newest vLLM on PyPI that day, then `uv pip install lmcache`,
# the release just published. The vLLM of a tag is therefore the newest vLLM on PyPI when that
# LMCache release was uploaded (PyPI upload times):
_LMCACHE_IMAGE_VLLM: dict[Version, tuple[Version, str]] = {
    (0, 3, 7): ((0, 10, 2), "LMCache 0.3.7 uploaded 2025-09-29; vLLM 0.10.2 (2025-09-13) was "
                "the newest, 0.11.0 followed on 2025-10-04"),
    (0, 5, 4): ((0, 27, 1), "LMCache 0.5.4 uploaded 2026-08-20; vLLM 0.27.1 (2026-08-11) was "
                "the newest, 0.28.0 followed on 2026-08-26"),
}
_LMCACHE_DOCKERFILE = ("LMCache docker/Dockerfile target image-release: unpinned `uv pip install "
                       "vllm`, then the LMCache release of the tag")
# vllm/vllm-openai: the tag is the vLLM release (vllm docker/Dockerfile builds the tag's
# source); LMCache comes from requirements/kv_connectors.txt, which names `lmcache` without a
# version (0.10.2 to 0.14.0) or with a floor only (`lmcache >= 0.3.9` by 0.27.1), resolved when
# the image was built. The AWS DLC vllm images are `FROM vllm/vllm-openai:v<version>`.
_VLLM_OPENAI = ("vllm docker/Dockerfile (the tag's own vLLM); LMCache from "
                "requirements/kv_connectors.txt, unpinned or a floor only")
_DLC = "aws/deep-learning-containers vllm/x86_64/gpu/Dockerfile: FROM vllm/vllm-openai:v<version>"
_VERSION_TAG = re.compile(r"v?(\d+)\.(\d+)\.(\d+)(?![\d.])")


def image_release(image: Image) -> ImageRelease:
    """The vLLM and LMCache the image carries: as mirror read them from its layers
    (images.lock.json), else as its build files say (the catalogue), else unknown."""
    record = record_for(image)
    if record is not None and record.has_pair:
        return ImageRelease(release_of(record.vllm), release_of(record.lmcache),
                            f"{record.digest[:19]}, {record.read}", RECORDED)
    release = catalogue_release(image)
    if release.vllm is None and release.lmcache is None:
        return replace(release, origin=UNKNOWN)
    return release


def catalogue_release(image: Image) -> ImageRelease:
    """What the image's build files say about the vLLM and LMCache it carries (for a team's
    image built FROM a catalogue one, as the environment's `imageBases` states: that one's)."""
    if image.based_on in IMAGES:
        base = IMAGES[image.based_on]
        release = catalogue_release(base)
        return replace(release, source=f"built FROM {base.source}:{base.tag}, as the "
                       f"environment's imageBases states ({release.source})")
    path = image.source.split("/", 1)[1]
    if path == "lmcache/vllm-openai":
        m = _LMCACHE_TAG.match(image.tag)
        if not m:        # latest, nightly, -lightweight builds: whatever was newest that day
            return ImageRelease(None, None, _LMCACHE_DOCKERFILE + "; a moving tag")
        lmcache = (int(m[1]), int(m[2]), int(m[3]))
        vllm, when = _LMCACHE_IMAGE_VLLM.get(lmcache, (None, "no record of its build date"))
        return ImageRelease(vllm, lmcache, f"{_LMCACHE_DOCKERFILE}; {when}")
    family = image_family(image)
    if family in (VLLM_OPENAI, DLC_VLLM):
        m = _VERSION_TAG.match(image.tag)
        vllm = (int(m[1]), int(m[2]), int(m[3])) if m else None
        return ImageRelease(vllm, None, _DLC if family is DLC_VLLM else _VLLM_OPENAI)
    return ImageRelease(None, None, "not an image family we know")


def lmcache_version(image: Image) -> Version | None:
    """The LMCache release an image carries, where a public record says (lmcache/vllm-openai
    release tags); vllm/vllm-openai and the DLC images install an unpinned `lmcache`: None."""
    return image_release(image).lmcache


# Worker images that carry `valkey-glide-sync`, which LMCache's `valkey://` connector imports
# (GLIDE's sync client: TLS, AUTH and cluster mode, what ElastiCache in cluster mode needs).
# The published lmcache/vllm-openai, vllm/vllm-openai and DLC images do not (LMCache does not
# require it), so none is listed: ElastiCache is then reached by `rediss://` on one shard
# (k8s/l2.py). A worker image built with it adds its catalogue key here.
GLIDE_IMAGES: frozenset[str] = frozenset()


def carries_glide(image: Image | None) -> bool:
    return image is not None and image.key in GLIDE_IMAGES


# Worker images that carry NVIDIA NIXL and libfabric's EFA provider, which vLLM's
# NixlConnector needs to move KV over EFA (k8s/pd.py): the two HyperPod's DPD documents
# ("A worker image that includes vLLM, LMCache, NVIDIA NIXL, and the EFA libfabric provider ...
# Both images include LMCache 0.4.3, vLLM 0.19.0, and NIXL 1.0.0": docs.aws.amazon.com/
# sagemaker/latest/dg/sagemaker-hyperpod-model-deployment-dpd.html). vllm/vllm-openai carries
# NIXL (requirements/kv_connectors.txt) but bundles no libfabric, so its LIBFABRIC backend has
# nothing to load: an image built with it is added here. Keyed by repository path and tag.
@dataclass(frozen=True)
class NixlImage:
    vllm: Version
    lmcache: Version
    nixl: Version
    source: str


_DPD_DOC = "HyperPod DPD guide (sagemaker-hyperpod-model-deployment-dpd), 2026-07"
NIXL_EFA_IMAGES: dict[tuple[str, str], NixlImage] = {
    ("deep-learning-containers/vllm", "server-hyperpod-cuda-v1.1"):
        NixlImage((0, 19, 0), (0, 4, 3), (1, 0, 0), _DPD_DOC),
    ("lmcache/vllm-openai", "v0.4.3"): NixlImage((0, 19, 0), (0, 4, 3), (1, 0, 0), _DPD_DOC),
}


def nixl_efa_image(image: Image | None) -> NixlImage | None:
    """What a worker image carries for NIXL over EFA, where a record says (above)."""
    if image is None:
        return None
    return NIXL_EFA_IMAGES.get((image.source.split("/", 1)[1], image.tag))
