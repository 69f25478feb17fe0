"""What a first deploy meets in the cluster, read from the synthesized templates: node groups
and what the scheduler can place on them, the pods every in-cluster object creates, and the
order CloudFormation creates things in. The first-deploy gates (test_scheduling.py,
test_deploy_order.py) walk every object with these; nothing here names one of our objects.

Allocatable node resources: EKS's reserved-resource formula, in config/instances.py
(`allocatable`, with its sources).
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping

from config.contracts import (
    EFA_NODE_LABEL, EFA_RESOURCE,
    ACCELERATOR_LABEL, CACHE_NODE_GROUP, CACHE_TAINT_KEY, DEVICE_PLUGIN_LABEL, GPU_TAINT_KEY,
    GPU_TAINT_VALUE, NODE_GROUP_LABEL, NODE_ROLE_CACHE, NODE_ROLE_GPU, NODE_ROLE_LABEL,
    NODE_ROLE_SYSTEM,
)
from config.instances import EFA, accelerator_label, allocatable as node_allocatable

MANIFEST = "Custom::AWSCDK-EKS-KubernetesResource"
HELM = "Custom::AWSCDK-EKS-HelmChart"
NODEGROUP = "AWS::EKS::Nodegroup"
ASSOCIATION = "AWS::EKS::PodIdentityAssociation"
ADDON = "AWS::EKS::Addon"

# DaemonSets the EKS add-ons put on every node (requests per node: millicores, MiB), from the
# add-ons' upstream charts: aws-node 25m (aws/eks-charts aws-vpc-cni values; its network policy
# agent requests nothing), kube-proxy 100m (EKS's kube-proxy manifest), ebs-csi-node 3 x
# (10m, 40Mi) (kubernetes-sigs/aws-ebs-csi-driver chart: plugin, registrar, liveness probe);
# the Pod Identity agent requests nothing.
ADDON_DAEMONSETS = {"aws-node": (25, 0), "kube-proxy": (100, 0), "ebs-csi-node": (30, 120)}

BUILTIN_NAMESPACES = {"default", "kube-system", "kube-public", "kube-node-lease"}
BUILTIN_GROUPS = {
    "", "apps", "batch", "policy", "autoscaling", "rbac.authorization.k8s.io",
    "networking.k8s.io", "storage.k8s.io", "scheduling.k8s.io", "coordination.k8s.io",
    "admissionregistration.k8s.io", "apiextensions.k8s.io", "certificates.k8s.io",
    "discovery.k8s.io", "node.k8s.io", "events.k8s.io", "apiregistration.k8s.io",
    "flowcontrol.apiserver.k8s.io", "resource.k8s.io",
}
CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition",
                  "StorageClass", "PriorityClass", "IngressClass", "ValidatingWebhookConfiguration",
                  "MutatingWebhookConfiguration", "APIService", "PersistentVolume",
                  "RuntimeClass"}
WORKLOADS = {"Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job"}


# ---------------------------------------------------------------- quantities and resources

_SUFFIX = {"Ki": 2 ** 10, "Mi": 2 ** 20, "Gi": 2 ** 30, "Ti": 2 ** 40, "K": 1e3, "k": 1e3,
           "M": 1e6, "G": 1e9, "T": 1e12, "m": 1e-3, "": 1}


def quantity(value: Any) -> float:
    """A Kubernetes quantity as a plain number (cores, bytes, devices)."""
    text = str(value)
    match = re.fullmatch(r"([0-9.]+)([A-Za-z]*)", text)
    if not match or match[2] not in _SUFFIX:
        raise ValueError(f"not a quantity: {value!r}")
    return float(match[1]) * _SUFFIX[match[2]]


@dataclass(frozen=True)
class Resources:
    cpu_m: float = 0          # millicores
    memory_mib: float = 0
    gpus: float = 0
    efa: float = 0            # vpc.amazonaws.com/efa: the EFA device plugin's, on EFA groups

    def __add__(self, other: "Resources") -> "Resources":
        return Resources(self.cpu_m + other.cpu_m, self.memory_mib + other.memory_mib,
                         self.gpus + other.gpus, self.efa + other.efa)

    def fits(self, capacity: "Resources") -> bool:
        return (self.cpu_m <= capacity.cpu_m and self.memory_mib <= capacity.memory_mib
                and self.gpus <= capacity.gpus and self.efa <= capacity.efa)

    def __str__(self) -> str:
        return (f"{self.cpu_m:.0f}m CPU, {self.memory_mib / 1024:.2f} GiB"
                + (f", {self.gpus:g} GPU" if self.gpus else "")
                + (f", {self.efa:g} EFA" if self.efa else ""))

    @staticmethod
    def of(requests: Mapping[str, Any] | None) -> "Resources":
        r = requests or {}
        return Resources(quantity(r.get("cpu", 0)) * 1000,
                         quantity(r.get("memory", 0)) / 2 ** 20,
                         quantity(r.get("nvidia.com/gpu", 0)),
                         quantity(r.get(EFA_RESOURCE, 0)))


def _maximum(a: Resources, b: Resources) -> Resources:
    return Resources(max(a.cpu_m, b.cpu_m), max(a.memory_mib, b.memory_mib),
                     max(a.gpus, b.gpus), max(a.efa, b.efa))


# ---------------------------------------------------------------- nodes


def allocatable(instance_type: str) -> Resources:
    a = node_allocatable(instance_type)
    return Resources(a.cpu_m, a.memory_mib, a.gpus)


ADDON_OVERHEAD = Resources(sum(c for c, _ in ADDON_DAEMONSETS.values()),
                           sum(m for _, m in ADDON_DAEMONSETS.values()))


@dataclass(frozen=True)
class NodeGroup:
    name: str
    instance_types: tuple[str, ...]
    labels: Mapping[str, str]
    taints: tuple[tuple[str, str, str], ...]   # (key, value, effect)
    min_size: int
    max_size: int
    resource: str = ""                         # "<stack>/<logical id>" where synthesized

    @property
    def allocatable(self) -> Resources:
        """What the smallest of its types offers: a pod must fit whichever one launches."""
        options = [allocatable(t) for t in self.instance_types]
        efa = (min(EFA[t].interfaces for t in self.instance_types)
               if self.labels.get(EFA_NODE_LABEL) == "true" else 0)
        return Resources(min(o.cpu_m for o in options), min(o.memory_mib for o in options),
                         min(o.gpus for o in options), efa)


def config_node_groups(cfg, l2_node_type: str | None = None) -> list[NodeGroup]:
    """The node groups an environment's config makes (what constructs/gpu_cluster.py labels and
    taints), for renders without a synth; a test holds them to the synthesized ones. With
    `l2_node_type`: the in-cluster L2's own node (stacks/cache_stack.py)."""
    def group(g, role, taints):
        labels = {NODE_ROLE_LABEL: role, NODE_GROUP_LABEL: g.name, "kubernetes.io/os": "linux",
                  "kubernetes.io/arch": "arm64" if "ARM" in g.ami_type else "amd64",
                  "eks.amazonaws.com/capacityType": g.capacity_type}
        if role == NODE_ROLE_GPU:
            labels[ACCELERATOR_LABEL] = accelerator_label(g.instance_types[0])
        if role == NODE_ROLE_GPU and not g.ami_type.startswith("BOTTLEROCKET"):
            labels[DEVICE_PLUGIN_LABEL] = "daemonset"
        if g.efa:
            labels[EFA_NODE_LABEL] = "true"
        return NodeGroup(g.name, g.instance_types, labels, taints, g.min_size, g.max_size)

    gpu_taint = ((GPU_TAINT_KEY, GPU_TAINT_VALUE, "NoSchedule"),)
    groups = [group(cfg.system_nodes, NODE_ROLE_SYSTEM, ()),
              *(group(g, NODE_ROLE_GPU, gpu_taint) for g in cfg.gpu_node_groups)]
    if l2_node_type:
        groups.append(NodeGroup(CACHE_NODE_GROUP, (l2_node_type,), {
            NODE_ROLE_LABEL: NODE_ROLE_CACHE, NODE_GROUP_LABEL: CACHE_NODE_GROUP,
            "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
            "eks.amazonaws.com/capacityType": "ON_DEMAND"},
            ((CACHE_TAINT_KEY, "present", "NoSchedule"),), 1, 1))
    return groups


