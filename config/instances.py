"""GPU instance shapes, so a worker's GPU, CPU and memory requests follow its instance type.

Sizes (GPUs, vCPUs, GiB) as EC2's DescribeInstanceTypes reports them, read from Karpenter's
generated instance-type reference (aws/karpenter-provider-aws,
website/content/en/docs/reference/instance-types.md, August 2026; p3 from the EC2
accelerated-computing page, which that reference no longer lists). Only types we can size are
accepted for GPU node groups; the region check lives in `regions.py`. Every family here is
x86_64 with NVIDIA GPUs: the node groups' AL2023 and Bottlerocket NVIDIA AMI types fit all of
them (EKS's AMI pages), and tests/constructs/test_gpu_nodegroups.py synthesizes a node group of
each in every partition that offers it.
"""
from __future__ import annotations

import re

from dataclasses import dataclass


@dataclass(frozen=True)
class GpuShape:
    gpus: int
    vcpus: int
    memory_gib: int
    gpu_memory_gib: int


@dataclass(frozen=True)
class GpuFamily:
    """One EC2 GPU family: its GPU, as NVIDIA, Cluster Autoscaler and prefill see it."""

    gpu: str                 # NVIDIA's name
    # Cluster Autoscaler's AWS provider value of `k8s.amazonaws.com/accelerator`
    # (cloudprovider/aws/aws_cloud_provider.go availableGPUTypes where it lists the GPU:
    # nvidia-tesla-t4/-v100/-a100, nvidia-a10g, nvidia-l4, nvidia-l40s; the same pattern for
    # the GPUs it does not list, which it treats as GPUs all the same: the label's presence
    # tells it a starting node will have them).
    accelerator: str
    tflops: float            # dense BF16/FP16 tensor throughput per GPU (NVIDIA datasheets)
    gpu_memory_gib: int      # per GPU, nominal (AWS's instance pages)
    sizes: dict[str, tuple[int, int, int]]   # size -> (GPUs, vCPUs, GiB)


_G5_SIZES = {
    "xlarge": (1, 4, 16), "2xlarge": (1, 8, 32), "4xlarge": (1, 16, 64), "8xlarge": (1, 32, 128),
    "12xlarge": (4, 48, 192), "16xlarge": (1, 64, 256), "24xlarge": (4, 96, 384),
    "48xlarge": (8, 192, 768),
}
_P5_48 = {"48xlarge": (8, 192, 2048)}

# A10G as bench/emulator.py's profile has it; H200 computes as H100 (same GH100 die); B300 as
# B200 (HGX B300 datasheet: 36 PFLOPS FP16/BF16 with sparsity for 8 GPUs, as HGX B200).
GPU_FAMILIES: dict[str, GpuFamily] = {
    "g4dn": GpuFamily("T4", "nvidia-tesla-t4", 65, 16, {
        "xlarge": (1, 4, 16), "2xlarge": (1, 8, 32), "4xlarge": (1, 16, 64),
        "8xlarge": (1, 32, 128), "12xlarge": (4, 48, 192), "16xlarge": (1, 64, 256),
        "metal": (8, 96, 384)}),
    "g5": GpuFamily("A10G", "nvidia-a10g", 70, 24, _G5_SIZES),
    "g6": GpuFamily("L4", "nvidia-l4", 121, 24, _G5_SIZES),
    "gr6": GpuFamily("L4", "nvidia-l4", 121, 24, {"4xlarge": (1, 16, 128),
                                                   "8xlarge": (1, 32, 256)}),
    "g6e": GpuFamily("L40S", "nvidia-l40s", 362, 48, {
        "xlarge": (1, 4, 32), "2xlarge": (1, 8, 64), "4xlarge": (1, 16, 128),
        "8xlarge": (1, 32, 256), "12xlarge": (4, 48, 384), "16xlarge": (1, 64, 512),
        "24xlarge": (4, 96, 768), "48xlarge": (8, 192, 1536)}),
    "p3": GpuFamily("V100", "nvidia-tesla-v100", 125, 16, {
        "2xlarge": (1, 8, 61), "8xlarge": (4, 32, 244), "16xlarge": (8, 64, 488)}),
    "p3dn": GpuFamily("V100", "nvidia-tesla-v100", 125, 32, {"24xlarge": (8, 96, 768)}),
    "p4d": GpuFamily("A100", "nvidia-tesla-a100", 312, 40, {"24xlarge": (8, 96, 1152)}),
    "p4de": GpuFamily("A100", "nvidia-tesla-a100", 312, 80, {"24xlarge": (8, 96, 1152)}),
    "p5": GpuFamily("H100", "nvidia-h100", 989, 80, {"4xlarge": (1, 16, 256), **_P5_48}),
    "p5e": GpuFamily("H200", "nvidia-h200", 989, 141, _P5_48),
    "p5en": GpuFamily("H200", "nvidia-h200", 989, 141, _P5_48),
    "p6-b200": GpuFamily("B200", "nvidia-b200", 2250, 179, _P5_48),
    "p6-b300": GpuFamily("B300", "nvidia-b300", 2250, 268, {"48xlarge": (8, 192, 4096)}),
}

