"""Scaling add-ons: KEDA (workers follow queue metrics) and Cluster Autoscaler (GPU nodes follow
pending pods, from zero). Pinned charts, images the region can pull, Pod Identity for both.

Cluster Autoscaler, not Karpenter: managed node groups are the one compute model that works the
same in both partitions, and CA reads their labels and taints through `eks:DescribeNodegroup`,
which is what scale-from-zero needs.
"""
from __future__ import annotations

from dataclasses import dataclass

from aws_cdk import CfnJson, Duration, Stack, aws_eks_v2 as eks, aws_iam as iam
from constructs import Construct

from config.contracts import (
    DEREGISTER_S_DEFAULT, HELM_TIMEOUT_MINUTES, KEDA_NAMESPACE, NODE_ROLE_LABEL, NODE_ROLE_SYSTEM,
)
from config.images import CHARTS, IMAGES, ImageResolver, autoscaler_key
from constructs.nag import acknowledge, wildcard
from constructs.pod_identity import PodIdentityRole, PodIdentityRoleProps
from k8s.router_front import termination_grace_s
from k8s.workers import WORKER_DRAIN_S, WORKER_EXIT_S, WORKER_PRE_STOP_S


def max_graceful_termination_s(deregister_s: int = DEREGISTER_S_DEFAULT) -> int:
    """A scale-down evicts pods with their own grace period capped at
    --max-graceful-termination-sec (default 600 s): below the router pod's drain (which grows
    with the environment's deregistration wait) and a worker's (k8s/router_front.py,
    k8s/workers.py), which would be cut short. Raised to the longest we render."""
    return max(termination_grace_s(deregister_s),
               WORKER_PRE_STOP_S + WORKER_DRAIN_S + WORKER_EXIT_S)


MAX_GRACEFUL_TERMINATION_S = max_graceful_termination_s()   # at the default wait
KEDA_OPERATOR_SA = "keda-operator"
AUTOSCALER_SA = "cluster-autoscaler"


@dataclass(frozen=True)
class ClusterScalingProps:
    cluster: eks.Cluster
    system_nodes: eks.Nodegroup       # where both run: their releases wait for its nodes
    images: ImageResolver
    kubernetes_version: str           # Cluster Autoscaler runs the same minor
    region: str
    amp_workspace_arn: str | None     # KEDA queries AMP with SigV4 where there is one
    deregister_s: int = DEREGISTER_S_DEFAULT   # listener.deregistrationWaitSeconds


