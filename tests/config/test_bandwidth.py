"""config/bandwidth.py lists the sustained NIC of every EC2 type the L2 verdict sizes: a GPU
type without one would be judged without its worker's NIC (k8s/l2.py)."""
from __future__ import annotations

import pytest

from config.bandwidth import EC2_BASELINE_GBPS, IN_CLUSTER_NODE_TYPES, nic_gbps
from config.instances import GPU_SHAPES


def test_every_gpu_type_we_size_has_a_nic_baseline():
    assert sorted(set(GPU_SHAPES) - set(EC2_BASELINE_GBPS)) == []
    assert all(nic_gbps(t) > 0 for t in GPU_SHAPES)


def test_every_in_cluster_cache_node_has_a_nic_baseline():
    assert all(nic_gbps(n.type) > 0 for n in IN_CLUSTER_NODE_TYPES)


def test_a_type_without_a_baseline_is_named():
    with pytest.raises(LookupError, match=r"^g9\.xlarge: .*EC2_BASELINE_GBPS"):
        nic_gbps("g9.xlarge")
