"""mirror --export / --import: the loopback drill of carrying the mirror as files.

Export from a real registry (Debian's docker-registry) into a directory, import into a second
one standing in for ECR, with skopeo; the source registry's access log counts what the imports
asked of it. The China dry run is sized from synthetic registry manifests (the real registries
are out of reach here): what it must list is what the China templates pull.
"""
from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import json
import re
import shutil
from pathlib import Path
from types import SimpleNamespace
from typing import Iterator

import boto3
import pytest

import config.images
import tools.carry as carry
import tools.mirror as mirror_module
from config.images import Image
from tests.tools.test_mirror import (
    INDEX, chart_repository, image_manifest, publish_world, registry,
)
from tools.__main__ import main
from tools.carry import read_manifest, verify_layout
from tools.mirror import OCI_MANIFEST, ChartRef, Skopeo, SkopeoError, write_oci_layout


@contextlib.contextmanager
def logged_registry(root: Path) -> Iterator[tuple[str, Path]]:
    """docker-registry on 127.0.0.1 with its access log (one line per request) in a file."""
    log = root / "access.log"
    with registry(root, access_log=log) as url:
        yield url, log


def requests_in(log: Path) -> list[str]:
    """The request lines (`METHOD /path`) of an access log."""
    return re.findall(r'"([A-Z]+ /\S*) HTTP', log.read_text())


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> Iterator[dict]:
    for tool in ("skopeo", "docker-registry"):
        assert shutil.which(tool), f"{tool} is needed: apt-get install skopeo docker-registry"
    tmp = tmp_path_factory.mktemp("carry")
    with logged_registry(tmp / "src") as (src, src_log), \
            logged_registry(tmp / "dst") as (dst, dst_log), \
            chart_repository(tmp / "charts", "web", "1.2.3") as repo:
        index, skopeo = publish_world(tmp / "layout", src, "carried", "carried tool")
        yield SimpleNamespace(
            src=src, src_log=src_log, dst=dst, dst_log=dst_log, skopeo=skopeo, tmp=tmp,
            images=[Image("app", f"{src}/test/app", "1.0",
                          "sha256:" + hashlib.sha256(index).hexdigest(), "multi-arch"),
                    Image("tool", f"{src}/test/tool", "2.1", None, "pinned by tag only")],
            charts=[ChartRef.of("demo", {"repository": f"oci://{src}/charts", "chart": "demo",
                                         "version": "0.1.0"}),
                    ChartRef.of("web", {"repository": repo, "name": "web", "version": "1.2.3"})])


@contextlib.contextmanager
def catalogue(w, clients: dict | None = None) -> Iterator[None]:
    """The dev environment deploying this world's images and charts (`app` from the catalogue,
    `tool` as an endpoint file's image), and no AWS client but `clients`."""
    import k8s.serving  # noqa: F401  (reads the real catalogue when first imported)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(config.images, "IMAGES", {"app": w.images[0]})
        mp.setattr(config.images, "CHARTS", {c.key: c for c in w.charts})
        mp.setattr(mirror_module, "load_endpoints", lambda cfg: (SimpleNamespace(
            image=w.images[1], l2_enabled=False, l2_url=None,
            pod=SimpleNamespace(init_containers=())),))

        def no_aws(self, service):
            if service in (clients or {}):
                return clients[service]
            raise AssertionError(f"an AWS {service} client was made")
        mp.setattr(mirror_module.Aws, "client", no_aws)
        yield


TLS = ["--src-tls-verify", "false", "--dest-tls-verify", "false"]


def cli(*argv: str) -> int:
    return main(["mirror", "--env", "dev", *argv, *TLS])


def actions(out: str) -> dict[str, str]:
    """key -> action from the report table."""
    return dict(re.findall(r"│ (?:image|chart) +│ (\w+) +│ ([a-z ]+?) +│", out))


@pytest.fixture(scope="module")
def export(world) -> SimpleNamespace:
    """The world exported once through the command line: its dry run, then the export."""
    out_dir = world.tmp / "export"
    with catalogue(world), contextlib.redirect_stdout(io.StringIO()) as dry_out:
        assert cli("--export", str(out_dir), "--dry-run", "--rate", "1MB/s") == 0
    assert not out_dir.exists()
    with catalogue(world), contextlib.redirect_stdout(io.StringIO()) as out, \
            contextlib.redirect_stderr(io.StringIO()) as err:
        assert cli("--export", str(out_dir)) == 0
    return SimpleNamespace(dir=out_dir, dry=dry_out.getvalue(), out=out.getvalue(),
                           err=err.getvalue())


