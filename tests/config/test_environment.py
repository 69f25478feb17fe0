"""Bad input: one clear message naming environment, field, value and what is allowed."""
from __future__ import annotations

import copy
import json
import os
import subprocess
import sys

import pytest

from config import ConfigError, resolve_environment
from config.context import repository_context
from tests.conftest import ROOT, context_for


def _ctx(env: str = "dev", **edits) -> dict:
    ctx = copy.deepcopy(context_for(env=env))
    raw = ctx["environments"][env]
    for path, value in edits.items():
        *parents, leaf = path.split("__")
        node = raw
        for p in parents:
            node = node[int(p)] if p.isdigit() else node[p]
        if value is _DELETE:
            del node[leaf]
        else:
            node[leaf] = value
    return ctx


_DELETE = object()
CN_CERT = ("arn:aws-cn:acm:cn-northwest-1:222222222222:certificate/"
           "0f7b1c2d-3e4f-4a5b-8c6d-7e8f9a0b1c2d")


def _error(ctx: dict) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        resolve_environment(ctx)
    return info.value


def test_the_default_environment_and_more_than_one_without_a_default():
    context = repository_context(ROOT)
    default = context["defaultEnvironment"]   # dev on a fresh clone
    assert resolve_environment(context).name == default   # bare `cdk synth`
    err = _error({k: v for k, v in context.items() if k != "defaultEnvironment"})
    assert (err.field, err.value) == ("env", None)
    assert err.allowed.startswith(", ".join(sorted(context["environments"]))
                                  + " (environments/NAME.json")
    err = _error({**context, "defaultEnvironment": "Prod"})
    assert (err.field, err.value) == ("env", "Prod")


def test_shipped_environments_resolve():
    dev = resolve_environment(context_for(env="dev"))
    assert (dev.name, dev.region, dev.facts.partition) == ("dev", "us-west-2", "aws")
    china = resolve_environment(context_for(env="china"))
    assert (china.facts.partition, china.use_ecr_images, china.observability) == (
        "aws-cn", True, "self-hosted")


def test_alert_subscriptions_become_typed_config():
    dev = resolve_environment(context_for())
    assert [(a.protocol, a.severities) for a in dev.alert_subscriptions] == [
        ("email", ("critical", "warning")), ("https", ("critical",))]
    assert resolve_environment(context_for(env="china")).alert_subscriptions


def test_each_strategy_gets_the_measured_router_unless_the_environment_says_otherwise():
    dev = resolve_environment(context_for())
    assert {s: dev.router_implementation(s) for s in (
        "prefixaware", "kvaware", "session", "roundrobin")} == {
        "prefixaware": "sglang-router", "kvaware": "vllm-router", "session": "vllm-router",
        "roundrobin": "vllm-router"}
    back = resolve_environment(_ctx("dev", routerImplementations={"prefixaware": "vllm-router"}))
    assert back.router_implementation("prefixaware") == "vllm-router"
    assert back.router_implementation("roundrobin") == "vllm-router"


def test_the_caches_parameter_group_family_follows_engine_and_version():
    """The L2's own parameter group (allkeys-lru) must be of the engine version's family."""
    redis = resolve_environment(_ctx(cache__engine="redis", cache__engineVersion="6.2")).cache
    valkey = resolve_environment(context_for()).cache
    assert (redis.parameter_group_family, valkey.parameter_group_family) == (
        "redis6.x", "valkey9")


def test_a_china_region_falls_back_to_the_newest_valkey_it_offers():
    """The China guide documents Valkey parameter groups only to 8.2 (config/regions.py): an
    environment there asking for 9.0 or 9.1 renders 8.2 with family valkey8 and keeps what it
    asked (said at synth: tests/stacks/test_cache_stack.py); what the region offers is served
    as asked, in China and elsewhere."""
    from config.regions import CHINA_REGIONS, cache_engine_versions_in

    for region in CHINA_REGIONS:
        assert cache_engine_versions_in(region, "valkey")[-1] == "8.2"
    for asked in ("9.0", "9.1"):
        cache = resolve_environment(_ctx("china", cache__engineVersion=asked)).cache
        assert (cache.engine_version, cache.parameter_group_family,
                cache.requested_engine_version) == ("8.2", "valkey8", asked)
    for env, asked in (("china", "8.1"), ("dev", "9.1")):
        cache = resolve_environment(_ctx(env, cache__engineVersion=asked)).cache
        assert (cache.engine_version, cache.requested_engine_version) == (asked, None)
    variant = resolve_environment(context_for(env="dev", china="true")).cache
    assert (variant.engine_version, variant.requested_engine_version) == ("8.2", "9.0")


