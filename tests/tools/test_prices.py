"""`python -m tools prices`: the environment's own on-demand prices from the AWS Price List
Query API (botocore's Stubber in front of the real pricing client), written into the file's
`instancePrices` in the region's currency, dated, then read by the plan."""
from __future__ import annotations

import argparse
import json
import shutil

import boto3
import pytest
from botocore.stub import Stubber

import config.arguments
import tools.prices as prices_tool
from config.arguments import load_environment
from stacks.plan import plan_text
from tests.conftest import ROOT
from tests.team_fleet import fleet
from tools.cli import Aws


def _product(price: str, currency: str) -> str:
    """One PriceList entry as the API returns it (a JSON string)."""
    return json.dumps({"product": {"attributes": {}}, "terms": {"OnDemand": {"SKU.T": {
        "priceDimensions": {"SKU.T.D": {"unit": "Hrs", "pricePerUnit": {currency: price},
                                        "description": "On Demand Linux"}}}}}})


@pytest.fixture
def team_repo(tmp_path, monkeypatch):
    for rel in ("cdk.json", "environments", "endpoints", "models"):
        src = ROOT / rel
        if src.is_dir():
            shutil.copytree(src, tmp_path / rel, ignore=shutil.ignore_patterns("snapshots"))
        elif src.exists():
            shutil.copy(src, tmp_path / rel)
    envs, files = fleet()      # issue 42's team: an ElastiCache L2 to price as well
    for path, text in files.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(text)
    for name, raw in envs.items():
        (tmp_path / "environments" / f"{name}.json").write_text(json.dumps(raw))
    monkeypatch.setattr(config.arguments, "ROOT", tmp_path)
    monkeypatch.setattr(prices_tool, "ROOT", tmp_path)
    return tmp_path


@pytest.mark.parametrize("env,variant,currency,api_region", [
    ("dev", False, "USD", "us-east-1"), ("china", False, "CNY", "cn-northwest-1"),
    ("prod-euc1", False, "USD", "us-east-1")])
def test_prices_are_read_where_the_partitions_api_is_and_written_dated(
        team_repo, monkeypatch, env, variant, currency, api_region):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    args = argparse.Namespace(env=env, china=variant, profile=None)
    cfg = load_environment(args)
    ec2, cache = prices_tool.priced_types(cfg)
    assert bool(cache) == (env == "prod-euc1")     # its L2 is ElastiCache
    made = {}

    def factory(service):
        client = boto3.client(service, region_name=api_region)
        stub = Stubber(client)
        for i, itype in enumerate(ec2 + cache):
            service_code = "AmazonEC2" if itype in ec2 else "AmazonElastiCache"
            # what the API matches on: the type in the region; for EC2 Linux on shared
            # tenancy, no pre-installed software, used capacity (one price per type)
            fields = {"instanceType": itype, "regionCode": cfg.region}
            if service_code == "AmazonEC2":
                fields.update(operatingSystem="Linux", tenancy="Shared", preInstalledSw="NA",
                              capacitystatus="Used")
            else:
                fields["cacheEngine"] = "Valkey" if cfg.cache.engine == "valkey" else "Redis"
            stub.add_response("get_products", {"FormatVersion": "aws_v1", "PriceList": [
                _product(f"{10 + i}.5000000000", currency)]}, {
                "ServiceCode": service_code, "FormatVersion": "aws_v1", "Filters": [
                    {"Type": "TERM_MATCH", "Field": k, "Value": v} for k, v in fields.items()]})
        stub.activate()
        made["client"], made["stub"] = client, stub
        return client
    aws = Aws(cfg, factory=factory)
    asked_in = []
    real_client = aws.client
    monkeypatch.setattr(aws, "client", lambda service, region=None: (
        asked_in.append((service, region)), real_client(service, region))[1])
    assert prices_tool.main(args, aws) == 0
    made["stub"].assert_no_pending_responses()
    assert asked_in == [("pricing", api_region)]      # China's credentials stay in China
    raw = json.loads((team_repo / "environments" / f"{env}.json").read_text())
    written = raw["instancePrices"]
    assert written["currency"] == currency and "Price List Query API" in written["source"]
    assert {t: written["hourly"][t] for t in ec2 + cache} == {
        t: 10 + i + 0.5 for i, t in enumerate(ec2 + cache)}
    after = load_environment(args)        # the plan prices from them now
    plan = plan_text(after, ())
    assert "Price List Query API" in plan and f"on demand in {currency}" in plan


def test_an_api_that_does_not_answer_is_one_line(team_repo, monkeypatch):
    from botocore.exceptions import EndpointConnectionError

    args = argparse.Namespace(env="dev", china=False, profile=None)
    cfg = load_environment(args)

    class Down:
        def get_paginator(self, name):
            raise EndpointConnectionError(endpoint_url="https://api.pricing.us-east-1.amazonaws.com")
    before = (team_repo / "environments" / "dev.json").read_text()
    with pytest.raises(config.arguments.ToolError) as err:
        prices_tool.main(args, Aws(cfg, factory=lambda s: Down()))
    assert "pricing:GetProducts" in str(err.value) and "\n" not in str(err.value)
    assert (team_repo / "environments" / "dev.json").read_text() == before   # nothing written
