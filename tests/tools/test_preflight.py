"""preflight with botocore Stubbers: every AWS answer is scripted, in the order it is asked."""
from __future__ import annotations

import argparse
import datetime

import boto3
import pytest
from botocore.stub import Stubber

from config.images import CHARTS
from k8s.serving import environment_images
from config.arguments import ToolError, load_environment
from tools.cli import Aws, load_endpoints
from tools.preflight import FAIL, PASS, WARN, Preflight, print_rows

CHINA = load_environment(argparse.Namespace(env="china", china=False))
ZONES = list(CHINA.availability_zones)            # cn-northwest-1a..c
MODEL = "llama31_8b"            # the endpoint's modelLocation
BUCKET = "kvcache-china-storage-models-1"
K8S = CHINA.kubernetes_version


# What DescribeCacheEngineVersions answers in cn-northwest-1 as the China guide documents it
# (config/regions.py): Valkey parameter groups up to 8.2.
VALKEY_IN_CHINA = {"7.2": "valkey7", "8.0": "valkey8", "8.1": "valkey8", "8.2": "valkey8"}


def engine_versions(versions: dict[str, str], engine: str = "valkey") -> dict:
    return {"CacheEngineVersions": [
        {"Engine": engine, "EngineVersion": v, "CacheParameterGroupFamily": f}
        for v, f in versions.items()]}


_CLIENTS: dict[str, object] = {}   # service -> a client: each costs ~10 ms, each run asks 8
_ACTIVE: list[Stubber] = []


@pytest.fixture(autouse=True)
def _stubbers_off():
    """Each test's Stubbers leave the module's clients when it ends, passed or not."""
    yield
    while _ACTIVE:
        _ACTIVE.pop().deactivate()


def stubbed(calls: dict[str, list[tuple]]) -> tuple[Aws, list[Stubber]]:
    """An Aws whose clients answer `calls[service]` = [(method, response | error code,
    expected params | None)] in order. The clients are the module's, one per service, each
    stubbed afresh for this Aws."""
    stubs = []

    def factory(service: str):
        client = _CLIENTS.get(service)
        if client is None or any(s.client is client for s in _ACTIVE):
            client = _CLIENTS[service] = boto3.client(
                service, region_name=CHINA.region, aws_access_key_id="x",
                aws_secret_access_key="y")
        stub = Stubber(client)
        for method, answer, params in calls.get(service, []):
            if isinstance(answer, str):
                stub.add_client_error(method, service_error_code=answer,
                                      service_message=f"{answer} (scripted)",
                                      http_status_code=400, expected_params=params)
            else:
                stub.add_response(method, answer, params)
        stub.activate()
        stubs.append(stub)
        _ACTIVE.append(stub)
        return client

    return Aws(CHINA, factory=factory), stubs


