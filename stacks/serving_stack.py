from __future__ import annotations

import cdk8s
from aws_cdk import Aws, CfnOutput, Duration, Fn, Stack, aws_eks_v2 as eks, aws_iam as iam
from aws_cdk import aws_route53 as route53
from aws_cdk import aws_kms as kms, aws_s3 as s3, aws_secretsmanager as sm
from constructs import Construct

from config import EnvironmentConfig
from config.contracts import NODE_START_MINUTES, SERVING_NAMESPACE
from config.environment import HostedZone
from constructs.naming import logical_id
from constructs.nag import acknowledge, wildcard
from constructs.pod_identity import PodIdentityRole, PodIdentityRoleProps
from config.endpoint_spec import EndpointSpec
from config.network import existing_load_balancer_subnets
from k8s.cache import SharedCacheChart
from k8s.router import router_name
from k8s.certificate import cert_service_account, s3_object
from k8s.serving import (
    ServingFacts, build_charts, dns_record, effective_scaling, generated_tls, needs_hub_token,
    reads_managed_l2, worker_service_account,
)
from stacks.common import removal_policy
from k8s.workers import L2Connection, MetricsSource



class ServingStack(Stack):
    """Workloads, in their own stack: a model change never touches the cluster stack."""

    def __init__(self, scope: Construct, id: str, *, cfg: EnvironmentConfig,
                 endpoints: tuple[EndpointSpec, ...], cluster: eks.ICluster,
                 model_bucket: s3.IBucket, model_key: kms.IKey | None,
                 l2_url: str | None, l2_secret_arn: str | None, l2_key: kms.IKey | None,
                 metrics: MetricsSource, keda_role: iam.IRole | None = None,
                 l2_nodes: eks.Nodegroup | None = None,
                 **kwargs) -> None:
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
        hub_token = None
        if needs_hub_token(endpoints):
            # huggingFaceModel.tokenSecretRef: the operator puts the Hub token here (HyperPod
            # reads a Kubernetes Secret; here no token is in a manifest or the cluster's etcd).
            hub_token = sm.Secret(self, "HuggingFaceToken", description="Hugging Face Hub "
                                  "token for gated models (put the value after deploy)",
                                  removal_policy=removal_policy(cfg))
            acknowledge(hub_token, {"AwsSolutions::AwsSolutions-SMG4": (
                "A token issued by the Hugging Face Hub: rotate it there and put the new value; "
                "workers read it when they start.")})
            CfnOutput(self, "HuggingFaceTokenSecretArn", value=hub_token.secret_arn)
        # The router NLBs' subnets: the created VPC's public ones, or those the existing VPC's
        # environment names (in a private-only VPC its node subnets, config/network.py).
        lb_subnets = (existing_load_balancer_subnets(cfg.network) if cfg.network.existing
                      else Fn.join(",", [s.subnet_id for s in cluster.vpc.public_subnets]))
        accounts = {}
        identities: dict[str, PodIdentityRole] = {}   # service account -> its Pod Identity
        for spec in endpoints:
            sa = worker_service_account(spec.name, spec.pod.service_account)
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
            if hub_token is not None and spec.hub and spec.hub.token:
                hub_token.grant_read(role)
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
                cert_object(identities[cert_sa].role, s3_object(uri, spec.name))
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
        if keda_role is not None and any(
                (scaling := effective_scaling(cfg, s)) and scaling.cloudwatch
                for s in endpoints):
            # autoScalingSpec.cloudWatchTrigger: KEDA reads the metrics as its operator. Here,
            # not in the cluster stack, so a model change never touches that stack.
            reads = iam.Policy(self, "KedaCloudWatchReads", roles=[keda_role], statements=[
                iam.PolicyStatement(actions=["cloudwatch:GetMetricData"], resources=["*"])])
            acknowledge(reads, {wildcard("*"): "cloudwatch:GetMetricData has no resource-level "
                                "permissions; the files' CloudWatch triggers name the metrics."})
        self.facts = ServingFacts(router_image=router_image,
                                  model_bucket=model_bucket.bucket_name,
                                  managed_l2=managed_l2, service_account=accounts,
                                  metrics=metrics, api_key_secret_arn=api_key.secret_arn,
                                  load_balancer_subnets=lb_subnets,
                                  hub_token_secret_arn=hub_token.secret_arn if hub_token
                                  else None)
        self.charts_app = cdk8s.App()
        self.charts = build_charts(self.charts_app, cfg, endpoints, self.facts)
        previous = None
        manifests: dict[str, eks.KubernetesManifest] = {}
        for chart in self.charts:
            manifest = eks.KubernetesManifest(self, logical_id(chart.node.id), cluster=cluster,
                                              manifest=chart.to_json(), overwrite=True)
            if previous is not None:
                manifest.node.add_dependency(previous)
            # The Pod Identity webhook gives a pod credentials only if its association exists
            # when the pod is created (as constructs/cluster_monitoring.py orders them).
            for account in sorted(_service_accounts(chart) & set(identities)):
                manifest.node.add_dependency(identities[account])
            # The in-cluster Valkey runs only on the Cache stack's node of its own (tainted
            # for it): its StatefulSet waits for that node group like the Helm releases wait
            # for theirs (tests/stacks/test_deploy_order.py).
            if l2_nodes is not None and isinstance(chart, SharedCacheChart):
                manifest.node.add_dependency(l2_nodes)
            previous = manifests[chart.node.id] = manifest
        for spec in endpoints:
            if (record := dns_record(cfg, spec)) is not None:
                self._dns_record(cluster, spec, *record, manifests[router_name(spec.name)])

    def _dns_record(self, cluster: eks.ICluster, spec: EndpointSpec, zone: HostedZone,
                    name: str, router: eks.KubernetesManifest) -> None:
        """dnsConfig: a CNAME to the router's NLB, whose name the load balancer controller
        writes to the Service's status once it made it (read back here, waiting for it)."""
        host = eks.KubernetesObjectValue(
            self, f"{logical_id(spec.name)}RouterHost", cluster=cluster, object_type="service",
            object_name=router_name(spec.name), object_namespace=SERVING_NAMESPACE,
            json_path=".status.loadBalancer.ingress[0].hostname",
            timeout=Duration.minutes(NODE_START_MINUTES))
        host.node.add_dependency(router)
        route53.CnameRecord(
            self, f"{logical_id(spec.name)}Dns", record_name=name, domain_name=host.value,
            ttl=Duration.minutes(5), zone=route53.HostedZone.from_hosted_zone_attributes(
                self, f"{logical_id(spec.name)}Zone", hosted_zone_id=zone.id,
                zone_name=zone.name))
        CfnOutput(self, f"{logical_id(spec.name)}DnsName", value=name)


