"""cdk-nag acknowledgements, scoped to the construct that causes them, each with its reason."""
from __future__ import annotations

from typing import Mapping

import aws_cdk as cdk
from constructs import IConstruct

AWS_MANAGED = "arn:<AWS::Partition>:iam::aws:policy/"


def acknowledge(scope: IConstruct, reasons: Mapping[str, str]) -> None:
    """`reasons` maps the exact id cdk-nag prints ('AwsSolutions::...') to why it is fine."""
    for rule_id, reason in reasons.items():
        cdk.Validations.of(scope).acknowledge(cdk.Acknowledgment(id=rule_id, reason=reason))


def managed_policy(name: str) -> str:
    return f"AwsSolutions::AwsSolutions-IAM4[Policy::{AWS_MANAGED}{name}]"


def wildcard(resource: str) -> str:
    return f"AwsSolutions::AwsSolutions-IAM5[Resource::{resource}]"


def wildcard_action(action: str) -> str:
    return f"AwsSolutions::AwsSolutions-IAM5[Action::{action}]"
