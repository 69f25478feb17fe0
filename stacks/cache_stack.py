from __future__ import annotations

from aws_cdk import CfnOutput, Stack, aws_ec2 as ec2
from constructs import Construct

from config import EnvironmentConfig
from constructs.kv_cache import KvCache, KvCacheProps


class CacheStack(Stack):
    """Only for `cache.kind: elasticache`; self-hosted caches are a chart, `none` is nothing."""

    def __init__(self, scope: Construct, id: str, *, cfg: EnvironmentConfig, vpc: ec2.IVpc,
                 client_security_group: ec2.ISecurityGroup, **kwargs) -> None:
        super().__init__(scope, id, **kwargs)
        c = cfg.cache
        self.cache = KvCache(self, "L2", props=KvCacheProps(
            vpc=vpc, client_security_group=client_security_group, engine=c.engine,
            engine_version=c.engine_version,
            parameter_group_family=c.parameter_group_family, node_type=c.node_type, replicas=c.replicas,
            multi_az=c.multi_az, snapshot_retention_days=c.snapshot_retention_days,
            retain=cfg.retain_data))
        # ${L2_ENDPOINT} and ${L2_SECRET_ARN} in the GitOps manifests (dist/<env>/)
        CfnOutput(self, "L2Endpoint", value=self.cache.endpoint_address)
        CfnOutput(self, "L2SecretArn", value=self.cache.auth_secret.secret_arn)
