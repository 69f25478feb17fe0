"""Copy the pinned images (and Helm charts) the environment deploys into its ECR, and build
the router image there (tools/router_image.py).

    python -m tools mirror --env china --export DIR   # outside China, no AWS credentials
    python -m tools mirror --env china --import DIR   # in China: DIR or s3://bucket/prefix
    python -m tools mirror --env dev                  # direct: upstream into the env's ECR
    python -m tools mirror --env dev --dry-run        # what it would copy: sizes, no AWS
    python -m tools mirror --resolve                  # only print digests of unpinned images
    python -m tools mirror --env china --export DIR --dry-run --rate 50MB/s   # sizes, time

Export and import (the files carried between them) are tools/carry.py's.

Each image is copied by digest (`skopeo copy --all --preserve-digests`), so the multi-arch index
in ECR has the digest the catalogue pins and `repo:tag@digest` resolves there. Idempotent: the
destination tag is inspected first and an image already there with the pinned digest is not
copied again. An image pinned by tag only (digest None) is resolved with `skopeo inspect`, copied
by that digest, and the digest is printed for pasting into the catalogue: never guessed.

ECR credentials come from `ecr:GetAuthorizationToken` in the destination region (its partition
follows the region), written to a private authfile for skopeo rather than put on its command
line, where other local users could read it.

Helm charts, where the catalogue has a `CHARTS` table, go to `<registry>/kvcache/charts/<name>`
as OCI artifacts: copied as they are from an `oci://` repository, or, from an HTTPS Helm
repository, downloaded, checked against the repository index's digest and pushed the way
`helm push` lays them out.
"""
from __future__ import annotations

import argparse
import base64
import json
import os
import shutil
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

from config.arguments import ToolError, add_command, err_console, load_environment
from tools.cli import Aws, load_endpoints, parse_rate
from tools.oci import (  # noqa: F401  (re-exported: the mirror's names for tests and tools)
    HELM_CHART, HELM_CONFIG, OCI_MANIFEST, ChartRef, MirrorReport, Row, Skopeo, SkopeoError,
    catalogue_charts, fetch_https_chart, helm_chart_layout, print_report, write_blob,
    write_oci_layout,
)

# --------------------------------------------------------------------------- mirror


