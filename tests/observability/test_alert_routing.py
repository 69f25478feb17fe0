"""Alerts reach someone: the routing each variant ships, read back from the synthesized
templates, checked by the real tools (Debian's amtool and Alertmanager 0.25, from
`make test`'s scripts/debian-tools).

- amtool `config routes test`: every shipped alert, in every environment, lands on the SNS
  receiver of its severity (global: AMP's alert manager definition; China: the in-cluster
  Alertmanager's config in the kube-prometheus-stack values).
- Alertmanager on 127.0.0.1: each inhibition silences its targets for the same endpoint only
  (a dead worker does not also page for its queue).
"""
from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import time
import urllib.request
from datetime import datetime, timedelta, timezone

import pytest
import yaml

from observability.alerting import (
    CHART_SILENT_ALERTS, INHIBITIONS, NULL_RECEIVER, SEVERITY_ATTRIBUTE, receiver,
)
from observability.metrics import ENDPOINT_LABEL
from observability.rules import alert_groups
from tests.conftest import ENVIRONMENTS, Lazy, resources

ENDPOINT = "llama-3-1-8b-instruct"


def _tool(name: str) -> str:
    path = shutil.which(name)
    assert path, f"{name} not found: `make tools` installs Debian's prometheus-alertmanager"
    return path


def _resolve(node, topic: str):
    """A CloudFormation value as text: Fn::Join joined, references replaced by `topic`."""
    if isinstance(node, str):
        return node
    if isinstance(node, dict) and "Fn::Join" in node:
        sep, parts = node["Fn::Join"]
        return sep.join(_resolve(p, topic) for p in parts)
    return topic


def _topic(cfg) -> str:
    return f"arn:{cfg.facts.partition}:sns:{cfg.region}:{cfg.account}:alerts"


def shipped_config(s) -> tuple[dict, bool]:
    """(Alertmanager config, in cluster?) as the environment's template carries it."""
    if s.cfg.observability == "managed":
        (ws,) = resources(s.template("Observability"), "AWS::APS::Workspace").values()
        definition = yaml.safe_load(_resolve(ws["Properties"]["AlertManagerDefinition"],
                                             _topic(s.cfg)))
        assert set(definition) == {"alertmanager_config"}
        return yaml.safe_load(definition["alertmanager_config"]), False
    (chart,) = resources(s.template("Monitoring"), "Custom::AWSCDK-EKS-HelmChart").values()
    values = json.loads(_resolve(chart["Properties"]["Values"], _topic(s.cfg)))
    return values["alertmanager"]["config"], True


def _alerts(cfg):
    return [a for group in alert_groups(cfg).values() for a in group]


@pytest.fixture(scope="module")
def configs(synths, tmp_path_factory):
    """name -> its Alertmanager configuration file, written on first use (the inhibition
    tests read the China sample's, in a run --environment narrowed to others too)."""
    def write(name):
        config, in_cluster = shipped_config(synths[name])
        path = tmp_path_factory.mktemp("am") / f"{name}.yml"
        path.write_text(yaml.safe_dump(config))
        return path, config, in_cluster
    return Lazy(write)


@pytest.mark.parametrize("name", ENVIRONMENTS)
def test_config_is_valid_for_alertmanager_and_delivers_only_to_sns(configs, synths, name):
    path, config, in_cluster = configs[name]
    proc = subprocess.run([_tool("amtool"), "check-config", str(path)], capture_output=True,
                          text=True, timeout=30)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    cfg = synths[name].cfg
    sns = [c for r in config["receivers"] for c in r.get("sns_configs", [])]
    assert len(sns) == 2 and all(
        c["topic_arn"] == _topic(cfg) and c["sigv4"] == {"region": cfg.region}
        and set(c["sigv4"]) == {"region"}           # Pod Identity / AMP: no keys, no role
        for c in sns)
    assert sorted(c["attributes"][SEVERITY_ATTRIBUTE] for c in sns) == ["critical", "warning"]
    other = [r["name"] for r in config["receivers"] if "sns_configs" not in r]
    assert other == ([NULL_RECEIVER] if in_cluster else [])   # AMP allows SNS receivers only


@pytest.mark.parametrize("name", ENVIRONMENTS)
def test_every_alert_reaches_the_receiver_of_its_severity(configs, synths, name):
    path, _, in_cluster = configs[name]
    alerts = _alerts(synths[name].cfg)
    assert len(alerts) >= 16
    cases = [(receiver(a.severity), {"alertname": a.name, "severity": a.severity,
                                     ENDPOINT_LABEL: ENDPOINT}) for a in alerts]
    cases.append((receiver("warning"), {"alertname": "SomethingNew", "severity": "page"}))
    if in_cluster:   # kube-prometheus-stack's default rules: theirs reach people too
        cases += [(NULL_RECEIVER, {"alertname": a, "severity": "none"})
                  for a in CHART_SILENT_ALERTS]
        cases.append((receiver("critical"), {"alertname": "KubePodCrashLooping",
                                             "severity": "critical", "namespace": "x"}))
    for expected, labels in cases:
        proc = subprocess.run(
            [_tool("amtool"), "config", "routes", "test", f"--config.file={path}",
             f"--verify.receivers={expected}", *(f"{k}={v}" for k, v in labels.items())],
            capture_output=True, text=True, timeout=30)
        assert proc.returncode == 0, (labels, proc.stdout + proc.stderr)


