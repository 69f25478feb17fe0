"""EKS (aws_eks_v2) with a CPU system node group and tainted GPU node groups.

Managed node groups, not Auto Mode: Auto Mode and node auto-repair are not confirmed in China,
and one code path for both partitions is the point of this product.
"""
from __future__ import annotations

import importlib

from dataclasses import dataclass

from aws_cdk import (
    CfnResource, RemovalPolicy, Stack, aws_ec2 as ec2, aws_eks_v2 as eks,
    aws_iam as iam, aws_kms as kms,
)
import cdk8s
from constructs import Construct

from config import NodeGroupConfig, RegionFacts
from k8s.device_plugin import DevicePluginChart
from k8s.efa_device_plugin import EfaDevicePluginChart
from constructs.naming import logical_id
from constructs.nag import acknowledge, managed_policy, wildcard
from constructs.pod_identity import PodIdentityRole, PodIdentityRoleProps, pod_identity_principal
from config.contracts import (
    EFA_NODE_LABEL, EFA_RESOURCE,
    ACCELERATOR_LABEL, CA_NODE_TEMPLATE_LABEL, CA_NODE_TEMPLATE_RESOURCE, DEVICE_PLUGIN_LABEL,
    GPU_TAINT_KEY,
    GPU_TAINT_VALUE, NODE_GROUP_LABEL, NODE_ROLE_GPU, NODE_ROLE_LABEL, NODE_ROLE_SYSTEM,
)
from config.instances import EFA, accelerator_label

# The VPC CNI's own service account; its AWS permissions come through Pod Identity on it, so the
# node role (reachable by any pod only through IMDS, which hop limit 1 closes) does not hold them.
CNI_SERVICE_ACCOUNT = "aws-node"
CNI_POLICY = "AmazonEKS_CNI_Policy"
# The add-on's network policy agent enforces NetworkPolicy objects (off by default).
VPC_CNI_CONFIGURATION = {"enableNetworkPolicy": "true"}
# Hop limit 1: IMDSv2 answers the node, not a pod behind the container network namespace.
IMDS_HOP_LIMIT = 1

# Bottlerocket mounts its data volume on xvdb; AL2023 has one root volume on xvda.
_DATA_DEVICE = {"BOTTLEROCKET": "/dev/xvdb"}


@dataclass(frozen=True)
class GpuClusterProps:
    vpc: ec2.IVpc
    kubernetes_version: str
    facts: RegionFacts
    public_endpoint_cidrs: tuple[str, ...]   # empty: private endpoint only
    admin_role_names: tuple[str, ...]
    system_nodes: NodeGroupConfig
    gpu_node_groups: tuple[NodeGroupConfig, ...]
    alb_controller_version: str
    alb_chart_repository: str       # CDK's default (eks-charts) or the account's OCI mirror
    device_plugin_image: str
    removal_policy: RemovalPolicy
    ami_release_version: str | None = None   # None: the latest of kubernetes_version
    efa_device_plugin_image: str | None = None   # where a GPU node group has efa: true


@dataclass(frozen=True)
class NodeVersions:
    """What every managed node group runs: the cluster's Kubernetes version and, where the
    environment pins one, the AMI release.

    aws-cdk-lib 2.275's aws_eks_v2 Nodegroup has no `version` prop (managed-nodegroup.ts
    renders ReleaseVersion, never Version), and a group without Version keeps the version it
    was created with when the cluster's changes: only the control plane would move, and EKS
    refuses the next minor while managed nodes lag. With Version on every group a bump of
    kubernetesVersion is an UpdateNodegroupVersion: EKS rolls the nodes (surge, drain honouring
    PodDisruptionBudgets for up to 15 minutes a node, docs/operations.md). Our launch templates
    name no AMI, so Version and ReleaseVersion are allowed (EKS refuses both with a custom
    AMI)."""

    kubernetes: str
    ami_release: str | None = None

    def apply(self, group: eks.Nodegroup) -> None:
        resource = group.node.default_child
        resource.version = self.kubernetes
        resource.release_version = self.ami_release
        # CDK's default, said here because an upgrade depends on it: a node whose pods cannot
        # leave in 15 minutes (a replacement with no GPU to start on) has them deleted rather
        # than failing the update half-way (PodEvictionFailure) into a stack rollback.
        resource.force_update_enabled = True


def kubectl_layer(scope: Construct, version: str) -> Construct:
    """The CDK kubectl layer of the cluster's Kubernetes minor (kubectl's skew policy: one
    minor either way; each accepted version's package is in requirements.txt)."""
    minor = version.split(".")[1]
    module = importlib.import_module(f"aws_cdk.lambda_layer_kubectl_v{minor}")
    return getattr(module, f"KubectlV{minor}Layer")(scope, "KubectlLayer")


