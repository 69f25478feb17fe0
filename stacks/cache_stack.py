from __future__ import annotations

from dataclasses import dataclass

from aws_cdk import CfnOutput, Stack, aws_ec2 as ec2, aws_eks_v2 as eks, aws_iam as iam
from constructs import Construct

from config import EnvironmentConfig
from config.contracts import (
    CACHE_NODE_GROUP, CACHE_TAINT_KEY, NODE_GROUP_LABEL, NODE_ROLE_CACHE, NODE_ROLE_LABEL,
)
from constructs.gpu_cluster import NodeVersions, node_launch_template
from constructs.kv_cache import KvCache, KvCacheProps

CACHE_NODE_DISK_GIB = 50   # the node's root volume: Valkey keeps nothing on disk


@dataclass(frozen=True)
class L2Needs:
    """What the endpoints' L2 verdicts (k8s/l2.py) ask to be provisioned: ElastiCache's shards
    (cluster mode where every endpoint on it reaches it by valkey://), the in-cluster Valkey's
    node type; None where nothing is."""

    elasticache_shards: int | None = None
    elasticache_cluster_mode: bool = False
    in_cluster_node_type: str | None = None

    @property
    def any(self) -> bool:
        return self.elasticache_shards is not None or self.in_cluster_node_type is not None


class CacheStack(Stack):
    """The L2's infrastructure, only where an endpoint's L2 verdict deploys one: the managed
    ElastiCache (sized by the verdicts), and the in-cluster Valkey's own node."""

    def __init__(self, scope: Construct, id: str, *, cfg: EnvironmentConfig, vpc: ec2.IVpc,
                 client_security_group: ec2.ISecurityGroup, needs: L2Needs,
                 cluster: eks.ICluster | None = None, node_role: iam.IRole | None = None,
                 **kwargs) -> None:
        super().__init__(scope, id, **kwargs)
        c = cfg.cache
        self.cache: KvCache | None = None
        self.l2_nodes: eks.Nodegroup | None = None   # the in-cluster Valkey's own node
        if needs.elasticache_shards is not None:
            self.cache = KvCache(self, "L2", props=KvCacheProps(
                vpc=vpc, client_security_group=client_security_group, engine=c.engine,
                engine_version=c.engine_version,
                parameter_group_family=c.parameter_group_family, node_type=c.node_type,
                replicas=c.replicas, multi_az=c.multi_az,
                snapshot_retention_days=c.snapshot_retention_days, retain=cfg.retain_data,
                shards=needs.elasticache_shards, cluster_mode=needs.elasticache_cluster_mode))
            # ${L2_ENDPOINT} and ${L2_SECRET_ARN} in the GitOps manifests (dist/<env>/)
            CfnOutput(self, "L2Endpoint", value=self.cache.endpoint_address)
            CfnOutput(self, "L2SecretArn", value=self.cache.auth_secret.secret_arn)
        if needs.in_cluster_node_type is not None:
            assert cluster is not None and node_role is not None
            template = node_launch_template(self, "L2NodeTemplate", device="/dev/xvda",
                                            disk_size_gib=CACHE_NODE_DISK_GIB)
            # One node: resp:// reaches one Valkey (no cluster), which has the node to itself.
            nodes = eks.Nodegroup(
                self, "L2Nodes", cluster=cluster, node_role=node_role,
                instance_types=[ec2.InstanceType(needs.in_cluster_node_type)],
                ami_type=eks.NodegroupAmiType.AL2023_X86_64_STANDARD,
                min_size=1, max_size=1, desired_size=1,
                labels={NODE_ROLE_LABEL: NODE_ROLE_CACHE, NODE_GROUP_LABEL: CACHE_NODE_GROUP},
                taints=[eks.TaintSpec(effect=eks.TaintEffect.NO_SCHEDULE, key=CACHE_TAINT_KEY,
                                      value="present")],
                subnets=ec2.SubnetSelection(subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS),
                launch_template_spec=eks.LaunchTemplateSpec(
                    id=template.launch_template_id, version=template.latest_version_number))
            # at the cluster's version, like the Cluster stack's groups (it rolls when the
            # Cache stack deploys after the Cluster stack's upgrade)
            NodeVersions(cfg.kubernetes_version, cfg.ami_release_version).apply(nodes)
            self.l2_nodes = nodes