class Mirror:
    """Mirrors a catalogue into `registry` (host[:port]). Catalogue and registry are
    parameters so tests can use their own against local registries."""

    def __init__(self, skopeo: Skopeo, registry: str | None, *, dry_run: bool = False,
                 jobs: int = 2, builders: Mapping[str, Callable[[Path], Any]] | None = None,
                 read_pairs: Iterable[str] = ()) -> None:
        self.skopeo, self.registry, self.dry_run, self.jobs = skopeo, registry, dry_run, jobs
        # catalogue keys of worker images whose vLLM/LMCache pair is read from their layers
        # (tools/image_pair.py) once mirrored: key -> (reference, digest, Pair) in `pairs`
        self.read_pairs, self.pairs = frozenset(read_pairs), {}
        # catalogue key -> build(layout) -> tools.image_build.Built, for images we build
        self.builders = dict(builders or {})

    def run(self, images: Iterable[Any], charts: Iterable[ChartRef] = (),
            progress: bool = True) -> MirrorReport:
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        work = [(self._image, i) for i in images] + [(self._chart, c) for c in charts]
        report = MirrorReport()
        with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn(
                "{task.completed}/{task.total}"), TimeElapsedColumn(), console=err_console,
                disable=not progress) as bar:
            task = bar.add_task("mirror", total=len(work))

            def one(item: tuple) -> Row:
                row = item[0](item[1])
                bar.advance(task)
                return row

            with ThreadPoolExecutor(max(1, self.jobs)) as pool:
                report.rows = list(pool.map(one, work))
        return report

    def _image(self, image: Any) -> Row:
        if getattr(image, "built_from", None):
            return self._built(image)
        dest = f"{self.registry}/{image.mirror_repository}:{image.tag}" if self.registry else ""
        row = Row("image", image.key, f"{image.source}:{image.tag}", dest, image.digest)
        try:
            if row.digest is None or not self.registry:
                upstream = self.skopeo.digest(f"{image.source}:{image.tag}", dest=False)
                if upstream is None:
                    raise SkopeoError(f"{image.source}:{image.tag} not found upstream")
                if row.digest is None:
                    row.digest, row.unpinned = upstream, True
                elif upstream != row.digest:
                    row.note = (f"the tag now points to {upstream} upstream; the pinned digest "
                                "is still the one mirrored")
            if not self.registry:
                row.action = "resolved"
                return row
            self._place(row, f"docker://{image.source}@{row.digest}")
            if image.key in self.read_pairs and not self.dry_run:
                self._read_pair(image, row)
        except SkopeoError as err:
            row.action, row.note = "failed", str(err)
        return row

    def _read_pair(self, image: Any, row: Row) -> None:
        """Read the vLLM/LMCache pair from the image's linux/amd64 layers (its source: the
        bytes just mirrored, by digest)."""
        from tools.image_pair import read_pair

        with tempfile.TemporaryDirectory(prefix="pair-") as tmp:   # no ':' (oci:PATH:TAG)
            self.skopeo.copy_platform(f"docker://{image.source}@{row.digest}",
                                      f"oci:{tmp}/layout:image")
            try:
                pair = read_pair(Path(tmp) / "layout")
            except (ValueError, OSError, KeyError) as err:
                raise SkopeoError(f"{image.source}:{image.tag}: its layers could not be read "
                                  f"for vLLM/LMCache: {err}") from None
        self.pairs[image.key] = (f"{image.source}:{image.tag}", row.digest, pair)
        row.note = (f"{row.note}; " if row.note else "") + (
            f"carries vLLM {pair.vllm or 'none'} + LMCache {pair.lmcache or 'none'}")

    def _built(self, image: Any) -> Row:
        """An image we build (tools/image_build.py): built where the destination lacks its
        tag, checked against the pinned digest, pushed by digest."""
        from tools.image_build import BuildError, pin_mismatch

        dest = f"{self.registry}/{image.mirror_repository}:{image.tag}" if self.registry else ""
        row = Row("image", image.key, f"built from {image.built_from}", dest, image.digest)
        try:
            if self.registry:
                present = self.skopeo.digest(dest, dest=True)
                if present is not None:
                    if image.digest and present != image.digest:
                        raise SkopeoError(f"{dest} holds {present}, not {image.digest}: tags "
                                          "are immutable in ECR")
                    row.action, row.digest, row.unpinned = "present", present, not image.digest
                    return row
                if self.dry_run:
                    row.action = "would build"
                    return row
            if image.key not in self.builders:
                raise SkopeoError(f"no build for {image.key}")
            with tempfile.TemporaryDirectory(prefix=f"build-{image.key}-") as tmp:
                built = self.builders[image.key](Path(tmp) / "layout")
                pinned = getattr(image, "built_layers", None)
                if image.digest and built.digest != image.digest:
                    raise SkopeoError(pin_mismatch(
                        built, image.digest, pinned and dict(pinned.diff_ids),
                        pinned and pinned.zlib))
                row.digest, row.unpinned = built.digest, not image.digest
                row.built_layers = (f"built_layers=BuiltLayers(zlib={built.zlib!r}, diff_ids="
                                    f"{tuple(sorted(built.diff_ids.items()))!r})")
                if not self.registry:
                    row.action = "resolved"
                    return row
                self.skopeo.copy(f"oci:{built.layout}:{built.tag}", f"docker://{dest}")
            self.skopeo.check_digest(dest, row.digest)
            row.action = "built"
        except (SkopeoError, BuildError) as err:
            row.action, row.note = "failed", str(err)
        return row

    def _chart(self, chart: ChartRef) -> Row:
        dest = f"{self.registry}/{chart.mirror_repository}:{chart.version}"
        row = Row("chart", chart.key, f"{chart.repository}/{chart.name}:{chart.version}", dest,
                  chart.digest)
        try:
            if chart.repository.startswith("oci://"):
                src = f"{chart.repository.removeprefix('oci://')}/{chart.name}"
                if row.digest is None:
                    row.digest = self.skopeo.digest(f"{src}:{chart.version}", dest=False)
                    row.unpinned = True
                    if row.digest is None:
                        raise SkopeoError(f"{src}:{chart.version} not found upstream")
                self._place(row, f"docker://{src}@{row.digest}")
                return row
            # An HTTPS Helm repository: the archive's digest is what we can compare.
            present = self._dest_chart_layer(dest)
            data, tgz_digest = fetch_https_chart(chart)
            row.digest, row.unpinned = tgz_digest, chart.digest is None
            if present == tgz_digest:
                row.action = "present"
                return row
            if self.dry_run:
                row.action = "would copy"
                return row
            with tempfile.TemporaryDirectory(prefix="chart-") as tmp:
                tag = helm_chart_layout(Path(tmp), data)
                self.skopeo.copy(f"oci:{tmp}:{tag}", f"docker://{dest}")
            if self._dest_chart_layer(dest) != tgz_digest:
                raise SkopeoError(f"{dest}: chart archive differs after the copy")
            row.action = "copied"
        except SkopeoError as err:
            row.action, row.note = "failed", str(err)
        return row

    def _dest_chart_layer(self, dest: str) -> str | None:
        raw = self.skopeo.manifest(dest, dest=True)
        layers = json.loads(raw).get("layers", []) if raw else []
        return next((l["digest"] for l in layers if l.get("mediaType") == HELM_CHART), None)

    def _place(self, row: Row, src: str) -> None:
        """Copy `src` to `row.dest` unless the destination already holds `row.digest`."""
        present = self.skopeo.digest(row.dest, dest=True)
        if present == row.digest:
            row.action = "present"
            return
        if present is not None:
            raise SkopeoError(f"{row.dest} holds {present}, not {row.digest}: tags are immutable "
                              "in ECR; bump the tag in the catalogue instead")
        if self.dry_run:
            row.action = "would copy"
            return
        self.skopeo.copy(src, f"docker://{row.dest}")
        after = self.skopeo.digest(row.dest, dest=True)
        if after != row.digest:
            raise SkopeoError(f"{row.dest} has digest {after} after the copy, not {row.digest}")
        row.action = "copied"