class GpuCluster(Construct):
    def __init__(self, scope: Construct, id: str, *, props: GpuClusterProps) -> None:
        super().__init__(scope, id)
        stack = Stack.of(self)
        self.secrets_key = kms.Key(self, "SecretsKey", enable_key_rotation=True,
                                   removal_policy=props.removal_policy,
                                   description="EKS envelope encryption of Kubernetes secrets")
        endpoint = (eks.EndpointAccess.PUBLIC_AND_PRIVATE.only_from(*props.public_endpoint_cidrs)
                    if props.public_endpoint_cidrs else eks.EndpointAccess.PRIVATE)
        private = ec2.SubnetSelection(subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS)
        self.cluster = eks.Cluster(
            self, "Cluster",
            version=eks.KubernetesVersion.of(props.kubernetes_version),
            vpc=props.vpc, vpc_subnets=[private],
            default_capacity_type=eks.DefaultCapacityType.NODEGROUP, default_capacity=0,
            endpoint_access=endpoint,
            secrets_encryption_key=self.secrets_key,
            cluster_logging=[eks.ClusterLoggingTypes.API, eks.ClusterLoggingTypes.AUDIT,
                             eks.ClusterLoggingTypes.AUTHENTICATOR,
                             eks.ClusterLoggingTypes.CONTROLLER_MANAGER,
                             eks.ClusterLoggingTypes.SCHEDULER],
            kubectl_provider_options=eks.KubectlProviderOptions(
                kubectl_layer=kubectl_layer(self, props.kubernetes_version),
            ),
            removal_policy=props.removal_policy,
        )
        for i, name in enumerate(props.admin_role_names):
            self.cluster.grant_access(
                f"Admin{i}",
                stack.format_arn(service="iam", region="", resource="role", resource_name=name),
                [eks.AccessPolicy.from_access_policy_name(
                    "AmazonEKSClusterAdminPolicy",
                    access_scope_type=eks.AccessScopeType.CLUSTER)],
            )

        self.node_role = iam.Role(
            self, "NodeRole", assumed_by=iam.ServicePrincipal("ec2.amazonaws.com"),
            managed_policies=[iam.ManagedPolicy.from_aws_managed_policy_name(n) for n in (
                "AmazonEKSWorkerNodePolicy", "AmazonEC2ContainerRegistryReadOnly",
                "AmazonSSMManagedInstanceCore")],
        )
        # Add-ons before nodes: aws-node must have its Pod Identity before a node joins.
        addons = {name: eks.Addon(
            self, logical_id(name), cluster=self.cluster, addon_name=name,
            preserve_on_delete=False,
            configuration_values=VPC_CNI_CONFIGURATION if name == "vpc-cni" else None)
            for name in ("vpc-cni", "kube-proxy", "coredns", "eks-pod-identity-agent")}
        self.cni_role = iam.Role(self, "VpcCniRole", assumed_by=pod_identity_principal(),
                                 managed_policies=[
                                     iam.ManagedPolicy.from_aws_managed_policy_name(CNI_POLICY)])
        cni = addons["vpc-cni"]
        cni.node.default_child.add_property_override("PodIdentityAssociations", [{
            "ServiceAccount": CNI_SERVICE_ACCOUNT, "RoleArn": self.cni_role.role_arn}])
        cni.node.add_dependency(addons["eks-pod-identity-agent"])
        node_prereqs = (cni, addons["eks-pod-identity-agent"], addons["kube-proxy"])
        self.node_versions = NodeVersions(props.kubernetes_version, props.ami_release_version)
        self.system_nodegroup = node_group(
            self, self.cluster, self.cluster, props.system_nodes, subnets=private,
            node_role=self.node_role, versions=self.node_versions,
            labels={NODE_ROLE_LABEL: NODE_ROLE_SYSTEM})
        self.system_nodegroup.node.add_dependency(*node_prereqs)
        addons["coredns"].node.add_dependency(self.system_nodegroup)  # Deployment: needs nodes
        self.gpu_nodegroups: dict[str, eks.Nodegroup] = {}
        for group in props.gpu_node_groups:
            efa = (EfaPlacement.for_group(self, group, self.cluster, props.vpc,
                                          props.facts.china) if group.efa else None)
            self.gpu_nodegroups[group.name] = node_group(
                self, self.cluster, self.cluster, group,
                subnets=efa.subnets if efa else private,
                node_role=self.node_role, versions=self.node_versions,
                labels={NODE_ROLE_LABEL: NODE_ROLE_GPU}, efa=efa)
            self.gpu_nodegroups[group.name].node.add_dependency(*node_prereqs)
        ebs_identity = PodIdentityRole(self, "EbsCsi", props=PodIdentityRoleProps(
            cluster=self.cluster, namespace="kube-system",
            service_account="ebs-csi-controller-sa"))
        ebs_role = ebs_identity.role
        ebs_role.add_managed_policy(iam.ManagedPolicy.from_aws_managed_policy_name(
            "service-role/AmazonEBSCSIDriverPolicy"))
        ebs = eks.Addon(self, "AwsEbsCsiDriver", cluster=self.cluster,
                        addon_name="aws-ebs-csi-driver", preserve_on_delete=False)
        ebs.node.add_dependency(self.system_nodegroup, ebs_identity)  # credentials first

        # The controller image comes from the region's EKS add-on registry, which China can pull.
        self.alb_controller = eks.AlbController(
            self, "AlbController", cluster=self.cluster,
            # A version CDK knows ships its matching IAM policy.
            version=getattr(eks.AlbControllerVersion,
                            "V" + props.alb_controller_version.lstrip("v").replace(".", "_")),
            repository=f"{props.facts.eks_addon_registry}/amazon/aws-load-balancer-controller",
            additional_helm_chart_values={
                "region": props.facts.region, "vpcId": props.vpc.vpc_id,
                "nodeSelector": {NODE_ROLE_LABEL: NODE_ROLE_SYSTEM},
            },
        )
        self.alb_controller.node.add_dependency(self.system_nodegroup)
        # AlbController takes no chart source; point its Helm release at the mirror (China).
        for child in self.alb_controller.node.find_all():
            if (isinstance(child, CfnResource)
                    and child.cfn_resource_type == "Custom::AWSCDK-EKS-HelmChart"):
                child.add_property_override("Repository", props.alb_chart_repository)
        device_plugin = self.cluster.add_cdk8s_chart("NvidiaDevicePlugin", DevicePluginChart(
            cdk8s.App(), "nvidia-device-plugin", image=props.device_plugin_image))
        device_plugin.node.add_dependency(*self.gpu_nodegroups.values())
        efa_groups = tuple(g.name for g in props.gpu_node_groups if g.efa)
        if efa_groups:
            efa_plugin = self.cluster.add_cdk8s_chart("EfaDevicePlugin", EfaDevicePluginChart(
                cdk8s.App(), "efa-device-plugin", image=props.efa_device_plugin_image))
            efa_plugin.node.add_dependency(*(self.gpu_nodegroups[n] for n in efa_groups))
        _acknowledge_cluster_findings(self)



