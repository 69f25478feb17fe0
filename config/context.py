"""Reads CDK context the way the CLI hands it over, without starting jsii.

The CLI merges `cdk.json`, `cdk.context.json` and `-c` flags into `CDK_CONTEXT_JSON`. Run
without the CLI (`python app.py`, tests), we do the same merge so `cdk.json` environments exist.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from contextlib import contextmanager
from typing import Any, Iterator, Mapping

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


@contextmanager
def exit_on_config_error() -> Iterator[None]:
    """Bad input: one clear line on stderr, exit 2, before jsii starts and anything is written."""
    try:
        yield
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        raise SystemExit(2)