def test_export_then_import_carries_every_digest_and_asks_nothing_of_the_source(
        world, export, capsys, monkeypatch):
    w, out_dir = world, export.dir
    assert "export of dev: 4 artifacts" in export.dry and "at 1.0 MB/s" in export.dry
    assert "export of dev into" in export.err and set(actions(export.out).values()) == {
        "exported"}, export.out
    with catalogue(w):
        exported = read_manifest(out_dir)
        assert sorted(exported) == ["kvcache/charts/demo:0.1.0", "kvcache/charts/web:1.2.3",
                                    "kvcache/test/app:1.0", "kvcache/test/tool:2.1"]
        for a in exported.values():
            assert verify_layout(out_dir / a.path, a.tag, a.digest) == (a.digest, a.size)
        for image in w.images:
            a = exported[f"{image.mirror_repository}:{image.tag}"]
            assert a.digest == w.skopeo.digest(f"{image.source}:{image.tag}", dest=False)

        # A second export verifies what is there and fetches only a blob that went missing.
        app = exported["kvcache/test/app:1.0"]
        blobs = out_dir / app.path / "blobs/sha256"
        index = json.loads((blobs / app.digest[7:]).read_bytes())
        platforms = [json.loads((blobs / m["digest"][7:]).read_bytes())
                     for m in index["manifests"]]
        layers = [layer["digest"] for m in platforms for layer in m["layers"]]
        configs = {m["config"]["digest"] for m in platforms}
        victim = blobs / layers[0][7:]
        victim.unlink()
        src_mark = len(requests_in(w.src_log))
        assert cli("--export", str(out_dir)) == 0
        again = actions(capsys.readouterr().out)
        assert again == {"app": "exported", "tool": "present", "demo": "present",
                         "web": "present"}
        assert victim.exists() and read_manifest(out_dir) == exported
        # only that layer came again (skopeo reads the small configs anew)
        fetched = {r.rsplit("/", 1)[1] for r in requests_in(w.src_log)[src_mark:]
                   if r.startswith("GET /v2/test/app/blobs/")}
        assert f"sha256:{victim.name}" in fetched and fetched <= configs | {layers[0]}, fetched

        # The import's dry run: every artifact and its size from the manifest, no AWS.
        assert cli("--import", str(out_dir), "--dry-run", "--rate", "1MB/s") == 0
        listed = capsys.readouterr().out
        total = sum(a.size for a in exported.values())
        assert all(f"{a.repository}:{a.tag}" in listed for a in exported.values())
        assert f"import: 4 artifacts, {total / 1024:.1f} KiB" in listed

        # Import, interrupted after the first push: what was pushed stays, the rest fails.
        src_before = len(requests_in(w.src_log))
        real_copy, pushed = Skopeo.copy, []

        def cut_after_one(self, src, dest):
            if pushed:
                raise SkopeoError("connection reset by peer")
            pushed.append(dest)
            real_copy(self, src, dest)
        monkeypatch.setattr(Skopeo, "copy", cut_after_one)
        assert cli("--import", str(out_dir), "--dest-registry", w.dst, "--jobs", "1") == 1
        cut = actions(capsys.readouterr().out)
        assert sorted(cut.values()) == ["copied", "failed", "failed", "failed"], cut
        monkeypatch.setattr(Skopeo, "copy", real_copy)

        # A blob corrupted in carrying is refused, by name; nothing else is held up.
        tool = exported["kvcache/test/tool:2.1"]
        if cut.get("tool") == "copied":
            tool = exported["kvcache/charts/demo:0.1.0"]
        top = json.loads((out_dir / tool.path / "index.json").read_text())["manifests"][0]
        body = json.loads((out_dir / tool.path / "blobs/sha256" / top["digest"][7:]).read_bytes())
        bad = out_dir / tool.path / "blobs/sha256" / body["layers"][0]["digest"][7:]
        good = bad.read_bytes()
        bad.write_bytes(good[:-1] + bytes([good[-1] ^ 1]))
        dst_mark = len(requests_in(w.dst_log))
        assert cli("--import", str(out_dir), "--dest-registry", w.dst) == 1
        refused = capsys.readouterr()
        assert f"blob {bad} does not have sha256" in refused.out + refused.err
        resumed = actions(refused.out)
        assert resumed[tool.key] == "failed" and sorted(resumed.values()) == [
            "copied", "copied", "failed", "present"], resumed
        # the resumed run wrote only into the repositories of what it copied: nothing into the
        # one pushed before, nothing for the refused one
        written = {m.group(1) for r in requests_in(w.dst_log)[dst_mark:]
                   if (m := re.match(r"(?:PUT|POST|PATCH) /v2/(.+?)/(?:blobs|manifests)/", r))}
        assert written == {a.repository for a in exported.values()
                           if resumed[a.key] == "copied"}, written
        bad.write_bytes(good)
        assert cli("--import", str(out_dir), "--dest-registry", w.dst) == 0
        last = actions(capsys.readouterr().out)
        assert last[tool.key] == "copied" and list(last.values()).count("present") == 3

        # The imports never asked the source registry anything.
        assert len(requests_in(w.src_log)) == src_before
        for a in exported.values():
            assert w.skopeo.digest(f"{w.dst}/{a.repository}:{a.tag}", dest=True) == a.digest
        pushed_index = json.loads(w.skopeo.manifest(f"{w.dst}/kvcache/test/app:1.0", dest=True))
        for m in pushed_index["manifests"]:   # every platform, by its own digest
            assert w.skopeo.digest(f"{w.dst}/kvcache/test/app@{m['digest']}",
                                   dest=True) == m["digest"]


