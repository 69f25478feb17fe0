"""The L2's stack where an endpoint's L2 verdict provisions one (the shipped environments have
none: tests/stacks/test_stacks.py): ElastiCache Valkey 9 in cluster mode with the verdicts'
shards on a non-burstable node type, and the in-cluster Valkey's own node group; cfn-lint and
cdk-nag run on it as on every shipped template. One small app, synthesized once."""
from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import yaml

from config import resolve_environment
from config.contracts import CACHE_NODE_GROUP, CACHE_TAINT_KEY, NODE_ROLE_CACHE, NODE_ROLE_LABEL
from config.endpoint_spec import parse_endpoint
from k8s.serving import fit_endpoint
from tests.lint import CfnLint
from tests.conftest import ROOT, context_for, resources

SEED = yaml.safe_load((ROOT / "tests" / "fixtures" / "endpoint-seed.yaml").read_text())


@pytest.fixture(scope="module")
def cache_app(tmp_path_factory):
    import aws_cdk as cdk
    from aws_cdk import aws_ec2 as ec2, aws_eks_v2 as eks, aws_iam as iam
    from cdk_nag import AwsSolutionsChecks

    from stacks.cache_stack import CacheStack, L2Needs

    cfg = resolve_environment(context_for(env="dev"))
    out = tmp_path_factory.mktemp("cache-app")
    app = cdk.App(outdir=str(out), context=context_for(env="dev"))
    env = cdk.Environment(account=cfg.account, region=cfg.region)
    base = cdk.Stack(app, "Base", env=env)   # what the other stacks would pass: imported
    cdk.CfnWaitConditionHandle(base, "Placeholder")   # a stack must hold a resource
    vpc = ec2.Vpc.from_vpc_attributes(base, "Vpc", vpc_id="vpc-0123456789abcdef0",
                                      availability_zones=list(cfg.availability_zones[:2]),
                                      private_subnet_ids=["subnet-0123456789abcdef0",
                                                          "subnet-0123456789abcdef1"])
    clients = ec2.SecurityGroup.from_security_group_id(base, "Clients", "sg-0123456789abcdef0")
    role = iam.Role.from_role_arn(base, "NodeRole",
                                  f"arn:aws:iam::{cfg.account}:role/nodes")
    cluster = eks.Cluster.from_cluster_attributes(base, "Cluster", cluster_name="kvcache",
                                                  vpc=vpc)
    stack = CacheStack(app, "Cache", cfg=cfg, vpc=vpc, client_security_group=clients,
                       needs=L2Needs(elasticache_shards=3, elasticache_cluster_mode=True,
                                     in_cluster_node_type="x2idn.16xlarge"),
                       cluster=cluster, node_role=role, env=env)
    cdk.Validations.of(app).add_plugins(AwsSolutionsChecks(app))
    assembly = app.synth()
    return cfg, assembly.get_stack_by_name(stack.stack_name).template, Path(assembly.directory)


def test_elasticache_is_valkey_9_in_cluster_mode_on_non_burstable_nodes(cache_app):
    cfg, t, _ = cache_app
    (rg,) = resources(t, "AWS::ElastiCache::ReplicationGroup").values()
    p = rg["Properties"]
    assert p["Engine"] == "valkey" and p["EngineVersion"] == cfg.cache.engine_version == "9.0"
    assert p["ClusterMode"] == "enabled" and p["NumNodeGroups"] == 3
    assert p["ReplicasPerNodeGroup"] == cfg.cache.replicas and "NumCacheClusters" not in p
    assert not p["CacheNodeType"].startswith("cache.t")
    assert p["TransitEncryptionEnabled"] is True and p["TransitEncryptionMode"] == "required"
    assert p["AtRestEncryptionEnabled"] is True
    assert p["MultiAZEnabled"] is cfg.cache.multi_az and rg["DeletionPolicy"] == "Snapshot"
    assert "resolve:secretsmanager" in json.dumps(p["AuthToken"])  # a reference, not the value
    (pg,) = resources(t, "AWS::ElastiCache::ParameterGroup").values()
    assert pg["Properties"]["CacheParameterGroupFamily"] == "valkey9"
    assert pg["Properties"]["Properties"] == {"maxmemory-policy": "allkeys-lru",
                                              "cluster-enabled": "yes"}
    outputs = json.dumps(t["Outputs"])
    assert "ConfigurationEndPoint.Address" in outputs   # GLIDE discovers the shards from it


def test_the_replication_groups_logical_id_is_stable(cache_app):
    """Renaming it would replace the cache (and lose what it holds): change it on purpose."""
    assert "L2ReplicationGroupEBA81C34" in cache_app[1]["Resources"]


def test_the_in_cluster_valkey_gets_a_node_of_its_own(cache_app):
    (ng,) = resources(cache_app[1], "AWS::EKS::Nodegroup").values()
    p = ng["Properties"]
    assert p["InstanceTypes"] == ["x2idn.16xlarge"]
    assert p["ScalingConfig"] == {"MinSize": 1, "MaxSize": 1, "DesiredSize": 1}
    assert p["Labels"][NODE_ROLE_LABEL] == NODE_ROLE_CACHE
    assert p["Labels"]["kvcache.io/node-group"] == CACHE_NODE_GROUP
    assert p["Taints"] == [{"Effect": "NO_SCHEDULE", "Key": CACHE_TAINT_KEY,
                            "Value": "present"}]
    assert p["Version"] == cache_app[0].kubernetes_version   # it follows the cluster too


