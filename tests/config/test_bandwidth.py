"""config/bandwidth.py lists the sustained NIC of every EC2 type the L2 verdict sizes (a GPU
type without one would be judged without its worker's NIC: k8s/l2.py), and what a pod's TCP
gets of it: network card 0's where the type has several (the VPC CNI puts pods there)."""
from __future__ import annotations

import pytest

from config.bandwidth import (
    EC2_BASELINE_GBPS, IN_CLUSTER_NODE_TYPES, MULTI_CARD, nic_gbps, pod_nic_gbps,
)
from config.instances import GPU_SHAPES


def test_every_gpu_type_we_size_has_a_nic_baseline():
    assert sorted(set(GPU_SHAPES) - set(EC2_BASELINE_GBPS)) == []
    assert all(nic_gbps(t) > 0 for t in GPU_SHAPES)


def test_every_in_cluster_cache_node_has_a_nic_baseline():
    assert all(nic_gbps(n.type) > 0 for n in IN_CLUSTER_NODE_TYPES)


def test_a_type_without_a_baseline_is_named():
    for lookup in (nic_gbps, pod_nic_gbps):
        with pytest.raises(LookupError, match=r"^g9\.xlarge: .*EC2_BASELINE_GBPS"):
            lookup("g9.xlarge")


@pytest.mark.parametrize("itype", sorted(GPU_SHAPES))
def test_every_gpu_type_has_a_pod_figure_no_more_than_the_instance(itype):
    assert 0 < pod_nic_gbps(itype) <= nic_gbps(itype)


# The multi-card GPU types (amazon-vpc-cni-k8s pkg/vpc/vpc_ip_resource_limit.go): a type
# dropped from MULTI_CARD would be judged on every card's figure again.
MULTI_CARD_GPU_TYPES = {"g6e.24xlarge", "g6e.48xlarge", "p4d.24xlarge", "p4de.24xlarge",
                        "p5.48xlarge", "p5e.48xlarge", "p5en.48xlarge", "p6-b200.48xlarge",
                        "p6-b300.48xlarge"}


def test_the_multi_card_types_are_every_sized_type_with_several_cards():
    assert set(MULTI_CARD) <= set(EC2_BASELINE_GBPS)
    assert {t for t in MULTI_CARD if t in GPU_SHAPES} == MULTI_CARD_GPU_TYPES
    assert all(card.cards > 1 for card in MULTI_CARD.values())


@pytest.mark.parametrize("itype", sorted(MULTI_CARD))
def test_a_pods_nic_on_a_multi_card_type_is_card_0_below_the_instance(itype):
    assert pod_nic_gbps(itype) == MULTI_CARD[itype].gbps < nic_gbps(itype)


def test_a_single_card_type_gives_a_pod_the_instance_figure():
    single = [t for t in EC2_BASELINE_GBPS if t not in MULTI_CARD]
    assert single and all(pod_nic_gbps(t) == nic_gbps(t) for t in single)
