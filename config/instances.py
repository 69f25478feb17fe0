"""GPU instance shapes, so a worker's GPU, CPU and memory requests follow its instance type.

Figures from the EC2 accelerated-computing instance pages. Only types we can size are accepted
for GPU node groups; the region check lives in `regions.py`.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GpuShape:
    gpus: int
    vcpus: int
    memory_gib: int
    gpu_memory_gib: int


def _family(gpu_mem: int, rows: dict[str, tuple[int, int, int]]) -> dict[str, GpuShape]:
    return {size: GpuShape(g, c, m, gpu_mem) for size, (g, c, m) in rows.items()}


_G5_SHAPES = {
    "xlarge": (1, 4, 16), "2xlarge": (1, 8, 32), "4xlarge": (1, 16, 64), "8xlarge": (1, 32, 128),
    "12xlarge": (4, 48, 192), "16xlarge": (1, 64, 256), "24xlarge": (4, 96, 384),
    "48xlarge": (8, 192, 768),
}

_FAMILIES: dict[str, dict[str, GpuShape]] = {
    "g4dn": _family(16, {
        "xlarge": (1, 4, 16), "2xlarge": (1, 8, 32), "4xlarge": (1, 16, 64),
        "8xlarge": (1, 32, 128), "12xlarge": (4, 48, 192), "16xlarge": (1, 64, 256),
        "metal": (8, 96, 384),
    }),
    "g5": _family(24, _G5_SHAPES),
    "g6": _family(24, _G5_SHAPES),
    "g6e": _family(48, {
        "xlarge": (1, 4, 32), "2xlarge": (1, 8, 64), "4xlarge": (1, 16, 128),
        "8xlarge": (1, 32, 256), "12xlarge": (4, 48, 384), "16xlarge": (1, 64, 512),
        "24xlarge": (4, 96, 768), "48xlarge": (8, 192, 1536),
    }),
    "p3": _family(16, {"2xlarge": (1, 8, 61), "8xlarge": (4, 32, 244), "16xlarge": (8, 64, 488)}),
    "p4d": _family(40, {"24xlarge": (8, 96, 1152)}),
    "p5": _family(80, {"48xlarge": (8, 192, 2048)}),
}

# Each family's GPU and its dense BF16/FP16 tensor throughput per GPU, TFLOPS (NVIDIA's
# datasheets; A10G as bench/emulator.py's profile has it): what prefill computes at. Used to
# judge at synth time whether reading KV from L2 can beat recomputing it (k8s/workers.py).
GPU_MODELS: dict[str, tuple[str, float]] = {
    "g4dn": ("T4", 65), "g5": ("A10G", 70), "g6": ("L4", 121), "g6e": ("L40S", 362),
    "p3": ("V100", 125), "p4d": ("A100", 312), "p5": ("H100", 989),
}

GPU_SHAPES: dict[str, GpuShape] = {
    f"{fam}.{size}": shape for fam, sizes in _FAMILIES.items() for size, shape in sizes.items()
}


def gpu_shape(instance_type: str) -> GpuShape | None:
    return GPU_SHAPES.get(instance_type)


def gpu_model(instance_type: str) -> tuple[str, float] | None:
    """(GPU name, dense TFLOPS per GPU) of a GPU instance type we know."""
    return GPU_MODELS.get(instance_type.split(".", 1)[0])


def ec2_type(instance_type: str) -> str:
    """HyperPod writes `ml.g5.24xlarge`; EKS node groups want `g5.24xlarge`."""
    return instance_type.removeprefix("ml.")


# --- What the kubelet leaves to pods (EKS's formula, as nodeadm writes the kubelet config of
# AL2023 nodes; Bottlerocket uses the same figures). awslabs/amazon-eks-ami,
# nodeadm/internal/kubelet/config.go and eni_max_pods.go:
# - kube-reserved CPU: 6% of the first core, 1% of the second, 0.5% of cores 3-4, 0.25% above;
# - kube-reserved memory: 11 MiB x maxPods + 255 MiB, maxPods = ENIs x (IPv4 per ENI - 1) + 2
#   (ENI figures from its instance-info.jsonl);
# - eviction-hard memory.available 100Mi.
# Memory capacity is the nominal memory less what the hypervisor and kernel keep, as Karpenter
# models it (VM_MEMORY_OVERHEAD_PERCENT, default 7.5%).
ENIS = {
    "m6i.large": (3, 10), "m6i.xlarge": (4, 15), "m6i.2xlarge": (4, 15),
    "m6i.4xlarge": (8, 30), "m7i.xlarge": (4, 15), "m7i.2xlarge": (4, 15),
    "g4dn.12xlarge": (8, 30), "g5.12xlarge": (15, 50), "g5.24xlarge": (15, 50),
    "g5.48xlarge": (7, 50), "g6e.12xlarge": (10, 30), "p4d.24xlarge": (15, 50),
    "p5.48xlarge": (2, 50),
}
VM_MEMORY_OVERHEAD = 0.075
EVICTION_HARD_MIB = 100
_DEFAULT_ENIS = (4, 15)   # types not listed: the smallest ENI figures above (more reserved)
# the families a system group or the in-cluster L2's node uses
_GIB_PER_VCPU = {"m": 4, "c": 2, "r": 8, "x": 16}
# Kept free on a GPU node beside its workers: the add-ons' and our DaemonSets (aws-node,
# kube-proxy, EBS CSI node, device plugin, DCGM exporter, node exporter) with headroom.
DAEMONSET_ROOM_M, DAEMONSET_ROOM_MIB = 1000, 2048


@dataclass(frozen=True)
class Allocatable:
    cpu_m: float
    memory_mib: float
    gpus: int


def instance_shape(instance_type: str) -> tuple[int, float, int]:
    """(vCPUs, GiB, GPUs): GPU types from GPU_SHAPES, m/c/r families from their ratios."""
    shape = gpu_shape(instance_type)
    if shape:
        return shape.vcpus, shape.memory_gib, shape.gpus
    family, size = instance_type.split(".")
    vcpus = {"large": 2, "xlarge": 4}.get(size) or 4 * int(size.removesuffix("xlarge"))
    return vcpus, vcpus * _GIB_PER_VCPU[family[0]], 0


def max_pods(instance_type: str) -> int:
    enis, ips = ENIS.get(instance_type, _DEFAULT_ENIS)
    return enis * (ips - 1) + 2


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
