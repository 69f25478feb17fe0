"""On-demand hourly prices the synth plan (stacks/plan.py) counts, per region, in the region's
own currency, each table with its source and date.

- The China regions bill in CNY (docs.amazonaws.cn, "Billing and Payment": priced and billed
  in local currency); every other region in USD.
- us-east-1: config/price_tables/us-east-1.json, every EC2 on-demand (Linux) price of the AWS
  Price List API as Karpenter generated it on 2026-07-20 (after AWS's June 2025 P4 and P5
  cuts: p5.48xlarge 55.04, p4d.24xlarge 21.96), with Amazon EKS pricing (a cluster: 0.10/h)
  and Elastic Load Balancing pricing (a Network Load Balancer's hour, without its LCUs). The
  in-cluster Valkey's nodes are config/bandwidth.py's IN_CLUSTER_NODE_TYPES figures.
- Any other global region: us-east-1's, and the plan's price line says so; `python -m tools
  prices --env E` reads the region's own from the Price List Query API into the team's file.
- cn-north-1: config/price_tables/cn-north-1.json, the EC2 on-demand (Linux) prices of the
  AWS Price List API as Karpenter generates them for its own use (its source and date are in
  the file). amazonaws.cn/en/ec2/pricing/ could not be read from where this table was written
  (2026-11-28); no EKS, NLB or ElastiCache price was found in a source we could read, so the
  plan names those as unpriced rather than guessing.
- cn-northwest-1: no table of its own was found; cn-north-1's instance prices stand in, and
  the plan's price line says so (the two China regions are run by different operators and
  price differently).
An environment states its own (`instancePrices` in its file, config/environment.py) over
these: a discount, the unpriced items, or Ningxia's own figures.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

from config.bandwidth import IN_CLUSTER_NODE_TYPES

EKS_CLUSTER = "eks-cluster"        # pseudo type: one EKS control plane's hour
NLB = "network-load-balancer"      # pseudo type: one NLB's hour (LCUs are by traffic: not here)
PSEUDO_TYPES = (EKS_CLUSTER, NLB)


def region_currency(region: str) -> str:
    return "CNY" if region.startswith("cn-") else "USD"


@dataclass(frozen=True)
class PriceTable:
    currency: str
    source: str
    date: str
    hourly: Mapping[str, float] = field(default_factory=dict)


def _table_file(region: str) -> PriceTable:
    raw = json.loads((Path(__file__).parent / "price_tables" / f"{region}.json").read_text())
    return PriceTable(raw["currency"], raw["source"], raw["date"], raw["hourly"])


_CN_NORTH_1 = _table_file("cn-north-1")
_EC2_US_EAST_1 = _table_file("us-east-1")

TABLES: dict[str, PriceTable] = {
    "us-east-1": PriceTable(
        "USD", _EC2_US_EAST_1.source + "; EKS and ELB pricing pages, US East (N. Virginia), "
        "2026-11", _EC2_US_EAST_1.date, {
            **_EC2_US_EAST_1.hourly, **{n.type: n.hourly_usd for n in IN_CLUSTER_NODE_TYPES},
            EKS_CLUSTER: 0.10, NLB: 0.0225}),
    "cn-north-1": _CN_NORTH_1,
    "cn-northwest-1": PriceTable(
        "CNY", "cn-north-1's (none kept for cn-northwest-1, which prices on its own: state "
        "Ningxia's in instancePrices); " + _CN_NORTH_1.source, _CN_NORTH_1.date,
        _CN_NORTH_1.hourly),
}


def price_table(region: str) -> PriceTable:
    """The region's table; in a USD region without one, us-east-1's, said so (prices differ
    by region by some percent, never by currency); an empty one in a CNY region."""
    if region in TABLES:
        return TABLES[region]
    if region_currency(region) == "USD":
        t = TABLES["us-east-1"]
        return PriceTable("USD", f"us-east-1's: none kept for {region}; {t.source}", t.date,
                          t.hourly)
    return PriceTable(region_currency(region), f"none kept for {region} in config/prices.py",
                      "-")


class Prices:
    """An environment's hourly prices in its region's currency: its own `instancePrices`
    (and, in a USD region, `instanceHourlyUsd`) over the region's table."""

    def __init__(self, region: str, own: PriceTable | None = None,
                 hourly_usd: Mapping[str, float] | None = None):
        self.currency = region_currency(region)
        table = price_table(region)
        self.hourly = dict(table.hourly)
        self.table_source = f"{table.source}, {table.date}"
        self.sources = [self.table_source] if table.hourly else []
        if self.currency == "USD" and hourly_usd:
            self.hourly.update(hourly_usd)
            self.sources.append("instanceHourlyUsd")
        if own is not None:
            self.hourly.update(own.hourly)
            self.sources.append(own.source)
        self.unpriced: list[str] = []   # asked for, no price: not counted

    def get(self, item: str) -> float | None:
        return self.hourly.get(item)

    def cost(self, item: str, count: int) -> float:
        if count == 0:
            return 0.0
        price = self.hourly.get(item)
        if price is None:
            if item not in self.unpriced:
                self.unpriced.append(item)
            return 0.0
        return price * count

    def said(self, amount: float) -> str:
        return f"{self.currency} {amount:,.2f}"