# --------------------------------------------------------------------------- ECR


def ecr_registry(aws: Aws) -> str:
    cfg = aws.cfg
    return f"{cfg.account}.{cfg.facts.ecr_host_suffix}"


def ecr_authfile(aws: Aws, registry: str, directory: Path) -> str:
    """A docker-style auth file for `registry` from ecr:GetAuthorizationToken (12 h token)."""
    data = aws.client("ecr").get_authorization_token()["authorizationData"][0]
    token = data["authorizationToken"]
    base64.b64decode(token)  # a malformed answer fails here, not inside skopeo
    path = directory / "auth.json"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        json.dump({"auths": {registry: {"auth": token}}}, fh)
    return str(path)


def missing_repositories(aws: Aws, names: Iterable[str]) -> list[str]:
    have: set[str] = set()
    for page in aws.client("ecr").get_paginator("describe_repositories").paginate():
        have |= {r["repositoryName"] for r in page["repositories"]}
    return sorted(set(names) - have)


# --------------------------------------------------------------------------- command


def register(sub: argparse._SubParsersAction) -> None:
    p = add_command(sub, "mirror", main, "copy the pinned images (and charts) into the "
                    "environment's ECR with skopeo", __doc__)
    carry = p.add_mutually_exclusive_group()
    carry.add_argument("--export", metavar="DIR", type=Path, help="write every artifact into "
                       "DIR (OCI layouts and manifest.json) instead of a registry; no AWS")
    carry.add_argument("--import", dest="import_", metavar="DIR", help="push what an export "
                       "holds (a directory or s3://bucket/prefix) into the environment's ECR")
    p.add_argument("--rate", type=parse_rate, metavar="RATE", help="with --dry-run: the time "
                   "the transfer takes at RATE (50MB/s)")
    p.add_argument("--work-dir", default="~/.cache/kvcache-eks/import", help="where an import "
                   "from S3 downloads the layouts it pushes (resumes from what is there)")
    p.add_argument("--only", nargs="+", metavar="KEY", help="catalogue keys to mirror")
    p.add_argument("--resolve", action="store_true",
                   help="only resolve and print digests (no destination, no AWS)")
    p.add_argument("--dry-run", action="store_true", help="inspect, but copy nothing")
    p.add_argument("--dest-registry", metavar="HOST",
                   help="another destination registry (default: the environment's ECR)")
    p.add_argument("--dest-authfile", help="auth file for --dest-registry")
    p.add_argument("--src-authfile", help="auth file for the source registries (Docker Hub "
                   "rate limits)")
    p.add_argument("--src-tls-verify", default="true", choices=("true", "false"))
    p.add_argument("--dest-tls-verify", default="true", choices=("true", "false"))
    p.add_argument("--jobs", type=int, default=2, help="images copied at once (default 2)")
    p.add_argument("--cache", default="~/.cache/kvcache-eks/build",
                   help="where the router image's pinned wheels and Debian packages are kept")
    p.add_argument("--pypi-files-mirror", metavar="URL", help="a mirror of "
                   "https://files.pythonhosted.org for the router image's wheels")
    p.add_argument("--debian-mirror", metavar="URL",
                   help="a mirror of https://deb.debian.org/debian")
    p.add_argument("--debian-security-mirror", metavar="URL",
                   help="a mirror of https://deb.debian.org/debian-security")