def _service_accounts(chart: cdk8s.Chart) -> set[str]:
    """The service accounts the chart's pod templates run as."""
    return {doc["spec"]["template"]["spec"].get("serviceAccountName", "default")
            for doc in chart.to_json() if "template" in doc.get("spec", {})}


def cert_object(role: iam.IRole, uri: str) -> None:
    """The certificate Job may write its one object, and encrypt it under whatever key the
    team's bucket uses by default (SSE-KMS needs kms:GenerateDataKey of the writer): any key,
    but only through S3 and only for that object (or its bucket, where S3 Bucket Keys make
    the bucket the encryption context)."""
    bucket, _, key = uri.removeprefix("s3://").partition("/")
    bucket_arn = f"arn:{Aws.PARTITION}:s3:::{bucket}"
    role.add_to_principal_policy(iam.PolicyStatement(
        actions=["s3:PutObject"], resources=[f"{bucket_arn}/{key}"]))
    role.add_to_principal_policy(iam.PolicyStatement(
        actions=["kms:GenerateDataKey"], resources=["*"], conditions={
            "StringEquals": {"kms:ViaService": f"s3.{Aws.REGION}.{Aws.URL_SUFFIX}"},
            "ForAnyValue:StringEquals": {"kms:EncryptionContext:aws:s3:arn": [
                f"{bucket_arn}/{key}", bucket_arn]}}))
    acknowledge(role, {wildcard("*"): "kms:GenerateDataKey of the team's bucket key, which "
                       "the stack does not know: only via S3, only for the certificate's object"})