def happy(**override) -> dict[str, list[tuple]]:
    calls = {
        "sts": [("get_caller_identity", {"Account": CHINA.account, "UserId": "AIDA",
                 "Arn": f"arn:aws-cn:iam::{CHINA.account}:user/ops"}, {})],
        "ec2": [
            ("describe_availability_zones", {"AvailabilityZones": [
                {"ZoneName": z, "State": "available", "OptInStatus": "opt-in-not-required"}
                for z in ZONES]}, {"Filters": [{"Name": "zone-name", "Values": ZONES}],
                                   "AllAvailabilityZones": True}),
            ("describe_instance_type_offerings", {"InstanceTypeOfferings": [
                {"InstanceType": t, "LocationType": "availability-zone", "Location": z}
                for t in ("g4dn.12xlarge", "g5.24xlarge", "m6i.xlarge") for z in ZONES]},
             {"LocationType": "availability-zone", "Filters": [
                 {"Name": "instance-type",
                  "Values": ["g4dn.12xlarge", "g5.24xlarge", "m6i.xlarge"]},
                 {"Name": "location", "Values": ZONES}]}),
            ("describe_instance_types", {"InstanceTypes": [
                {"InstanceType": "m6i.xlarge", "VCpuInfo": {"DefaultVCpus": 4}}]},
             {"InstanceTypes": ["m6i.xlarge"]}),
        ],
        # china: g5.24xlarge x (2..6) + g4dn.12xlarge x (0..4) = 192..768 vCPUs; m6i 12..24
        "service-quotas": [
            ("get_service_quota", {"Quota": {"Value": 768.0}},
             {"ServiceCode": "ec2", "QuotaCode": "L-DB2E81BA"}),
            ("get_service_quota", {"Quota": {"Value": 64.0}},
             {"ServiceCode": "ec2", "QuotaCode": "L-1216C47A"}),
        ],
        "eks": [("describe_cluster_versions", {"clusterVersions": [{
            "clusterVersion": K8S, "versionStatus": "STANDARD_SUPPORT",
            "endOfStandardSupportDate": datetime.datetime(2027, 12, 2)}]},
            {"clusterVersions": [K8S], "includeAll": True})],
        "elasticache": [("describe_cache_engine_versions", engine_versions(VALKEY_IN_CHINA),
                         {"Engine": "valkey"})],
        "ecr": [("describe_images", {"imageDetails": [{"imageDigest": i.digest or "sha256:" +
                                                       "0" * 64}]},
                 {"repositoryName": i.mirror_repository, "imageIds": [{"imageTag": i.tag}]})
                for i in environment_images(CHINA, load_endpoints(CHINA))]
        + [("describe_images", {"imageDetails": [{"imageDigest": "sha256:" + "1" * 64}]},
            {"repositoryName": c.mirror_repository, "imageIds": [{"imageTag": c.version}]})
           for c in CHARTS.values()],
        "cloudformation": [("describe_stacks", {"Stacks": [{
            "StackName": "KvCache-china-Storage", "CreationTime": datetime.datetime(2026, 1, 1),
            "StackStatus": "CREATE_COMPLETE",
            "Outputs": [{"OutputKey": "ModelBucketName", "OutputValue": BUCKET}]}]},
            {"StackName": "KvCache-china-Storage"})],
        "s3": [("list_objects_v2", {"Contents": [
            {"Key": f"{MODEL}/{n}"} for n in ("config.json", "tokenizer.json",
                                              "model-00001-of-00002.safetensors",
                                              "model-00002-of-00002.safetensors")]},
            {"Bucket": BUCKET, "Prefix": f"{MODEL}/"})],
    }
    calls.update(override)
    return calls


def status(rows) -> dict[str, str]:
    return {r.check: r.status for r in rows}


def test_a_ready_account_passes_every_check(capsys):
    aws, stubs = stubbed(happy())
    rows = Preflight(aws, load_endpoints(CHINA)).run()
    for stub in stubs:
        stub.assert_no_pending_responses()
    got = status(rows)
    assert "image: vllm-lmcache" not in got   # the catalogue's, but no china file names it
    assert got.pop("image: router") == WARN    # built by the mirror; its digest not pinned yet
    # The endpoint file's own worker image is checked in ECR too (tag only: a warning).
    assert got.pop("image: lmcache/vllm-openai:v0.3.7") == WARN
    assert set(got.values()) == {PASS}, rows
    assert {"credentials", "services", "zones", "offered: g5.24xlarge", "offered: g4dn.12xlarge",
            "offered: m6i.xlarge", "quota: Running On-Demand G and VT instances",
            "quota: Running On-Demand Standard instances", f"EKS {K8S}",
            "model: llama-8b-intel-routing"} <= set(got)
    assert print_rows(CHINA, rows) == 0
    out = capsys.readouterr().out
    assert "preflight: china" in out and "768 vCPUs (L-DB2E81BA)" in out


