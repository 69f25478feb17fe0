"""The vLLM/LMCache pair a worker image carries, read from the image itself: the `Version:` of
`vllm-*.dist-info/METADATA` and `lmcache-*.dist-info/METADATA` under any site-packages or
dist-packages in its layers, as the container would see its filesystem (the newest layer that
has the file wins; a whiteout, `.wh.<name>` or an opaque `.wh..wh..opq`, hides what lower layers
hold). Layers are streamed, only the METADATA files are read; nothing is extracted to disk.

`python -m tools mirror` runs it on the worker images whose pair neither the catalogue nor
images.lock.json knows, and records pair and digest there (config/images.py IMAGES_LOCK), which
the next synth's L2 verdict uses.
"""
from __future__ import annotations

import json
import re
import tarfile
from dataclasses import dataclass
from email.parser import HeaderParser
from pathlib import Path

import config.images
from config.images import load_lock

PACKAGES = ("vllm", "lmcache")
_METADATA = re.compile(r"(?:^|/)(?:site|dist)-packages/(vllm|lmcache)-[^/]+\.dist-info/METADATA$")
_WHITEOUT, _OPAQUE = ".wh.", ".wh..wh..opq"


@dataclass(frozen=True)
class Pair:
    vllm: str | None      # the METADATA's Version, as written (0.11.0, 0.3.9.post1)
    lmcache: str | None


def _blob(layout: Path, digest: str) -> Path:
    algorithm, _, hexdigest = digest.partition(":")
    return layout / "blobs" / algorithm / hexdigest


def _manifest(layout: Path, descriptor: dict, arch: str) -> dict:
    """The image manifest a descriptor leads to: an index's entry for linux/`arch`."""
    body = json.loads(_blob(layout, descriptor["digest"]).read_bytes())
    if "manifests" in body:
        wanted = [m for m in body["manifests"] if m.get("platform", {}).get("os") == "linux"
                  and m.get("platform", {}).get("architecture") == arch]
        if not wanted:
            raise ValueError(f"no linux/{arch} image in the index")
        return _manifest(layout, wanted[0], arch)
    return body


def _hidden(path: str, hidden: set[str], opaque: set[str]) -> bool:
    parts = path.split("/")
    prefixes = {"/".join(parts[:i]) for i in range(1, len(parts) + 1)}
    return bool(prefixes & hidden) or any(path.startswith(d + "/") for d in opaque)


def read_pair(layout: Path, arch: str = "amd64") -> Pair:
    """The pair in the single image an OCI layout holds (its index's first manifest)."""
    index = json.loads((layout / "index.json").read_text())
    layers = _manifest(layout, index["manifests"][0], arch)["layers"]
    found: dict[str, str] = {}
    hidden: set[str] = set()    # paths whiteouts of the layers above removed
    opaque: set[str] = set()    # directories whose lower content the layers above replaced
    for layer in reversed(layers):          # newest first
        here_hidden, here_opaque = set(), set()
        with tarfile.open(_blob(layout, layer["digest"]), mode="r|*") as tar:
            for member in tar:
                name = member.name.removeprefix("./").lstrip("/")
                head, _, base = name.rpartition("/")
                if base == _OPAQUE:
                    here_opaque.add(head)
                elif base.startswith(_WHITEOUT):
                    here_hidden.add(f"{head}/{base[len(_WHITEOUT):]}".lstrip("/"))
                elif member.isfile() and (m := _METADATA.search(name)) and \
                        m[1] not in found and not _hidden(name, hidden, opaque):
                    text = tar.extractfile(member).read().decode("utf-8", "replace")
                    version = HeaderParser().parsestr(text).get("Version")
                    if version:
                        found[m[1]] = version.strip()
        hidden |= here_hidden
        opaque |= here_opaque
        if len(found) == len(PACKAGES):
            break
    return Pair(found.get("vllm"), found.get("lmcache"))


def record_pair(reference: str, digest: str, pair: Pair, how: str,
                path: Path | None = None) -> None:
    """Write (or replace) `reference`'s entry in images.lock.json, then check the file reads."""
    path = path or config.images.IMAGES_LOCK
    data = json.loads(path.read_text()) if path.exists() else {}
    data[reference] = {"digest": digest, "vllm": pair.vllm, "lmcache": pair.lmcache, "read": how}
    path.write_text(json.dumps(dict(sorted(data.items())), indent=2) + "\n")
    load_lock(path)
