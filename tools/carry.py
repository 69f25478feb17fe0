"""The mirror carried as files: `mirror --export DIR` outside China with no AWS credentials,
`mirror --import DIR` inside China with only the account's own ECR (and STS) reachable.

    DIR/manifest.json                 what was exported: one entry per artifact (below)
    DIR/oci/<ECR repository>/<tag>/   one OCI image layout per image or chart, tagged <tag>

Each image is written with `skopeo copy --all --preserve-digests`, every platform it has, so
the layout's top manifest has the digest the catalogue pins; the router image is built into its
layout from its lock (tools/image_build.py); an HTTPS Helm chart is laid out the way `helm push`
uploads it. A manifest entry names the artifact's source, digest, size (the bytes of its blobs)
and the ECR repository and tag it goes to.

Both directions resume and trust nothing they did not check: export skips an artifact whose
layout already holds the pinned digest and every blob it names with the right sha256 (a bad or
missing blob is fetched again), import checks the same before pushing and refuses the artifact
naming the blob that differs, and pushes only what ECR lacks (skopeo skips blobs already there).
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

from config.arguments import ToolError, err_console, out_console
from tools.cli import human_size, transfer_estimate
from tools.oci import (
    ChartRef, MirrorReport, Row, Skopeo, SkopeoError, fetch_https_chart, helm_chart_layout,
)

FORMAT = "kvcache-eks-mirror-export/1"
MANIFEST = "manifest.json"
_REF = "org.opencontainers.image.ref.name"
_BLOCK = 8 << 20


class CorruptArtifact(SkopeoError):
    """A layout's blob is missing or differs from the digest that names it (`path`)."""

    def __init__(self, message: str, path: Path | None = None) -> None:
        super().__init__(message)
        self.path = path


@dataclass(frozen=True)
class Artifact:
    kind: str          # image | chart
    key: str           # catalogue key
    source: str        # where export read it (registry ref, chart repository, or the build)
    digest: str        # of the top manifest (the index for a multi-platform image)
    size: int          # bytes of its distinct blobs, manifests included
    repository: str    # the ECR repository it goes to
    tag: str

    @property
    def path(self) -> str:
        return f"oci/{self.repository}/{self.tag}"


# --------------------------------------------------------------------------- layouts


def blob_path(layout: Path, digest: str) -> Path:
    algo, _, hexa = digest.partition(":")
    if algo != "sha256" or not re.fullmatch(r"[0-9a-f]{64}", hexa):
        raise CorruptArtifact(f"{layout}: {digest!r} is not a sha256 digest")
    return layout / "blobs" / "sha256" / hexa


def tagged(layout: Path, tag: str) -> dict | None:
    """The descriptor index.json gives `tag`, or None."""
    try:
        index = json.loads((layout / "index.json").read_text())
    except (OSError, ValueError):
        return None
    return next((m for m in index.get("manifests", [])
                 if m.get("annotations", {}).get(_REF) == tag), None)


def verify_layout(layout: Path, tag: str, digest: str | None = None,
                  on_bytes: Callable[[int], None] | None = None) -> tuple[str, int]:
    """Checks that `tag` in `layout` is `digest` (when given) and that every blob it reaches
    exists with its size and sha256; returns (digest, bytes of the distinct blobs). Raises
    CorruptArtifact naming the first blob that is missing or differs."""
    top = tagged(layout, tag)
    if top is None:
        raise CorruptArtifact(f"{layout}: no {tag!r} in index.json")
    if digest and top["digest"] != digest:
        raise CorruptArtifact(f"{layout}: {tag} is {top['digest']}, the manifest says {digest}")
    seen: dict[str, int] = {}

    def walk(desc: Mapping) -> None:
        d = desc["digest"]
        if d in seen:
            return
        path = blob_path(layout, d)
        data = _checked(path, d, desc.get("size"), on_bytes)
        seen[d] = path.stat().st_size
        if data is None:
            return
        body = json.loads(data)
        for child in body.get("manifests", []):
            walk(child)
        if "config" in body:
            walk(body["config"])
        for layer in body.get("layers", []):
            walk(layer)

    walk(top)
    return top["digest"], sum(seen.values())


