"""The router image, built without a container engine (tools/image_build.py) and pushed by
`python -m tools mirror`, against real registries on 127.0.0.1 (Debian's docker-registry) with
skopeo: a two-platform base like python:*-slim (a dpkg status, /etc/passwd, a python), a wheel
with a console script and a Debian package made here with dpkg-deb, fetched over HTTP by URL
and sha256 as the real lock's files are. The base is merged-/usr as bookworm's is (`/lib ->
usr/lib`, ...) and the package ships `lib/`, `bin/`, a unit, an init script and docs, as
haproxy's does: what runs is shown by tests/tools/test_router_image_runs.py.

The real lock (images/router/lock.json) is checked against the pins it must agree with; its
files are not fetched here (PyPI and Debian are not the test's to reach).
"""
from __future__ import annotations

import functools
import gzip
import hashlib
import http.server
import io
import json
import subprocess
import tarfile
import threading
import zipfile
import zlib
from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path

import pytest

from config.images import IMAGES, BuiltLayers, Image, router_tag
from tests.tools.test_mirror import INDEX, registry, write_blob, write_oci_layout
from tools.image_build import (
    OCI_LAYER_GZIP, OCI_MANIFEST, BuildError, Fetcher, Pinned, PlatformLayer, Recipe, build,
    follow,
)
from tools.mirror import Mirror, Skopeo
from tools.router_image import LOCK, load_lock, recipe

PLATFORMS = ("linux/amd64", "linux/arm64")
BASE_STATUS = ("Package: libc6\nStatus: install ok installed\nVersion: 2.36-9+deb12u10\n\n"
               "Package: dash\nStatus: install ok installed\nVersion: 0.5.12-2\n")
BASE_PASSWD = b"root:x:0:0:root:/root:/bin/bash\nnobody:x:65534:65534:nobody:/nonexistent:" \
              b"/usr/sbin/nologin\n"
# bookworm's merged /usr: what a package's lib/, bin/ ... must land under
MERGED_USR = {"bin": "usr/bin", "sbin": "usr/sbin", "lib": "usr/lib", "lib64": "usr/lib64"}


