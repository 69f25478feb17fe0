"""The pod-level fields of a HyperPod file: `tolerations`, `nodeAffinity` and `spec.kubernetes`.

HyperPod puts them on the worker pods; so do we, under the gates our own pods pass: the serving
namespace enforces the restricted pod security standard, so what it would refuse at deploy
(a privileged or root init container, a hostPath volume) is refused or replaced here, at synth,
naming the field. Placement is judged against the environment's node groups (their labels and
taints, `node_labels` / `node_taints`) in k8s/serving.py `fit_endpoint`: an affinity no group
satisfies is an error before deploy rather than a Pending pod.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from config.contracts import (
    ACCELERATOR_LABEL, CACHE_NODE_GROUP, CACHE_TAINT_KEY, DEVICE_PLUGIN_LABEL, GPU_TAINT_KEY,
    GPU_TAINT_VALUE,
    NODE_GROUP_LABEL, NODE_ROLE_CACHE, NODE_ROLE_GPU, NODE_ROLE_LABEL, NODE_ROLE_SYSTEM,
)
from config.errors import ConfigError
from config.images import parse_reference
from config.instances import accelerator_label, ec2_type

Fail = Callable[[str, Any, Any], ConfigError]   # (path, value, allowed) -> the error to raise

_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_ANNOTATION_KEY = re.compile(r"([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}"
                             r"[A-Za-z0-9])?")

# Variables that hold a credential (HF_TOKEN, OPENAI_API_KEY, AWS_SECRET_ACCESS_KEY...): written
# as a literal, it would be in the CloudFormation template and the GitOps YAML.
CREDENTIAL_VAR = re.compile(r"(?:.*_)?(?:TOKEN|SECRET|PASSWORD|PASSWD|API_KEY|APIKEY|ACCESS_KEY|"
                             r"PRIVATE_KEY)", re.I | re.A)

# --- tolerations -----------------------------------------------------------------------------
EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")


def tolerations(items: Any, where: str, fail: Fail) -> tuple[dict, ...]:
    """Kubernetes Toleration objects, checked as the API server would."""
    if not isinstance(items, list):
        raise fail(where, items, "a list of tolerations")
    out = []
    for i, t in enumerate(items):
        at = f"{where}[{i}]"
        if not isinstance(t, Mapping) or not set(t) <= {"key", "operator", "value", "effect",
                                                       "tolerationSeconds"}:
            raise fail(at, t, "{key, operator, value, effect, tolerationSeconds}")
        op = t.get("operator", "Equal")
        if op not in ("Equal", "Exists"):
            raise fail(f"{at}.operator", op, ("Equal", "Exists"))
        if op == "Exists" and t.get("value"):
            raise fail(f"{at}.value", t["value"], "none with operator Exists")
        if not t.get("key") and op != "Exists":
            raise fail(f"{at}.key", None, "a taint key (an empty key needs operator Exists)")
        if t.get("effect") not in (None, "", *EFFECTS):
            raise fail(f"{at}.effect", t["effect"], EFFECTS)
        seconds = t.get("tolerationSeconds")
        if seconds is not None and (isinstance(seconds, bool) or not isinstance(seconds, int)
                                    or t.get("effect") != "NoExecute"):
            raise fail(f"{at}.tolerationSeconds", seconds, "an integer, with effect NoExecute")
        for k in ("key", "value"):
            if not isinstance(t.get(k, ""), str):
                raise fail(f"{at}.{k}", t[k], "a string")
        out.append({k: t[k] for k in ("key", "operator", "value", "effect", "tolerationSeconds")
                    if t.get(k) not in (None, "")})
    return tuple(out)


def tolerates(toleration: Mapping[str, Any], taint: tuple[str, str, str]) -> bool:
    """Kubernetes' ToleratesTaint: key (empty key with Exists: every key), value, effect."""
    key, value, effect = taint
    if toleration.get("effect") and toleration["effect"] != effect:
        return False
    if toleration.get("key") and toleration["key"] != key:
        return False
    if toleration.get("operator", "Equal") == "Exists":
        return True
    return toleration.get("value", "") == value