def main(args: argparse.Namespace, aws: Aws | None = None) -> int:
    from k8s.serving import environment_images

    if not shutil.which("skopeo"):
        raise ToolError("skopeo not found: install it (Debian: apt-get install skopeo)", 2)
    # What the environment deploys: the catalogue images its parts use, every endpoint file's
    # worker image, and the router image, built here.
    cfg = load_environment(args)
    specs = load_endpoints(cfg)
    images = environment_images(cfg, specs)
    workers = {s.image.key for s in specs if s.image is not None}
    charts = catalogue_charts()
    if args.only:
        known = list(dict.fromkeys([i.key for i in images] + [c.key for c in charts]))
        for key in args.only:
            if key not in known:
                raise ToolError.bad_input("--only", key, known)
        images = [i for i in images if i.key in args.only]
        charts = [c for c in charts if c.key in args.only]
    if not 1 <= args.jobs <= 8:
        raise ToolError.bad_input("--jobs", args.jobs, "1 to 8")
    if getattr(args, "export", None) is not None:
        return export_main(args, cfg, images, charts)
    if getattr(args, "import_", None):
        return import_main(args, cfg, images, charts, aws)
    if args.dry_run and not args.dest_registry and not args.resolve:
        return direct_plan(args, cfg, images, charts)
    with tempfile.TemporaryDirectory(prefix="mirror-") as tmp:
        registry, dest_authfile = args.dest_registry, args.dest_authfile
        if args.resolve:
            registry, charts = None, []
        elif not registry:
            aws = aws or Aws(cfg, args.profile)
            registry = ecr_registry(aws)
            missing = missing_repositories(aws, [i.mirror_repository for i in images]
                                           + [c.mirror_repository for c in charts])
            if missing:
                raise ToolError(f"ECR repositories missing in {cfg.region}: {', '.join(missing)}"
                                f"; deploy {cfg.stack_prefix}-Storage first")
            dest_authfile = ecr_authfile(aws, registry, Path(tmp))
        skopeo = Skopeo(src_tls_verify=args.src_tls_verify == "true",
                        dest_tls_verify=args.dest_tls_verify == "true",
                        src_authfile=args.src_authfile, dest_authfile=dest_authfile)
        mirror = Mirror(skopeo, registry, dry_run=args.dry_run, jobs=args.jobs,
                        builders=image_builders(args, skopeo),
                        read_pairs=unread_pairs(images, workers))
        report = mirror.run(images, charts)
    record_pairs(mirror.pairs)
    return print_report(report)


