"""The one pinned catalogue of images and charts. Charts, ECR repositories, the mirror tool and
preflight all read these entries, so what is mirrored is exactly what is deployed.

Every image is pinned by tag AND digest (the multi-arch index digest, which `skopeo copy --all`
preserves, so `repo:tag@digest` resolves in ECR too). Never `latest`.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable

from .regions import RegionFacts

MIRROR_PREFIX = "kvcache"


@dataclass(frozen=True)
class Image:
    key: str
    source: str     # registry/repository, e.g. docker.io/lmcache/vllm-openai
    tag: str
    digest: str | None  # sha256:<64 hex> of the multi-arch index
    purpose: str
    written: str | None = None  # an endpoint file's image, as the file writes it

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


IMAGES: dict[str, Image] = {i.key: i for i in (
    # No public record ties a digest to an lmcache/vllm-openai tag yet: `digest=None` makes
    # the mirror tool resolve and print it, and synth warns until it is filled in here.
    Image("vllm-lmcache", "docker.io/lmcache/vllm-openai", "v0.5.4", None,
          "vLLM 0.27.1 + LMCache 0.5.4: the workers"),
    Image("valkey", "docker.io/valkey/valkey", "9.0.2-alpine",
          "sha256:68677f85c863830af7836ff07c4a13b7f085ebeff62f4dedb71499ca27d229f2",
          "self-hosted L2 cache"),
    # v1.89.0's digest as two independent public records pin it (a compose file pulling by
    # digest, an ops log of the running image); `mirror --resolve` prints it to re-check.
    Image("redis-exporter", "docker.io/oliver006/redis_exporter", "v1.89.0",
          "sha256:fed773ffd2bb2eac706e0ed9cc2fff41651193ee4977e2a4f6919658ad2313f4",
          "Valkey metrics: sidecar in the self-hosted L2 cache pod"),
    Image("aws-cli", "docker.io/amazon/aws-cli", "2.37.5",
          "sha256:fb7ccfc7b4e3a05017e6c9ded4ba959b99af622130e211fb976c68c2f4d3f224",
          "init containers: stage weights from S3, fetch the cache secret"),
    Image("python", "docker.io/library/python", "3.12.13-slim-bookworm",
          "sha256:8a7e7cc04fd3e2bd787f7f24e22d5d119aa590d429b50c95dfe12b3abe52f48b",
          "base of the router image built from the pinned vllm-router wheel"),
    Image("nvidia-device-plugin", "nvcr.io/nvidia/k8s-device-plugin", "v0.18.2",
          "sha256:b5788e29e7ae5272de8de863ebe386d6611e608421a6ecc5b4e7d5952aba637f",
          "exposes nvidia.com/gpu on AL2023 NVIDIA nodes"),
    Image("keda", "ghcr.io/kedacore/keda", "2.20.2",
          "sha256:fe74c7b8849586a67ad2201bcb89e7f5ac221ff90399ecaa8fd28427f1ef11e6",
          "KEDA operator: scales workers on Prometheus/AMP queries"),
    Image("keda-metrics-apiserver", "ghcr.io/kedacore/keda-metrics-apiserver", "2.20.2",
          "sha256:27286536a8a775aeeee37a7e343f8ecebb27ebf680ee1181a4f99e82eefb253b",
          "KEDA external metrics API server"),
    Image("keda-admission-webhooks", "ghcr.io/kedacore/keda-admission-webhooks", "2.20.2",
          "sha256:41f74102aba7959c6e8d08b433ab8a5fd6cae7c5646c78f7fe3de40a52df3439",
          "KEDA admission webhooks"),
    Image("cluster-autoscaler", "registry.k8s.io/autoscaling/cluster-autoscaler", "v1.35.2",
          "sha256:aac369dc283927a623deb1af54696efcc722ae79255aa07788422e495bab887d",
          "GPU and system node groups follow pending pods (same minor as Kubernetes)"),
    # Observability: kube-prometheus-stack 88.5.2's images (public lock of that chart version)
    # and NVIDIA's DCGM exporter. Tag@digest pairs from /tmp/research/images.md.
    Image("prometheus", "quay.io/prometheus/prometheus", "v3.14.0-distroless",
          "sha256:50c707e96da5ade383cb1707790576480485e93de06aa60ad8802cb5f744bd0a",
          "Prometheus: agent remote-writing to AMP (global), server (China)"),
    Image("alertmanager", "quay.io/prometheus/alertmanager", "v0.34.0",
          "sha256:690c7b525f4367aa91f73e2f91c632206d32e97c6384bdbf2fb7a861b420340d",
          "Alertmanager for the in-cluster Prometheus (China)"),
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
          "in-cluster Grafana (China)"),
    Image("k8s-sidecar", "quay.io/kiwigrid/k8s-sidecar", "2.10.1",
          "sha256:7eac5c4fed714a18d038fc9fea57d8744d113367935dac0ea4eb6a87cef704a3",
          "Grafana sidecar loading dashboards and data sources from ConfigMaps"),
    Image("dcgm-exporter", "nvcr.io/nvidia/k8s/dcgm-exporter", "4.5.3-4.8.2-distroless",
          "sha256:60d3b00ac80b4ae77f94dae2f943685605585ad9e92fdccda3154d009ae317cc",
          "GPU metrics on GPU nodes"),
)}


def deployed_images(endpoint_images: Iterable[Image] = ()) -> list[Image]:
    """The catalogue and every endpoint file's worker image: what the mirror copies, what ECR
    holds repositories for and what preflight checks, one entry per repository and tag."""
    seen: dict[tuple[str, str], Image] = {}
    for image in (*IMAGES.values(), *endpoint_images):
        seen.setdefault((image.mirror_repository, image.tag), image)
    return list(seen.values())


def unpinned_images() -> list[Image]:
    """Images still waiting for a digest: synth warns about each until it is pinned."""
    return [i for i in IMAGES.values() if not i.digest]


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
          "9.54.0", ("cluster-autoscaler",)),
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
        return self.resolve(IMAGES[key])

    def resolve(self, image: Image) -> str:
        """Upstream as written (endpoint files) or pinned (catalogue); the mirror in ECR."""
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
        return IMAGES[key]
    registry, path, tag, digest = parse_reference(reference)
    return Image(f"{path}:{tag}", f"{registry}/{path}", tag, digest,
                 "worker image named by an endpoint file", written=reference)


# vLLM published KV events (`--kv-events-config`, which kvaware needs) from 0.9.0 on. Where an
# image's vLLM version is known, kvaware is allowed or refused; elsewhere it is only a warning.
KV_EVENTS_SINCE = (0, 9)
_VLLM_VERSION_BY_KEY = {"vllm-lmcache": (0, 27)}
# Repositories whose tags start with the vLLM version they carry.
_VLLM_VERSION_TAGGED = ("docker.io/vllm/vllm-openai", "public.ecr.aws/deep-learning-containers/vllm")


def vllm_version(image: Image) -> tuple[int, int] | None:
    """The vLLM (major, minor) an image carries, where we know it; None where we do not."""
    if image.key in _VLLM_VERSION_BY_KEY:
        return _VLLM_VERSION_BY_KEY[image.key]
    if image.source in _VLLM_VERSION_TAGGED or image.source.endswith(".amazonaws.com/vllm"):
        match = re.match(r"v?(\d+)\.(\d+)", image.tag)
        if match:
            return int(match[1]), int(match[2])
    return None


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
    None for an image we know nothing about (the chart then probes for vLLM)."""
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


def lmcache_version(image: Image) -> tuple[int, int, int] | None:
    """The LMCache release an image carries, where a public record says: lmcache/vllm-openai
    release tags are the LMCache release they were built at (LMCache's release workflow).
    vllm/vllm-openai and the DLC images install an unpinned `lmcache` at build time: None."""
    if image.source.split("/", 1)[1] != "lmcache/vllm-openai":
        return None
    m = _LMCACHE_TAG.match(image.tag)
    return (int(m[1]), int(m[2]), int(m[3])) if m else None


# Worker images that carry `valkey-glide-sync`, which LMCache's `valkey://` connector imports
# (GLIDE's sync client: TLS, AUTH and cluster mode, what ElastiCache in cluster mode needs).
# The published lmcache/vllm-openai, vllm/vllm-openai and DLC images do not (LMCache does not
# require it), so none is listed: ElastiCache is then reached by `rediss://` on one shard
# (k8s/l2.py). A worker image built with it adds its catalogue key here.
GLIDE_IMAGES: frozenset[str] = frozenset()


def carries_glide(image: Image | None) -> bool:
    return image is not None and image.key in GLIDE_IMAGES