# Each family's GPU and its dense BF16/FP16 TFLOPS per GPU: what prefill computes at. Used to
# judge at synth time whether reading KV from L2 can beat recomputing it (k8s/workers.py).
GPU_MODELS: dict[str, tuple[str, float]] = {
    name: (f.gpu, f.tflops) for name, f in GPU_FAMILIES.items()}

GPU_SHAPES: dict[str, GpuShape] = {
    f"{name}.{size}": GpuShape(gpus, vcpus, gib, f.gpu_memory_gib)
    for name, f in GPU_FAMILIES.items() for size, (gpus, vcpus, gib) in f.sizes.items()
}


def gpu_shape(instance_type: str) -> GpuShape | None:
    return GPU_SHAPES.get(instance_type)


def gpu_model(instance_type: str) -> tuple[str, float] | None:
    """(GPU name, dense TFLOPS per GPU) of a GPU instance type we know."""
    return GPU_MODELS.get(instance_type.split(".", 1)[0])


def accelerator_label(instance_type: str) -> str | None:
    """The `k8s.amazonaws.com/accelerator` value of a GPU instance type we know."""
    family = GPU_FAMILIES.get(instance_type.split(".", 1)[0])
    return family.accelerator if family else None


def ec2_type(instance_type: str) -> str:
    """HyperPod writes `ml.g5.24xlarge`; EKS node groups want `g5.24xlarge`."""
    return instance_type.removeprefix("ml.")