# --- node affinity ---------------------------------------------------------------------------
OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt")
INSTANCE_TYPE_KEYS = ("node.kubernetes.io/instance-type", "beta.kubernetes.io/instance-type")
# A node's own name: node groups start and replace nodes on demand, so no name is known before
# deploy, and a term requiring one is never met by a node the group starts.
NODE_NAME_KEY = "kubernetes.io/hostname"
# Labels every node has with a value nobody knows at synth: a requirement on them is taken as
# satisfiable (the scheduler decides).
PER_NODE_KEYS = ("eks.amazonaws.com/nodegroup",
                 "eks.amazonaws.com/nodegroup-image", "eks.amazonaws.com/sourceLaunchTemplateId",
                 "eks.amazonaws.com/sourceLaunchTemplateVersion", "topology.k8s.aws/zone-id",
                 "topology.k8s.aws/network-node-layer-1", "topology.k8s.aws/network-node-layer-2",
                 "topology.k8s.aws/network-node-layer-3", "k8s.io/cloud-provider-aws")


def _requirements(items: Any, where: str, fail: Fail, types: Callable[[str], str]) -> list[dict]:
    if not isinstance(items, list):
        raise fail(where, items, "a list of {key, operator, values}")
    out = []
    for i, r in enumerate(items):
        at = f"{where}[{i}]"
        if not isinstance(r, Mapping) or not set(r) <= {"key", "operator", "values"} \
                or not isinstance(r.get("key"), str):
            raise fail(at, r, "{key, operator, values}")
        if r.get("operator") not in OPERATORS:
            raise fail(f"{at}.operator", r.get("operator"), OPERATORS)
        values = r.get("values", [])
        if not isinstance(values, list) or not all(isinstance(v, str) for v in values) \
                or (r["operator"] in ("In", "NotIn")) != bool(values) \
                or (r["operator"] in ("Gt", "Lt") and len(values) != 1):
            raise fail(f"{at}.values", values, "strings: some for In/NotIn, one for Gt/Lt, none "
                       "for Exists/DoesNotExist")
        if r["key"] in INSTANCE_TYPE_KEYS:   # HyperPod's ml. names, read as instanceType is
            values = [types(v) for v in values]
        out.append({"key": r["key"], "operator": r["operator"], **({"values": values}
                                                                  if values else {})})
    return out


def _term(term: Any, where: str, fail: Fail, types: Callable[[str], str]) -> dict:
    if not isinstance(term, Mapping) or not set(term) <= {"matchExpressions", "matchFields"}:
        raise fail(where, term, "{matchExpressions, matchFields}")
    return {k: _requirements(term[k], f"{where}.{k}", fail, types)
            for k in ("matchExpressions", "matchFields") if k in term}


def node_affinity(raw: Any, where: str, fail: Fail, types: Callable[[str], str]) -> dict:
    """A Kubernetes NodeAffinity; instance types written `ml.g5.24xlarge` become the EC2 type
    the environment serves them on (`types`)."""
    keys = {"requiredDuringSchedulingIgnoredDuringExecution",
            "preferredDuringSchedulingIgnoredDuringExecution"}
    if not isinstance(raw, Mapping) or not set(raw) <= keys:
        raise fail(where, raw, sorted(keys))
    out: dict[str, Any] = {}
    req = raw.get("requiredDuringSchedulingIgnoredDuringExecution")
    if req is not None:
        at = f"{where}.requiredDuringSchedulingIgnoredDuringExecution"
        if not isinstance(req, Mapping) or set(req) != {"nodeSelectorTerms"} \
                or not isinstance(req["nodeSelectorTerms"], list) or not req["nodeSelectorTerms"]:
            raise fail(at, req, "{nodeSelectorTerms: [one or more terms]}")
        out["requiredDuringSchedulingIgnoredDuringExecution"] = {"nodeSelectorTerms": [
            _term(t, f"{at}.nodeSelectorTerms[{i}]", fail, types)
            for i, t in enumerate(req["nodeSelectorTerms"])]}
    pref = raw.get("preferredDuringSchedulingIgnoredDuringExecution")
    if pref is not None:
        at = f"{where}.preferredDuringSchedulingIgnoredDuringExecution"
        if not isinstance(pref, list):
            raise fail(at, pref, "a list of {weight, preference}")
        out["preferredDuringSchedulingIgnoredDuringExecution"] = []
        for i, p in enumerate(pref):
            w = p.get("weight") if isinstance(p, Mapping) else None
            if not isinstance(p, Mapping) or set(p) != {"weight", "preference"} \
                    or isinstance(w, bool) or not isinstance(w, int) or not 1 <= w <= 100:
                raise fail(f"{at}[{i}]", p, "{weight: 1 to 100, preference: a term}")
            out["preferredDuringSchedulingIgnoredDuringExecution"].append(
                {"weight": w, "preference": _term(p["preference"], f"{at}[{i}].preference",
                                                  fail, types)})
    return out