def test_blockers_are_failures_and_exit_non_zero(capsys):
    calls = happy()
    calls["sts"] = [("get_caller_identity", {"Account": "999999999999", "UserId": "x",
                                             "Arn": "arn:aws-cn:iam::999999999999:user/x"}, {})]
    offers = calls["ec2"][1][1]["InstanceTypeOfferings"]
    offers[:] = [o for o in offers if (o["InstanceType"], o["Location"])
                 != ("g5.24xlarge", "cn-northwest-1c")]
    calls["service-quotas"][0] = ("get_service_quota", {"Quota": {"Value": 96.0}}, None)
    calls["service-quotas"][1] = ("get_service_quota", "NoSuchResourceException", None)
    calls["service-quotas"].append(("get_aws_default_service_quota",
                                    {"Quota": {"Value": 16.0}}, None))
    calls["eks"] = [("describe_cluster_versions", {"clusterVersions": []}, None)]
    calls["ecr"][1] = ("describe_images", "ImageNotFoundException", None)
    calls["ecr"][2] = ("describe_images", "RepositoryNotFoundException", None)
    calls["s3"] = [("list_objects_v2", {"Contents": [{"Key": f"{MODEL}/config.json"}]}, None)]
    aws, _ = stubbed(calls)
    rows = Preflight(aws, load_endpoints(CHINA)).run()
    got = status(rows)
    assert got["credentials"] == FAIL
    assert got["offered: g5.24xlarge"] == FAIL and got["offered: g4dn.12xlarge"] == PASS
    assert got["quota: Running On-Demand G and VT instances"] == FAIL   # 96 < 192 desired
    assert got["quota: Running On-Demand Standard instances"] == WARN   # 12 <= 16 < 24
    assert got[f"EKS {K8S}"] == FAIL
    second, third = [i.key for i in environment_images(CHINA, load_endpoints(CHINA))][1:3]
    assert got[f"image: {second}"] == FAIL and got[f"image: {third}"] == FAIL
    assert got["model: llama-8b-intel-routing"] == FAIL
    detail = {r.check: r.detail for r in rows}
    assert "not offered in cn-northwest-1c" in detail["offered: g5.24xlarge"]
    assert "run python -m tools mirror" in detail[f"image: {second}"]
    assert "deploy KvCache-china-Storage" in detail[f"image: {third}"]
    assert "no *.safetensors" in detail["model: llama-8b-intel-routing"]
    with pytest.raises(ToolError, match=r"^7 blocker\(s\): credentials: account 999999999999"):
        print_rows(CHINA, rows)


def test_expired_credentials_are_one_row_not_one_per_check():
    calls = happy(sts=[("get_caller_identity", "ExpiredToken", {})])
    aws, _ = stubbed(calls)
    rows = Preflight(aws, load_endpoints(CHINA)).run()
    assert [(r.check, r.status) for r in rows] == [("credentials", FAIL)]
    assert rows[0].detail.startswith("AWS GetCallerIdentity failed: ExpiredToken")
    assert "nothing else was checked" in rows[0].detail


def test_a_missing_stack_is_a_row_not_a_traceback():
    calls = happy(cloudformation=[("describe_stacks", "ValidationError", None)], s3=[])
    aws, _ = stubbed(calls)
    rows = {r.check: r for r in Preflight(aws, load_endpoints(CHINA)).run()}
    model = rows["model: llama-8b-intel-routing"]
    assert model.status == FAIL and "stack KvCache-china-Storage not found" in model.detail
    assert all("\n" not in r.detail for r in rows.values())


def test_without_describe_cluster_versions_the_add_ons_tell_the_version():
    aws, _ = stubbed(happy(eks=[
        ("describe_cluster_versions", "AccessDeniedException", None),
        ("describe_addon_versions", {"addons": [{"addonName": "vpc-cni"}]},
         {"kubernetesVersion": K8S, "maxResults": 1})]))
    row, = [r for r in Preflight(aws, ()).run() if r.check == f"EKS {K8S}"]
    assert (row.status, row.detail) == (PASS, f"add-ons are published for {K8S}")