# --- What the kubelet leaves to pods (EKS's formula, as nodeadm writes the kubelet config of
# AL2023 nodes; Bottlerocket uses the same figures). awslabs/amazon-eks-ami,
# nodeadm/internal/kubelet/config.go and eni_max_pods.go:
# - kube-reserved CPU: 6% of the first core, 1% of the second, 0.5% of cores 3-4, 0.25% above;
# - kube-reserved memory: 11 MiB x maxPods + 255 MiB, maxPods = ENIs x (IPv4 per ENI - 1) + 2
#   (ENI figures from its instance-info.jsonl; the maxPods below are that formula's result, as
#   Karpenter's instance-type reference lists them);
# - eviction-hard memory.available 100Mi.
# Memory capacity is the nominal memory less what the hypervisor and kernel keep, as Karpenter
# models it (VM_MEMORY_OVERHEAD_PERCENT, default 7.5%).
MAX_PODS = {
    "m6i.large": 29, "m6i.xlarge": 58, "m6i.2xlarge": 58, "m6i.4xlarge": 234,
    "m7i.xlarge": 58, "m7i.2xlarge": 58,
    "g4dn.xlarge": 29, "g4dn.2xlarge": 29, "g4dn.4xlarge": 29, "g4dn.8xlarge": 58,
    "g4dn.12xlarge": 234, "g4dn.16xlarge": 58, "g4dn.metal": 737,
    "g5.xlarge": 58, "g5.2xlarge": 58, "g5.4xlarge": 234, "g5.8xlarge": 234,
    "g5.12xlarge": 737, "g5.16xlarge": 234, "g5.24xlarge": 737, "g5.48xlarge": 345,
    "g6.xlarge": 58, "g6.2xlarge": 58, "g6.4xlarge": 234, "g6.8xlarge": 234,
    "g6.12xlarge": 234, "g6.16xlarge": 737, "g6.24xlarge": 737, "g6.48xlarge": 737,
    "gr6.4xlarge": 234, "gr6.8xlarge": 234,
    "g6e.xlarge": 58, "g6e.2xlarge": 58, "g6e.4xlarge": 234, "g6e.8xlarge": 234,
    "g6e.12xlarge": 292, "g6e.16xlarge": 737, "g6e.24xlarge": 492, "g6e.48xlarge": 492,
    "p3.2xlarge": 58, "p3.8xlarge": 234, "p3.16xlarge": 234,   # amazon-eks-ami eni-max-pods.txt
    "p3dn.24xlarge": 737, "p4d.24xlarge": 737, "p4de.24xlarge": 737,
    "p5.4xlarge": 118, "p5.48xlarge": 100, "p5e.48xlarge": 100, "p5en.48xlarge": 198,
    "p6-b200.48xlarge": 198, "p6-b300.48xlarge": 198,
}
VM_MEMORY_OVERHEAD = 0.075
EVICTION_HARD_MIB = 100
_DEFAULT_MAX_PODS = 58   # a type not listed (a system group's): a 4-ENI, 15-address type
# the families a system group or the in-cluster L2's node uses (by family, else its letter)
_GIB_PER_VCPU = {"m": 4, "c": 2, "r": 8, "x": 16, "x2iedn": 32}
# Kept free on a GPU node beside its workers: the add-ons' and our DaemonSets (aws-node,
# kube-proxy, EBS CSI node, device plugin, DCGM exporter, node exporter) with headroom.
DAEMONSET_ROOM_M, DAEMONSET_ROOM_MIB = 1000, 2048


@dataclass(frozen=True)
class Allocatable:
    cpu_m: float
    memory_mib: float
    gpus: int


_TYPE_PARTS = re.compile(r"^([a-z]+)(\d{1,2})([a-z\-]*)\.([a-z0-9\-]+)$")


def architecture(instance_type: str) -> str:
    """`arm64` or `x86_64`, by the rule CDK's InstanceType.architecture applies (aws-cdk-lib
    aws-ec2 instance-types.ts): the `a` family (first Graviton) or a `g` among the capability
    letters after the generation (m7g, c6gn, r7gd, x2gd, t4g) is Graviton; the rest x86."""
    m = _TYPE_PARTS.match(instance_type)
    return "arm64" if m and (m[1] == "a" or "g" in m[3]) else "x86_64"


def instance_shape(instance_type: str) -> tuple[int, float, int]:
    """(vCPUs, GiB, GPUs): GPU types from GPU_SHAPES, m/c/r families from their ratios."""
    shape = gpu_shape(instance_type)
    if shape:
        return shape.vcpus, shape.memory_gib, shape.gpus
    family, size = instance_type.split(".")
    vcpus = {"large": 2, "xlarge": 4}.get(size) or 4 * int(size.removesuffix("xlarge"))
    return vcpus, vcpus * _GIB_PER_VCPU.get(family, _GIB_PER_VCPU[family[0]]), 0


def max_pods(instance_type: str) -> int:
    return MAX_PODS.get(instance_type, _DEFAULT_MAX_PODS)


def kube_reserved_cpu_m(vcpus: int) -> float:
    total, reserved = vcpus * 1000, 0.0
    for start, end, percent in ((0, 1000, 6), (1000, 2000, 1), (2000, 4000, 0.5),
                                (4000, float("inf"), 0.25)):
        if total > start:
            reserved += (min(total, end) - start) * percent / 100
    return reserved


