"""The managed L2 KV cache: an ElastiCache (Valkey or Redis OSS) replication group.

TLS in transit, an AUTH token that lives only in Secrets Manager (the template carries a
dynamic reference, never the value), reachable only from the nodes, snapshot on delete.
Cluster mode with the shards the L2 verdict needs where LMCache reaches it by `valkey://`
(GLIDE's cluster client); one shard, cluster mode off, where it has only `rediss://` (a
plain Redis client, which a cluster's MOVED replies would break): k8s/l2.py.
"""
from __future__ import annotations

from dataclasses import dataclass

from aws_cdk import (
    RemovalPolicy, aws_ec2 as ec2, aws_elasticache as elasticache, aws_kms as kms,
    aws_secretsmanager as sm,
)
from constructs import Construct

from config.contracts import CACHE_PORT
from constructs.nag import acknowledge


@dataclass(frozen=True)
class KvCacheProps:
    vpc: ec2.IVpc
    client_security_group: ec2.ISecurityGroup
    engine: str
    engine_version: str
    parameter_group_family: str   # e.g. valkey8, redis6.x (config.environment)
    node_type: str
    replicas: int
    multi_az: bool
    snapshot_retention_days: int
    retain: bool
    shards: int = 1
    cluster_mode: bool = False


class KvCache(Construct):
    def __init__(self, scope: Construct, id: str, *, props: KvCacheProps) -> None:
        super().__init__(scope, id)
        removal = RemovalPolicy.RETAIN if props.retain else RemovalPolicy.DESTROY
        self.key = kms.Key(self, "Key", enable_key_rotation=True, removal_policy=removal,
                           description="L2 KV cache encryption at rest and of its AUTH secret")
        # ElastiCache AUTH tokens allow printable ASCII except @ " / and spaces.
        self.auth_secret = sm.Secret(
            self, "AuthToken", encryption_key=self.key,
            description="AUTH token of the L2 KV cache",
            generate_secret_string=sm.SecretStringGenerator(
                password_length=64, exclude_punctuation=True),
            removal_policy=removal,
        )
        self.security_group = ec2.SecurityGroup(
            self, "SecurityGroup", vpc=props.vpc, allow_all_outbound=False,
            description="L2 KV cache - only the cluster nodes and pods may connect")
        self.security_group.add_ingress_rule(
            props.client_security_group, ec2.Port.tcp(CACHE_PORT), "LMCache workers")
        subnets = elasticache.CfnSubnetGroup(
            self, "Subnets", description="L2 KV cache private subnets",
            subnet_ids=props.vpc.select_subnets(
                subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS).subnet_ids)
        # The default group's maxmemory-policy is volatile-lru, which evicts only keys with a
        # TTL; LMCache sets none, so a full cache would refuse every write. Evict any key, LRU.
        parameters = elasticache.CfnParameterGroup(
            self, "Parameters", cache_parameter_group_family=props.parameter_group_family,
            description="LMCache L2: evict any key, least recently used first",
            properties={"maxmemory-policy": "allkeys-lru",
                        **({"cluster-enabled": "yes"} if props.cluster_mode else {})})
        shape = (dict(cluster_mode="enabled", num_node_groups=props.shards,
                      replicas_per_node_group=props.replicas) if props.cluster_mode else
                 dict(num_cache_clusters=1 + props.replicas))
        self.cluster_mode = props.cluster_mode
        self.replication_group = elasticache.CfnReplicationGroup(
            self, "ReplicationGroup",
            replication_group_description="LMCache L2 KV cache shared by workers",
            engine=props.engine, engine_version=props.engine_version,
            cache_parameter_group_name=parameters.ref,
            cache_node_type=props.node_type, **shape,
            automatic_failover_enabled=props.multi_az, multi_az_enabled=props.multi_az,
            cache_subnet_group_name=subnets.ref,
            security_group_ids=[self.security_group.security_group_id],
            port=CACHE_PORT,
            transit_encryption_enabled=True, transit_encryption_mode="required",
            at_rest_encryption_enabled=True, kms_key_id=self.key.key_id,
            auth_token=self.auth_secret.secret_value.unsafe_unwrap(),
            snapshot_retention_limit=props.snapshot_retention_days,
            auto_minor_version_upgrade=True,
        )
        acknowledge(self.auth_secret, {
            "AwsSolutions::AwsSolutions-SMG4": "An ElastiCache AUTH token rotates through "
            "ModifyReplicationGroup (ROTATE then SET), which Secrets Manager rotation cannot "
            "drive alone; rotation is a documented runbook step.",
        })
        # A final snapshot on delete keeps the warm cache unless the environment says destroy.
        self.replication_group.apply_removal_policy(
            RemovalPolicy.SNAPSHOT if props.retain else RemovalPolicy.DESTROY)

    @property
    def endpoint_address(self) -> str:
        """The configuration endpoint in cluster mode (GLIDE discovers the shards from it),
        else the primary's."""
        if self.cluster_mode:
            return self.replication_group.attr_configuration_end_point_address
        return self.replication_group.attr_primary_end_point_address

    @property
    def url_without_credentials(self) -> str:
        """What LMCache gets, with the password added at pod start from Secrets Manager."""
        return f"rediss://{self.endpoint_address}:{CACHE_PORT}"
