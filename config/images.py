"""The one pinned catalogue of images and charts. Charts, ECR repositories, the mirror tool and
preflight all read these entries, so what is mirrored is exactly what is deployed.

Every image is pinned by tag AND digest (the multi-arch index digest, which `skopeo copy --all`
preserves, so `repo:tag@digest` resolves in ECR too). Never `latest`.
"""
from __future__ import annotations

from dataclasses import dataclass

from .regions import RegionFacts

MIRROR_PREFIX = "kvcache"


@dataclass(frozen=True)
class Image:
    key: str
    source: str     # registry/repository, e.g. docker.io/lmcache/vllm-openai
    tag: str
    digest: str | None  # sha256:<64 hex> of the multi-arch index
    purpose: str

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
)}


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
        image = IMAGES[key]
        if not self.use_ecr:
            return image.source_ref
        return f"{self.registry}/{image.mirror_repository}:{image.pin}"

# Installed by CDK's AlbController from the region's EKS add-on registry (not mirrored).
ALB_CONTROLLER_VERSION = "v2.13.3"

# Worker images able to publish KV events (vLLM >= 0.9 `--kv-events-config`) for kvaware.
KV_EVENT_IMAGES = frozenset({"vllm-lmcache"})


def catalogue_key_for(reference: str) -> str | None:
    """Match an image as HyperPod files write it (`lmcache/vllm-openai:v0.5.4`) to the catalogue."""
    repo, _, tag = reference.partition("@")[0].rpartition(":")
    for image in IMAGES.values():
        path = image.source.split("/", 1)[1]
        if tag == image.tag and repo in (image.source, path, f"docker.io/{path}"):
            return image.key
    return None