@dataclass(frozen=True)
class NodeGroupFacts:
    """What a node group's nodes carry: label -> the values its nodes may have, and taints."""

    name: str
    labels: Mapping[str, tuple[str, ...]]
    taints: tuple[tuple[str, str, str], ...]    # (key, value, effect)


def gpu_group_facts(name: str, instance_types: tuple[str, ...], ami_type: str, region: str,
                    zones: tuple[str, ...]) -> NodeGroupFacts:
    """A GPU node group as constructs/gpu_cluster.py makes it, plus the labels EKS and the
    kubelet put on every node."""
    labels: dict[str, tuple[str, ...]] = {
        NODE_ROLE_LABEL: (NODE_ROLE_GPU,), NODE_GROUP_LABEL: (name,),
        "kubernetes.io/os": ("linux",), "kubernetes.io/arch": ("amd64",),
        "topology.kubernetes.io/region": (region,), "topology.kubernetes.io/zone": zones,
        "node.kubernetes.io/instance-type": instance_types,
        "beta.kubernetes.io/instance-type": instance_types,
        "eks.amazonaws.com/capacityType": ("ON_DEMAND", "SPOT"),
    }
    if accel := accelerator_label(instance_types[0]):
        labels[ACCELERATOR_LABEL] = (accel,)
    if not ami_type.startswith("BOTTLEROCKET"):   # the device plugin DaemonSet's selector
        labels[DEVICE_PLUGIN_LABEL] = ("daemonset",)
    return NodeGroupFacts(name, labels, ((GPU_TAINT_KEY, GPU_TAINT_VALUE, "NoSchedule"),))


def other_groups() -> tuple[NodeGroupFacts, ...]:
    """The system group and the in-cluster L2's node (the taints a toleration may be for)."""
    return (NodeGroupFacts("system", {NODE_ROLE_LABEL: (NODE_ROLE_SYSTEM,)}, ()),
            NodeGroupFacts(CACHE_NODE_GROUP, {NODE_ROLE_LABEL: (NODE_ROLE_CACHE,)},
                           ((CACHE_TAINT_KEY, "present", "NoSchedule"),)))


def _may_match(req: Mapping[str, Any], group: NodeGroupFacts) -> bool:
    """Whether some node of `group` may satisfy `req` (unknown per-node values: yes)."""
    key, op, values = req["key"], req["operator"], req.get("values", [])
    if key == NODE_NAME_KEY:
        return op in ("NotIn", "Exists")
    if key in PER_NODE_KEYS:
        return True
    have = group.labels.get(key)
    if have is None:
        return op in ("NotIn", "DoesNotExist")
    if op == "In":
        return bool(set(have) & set(values))
    if op == "NotIn":
        return bool(set(have) - set(values))
    if op == "Exists":
        return True
    if op == "DoesNotExist":
        return False
    try:
        bound = int(values[0])
        nums = [int(v) for v in have]
    except ValueError:
        return False
    return any(n > bound if op == "Gt" else n < bound for n in nums)


def unsatisfied(affinity: Mapping[str, Any], group: NodeGroupFacts) -> bool:
    """True where no node of `group` can satisfy the required terms (terms are ORed, a term's
    requirements ANDed; matchFields name nodes, unknown at synth)."""
    req = affinity.get("requiredDuringSchedulingIgnoredDuringExecution")
    if not req:
        return False
    return not any(all(_may_match(r, group) for r in t.get("matchExpressions", []))
                   for t in req["nodeSelectorTerms"])


# --- spec.kubernetes -------------------------------------------------------------------------
# Volume sources the restricted pod security standard admits.
RESTRICTED_VOLUMES = ("configMap", "csi", "downwardAPI", "emptyDir", "ephemeral",
                      "persistentVolumeClaim", "projected", "secret")
CONTAINER_KEYS = ("name", "image", "command", "args", "env", "envFrom", "volumeMounts",
                  "resources", "securityContext", "workingDir", "imagePullPolicy",
                  "terminationMessagePath", "terminationMessagePolicy")
# Annotations whose meaning the platform owns: a file's value would change how the workers are
# evicted or operated, so ours (or none) stands.
OWN_ANNOTATIONS = ("kubectl.kubernetes.io/default-container",
                   "cluster-autoscaler.kubernetes.io/safe-to-evict",
                   "karpenter.sh/do-not-disrupt")
OWN_ANNOTATION_PREFIXES = ("kvcache.io/",)
# What the workers chart (k8s/workers.py) names itself: a file's volume or init container may
# not take these names (a test holds the chart to them).
OUR_VOLUMES = ("model-weights", "dshm", "home", "tmp", "prometheus", "lmcache-base",
               "lmcache-runtime", "api-key", "fetch-tmp", "hub-token", "limits-config")