def _checked(path: Path, digest: str, size: int | None,
             on_bytes: Callable[[int], None] | None) -> bytes | None:
    """Hashes the blob at `path`; returns its bytes when it is a manifest or an index (JSON
    naming other blobs), None for a config or a layer."""
    try:
        actual_size = path.stat().st_size
    except OSError:
        raise CorruptArtifact(f"blob {path} is missing", path) from None
    if size is not None and actual_size != size:
        raise CorruptArtifact(f"blob {path} has {actual_size} bytes, its descriptor says {size}",
                              path)
    h, head = hashlib.sha256(), b""
    with open(path, "rb") as fh:
        while block := fh.read(_BLOCK):
            h.update(block)
            if len(head) < (4 << 20):
                head += block
            if on_bytes:
                on_bytes(len(block))
    if "sha256:" + h.hexdigest() != digest:
        raise CorruptArtifact(f"blob {path} does not have sha256 {digest}: corrupted in carrying? "
                              "export it again or copy that file again", path)
    if actual_size <= (4 << 20) and head[:1] == b"{":
        try:
            body = json.loads(head)
        except ValueError:
            return None
        return head if isinstance(body, dict) and ("layers" in body or "manifests" in body) \
            else None
    return None


def read_manifest(root: Path) -> dict[str, Artifact]:
    """The export's manifest by `repository:tag`; empty where there is none yet."""
    try:
        data = json.loads((root / MANIFEST).read_text())
    except FileNotFoundError:
        return {}
    except ValueError as err:
        raise ToolError.bad_input(str(root / MANIFEST), str(err), "the JSON mirror --export wrote")
    if data.get("format") != FORMAT:
        raise ToolError.bad_input(f"{root / MANIFEST}: format", data.get("format"), FORMAT)
    fields = set(Artifact.__dataclass_fields__)
    out = {}
    for entry in data.get("artifacts", []):
        if not isinstance(entry, dict) or set(entry) - {"path"} != fields:
            raise ToolError.bad_input(f"{root / MANIFEST}: artifact", entry,
                                      f"an object with {', '.join(sorted(fields))}")
        a = Artifact(**{k: entry[k] for k in fields})
        out[f"{a.repository}:{a.tag}"] = a
    return out


def write_manifest(root: Path, environment: str, artifacts: Iterable[Artifact]) -> None:
    """Written whole, then renamed: an interrupted export never leaves half a manifest."""
    body = {"format": FORMAT, "environment": environment, "artifacts": [
        {**asdict(a), "path": a.path} for a in sorted(artifacts, key=lambda a: a.path)]}
    tmp = root / f".{MANIFEST}.tmp"
    tmp.write_text(json.dumps(body, indent=1) + "\n")
    os.replace(tmp, root / MANIFEST)


# --------------------------------------------------------------------------- plan (sizes)


@dataclass
class Planned:
    kind: str
    key: str
    source: str
    repository: str
    tag: str
    digest: str | None
    size: int | None
    note: str = ""


def registry_size(skopeo: Skopeo, repository: str, digest: str) -> int:
    """Bytes of the distinct blobs `repository@digest` names, every platform, read from the
    registry's manifests (no blob is fetched, no credentials are needed for a public image)."""
    seen: dict[str, int] = {}

    def walk(ref_digest: str, raw: bytes) -> None:
        seen[ref_digest] = len(raw)
        body = json.loads(raw)
        for child in body.get("manifests", []):
            if child["digest"] not in seen:
                sub = skopeo.manifest(f"{repository}@{child['digest']}", dest=False)
                if sub is None:
                    raise SkopeoError(f"{repository}@{child['digest']} not found upstream")
                walk(child["digest"], sub)
        for blob in ([body["config"]] if "config" in body else []) + body.get("layers", []):
            seen[blob["digest"]] = int(blob.get("size", 0))

    raw = skopeo.manifest(f"{repository}@{digest}", dest=False)
    if raw is None:
        raise SkopeoError(f"{repository}@{digest} not found upstream")
    walk(digest, raw)
    return sum(seen.values())


