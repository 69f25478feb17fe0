"""Values AWS assigns at deploy, as the GitOps YAML (dist/<env>/) names them.

A placeholder is `@@KVCACHE_<NAME>@@`: neither a shell, envsubst, Kubernetes' `$(VAR)` nor Helm's
`{{ }}` reads it, so the runtime variables the manifests carry (the router front's
`${FRONT_BIND}`, the init containers' shell) pass through untouched, and one left unfilled is
easy to find. `python -m tools fill` replaces each with the stack output named here.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

PATTERN = re.compile(r"@@KVCACHE_([A-Z0-9_]+)@@")


@dataclass(frozen=True)
class Placeholder:
    name: str
    stack: str      # the stack suffix: KvCache-<env>-<stack>
    output: str     # its CloudFormation output

    @property
    def token(self) -> str:
        return f"@@KVCACHE_{self.name}@@"


PLACEHOLDERS: dict[str, Placeholder] = {p.name: p for p in (
    Placeholder("API_KEY_SECRET_ARN", "Serving", "ApiKeySecretArn"),
    Placeholder("HUB_TOKEN_SECRET_ARN", "Serving", "HuggingFaceTokenSecretArn"),
    Placeholder("MODEL_BUCKET", "Storage", "ModelBucketName"),
    Placeholder("LB_SUBNETS", "Network", "LoadBalancerSubnets"),
    Placeholder("L2_ENDPOINT", "Cache", "L2Endpoint"),
    Placeholder("L2_SECRET_ARN", "Cache", "L2SecretArn"),
    Placeholder("AMP_QUERY_URL", "Observability", "AmpQueryUrl"),
    Placeholder("AMP_REMOTE_WRITE_URL", "Observability", "AmpRemoteWriteUrl"),
    Placeholder("GRAFANA_ADMIN_SECRET_ARN", "Monitoring", "GrafanaAdminSecretArn"),
    Placeholder("ALERT_TOPIC_ARN", "Monitoring", "AlertTopicArn"),
)}


def token(name: str) -> str:
    return PLACEHOLDERS[name].token