def test_cfn_lint_and_cdk_nag_are_clean(cache_app):
    cfg, _, outdir = cache_app
    report = json.loads((outdir / "validation-report.json").read_text())
    for rep in report["pluginReports"]:
        assert rep["conclusion"] == "success", (rep["pluginName"], rep["violations"])
    template = str(outdir / "Cache.template.json")
    proc = CfnLint((cfg.region, "cn-northwest-1", "cn-north-1"), [template]).result()
    assert proc.returncode == 0, proc.stdout + proc.stderr


def _spec(cfg, glide_image: bool, monkeypatch):
    import config.images

    if glide_image:
        monkeypatch.setattr(config.images, "GLIDE_IMAGES", frozenset({"vllm-lmcache"}))
    raw = copy.deepcopy(SEED)
    raw["spec"]["kvCacheSpec"]["prefixTokens"] = 65536
    raw["spec"]["kvCacheSpec"]["forceL2Cache"] = False
    return fit_endpoint(cfg, parse_endpoint(cfg.name, "endpoints/seed.yaml", raw))


def test_the_shards_follow_the_verdict_and_glide_decides_cluster_mode(monkeypatch):
    from dataclasses import replace

    from k8s.serving import l2_plan
    from stacks.app_builder import l2_needs

    cfg = resolve_environment(context_for(env="dev"))
    ctx = context_for(env="dev")
    ctx["environments"]["dev"]["cache"].update(nodeType="cache.r7g.4xlarge", maxShards=32)
    big = resolve_environment(ctx)
    glide = _spec(big, True, monkeypatch)
    needs = l2_needs(big, (glide,))
    assert glide.l2_enabled and needs.elasticache_cluster_mode
    assert 1 < needs.elasticache_shards <= big.cache.max_shards
    assert needs.in_cluster_node_type is None
    # the fewest shards that pay and hold twice the fleet's GPU KV and L1s: here what it must
    # hold decides (r7g.4xlarge: 79 GiB of maxmemory a shard), not the network
    v = l2_plan(big, glide).verdict
    assert v.shards == needs.elasticache_shards and v.pays and v.holds
    fewer = replace(v, shards=v.shards - 1)
    assert fewer.pays and not fewer.holds
    monkeypatch.undo()
    plain = _spec(cfg, False, monkeypatch)   # rediss:// on one r7g.large: too slow, said once
    assert not plain.l2_enabled and l2_needs(cfg, (plain,)).elasticache_shards is None
    (said,) = [w for w in plain.warnings if "enableL2Cache" in w]
    assert "rediss://" in said and "cache.r7g.large" in said


def test_a_china_region_renders_the_newest_valkey_it_offers_and_says_so():
    """cn-northwest-1 has no Valkey 9 parameter group family (config/regions.py): the China
    sample asks for 9.0, its ElastiCache renders 8.2 with a valkey8 group, and synth says so
    once, under an id the team can acknowledge."""
    import aws_cdk as cdk
    from aws_cdk import aws_ec2 as ec2

    from config.notices import CHANGED
    from stacks.app_builder import notices
    from stacks.cache_stack import CacheStack, L2Needs

    cfg = resolve_environment(context_for(env="china"))
    assert cfg.cache.requested_engine_version == "9.0"
    spec = fit_endpoint(cfg, parse_endpoint(cfg.name, "endpoints/seed.yaml", SEED))
    said = [w for w in notices(cfg, (spec,)) if "cache.engineVersion" in w]
    assert said == [
        "environment: cache.engineVersion: valkey 9.0 is not offered in cn-northwest-1 "
        "(config/regions.py); the ElastiCache L2 runs valkey 8.2 (parameter group family "
        "valkey8), the newest offered there"]
    assert (said[0].kind, said[0].ack) == (CHANGED, "kvcache:changed:environment:cache.engineVersion")
    assert not [w for w in notices(cfg, ()) if "cache.engineVersion" in w]  # no L2: not said

    app = cdk.App(context=context_for(env="china"), builtin_cloud_formation_validation=False)
    env = cdk.Environment(account=cfg.account, region=cfg.region)
    base = cdk.Stack(app, "Base", env=env)
    vpc = ec2.Vpc.from_vpc_attributes(base, "Vpc", vpc_id="vpc-0123456789abcdef0",
                                      availability_zones=list(cfg.availability_zones[:2]),
                                      private_subnet_ids=["subnet-0123456789abcdef0",
                                                          "subnet-0123456789abcdef1"])
    clients = ec2.SecurityGroup.from_security_group_id(base, "Clients", "sg-0123456789abcdef0")
    stack = CacheStack(app, "CacheCn", cfg=cfg, vpc=vpc, client_security_group=clients,
                       needs=L2Needs(elasticache_shards=1), env=env)
    t = app.synth().get_stack_by_name(stack.stack_name).template
    (rg,) = resources(t, "AWS::ElastiCache::ReplicationGroup").values()
    (pg,) = resources(t, "AWS::ElastiCache::ParameterGroup").values()
    assert (rg["Properties"]["EngineVersion"],
            pg["Properties"]["CacheParameterGroupFamily"]) == ("8.2", "valkey8")