@dataclass(frozen=True)
class EfaPlacement:
    """What an EFA node group needs beyond its launch template's disk (EC2's EFA guide: "All
    instances that use an EFA must be in the same cluster placement group"; the security group
    "must allow all inbound and outbound traffic to and from the security group itself"): a
    cluster placement group, one subnet (one zone), the cluster's security group (which a
    launch template naming its own interfaces must list itself) and a self-referencing one,
    and an interface per EFA card: `efa` on card 0 (ENA and EFA: the node's IP), `efa-only` on
    the others where the partition has that type (China: `efa` on every card)."""

    placement_group: ec2.CfnPlacementGroup
    security_groups: tuple[str, ...]
    subnets: ec2.SubnetSelection
    interfaces: int
    efa_only: bool

    @staticmethod
    def for_group(scope: Construct, group: NodeGroupConfig, cluster: eks.Cluster,
                  vpc: ec2.IVpc, china: bool) -> "EfaPlacement":
        base = logical_id(group.name)
        placement = ec2.CfnPlacementGroup(scope, f"{base}Placement", strategy="cluster")
        sg = ec2.SecurityGroup(scope, f"{base}Efa", vpc=vpc, allow_all_outbound=False,
                               description=f"EFA of node group {group.name}: all traffic "
                                           "to and from itself")
        sg.add_ingress_rule(sg, ec2.Port.all_traffic(), "EFA: all traffic from itself")
        sg.add_egress_rule(sg, ec2.Port.all_traffic(), "EFA: all traffic to itself")
        # the rest of the node's traffic (the cluster, the internet through NAT) leaves as the
        # cluster security group allows it
        subnet = vpc.select_subnets(subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS).subnets[0]
        return EfaPlacement(placement, (cluster.cluster_security_group_id, sg.security_group_id),
                            ec2.SubnetSelection(subnets=[subnet]),
                            EFA[group.instance_types[0]].interfaces, not china)

    def apply(self, template: ec2.LaunchTemplate) -> None:
        cfn = template.node.default_child
        cfn.add_property_override("LaunchTemplateData.Placement.GroupName",
                                  self.placement_group.ref)
        cfn.add_property_override("LaunchTemplateData.NetworkInterfaces", [
            {"DeviceIndex": 0 if card == 0 else 1, "NetworkCardIndex": card,
             "InterfaceType": "efa" if card == 0 or not self.efa_only else "efa-only",
             "Groups": list(self.security_groups), "DeleteOnTermination": True}
            for card in range(self.interfaces)])