def test_the_command_line_reports_one_line_and_exit_1(monkeypatch, capsys):
    from tools import __main__ as cli
    from tools import preflight

    aws, _ = stubbed(happy(eks=[("describe_cluster_versions", {"clusterVersions": []}, None)]))
    monkeypatch.setattr(preflight, "Aws", lambda cfg, profile: aws)
    assert cli.main(["preflight", "--env", "china"]) == 1
    err = capsys.readouterr().err.strip()
    assert err == f"error: 1 blocker(s): EKS {K8S}: not offered in cn-northwest-1"


def test_each_chart_missing_from_the_mirror_is_one_line_naming_it():
    """China's Cluster stack installs its charts from the account's ECR: before the mirror
    runs, `cdk deploy` fails there; preflight names each missing chart (issue 16, finding 4)."""
    calls = happy()
    images = len(environment_images(CHINA, load_endpoints(CHINA)))
    calls["ecr"][images] = ("describe_images", "ImageNotFoundException", None)
    calls["ecr"][images + 1] = ("describe_images", "RepositoryNotFoundException", None)
    aws, _ = stubbed(calls)
    rows = {r.check: r for r in Preflight(aws, load_endpoints(CHINA)).run()}
    first, second, *rest = CHARTS.values()
    missing = rows[f"chart: {first.key} {first.version}"]
    assert missing.status == FAIL and missing.detail == (
        f"{first.mirror_repository}:{first.version} missing: run python -m tools mirror")
    assert rows[f"chart: {second.key} {second.version}"].detail.startswith(
        f"no repository {second.mirror_repository}: deploy KvCache-china-Storage")
    assert all(rows[f"chart: {c.key} {c.version}"].status == PASS for c in rest)


@pytest.mark.parametrize("instances, status", [([], FAIL), (
    [{"InstanceArn": "arn:aws:sso:::instance/ssoins-1", "IdentityStoreId": "d-1"}], PASS)])
def test_managed_grafana_needs_iam_identity_center(instances, status):
    dev = load_environment(argparse.Namespace(env="dev", china=False))
    assert dev.managed_grafana

    def factory(service):
        client = boto3.client(service, region_name=dev.region, aws_access_key_id="x",
                              aws_secret_access_key="y")
        stub = Stubber(client)
        stub.add_response("list_instances", {"Instances": instances}, {})
        stub.activate()
        return client

    (row,) = Preflight(Aws(dev, factory=factory), ()).identity_center()
    assert row.status == status
    if status == FAIL:
        assert '"grafana": "none"' in row.detail and "\n" not in row.detail
    import dataclasses
    assert Preflight(Aws(dataclasses.replace(dev, managed_grafana=False), factory=factory),
                     ()).identity_center() == []


def test_without_credentials_one_line_not_a_fail_row_per_check(monkeypatch, capsys, tmp_path):
    """No credentials: every check would fail with the same message; the tool says it once."""
    for key in ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
                "AWS_SESSION_TOKEN", "AWS_CONTAINER_CREDENTIALS_FULL_URI",
                "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", "AWS_WEB_IDENTITY_TOKEN_FILE"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    from tools import __main__ as cli
    assert cli.main(["preflight", "--env", "china"]) == 1
    out = capsys.readouterr()
    assert out.out.count("FAIL") == 1 and "no AWS credentials found" in out.out
    assert out.err.strip().count("\n") == 0 and out.err.startswith("error: 1 blocker(s)")


