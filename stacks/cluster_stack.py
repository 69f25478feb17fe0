from __future__ import annotations

from aws_cdk import Annotations, CfnOutput, Stack, aws_ec2 as ec2
from constructs import Construct

from config import EnvironmentConfig
from config.images import ALB_CONTROLLER_VERSION
from constructs.cluster_scaling import ClusterScaling, ClusterScalingProps
from constructs.gpu_cluster import GpuCluster, GpuClusterProps
from constructs.network import existing_vpc
from stacks.common import removal_policy

SUBNET_TAG_WARNING = "@aws-cdk/aws-eks:clusterMustManuallyTagSubnet"


class ClusterStack(Stack):
    def __init__(self, scope: Construct, id: str, *, cfg: EnvironmentConfig,
                 vpc: ec2.IVpc | None, amp_workspace_arn: str | None = None, **kwargs) -> None:
        """`vpc`: the Network stack's, or None for the environment's existing VPC."""
        super().__init__(scope, id, **kwargs)
        if vpc is None:
            vpc = existing_vpc(self, "ExistingVpc", network=cfg.network)
        self.vpc = vpc
        built = GpuCluster(self, "Gpu", props=GpuClusterProps(
            vpc=vpc, kubernetes_version=cfg.kubernetes_version, facts=cfg.facts,
            public_endpoint_cidrs=(cfg.cluster_endpoint.public_cidrs
                                   if cfg.cluster_endpoint.public else ()),
            admin_role_names=cfg.admin_role_names, system_nodes=cfg.system_nodes,
            gpu_node_groups=cfg.gpu_node_groups, alb_controller_version=ALB_CONTROLLER_VERSION,
            alb_chart_repository=cfg.images.chart_source("aws-load-balancer-controller")[0],
            device_plugin_image=cfg.images.uri("nvidia-device-plugin"),
            efa_device_plugin_image=(cfg.images.uri("efa-device-plugin")
                                     if any(g.efa for g in cfg.gpu_node_groups) else None),
            removal_policy=removal_policy(cfg), ami_release_version=cfg.ami_release_version,
        ))
        self.gpu_cluster = built
        self.cluster = built.cluster
        if cfg.network.existing:
            # aws_eks_v2.Cluster tags every subnet of the VPC kubernetes.io/role/(internal-)elb
            # for the load balancer controller's discovery, and cannot tag imported ones. It
            # needs no tag here: the router's Service names its subnets (the annotation
            # aws-load-balancer-subnets, cfg.network.load_balancer_subnets), and no other load
            # balancer is made. Said in README.md (existingVpc).
            Annotations.of(self.cluster).acknowledge_warning(
                SUBNET_TAG_WARNING, "the router's Service names its load balancer subnets")
        self.scaling = ClusterScaling(self, "Scaling", props=ClusterScalingProps(
            cluster=self.cluster, system_nodes=built.system_nodegroup, images=cfg.images,
            kubernetes_version=cfg.kubernetes_version, region=cfg.region,
            amp_workspace_arn=amp_workspace_arn,
            deregister_s=cfg.listener.deregistration_wait_s))
        CfnOutput(self, "ClusterName", value=self.cluster.cluster_name)