_EFFECT = {"NO_SCHEDULE": "NoSchedule", "NO_EXECUTE": "NoExecute",
           "PREFER_NO_SCHEDULE": "PreferNoSchedule"}


def node_groups(templates: Mapping[str, dict]) -> list[NodeGroup]:
    """Every managed node group of the templates, with the labels its nodes carry (its own and
    the well-known ones the kubelet and EKS set)."""
    out = []
    for stack, template in templates.items():
        for lid, res in template.get("Resources", {}).items():
            if res["Type"] != NODEGROUP:
                continue
            p = res["Properties"]
            types = tuple(p["InstanceTypes"])
            arch = "arm64" if "ARM" in p.get("AmiType", "") else "amd64"
            labels = {**p.get("Labels", {}), "kubernetes.io/os": "linux",
                      "kubernetes.io/arch": arch,
                      "eks.amazonaws.com/capacityType": p.get("CapacityType", "ON_DEMAND")}
            taints = tuple((t["Key"], t.get("Value", ""), _EFFECT[t["Effect"]])
                           for t in p.get("Taints", []))
            scaling = p["ScalingConfig"]
            out.append(NodeGroup(labels.get("kvcache.io/node-group", lid), types, labels, taints,
                                 scaling["MinSize"], scaling["MaxSize"], f"{stack}/{lid}"))
    return out


