"""Observability as code: the metric catalogue, dashboards and alerting rules.

Everything here is plain data built from the environment config and endpoint files; the CDK
stacks and cdk8s charts deliver it (AMP + Amazon Managed Grafana in global regions, the
in-cluster Prometheus and Grafana in China).
"""