def test_import_reads_an_export_from_s3_with_the_transfer_manager(world, export, capsys,
                                                                 aws_env):
    from moto import mock_aws

    w, out_dir = world, export.dir
    with mock_aws(), logged_registry(w.tmp / "dst-s3") as (dst, _):
        s3 = boto3.client("s3", region_name="us-west-2")
        s3.create_bucket(Bucket="carried", CreateBucketConfiguration={
            "LocationConstraint": "us-west-2"})
        for f in out_dir.rglob("*"):
            if f.is_file() and (f.name == "manifest.json" or "/test/tool/" in str(f)
                                or "/charts/web/" in str(f)):
                s3.upload_file(str(f), "carried", f"drop/{f.relative_to(out_dir).as_posix()}")
        # a blob left damaged in the work directory by a run before (same size): fetched again
        tool = read_manifest(out_dir)["kvcache/test/tool:2.1"]
        blob = next(p for p in (out_dir / tool.path / "blobs/sha256").iterdir()
                    if p.stat().st_size > 100)
        stale = w.tmp / "work" / "dev" / blob.relative_to(out_dir)
        stale.parent.mkdir(parents=True)
        stale.write_bytes(bytes(len(blob.read_bytes())))
        with catalogue(w, {"s3": s3}):
            args = ["--import", "s3://carried/drop", "--dest-registry", dst, "--only", "tool",
                    "web", "--work-dir", str(w.tmp / "work")]
            assert cli(*args) == 0
            assert sorted(actions(capsys.readouterr().out).values()) == ["copied", "copied"]
            assert stale.read_bytes() == blob.read_bytes()
            assert cli(*args, "--dry-run") == 0
            assert sorted(actions(capsys.readouterr().out).values()) == ["present", "present"]
        for key in ("kvcache/test/tool:2.1", "kvcache/charts/web:1.2.3"):
            a = read_manifest(out_dir)[key]
            assert w.skopeo.digest(f"{dst}/{a.repository}:{a.tag}", dest=True) == a.digest


def test_an_import_of_another_environments_export_is_refused(world, tmp_path, capsys):
    (tmp_path / "manifest.json").write_text(json.dumps(
        {"format": carry.FORMAT, "environment": "china", "artifacts": []}))
    with catalogue(world):
        assert cli("--import", str(tmp_path), "--dest-registry", world.dst) == 2
    assert "environment = 'china' is not valid; allowed: dev" in capsys.readouterr().err


# --------------------------------------------------------------------------- China, dry run