def plan(skopeo: Skopeo, images: Sequence[Any], charts: Sequence[ChartRef], jobs: int = 4
         ) -> list[Planned]:
    """Every artifact of an export with its digest and size, from the registries' manifests
    and the chart repositories' archives; nothing is written."""
    import config.images as catalogue

    def one_image(image: Any) -> Planned:
        p = Planned("image", image.key, f"{image.source}:{image.tag}", image.mirror_repository,
                    image.tag, image.digest, None)
        try:
            if image.built_from:
                base = catalogue.IMAGES[image.built_from]
                p.source = f"built from {image.built_from} and images/router/lock.json"
                p.size = registry_size(skopeo, base.source, base.digest)
                p.note = "the base's size; the pinned wheels and packages add a few tens of MB"
                return p
            if p.digest is None:
                p.digest = skopeo.digest(f"{image.source}:{image.tag}", dest=False)
                if p.digest is None:
                    raise SkopeoError(f"{image.source}:{image.tag} not found upstream")
                p.note = "pinned by tag only: the digest it has now"
            p.size = registry_size(skopeo, image.source, p.digest)
        except SkopeoError as err:
            p.note = f"failed: {err}"
        return p

    def one_chart(chart: ChartRef) -> Planned:
        p = Planned("chart", chart.key, f"{chart.repository}/{chart.name}:{chart.version}",
                    chart.mirror_repository, chart.version, chart.digest, None)
        try:
            if chart.repository.startswith("oci://"):
                src = f"{chart.repository.removeprefix('oci://')}/{chart.name}"
                p.digest = p.digest or skopeo.digest(f"{src}:{chart.version}", dest=False)
                if p.digest is None:
                    raise SkopeoError(f"{src}:{chart.version} not found upstream")
                p.size = registry_size(skopeo, src, p.digest)
            else:
                data, p.digest = fetch_https_chart(chart)
                p.size = len(data)
                p.note = "digest of the chart archive"
        except SkopeoError as err:
            p.note = f"failed: {err}"
        return p

    with ThreadPoolExecutor(max(1, jobs)) as pool:
        return list(pool.map(one_image, images)) + list(pool.map(one_chart, charts))


def print_plan(planned: Sequence[Planned], rate: float | None, what: str) -> int:
    """One line per artifact, never cut to the terminal's width: a list to read and to keep."""
    width = max((len(p.key) for p in planned), default=0)
    for p in planned:
        size = "?" if p.size is None else human_size(p.size)
        out_console.print(f"{p.kind:5}  {p.key:{width}}  {size:>10}  {p.repository}:{p.tag}  "
                          f"<- {p.source}" + (f"  ({p.note})" if p.note else ""), soft_wrap=True)
    total = sum(p.size or 0 for p in planned)
    out_console.print(f"{what}: {len(planned)} artifacts, {human_size(total)}"
                      + (f", {transfer_estimate(total, rate)}" if rate else ""))
    failed = [p for p in planned if p.note.startswith("failed")]
    if failed:
        raise ToolError(f"{len(failed)} of {len(planned)} not sized ({failed[0].key}: "
                        f"{failed[0].note})")
    return 0


