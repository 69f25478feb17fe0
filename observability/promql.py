"""PromQL checks shared by the tests: parse a query (Grafana variables made concrete first) and
list the metric names its selectors read."""
from __future__ import annotations

import re

import promql_parser

# What Grafana substitutes before a query reaches Prometheus, made concrete for the parser.
GRAFANA_VARIABLES = {"$__rate_interval": "5m", "$__interval": "1m", "$__range": "1h"}
_VARIABLE = re.compile(r"\$\{?(\w+)(?::\w+)?\}?")


def concrete(expr: str) -> str:
    for name, value in GRAFANA_VARIABLES.items():
        expr = expr.replace(name, value)
    return _VARIABLE.sub(".*", expr)   # template variables only ever sit in regex matchers


def parse(expr: str) -> promql_parser.Expr:
    """Raises ValueError with the parser's message when the query is not valid PromQL."""
    return promql_parser.parse(concrete(expr))


def metric_names(expr: str) -> set[str]:
    """Metric names of every vector selector (`{__name__="..."}` included)."""
    names: set[str] = set()

    def visit(node) -> None:
        if isinstance(node, promql_parser.VectorSelector):
            if node.name:
                names.add(node.name)
            for m in node.matchers.matchers:
                if m.name == "__name__":
                    names.add(m.value)

    promql_parser.walk(parse(expr), visit)
    return names
