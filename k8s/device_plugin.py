"""NVIDIA device plugin DaemonSet: advertises `nvidia.com/gpu` on AL2023 NVIDIA nodes.

Rendered here rather than from NVIDIA's Helm repository, which China cannot reach; the image
comes from the catalogue like every other.
"""
from __future__ import annotations

from cdk8s import Chart
from constructs import Construct

from config.contracts import DEVICE_PLUGIN_LABEL, GPU_TAINT_KEY, SYSTEM_NAMESPACE
from k8s.objects import k8s_object, selector_labels, standard_labels


class DevicePluginChart(Chart):
    def __init__(self, scope: Construct, id: str, *, image: str) -> None:
        super().__init__(scope, id, namespace=SYSTEM_NAMESPACE)
        sel = selector_labels("nvidia-device-plugin", "cluster")
        labels = standard_labels("nvidia-device-plugin", "cluster")
        k8s_object(self, "DaemonSet", api_version="apps/v1", kind="DaemonSet",
                   name="nvidia-device-plugin", namespace=SYSTEM_NAMESPACE, labels=labels,
                   body={"spec": {
                       "selector": {"matchLabels": sel},
                       "updateStrategy": {"type": "RollingUpdate"},
                       "template": {"metadata": {"labels": labels}, "spec": {
                           "priorityClassName": "system-node-critical",
                           "nodeSelector": {DEVICE_PLUGIN_LABEL: "daemonset"},
                           "tolerations": [{"key": GPU_TAINT_KEY, "operator": "Exists",
                                            "effect": "NoSchedule"}],
                           "automountServiceAccountToken": False,
                           "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
                           "containers": [{
                               "name": "nvidia-device-plugin", "image": image,
                               "imagePullPolicy": "IfNotPresent",
                               "env": [{"name": "FAIL_ON_INIT_ERROR", "value": "false"}],
                               "securityContext": {"allowPrivilegeEscalation": False,
                                                   "capabilities": {"drop": ["ALL"]}},
                               "resources": {"requests": {"cpu": "50m", "memory": "64Mi"},
                                             "limits": {"memory": "256Mi"}},
                               "volumeMounts": [{"name": "device-plugin",
                                                 "mountPath": "/var/lib/kubelet/device-plugins"}],
                           }],
                           "volumes": [{"name": "device-plugin", "hostPath": {
                               "path": "/var/lib/kubelet/device-plugins"}}],
                       }}}})
