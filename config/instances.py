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

GPU_SHAPES: dict[str, GpuShape] = {
    f"{fam}.{size}": shape for fam, sizes in _FAMILIES.items() for size, shape in sizes.items()
}


def gpu_shape(instance_type: str) -> GpuShape | None:
    return GPU_SHAPES.get(instance_type)


def ec2_type(instance_type: str) -> str:
    """HyperPod writes `ml.g5.24xlarge`; EKS node groups want `g5.24xlarge`."""
    return instance_type.removeprefix("ml.")
