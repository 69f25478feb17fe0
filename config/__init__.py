"""Typed, validated configuration built once from CDK context (see `app.py`)."""
from .environment import (  # noqa: F401
    AlertSubscription, CacheConfig, EndpointAccessConfig, EnvironmentConfig, NodeGroupConfig, parse_environment,
    resolve_environment,
)
from .errors import ConfigError  # noqa: F401
from .regions import RegionFacts, region_facts  # noqa: F401
