"""Registries and OCI image layouts as the mirror uses them: skopeo with one run's settings,
Helm charts laid out as `helm push` uploads them, and the report table both the direct mirror
and the import print. Below tools/mirror.py and tools/carry.py, which both use it."""
from __future__ import annotations

import hashlib
import io
import json
import re
import subprocess
import tarfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from config.arguments import ToolError, out_console

_NOT_FOUND = ("manifest unknown", "name unknown", "not found", "does not exist")
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
HELM_CONFIG = "application/vnd.cncf.helm.config.v1+json"
HELM_CHART = "application/vnd.cncf.helm.chart.content.v1.tar+gzip"


class SkopeoError(Exception):
    pass


@dataclass(frozen=True)
class Skopeo:
    """The skopeo binary with the source and destination settings of one run."""

    binary: str = "skopeo"
    src_tls_verify: bool = True
    dest_tls_verify: bool = True
    src_authfile: str | None = None
    dest_authfile: str | None = None
    timeout_s: float = 3600.0

    def _run(self, args: Sequence[str]) -> bytes:
        try:
            proc = subprocess.run([self.binary, *args], capture_output=True,
                                  timeout=self.timeout_s, check=False)
        except FileNotFoundError:
            raise ToolError(f"{self.binary} not found: install skopeo (Debian: apt-get install "
                            "skopeo)", exit_code=2) from None
        except subprocess.TimeoutExpired:
            raise SkopeoError(f"skopeo {args[0]} timed out after {self.timeout_s:.0f}s")
        if proc.returncode != 0:
            raise SkopeoError(_last_line(proc.stderr.decode(errors="replace")))
        return proc.stdout

    def manifest(self, ref: str, *, dest: bool) -> bytes | None:
        """The raw manifest (the index, for a multi-arch image) `ref` names; None when the
        registry does not have it."""
        tls = self.dest_tls_verify if dest else self.src_tls_verify
        auth = self.dest_authfile if dest else self.src_authfile
        args = ["inspect", "--raw", f"--tls-verify={str(tls).lower()}"]
        if auth:
            args += ["--authfile", auth]
        try:
            return self._run([*args, f"docker://{ref}"])
        except SkopeoError as err:
            if any(s in str(err).lower() for s in _NOT_FOUND):
                return None
            raise

    def digest(self, ref: str, *, dest: bool) -> str | None:
        raw = self.manifest(ref, dest=dest)
        return None if raw is None else "sha256:" + hashlib.sha256(raw).hexdigest()

    def check_digest(self, dest: str, expected: str) -> None:
        """After a push: the destination registry's manifest is the one pushed, or SkopeoError."""
        after = self.digest(dest, dest=True)
        if after != expected:
            raise SkopeoError(f"{dest} has digest {after} after the push, not {expected}")

    def copy(self, src: str, dest: str) -> None:
        """`src` and `dest` with their transport (`docker://`, `oci:`)."""
        args = ["copy", "--all", "--preserve-digests", "--retry-times", "3", "--quiet",
                f"--src-tls-verify={str(self.src_tls_verify).lower()}",
                f"--dest-tls-verify={str(self.dest_tls_verify).lower()}"]
        if self.src_authfile:
            args += ["--src-authfile", self.src_authfile]
        if self.dest_authfile:
            args += ["--dest-authfile", self.dest_authfile]
        self._run([*args, src, dest])


    def copy_platform(self, src: str, dest: str, arch: str = "amd64") -> None:
        """One platform of `src` (linux/`arch`), e.g. into an `oci:` layout to read its files."""
        args = ["copy", "--override-os", "linux", "--override-arch", arch, "--retry-times",
                "3", "--quiet", f"--src-tls-verify={str(self.src_tls_verify).lower()}"]
        if self.src_authfile:
            args += ["--src-authfile", self.src_authfile]
        self._run([*args, src, dest])


def _last_line(text: str) -> str:
    """skopeo's last log line, its message only: `level=fatal msg="Error parsing image name
    \"docker://x\": pinging ..."` -> `pinging ...`."""
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    line = lines[-1] if lines else "skopeo failed"
    if 'msg="' in line:
        line = line.split('msg="', 1)[1].rstrip('"').replace('\\"', '"')
    return re.sub(r'^Error parsing image name "[^"]*": ', "", line)


# --------------------------------------------------------------------------- charts


@dataclass(frozen=True)
class ChartRef:
    """A chart of the catalogue, read from whatever shape `CHARTS` entries have."""

    key: str
    repository: str   # oci://host/path or https://... Helm repository
    name: str
    version: str
    digest: str | None
    mirror_repository: str

    @classmethod
    def of(cls, key: str, entry: Any) -> "ChartRef":
        def get(*names: str, default: Any = None) -> Any:
            for n in names:
                value = entry.get(n) if isinstance(entry, Mapping) else getattr(entry, n, None)
                if value is not None:
                    return value
            return default

        name = get("chart", "name")
        repository, version = get("repository", "repo", "url"), get("version")
        if not (name and repository and version):
            raise ToolError.bad_input(f"CHARTS[{key!r}]", entry,
                                      "an entry with repository, chart (or name) and version")
        from config.images import MIRROR_PREFIX
        return cls(key, str(repository).rstrip("/"), str(name), str(version),
                   get("digest"), get("mirror_repository",
                                      default=f"{MIRROR_PREFIX}/charts/{name}"))


