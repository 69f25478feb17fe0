"""Command-line inputs shared by the operator's tools (`tools/`) and the measuring side
(`bench/`): argument types, the environment options, `ToolError`, the consoles.

They sit beside the other validated inputs so that both `tools/` and `bench/` import them from
below; neither imports the other for them. Bad input is a `ToolError`: one line naming the
field, the value and what is allowed, exit 2. A failure the user can only retry (a broken
upload, an unreachable registry) is exit 1.
"""
from __future__ import annotations

import argparse
import ipaddress
import math
import os
import re
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterable
from urllib.parse import urlsplit

from rich.console import Console

from .context import ROOT, repository_context
from .environment import EnvironmentConfig, resolve_environment
from .errors import excerpt, printable, redact

# Progress bars and notes go to stderr, results (tables, reports) to stdout.
# Result lines are never wrapped (they are read and grepped); tables fit the terminal.
err_console = Console(stderr=True, highlight=False, soft_wrap=True)
out_console = Console(highlight=False, soft_wrap=True)


class ToolError(Exception):
    """One line for the user; `exit_code` 2 = bad input, 1 = the work failed."""

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code

    @classmethod
    def bad_input(cls, field: str, value: Any, allowed: str | Iterable[str]) -> "ToolError":
        if not isinstance(allowed, str):
            allowed = ", ".join(str(a) for a in allowed)
        return cls(f"{printable(field, 200)} = {excerpt(value)} is not valid; allowed: "
                   f"{printable(allowed, 1000)}", exit_code=2)


class OneLineParser(argparse.ArgumentParser):
    """Usage mistakes are one line too, naming the argument and what it allows (`--help`
    shows the usage)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"error: {self.prog}: {printable(message, 600)} (see --help)\n")


def key_from_env(var: str) -> str:
    """The API key a tool was told to read from the environment variable `var`
    (`--api-key-env`); never echoed, only the variable's name."""
    key = os.environ.get(var)
    if not key:
        raise ToolError.bad_input("--api-key-env", var, "the name of a set environment variable")
    return key


# --------------------------------------------------------------------------- argument types
# argparse prints "argument --x: <message>": each type's message is the rest of the one line.


def _refuse(text: str, allowed: str) -> argparse.ArgumentTypeError:
    return argparse.ArgumentTypeError(f"{excerpt(text)} is not valid; allowed: {allowed}")


_DECIMAL = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")


def finite_float(text: str) -> float:
    """A number as written in ASCII; NaN and infinity pass every `<` check, so never."""
    value = float(text) if _DECIMAL.fullmatch(text.strip()) else math.nan
    if not math.isfinite(value):
        raise _refuse(text, "a finite decimal number")
    return value


def http_url(text: str, *, base: bool = False) -> str:
    """An http(s) URL with a host and a valid port, and no credential in it: what a URL
    argument holds is printed and saved in reports."""
    what = "an http:// or https:// " + ("base URL (no query)" if base else "URL")
    try:
        parts = urlsplit(text)
        port = parts.port
    except ValueError:
        raise _refuse(text, what + " with a port from 1 to 65535") from None
    if len(text) > 2048 or not all("!" <= c <= "~" for c in text) \
            or parts.scheme not in ("http", "https") or not _host(parts.hostname) or port == 0:
        raise _refuse(text, what + ", e.g. http://10.0.0.5:8000")
    if "@" in parts.netloc or redact(text) != text:
        raise _refuse(text, what + " without a user, password or token in it (they would be "
                      "printed and saved; --api-key-env sends a bearer token)")
    if base and (parts.query or parts.fragment):
        raise _refuse(text, what)
    return text


def _host(name: str | None) -> bool:
    """A DNS name (labels of at most 63 characters) or an IP address."""
    try:
        return ipaddress.ip_address(name or "") is not None
    except ValueError:
        return bool(name) and len(name) <= 253 and all(
            re.fullmatch(r"[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?", label)
            for label in name.rstrip(".").split("."))


def base_url(text: str) -> str:
    return http_url(text, base=True)


def check_output_dir(field: str, path: Path) -> None:
    """Before any work: `path` is, or can be made, a writable directory. Tried for real, not
    with an access test (root passes one for /proc, where nothing can be created): a probe
    directory is made where the first missing part would go, or inside `path`, and removed."""
    probe = path
    while not probe.exists() and not probe.is_symlink() and probe.parent != probe:
        probe = probe.parent
    if not probe.is_dir():
        raise ToolError.bad_input(field, str(path), f"a directory to write into ({probe} is "
                                  "not a directory)")
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".kvcache-probe-", dir=probe))
    except OSError as err:
        raise ToolError.bad_input(field, str(path), f"a directory to write into (nothing can "
                                  f"be created in {probe}: {err.strerror})") from None


# --------------------------------------------------------------------------- environment


def add_env_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--env", metavar="NAME",
                        help="environment: environments/NAME.json (needed when more than one)")
    parser.add_argument("--china", action="store_true",
                        help="the environment's China variant (as `-c china=true`)")
    parser.add_argument("--profile", metavar="NAME", help="AWS profile for credentials")


def add_command(sub: argparse._SubParsersAction, name: str, func: Callable, help: str,
                doc: str | None = None, *, env: bool = True,
                **kwargs: Any) -> argparse.ArgumentParser:
    """One `python -m tools` command: its parser (described by the module docstring's first
    paragraph), the environment options, and the function it runs."""
    p = sub.add_parser(name, help=help, description=(doc or help).split("\n\n")[0], **kwargs)
    if env:
        add_env_args(p)
    p.set_defaults(func=func)
    return p


def load_environment(args: argparse.Namespace) -> EnvironmentConfig:
    """The same resolution as `app.py`: the environment files, `env`, then the China switch."""
    context = repository_context(ROOT)
    if getattr(args, "env", None):
        context["env"] = args.env
    if getattr(args, "china", False):
        context["china"] = "true"
    return resolve_environment(context)


def pick_endpoint(cfg: EnvironmentConfig, endpoints: tuple, name: str | None):
    names = [e.name for e in endpoints]
    if name is None:
        if len(endpoints) == 1:
            return endpoints[0]
        raise ToolError.bad_input("--endpoint", None, names or
                                  f"none: environment '{cfg.name}' lists no endpoint files")
    for e in endpoints:
        if e.name == name:
            return e
    raise ToolError.bad_input("--endpoint", name, names or
                              f"none: environment '{cfg.name}' lists no endpoint files")