class RecordedRegistries(Skopeo):
    """Answers `skopeo inspect --raw` as the upstream registries would, from synthetic
    manifests (the real ones are out of reach here): a two-platform index per image."""

    def __init__(self) -> None:
        super().__init__()
        object.__setattr__(self, "blobs", {})

    def manifest(self, ref: str, *, dest: bool) -> bytes | None:
        assert not dest
        repository, _, digest = ref.partition("@")
        if digest in self.blobs:
            return self.blobs[digest]
        children = []
        for arch in ("amd64", "arm64"):
            seed = hashlib.sha256(f"{repository}/{arch}".encode()).digest()
            body = json.dumps({"schemaVersion": 2, "mediaType": OCI_MANIFEST,
                               "config": {"digest": "sha256:" + seed.hex(), "size": 1000},
                               "layers": [{"digest": "sha256:" + hashlib.sha256(seed + bytes(
                                   [i])).hexdigest(), "size": 10_000_000 * (i + 1)}
                                   for i in range(3)]}).encode()
            d = "sha256:" + hashlib.sha256(body).hexdigest()
            self.blobs[d] = body
            children.append({"digest": d, "size": len(body), "mediaType": OCI_MANIFEST,
                             "platform": {"os": "linux", "architecture": arch}})
        return json.dumps({"schemaVersion": 2, "mediaType": INDEX, "manifests": children}
                          ).encode()


def test_china_export_dry_run_lists_every_image_its_templates_pull_with_sizes(
        china, monkeypatch, capsys):
    # what the templates pull: an image reference or a chart's oci:// repository under the
    # account's ECR, or a chart's values naming the repository apart from the registry (the
    # Storage stack, which names every ECR repository, left out)
    registry = f"{china.cfg.account}.{china.cfg.facts.ecr_host_suffix}"
    pulling = json.dumps({name: t for name, t in china.templates.items()
                          if name != f"{china.cfg.stack_prefix}-Storage"})
    assert registry in pulling
    pulled = set(re.findall(re.escape(registry) + r'/(kvcache/[a-z0-9._/-]+)|repository\\*":'
                            r'\\*"(kvcache/[a-z0-9._/-]+)', pulling))
    pulled = {a or b for a, b in pulled}
    assert pulled, "the China templates pull from the account's ECR"

    monkeypatch.setattr(carry, "fetch_https_chart", lambda chart: (b"c" * 5000, "sha256:" + (
        hashlib.sha256(chart.name.encode()).hexdigest())))
    monkeypatch.setattr(mirror_module, "Skopeo", lambda **kw: RecordedRegistries())
    monkeypatch.setattr(mirror_module.shutil, "which", lambda tool: "/usr/bin/" + tool)

    def no_aws(*a, **kw):
        raise AssertionError("the dry run made an AWS client")
    monkeypatch.setattr(mirror_module, "Aws", no_aws)
    monkeypatch.setattr(boto3, "client", no_aws)
    assert main(["mirror", "--env", "china", "--export", "/nonexistent/carry", "--dry-run",
                 "--rate", "50MB/s"]) == 0
    out = capsys.readouterr().out
    listed = set(re.findall(r"^(?:image|chart) .* (kvcache/[a-z0-9._/-]+):", out, re.M))
    assert pulled <= listed, pulled - listed
    assert listed == pulled, listed - pulled
    total = re.search(r"export of china: (\d+) artifacts, ([\d.]+) GiB, about (.+) at 50\.0 MB/s",
                      out)
    assert total and int(total.group(1)) == len(listed)
    sizes = re.findall(r"^(?:image|chart) +\S+ +([\d.]+) (?:B|KiB|MiB|GiB) ", out, re.M)
    assert len(sizes) == len(listed) and all(float(s) > 0 for s in sizes)
    assert not Path("/nonexistent/carry").exists()


def test_the_router_image_is_built_into_its_layout_once(tmp_path):
    """An image we build goes into the export as its build wrote it; a second export keeps it
    (its digest from the manifest where the catalogue pins none yet)."""
    from tools.carry import Exporter, Planned
    from tools.image_build import Built

    builds = []

    def build(layout: Path) -> Built:
        builds.append(layout)
        layout.mkdir(parents=True)
        body = image_manifest(layout, "amd64", "router")
        write_oci_layout(layout, [("1.0", body, {"mediaType": OCI_MANIFEST})])
        return Built(layout, "1.0", "sha256:" + hashlib.sha256(body).hexdigest(), {})

    router = Image("router", "docker.io/kvcache/router", "1.0", None, "built",
                   built_from="python")
    planned = [Planned("image", "router", "built from python", router.mirror_repository, "1.0",
                       None, None)]
    rows = [Exporter(Skopeo(), tmp_path, "dev", builders={"router": build}).run(
        planned, {"router": router}, {}).rows[0] for _ in range(2)]
    assert [r.action for r in rows] == ["built", "present"] and len(builds) == 1
    a = read_manifest(tmp_path)["kvcache/kvcache/router:1.0"]
    assert a.digest == rows[0].digest and verify_layout(tmp_path / a.path, "1.0") == (
        a.digest, a.size)
