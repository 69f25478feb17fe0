"""Reads CDK context the way the CLI hands it over, without starting jsii.

The CLI merges `cdk.json`, `cdk.context.json` and `-c` flags into `CDK_CONTEXT_JSON`. Run
without the CLI (`python app.py`, tests), we do the same merge so `cdk.json` environments exist.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any, Mapping

from .environment import EnvironmentConfig, resolve_environment
from .errors import ConfigError

ROOT = Path(__file__).resolve().parent.parent


def cdk_json_context(root: Path = ROOT) -> dict[str, Any]:
    context: dict[str, Any] = {}
    for name in ("cdk.json", "cdk.context.json"):
        path = root / name
        if path.exists():
            data = json.loads(path.read_text())
            context.update(data.get("context", {}) if name == "cdk.json" else data)
    return context


def cli_context(environ: Mapping[str, str] = os.environ) -> dict[str, Any]:
    raw = environ.get("CDK_CONTEXT_JSON")
    return json.loads(raw) if raw else cdk_json_context()


def load_or_exit(context: Mapping[str, Any] | None = None) -> EnvironmentConfig:
    """Resolve the environment or print one clear line and exit 2 (no jsii, nothing written)."""
    try:
        return resolve_environment(cli_context() if context is None else context)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        raise SystemExit(2)
