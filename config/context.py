"""Reads CDK context the way the CLI hands it over, and the team's environments, without jsii.

Environments live in `environments/NAME.json`, one file per environment, owned by the team that
deploys them; `cdk.json` keeps only CDK's feature flags, so an update of this repository never
touches a team's environments. The CLI merges `cdk.json`, `cdk.context.json` and `-c` flags into
`CDK_CONTEXT_JSON`; run without the CLI (`python app.py`, tests, tools) we read the same files.
Every file is read strictly (`config.files`).
"""
from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from contextlib import contextmanager
from typing import Any, Iterator, Mapping

from .errors import ConfigError
from .files import load_json_object, read_repository_file

ROOT = Path(__file__).resolve().parent.parent
ENVIRONMENTS_DIR = "environments"
# A file's stem is the environment's name: stack names (`KvCache-NAME-Cluster`), dist/NAME/,
# Kubernetes label values; `-cn` is added for a China variant.
ENVIRONMENT_NAME = re.compile(r"[a-z][a-z0-9-]{0,29}", re.A)
_NOT_ENVIRONMENTS = ("README.md",)
# environments/snapshots/NAME/: each environment's test snapshots, beside its file and owned
# with it (tests/conftest.py EnvironmentSnapshots)
SNAPSHOTS_DIR = "snapshots"
_MOVED = ("every environment in a file of its own, environments/NAME.json (cdk.json keeps "
          "CDK's feature flags): move each entry of context.environments there")


def environment_files(root: Path = ROOT) -> dict[str, Mapping[str, Any]]:
    """name -> the environment's fields, from `environments/NAME.json`, read strictly."""
    folder = root / ENVIRONMENTS_DIR
    if not folder.is_dir():
        raise ConfigError("-", f"{ENVIRONMENTS_DIR}/", None, "a folder of environment files "
                          "(environments/NAME.json)")
    envs: dict[str, Mapping[str, Any]] = {}
    for path in sorted(folder.iterdir()):
        if path.name in _NOT_ENVIRONMENTS or path.name.startswith(".") or (
                path.name == SNAPSHOTS_DIR and path.is_dir()):
            continue
        rel = f"{ENVIRONMENTS_DIR}/{path.name}"
        if path.suffix != ".json" or not ENVIRONMENT_NAME.fullmatch(path.stem):
            raise ConfigError(path.stem, rel, path.name, "files named NAME.json, NAME of "
                              "lowercase letters, digits and '-', starting with a letter, at "
                              "most 30 characters (and README.md, snapshots/)")
        text, _ = read_repository_file(path.stem, rel, rel, root)
        data = load_json_object(path.stem, rel, text)
        if not isinstance(data, Mapping):
            raise ConfigError(path.stem, rel, data, "a JSON object of environment fields")
        envs[path.stem] = data
    if not envs:
        raise ConfigError("-", f"{ENVIRONMENTS_DIR}/", [], "at least one environment file "
                          "(environments/NAME.json)")
    for name, raw in envs.items():
        if isinstance(raw.get("chinaVariant"), Mapping) and f"{name}-cn" in envs:
            raise ConfigError(name, "chinaVariant", f"{name}-cn",
                              f"a name no file takes: {name}'s China variant is {name}-cn, "
                              f"and so is {ENVIRONMENTS_DIR}/{name}-cn.json")
    return envs


def declared_environments(root: Path = ROOT) -> dict[str, dict[str, str]]:
    """Every environment the repository declares, with the context that selects it: each file,
    and the China variant of each that has a `chinaVariant` (`-c env=NAME -c china=true`).
    The gates in tests/ run on exactly these."""
    out: dict[str, dict[str, str]] = {}
    for name, raw in environment_files(root).items():
        out[name] = {"env": name}
        region = raw.get("region")
        if isinstance(raw.get("chinaVariant"), Mapping) and not (
                isinstance(region, str) and region.startswith("cn-")):
            out[f"{name}-cn"] = {"env": name, "china": "true"}
    return out


def _files_context(root: Path) -> dict[str, Any]:
    """cdk.json's `context` and cdk.context.json (CDK's lookup cache), read strictly."""
    context: dict[str, Any] = {}
    for name in ("cdk.json", "cdk.context.json"):
        if (root / name).exists():
            data = load_json_object("-", name, read_repository_file("-", name, name, root)[0])
            if not isinstance(data, Mapping) or not isinstance(data.get("context", {}), Mapping):
                raise ConfigError("-", name, data, "a JSON object (cdk.json: with a `context` "
                                  "object)")
            part = data.get("context", {}) if name == "cdk.json" else data
            if "environments" in part:
                where = "context.environments" if name == "cdk.json" else "environments"
                raise ConfigError("-", f"{name}: {where}", "{...}", _MOVED)
            context.update(part)
    return context


def repository_context(root: Path = ROOT) -> dict[str, Any]:
    """What the app reads without the CLI: cdk.json's flags, cdk.context.json, and
    `environments`, the environment files."""
    return {**_files_context(root), "environments": environment_files(root)}




def cli_context(environ: Mapping[str, str] = os.environ, root: Path = ROOT) -> dict[str, Any]:
    """The CLI's merged context (else the files'), with the environment files. The files are
    read strictly either way: the CLI's own JSON parser lets a duplicated key silently win.
    An `environments` object already in CDK_CONTEXT_JSON (a test running app.py on an edited
    environment) stands in for the folder."""
    from_files = repository_context(root)
    raw = environ.get("CDK_CONTEXT_JSON")
    if not raw:
        return from_files
    context = load_json_object("-", "CDK_CONTEXT_JSON", raw)
    if not isinstance(context, Mapping):
        raise ConfigError("-", "CDK_CONTEXT_JSON", context, "a JSON object")
    overflow = environ.get("CONTEXT_OVERFLOW_LOCATION_ENV")   # what did not fit the variable
    if overflow:
        more = load_json_object("-", "CONTEXT_OVERFLOW_LOCATION_ENV",
                                Path(overflow).read_text(encoding="utf-8"))
        if not isinstance(more, Mapping):
            raise ConfigError("-", "CONTEXT_OVERFLOW_LOCATION_ENV", more, "a JSON object")
        context = {**context, **more}
    return {"environments": from_files["environments"], **context}


@contextmanager
def exit_on_config_error() -> Iterator[None]:
    """Bad input: one clear line on stderr, exit 2, before jsii starts and anything is written."""
    try:
        yield
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        raise SystemExit(2)