# ---------------------------------------------------------------- pods


@dataclass(frozen=True)
class Pod:
    """One pod template: where it may run and what it requests."""

    owner: str                    # "<kind>/<namespace>/<name>"
    namespace: str
    service_account: str
    requests: Resources
    node_selector: Mapping[str, str] = field(default_factory=dict)
    tolerations: tuple[Mapping[str, Any], ...] = ()
    required_terms: tuple[Mapping[str, Any], ...] = ()   # nodeSelectorTerms (OR)
    daemonset: bool = False


def pod_requests(spec: Mapping[str, Any]) -> Resources:
    """The scheduler's view: the sum of the containers, or the largest init container."""
    total = Resources()
    for c in spec.get("containers", []):
        total = total + Resources.of(c.get("resources", {}).get("requests")
                                     or c.get("resources", {}).get("limits"))
    init = Resources()
    for c in spec.get("initContainers", []):
        init = _maximum(init, Resources.of(c.get("resources", {}).get("requests")
                                           or c.get("resources", {}).get("limits")))
    return _maximum(total, init)


def pod_of(kind: str, namespace: str, name: str, spec: Mapping[str, Any]) -> Pod:
    affinity = (spec.get("affinity") or {}).get("nodeAffinity") or {}
    required = (affinity.get("requiredDuringSchedulingIgnoredDuringExecution") or {})
    return Pod(f"{kind}/{namespace}/{name}", namespace,
               spec.get("serviceAccountName") or "default", pod_requests(spec),
               dict(spec.get("nodeSelector") or {}), tuple(spec.get("tolerations") or ()),
               tuple(required.get("nodeSelectorTerms") or ()), kind == "DaemonSet")


def pods_of_objects(objects: Iterable[Mapping[str, Any]]) -> list[Pod]:
    out = []
    for obj in objects:
        if obj.get("kind") in WORKLOADS:
            spec = obj["spec"]["template"]["spec"]
            meta = obj["metadata"]
            out.append(pod_of(obj["kind"], meta.get("namespace", "default"), meta["name"], spec))
    return out


def manifest_pods(templates: Mapping[str, dict]) -> list[Pod]:
    """The pods of every manifest the templates apply."""
    return [pod for t in templates.values() for res in t.get("Resources", {}).values()
            if res["Type"] == MANIFEST for pod in pods_of_objects(manifest_objects(res))]


def _tolerates(pod: Pod, taint: tuple[str, str, str]) -> bool:
    key, value, effect = taint
    for t in pod.tolerations:
        if t.get("effect") not in (None, "", effect):
            continue
        if t.get("operator") == "Exists" and t.get("key") in (None, "", key):
            return True
        if t.get("key") == key and t.get("operator", "Equal") == "Equal" \
                and str(t.get("value", "")) == value:
            return True
    return False


def _expression(labels: Mapping[str, str], e: Mapping[str, Any]) -> bool:
    key, op, values = e["key"], e["operator"], [str(v) for v in e.get("values", [])]
    have = labels.get(key)
    if op in ("Gt", "Lt"):   # integers, as the scheduler reads them; only for these operators
        if have is None or not have.lstrip("-").isdigit():
            return False
        return int(have) > int(values[0]) if op == "Gt" else int(have) < int(values[0])
    return {"In": have in values, "NotIn": have not in values, "Exists": have is not None,
            "DoesNotExist": have is None}[op]


def may_land_on(pod: Pod, group: NodeGroup) -> bool:
    """nodeSelector, required node affinity and taints, as the scheduler's filters read them."""
    if any(group.labels.get(k) != str(v) for k, v in pod.node_selector.items()):
        return False
    if pod.required_terms and not any(
            all(_expression(group.labels, e) for e in term.get("matchExpressions", []))
            for term in pod.required_terms):
        return False
    return all(_tolerates(pod, t) for t in group.taints if t[2] in ("NoSchedule", "NoExecute"))


def daemon_load(group: NodeGroup, pods: Iterable[Pod]) -> Resources:
    """What DaemonSets take from every node of the group: ours, the charts', the add-ons'."""
    total = ADDON_OVERHEAD
    for p in pods:
        if p.daemonset and may_land_on(p, group):
            total = total + p.requests
    return total


