"""A model from a hub, for upload-model: ModelScope (`modelscope:ORG/NAME`, reachable from AWS
China) or the Hugging Face Hub (`hf:ORG/NAME`, global regions), at a pinned revision.

The file list (with sizes, and sha256 where the hub records one) comes from the hub's API, so a
dry run needs neither the weights nor AWS credentials. The download goes through the hub's own
SDK into a local directory that is kept: a run cut short resumes there (the SDKs skip files
already complete), and upload-model's S3 upload resumes by checksum. Every file is checked
against the size the hub lists and against the sha256 the hub lists or the user gives.
"""
from __future__ import annotations

import fnmatch
import hashlib
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, Sequence

from config.arguments import ToolError

HUBS = {"modelscope": "ModelScope", "hf": "Hugging Face"}
_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*")
_FLOATING = {"", "master", "main", "HEAD"}


@dataclass(frozen=True)
class HubFile:
    path: str
    size: int
    sha256: str | None


@dataclass(frozen=True)
class HubModel:
    hub: str            # modelscope | hf
    repo: str           # ORG/NAME
    revision: str
    endpoint: str | None = None   # the hub's API (tests: a fake on 127.0.0.1)
    include: tuple[str, ...] = ()  # glob patterns of the files to take (default: all)

    @classmethod
    def parse(cls, source: str, revision: str | None, endpoint: str | None = None,
              include: Sequence[str] = ()) -> "HubModel | None":
        """`modelscope:ORG/NAME` or `hf:ORG/NAME`; None for anything else (a local path)."""
        hub, sep, repo = source.partition(":")
        if not sep or hub not in HUBS:
            return None
        if not _ID.fullmatch(repo):
            raise ToolError.bad_input("model", source, f"{hub}:ORG/NAME")
        revision = (revision or "").strip()
        if revision in _FLOATING:
            raise ToolError.bad_input("--revision", revision or None, "a tag or commit of "
                                      f"{repo} (a branch moves: the upload must be repeatable)")
        if hub == "hf" and not re.fullmatch(r"[0-9a-f]{40}", revision):
            raise ToolError.bad_input("--revision", revision, "the 40-hex commit of "
                                      f"{repo} on the Hugging Face Hub")
        return cls(hub, repo, revision, endpoint, tuple(include))

    @property
    def name(self) -> str:
        return f"{self.hub}:{self.repo}@{self.revision}"

    def wanted(self, path: str) -> bool:
        return not self.include or any(fnmatch.fnmatch(path, p) for p in self.include)

    # ------------------------------------------------------------------ the hub's API

    def files(self, token: str | None = None) -> list[HubFile]:
        """The revision's files (those `include` picks), from the hub's file list."""
        if self.hub == "modelscope":
            from modelscope_hub.api import HubApi

            listed = [HubFile(f.path, int(f.size or 0), f.sha256)
                      for f in HubApi(endpoint=self.endpoint, token=token).list_repo_files(
                          self.repo, "model", revision=self.revision) if f.type != "tree"]
        else:
            from huggingface_hub import HfApi
            from huggingface_hub.hf_api import RepoFile

            listed = [HubFile(f.path, int(f.size or 0), f.lfs.sha256 if f.lfs else None)
                      for f in HfApi(endpoint=self.endpoint, token=token).list_repo_tree(
                          self.repo, revision=self.revision, recursive=True)
                      if isinstance(f, RepoFile)]
        return sorted((f for f in listed if self.wanted(f.path)), key=lambda f: f.path)

    def download(self, dest: Path, token: str | None = None) -> Path:
        """Downloads into `dest` (kept, so a second run resumes); returns it."""
        dest.mkdir(parents=True, exist_ok=True)
        patterns = list(self.include) or None
        try:
            if self.hub == "modelscope":
                from modelscope.hub.snapshot_download import snapshot_download

                snapshot_download(self.repo, revision=self.revision, local_dir=str(dest),
                                  allow_patterns=patterns, endpoint=self.endpoint, token=token)
            else:
                from huggingface_hub import snapshot_download

                snapshot_download(self.repo, revision=self.revision, local_dir=str(dest),
                                  allow_patterns=patterns, endpoint=self.endpoint, token=token)
        except KeyboardInterrupt:
            raise
        except Exception as err:   # the SDKs' own errors: one line, never the token
            first = (str(err).strip().splitlines() or [""])[0]
            raise ToolError(f"download of {self.name} failed: {type(err).__name__}: "
                            f"{first[:300]}; run the same command again to resume") from None
        return dest


def parse_hashes(items: Sequence[str], hash_file: Path | None) -> dict[str, str]:
    """`--sha256 PATH=HEX` and a `sha256sum`-style file (`HEX  PATH` lines), by path."""
    out: dict[str, str] = {}
    lines = [("--sha256", i) for i in items]
    if hash_file is not None:
        try:
            text = hash_file.read_text()
        except OSError as err:
            raise ToolError.bad_input("--hashes", str(hash_file), f"a readable file ({err})")
        for line in text.splitlines():
            if line.strip() and not line.startswith("#"):
                hexa, _, path = line.strip().partition(" ")
                lines.append((str(hash_file), f"{path.strip().lstrip('*')}={hexa}"))
    for where, item in lines:
        path, _, hexa = item.partition("=")
        if not path or not re.fullmatch(r"[0-9a-fA-F]{64}", hexa):
            raise ToolError.bad_input(where, item, "PATH=<64 hex sha256> (or `HEX  PATH` lines)")
        out[path] = hexa.lower()
    return out


def verify(root: Path, listed: Sequence[HubFile], given: Mapping[str, str],
           on_bytes: Callable[[int], None] | None = None) -> int:
    """Every listed file is in `root` with its size and, where the hub or the user gives one,
    its sha256; returns how many were hashed. A difference is one line naming the file."""
    by_path = {f.path: f for f in listed}
    unknown = sorted(set(given) - set(by_path))
    if unknown:
        raise ToolError.bad_input("--sha256", unknown[0], sorted(by_path))
    hashed = 0
    for f in listed:
        path = root / f.path
        if not path.is_file():
            raise ToolError(f"{f.path}: listed by the hub but not downloaded; run again")
        if path.stat().st_size != f.size:
            raise ToolError(f"{f.path}: {path.stat().st_size} bytes, the hub lists {f.size}: "
                            f"delete {path} and run again")
        want = given.get(f.path) or f.sha256
        if not want:
            continue
        h = hashlib.sha256()
        with open(path, "rb") as fh:
            while block := fh.read(8 << 20):
                h.update(block)
                if on_bytes:
                    on_bytes(len(block))
        if h.hexdigest() != want.lower():
            whose = "you gave" if f.path in given else "the hub lists"
            raise ToolError(f"{f.path}: sha256 {h.hexdigest()}, {whose} {want}: not uploaded "
                            f"(delete {path} and run again)")
        hashed += 1
    return hashed


def hf_token(secret_id: str | None, client: Callable[[str], object] | None) -> str | None:
    """The Hugging Face token: a Secrets Manager secret when named, else $HF_TOKEN. Returned,
    never printed."""
    if secret_id:
        assert client is not None
        value = client("secretsmanager").get_secret_value(SecretId=secret_id)
        token = value.get("SecretString") or ""
        if not token.strip():
            raise ToolError.bad_input("--hf-token-secret", secret_id, "a secret holding a token "
                                      "as its string value")
        return token.strip()
    return os.environ.get("HF_TOKEN") or None