def run_all(work: Sequence[Any], one: Callable[[Any], Row], sizes: Sequence[int], jobs: int,
            what: str, progress: bool = True) -> MirrorReport:
    """`one` over `work` on `jobs` threads, with a bar of the bytes done (an artifact counts
    when it is done: skopeo copies quietly)."""
    from rich.progress import (
        BarColumn, DownloadColumn, Progress, TextColumn, TimeElapsedColumn,
    )

    with Progress(TextColumn(what), BarColumn(), DownloadColumn(), TimeElapsedColumn(),
                  console=err_console, disable=not progress) as bar:
        task = bar.add_task(what, total=sum(sizes) or None)

        def step(item: tuple[Any, int]) -> Row:
            row = one(item[0])
            bar.advance(task, item[1])
            return row

        with ThreadPoolExecutor(max(1, jobs)) as pool:
            return MirrorReport(list(pool.map(step, zip(work, sizes))))


# --------------------------------------------------------------------------- export


class Exporter:
    """Writes the artifacts into `root`; `builders` build the images we build (as Mirror's)."""

    def __init__(self, skopeo: Skopeo, root: Path, environment: str, *, jobs: int = 2,
                 builders: Mapping[str, Callable[[Path], Any]] | None = None) -> None:
        self.skopeo, self.root, self.environment, self.jobs = skopeo, root, environment, jobs
        self.builders = dict(builders or {})
        self._done: dict[str, Artifact] = {}
        self._lock = threading.Lock()

    def run(self, planned: Sequence[Planned], images: Mapping[str, Any],
            charts: Mapping[str, ChartRef]) -> MirrorReport:
        self.root.mkdir(parents=True, exist_ok=True)
        self._done = read_manifest(self.root)
        if self._done:
            held = json.loads((self.root / MANIFEST).read_text()).get("environment")
            if held != self.environment:
                raise ToolError.bad_input(f"{self.root}: environment", held,
                                          f"{self.environment} (an empty directory, or one "
                                          f"this environment's export wrote)")

        def one(p: Planned) -> Row:
            row = Row(p.kind, p.key, p.source, str(self.root / f"oci/{p.repository}/{p.tag}"),
                      p.digest)
            try:
                artifact, row.action = (self._image(p, images[p.key]) if p.kind == "image"
                                        else self._chart(p, charts[p.key]))
                row.digest = artifact.digest
            except SkopeoError as err:
                row.action, row.note = "failed", str(err)
            return row

        return run_all(planned, one, [p.size or 0 for p in planned], self.jobs, "export")

    def _record(self, a: Artifact, action: str) -> tuple[Artifact, str]:
        with self._lock:
            self._done[f"{a.repository}:{a.tag}"] = a
            write_manifest(self.root, self.environment, self._done.values())
        return a, action

    def _held(self, p: Planned, layout: Path, digest: str | None) -> Artifact | None:
        """What `layout` already holds, checked; None (and the bad blob gone) otherwise."""
        if not (layout / "index.json").exists():
            return None
        try:
            found, size = verify_layout(layout, p.tag, digest)
        except CorruptArtifact as err:
            err_console.print(f"{p.key}: {err}; fetching it again")
            if err.path is not None:
                err.path.unlink(missing_ok=True)
            return None
        return Artifact(p.kind, p.key, p.source, found, size, p.repository, p.tag)

    def _image(self, p: Planned, image: Any) -> tuple[Artifact, str]:
        layout = self.root / "oci" / p.repository / p.tag
        if image.built_from:
            recorded = self._done.get(f"{p.repository}:{p.tag}")
            pinned = image.digest or (recorded.digest if recorded else None)
            if pinned and (held := self._held(p, layout, pinned)):
                return self._record(held, "present")
            if image.key not in self.builders:
                raise SkopeoError(f"no build for {image.key}")
            from tools.image_build import BuildError, pin_mismatch
            shutil.rmtree(layout, ignore_errors=True)
            try:
                built = self.builders[image.key](layout)
            except BuildError as err:
                raise SkopeoError(str(err)) from None
            if image.digest and built.digest != image.digest:
                pinned_layers = image.built_layers
                raise SkopeoError(pin_mismatch(built, image.digest, pinned_layers and dict(
                    pinned_layers.diff_ids), pinned_layers and pinned_layers.zlib))
            digest, size = verify_layout(layout, p.tag, built.digest)
            return self._record(Artifact(p.kind, p.key, p.source, digest, size, p.repository,
                                         p.tag), "built")
        if not p.digest:
            raise SkopeoError(p.note or "no digest")
        if held := self._held(p, layout, p.digest):
            return self._record(held, "present")
        layout.parent.mkdir(parents=True, exist_ok=True)
        # blobs already in the layout are reused by skopeo: an interrupted copy resumes (what
        # it was writing when cut is a temporary file, dropped here)
        for partial in layout.glob("oci-put-blob*"):
            partial.unlink()
        self.skopeo.copy(f"docker://{image.source}@{p.digest}", f"oci:{layout}:{p.tag}")
        digest, size = verify_layout(layout, p.tag, p.digest)
        return self._record(Artifact(p.kind, p.key, p.source, digest, size, p.repository,
                                     p.tag), "exported")

    def _chart(self, p: Planned, chart: ChartRef) -> tuple[Artifact, str]:
        layout = self.root / "oci" / p.repository / p.tag
        if chart.repository.startswith("oci://"):
            if held := self._held(p, layout, p.digest):
                return self._record(held, "present")
            src = f"{chart.repository.removeprefix('oci://')}/{chart.name}"
            layout.parent.mkdir(parents=True, exist_ok=True)
            self.skopeo.copy(f"docker://{src}@{p.digest}", f"oci:{layout}:{p.tag}")
            digest, size = verify_layout(layout, p.tag, p.digest)
            return self._record(Artifact(p.kind, p.key, p.source, digest, size, p.repository,
                                         p.tag), "exported")
        recorded = self._done.get(f"{p.repository}:{p.tag}")
        if recorded and (held := self._held(p, layout, recorded.digest)):
            return self._record(held, "present")
        data, _ = fetch_https_chart(chart)   # checked against the repository index's digest
        shutil.rmtree(layout, ignore_errors=True)
        layout.mkdir(parents=True)
        tag = helm_chart_layout(layout, data)
        if tag != p.tag:
            raise SkopeoError(f"the chart archive says version {tag}, not {p.tag}")
        digest, size = verify_layout(layout, p.tag)
        return self._record(Artifact(p.kind, p.key, p.source, digest, size, p.repository,
                                     p.tag), "exported")