# (native sidecars among them: k8s/request_limits.py's and k8s/lmcache_server.py's)
OUR_INIT_CONTAINERS = ("stage-model", "fetch-l2-secret", "fetch-api-key", "fetch-hub-token",
                       "vllm", "request-limits", "lmcache-server")


@dataclass(frozen=True)
class PodExtras:
    """What `spec.kubernetes` adds to the worker pod."""

    init_containers: tuple[Mapping[str, Any], ...] = ()
    volumes: tuple[Mapping[str, Any], ...] = ()
    service_account: str | None = None
    annotations: tuple[tuple[str, str], ...] = ()


def annotations(raw: Any, where: str, fail: Fail, warnings: list[str], file: str
                ) -> tuple[tuple[str, str], ...]:
    if not isinstance(raw, Mapping):
        raise fail(where, raw, "a mapping of annotation keys to strings")
    out = []
    for key, value in raw.items():
        if not isinstance(key, str) or not _ANNOTATION_KEY.fullmatch(key) \
                or not isinstance(value, str):
            raise fail(f"{where}.{key}", value, "an annotation key (prefix/name) and a string "
                       "value")
        if key in OWN_ANNOTATIONS or key.startswith(OWN_ANNOTATION_PREFIXES):
            warnings.append(f"{file}: {where}.{key}: not rendered: this annotation is ours "
                            "(the workers' eviction and operation follow their "
                            "PodDisruptionBudget and drain)")
            continue
        out.append((key, value))
    return tuple(sorted(out))


def volumes(raw: Any, where: str, fail: Fail, warnings: list[str], file: str,
            model_volume: str, reserved: tuple[str, ...]) -> tuple[dict, ...]:
    """The file's volumes; hostPath (refused by the namespace) becomes an emptyDir; the model
    volume is ours (staged from the model bucket)."""
    if not isinstance(raw, list):
        raise fail(where, raw, "a list of volumes")
    out: list[dict] = []
    for i, v in enumerate(raw):
        at = f"{where}[{i}]"
        name = v.get("name") if isinstance(v, Mapping) else None
        if not isinstance(name, str) or not _DNS_LABEL.fullmatch(name):
            raise fail(f"{at}.name", name, "a DNS label")
        sources = set(v) - {"name"}
        if len(sources) != 1:
            raise fail(at, sorted(sources), "a name and one volume source")
        (source,) = sources
        if name == model_volume:
            warnings.append(f"{file}: {at}: {name} is the model volume: ours serves it "
                            "(the weights staged from the environment's model bucket)")
            continue
        if name in reserved or any(o["name"] == name for o in out):
            raise fail(f"{at}.name", name, f"a name other than {', '.join(reserved)} and "
                       "the file's other volumes")
        if source == "hostPath":
            warnings.append(f"{file}: {at}.hostPath: the serving namespace enforces the "
                            "restricted pod security standard, which refuses hostPath: "
                            f"{name} is an emptyDir on the node's disk instead")
            out.append({"name": name, "emptyDir": {}})
            continue
        if source not in RESTRICTED_VOLUMES:
            raise fail(f"{at}.{source}", name, "a volume source the restricted pod security "
                       "standard admits: " + ", ".join(RESTRICTED_VOLUMES))
        if not isinstance(v[source], Mapping):
            raise fail(f"{at}.{source}", v[source], "a mapping")
        out.append({"name": name, source: dict(v[source])})
    return tuple(out)


def _security(ctx: Any, at: str, fail: Fail) -> dict:
    """The parts of a container's securityContext we keep; what would break the restricted
    standard is refused, naming the container."""
    if ctx is None:
        return {}
    if not isinstance(ctx, Mapping):
        raise fail(at, ctx, "a mapping")
    why = ("the workers' namespace enforces the restricted pod security standard, which "
           "refuses it at deploy")
    if ctx.get("privileged") is True:
        raise fail(f"{at}.privileged", True, f"false or absent: {why}")
    if ctx.get("allowPrivilegeEscalation") is True:
        raise fail(f"{at}.allowPrivilegeEscalation", True, f"false or absent: {why}")
    if ctx.get("runAsNonRoot") is False:
        raise fail(f"{at}.runAsNonRoot", False, f"true or absent: {why}")
    for k in ("runAsUser", "runAsGroup"):
        if ctx.get(k) == 0:
            raise fail(f"{at}.{k}", 0, f"a non-zero id or absent: {why}")
    added = (ctx.get("capabilities") or {}).get("add") or []
    if set(added) - {"NET_BIND_SERVICE"}:
        raise fail(f"{at}.capabilities.add", added, f"none but NET_BIND_SERVICE: {why}")
    if (ctx.get("seccompProfile") or {}).get("type") == "Unconfined":
        raise fail(f"{at}.seccompProfile.type", "Unconfined", f"RuntimeDefault: {why}")
    if ctx.get("procMount") not in (None, "Default"):
        raise fail(f"{at}.procMount", ctx["procMount"], f"Default: {why}")
    return {k: ctx[k] for k in ("runAsUser", "runAsGroup", "readOnlyRootFilesystem")
            if k in ctx}


