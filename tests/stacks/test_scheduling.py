"""First-deploy gate (a): every pod we render, and every pod our Helm releases create, fits a
node group it may land on (nodeSelector, required affinity, taints), on that instance type's
allocatable CPU, memory and GPUs after the DaemonSets every node runs (tests/stacks/
cluster_model.py: EKS's reserved-resource formula). Shipped environments from their
synthesized templates; every served corpus file rendered into each variant."""
from __future__ import annotations

import copy

import cdk8s
import pytest
import yaml

from config import resolve_environment
from config.contracts import SERVING_NAMESPACE, SHARED_CACHE_NAME
from k8s.serving import build_charts, in_cluster_node, load_endpoints, placeholder_facts
from tests.k8s.test_hyperpod_corpus import CORPUS, _corpus_env, _groups, filled
from tests.stacks.cluster_model import (
    allocatable, config_node_groups, manifest_pods, node_groups, pods_of_objects,
    unschedulable,
)
from tests.stacks.helm_pods import helm_release_pods
from tests.conftest import ENVIRONMENTS, ROOT



def test_allocatable_follows_the_eks_formula():
    """Hand-worked from nodeadm's formula (module docstring of cluster_model)."""
    m6i = allocatable("m6i.xlarge")       # 4 vCPU, 16 GiB, 4 ENIs x 15 IPs: 58 pods
    assert m6i.cpu_m == 4000 - (60 + 10 + 10)
    assert m6i.memory_mib == pytest.approx(16 * 1024 * 0.925 - (11 * 58 + 255) - 100)
    g5 = allocatable("g5.24xlarge")       # 96 vCPU, 384 GiB, 4 GPUs, 15 x 50: 737 pods
    assert g5.cpu_m == pytest.approx(96000 - (60 + 10 + 10 + 92000 * 0.0025))
    assert g5.gpus == 4 and g5.memory_mib < 384 * 1024 * 0.925 - 8000


@pytest.mark.parametrize("name", ENVIRONMENTS)
def test_config_groups_match_the_templates(synths, name):
    s = synths[name]
    key = lambda g: g.name   # noqa: E731
    from_templates = sorted(node_groups(s.templates), key=key)
    node = in_cluster_node(s.cfg, load_endpoints(s.cfg, ROOT))   # the in-cluster L2's own
    from_config = sorted(config_node_groups(s.cfg, node.node_type if node else None), key=key)
    assert [(g.name, g.instance_types, dict(g.labels), g.taints, g.max_size)
            for g in from_templates] == [(g.name, g.instance_types, dict(g.labels), g.taints,
                                          g.max_size) for g in from_config]


@pytest.mark.parametrize("name", ENVIRONMENTS)
def test_every_pod_of_the_shipped_environments_fits_a_node_group(synths, name):
    s = synths[name]
    pods = manifest_pods(s.templates) + helm_release_pods(s.templates, name)
    owners = {p.owner for p in pods}
    # the gate really sees the workloads: workers, routers, KEDA, the monitoring stack
    assert any(o.endswith(("-workers", "-prefill")) for o in owners) and any(o.endswith("-router")
                                                               for o in owners)
    assert "Deployment/keda/keda-operator" in owners
    assert unschedulable(pods, node_groups(s.templates)) == []


@pytest.fixture(scope="module")
def self_hosted(tmp_path_factory, dev, sound_l2_client) -> tuple[list, list[str]]:
    """Every served corpus file in dev with `cache.kind: self-hosted` (the in-cluster Valkey
    serves every file's L2); the corpus in each variant's own cache is checked in
    tests/k8s/test_hyperpod_corpus.py on its synthesized charts."""
    pods, cfg, l2_nodes = [], None, set()
    for i, files in enumerate([*_groups(), [TIERED]]):
        tmp = tmp_path_factory.mktemp(f"sched-{i}")
        ctx = copy.deepcopy(_corpus_env(tmp, "dev", files))
        if files == [TIERED]:   # the one published file asking for the in-cluster L2
            raw = yaml.safe_load(filled(TIERED)[0])
            gpus = raw["spec"]["worker"]["resources"]
            gpus["requests"]["nvidia.com/gpu"] = gpus["limits"]["nvidia.com/gpu"]
            # its L2 would not pay on its GPU (k8s/l2.py l2_verdict): forced, so the
            # Valkey it brings is scheduled too
            raw["spec"]["kvCacheSpec"]["forceL2Cache"] = True
            # on an image that may have an L2 (k8s/workers.py l2_refusal: not the v0.3.7 the
            # corpus fills its placeholder with)
            image = raw["spec"]["worker"]["image"]
            raw["spec"]["worker"]["image"] = image.replace(":v0.3.7", ":v0.5.4")
            assert raw["spec"]["worker"]["image"] != image
            (tmp / TIERED.name).write_text(yaml.safe_dump(raw))
        ctx["environments"]["dev"]["cache"] = {"kind": "self-hosted"}
        cfg = resolve_environment(ctx)
        specs = load_endpoints(cfg, tmp)
        pods += pods_of_objects(d for c in build_charts(
            cdk8s.App(), cfg, specs, placeholder_facts(cfg, specs)) for d in c.to_json())
        if (node := in_cluster_node(cfg, specs)) is not None:
            l2_nodes.add(node.node_type)
    pods += helm_release_pods(dev.templates, "dev")
    (l2_node,) = l2_nodes   # the Valkey's own node group, as stacks/cache_stack.py adds it
    return pods, unschedulable(pods, config_node_groups(cfg, l2_node))


# It asks for 4 GPUs with a limit of 8, which the reader refuses (Kubernetes would too): served
# here with the two equal and its L2 forced, for the Valkey its tieredstorage L2 brings.
TIERED = CORPUS / "hpcli-pr413-sample-llama70b-l1-l2-tieredstorage.yaml"


def test_every_corpus_pod_beside_a_self_hosted_cache_fits_a_node_group(self_hosted):
    """Finding 7 included: the in-cluster Valkey (also serving tieredstorage files) fits the
    node of its own the cache stack adds, and nothing else lands there."""
    pods, problems = self_hosted
    assert len({p.owner for p in pods if p.owner.endswith("-workers")}) >= 10
    assert {p.owner for p in pods if p.owner.startswith("StatefulSet/")
            and SHARED_CACHE_NAME in p.owner} == {
        f"StatefulSet/{SERVING_NAMESPACE}/{SHARED_CACHE_NAME}"}
    assert problems == []