def allocatable(instance_type: str) -> Allocatable:
    vcpus, gib, gpus = instance_shape(instance_type)
    capacity_mib = gib * 1024 * (1 - VM_MEMORY_OVERHEAD)
    return Allocatable(vcpus * 1000 - kube_reserved_cpu_m(vcpus),
                       capacity_mib - (11 * max_pods(instance_type) + 255) - EVICTION_HARD_MIB,
                       gpus)


def pod_share(instance_type: str, pods_per_node: int) -> tuple[int, int]:
    """(whole cores, whole GiB) each of `pods_per_node` workers may request so that all of
    them and the node's DaemonSets fit its allocatable."""
    a = allocatable(instance_type)
    return (int((a.cpu_m - DAEMONSET_ROOM_M) / pods_per_node // 1000),
            int((a.memory_mib - DAEMONSET_ROOM_MIB) / pods_per_node // 1024))


# --- EFA: which GPU types carry it, how many interfaces, and whether the GPUs reach it directly
# (GPUDirect RDMA), which is what prefill/decode disaggregation moves KV over (k8s/pd.py).
# EC2's "Supported instance types" for EFA (docs.aws.amazon.com/AWSEC2/latest/UserGuide/
# efa.html and its .cn twin) and DescribeInstanceTypes' NetworkInfo.EfaInfo.
# MaximumEfaInterfaces; `python -m tools preflight` asks EC2 the same in the environment's region
# and fails where the answer differs from this table (tests/config/test_efa.py holds the
# comparison). HyperPod's DPD supports p5, p5e, p5en, p6-b200 and p6-b300 ("requires
# EFA-capable instances with GPU-Direct RDMA support"); p4d and p4de have GPUDirect RDMA over
# EFA too (4 x 100 Gbps). The g families carry one EFA on their larger sizes, but their GPUs
# reach it through host memory (no GPUDirect RDMA): a KV handoff there is host-staged.
@dataclass(frozen=True)
class Efa:
    interfaces: int          # MaximumEfaInterfaces: one per network card that carries EFA
    gbps: float              # the instance's EFA bandwidth, all cards
    gpu_direct: bool         # GPUDirect RDMA: the GPUs read and write over EFA directly


EFA: dict[str, Efa] = {
    "p4d.24xlarge": Efa(4, 400, True), "p4de.24xlarge": Efa(4, 400, True),
    "p5.48xlarge": Efa(32, 3200, True), "p5e.48xlarge": Efa(32, 3200, True),
    "p5en.48xlarge": Efa(16, 3200, True), "p6-b200.48xlarge": Efa(8, 3200, True),
    **{t: Efa(1, g, False) for t, g in (
        ("g4dn.8xlarge", 50), ("g4dn.12xlarge", 50), ("g4dn.16xlarge", 50),
        ("g4dn.metal", 100), ("g5.8xlarge", 25), ("g5.12xlarge", 40), ("g5.16xlarge", 25),
        ("g5.24xlarge", 50), ("g5.48xlarge", 100), ("g6.8xlarge", 25), ("g6.12xlarge", 40),
        ("g6.16xlarge", 25), ("g6.24xlarge", 50), ("g6.48xlarge", 100),
        ("g6e.8xlarge", 25), ("g6e.12xlarge", 100), ("g6e.16xlarge", 35),
        ("g6e.24xlarge", 200), ("g6e.48xlarge", 400), ("p3dn.24xlarge", 100))},
}
# Where a type's GPU-direct EFA exists in the China regions (the project's notes, the EC2 China
# pages): only p4d.24xlarge in cn-northwest-1. Elsewhere a type has it wherever it is offered.
CHINA_GPU_DIRECT_EFA = {"cn-northwest-1": frozenset({"p4d.24xlarge"}), "cn-north-1": frozenset()}


def efa(instance_type: str) -> Efa | None:
    return EFA.get(instance_type)


def gpu_direct_efa_in(instance_type: str, region: str) -> bool:
    """Does `instance_type` have GPUDirect RDMA over EFA in `region`?"""
    e = EFA.get(instance_type)
    if e is None or not e.gpu_direct:
        return False
    china = CHINA_GPU_DIRECT_EFA.get(region)
    return china is None or instance_type in china
