"""One way to declare a Kubernetes object in a chart, and the standard labels.

Raw `ApiObject` + a JSON patch keeps manifests exactly as written (quantities, extended
resources like `nvidia.com/gpu`) and avoids cdk8s-plus defaults that are wrong for GPU workers
(docs/serving.md); strict schema tests check every object.
"""
from __future__ import annotations

from typing import Any, Mapping

from cdk8s import ApiObject, JsonPatch
from constructs import Construct

from config.contracts import (
    APP_NAME, LABEL_COMPONENT, LABEL_INSTANCE, LABEL_MANAGED_BY, LABEL_NAME, LABEL_PART_OF,
)


def selector_labels(component: str, instance: str) -> dict[str, str]:
    """What Services, PDBs and the router select on; never typed by hand elsewhere."""
    return {LABEL_NAME: component, LABEL_INSTANCE: instance}


def standard_labels(component: str, instance: str) -> dict[str, str]:
    return {**selector_labels(component, instance), LABEL_COMPONENT: component,
            LABEL_PART_OF: APP_NAME, LABEL_MANAGED_BY: "cdk8s"}


def k8s_object(scope: Construct, id: str, *, api_version: str, kind: str, name: str,
               namespace: str | None, labels: Mapping[str, str],
               body: Mapping[str, Any], annotations: Mapping[str, str] | None = None
               ) -> ApiObject:
    meta: dict[str, Any] = {"name": name, "labels": dict(labels)}
    if namespace:
        meta["namespace"] = namespace
    if annotations:
        meta["annotations"] = dict(annotations)
    obj = ApiObject(scope, id, api_version=api_version, kind=kind, metadata=meta)
    for key, value in body.items():
        obj.add_json_patch(JsonPatch.add(f"/{key}", value))
    return obj


def hardened(read_only_root: bool = True, run_as_user: int | None = 65532) -> dict[str, Any]:
    ctx: dict[str, Any] = {"allowPrivilegeEscalation": False,
                           "capabilities": {"drop": ["ALL"]},
                           "readOnlyRootFilesystem": read_only_root,
                           "seccompProfile": {"type": "RuntimeDefault"}}
    if run_as_user is not None:
        ctx.update(runAsNonRoot=True, runAsUser=run_as_user, runAsGroup=run_as_user)
    return ctx


def pod_security(run_as_user: int | None = 65532) -> dict[str, Any]:
    """Pod-level: seccomp RuntimeDefault always; non-root (with its fsGroup owning emptyDirs)
    where every container can run so."""
    ctx: dict[str, Any] = {"seccompProfile": {"type": "RuntimeDefault"}}
    if run_as_user is not None:
        ctx.update(runAsNonRoot=True, runAsUser=run_as_user, runAsGroup=run_as_user,
                   fsGroup=run_as_user)
    return ctx


PSA = "pod-security.kubernetes.io/"


def pod_security_labels(enforce: str, version: str, audit: str | None = None) -> dict[str, str]:
    """Pod Security Admission: `enforce` rejects pods; audit/warn (default: `enforce`) report
    what a stricter level would reject. Pinned to the cluster's minor version."""
    audit = audit or enforce
    v = f"v{version}"
    return {f"{PSA}enforce": enforce, f"{PSA}enforce-version": v,
            f"{PSA}audit": audit, f"{PSA}audit-version": v,
            f"{PSA}warn": audit, f"{PSA}warn-version": v}


def pdb(scope: Construct, *, name: str, namespace: str, labels: Mapping[str, str],
        selector: Mapping[str, str], max_unavailable: int = 1) -> ApiObject:
    return k8s_object(scope, "Pdb", api_version="policy/v1", kind="PodDisruptionBudget",
                      name=name, namespace=namespace, labels=labels,
                      body={"spec": {"maxUnavailable": max_unavailable,
                                     "selector": {"matchLabels": dict(selector)}}})


def zone_spread(selector: Mapping[str, str], hard: bool = False) -> list[dict[str, Any]]:
    return [{"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone",
             "whenUnsatisfiable": "DoNotSchedule" if hard else "ScheduleAnyway",
             "labelSelector": {"matchLabels": dict(selector)}}]


def account_role(scope: Construct, id_prefix: str, *, name: str, namespace: str,
                 labels: Mapping[str, str], rules: list[dict]) -> None:
    """A namespaced Role and its RoleBinding to the service account of the same name: the
    least privilege a pod of ours gets (ids `<prefix>Role`, `<prefix>RoleBinding`)."""
    rbac = "rbac.authorization.k8s.io"
    k8s_object(scope, f"{id_prefix}Role", api_version=f"{rbac}/v1", kind="Role", name=name,
               namespace=namespace, labels=labels, body={"rules": rules})
    k8s_object(scope, f"{id_prefix}RoleBinding", api_version=f"{rbac}/v1", kind="RoleBinding",
               name=name, namespace=namespace, labels=labels, body={
                   "roleRef": {"apiGroup": rbac, "kind": "Role", "name": name},
                   "subjects": [{"kind": "ServiceAccount", "name": name,
                                 "namespace": namespace}]})