def test_an_ami_release_of_the_clusters_minor_is_taken():
    cfg = resolve_environment(_ctx("dev", amiReleaseVersion="1.35.12-20260115"))
    assert cfg.ami_release_version == "1.35.12-20260115"
    assert resolve_environment(context_for()).ami_release_version is None


def test_china_flag_switches_dev_to_its_china_variant():
    cfg = resolve_environment(context_for(env="dev", china="true"))
    assert cfg.name == "dev-cn" and cfg.region == "cn-northwest-1"
    assert cfg.facts.china and cfg.use_ecr_images and cfg.observability == "self-hosted"


@pytest.mark.parametrize("case, ctx, field, value, allowed", [
    ("engine version without a parameter group family", _ctx(cache__engineVersion="6.2"),
     "cache.engineVersion", "6.2", "7.2, 8.0, 8.1, 8.2, 9.0, 9.1 (ElastiCache valkey)"),
    ("AMI release of another minor", _ctx("dev", amiReleaseVersion="1.34.2-20260115"),
     "amiReleaseVersion", "1.34.2-20260115", "AL2023 AMI release of Kubernetes 1.35, "
     "1.35.<patch>-<YYYYMMDD>"),
    ("AMI release not a release", _ctx("dev", amiReleaseVersion="v20260115"),
     "amiReleaseVersion", "v20260115", "1.35.<patch>-<YYYYMMDD>"),
    ("AMI release beside a Bottlerocket group", _ctx(
        "dev", amiReleaseVersion="1.35.2-20260115",
        nodeGroups__gpu__0__amiType="BOTTLEROCKET_X86_64_NVIDIA"),
     "nodeGroups.gpu[0].amiType", "BOTTLEROCKET_X86_64_NVIDIA", "an AL2023 AMI type"),
    ("unknown environment", {**context_for(), "env": "Prod"}, "env", "Prod",
     ", ".join(sorted(context_for()["environments"])) + " (environments/NAME.json"),
    ("china flag on a China region set false", context_for(env="china", china="false"),
     "china", False, "true (region cn-northwest-1"),
    ("malformed china flag", context_for(env="dev", china="yes"), "china", "yes", "true, false"),
    ("GPU type not offered in China",
     _ctx("china", nodeGroups__gpu__0__instanceTypes=["g6e.12xlarge"]),
     "nodeGroups.gpu[0].instanceTypes[0]", "g6e.12xlarge", "g4dn.*, g5.*, p3.*, p4d.*"),
    ("GPU type we cannot size", _ctx("dev", nodeGroups__gpu__0__instanceTypes=["m5.large"]),
     "nodeGroups.gpu[0].instanceTypes[0]", "m5.large", "GPU types we can size"),
    ("system type not in region", _ctx("china", nodeGroups__system__instanceTypes=["m7i.xlarge"]),
     "nodeGroups.system.instanceTypes[0]", "m7i.xlarge", "offered in cn-northwest-1"),
    ("cache node type not in China", _ctx("china", cache__nodeType="cache.r6gd.xlarge"),
     "cache.nodeType", "cache.r6gd.xlarge", "cache.r7g.*"),
    ("min above max", _ctx("dev", nodeGroups__gpu__0__minSize=5),
     "nodeGroups.gpu[0].minSize", 5, "at most maxSize (4)"),
    ("desired outside min..max", _ctx("dev", nodeGroups__gpu__0__desiredSize=9),
     "nodeGroups.gpu[0].desiredSize", 9, "from 0 to 4"),
    ("missing required field", _ctx("dev", account=_DELETE), "account", None, "required"),
    ("malformed account", _ctx("dev", account="1234"), "account", "1234", "12-digit"),
    ("zone of another region", _ctx("dev", availabilityZones=["us-east-1a", "us-east-1b"]),
     "availabilityZones[0]", "us-east-1a", "zones of us-west-2"),
    ("unknown field (typo)", _ctx("dev", natGateway=2), "natGateway", 2, "known fields"),
    ("bad CIDR", _ctx("dev", clusterEndpoint={"public": True, "publicCidrs": ["10.0.0.0/33"]}),
     "clusterEndpoint.publicCidrs[0]", "10.0.0.0/33", "an IPv4 CIDR"),
    ("AMP/AMG asked for in China", _ctx("china", observability="managed"),
     "observability", "managed", "self-hosted (AMP and Amazon Managed Grafana do not exist"),
    ("public registries in China", _ctx("china", useEcrImages=False),
     "useEcrImages", False, "true (public registries are unreachable"),
    ("unsupported Kubernetes version", _ctx("dev", kubernetesVersion="1.29"),
     "kubernetesVersion", "1.29", "1.35"),
    ("wrong type", _ctx("dev", natGateways="two"), "natGateways", "two", "an integer"),
    ("unknown region", _ctx("dev", region="mars-east-1"), "region", "mars-east-1", "region name"),
    ("bad cache kind", _ctx("dev", cache={"kind": "memcached"}), "cache.kind", "memcached",
     "elasticache, self-hosted, none"),
    ("alert protocol", _ctx("dev", alerts={"subscriptions": [
        {"protocol": "sms", "endpoint": "+8613800000000"}]}),
     "alerts.subscriptions[0].protocol", "sms", "email, https"),
    ("alert e-mail", _ctx("dev", alerts={"subscriptions": [
        {"protocol": "email", "endpoint": "oncall.example.com"}]}),
     "alerts.subscriptions[0].endpoint", "oncall.example.com", "an e-mail address"),
    ("alert endpoint over http", _ctx("dev", alerts={"subscriptions": [
        {"protocol": "https", "endpoint": "http://hooks.example.com/x"}]}),
     "alerts.subscriptions[0].endpoint", "http://hooks.example.com/x", "an https:// URL"),
    ("alert severity", _ctx("china", alerts={"subscriptions": [
        {"protocol": "email", "endpoint": "a@example.cn", "severities": ["page"]}]}),
     "alerts.subscriptions[0].severities", "page", "critical, warning"),
    ("alert typo", _ctx("dev", alerts={"subscription": []}), "alerts.subscription", [],
     "known fields: subscriptions"),
    ("public listener without TLS", _ctx("dev", publicListener=True),
     "listener.certificateArn", None, "needs TLS (listener.certificateArn)"),
    ("public listener without client CIDRs", _ctx("china", publicListener=True, listener={
        "certificateArn": CN_CERT}), "listener.sourceRanges", None, "client CIDRs"),
    ("public listener open to all", _ctx("china", publicListener=True, listener={
        "certificateArn": CN_CERT, "sourceRanges": ["0.0.0.0/0"]}),
     "listener.sourceRanges", ["0.0.0.0/0"], "narrower than 0.0.0.0/0"),
    ("certificate of the other partition", _ctx("china", listener={
        "certificateArn": CN_CERT.replace("aws-cn", "aws")}),
     "listener.certificateArn", CN_CERT.replace("aws-cn", "aws"), "arn:aws-cn:acm:cn-northwest-1"),
    ("bad source range", _ctx("dev", listener={"sourceRanges": ["10.0.0.0/40"]}),
     "listener.sourceRanges[0]", "10.0.0.0/40", "an IPv4 CIDR"),
    ("router for a strategy it lacks", _ctx("dev", routerImplementations={
        "kvaware": "sglang-router"}), "routerImplementations.kvaware", "sglang-router",
     "a router that offers it: vllm-router"),
    ("unknown router", _ctx("dev", routerImplementations={"prefixaware": "envoy"}),
     "routerImplementations.prefixaware", "envoy", "vllm-router, sglang-router"),
    ("unknown strategy", _ctx("dev", routerImplementations={"prefix": "vllm-router"}),
     "routerImplementations", "prefix", "prefixaware, kvaware, session, roundrobin"),
])
def test_bad_input_is_one_clear_error(case, ctx, field, value, allowed):
    err = _error(ctx)
    assert err.field == field, case
    assert err.value == value, case
    assert allowed in err.allowed, (case, err.allowed)
    assert field in str(err) and "environment '" in str(err)