class ClusterScaling(Construct):
    def __init__(self, scope: Construct, id: str, *, props: ClusterScalingProps) -> None:
        super().__init__(scope, id)
        p = props
        system = {NODE_ROLE_LABEL: NODE_ROLE_SYSTEM}

        keda_identity = PodIdentityRole(self, "KedaIdentity", props=PodIdentityRoleProps(
            cluster=p.cluster, namespace=KEDA_NAMESPACE, service_account=KEDA_OPERATOR_SA))
        keda_role = keda_identity.role
        self.keda_role = keda_role   # the serving stack grants CloudWatch reads where a file asks
        if p.amp_workspace_arn:
            keda_role.add_to_policy(iam.PolicyStatement(
                actions=["aps:QueryMetrics", "aps:GetSeries", "aps:GetLabels",
                         "aps:GetMetricMetadata"], resources=[p.amp_workspace_arn]))
        keda_chart = CHARTS["keda"]
        repo, name = p.images.chart_source("keda")

        def keda_image(key: str) -> dict:
            registry, _, repository = p.images.repository_of(key).partition("/")
            return {"registry": registry, "repository": repository, "tag": IMAGES[key].pin}

        self.keda = eks.HelmChart(
            self, "Keda", cluster=p.cluster, chart=name, repository=repo,
            version=keda_chart.version, namespace=KEDA_NAMESPACE, create_namespace=True,
            release="keda", wait=True, atomic=True, timeout=Duration.minutes(HELM_TIMEOUT_MINUTES),
            values={
                "image": {"keda": keda_image("keda"),
                          "metricsApiServer": keda_image("keda-metrics-apiserver"),
                          "webhooks": keda_image("keda-admission-webhooks"),
                          "pullPolicy": "IfNotPresent"},
                "serviceAccount": {"operator": {"create": True, "name": KEDA_OPERATOR_SA}},
                "nodeSelector": system,
            })

        ca_identity = PodIdentityRole(self, "AutoscalerIdentity", props=PodIdentityRoleProps(
            cluster=p.cluster, namespace="kube-system", service_account=AUTOSCALER_SA))
        ca_role = ca_identity.role
        ca_role.add_to_policy(iam.PolicyStatement(
            actions=["autoscaling:DescribeAutoScalingGroups",
                     "autoscaling:DescribeAutoScalingInstances",
                     "autoscaling:DescribeLaunchConfigurations",
                     "autoscaling:DescribeScalingActivities", "autoscaling:DescribeTags",
                     "ec2:DescribeImages", "ec2:DescribeInstanceTypes",
                     "ec2:DescribeLaunchTemplateVersions", "ec2:GetInstanceTypesFromInstanceRequirements"],
            resources=["*"]))
        # Writes only to this cluster's node groups' ASGs (EKS tags them `owned`).
        ca_role.add_to_policy(iam.PolicyStatement(
            actions=["autoscaling:SetDesiredCapacity",
                     "autoscaling:TerminateInstanceInAutoScalingGroup"],
            resources=["*"], conditions={"StringEquals": CfnJson(self, "OwnedByCluster", value={
                f"aws:ResourceTag/k8s.io/cluster-autoscaler/{p.cluster.cluster_name}": "owned"})}))
        ca_role.add_to_policy(iam.PolicyStatement(
            actions=["eks:DescribeNodegroup"],
            resources=[Stack.of(self).format_arn(
                service="eks", resource="nodegroup",
                resource_name=f"{p.cluster.cluster_name}/*")]))
        stack = Stack.of(self)
        cluster_id = stack.get_logical_id(p.cluster.node.default_child)
        acknowledge(ca_role, {
            wildcard("*"): "Describe* calls support no resource scoping; the two writes are "
                           "conditioned on the cluster's ownership tag.",
            wildcard(f"arn:<AWS::Partition>:eks:{p.region}:{stack.account}:nodegroup/"
                     f"<{cluster_id}>/*"): "Only this cluster's node groups.",
        })
        ca_chart = CHARTS["cluster-autoscaler"]
        autoscaler = autoscaler_key(p.kubernetes_version)
        repo, name = p.images.chart_source("cluster-autoscaler")
        self.autoscaler = eks.HelmChart(
            self, "ClusterAutoscaler", cluster=p.cluster, chart=name, repository=repo,
            version=ca_chart.version, namespace="kube-system", release="cluster-autoscaler",
            wait=True, atomic=True, timeout=Duration.minutes(HELM_TIMEOUT_MINUTES),
            values={
                "image": {"repository": p.images.repository_of(autoscaler),
                          "tag": IMAGES[autoscaler].pin,
                          "pullPolicy": "IfNotPresent"},
                "autoDiscovery": {"clusterName": p.cluster.cluster_name},
                "awsRegion": p.region, "cloudProvider": "aws",
                "rbac": {"serviceAccount": {"create": True, "name": AUTOSCALER_SA}},
                "nodeSelector": system,
                "extraArgs": {"balance-similar-node-groups": True,
                              "skip-nodes-with-local-storage": False,
                              "expander": "least-waste",
                              "scale-down-unneeded-time": "10m",
                              "max-graceful-termination-sec": max_graceful_termination_s(
                                  p.deregister_s)},
            })
        # The kubectl barrier does not wait for nodes: without these the releases' pods stay
        # Pending, Helm's wait runs out and the stack rolls back; and a pod started before its
        # Pod Identity association exists never gets credentials.
        self.keda.node.add_dependency(p.system_nodes, keda_identity)
        self.autoscaler.node.add_dependency(p.system_nodes, ca_identity)