def node_launch_template(scope: Construct, id: str, *, device: str,
                         disk_size_gib: int) -> ec2.LaunchTemplate:
    """Every node's launch template: IMDSv2 at hop limit 1, an encrypted gp3 volume on
    `device` (the root, or Bottlerocket's data volume)."""
    return ec2.LaunchTemplate(
        scope, id, require_imdsv2=True, http_put_response_hop_limit=IMDS_HOP_LIMIT,
        block_devices=[ec2.BlockDevice(device_name=device, volume=ec2.BlockDeviceVolume.ebs(
            disk_size_gib, volume_type=ec2.EbsDeviceVolumeType.GP3, encrypted=True))],
    )


# aws-cdk-lib 2.275's Nodegroup judges instance types by its own tables (aws-eks-v2
# managed-nodegroup.ts getPossibleAmiTypes, private/nodegroup.ts isGpuInstanceType, aws-ec2
# instance-types.ts): its GPU classes stop at p4d/g6e, so a p5, p5e, p5en or gr6 group with an
# NVIDIA AMI type is refused (AmiTypeDoesNotMatchInstanceArchitecture), and its type pattern
# cannot parse p6-b200.48xlarge at all (MalformedInstanceTypeIdentifier), though EKS runs all of
# them on exactly these AMI types. GPU groups therefore give the L2 neither and set both on the
# resource; with a launch template the L2 writes no AMI type of its own (`amiType:
# launchTemplateSpec ? props.amiType : ...`). What CDK's check guarded is held by the config:
# GPU groups take only types of config/instances.py (all x86_64 NVIDIA) and only x86_64 NVIDIA
# AMI types.


def node_group(scope: Construct, owner: Construct, cluster: eks.ICluster,
               group: NodeGroupConfig, *, subnets: ec2.SubnetSelection, node_role: iam.IRole,
               versions: NodeVersions, labels: dict[str, str],
               efa: EfaPlacement | None = None) -> eks.Nodegroup:
    """A managed node group under `owner` (the cluster, where add_nodegroup_capacity puts it)
    with its launch template under `scope` (IMDSv2 at hop limit 1, an encrypted gp3
    root or data volume), at the cluster's version (`versions`). GPU groups are tainted and
    labelled for the device plugin and for Cluster Autoscaler (ACCELERATOR_LABEL, also as the
    node-template tag CA documents; EKS keeps node group tags off the Auto Scaling group, so
    CA 1.35 takes the label from eks:DescribeNodegroup, which constructs/cluster_scaling.py
    grants it). An EFA group's tags also say how many `vpc.amazonaws.com/efa` a node offers
    (CA 1.35 aws_manager.go reads node-template/resources/ from the node group's tags too):
    without it CA never scales a group at zero nodes up for a pod that asks for EFA."""
    template = node_launch_template(
        scope, f"{logical_id(group.name)}Template",
        device=_DATA_DEVICE.get(group.ami_type.split("_")[0], "/dev/xvda"),
        disk_size_gib=group.disk_size_gib)
    if efa is not None:
        efa.apply(template)
    labels = {**labels, NODE_GROUP_LABEL: group.name,
              **({EFA_NODE_LABEL: "true"} if group.efa else {})}
    taints, tags = [], None
    if group.gpu:
        accelerator = accelerator_label(group.instance_types[0])
        labels[ACCELERATOR_LABEL] = accelerator
        tags = {CA_NODE_TEMPLATE_LABEL + ACCELERATOR_LABEL: accelerator}
        if not group.ami_type.startswith("BOTTLEROCKET"):
            labels[DEVICE_PLUGIN_LABEL] = "daemonset"
        taints = [eks.TaintSpec(effect=eks.TaintEffect.NO_SCHEDULE, key=GPU_TAINT_KEY,
                                value=GPU_TAINT_VALUE)]
    if efa is not None:   # a group at zero nodes offers the EFA its pods ask for
        tags = {**(tags or {}), CA_NODE_TEMPLATE_RESOURCE + EFA_RESOURCE: str(efa.interfaces)}
    ng = eks.Nodegroup(   # the id add_nodegroup_capacity gives: logical IDs stay as they were
        owner, f"Nodegroup{logical_id(group.name)}", cluster=cluster,
        instance_types=None if group.gpu else [ec2.InstanceType(t)
                                               for t in group.instance_types],
        ami_type=None if group.gpu else getattr(eks.NodegroupAmiType, group.ami_type),
        capacity_type=getattr(eks.CapacityType, group.capacity_type),
        min_size=group.min_size, max_size=group.max_size, desired_size=group.desired_size,
        labels=labels, taints=taints, tags=tags, subnets=subnets, node_role=node_role,
        launch_template_spec=eks.LaunchTemplateSpec(
            id=template.launch_template_id, version=template.latest_version_number),
    )
    if group.gpu:
        # jsii's Python enum carries the member name; CloudFormation spells the value in
        # lowercase x86_64 (AL2023_x86_64_NVIDIA, BOTTLEROCKET_x86_64_NVIDIA)
        ng.node.default_child.add_property_override(
            "AmiType", group.ami_type.replace("X86_64", "x86_64"))
        ng.node.default_child.add_property_override("InstanceTypes", list(group.instance_types))
    versions.apply(ng)
    return ng