def unread_pairs(images: Iterable[Any], workers: Iterable[str]) -> list[str]:
    """Keys of the worker images (`workers`: the endpoints' image keys) whose vLLM/LMCache pair
    neither the catalogue nor images.lock.json knows: mirror reads them."""
    from config.images import RECORDED, image_release

    keys, workers = [], set(workers)
    for image in images:
        if image.key not in workers or image.built_from:
            continue
        release = image_release(image)
        if release.origin != RECORDED and (release.vllm is None or release.lmcache is None):
            keys.append(image.key)
    return keys


def record_pairs(pairs: Mapping[str, tuple[str, str, Any]]) -> None:
    """Write what the mirror read into images.lock.json, and say so."""
    from datetime import date

    from config.images import IMAGES_LOCK
    from tools.image_pair import record_pair

    for reference, digest, pair in pairs.values():
        record_pair(reference, digest, pair, f"mirror read its site-packages METADATA on "
                    f"{date.today().isoformat()}")
        err_console.print(f"{IMAGES_LOCK.name}: {reference}@{digest[:19]}: vLLM "
                          f"{pair.vllm or 'none'} + LMCache {pair.lmcache or 'none'} "
                          "(commit it: the next synth uses it)")


def _skopeo(args: argparse.Namespace, dest_authfile: str | None = None) -> Skopeo:
    return Skopeo(src_tls_verify=args.src_tls_verify == "true",
                  dest_tls_verify=args.dest_tls_verify == "true",
                  src_authfile=args.src_authfile, dest_authfile=dest_authfile)


def direct_plan(args: argparse.Namespace, cfg: Any, images: list, charts: list) -> int:
    """The direct path's dry run: each artifact, its size from the upstream registries'
    manifests, and where in the environment's ECR it would go; no AWS client is made (ECR's
    repositories are checked by the copy itself)."""
    from tools.carry import plan, print_plan

    registry = f"{cfg.account}.{cfg.facts.ecr_host_suffix}"
    planned = plan(_skopeo(args), images, charts, jobs=args.jobs)
    return print_plan(planned, getattr(args, "rate", None),
                      f"mirror of {cfg.name} into {registry}")


def export_main(args: argparse.Namespace, cfg: Any, images: list, charts: list) -> int:
    """Sizes first (from the registries' manifests), then every artifact into the directory;
    no AWS client is ever made."""
    from tools.carry import Exporter, plan, print_plan
    from tools.cli import human_size

    if args.dest_registry or args.resolve:
        raise ToolError.bad_input("--export", str(args.export), "without --dest-registry or "
                                  "--resolve (an export writes files, not a registry)")
    skopeo = _skopeo(args)
    planned = plan(skopeo, images, charts, jobs=args.jobs)
    if args.dry_run:
        return print_plan(planned, args.rate, f"export of {cfg.name}")
    unsized = [p for p in planned if p.note.startswith("failed")]
    if unsized:
        print_plan(planned, args.rate, f"export of {cfg.name}")
    err_console.print(f"export of {cfg.name} into {args.export}: {len(planned)} artifacts, "
                      f"{human_size(sum(p.size or 0 for p in planned))}")
    report = Exporter(skopeo, args.export, cfg.name, jobs=args.jobs,
                      builders=image_builders(args, skopeo)).run(
        planned, {i.key: i for i in images}, {c.key: c for c in charts})
    return print_report(report)