def test_china_flag_on_a_global_environment_without_a_variant():
    ctx = _ctx("dev", chinaVariant=_DELETE)
    ctx["china"] = "true"
    err = _error(ctx)
    assert (err.field, err.value) == ("china", True)
    assert "chinaVariant" in err.allowed


@pytest.mark.parametrize("overrides", [
    {"env": "nope"},
    {"env": "china", "china": "false"},
])
def test_cli_exits_2_with_one_line_and_writes_nothing(tmp_path, overrides):
    ctx = {**context_for(), **overrides}
    env = {**os.environ, "CDK_CONTEXT_JSON": json.dumps(ctx), "CDK_OUTDIR": str(tmp_path / "out")}
    proc = subprocess.run([sys.executable, "app.py"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: environment '")
    assert "Traceback" not in proc.stderr and "jsii" not in proc.stderr
    assert not (tmp_path / "out").exists()


def test_managed_observability_only_where_the_region_offers_it():
    """Amazon Managed Grafana is in fewer regions than AMP (cfn-lint's provider schemas): in
    us-west-1 `managed` means AMP alone by default, and asking for its Grafana is one line."""
    from config import ConfigError, resolve_environment
    from config.regions import GRAFANA_TYPE, resource_types_in
    from tests.conftest import context_for

    assert GRAFANA_TYPE not in resource_types_in("us-west-1")
    assert GRAFANA_TYPE in resource_types_in("us-east-1")

    def ctx(**fields):
        c = context_for(env="dev")
        env = c["environments"]["dev"]
        env.pop("chinaVariant", None)
        env.update(region="us-west-1", availabilityZones=["us-west-1a", "us-west-1c"],
                   observability="managed", instanceTypeMap={}, **fields)
        env["nodeGroups"]["gpu"] = [{"name": "t4", "instanceTypes": ["g4dn.12xlarge"],
                                     "minSize": 0, "maxSize": 2}]
        return c
    assert resolve_environment(ctx()).managed_grafana is False
    with pytest.raises(ConfigError) as err:
        resolve_environment(ctx(grafana="managed"))
    assert err.value.field == "grafana" and "\n" not in str(err.value)


def test_a_groups_ami_type_follows_its_types_architecture():
    """Graviton system nodes get an ARM AMI type by default; an AMI type of the other
    architecture, or types of both, is one line (CDK refused it at synth with a traceback,
    EKS at deploy). The rule is held to CDK's own InstanceType.architecture."""
    import aws_cdk.aws_ec2 as ec2

    from config import ConfigError, resolve_environment
    from config.instances import architecture
    from config.regions import instance_types_in
    from tests.conftest import context_for

    offered = sorted(instance_types_in("us-east-1"))
    for itype in offered[::7]:    # a seventh of what us-east-1 offers
        try:
            cdk_arch = ec2.InstanceType(itype).architecture
        except RuntimeError:      # a name CDK's pattern cannot parse (p6e-gb200, u7i-12tb)
            continue
        assert architecture(itype) == ("arm64" if cdk_arch == ec2.InstanceArchitecture.ARM_64
                                       else "x86_64"), itype

    def resolved(system):
        ctx = context_for(env="dev")
        ctx["environments"]["dev"]["nodeGroups"]["system"] = {"minSize": 2, "maxSize": 3,
                                                              **system}
        return resolve_environment(ctx)
    assert resolved({"instanceTypes": ["m7g.xlarge"]}).system_nodes.ami_type == \
        "AL2023_ARM_64_STANDARD"
    for system, field in (({"instanceTypes": ["m6i.xlarge"], "amiType":
                            "AL2023_ARM_64_STANDARD"}, "amiType"),
                          ({"instanceTypes": ["m6i.xlarge", "m7g.xlarge"]}, "instanceTypes")):
        with pytest.raises(ConfigError) as err:
            resolved(system)
        assert err.value.field == f"nodeGroups.system.{field}" and "\n" not in str(err.value)