def _tar(files: dict[str, bytes | str]) -> bytes:
    """A layer: bytes are a file, a str a symlink's target."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            if isinstance(data, str):
                info.type, info.linkname, info.mode = tarfile.SYMTYPE, data, 0o777
                tar.addfile(info)
                continue
            info.size, info.mode = len(data), 0o755 if "bin/" in name else 0o644
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _base_layout(root: Path) -> bytes:
    """A python:*-slim-like base for both platforms; returns the index bytes."""
    manifests = []
    for platform in PLATFORMS:
        arch = platform.split("/")[1]
        layer = _tar({**MERGED_USR, "etc/passwd": BASE_PASSWD, "etc/group": b"root:x:0:\n",
                      "var/lib/dpkg/status": BASE_STATUS.encode(),
                      "usr/lib64/ld-linux-x86-64.so.2": "/lib/x86_64-linux-gnu/ld-2.36.so",
                      "usr/local/bin/python3.12": f"#!/bin/sh\n# {arch}\n".encode(),
                      "usr/local/bin/python3": "python3.12"})
        config = write_blob(root, json.dumps({
            "architecture": arch, "os": "linux", "created": "2026-10-01T00:00:00Z",
            "config": {"Env": ["PATH=/usr/local/bin:/usr/bin:/bin", "LANG=C.UTF-8"],
                       "Cmd": ["python3"]},
            "rootfs": {"type": "layers",
                       "diff_ids": ["sha256:" + hashlib.sha256(layer).hexdigest()]},
            "history": [{"created": "2026-10-01T00:00:00Z", "created_by": "base"}]}).encode(),
            "application/vnd.oci.image.config.v1+json")
        body = json.dumps({"schemaVersion": 2, "mediaType": OCI_MANIFEST, "config": config,
                           "layers": [write_blob(root, gzip.compress(layer, mtime=0),
                                                 OCI_LAYER_GZIP)]}).encode()
        manifests.append({**write_blob(root, body, OCI_MANIFEST),
                          "platform": {"architecture": arch, "os": "linux",
                                       **({"variant": "v8"} if arch == "arm64" else {})}})
    # an attestation manifest, as Docker Hub's official images carry: never a platform
    manifests.append({**manifests[0], "platform": {"architecture": "unknown", "os": "unknown"}})
    index = json.dumps({"schemaVersion": 2, "mediaType": INDEX, "manifests": manifests}).encode()
    write_oci_layout(root, [("3.12", index, {"mediaType": INDEX})])
    return index


# What the fake package ships besides usr/sbin/fakeproxy, as haproxy's and its libraries' do:
# paths under the merged directories, and what a container never reads.
DEB_FILES = {"lib/x86_64-linux-gnu/libfake.so.1": b"ELF", "bin/fakeproxy-ctl": b"#!/bin/sh\n",
             "lib/systemd/system/fakeproxy.service": b"[Unit]\n",
             "etc/init.d/fakeproxy": b"#!/bin/sh\n", "etc/default/fakeproxy": b"X=1\n",
             "usr/share/doc/fakeproxy/copyright": b"(c)\n",
             "usr/share/man/man8/fakeproxy.8.gz": b"man\n", "etc/fakeproxy/fakeproxy.cfg": b"\n"}


def _deb(root: Path, arch: str, depends: str, extra: dict[str, bytes] | None = None) -> Path:
    pkg = root / f"deb-{arch}-{abs(hash(depends))}-{len(extra or {})}"
    (pkg / "DEBIAN").mkdir(parents=True)
    (pkg / "usr" / "sbin").mkdir(parents=True)
    (pkg / "DEBIAN" / "control").write_text(
        f"Package: fakeproxy\nVersion: 2.6.12-1+deb12u4\nArchitecture: {arch}\n"
        f"Maintainer: test <t@example.com>\nDepends: {depends}\nDescription: a proxy\n")
    tool = pkg / "usr" / "sbin" / "fakeproxy"
    tool.write_text("#!/bin/sh\necho fakeproxy\n")
    tool.chmod(0o755)
    for name, data in {**DEB_FILES, **(extra or {})}.items():
        (pkg / name).parent.mkdir(parents=True, exist_ok=True)
        (pkg / name).write_bytes(data)
    (pkg / "lib/x86_64-linux-gnu/libfake.so").symlink_to("libfake.so.1")
    out = root / f"fakeproxy_2.6.12_{arch}_{abs(hash(depends))}_{len(extra or {})}.deb"
    subprocess.run(["dpkg-deb", "--root-owner-group", "--build", str(pkg), str(out)],
                   check=True, capture_output=True)
    return out


def _wheel(root: Path) -> Path:
    path = root / "hello_router-1.0-py3-none-any.whl"
    files = {"hello_router/__init__.py": b"def main():\n    print('hello')\n",
             "hello_router-1.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: hello-router"
                                                   b"\nVersion: 1.0\n",
             "hello_router-1.0.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\n"
                                                b"Root-Is-Purelib: true\nTag: py3-none-any\n",
             "hello_router-1.0.dist-info/entry_points.txt":
                 b"[console_scripts]\nhello-router = hello_router:main\n"}
    record = "".join(f"{n},sha256={_b64(d)},{len(d)}\n" for n, d in files.items())
    record += "hello_router-1.0.dist-info/RECORD,,\n"
    with zipfile.ZipFile(path, "w") as z:
        for name, data in {**files, "hello_router-1.0.dist-info/RECORD": record.encode()}.items():
            z.writestr(name, data)
    return path


def _b64(data: bytes) -> str:
    import base64
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def _pinned(path: Path, url: str) -> Pinned:
    return Pinned(path.name, f"{url}/{path.name}", hashlib.sha256(path.read_bytes()).hexdigest())


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("router-image")
    files = tmp / "files"
    files.mkdir()
    with ExitStack() as stack:
        src = dst = stack.enter_context(registry(tmp / "registry"))   # base and push: one
        handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(files))
        handler.log_message = lambda *a: None
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                     daemon=True).start()
        stack.callback(server.server_close)
        stack.callback(server.shutdown)
        url = f"http://127.0.0.1:{server.server_address[1]}"
        skopeo = Skopeo(src_tls_verify=False, dest_tls_verify=False)
        layout = tmp / "base"
        index = _base_layout(layout)
        skopeo.copy(f"oci:{layout}:3.12", f"docker://{src}/library/python:3.12")
        wheel = _wheel(files)
        debs = {p: _deb(files, p.split("/")[1], "libc6 (>= 2.34), adduser")
                for p in PLATFORMS}
        base = f"{src}/library/python@sha256:{hashlib.sha256(index).hexdigest()}"
        recipe_ = Recipe(
            base=base, python="/usr/local/bin/python3.12",
            site_packages="/usr/local/lib/python3.12/site-packages",
            scripts_dir="/usr/local/bin", user="65532:65532", user_name="router",
            entrypoint=("hello-router",), exposed_ports=(8000,),
            script_only_depends=frozenset({"adduser"}),
            layers=tuple(PlatformLayer(p, wheels=(_pinned(wheel, url),),
                                       debs=(_pinned(debs[p], url),)) for p in PLATFORMS))
        yield {"src": src, "dst": dst, "skopeo": skopeo, "recipe": recipe_, "url": url,
               "files": files, "tmp": tmp, "cache": tmp / "cache"}


def _build(world, recipe_: Recipe, out: Path, cache: Path | None = None):
    skopeo = world["skopeo"]
    return build(recipe_, Fetcher(cache or world["cache"]), out, "test",
                 inspect_raw=lambda ref: skopeo.manifest(ref, dest=False),
                 pull=lambda ref, layout, tag: skopeo.copy(f"docker://{ref}",
                                                           f"oci:{layout}:{tag}"))


def _blob(layout: Path, digest: str) -> bytes:
    return (layout / "blobs" / "sha256" / digest.split(":")[1]).read_bytes()


def test_the_build_is_the_base_plus_one_layer_per_platform_and_reproducible(world, tmp_path):
    first = _build(world, world["recipe"], tmp_path / "a")
    # again, elsewhere, with nothing cached: the same digest
    second = _build(world, world["recipe"], tmp_path / "b", cache=tmp_path / "cache2")
    assert first.digest == second.digest
    index = json.loads(_blob(first.layout, first.digest))
    assert [(m["platform"]["os"], m["platform"]["architecture"]) for m in index["manifests"]] \
        == [("linux", "amd64"), ("linux", "arm64")]
    for entry in index["manifests"]:
        manifest = json.loads(_blob(first.layout, entry["digest"]))
        config = json.loads(_blob(first.layout, manifest["config"]["digest"]))
        assert len(manifest["layers"]) == 2 and manifest["layers"][-1]["mediaType"] \
            == OCI_LAYER_GZIP
        layer = gzip.decompress(_blob(first.layout, manifest["layers"][-1]["digest"]))
        assert config["rootfs"]["diff_ids"][-1] == "sha256:" + hashlib.sha256(layer).hexdigest()
        assert config["config"]["User"] == "65532:65532"
        assert config["config"]["Entrypoint"] == ["hello-router"]
        assert config["config"]["Env"] == ["PATH=/usr/local/bin:/usr/bin:/bin", "LANG=C.UTF-8"]
        assert config["architecture"] == entry["platform"]["architecture"]
        with tarfile.open(fileobj=io.BytesIO(layer)) as tar:
            members = {m.name: m for m in tar.getmembers()}
            read = lambda name: tar.extractfile(members[name]).read()   # noqa: E731
            assert all(m.mtime == 0 and m.uid == 0 for m in members.values())
            launcher = read("usr/local/bin/hello-router").decode()
            assert launcher.startswith("#!/usr/local/bin/python3.12\n")
            assert "from hello_router import main" in launcher
            assert members["usr/local/bin/hello-router"].mode == 0o755
            assert "usr/local/lib/python3.12/site-packages/hello_router/__init__.py" in members
            assert read("usr/sbin/fakeproxy").startswith(b"#!/bin/sh")
            assert members["usr/sbin/fakeproxy"].mode == 0o755
            # dpkg's unpack on merged /usr: lib/, bin/ land in usr/; never a directory or
            # file where the base has a symlink; what a container never reads is left out
            assert not set(members) & set(MERGED_USR), sorted(members)
            assert read("usr/lib/x86_64-linux-gnu/libfake.so.1") == b"ELF"
            assert members["usr/lib/x86_64-linux-gnu/libfake.so"].linkname == "libfake.so.1"
            assert members["usr/bin/fakeproxy-ctl"].isfile()
            assert "etc/fakeproxy/fakeproxy.cfg" in members
            assert not [n for n in members if n.startswith((
                "usr/lib/systemd/", "etc/init.d/", "etc/default/", "usr/share/doc/",
                "usr/share/man/"))], sorted(members)
            status = read("var/lib/dpkg/status.d/fakeproxy").decode()
            assert "Package: fakeproxy" in status and "Status: install ok installed" in status
            assert read("etc/passwd") == BASE_PASSWD + \
                b"router:x:65532:65532::/nonexistent:/usr/sbin/nologin\n"


def test_mirror_builds_pushes_by_digest_and_a_second_run_builds_nothing(world):
    skopeo, dst = world["skopeo"], world["dst"]
    built = []

    def build_router(layout):
        built.append(_build(world, world["recipe"], layout))
        return built[-1]

    image = Image("router", "kvcache-eks/router", "t1", None, "test", built_from="python")
    mirror = Mirror(skopeo, dst, builders={"router": build_router})
    (row,) = mirror.run([image], progress=False).rows
    assert (row.action, row.unpinned) == ("built", True), row
    assert skopeo.digest(f"{dst}/kvcache/router:t1", dest=True) == row.digest \
        == built[0].digest
    index = json.loads(skopeo.manifest(f"{dst}/kvcache/router:t1", dest=True))
    for m in index["manifests"]:   # every platform came along, addressable by its digest
        assert skopeo.digest(f"{dst}/kvcache/router@{m['digest']}", dest=True) == m["digest"]
    pinned = replace(image, digest=row.digest)
    (again,) = mirror.run([pinned], progress=False).rows
    assert again.action == "present" and len(built) == 1
    # a pin the inputs no longer give: refused, nothing pushed
    other = replace(image, tag="t2", digest="sha256:" + "0" * 64)
    (refused,) = mirror.run([other], progress=False).rows
    assert refused.action == "failed" and "the catalogue pins" in refused.note
    assert skopeo.digest(f"{dst}/kvcache/router:t2", dest=True) is None


def test_a_build_that_is_not_the_pin_says_whether_its_content_or_only_gzip_differs(
        world, tmp_path, monkeypatch):
    """The pin's layers by uncompressed digest decide: another compressor (here another gzip
    level, as zlib-ng's or macOS's deflate would give) is told apart from another input."""
    from tools import image_build

    pinned = _build(world, world["recipe"], tmp_path / "pinned")
    image = Image("router", "kvcache-eks/router", "t1", pinned.digest, "test",
                  built_from="python", built_layers=BuiltLayers(
                      "1.2.13-pinning", tuple(sorted(pinned.diff_ids.items()))))
    (resolved,) = Mirror(world["skopeo"], None, builders={"router": lambda layout: pinned}).run(
        [replace(image, digest=None)], progress=False).rows
    assert resolved.action == "resolved" and resolved.digest == pinned.digest
    assert resolved.built_layers == f"built_layers=BuiltLayers(zlib={zlib.ZLIB_RUNTIME_VERSION!r}" \
        f", diff_ids={tuple(sorted(pinned.diff_ids.items()))!r})"

    monkeypatch.setattr(image_build, "GZIP_LEVEL", 1)   # the same tar, other gzip bytes
    other_gzip = _build(world, world["recipe"], tmp_path / "other")
    assert other_gzip.digest != pinned.digest and other_gzip.diff_ids == pinned.diff_ids
    mirror = Mirror(world["skopeo"], None, builders={"router": lambda layout: other_gzip})
    (row,) = mirror.run([image], progress=False).rows
    assert row.action == "failed"
    assert "the same layers uncompressed" in row.note and "by zlib 1.2.13-pinning" in row.note \
        and f"this machine's zlib is {zlib.ZLIB_RUNTIME_VERSION}" in row.note, row.note

    other = dict(pinned.diff_ids, **{"linux/arm64": "sha256:" + "1" * 64})
    changed = replace(image, built_layers=BuiltLayers("1.2.13", tuple(other.items())))
    (row,) = mirror.run([changed], progress=False).rows
    assert row.action == "failed" and "the layers' content differs (linux/arm64: layer " \
        f"{pinned.diff_ids['linux/arm64']}, pinned sha256:{'1' * 64}): an input changed" \
        in row.note, row.note
    (row,) = mirror.run([replace(image, built_layers=None)], progress=False).rows
    assert "no layer digests are pinned beside it" in row.note, row.note
    with pytest.raises(ValueError, match="BuiltLayers linux/amd64: 'sha256:12' is not"):
        BuiltLayers("1.2.13", (("linux/amd64", "sha256:12"),))


def _broken(world, platform: str, **changes) -> Recipe:
    r = world["recipe"]
    return replace(r, layers=tuple(replace(layer, **changes) if layer.platform == platform
                                   else layer for layer in r.layers))


def test_a_package_the_base_cannot_satisfy_is_refused_by_name(world, tmp_path):
    deb = _deb(world["files"], "arm64", "libc6 (>= 2.34), liblua5.3-0")
    recipe_ = _broken(world, "linux/arm64", debs=(_pinned(deb, world["url"]),))
    with pytest.raises(BuildError, match=r"linux/arm64: fakeproxy .* needs liblua5\.3-0"):
        _build(world, recipe_, tmp_path / "x")
    old_libc = _deb(world["files"], "amd64", "libc6 (>= 2.40)")
    recipe_ = _broken(world, "linux/amd64", debs=(_pinned(old_libc, world["url"]),))
    with pytest.raises(BuildError, match=r"needs libc6 \(>= 2\.40\)"):
        _build(world, recipe_, tmp_path / "y")


def test_a_file_where_the_base_has_a_symlink_is_refused_by_name(world, tmp_path):
    """Applied, the layer's file would replace the base's symlink (python3 -> python3.12)."""
    deb = _deb(world["files"], "amd64", "libc6 (>= 2.34)",
               {"usr/local/bin/python3": b"#!/bin/sh\n"})
    recipe_ = _broken(world, "linux/amd64", debs=(_pinned(deb, world["url"]),))
    with pytest.raises(BuildError, match=r"linux/amd64: the layer holds a file at "
                                         r"/usr/local/bin/python3, where the base has a "
                                         r"symlink to python3\.12"):
        _build(world, recipe_, tmp_path / "x")


@pytest.mark.parametrize(("path", "last", "expected"), [
    ("./lib/systemd/system/x.service", False, "usr/lib/systemd/system/x.service"),
    ("lib", False, "lib"), ("lib/", True, "usr/lib"),
    ("lib64/ld-linux-x86-64.so.2", False, "usr/lib64/ld-linux-x86-64.so.2"),
    ("opt/app/x", False, "srv/x"), ("up/x", False, "usr/lib/x"),
    ("usr/local/bin/python3", False, "usr/local/bin/python3"),
])
def test_paths_follow_the_bases_directory_symlinks_as_dpkg_writes_them(path, last, expected):
    links = {**MERGED_USR, "opt/app": "/srv", "up": "usr/../lib",
             "usr/local/bin/python3": "python3.12"}
    assert follow(path, links, last=last) == expected


def test_a_file_that_is_not_what_the_lock_pins_is_refused(world, tmp_path):
    wheel = world["recipe"].layers[0].wheels[0]
    recipe_ = _broken(world, "linux/amd64", wheels=(replace(wheel, sha256="1" * 64),))
    with pytest.raises(BuildError, match="sha256"):
        _build(world, recipe_, tmp_path / "x", cache=tmp_path / "c")


def test_a_wheel_of_another_platform_is_refused(world, tmp_path):
    arm = world["files"] / "native-1.0-cp312-cp312-manylinux_2_17_aarch64.whl"
    arm.write_bytes((world["files"] / "hello_router-1.0-py3-none-any.whl").read_bytes())
    recipe_ = _broken(world, "linux/amd64", wheels=(_pinned(arm, world["url"]),))
    with pytest.raises(BuildError, match="not a wheel for amd64"):
        _build(world, recipe_, tmp_path / "x")


# --- the real lock


def test_the_lock_pins_what_the_catalogue_and_the_requirements_pin():
    lock = load_lock()
    base = IMAGES["python"]
    assert lock["base"] == {"key": "python", "source": base.source, "tag": base.tag,
                            "digest": base.digest}
    assert IMAGES["router"].built_from == "python"
    assert IMAGES["router"].tag == router_tag(LOCK.read_bytes())   # any change: a new tag
    reqs = (LOCK.parents[2] / "requirements.txt").read_text().splitlines()
    assert set(lock["requirements"]) <= set(reqs)   # the routers the loopback tests run
    for platform in PLATFORMS:
        spec = lock["platforms"][platform]
        names = {w["name"]: w["version"] for w in spec["wheels"]}
        for pin in lock["requirements"]:
            name, version = pin.split("==")
            assert names[name] == version
        machine = {"linux/amd64": "x86_64", "linux/arm64": "aarch64"}[platform]
        for w in spec["wheels"]:
            assert w["url"].startswith("https://files.pythonhosted.org/") \
                and w["url"].endswith("/" + w["filename"]) and len(w["sha256"]) == 64
            tag = w["filename"].removesuffix(".whl").split("-")[-1]
            assert tag == "any" or all(t.endswith(machine) for t in tag.split("."))
        arch = platform.split("/")[1]
        for d in spec["debs"]:
            assert d["url"].startswith("https://deb.debian.org/debian") \
                and d["filename"].endswith(f"_{arch}.deb") and len(d["sha256"]) == 64
    assert recipe(lock, base.source).base == f"{base.source}@{base.digest}"


def test_the_locked_haproxy_is_the_series_the_front_is_tested_with():
    """The front's configuration is run against Debian's haproxy on loopback (tests/e2e)."""
    lock = load_lock()
    (haproxy,) = {d["version"] for p in lock["platforms"].values() for d in p["debs"]
                  if d["package"] == "haproxy"}
    series = lock["debian"]["haproxy_series"]
    assert haproxy.startswith(series + ".")
    here = subprocess.run(["haproxy", "-v"], capture_output=True, text=True).stdout
    assert here.startswith(f"HAProxy version {series}."), here
