"""An IAM role bound to one Kubernetes service account through EKS Pod Identity.

Pod Identity, not IRSA: no OIDC provider custom resource, and it works the same in China.
"""
from __future__ import annotations

from dataclasses import dataclass

from aws_cdk import aws_eks_v2 as eks, aws_iam as iam
from constructs import Construct


@dataclass(frozen=True)
class PodIdentityRoleProps:
    cluster: eks.ICluster
    namespace: str
    service_account: str


def pod_identity_principal() -> iam.IPrincipal:
    """Who assumes a Pod Identity role: the EKS Pod Identity agent, with session tags."""
    return iam.ServicePrincipal("pods.eks.amazonaws.com").with_session_tags()


class PodIdentityRole(Construct):
    def __init__(self, scope: Construct, id: str, *, props: PodIdentityRoleProps) -> None:
        super().__init__(scope, id)
        self.role = iam.Role(self, "Role", assumed_by=pod_identity_principal())
        eks.CfnPodIdentityAssociation(
            self, "Association", cluster_name=props.cluster.cluster_name,
            namespace=props.namespace, service_account=props.service_account,
            role_arn=self.role.role_arn)