def import_main(args: argparse.Namespace, cfg: Any, images: list, charts: list,
                aws: Aws | None) -> int:
    """Reads the export's manifest, checks it covers what the environment deploys, and pushes
    what ECR lacks. Talks to the environment's ECR only (and S3 for an s3:// export)."""
    from tools.carry import (
        Importer, S3Export, check_covers, import_plan, local_fetch, read_manifest,
    )

    source = args.import_
    if args.resolve:
        raise ToolError.bad_input("--import", source, "without --resolve")
    s3_export = None
    if source.startswith("s3://"):
        aws = aws or Aws(cfg, args.profile)
        s3_export = S3Export.parse(source, aws.client("s3"),
                                   Path(args.work_dir).expanduser() / cfg.name)
        root = s3_export.manifest_root()
    else:
        root = Path(source)
        if not (root / "manifest.json").is_file():
            raise ToolError.bad_input("--import", source, "a directory mirror --export wrote "
                                      "(with manifest.json)")
    exported = read_manifest(root)
    environment = json.loads((root / "manifest.json").read_text()).get("environment")
    if environment != cfg.name:
        raise ToolError.bad_input(f"{source}: environment", environment,
                                  f"{cfg.name} (export with --env {cfg.name})")
    check_covers(exported, images, charts, source)
    wanted = {f"{i.mirror_repository}:{i.tag}" for i in images} | {
        f"{c.mirror_repository}:{c.version}" for c in charts}
    artifacts = [a for k, a in exported.items() if k in wanted]
    if args.dry_run and not args.dest_registry:
        return import_plan(artifacts, args.rate)
    with tempfile.TemporaryDirectory(prefix="mirror-") as tmp:
        registry, dest_authfile = args.dest_registry, args.dest_authfile
        if not registry:
            aws = aws or Aws(cfg, args.profile)
            registry = ecr_registry(aws)
            missing = missing_repositories(aws, [a.repository for a in artifacts])
            if missing:
                raise ToolError(f"ECR repositories missing in {cfg.region}: {', '.join(missing)}"
                                f"; deploy {cfg.stack_prefix}-Storage first")
            dest_authfile = ecr_authfile(aws, registry, Path(tmp))
        fetch = s3_export.fetch if s3_export else local_fetch(root)
        report = Importer(_skopeo(args, dest_authfile), registry, fetch, jobs=args.jobs,
                          dry_run=args.dry_run).run(artifacts)
    return print_report(report)


def image_builders(args: argparse.Namespace, skopeo: Skopeo) -> dict[str, Callable]:
    """The images we build, each from its recipe on its base's upstream source (the same
    digest wherever it is built), with inputs from PyPI and Debian or the mirrors given."""
    import config.images as catalogue
    from tools.image_build import Fetcher, build
    from tools.router_image import load_lock, recipe

    mirrors = {prefix: url for prefix, url in (
        ("https://files.pythonhosted.org", args.pypi_files_mirror),
        ("https://deb.debian.org/debian-security", args.debian_security_mirror),
        ("https://deb.debian.org/debian", args.debian_mirror)) if url}
    fetcher = Fetcher(Path(args.cache).expanduser(), mirrors)
    router = catalogue.IMAGES.get("router")
    if router is None or not router.built_from:
        return {}
    base = catalogue.IMAGES[router.built_from]

    def build_router(layout: Path):
        return build(recipe(load_lock(), base.source), fetcher, layout, router.tag,
                     inspect_raw=lambda ref: skopeo.manifest(ref, dest=False) or b"",
                     pull=lambda ref, out, tag: skopeo.copy(f"docker://{ref}",
                                                            f"oci:{out}:{tag}"))
    return {"router": build_router}