# --------------------------------------------------------------------------- import


def check_covers(artifacts: Mapping[str, Artifact], images: Iterable[Any],
                 charts: Iterable[ChartRef], where: str) -> None:
    """The export holds every artifact the environment deploys, at the pinned digests."""
    for image in images:
        a = artifacts.get(f"{image.mirror_repository}:{image.tag}")
        if a is None:
            raise ToolError(f"{where} has no {image.key} ({image.mirror_repository}:{image.tag})"
                            ": export again with this checkout")
        if image.digest and a.digest != image.digest:
            raise ToolError(f"{where}: {image.key} is {a.digest}, the catalogue pins "
                            f"{image.digest}: export again with this checkout")
    for chart in charts:
        if f"{chart.mirror_repository}:{chart.version}" not in artifacts:
            raise ToolError(f"{where} has no chart {chart.key} ({chart.mirror_repository}:"
                            f"{chart.version}): export again with this checkout")


class Importer:
    """Pushes an export's layouts into `registry`; `fetch(artifact) -> Path` makes an
    artifact's layout local (a directory: itself; an S3 prefix: a download)."""

    def __init__(self, skopeo: Skopeo, registry: str, fetch: Callable[[Artifact], Path], *,
                 jobs: int = 2, dry_run: bool = False) -> None:
        self.skopeo, self.registry, self.fetch, self.jobs = skopeo, registry, fetch, jobs
        self.dry_run = dry_run

    def run(self, artifacts: Sequence[Artifact]) -> MirrorReport:
        return run_all(artifacts, self._one, [a.size for a in artifacts], self.jobs, "import")

    def _one(self, a: Artifact) -> Row:
        dest = f"{self.registry}/{a.repository}:{a.tag}"
        row = Row(a.kind, a.key, a.source, dest, a.digest)
        try:
            present = self.skopeo.digest(dest, dest=True)
            if present == a.digest:
                row.action = "present"
                return row
            if present is not None:
                raise SkopeoError(f"{dest} holds {present}, not {a.digest}: tags are immutable "
                                  "in ECR")
            layout = self.fetch(a)
            verify_layout(layout, a.tag, a.digest)
            if self.dry_run:
                row.action = "would copy"
                return row
            self.skopeo.copy(f"oci:{layout}:{a.tag}", f"docker://{dest}")
            self.skopeo.check_digest(dest, a.digest)
            row.action = "copied"
        except SkopeoError as err:
            row.action, row.note = "failed", str(err)
        return row