@pytest.mark.parametrize("env", ["china", "dev"])
def test_the_router_image_missing_from_ecr_is_a_blocker_in_every_environment(env):
    """The router image is built by the mirror into the account's ECR, also where the other
    images come from upstream (dev): before `python -m tools mirror` no router pod starts."""
    from config.images import IMAGES
    cfg = load_environment(argparse.Namespace(env=env, china=False))
    router = IMAGES["router"]
    ecr = boto3.client("ecr", region_name=cfg.region, aws_access_key_id="x",
                       aws_secret_access_key="y")
    stub = Stubber(ecr)
    images = environment_images(cfg, load_endpoints(cfg))
    for image in images:
        if cfg.use_ecr_images or image.built_from:
            stub.add_client_error(
                "describe_images", service_error_code="ImageNotFoundException",
                http_status_code=400, expected_params={
                    "repositoryName": image.mirror_repository,
                    "imageIds": [{"imageTag": image.tag}]})
    stub.activate()
    aws = Aws(cfg, factory=lambda service: {"ecr": ecr}[service])
    rows = {r.check: r for r in Preflight(aws, load_endpoints(cfg)).images_in_ecr()}
    assert rows["image: router"].status == FAIL
    assert rows["image: router"].detail == (
        f"{router.mirror_repository}:{router.tag} missing: run python -m tools mirror")
    assert router in images
    if not cfg.use_ecr_images:   # the others come from upstream: only the router is checked
        assert [k for k in rows if k.startswith("image: ")] == ["image: router"]
    stub.assert_no_pending_responses()


def _engine_row(cfg, answer: dict):
    """The cache-engine row of `cfg` when the region answers `answer`, asked once by engine."""
    client = boto3.client("elasticache", region_name=cfg.region, aws_access_key_id="x",
                          aws_secret_access_key="y")
    stub = Stubber(client)
    stub.add_response("describe_cache_engine_versions", answer, {"Engine": cfg.cache.engine})
    stub.activate()
    rows = Preflight(Aws(cfg, factory=lambda service: {"elasticache": client}[service]),
                     ()).cache_engine()
    stub.assert_no_pending_responses()
    (row,) = rows
    assert "\n" not in row.detail
    return row


def test_the_rendered_cache_engine_offered_in_the_region_passes():
    """China renders the newest Valkey its guide documents a family for (8.2, valkey8), and
    says the file's 9.0 is not offered; dev renders the file's 9.0 (valkey9)."""
    row = _engine_row(CHINA, engine_versions(VALKEY_IN_CHINA))
    assert (row.check, row.status) == ("ElastiCache valkey 8.2", PASS)
    assert row.detail == ("offered in cn-northwest-1, parameter group family valkey8 (the "
                          "file asks 9.0, not offered there: config/regions.py)")
    dev = load_environment(argparse.Namespace(env="dev", china=False))
    row = _engine_row(dev, engine_versions({**VALKEY_IN_CHINA, "9.0.1": "valkey9"}))
    assert (row.check, row.status) == ("ElastiCache valkey 9.0", PASS)


def test_a_rendered_cache_engine_the_region_does_not_offer_is_a_blocker():
    row = _engine_row(CHINA, engine_versions({"7.2": "valkey7", "8.0": "valkey8"}))
    assert (row.check, row.status) == ("ElastiCache valkey 8.2", FAIL)
    assert row.detail == ("not offered in cn-northwest-1 (it offers valkey 7.2, 8.0): set "
                          "cache.engineVersion to one of them, and correct config/regions.py")


def test_a_parameter_group_family_other_than_the_rendered_one_is_a_blocker():
    row = _engine_row(CHINA, engine_versions({**VALKEY_IN_CHINA, "8.2": "valkey8.2"}))
    assert row.status == FAIL
    assert row.detail.startswith("cn-northwest-1 gives valkey 8.2 the parameter group family "
                                 "valkey8.2; the Cache stack renders valkey8 ")


def test_a_region_offering_the_asked_version_the_table_lacks_is_a_warning():
    """The region table is behind the region: the file's 9.0 would deploy there."""
    row = _engine_row(CHINA, engine_versions({**VALKEY_IN_CHINA, "9.0": "valkey9"}))
    assert (row.status, row.detail) == (WARN, (
        "cn-northwest-1 offers valkey 9.0, which the file asks for, but config/regions.py "
        "says it does not, so 8.2 is rendered: add 9.0 to cn-northwest-1 there"))


def test_no_elasticache_no_engine_row():
    import dataclasses
    cfg = dataclasses.replace(CHINA, cache=dataclasses.replace(CHINA.cache, kind="none"))
    assert Preflight(Aws(cfg, factory=lambda service: None), ()).cache_engine() == []
