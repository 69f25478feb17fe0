"""Construct ids from names: the one rule every construct uses, so logical IDs stay stable."""
from __future__ import annotations

import re


def logical_id(name: str) -> str:
    """`vpc-cni` -> `VpcCni`, `ECR_DOCKER` -> `EcrDocker`, `kvcache/lmcache/vllm-openai` ->
    `KvcacheLmcacheVllmOpenai`."""
    return "".join(part.capitalize() for part in re.split(r"[-_./]", name))
