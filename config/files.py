"""Strict readers for the files a user hands us: `cdk.json` and endpoint files.

One property for every file, instead of one check per mistake: a regular file inside the
repository (a symlink in a pull request may not reach a key file elsewhere), of bounded size,
UTF-8, holding exactly one document, each mapping key once, finite numbers, text without control
characters, and (YAML) no aliases, so nothing expands beyond what was written. Every refusal
is a `ConfigError`: one line, no more of the file than a short excerpt.
"""
from __future__ import annotations

import copy
import functools
import json
import math
from pathlib import Path
from typing import Any

import yaml

from .errors import ConfigError

MAX_FILE_BYTES = 1 << 20   # a HyperPod file is a few KB; Kubernetes objects stop near 1.5 MiB
# C0 controls but tab/newline/CR, DEL, C1 controls, and the bidirectional overrides that make
# text display other than it reads ("trojan source").
_CONTROL = frozenset([*map(chr, range(0x20)), *map(chr, range(0x7f, 0xa0)),
                      *"\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"]) - set("\t\n\r")


def read_repository_file(env: str, field: str, written: str, root: Path,
                         limit: int = MAX_FILE_BYTES) -> tuple[str, str]:
    """(text, path relative to `root`) of a file named in config; `field` names the entry."""
    base = root.resolve()
    path = (root / written).resolve()      # follows symlinks, every one of them
    if not path.is_relative_to(base):
        raise ConfigError(env, field, written, "a file inside the repository (this path "
                          "resolves outside it, e.g. through a symlink)")
    rel = str(path.relative_to(base))
    if not path.is_file():
        raise ConfigError(env, field, written, "the path of an existing regular file")
    size = path.stat().st_size
    if size > limit:
        raise ConfigError(env, field, written, f"a file of at most {limit / 2**20:g} MiB (this "
                          f"one has {size:,} bytes)")
    with path.open("rb") as f:
        data = f.read(limit + 1)
    try:
        return data.decode("utf-8"), rel
    except UnicodeDecodeError as err:
        line = data[:err.start].count(b"\n") + 1
        raise ConfigError(env, f"{rel}: line {line}", f"byte 0x{data[err.start]:02x}",
                          "UTF-8 text") from None


class _Refused(Exception):
    def __init__(self, line: int, value: Any, allowed: str):
        super().__init__(allowed)
        self.line, self.value, self.allowed = line, value, allowed


def _check_text(text: str, line: int) -> str:
    bad = next((c for c in text if c in _CONTROL), None)
    if bad is not None:
        raise _Refused(line, bad, "text without control characters")
    return text


class _StrictLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing aliases, duplicate keys, NaN/infinity and control
    characters where they are found (with their line)."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise _Refused(event.start_mark.line + 1, f"*{event.anchor}",
                           "YAML without aliases (*name): an endpoint file is plain data")
        return super().compose_node(parent, index)

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            try:
                first = seen.setdefault(key, line)
            except TypeError:
                raise _Refused(line, "a mapping or list as a key", "text or numbers as keys")
            if first != line:
                raise _Refused(line, key, f"each key once per mapping (this one is also at "
                               f"line {first}; the last would silently win)")
        return super().construct_mapping(node, deep)

    def construct_yaml_str(self, node: yaml.ScalarNode) -> str:
        return _check_text(super().construct_yaml_str(node), node.start_mark.line + 1)

    def construct_yaml_float(self, node: yaml.ScalarNode) -> float:
        value = super().construct_yaml_float(node)
        if not math.isfinite(value):
            raise _Refused(node.start_mark.line + 1, node.value, "a finite number")
        return value


_StrictLoader.add_constructor("tag:yaml.org,2002:str", _StrictLoader.construct_yaml_str)
_StrictLoader.add_constructor("tag:yaml.org,2002:float", _StrictLoader.construct_yaml_float)


@functools.lru_cache(maxsize=256)
def _documents(text: str) -> tuple:
    """The documents of `text`, read strictly (up to the second: an error). PyYAML's pure
    Python reader takes ~30 ms an endpoint file, and a synth, the plan and the tools read the
    same files again: a text read once is not read twice (callers get a copy)."""
    loader = _StrictLoader(text)
    try:
        docs = []
        while loader.check_data():
            if docs:   # a second document: `cat a.yaml b.yaml` is not one endpoint
                mark = loader.peek_event().start_mark
                raise _Refused(mark.line + 1, "a second document",
                               "one YAML document per file (one endpoint per file)")
            docs.append(loader.get_data())
        return tuple(docs)
    finally:
        loader.dispose()


def load_yaml_document(env: str, rel: str, text: str) -> Any:
    """The one YAML document of `text` (file `rel`), read strictly."""
    try:
        docs = _documents(text)
    except _Refused as err:
        raise ConfigError(env, f"{rel}: line {err.line}", err.value, err.allowed) from None
    except yaml.reader.ReaderError as err:
        line = text[:err.position].count("\n") + 1
        raise ConfigError(env, f"{rel}: line {line}", chr(err.character) if isinstance(
            err.character, int) else err.character, "printable text (YAML allows no control "
            "characters)") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"{rel}: line {mark.line + 1}, column {mark.column + 1}" if mark else rel
        problem = getattr(err, "problem", None) or type(err).__name__
        context = getattr(err, "context", None)
        raise ConfigError(env, where, problem, "well-formed YAML" + (
            f" ({context} there; check the indentation and quotes)" if context
            else " (check the indentation and quotes there)")) from None
    except RecursionError:
        raise ConfigError(env, rel, "YAML nested too deep", "an endpoint file as HyperPod "
                          "writes it") from None
    except ValueError as err:   # a value Python cannot hold: a 5,000-digit integer, 2024-13-45
        raise ConfigError(env, rel, f"an unreadable value: {err}", "an endpoint file as "
                          "HyperPod writes it") from None
    if not docs:
        raise ConfigError(env, rel, "an empty file", "one YAML document")
    return copy.deepcopy(docs[0])


def load_json_object(env: str, rel: str, text: str) -> Any:
    """`text` (file `rel`, or the CLI's context) as JSON: each key once, finite numbers."""
    def pairs(items: list[tuple[str, Any]]) -> dict:
        out: dict[str, Any] = {}
        for key, value in items:
            if key in out:
                raise _Refused(0, key, "each key once per object (the last would silently win)")
            for text in (key, value, *(value if isinstance(value, list) else ())):
                if isinstance(text, str):
                    _check_text(text, 0)
            out[key] = value
        return out

    def constant(name: str) -> Any:
        raise _Refused(0, name, "finite numbers (JSON has no NaN or Infinity)")

    try:
        return json.loads(text, object_pairs_hook=pairs, parse_constant=constant)
    except _Refused as err:
        raise ConfigError(env, rel, err.value, err.allowed) from None
    except json.JSONDecodeError as err:
        raise ConfigError(env, f"{rel}: line {err.lineno}", f"malformed JSON: {err.msg}",
                          "a JSON object") from None
    except RecursionError:
        raise ConfigError(env, rel, "JSON nested too deep", "a JSON object") from None
