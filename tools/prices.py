"""Read the environment's own on-demand prices from the AWS Price List Query API and write them
into its file's `instancePrices`, dated and sourced, in the region's currency.

    python -m tools prices --env prod-euc1             # with the team's credentials
    python -m tools prices --env china --china          # the China endpoint, in CNY

What it prices: every instance type of the environment's node groups, the in-cluster Valkey's
node where an endpoint's L2 is there, and the ElastiCache node type where the environment's
cache is ElastiCache: what the synth plan counts. The query runs where the partition's Price
List API is (us-east-1 for the global regions, cn-northwest-1 for China: the China
credentials stay in China), filtered to Linux, shared tenancy, no pre-installed software, used
capacity. The file's other prices (the EKS and load balancer hours, anything the API does not
list) are kept; the plan, `bench` and the cost panels then read the one list
(config/environment.py EnvironmentConfig.prices). The file is rewritten as JSON with two-space
indents: review the diff before you commit it.
"""
from __future__ import annotations

import argparse
import datetime
import json
from pathlib import Path
from typing import Any, Iterable

from config.arguments import ToolError, add_command, err_console, load_environment
from config.context import ENVIRONMENTS_DIR, ROOT
from config.environment import EnvironmentConfig
from config.prices import region_currency
from tools.cli import Aws

# Where each partition's Price List Query API answers (its endpoints page)
PRICING_REGION = {"aws": "us-east-1", "aws-cn": "cn-northwest-1"}
EC2_FILTERS = {"operatingSystem": "Linux", "tenancy": "Shared", "preInstalledSw": "NA",
               "capacitystatus": "Used"}


def register(sub: argparse._SubParsersAction) -> None:
    add_command(sub, "prices", main, "write the environment's own prices from the AWS Price "
                "List Query API into its file", __doc__)


def priced_types(cfg: EnvironmentConfig) -> tuple[list[str], list[str]]:
    """(EC2 types, ElastiCache node types) the plan counts for this environment."""
    from k8s.serving import in_cluster_node, load_endpoints, managed_l2_plans

    specs = load_endpoints(cfg, ROOT)
    ec2 = {t for g in (cfg.system_nodes, *cfg.gpu_node_groups) for t in g.instance_types}
    node = in_cluster_node(cfg, specs)
    if node is not None:
        ec2.add(node.node_type)
    cache = [cfg.cache.node_type] if cfg.cache.kind == "elasticache" and managed_l2_plans(
        cfg, specs) else []
    return sorted(ec2), cache


def _filters(fields: dict[str, str]) -> list[dict[str, str]]:
    return [{"Type": "TERM_MATCH", "Field": k, "Value": v} for k, v in fields.items()]


def on_demand_price(products: Iterable[str], currency: str) -> float | None:
    """The hourly on-demand price in `currency` of the first product that has one."""
    for text in products:
        item = json.loads(text)
        for term in (item.get("terms", {}).get("OnDemand") or {}).values():
            for dim in (term.get("priceDimensions") or {}).values():
                if dim.get("unit") not in ("Hrs", "Hours"):
                    continue
                value = (dim.get("pricePerUnit") or {}).get(currency)
                if value is not None and float(value) > 0:
                    return float(value)
    return None


def read_prices(cfg: EnvironmentConfig, pricing: Any) -> tuple[dict[str, float], list[str]]:
    """({type: hourly price}, the types the API lists no price for)."""
    currency = region_currency(cfg.region)
    ec2, cache = priced_types(cfg)
    asks = [("AmazonEC2", t, {"instanceType": t, "regionCode": cfg.region, **EC2_FILTERS})
            for t in ec2]
    engine = "Valkey" if cfg.cache.engine == "valkey" else "Redis"
    asks += [("AmazonElastiCache", t, {"instanceType": t, "regionCode": cfg.region,
                                       "cacheEngine": engine}) for t in cache]
    found, missing = {}, []
    for service, itype, fields in asks:
        pages = pricing.get_paginator("get_products").paginate(
            ServiceCode=service, Filters=_filters(fields), FormatVersion="aws_v1")
        price = on_demand_price((p for page in pages for p in page.get("PriceList", [])),
                                currency)
        if price is None:
            missing.append(itype)
        else:
            found[itype] = price
    return found, missing


def write_prices(path: Path, china_variant: bool, found: dict[str, float], currency: str,
                 today: str) -> dict:
    """The file with `instancePrices` updated (the variant's where `china_variant`)."""
    raw = json.loads(path.read_text(encoding="utf-8"))
    holder = raw.setdefault("chinaVariant", {}) if china_variant else raw
    old = holder.get("instancePrices") or {}
    kept = {k: v for k, v in (old.get("hourly") or {}).items() if k not in found}
    source = f"AWS Price List Query API, on demand, read {today} by `python -m tools prices`"
    if kept:
        source += f"; the file's own for {', '.join(sorted(kept))}"
    holder["instancePrices"] = {"currency": currency, "hourly": {**kept, **dict(sorted(
        found.items()))}, "source": source}
    return raw


def main(args: argparse.Namespace, aws: Aws | None = None) -> int:
    cfg = load_environment(args)
    aws = aws or Aws(cfg, getattr(args, "profile", None))
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        pricing = aws.client("pricing", region=PRICING_REGION[cfg.facts.partition])
        found, missing = read_prices(cfg, pricing)
    except (BotoCoreError, ClientError) as err:
        raise ToolError(f"the Price List Query API in {PRICING_REGION[cfg.facts.partition]} "
                        f"did not answer: {str(err).splitlines()[0]} (it needs "
                        "pricing:GetProducts)", 1) from None
    if not found:
        raise ToolError(f"no on-demand price listed for {', '.join(missing)} in {cfg.region}",
                        1)
    stem = getattr(args, "env", None) or cfg.name
    path = ROOT / ENVIRONMENTS_DIR / f"{stem}.json"
    if not path.exists():      # the default environment's China variant (NAME-cn)
        path = path.with_name(f"{stem.removesuffix('-cn')}.json")
    top_region = str(json.loads(path.read_text(encoding="utf-8")).get("region", ""))
    variant = bool(getattr(args, "china", False)) and not top_region.startswith("cn-")
    raw = write_prices(path, variant, found, region_currency(cfg.region),
                       datetime.date.today().isoformat())
    text = json.dumps(raw, indent=2, ensure_ascii=False) + "\n"
    path.write_text(text, encoding="utf-8")
    load_environment(args)      # the file still resolves, with its new prices
    err_console.print(f"{path.relative_to(ROOT)}: instancePrices for {len(found)} type(s) in "
                      f"{region_currency(cfg.region)}" + (f"; none listed for "
                                                           f"{', '.join(missing)}" if missing
                                                           else ""))
    return 0
