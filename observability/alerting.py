"""Where alerts go: one Alertmanager routing tree for both variants, delivering to SNS.

- Global: AMP's alert manager evaluates it (`amp_alert_manager_definition`); AMP publishes to
  the topic as `aps.amazonaws.com`. AMP accepts only SNS receivers, so there is no null one.
- China: kube-prometheus-stack's Alertmanager (v0.34) gets the same tree plus a null receiver
  for the chart's always-firing Watchdog/InfoInhibitor. Its SNS client is aws-sdk-go-v2 with the
  default credential chain, whose container provider reads the Pod Identity agent's credentials
  (`AWS_CONTAINER_CREDENTIALS_FULL_URI` + token file), so no key or role_arn is configured.

Severity routing: every message carries an SNS message attribute `severity`; each subscription
(config `alerts.subscriptions`) filters on it. Critical alerts repeat hourly, warnings every
12 hours. Inhibition keeps one page per failure: the cause silences its symptoms.
"""
from __future__ import annotations

from dataclasses import dataclass

import yaml

from config.environment import ALERT_SEVERITIES
from observability.metrics import ENDPOINT_LABEL

SEVERITY_ATTRIBUTE = "severity"            # SNS message attribute the subscriptions filter on
NULL_RECEIVER = "null"
GROUP_BY = ("alertname", ENDPOINT_LABEL)
# Alerts of kube-prometheus-stack's default rules that exist to be inhibited or to prove the
# pipeline works: never delivered (China only; AMP evaluates only our rules).
CHART_SILENT_ALERTS = ("Watchdog", "InfoInhibitor")
REPEAT = {"critical": "1h", "warning": "12h"}


def receiver(severity: str) -> str:
    return f"sns-{severity}"


@dataclass(frozen=True)
class Inhibition:
    """While `source` fires, `targets` with the same `equal` labels are not sent."""

    source: str
    targets: tuple[str, ...]
    equal: tuple[str, ...] = (ENDPOINT_LABEL,)
    why: str = ""

    def rule(self) -> dict:
        rule = {"source_matchers": [f'alertname="{self.source}"'],
                "target_matchers": [f'alertname=~"{"|".join(self.targets)}"']}
        return {**rule, "equal": list(self.equal)} if self.equal else rule


INHIBITIONS = (
    Inhibition("KvcacheEndpointNoWorkers",
               ("KvcacheWorkerUnhealthy", "KvcacheQueueGrowing", "KvcacheTtftP90AboveObjective",
                "KvcacheHitRateCollapse", "KvcacheRouterCannotTokenize"),
               why="no worker at all: every per-worker and latency symptom follows from it"),
    Inhibition("KvcacheWorkerUnhealthy", ("KvcacheQueueGrowing",),
               why="a dead worker's requests queue on the others: page for the worker only"),
    Inhibition("KvcacheRoutersAllDown",
               ("KvcacheRouterDown", "KvcacheEndpointNoWorkers", "KvcacheWorkerUnhealthy",
                "KvcacheRouterCannotTokenize"),
               why="with no router up the router's own view of workers is stale"),
    Inhibition("KvcacheL2Unhealthy",
               ("KvcacheL2Slow", "KvcacheL2ReadsFailing", "KvcacheHitRateCollapse"),
               why="L2 out of service explains slow and failing reads and the lost hit rate"),
    Inhibition("KvcacheSharedCacheDown",
               ("KvcacheL2Unhealthy", "KvcacheL2Slow", "KvcacheL2ReadsFailing",
                "KvcacheHitRateCollapse", "KvcacheValkeyExporterDown"),
               equal=(), why="the in-cluster cache serves every endpoint: one page for all"),
    Inhibition("KvcacheValkeyExporterDown",
               ("KvcacheValkeyOverMemoryLimit", "KvcacheValkeyEvicting",
                "KvcacheValkeyRejectingConnections"), equal=("namespace", "pod"),
               why="without the exporter the Valkey series are stale"),
)


def alertmanager_config(*, topic_arn: str, region: str, in_cluster: bool) -> dict:
    """The routing tree. `topic_arn` may be a CloudFormation token (it resolves in the YAML)."""
    def sns(severity: str) -> dict:
        return {"name": receiver(severity), "sns_configs": [{
            "topic_arn": topic_arn, "sigv4": {"region": region},
            # SNS subjects: ASCII, at most 100 characters. The default lists every label.
            "subject": ('[{{ .Status | toUpper }}] {{ .CommonLabels.alertname }} '
                        f'{{{{ .CommonLabels.{ENDPOINT_LABEL} }}}}'),
            "attributes": {SEVERITY_ATTRIBUTE: severity},
            "send_resolved": True}]}

    routes = [{"receiver": receiver(s), "matchers": [f'severity="{s}"'],
               "repeat_interval": REPEAT[s]} for s in ALERT_SEVERITIES]
    receivers = [sns(s) for s in ALERT_SEVERITIES]
    if in_cluster:
        routes.insert(0, {"receiver": NULL_RECEIVER,
                          "matchers": [f'alertname=~"{"|".join(CHART_SILENT_ALERTS)}"']})
        receivers.append({"name": NULL_RECEIVER})
    return {
        "route": {
            # Anything without a known severity still reaches people, as a warning.
            "receiver": receiver("warning"), "group_by": list(GROUP_BY),
            "group_wait": "30s", "group_interval": "5m", "repeat_interval": REPEAT["warning"],
            "routes": routes},
        "inhibit_rules": [
            *(i.rule() for i in INHIBITIONS),
            # A critical alert silences the warning of the same name on the same endpoint.
            {"source_matchers": ['severity="critical"'], "target_matchers": ['severity="warning"'],
             "equal": ["alertname", ENDPOINT_LABEL]}],
        "receivers": receivers,
    }


def render_config(config: dict) -> str:
    return yaml.safe_dump(config, sort_keys=False, width=1000)


class _Literal(str):
    pass


class _Dumper(yaml.SafeDumper):
    pass


_Dumper.add_representer(_Literal, lambda d, v: d.represent_scalar(
    "tag:yaml.org,2002:str", v, style="|"))


def amp_alert_manager_definition(*, topic_arn: str, region: str) -> str:
    """AMP's alert manager definition: the Alertmanager config as a block under
    `alertmanager_config` (AMP's wrapper, beside an optional `template_files`)."""
    config = render_config(alertmanager_config(topic_arn=topic_arn, region=region,
                                               in_cluster=False))
    return yaml.dump({"alertmanager_config": _Literal(config)}, Dumper=_Dumper,
                     sort_keys=False, width=1000)
