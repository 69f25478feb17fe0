"""What `bench` and `bench-compare` check around the run: a result file is one `bench` wrote
(before anything is compared), and a run in which no request succeeded is a failure."""
from __future__ import annotations

import json
from numbers import Real
from pathlib import Path
from typing import Any, Mapping

from config.arguments import ToolError

# The parts of results.json that bench-compare reads, each with what it must be.
_NUMBER = "a number"
_META = {"label": str, "url": str, "started": str}
_SCENARIO_FIGURES = ("cache_hit_rate", "output_tokens_per_s", "cost_per_1k_output_tokens_usd")


def load_result(field: str, path: Path) -> dict:
    """The results.json at `path` (argument `field`), or one line saying what is wrong."""
    what = "a results.json written by python -m tools bench"
    try:
        data = json.loads(path.read_bytes().decode("utf-8"))
    except OSError as err:
        raise ToolError.bad_input(field, str(path), f"{what} ({err.strerror})") from None
    except (ValueError, RecursionError):
        raise ToolError.bad_input(field, str(path), f"{what} (this is not UTF-8 JSON)") from None
    problem = _problem(data)
    if problem:
        where, value, allowed = problem
        raise ToolError.bad_input(f"{field} {path}: {where}", value, allowed)
    return data


def _problem(data: Any) -> tuple[str, Any, str] | None:
    """The first part of `data` bench-compare could not read: (where, value, allowed)."""
    if not isinstance(data, Mapping):
        return "<document>", type(data).__name__, "a JSON object with meta and scenarios"
    meta, scenarios = data.get("meta"), data.get("scenarios")
    if not isinstance(meta, Mapping):
        return "meta", meta, "an object with label, url and started"
    for key, kind in _META.items():
        if not isinstance(meta.get(key), kind):
            return f"meta.{key}", meta.get(key), "a string"
    if not isinstance(meta.get("repeats", 1), int) or isinstance(meta.get("repeats"), bool):
        return "meta.repeats", meta.get("repeats"), "an integer"
    if not isinstance(scenarios, Mapping):
        return "scenarios", scenarios, "an object of scenario name -> figures"
    for name, s in scenarios.items():
        where = f"scenarios.{name}"
        if not isinstance(s, Mapping):
            return where, s, "an object of figures"
        errors = s.get("errors")
        if not isinstance(errors, int) or isinstance(errors, bool) or errors < 0:
            return f"{where}.errors", errors, "a count"
        for key in _SCENARIO_FIGURES:
            if s.get(key) is not None and not _is_number(s[key]):
                return f"{where}.{key}", s[key], _NUMBER
        for group in ("ttft_s", "spread"):
            figures = s.get(group) or {}
            if not isinstance(figures, Mapping):
                return f"{where}.{group}", figures, "an object of figures"
            for key, value in figures.items():
                ok = (_is_number(value) if group == "ttft_s" else
                      isinstance(value, list) and len(value) == 2 and all(map(_is_number, value)))
                if not ok:
                    return (f"{where}.{group}.{key}", value,
                            _NUMBER if group == "ttft_s" else "[min, max]")
    return None


def _is_number(value: Any) -> bool:
    return isinstance(value, Real) and not isinstance(value, bool)


def failed_run(result: Mapping) -> str | None:
    """Why a finished run is a failure (no request succeeded), or None."""
    scenarios = result.get("scenarios", {}).values()
    sent = sum(s.get("requests") or 0 for s in scenarios)
    if sum(s.get("ok") or 0 for s in scenarios) == 0:
        return f"no request succeeded (0 of {sent})"
    return None
