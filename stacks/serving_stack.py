from __future__ import annotations

import cdk8s
from aws_cdk import Aws, CfnOutput, Fn, Stack, aws_eks_v2 as eks, aws_iam as iam
from aws_cdk import aws_kms as kms, aws_s3 as s3, aws_secretsmanager as sm
from constructs import Construct

from config import EnvironmentConfig
from config.contracts import SERVING_NAMESPACE
from constructs.naming import logical_id
from constructs.nag import acknowledge, wildcard
from constructs.pod_identity import PodIdentityRole, PodIdentityRoleProps
from config.endpoint_spec import EndpointSpec
from k8s.router import router_name
from k8s.certificate import cert_service_account, s3_object
from k8s.serving import (
    ServingFacts, build_charts, generated_tls, reads_managed_l2, worker_service_account,
)
from stacks.common import removal_policy
from k8s.workers import L2Connection, MetricsSource



class ServingStack(Stack):
    """Workloads, in their own stack: a model change never touches the cluster stack."""

    def __init__(self, scope: Construct, id: str, *, cfg: EnvironmentConfig,
                 endpoints: tuple[EndpointSpec, ...], cluster: eks.ICluster,
                 model_bucket: s3.IBucket, model_key: kms.IKey | None,
                 l2_url: str | None, l2_secret_arn: str | None, l2_key: kms.IKey | None,
                 metrics: MetricsSource, **kwargs) -> None:
        super().__init__(scope, id, **kwargs)
        # Built and pushed to the account's ECR by `python -m tools mirror` (images/router/
        # lock.json), before this stack deploys: nothing is built or fetched at deploy time.
        router_image = cfg.images.uri("router")
        CfnOutput(self, "RouterImageUri", value=router_image)
        # The endpoints' API key: clients send it as a Bearer token, vLLM checks it.
        api_key = sm.Secret(self, "ApiKey", description="API key of the kvcache endpoints",
                            generate_secret_string=sm.SecretStringGenerator(
                                password_length=48, exclude_punctuation=True),
                            removal_policy=removal_policy(cfg))
        acknowledge(api_key, {"AwsSolutions::AwsSolutions-SMG4": (
            "A bearer key shared with clients: rotate by putting a new value and restarting "
            "the router and worker pods (they read it at start).")})
        CfnOutput(self, "ApiKeySecretArn", value=api_key.secret_arn)  # ${API_KEY_SECRET_ARN}
        # The router NLBs' subnets, where no pod has an address: the created VPC's public
        # ones, or those the existing VPC's environment names.
        lb_subnets = (",".join(s.subnet_id for s in cfg.network.load_balancer_subnets)
                      if cfg.network.existing
                      else Fn.join(",", [s.subnet_id for s in cluster.vpc.public_subnets]))
        accounts = {}
        identities: dict[str, PodIdentityRole] = {}   # service account -> its Pod Identity
        for spec in endpoints:
            sa = worker_service_account(spec.name)
            accounts[spec.name] = sa
            identities[sa] = PodIdentityRole(
                self, f"{logical_id(spec.name)}Worker", props=PodIdentityRoleProps(
                    cluster=cluster, namespace=SERVING_NAMESPACE, service_account=sa))
            role = identities[sa].role
            # `aws s3 sync` of the endpoint's own prefix: GetObject under it, and ListBucket
            # only for keys under it (CDK's grant_read would add s3:List* on the whole bucket).
            prefix = f"{spec.model_location}/*"
            role.add_to_policy(iam.PolicyStatement(
                actions=["s3:GetObject"], resources=[model_bucket.arn_for_objects(prefix)]))
            role.add_to_policy(iam.PolicyStatement(
                actions=["s3:ListBucket"], resources=[model_bucket.bucket_arn],
                conditions={"StringLike": {"s3:prefix": [prefix]}}))
            if model_key:
                model_key.grant_decrypt(role)
            api_key.grant_read(role)
            identities[router_name(spec.name)] = PodIdentityRole(
                self, f"{logical_id(spec.name)}RouterIdentity", props=PodIdentityRoleProps(
                    cluster=cluster, namespace=SERVING_NAMESPACE,
                    service_account=router_name(spec.name)))
            router_role = identities[router_name(spec.name)].role
            api_key.grant_read(router_role)
            uri = generated_tls(cfg, spec).get("certificate_s3_uri")
            if uri:   # the front's certificate (public part) to tlsCertificateOutputS3Uri
                cert_sa = cert_service_account(router_name(spec.name))
                identities[cert_sa] = PodIdentityRole(
                    self, f"{logical_id(spec.name)}CertIdentity", props=PodIdentityRoleProps(
                        cluster=cluster, namespace=SERVING_NAMESPACE, service_account=cert_sa))
                bucket_key = s3_object(uri, spec.name).removeprefix("s3://")
                identities[cert_sa].role.add_to_policy(iam.PolicyStatement(
                    actions=["s3:PutObject"], resources=[f"arn:{Aws.PARTITION}:s3:::{bucket_key}"]))
            if l2_secret_arn and reads_managed_l2(cfg, spec):
                role.add_to_policy(iam.PolicyStatement(
                    actions=["secretsmanager:GetSecretValue"], resources=[l2_secret_arn]))
                if l2_key:
                    l2_key.grant_decrypt(role)
            bucket_arn = (f"{Stack.of(model_bucket).stack_name}:ExportsOutputFnGetAtt"
                          "ModelsBucket970C6ADAArnC12F88E2")
            acknowledge(role, {wildcard(f"{bucket_arn}/{prefix}"):
                              "Objects under the endpoint's own model prefix only."})
        managed_l2 = (L2Connection(url=l2_url, secret_arn=l2_secret_arn) if l2_url else None)
        self.facts = ServingFacts(router_image=router_image,
                                  model_bucket=model_bucket.bucket_name,
                                  managed_l2=managed_l2, service_account=accounts,
                                  metrics=metrics, api_key_secret_arn=api_key.secret_arn,
                                  load_balancer_subnets=lb_subnets)
        self.charts_app = cdk8s.App()
        self.charts = build_charts(self.charts_app, cfg, endpoints, self.facts)
        previous = None
        for chart in self.charts:
            manifest = eks.KubernetesManifest(self, logical_id(chart.node.id), cluster=cluster,
                                              manifest=chart.to_json(), overwrite=True)
            if previous is not None:
                manifest.node.add_dependency(previous)
            # The Pod Identity webhook gives a pod credentials only if its association exists
            # when the pod is created (as constructs/cluster_monitoring.py orders them).
            for account in sorted(_service_accounts(chart) & set(identities)):
                manifest.node.add_dependency(identities[account])
            previous = manifest


def _service_accounts(chart: cdk8s.Chart) -> set[str]:
    """The service accounts the chart's pod templates run as."""
    return {doc["spec"]["template"]["spec"].get("serviceAccountName", "default")
            for doc in chart.to_json() if "template" in doc.get("spec", {})}
