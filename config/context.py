"""Reads CDK context the way the CLI hands it over, without starting jsii.

The CLI merges `cdk.json`, `cdk.context.json` and `-c` flags into `CDK_CONTEXT_JSON`. Run
without the CLI (`python app.py`, tests), we do the same merge so `cdk.json` environments exist.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path
from contextlib import contextmanager
from typing import Any, Iterator, Mapping

from .errors import ConfigError
from .files import load_json_object, read_repository_file

ROOT = Path(__file__).resolve().parent.parent


def cdk_json_context(root: Path = ROOT) -> dict[str, Any]:
    """cdk.json's `context` and cdk.context.json, read strictly (`config.files`)."""
    context: dict[str, Any] = {}
    for name in ("cdk.json", "cdk.context.json"):
        if (root / name).exists():
            data = load_json_object("-", name, read_repository_file("-", name, name, root)[0])
            if not isinstance(data, Mapping) or not isinstance(data.get("context", {}), Mapping):
                raise ConfigError("-", name, data, "a JSON object (cdk.json: with a `context` "
                                  "object)")
            context.update(data.get("context", {}) if name == "cdk.json" else data)
    return context


def cli_context(environ: Mapping[str, str] = os.environ, root: Path = ROOT) -> dict[str, Any]:
    """The CLI's merged context, else cdk.json's. cdk.json is read strictly either way: the
    CLI's own JSON parser lets a duplicated key silently win."""
    from_files = cdk_json_context(root)
    raw = environ.get("CDK_CONTEXT_JSON")
    if not raw:
        return from_files
    context = load_json_object("-", "CDK_CONTEXT_JSON", raw)
    if not isinstance(context, Mapping):
        raise ConfigError("-", "CDK_CONTEXT_JSON", context, "a JSON object")
    return dict(context)


@contextmanager
def exit_on_config_error() -> Iterator[None]:
    """Bad input: one clear line on stderr, exit 2, before jsii starts and anything is written."""
    try:
        yield
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        raise SystemExit(2)