_NODE_POLICIES = ("AmazonEKSWorkerNodePolicy", "AmazonEC2ContainerRegistryReadOnly",
                  "AmazonSSMManagedInstanceCore")
_ALB_RESOURCES = (
    "*", "arn:<AWS::Partition>:ec2:*:*:security-group/*",
    "arn:<AWS::Partition>:elasticloadbalancing:*:*:targetgroup/*/*",
    "arn:<AWS::Partition>:elasticloadbalancing:*:*:loadbalancer/net/*/*",
    "arn:<AWS::Partition>:elasticloadbalancing:*:*:loadbalancer/app/*/*",
    "arn:<AWS::Partition>:elasticloadbalancing:*:*:listener/net/*/*/*",
    "arn:<AWS::Partition>:elasticloadbalancing:*:*:listener/app/*/*/*",
    "arn:<AWS::Partition>:elasticloadbalancing:*:*:listener-rule/net/*/*/*",
    "arn:<AWS::Partition>:elasticloadbalancing:*:*:listener-rule/app/*/*/*",
)


def _acknowledge_cluster_findings(c: GpuCluster) -> None:
    acknowledge(c.node_role, {managed_policy(p): (
        "The AWS-managed node policies are what EKS documents for managed node groups and "
        "track new API needs; workloads get their own Pod Identity roles instead.")
        for p in _NODE_POLICIES})
    acknowledge(c.cluster, {
        managed_policy("AmazonEKSClusterPolicy"): "The EKS service role policy AWS requires.",
        managed_policy("service-role/AWSLambdaBasicExecutionRole"):
            "CDK's kubectl provider Lambda: logs only.",
        managed_policy("service-role/AWSLambdaVPCAccessExecutionRole"):
            "CDK's kubectl provider Lambda runs in the VPC to reach the private endpoint.",
        managed_policy("AmazonEC2ContainerRegistryReadOnly"):
            "CDK's kubectl provider pulls its layer images read-only.",
        'AwsSolutions::AwsSolutions-IAM4[Policy::{"Fn::If":["GpuClusterKubectlProviderHandler'
        'HasEcrPublicA05F4FCD",{"Fn::Join":["",["arn:",{"Ref":"AWS::Partition"},":iam::aws:'
        'policy/AmazonElasticContainerRegistryPublicReadOnly"]]},{"Ref":"AWS::NoValue"}]}]':
            "CDK adds ECR Public read only in partitions that have ECR Public (not China).",
        "AwsSolutions::AwsSolutions-L1": "CDK pins the kubectl provider's runtime to the one "
            "its kubectl layer is built for.",
        wildcard("<GpuClusterKubectlProviderHandlerCAE0D238.Arn>:*"):
            "The provider framework invokes its own handler's versions.",
    })
    acknowledge(c.alb_controller, {wildcard(r): (
        "The AWS Load Balancer Controller policy CDK ships for this version: it manages load "
        "balancers it creates, named at run time; tag conditions scope the writes.")
        for r in _ALB_RESOURCES})
    acknowledge(c.cni_role, {managed_policy(CNI_POLICY): (
        "The VPC CNI policy AWS maintains (ENI and IP management), bound to aws-node only by "
        "Pod Identity instead of the node role.")})
    acknowledge(c, {managed_policy("service-role/AmazonEBSCSIDriverPolicy"): (
        "The EBS CSI driver policy AWS maintains, bound to its one service account by Pod "
        "Identity.")})