def unschedulable(pods: list[Pod], groups: list[NodeGroup]) -> list[str]:
    """One line per pod that fits no node group it may land on."""
    problems = []
    for pod in pods:
        candidates = [g for g in groups if may_land_on(pod, g) and g.max_size > 0]
        if not candidates:
            problems.append(f"{pod.owner}: no node group matches its nodeSelector, affinity "
                            "and tolerations")
            continue
        if pod.daemonset:
            continue   # counted in every group's daemon load below
        reasons = []
        for g in candidates:
            free = g.allocatable
            need = pod.requests + daemon_load(g, pods)
            if need.fits(free):
                break
            reasons.append(f"{g.name} ({'/'.join(g.instance_types)}) allocates {free}; the pod "
                           f"requests {pod.requests} beside {daemon_load(g, pods)} of DaemonSets")
        else:
            problems.append(f"{pod.owner}: fits no node group: " + "; ".join(reasons))
    for g in groups:   # the DaemonSets alone must leave room on every group
        load = daemon_load(g, pods)
        if not load.fits(g.allocatable):
            problems.append(f"DaemonSets on {g.name}: {load} > {g.allocatable}")
    return problems


# ---------------------------------------------------------------- templates


def flatten(value: Any) -> str:
    """A CloudFormation string, tokens replaced by a placeholder (JSON-safe)."""
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping) and "Fn::Join" in value:
        sep, parts = value["Fn::Join"]
        return sep.join(flatten(p) if isinstance(p, (str, Mapping)) else "TOKEN" for p in parts)
    return "TOKEN"


def manifest_objects(resource: Mapping[str, Any]) -> list[dict]:
    return json.loads(flatten(resource["Properties"]["Manifest"]))


def _refs(value: Any) -> Iterator[str]:
    if isinstance(value, Mapping):
        for k, v in value.items():
            if k == "Ref" and isinstance(v, str):
                yield v
            elif k == "Fn::GetAtt":
                yield v[0] if isinstance(v, list) else v.split(".")[0]
            elif k == "Fn::Sub":
                text = v[0] if isinstance(v, list) else v
                yield from (m.split(".")[0] for m in re.findall(r"\$\{([^}!]+)\}", text))
                if isinstance(v, list):
                    yield from _refs(v[1])
            else:
                yield from _refs(v)
    elif isinstance(value, list):
        for v in value:
            yield from _refs(v)


class DeployGraph:
    """Creation order as CloudFormation runs it: DependsOn and references within a stack, and
    every resource of a stack after every resource of the stacks it depends on."""

    def __init__(self, templates: Mapping[str, dict], stack_deps: Mapping[str, Iterable[str]]):
        self.templates = templates
        self.parents: dict[str, set[str]] = {}
        for stack, t in templates.items():
            resources = t.get("Resources", {})
            for lid, res in resources.items():
                deps = res.get("DependsOn", [])
                deps = [deps] if isinstance(deps, str) else deps
                refs = {r for r in _refs(res.get("Properties", {})) if r in resources}
                self.parents[f"{stack}/{lid}"] = {f"{stack}/{d}" for d in (*deps, *refs)}
        self.stack_deps = {s: {d for d in stack_deps.get(s, ()) if d in templates}
                           for s in templates}
        self._cache: dict[str, set[str]] = {}

    def resources(self, type_: str) -> dict[str, dict]:
        return {f"{s}/{lid}": r for s, t in self.templates.items()
                for lid, r in t.get("Resources", {}).items() if r["Type"] == type_}

    def _stack_closure(self, stack: str) -> set[str]:
        seen, todo = set(), list(self.stack_deps[stack])
        while todo:
            s = todo.pop()
            if s not in seen:
                seen.add(s)
                todo += self.stack_deps[s]
        return seen

    def ancestors(self, node: str) -> set[str]:
        if node not in self._cache:
            seen, todo = set(), list(self.parents[node])
            while todo:
                n = todo.pop()
                if n not in seen:
                    seen.add(n)
                    todo += self.parents[n]
            for s in self._stack_closure(node.split("/")[0]):
                seen |= {f"{s}/{lid}" for lid in self.templates[s].get("Resources", {})}
            self._cache[node] = seen
        return self._cache[node]

    def waits_for(self, node: str, other: str) -> bool:
        return other in self.ancestors(node)


def stack_dependencies(outdir: Path) -> dict[str, list[str]]:
    manifest = json.loads((outdir / "manifest.json").read_text())
    return {name: art.get("dependencies", []) for name, art in manifest["artifacts"].items()
            if art["type"] == "aws:cloudformation:stack"}
