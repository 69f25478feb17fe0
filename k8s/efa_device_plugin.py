"""The EFA device plugin DaemonSet: advertises `vpc.amazonaws.com/efa` on EFA node groups (the
nodes of disaggregated prefill/decode, k8s/pd.py), as the EKS add-on registry's chart
(eks-charts `aws-efa-k8s-device-plugin`) renders it: hostNetwork, the kubelet's device-plugin
socket directory, no capability. Rendered here (China reaches no Helm repository); the image is
the catalogue's (`efa-device-plugin`, mirrored in China like every other)."""
from __future__ import annotations

from cdk8s import Chart
from constructs import Construct

from config.contracts import EFA_NODE_LABEL, GPU_TAINT_KEY, SYSTEM_NAMESPACE
from k8s.objects import k8s_object, selector_labels, standard_labels

NAME = "aws-efa-k8s-device-plugin"


class EfaDevicePluginChart(Chart):
    def __init__(self, scope: Construct, id: str, *, image: str) -> None:
        super().__init__(scope, id, namespace=SYSTEM_NAMESPACE)
        sel = selector_labels(NAME, "cluster")
        labels = standard_labels(NAME, "cluster")
        k8s_object(self, "DaemonSet", api_version="apps/v1", kind="DaemonSet", name=NAME,
                   namespace=SYSTEM_NAMESPACE, labels=labels, body={"spec": {
                       "selector": {"matchLabels": sel},
                       "updateStrategy": {"type": "RollingUpdate"},
                       "template": {"metadata": {"labels": labels}, "spec": {
                           "priorityClassName": "system-node-critical",
                           "hostNetwork": True,
                           "nodeSelector": {EFA_NODE_LABEL: "true"},
                           "tolerations": [{"key": GPU_TAINT_KEY, "operator": "Exists",
                                            "effect": "NoSchedule"}],
                           "automountServiceAccountToken": False,
                           "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
                           "containers": [{
                               "name": NAME, "image": image, "imagePullPolicy": "IfNotPresent",
                               "securityContext": {"allowPrivilegeEscalation": False,
                                                   "capabilities": {"drop": ["ALL"]}},
                               "resources": {"requests": {"cpu": "10m", "memory": "20Mi"},
                                             "limits": {"memory": "128Mi"}},
                               "volumeMounts": [{"name": "device-plugin",
                                                 "mountPath": "/var/lib/kubelet/device-plugins"},
                                                {"name": "infiniband",
                                                 "mountPath": "/dev/infiniband"}],
                           }],
                           "volumes": [{"name": "device-plugin", "hostPath": {
                               "path": "/var/lib/kubelet/device-plugins"}},
                                       {"name": "infiniband", "hostPath": {
                                           "path": "/dev/infiniband"}}],
                       }}}})
