from __future__ import annotations

from aws_cdk import Stack
from constructs import Construct

from config import EnvironmentConfig
from constructs.managed_observability import ManagedObservability, ManagedObservabilityProps
from observability.rules import render as render_rules
from stacks.common import removal_policy


class ObservabilityStack(Stack):
    """AMP + Amazon Managed Grafana; only built where the region offers them."""

    def __init__(self, scope: Construct, id: str, *, cfg: EnvironmentConfig, **kwargs) -> None:
        super().__init__(scope, id, **kwargs)
        self.managed = ManagedObservability(self, "Managed", props=ManagedObservabilityProps(
            removal_policy=removal_policy(cfg), alert_rules=render_rules(cfg)))