def catalogue_charts() -> list[ChartRef]:
    """`config.images.CHARTS` if the catalogue has one (a dict by key, or a sequence)."""
    import config.images as images

    charts = getattr(images, "CHARTS", None) or {}
    items = charts.items() if isinstance(charts, Mapping) else (
        (getattr(c, "key", None) or getattr(c, "name", str(i)), c) for i, c in enumerate(charts))
    return [ChartRef.of(str(k), v) for k, v in items]


def write_oci_layout(root: Path, manifests: Sequence[tuple[str, bytes, dict]]) -> None:
    """An OCI image layout (`oci:` for skopeo) holding blobs and tagged top-level manifests.

    `manifests`: (tag, manifest bytes, descriptor fields such as mediaType); blobs the
    manifests refer to are written with `write_blob` first.
    """
    (root / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
    index = []
    for tag, body, extra in manifests:
        desc = write_blob(root, body)
        index.append({**desc, **extra,
                      "annotations": {"org.opencontainers.image.ref.name": tag}})
    (root / "index.json").write_text(json.dumps({"schemaVersion": 2, "manifests": index}))


def write_blob(root: Path, data: bytes, media_type: str | None = None) -> dict:
    digest = hashlib.sha256(data).hexdigest()
    blobs = root / "blobs" / "sha256"
    blobs.mkdir(parents=True, exist_ok=True)
    (blobs / digest).write_bytes(data)
    desc = {"digest": f"sha256:{digest}", "size": len(data)}
    return {"mediaType": media_type, **desc} if media_type else desc


def helm_chart_layout(root: Path, chart_tgz: bytes) -> str:
    """The OCI layout `helm push` would upload for `chart_tgz`; returns the tag (version)."""
    meta = _chart_yaml(chart_tgz)
    config = write_blob(root, json.dumps(meta, sort_keys=True).encode(), HELM_CONFIG)
    layer = write_blob(root, chart_tgz, HELM_CHART)
    manifest = json.dumps({
        "schemaVersion": 2, "mediaType": OCI_MANIFEST, "config": config, "layers": [layer],
        "annotations": {"org.opencontainers.image.title": meta["name"],
                        "org.opencontainers.image.version": meta["version"]}}).encode()
    write_oci_layout(root, [(meta["version"], manifest, {"mediaType": OCI_MANIFEST})])
    return meta["version"]


def _chart_yaml(chart_tgz: bytes) -> dict:
    import yaml

    with tarfile.open(fileobj=io.BytesIO(chart_tgz), mode="r:gz") as tar:
        for member in tar.getmembers():
            if member.name.count("/") == 1 and member.name.endswith("/Chart.yaml"):
                return yaml.safe_load(tar.extractfile(member).read())
    raise SkopeoError("the chart archive has no Chart.yaml")


def fetch_https_chart(chart: ChartRef, timeout: float = 60.0) -> tuple[bytes, str]:
    """The chart archive from an HTTPS Helm repository, checked against the pinned digest or
    else the repository index's."""
    import yaml

    index = yaml.safe_load(_get(f"{chart.repository}/index.yaml", timeout).content)
    entry = next((e for e in index.get("entries", {}).get(chart.name, [])
                  if str(e.get("version")) == chart.version), None)
    if entry is None:
        raise SkopeoError(f"{chart.repository} has no {chart.name} {chart.version}")
    url = entry["urls"][0]
    if "://" not in url:
        url = f"{chart.repository}/{url}"
    data = _get(url, timeout).content
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    expected = chart.digest or (f"sha256:{entry['digest']}" if entry.get("digest") else None)
    if expected and digest != expected:
        raise SkopeoError(f"{url}: sha256 {digest} differs from the pinned {expected}")
    return data, digest


def _get(url: str, timeout: float):
    """GET `url`; one line (a SkopeoError, the row's note) where it cannot be reached, as
    behind a proxy or air-gapped, never a traceback."""
    import requests

    try:
        resp = requests.get(url, timeout=timeout)
    except requests.RequestException as err:
        reason = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise SkopeoError(f"GET {url}: unreachable ({type(err).__name__}: "
                          f"{reason[:160]})") from None
    if resp.status_code != 200:
        raise SkopeoError(f"GET {url}: HTTP {resp.status_code}")
    return resp


# --------------------------------------------------------------------------- report


@dataclass
class Row:
    kind: str        # image | chart
    key: str
    source: str
    dest: str
    digest: str | None = None
    action: str = ""  # present | copied | built | would copy | would build | resolved | failed
    note: str = ""
    unpinned: bool = False
    built_layers: str = ""   # an image we build: what to pin beside its digest


@dataclass
class MirrorReport:
    rows: list[Row] = field(default_factory=list)

    @property
    def failed(self) -> list[Row]:
        return [r for r in self.rows if r.action == "failed"]

    @property
    def copied(self) -> list[Row]:
        return [r for r in self.rows if r.action == "copied"]


def print_report(report: MirrorReport) -> int:
    from rich.table import Table

    table = Table("kind", "key", "action", "digest", "destination / note")
    for r in report.rows:
        table.add_row(r.kind, r.key, r.action, (r.digest or "-")[:19],
                      r.note or r.dest or r.source)
    out_console.print(table)
    for r in report.rows:
        if r.unpinned and r.digest:
            out_console.print(f"pin {r.key}: digest=\"{r.digest}\"  ({r.source}; paste into "
                              "config/images.py)")
            if r.built_layers:
                out_console.print(f"pin {r.key}: {r.built_layers}", soft_wrap=True)
    if report.failed:
        first = report.failed[0]
        raise ToolError(f"{len(report.failed)} of {len(report.rows)} not mirrored "
                        f"({first.key}: {first.note})")
    return 0

