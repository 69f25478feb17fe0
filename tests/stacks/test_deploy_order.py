"""First-deploy gate (b): in the synthesized templates, every in-cluster object (manifest, Helm
release) waits, transitively through DependsOn, references and stack dependencies, for its
namespace, the CRDs of its custom resources, the Pod Identity association its pods' service
account uses, and a node group that can run its pods; every Helm release waits for its pods
no longer than the kubectl handler may run, and long enough for a node to start.

Generic: every object of every stack is walked; the Helm releases' objects come from the
recorded `helm template` of the pinned charts (tests/stacks/helm_pods.py).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from config.contracts import NODE_START_MINUTES
from k8s.gateway import TEAM_CRD_GROUPS
from tests.stacks import helm_pods
from tests.conftest import ENVIRONMENTS
from tests.stacks.cluster_model import (
    ADDON, ASSOCIATION, BUILTIN_GROUPS, BUILTIN_NAMESPACES, CLUSTER_SCOPED, HELM, MANIFEST,
    DeployGraph, Pod, manifest_objects, may_land_on, node_groups, pods_of_objects,
    stack_dependencies,
)

# The kubectl handler is a Lambda function of at most 15 minutes (aws-eks-v2 KubectlProvider);
# CDK refuses a Helm timeout above that (HelmChartTimeoutCannotHigher).
HANDLER_LIMIT_S = 900
# Service accounts the EKS add-ons run their pods as (EKS user guide, each add-on's page).
ADDON_SERVICE_ACCOUNTS = {"aws-ebs-csi-driver": ("kube-system", "ebs-csi-controller-sa"),
                          "vpc-cni": ("kube-system", "aws-node")}


@dataclass
class InCluster:
    resource: str                       # "<stack>/<logical id>"
    kind: str                           # manifest or helm
    pods: list[Pod]
    namespaces: set[str]                # where its namespaced objects go
    creates_namespaces: set[str] = field(default_factory=set)
    uses_groups: set[str] = field(default_factory=set)
    provides_groups: set[str] = field(default_factory=set)
    props: dict = field(default_factory=dict)


def _group(api_version: str) -> str:
    return api_version.rpartition("/")[0]


def in_cluster_objects(graph: DeployGraph, env: str) -> list[InCluster]:
    out = []
    for rid, res in graph.resources(MANIFEST).items():
        objs = manifest_objects(res)
        out.append(InCluster(
            rid, "manifest", pods_of_objects(objs),
            {o["metadata"].get("namespace", "default") for o in objs
             if o["kind"] not in CLUSTER_SCOPED},
            {o["metadata"]["name"] for o in objs if o["kind"] == "Namespace"},
            {_group(o["apiVersion"]) for o in objs} - BUILTIN_GROUPS,
            {o["spec"]["group"] for o in objs if o["kind"] == "CustomResourceDefinition"}))
    for rid, res in graph.resources(HELM).items():
        p = res["Properties"]
        entry = helm_pods.recorded_release(env, p)
        ns = p.get("Namespace", "default")
        out.append(InCluster(rid, "helm", helm_pods.recorded_pods(entry), {ns},
                             {ns} if p.get("CreateNamespace") else set(),
                             set(entry["custom_groups"]), set(entry["crd_groups"]), p))
    return out


def order_problems(graph: DeployGraph, env: str) -> list[str]:
    objects = in_cluster_objects(graph, env)
    groups = node_groups(graph.templates)
    associations = {(r["Properties"]["Namespace"], r["Properties"]["ServiceAccount"]): rid
                    for rid, r in graph.resources(ASSOCIATION).items()}
    problems = []
    for x in objects:
        waits = lambda other: graph.waits_for(x.resource, other)   # noqa: E731
        for ns in sorted(x.namespaces - BUILTIN_NAMESPACES - x.creates_namespaces):
            makers = [y.resource for y in objects if ns in y.creates_namespaces]
            if not any(waits(m) for m in makers):
                problems.append(f"{x.resource}: namespace {ns} is made by "
                                f"{makers or 'nothing'}, which it does not wait for")
        # the Gateway API's CRDs are the team's gateway's (k8s/gateway.py TEAM_CRD_GROUPS)
        for g in sorted(x.uses_groups - x.provides_groups - TEAM_CRD_GROUPS):
            providers = [y.resource for y in objects if g in y.provides_groups]
            if not any(waits(p) for p in providers):
                problems.append(f"{x.resource}: the CRDs of {g} come from "
                                f"{providers or 'nothing'}, which it does not wait for")
        for pod in x.pods:
            assoc = associations.get((pod.namespace, pod.service_account))
            if assoc and not waits(assoc):
                problems.append(f"{x.resource}: {pod.owner} runs as {pod.namespace}/"
                                f"{pod.service_account}, whose Pod Identity association "
                                f"{assoc} it does not wait for")
            able = [g for g in groups if may_land_on(pod, g)]
            if not any(waits(g.resource) for g in able):
                problems.append(f"{x.resource}: {pod.owner} can run on "
                                f"{[g.name for g in able]}, none of which it waits for")
        if x.kind == "helm":
            timeout = int(str(x.props.get("Timeout", "300s")).removesuffix("s"))
            if not (x.props.get("Wait") or x.props.get("Atomic")):
                problems.append(f"{x.resource}: Helm release does not wait for its pods")
            if not NODE_START_MINUTES * 60 < timeout <= HANDLER_LIMIT_S:
                problems.append(f"{x.resource}: Helm timeout {timeout}s: more than a node "
                                f"start ({NODE_START_MINUTES} min) and at most "
                                f"{HANDLER_LIMIT_S}s (the kubectl handler's limit)")
    # every association is used, and an add-on using one waits for it (objects are above)
    used = {(p.namespace, p.service_account) for x in objects for p in x.pods}
    addons = {ADDON_SERVICE_ACCOUNTS[a["Properties"]["AddonName"]]: rid
              for rid, a in graph.resources(ADDON).items()
              if a["Properties"]["AddonName"] in ADDON_SERVICE_ACCOUNTS}
    for key, assoc in associations.items():
        if key in addons and not graph.waits_for(addons[key], assoc):
            problems.append(f"{addons[key]}: the add-on runs as {key[0]}/{key[1]} before its "
                            f"Pod Identity association {assoc} exists")
        elif key not in addons and key not in used:
            problems.append(f"{assoc}: nothing in the cluster runs as {key[0]}/{key[1]}")
    return sorted(set(problems))


@pytest.fixture(scope="module", params=ENVIRONMENTS)
def graph(request, synths):
    s = synths[request.param]
    return request.param, DeployGraph(s.templates, stack_dependencies(s.outdir))


def test_every_in_cluster_object_waits_for_what_it_needs(graph):
    env, g = graph
    objects = in_cluster_objects(g, env)
    # the walk sees every kind of in-cluster object and pods in each stack that has them
    assert {x.kind for x in objects} == {"manifest", "helm"}
    assert {x.resource.split("/")[0].rsplit("-", 1)[1] for x in objects if x.pods} >= {
        "Cluster", "Serving", "Monitoring"}
    assert order_problems(g, env) == []


def test_the_gate_sees_a_release_that_races_the_nodes(graph):
    """The same walk on a copy of the templates where the KEDA release waits for nothing but
    the kubectl barrier (issue 16, finding 2): it must complain."""
    import copy

    env, g = graph
    templates = copy.deepcopy(g.templates)
    (stack, lid), = [(s, k) for s, t in templates.items() for k, r in t["Resources"].items()
                     if r["Type"] == HELM and r["Properties"]["Release"] == "keda"]
    keda = templates[stack]["Resources"][lid]
    keda["DependsOn"] = [d for d in keda.get("DependsOn", []) if "Barrier" in d]
    keda["Properties"].pop("Timeout", None)
    problems = order_problems(DeployGraph(templates, g.stack_deps), env)
    mine = [p for p in problems if p.startswith(f"{stack}/{lid}")]
    assert any("none of which it waits for" in p for p in mine)
    assert any("Helm timeout 300s" in p for p in mine)
    assert any("keda-operator" in p and "Pod Identity" in p for p in mine)
