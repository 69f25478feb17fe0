"""The EFA device plugin DaemonSet: advertises `vpc.amazonaws.com/efa` on EFA node groups (the
nodes of disaggregated prefill/decode, k8s/pd.py), with the privileges the EKS add-on
registry's chart gives the image we pin (eks-charts `aws-efa-k8s-device-plugin` v0.5.30, app
v0.5.20, recorded by real helm in tests/fixtures/efa-device-plugin.json): privileged, as root,
on the host network, with the kubelet's device-plugin directory, /dev/infiniband and
/opt/aws/neuron (since eks-charts #1245 the plugin reads the GPU/Neuron-EFA topology to hand
out the cards next to a pod's accelerators, which needs the host's devices). Rendered here, not
installed by Helm: China reaches no Helm repository; the image is the catalogue's
(`efa-device-plugin`, mirrored in China like every other). Only on EFA nodes."""
from __future__ import annotations

from cdk8s import Chart
from constructs import Construct

from config.contracts import EFA_NODE_LABEL, GPU_TAINT_KEY, SYSTEM_NAMESPACE
from k8s.objects import k8s_object, selector_labels, standard_labels

NAME = "aws-efa-k8s-device-plugin"
# host path -> (volume name, hostPath type), as the chart mounts them
HOST_PATHS = {"/var/lib/kubelet/device-plugins": ("device-plugin", None),
              "/dev/infiniband/": ("infiniband", None),
              "/opt/aws/neuron/": ("neuron-tools", "DirectoryOrCreate")}
# the chart's own securityContext for this release (its values.yaml)
SECURITY = {"privileged": True, "allowPrivilegeEscalation": True, "runAsNonRoot": False,
            "runAsUser": 0}


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
                           "tolerations": [{"key": "CriticalAddonsOnly", "operator": "Exists"},
                                           {"key": GPU_TAINT_KEY, "operator": "Exists",
                                            "effect": "NoSchedule"}],
                           "automountServiceAccountToken": False,
                           "containers": [{
                               "name": NAME, "image": image, "imagePullPolicy": "IfNotPresent",
                               "securityContext": dict(SECURITY),
                               "resources": {"requests": {"cpu": "10m", "memory": "20Mi"},
                                             "limits": {"memory": "128Mi"}},
                               "volumeMounts": [{"name": name, "mountPath": path}
                                                for path, (name, _) in HOST_PATHS.items()],
                           }],
                           "volumes": [{"name": name, "hostPath": {
                               "path": path, **({"type": kind} if kind else {})}}
                                       for path, (name, kind) in HOST_PATHS.items()],
                       }}}})