def test_inhibitions_name_real_alerts_and_their_shared_labels(synths):
    names = {a.name: a for s in synths.values() for a in _alerts(s.cfg)}
    for rule in INHIBITIONS:
        assert rule.source in names and set(rule.targets) <= set(names), rule
        for alert in (rule.source, *rule.targets):
            # The label survives the expression on both sides, or nothing ever matches.
            by_clauses = re.findall(r"by \(([^)]*)\)", names[alert].expr)
            for label in rule.equal:
                assert all(label in c.split(", ") for c in by_clauses), (alert, label)
    dead_worker = next(i for i in INHIBITIONS if i.source == "KvcacheWorkerUnhealthy")
    assert "KvcacheQueueGrowing" in dead_worker.targets and dead_worker.equal == (ENDPOINT_LABEL,)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _api(port: int, path: str, body=None):
    req = urllib.request.Request(f"http://127.0.0.1:{port}/api/v2/{path}",
                                 data=json.dumps(body).encode() if body is not None else None,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=5) as resp:
        text = resp.read()
        return json.loads(text) if text else None


@pytest.mark.parametrize("rule", INHIBITIONS, ids=lambda r: r.source)
def test_alertmanager_inhibits_symptoms_of_the_same_endpoint_only(configs, tmp_path, rule):
    path, _, _ = configs["china"]
    port = _free_port()
    proc = subprocess.Popen(
        [_tool("prometheus-alertmanager"), f"--config.file={path}",
         f"--storage.path={tmp_path}", f"--web.listen-address=127.0.0.1:{port}",
         "--cluster.listen-address=", "--log.level=error"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                _api(port, "status")
                break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()
                time.sleep(0.1)
        now = datetime.now(timezone.utc)
        ends = (now + timedelta(hours=1)).isoformat()

        def alert(name: str, **labels) -> dict:
            return {"labels": {"alertname": name, "severity": "warning", **labels},
                    "startsAt": now.isoformat(), "endsAt": ends}

        same = {label: "a" for label in rule.equal}
        other = {label: "b" for label in rule.equal}
        posted = [alert(rule.source, **same)] + [alert(t, **same) for t in rule.targets]
        if rule.equal:
            posted += [alert(t, **other) for t in rule.targets]
        _api(port, "alerts", posted)
        same_key = tuple(same.values())
        # Alertmanager marks inhibitions asynchronously after the POST: read until this
        # source's own targets show it (bounded), then assert on that view.
        settle = time.monotonic() + 10
        while True:
            got = {(a["labels"]["alertname"], tuple(a["labels"].get(k) for k in rule.equal)): a
                   for a in _api(port, "alerts")}
            if all(got.get((t, same_key), {}).get("status", {}).get("state") == "suppressed"
                   for t in rule.targets) or time.monotonic() > settle:
                break
            time.sleep(0.1)
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    other_key = tuple(other.values())
    source = got[(rule.source, same_key)]
    assert source["status"]["state"] == "active"
    for target in rule.targets:
        assert got[(target, same_key)]["status"]["state"] == "suppressed", target
        if rule.equal:   # another endpoint's symptom is not this source's to silence
            assert source["fingerprint"] not in got[(target, other_key)]["status"]["inhibitedBy"]


@pytest.mark.parametrize("name", ENVIRONMENTS)
def test_topic_is_encrypted_subscribed_from_config_and_publishable_by_the_alertmanager(
        synths, name):
    s = synths[name]
    managed = s.cfg.observability == "managed"
    template = s.template("Observability" if managed else "Monitoring")
    (topic_id, topic), = resources(template, "AWS::SNS::Topic").items()
    key_id = topic["Properties"]["KmsMasterKeyId"]["Fn::GetAtt"][0]
    key = template["Resources"][key_id]
    assert key["Properties"]["EnableKeyRotation"] is True
    assert key["DeletionPolicy"] == ("Retain" if s.cfg.retain_data else "Delete")
    subs = sorted((r["Properties"]["Protocol"], r["Properties"]["Endpoint"],
                   tuple(r["Properties"]["FilterPolicy"][SEVERITY_ATTRIBUTE]))
                  for r in resources(template, "AWS::SNS::Subscription").values())
    assert subs == sorted((a.protocol, a.endpoint, a.severities)
                          for a in s.cfg.alert_subscriptions)
    (policy,) = resources(template, "AWS::SNS::TopicPolicy").values()
    statements = policy["Properties"]["PolicyDocument"]["Statement"]
    assert any(st["Effect"] == "Deny" and st["Condition"] == {
        "Bool": {"aws:SecureTransport": "false"}} for st in statements)
    text = json.dumps(template)
    if managed:
        amp = [st for st in statements if st.get("Principal") == {"Service": "aps.amazonaws.com"}]
        assert len(amp) == 1 and amp[0]["Condition"]["StringEquals"] == {
            "aws:SourceAccount": s.cfg.account}
        key_amp = [st for st in key["Properties"]["KeyPolicy"]["Statement"]
                   if st.get("Principal") == {"Service": "aps.amazonaws.com"}]
        assert key_amp and key_amp[0]["Condition"] == amp[0]["Condition"]
        (ws,) = resources(template, "AWS::APS::Workspace").values()
        assert topic_id in json.dumps(ws["Properties"]["AlertManagerDefinition"])
    else:
        assert "aps.amazonaws.com" not in text
        (assoc,) = [a for a in resources(template, "AWS::EKS::PodIdentityAssociation").values()
                    if a["Properties"]["ServiceAccount"] == "kvcache-alertmanager"]
        role_id = assoc["Properties"]["RoleArn"]["Fn::GetAtt"][0]
        (role_policy,) = [p for p in resources(template, "AWS::IAM::Policy").values()
                          if {"Ref": role_id} in p["Properties"]["Roles"]]
        doc = role_policy["Properties"]["PolicyDocument"]["Statement"]
        assert {"Action": "sns:Publish", "Effect": "Allow", "Resource": {"Ref": topic_id}} in doc