def init_containers(raw: Any, where: str, fail: Fail, warnings: list[str], file: str,
                    model_volume: str, volume_names: set[str], reserved: tuple[str, ...]
                    ) -> tuple[dict, ...]:
    """The file's init containers, to run after ours; one that loads the model volume is
    replaced by our staging (a warning), a privileged or root one is refused, naming it."""
    if not isinstance(raw, list):
        raise fail(where, raw, "a list of containers")
    out: list[dict] = []
    for i, c in enumerate(raw):
        at = f"{where}[{i}]"
        name = c.get("name") if isinstance(c, Mapping) else None
        if not isinstance(name, str) or not _DNS_LABEL.fullmatch(name):
            raise fail(f"{at}.name", name, "a DNS label")
        at = f"{where}[{name}]"
        if name in reserved or any(o["name"] == name for o in out):
            raise fail(f"{at}.name", name, f"a name other than {', '.join(reserved)} and the "
                       "file's other init containers")
        if set(c) - set(CONTAINER_KEYS):
            raise fail(at, sorted(set(c) - set(CONTAINER_KEYS)), "container fields "
                       + ", ".join(CONTAINER_KEYS))
        security = _security(c.get("securityContext"), f"{at}.securityContext", fail)
        mounts = c.get("volumeMounts") or []
        if not isinstance(mounts, list) or not all(isinstance(m, Mapping) and isinstance(
                m.get("name"), str) and isinstance(m.get("mountPath"), str) for m in mounts):
            raise fail(f"{at}.volumeMounts", mounts, "a list of {name, mountPath}")
        if any(m["name"] == model_volume for m in mounts):
            warnings.append(f"{file}: {at}: loads the model volume ({model_volume}): ours "
                            "stages the weights from the environment's model bucket instead, "
                            "so it is not run (python -m tools upload-model puts them there)")
            continue
        for m in mounts:
            if m["name"] not in volume_names:
                raise fail(f"{at}.volumeMounts", m["name"], "a volume of spec.kubernetes."
                           "volumes: " + (", ".join(sorted(volume_names)) or "(none)"))
        image = c.get("image")
        try:
            pinned = isinstance(image, str) and (lambda r: r[3] or r[2] != "latest")(
                parse_reference(image))
        except ValueError:
            pinned = False
        if not pinned:
            raise fail(f"{at}.image", image, "an image with a pinned tag or digest (not "
                       "latest): what runs must be what was reviewed and mirrored")
        env = c.get("env") or []
        if not isinstance(env, list) or not all(isinstance(e, Mapping) and isinstance(
                e.get("name"), str) for e in env):
            raise fail(f"{at}.env", env, "a list of {name, value} or {name, valueFrom}")
        for e in env:
            if e.get("value") not in (None, "") and CREDENTIAL_VAR.fullmatch(e["name"]):
                raise fail(f"{at}.env.{e['name']}", "<a literal credential>", "valueFrom."
                           "secretKeyRef (a Secret in kvcache-serving): a literal would be in "
                           "the CloudFormation template and the GitOps YAML")
        out.append({**{k: c[k] for k in CONTAINER_KEYS if k in c},
                    "securityContext": security})
    return tuple(out)


def service_account(raw: Any, where: str, fail: Fail) -> str:
    if not isinstance(raw, str) or len(raw) > 253 or not _DNS_SUBDOMAIN.fullmatch(raw) \
            or raw == "default":
        raise fail(where, raw, "a service account name (a DNS subdomain, not default): the "
                   "workers' account, which Pod Identity binds to the worker role")
    return raw


def served_type(mapping: Mapping[str, str]) -> Callable[[str], str]:
    """How an instance type written in a file reads: `ml.` dropped, instanceTypeMap applied."""
    return lambda t: mapping.get(t, ec2_type(t))