@dataclass
class S3Export:
    """An export copied to `s3://bucket/prefix/`: the manifest read first, an artifact's layout
    downloaded (transfer manager) only when ECR lacks it, into `cache`; a file already there
    with its size is not fetched again, and every blob is checked before it is pushed."""

    s3: Any
    bucket: str
    prefix: str
    cache: Path

    @classmethod
    def parse(cls, url: str, s3: Any, cache: Path) -> "S3Export":
        m = re.fullmatch(r"s3://([a-z0-9][a-z0-9.\-]{1,61}[a-z0-9])(?:/(.*))?", url)
        if not m:
            raise ToolError.bad_input("--import", url, "a directory or s3://bucket/prefix")
        return cls(s3, m.group(1), (m.group(2) or "").strip("/"), cache)

    def key(self, rel: str) -> str:
        return f"{self.prefix}/{rel}" if self.prefix else rel

    def manifest_root(self) -> Path:
        self.cache.mkdir(parents=True, exist_ok=True)
        self.s3.download_file(self.bucket, self.key(MANIFEST), str(self.cache / MANIFEST))
        return self.cache

    def fetch(self, a: Artifact) -> Path:
        """The artifact's layout in the cache, checked; a blob that differs is downloaded
        once more (a bad local copy), and refused if S3's copy differs too."""
        local = self.cache / a.path
        self._download(a, local)
        try:
            verify_layout(local, a.tag, a.digest)
        except CorruptArtifact as err:
            if err.path is None:
                raise
            err.path.unlink(missing_ok=True)
            self._download(a, local)
        return local

    def _download(self, a: Artifact, local: Path) -> None:
        from boto3.s3.transfer import TransferConfig, create_transfer_manager

        manager = create_transfer_manager(self.s3, TransferConfig(max_concurrency=8))
        try:
            futures = []
            for page in self.s3.get_paginator("list_objects_v2").paginate(
                    Bucket=self.bucket, Prefix=self.key(a.path) + "/"):
                for obj in page.get("Contents", []):
                    rel = obj["Key"][len(self.key(a.path)) + 1:]
                    if not rel or ".." in Path(rel).parts or rel.startswith("/"):
                        raise SkopeoError(f"s3://{self.bucket}/{obj['Key']}: not a layout file")
                    dest = local / rel
                    if dest.exists() and dest.stat().st_size == obj["Size"]:
                        continue   # there from a run before: checked before it is pushed
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    futures.append(manager.download(self.bucket, obj["Key"], str(dest)))
            for f in futures:
                f.result()
        finally:
            manager.shutdown()


def local_fetch(root: Path) -> Callable[[Artifact], Path]:
    return lambda a: root / a.path


def import_plan(artifacts: Sequence[Artifact], rate: float | None) -> int:
    return print_plan([Planned(a.kind, a.key, a.source, a.repository, a.tag, a.digest, a.size)
                       for a in artifacts], rate, "import")
