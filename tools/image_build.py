"""Images built without a container engine: a base image plus one layer per platform made here
from pinned files, Python wheels (installed with pypa's `installer` for the image's own Python)
and Debian packages (unpacked with python-debian), pushed with skopeo.

Reproducible: the same base digest and the same files give the same image digest. Every file
is fetched by URL and checked against its sha256; the layer is a tar with sorted entries, owner
root and a fixed time, gzip-compressed without a name or time in its header; the config and the
manifests are written from the base's with sorted keys. One input is the machine's: the deflate
stream comes from its zlib (zlib's output has not changed across 1.2.x and 1.3.x at a given
level; zlib-ng, which some distributions ship in its place, and macOS's compress
differently), so a digest the catalogue pins is checked after every build, and a build that
differs is compared by what does not depend on zlib: each layer's uncompressed digest (its
diff_id), pinned beside the digest (config/images.py BuiltLayers). The error then says whether
an input changed or only the compressor, and which zlib gives the pinned bytes. The build
never runs anything inside the image, so it builds every platform on any machine.

Debian packages are unpacked as dpkg unpacks them on the base: a path whose directory is a
symlink in the base lands where the symlink points, so on a merged-/usr base (bookworm's:
/bin, /sbin, /lib, /lib64 -> usr/...) a package's `lib/...` goes to `usr/lib/...`. Files a
container never uses (DEB_EXCLUDE: init scripts and units, docs, man pages) are left out.

Checked before anything is pushed: each Debian package's dependencies are installed in the base
(its dpkg status) or are in the layer, with their versions; the wheels' platform tags fit the
platform; the layer holds no directory or file where the base holds a symlink (a runtime
applying the layer would replace the symlink: a directory `lib` over `lib -> usr/lib` leaves
the ELF interpreter `/lib64/ld-linux-x86-64.so.2` pointing at nothing, and nothing runs).
"""
from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import posixpath
import re
import stat
import tarfile
import tempfile
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Callable, Iterable, Mapping, Sequence

OCI_INDEX = "application/vnd.oci.image.index.v1+json"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
OCI_LAYER = "application/vnd.oci.image.layer.v1.tar"
OCI_LAYER_GZIP = "application/vnd.oci.image.layer.v1.tar+gzip"
# A Docker schema 2 base: the same blobs under OCI media types (OCI image-spec, "Docker
# compatibility": the formats are the same bytes).
_TO_OCI = {
    "application/vnd.docker.distribution.manifest.list.v2+json": OCI_INDEX,
    "application/vnd.docker.distribution.manifest.v2+json": OCI_MANIFEST,
    "application/vnd.docker.container.image.v1+json": OCI_CONFIG,
    "application/vnd.docker.image.rootfs.diff.tar.gzip": OCI_LAYER_GZIP,
    "application/vnd.docker.image.rootfs.diff.tar": OCI_LAYER,
}
# Files the layer writes are dated here (SOURCE_DATE_EPOCH of reproducible-builds.org).
EPOCH = 0
GZIP_LEVEL = 6
# What the layer leaves out of a Debian package (paths after the base's symlinks are followed,
# and as the package names them): what only an init system, logrotate, syslog or a person at a
# terminal reads. A container runs one program as its entrypoint: no init, no cron, no man.
# As debian:*-slim's own /etc/dpkg/dpkg.cfg.d/docker leaves out docs, man pages and locales.
DEB_EXCLUDE = (
    "etc/init.d/", "etc/default/", "etc/logrotate.d/", "etc/rsyslog.d/", "etc/cron.d/",
    "lib/systemd/", "usr/lib/systemd/", "usr/lib/tmpfiles.d/", "usr/lib/sysusers.d/",
    "usr/share/doc/", "usr/share/man/", "usr/share/info/", "usr/share/lintian/",
    "usr/share/bug/", "usr/share/locale/",
)


class BuildError(Exception):
    pass


@dataclass(frozen=True)
class Pinned:
    """A file to fetch: where, and the sha256 it must have."""

    filename: str
    url: str
    sha256: str


@dataclass(frozen=True)
class PlatformLayer:
    """What the layer of one platform holds."""

    platform: str                        # linux/amd64, linux/arm64
    wheels: tuple[Pinned, ...] = ()
    debs: tuple[Pinned, ...] = ()


@dataclass(frozen=True)
class Recipe:
    """An image: the base (pinned by index digest), the layers, and the config it runs with."""

    base: str                            # registry/repository@sha256:... of a multi-arch index
    layers: tuple[PlatformLayer, ...]
    python: str                          # the base's python, for wheel launchers
    site_packages: str
    scripts_dir: str
    user: str                            # uid:gid the image runs as
    user_name: str                       # its /etc/passwd entry (none in the base)
    entrypoint: tuple[str, ...]
    exposed_ports: tuple[int, ...] = ()
    labels: Mapping[str, str] = field(default_factory=dict)
    # Depends of Debian packages that only their maintainer scripts need (adduser, init
    # scripts), which the layer never runs: not required in the base.
    script_only_depends: frozenset[str] = frozenset()
    created_by: str = "kvcache-eks tools/image_build.py"


# --------------------------------------------------------------------------- fetching


@dataclass
class Fetcher:
    """Fetches pinned files into a cache keyed by sha256; `mirrors` rewrite URL prefixes (a
    PyPI or Debian mirror an environment names)."""

    cache: Path
    mirrors: Mapping[str, str] = field(default_factory=dict)
    timeout: float = 120.0
    get: Callable[[str, float], bytes] | None = None

    def fetch(self, item: Pinned) -> Path:
        if "/" in item.filename or item.filename in ("", ".", ".."):
            raise BuildError(f"not a file name: {item.filename!r}")
        path = self.cache / item.sha256 / item.filename   # installer reads the wheel's name
        if path.exists() and _sha256_file(path) == item.sha256:
            return path
        url = item.url
        for prefix in sorted(self.mirrors, key=len, reverse=True):   # the longest match
            if url.startswith(prefix):
                url = self.mirrors[prefix].rstrip("/") + url[len(prefix):]
                break
        data = (self.get or _http_get)(url, self.timeout)
        digest = hashlib.sha256(data).hexdigest()
        if digest != item.sha256:
            raise BuildError(f"{item.filename} from {url}: sha256 {digest}, pinned "
                             f"{item.sha256}")
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".part")
        tmp.write_bytes(data)
        tmp.replace(path)
        return path


def _http_get(url: str, timeout: float) -> bytes:
    import requests

    for attempt in range(3):
        try:
            resp = requests.get(url, timeout=timeout)
        except requests.RequestException as err:
            if attempt == 2:
                raise BuildError(f"GET {url}: {err}") from None
            time.sleep(1 + attempt)
            continue
        if resp.status_code == 200:
            return resp.content
        if resp.status_code < 500 or attempt == 2:
            raise BuildError(f"GET {url}: HTTP {resp.status_code}")
        time.sleep(1 + attempt)
    raise AssertionError("unreachable")


def _sha256_file(path: Path) -> str:
    with path.open("rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


# --------------------------------------------------------------------------- layer


@dataclass(frozen=True)
class Entry:
    """One tar member of the layer."""

    kind: str              # file | dir | symlink | hardlink
    mode: int
    data: bytes = b""
    target: str = ""       # symlink or hardlink target


class Tree:
    """The layer's files by path (no leading '/'); written out in sorted order."""

    def __init__(self) -> None:
        self.entries: dict[str, Entry] = {}

    def add(self, path: str, entry: Entry) -> None:
        path = _clean(path)
        if not path:
            return
        parent = str(PurePosixPath(path).parent)
        if parent != ".":
            self.add_dir(parent)
        if entry.kind == "dir" and path in self.entries:
            return
        self.entries[path] = entry

    def add_dir(self, path: str, mode: int = 0o755) -> None:
        path = _clean(path)
        if path and path not in self.entries:
            self.add(path, Entry("dir", mode))

    def tar(self) -> bytes:
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
            for path in sorted(self.entries):
                e = self.entries[path]
                info = tarfile.TarInfo(path)
                info.mtime, info.uid, info.gid, info.uname, info.gname = EPOCH, 0, 0, "", ""
                info.mode = e.mode
                if e.kind == "dir":
                    info.type = tarfile.DIRTYPE
                    tar.addfile(info)
                elif e.kind in ("symlink", "hardlink"):
                    info.type = tarfile.SYMTYPE if e.kind == "symlink" else tarfile.LNKTYPE
                    info.linkname = e.target
                    tar.addfile(info)
                else:
                    info.size = len(e.data)
                    tar.addfile(info, io.BytesIO(e.data))
        return buf.getvalue()


def _clean(path: str) -> str:
    parts = [p for p in PurePosixPath(path).parts if p not in ("/", ".", "")]
    if ".." in parts:
        raise BuildError(f"a path leaving the root: {path!r}")
    return "/".join(parts)


def follow(path: str, symlinks: Mapping[str, str], *, last: bool = False) -> str:
    """`path` with each directory on it that is a symlink in `symlinks` (the base's: path ->
    target) replaced by where it points, as the kernel resolves it when dpkg writes there; the
    last component too where `last` (a directory the package ships, which dpkg never puts in
    place of a symlink to a directory)."""
    parts = _clean(path).split("/") if _clean(path) else []
    done: list[str] = []
    hops = 0
    while parts:
        name = parts.pop(0)
        here = "/".join([*done, name])
        if here in symlinks and (parts or last):
            hops += 1
            if hops > 40:   # the kernel's limit (ELOOP)
                raise BuildError(f"too many symlinks resolving {path!r} in the base")
            target = symlinks[here]
            base = [] if target.startswith("/") else done
            resolved = posixpath.normpath("/" + "/".join([*base, target])).lstrip("/")
            done, parts = [], [*(resolved.split("/") if resolved else []), *parts]
            continue
        done.append(name)
    return "/".join(done)


def _excluded(*paths: str) -> bool:
    return any((p + "/").startswith(DEB_EXCLUDE) for p in paths)


def add_deb(tree: Tree, deb: Path, symlinks: Mapping[str, str] | None = None) -> dict[str, str]:
    """Unpack a Debian package's data into the tree as dpkg would onto a base whose symlinks
    are `symlinks` (path -> target), leaving out DEB_EXCLUDE; returns its control fields."""
    from debian.debfile import DebFile

    symlinks = symlinks or {}
    package = DebFile(str(deb))
    control = dict(package.debcontrol())
    with package.data.tgz() as data:
        for m in data.getmembers():
            name = follow(m.name, symlinks, last=m.isdir())
            if not name or _excluded(_clean(m.name), name):
                continue
            if m.isdir():
                tree.add_dir(name, stat.S_IMODE(m.mode))
            elif m.issym():
                tree.add(name, Entry("symlink", 0o777, target=m.linkname))
            elif m.islnk():
                target = follow(m.linkname, symlinks)
                held = tree.entries.get(target)
                if held is None or held.kind == "dir":   # left out (DEB_EXCLUDE), say
                    raise BuildError(f"{deb.name}: hard link {m.name} to {m.linkname}, which "
                                     "the layer does not hold")
                tree.add(name, Entry("hardlink", stat.S_IMODE(m.mode), target=target))
            elif m.isfile():
                tree.add(name, Entry("file", stat.S_IMODE(m.mode),
                                     data=data.extractfile(m).read()))
    # What was installed, where image scanners look for it without a dpkg database to edit
    # (one file per package, as distroless images keep them).
    tree.add(f"var/lib/dpkg/status.d/{control['Package']}", Entry(
        "file", 0o644, data=_control_paragraph({**control, "Status": "install ok installed"})))
    return control


def _control_paragraph(fields: Mapping[str, str]) -> bytes:
    from debian.deb822 import Deb822

    return Deb822(dict(fields)).dump().encode()


def add_wheels(tree: Tree, wheels: Sequence[Path], recipe: Recipe) -> None:
    """Install wheels as pip would into the image's Python, with launchers for its path."""
    from installer import install
    from installer.destinations import SchemeDictionaryDestination
    from installer.sources import WheelFile

    with tempfile.TemporaryDirectory(prefix="wheels-") as root:
        scheme = {"purelib": recipe.site_packages, "platlib": recipe.site_packages,
                  "headers": f"{recipe.site_packages}/../../../include",
                  "scripts": recipe.scripts_dir, "data": "/usr/local"}
        destination = SchemeDictionaryDestination(
            scheme, interpreter=recipe.python, script_kind="posix", destdir=root)
        for wheel in sorted(wheels):
            with WheelFile.open(wheel) as source:
                install(source, destination, {"INSTALLER": b"kvcache-eks\n"})
        _add_tree_from(tree, Path(root))


def _add_tree_from(tree: Tree, root: Path) -> None:
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(dirnames):
            rel = (Path(dirpath) / name).relative_to(root)
            if (Path(dirpath) / name).is_symlink():
                tree.add(str(rel), Entry("symlink", 0o777,
                                         target=os.readlink(Path(dirpath) / name)))
            else:
                tree.add_dir(str(rel))
        for name in sorted(filenames):
            path = Path(dirpath) / name
            rel = str(path.relative_to(root))
            if path.is_symlink():
                tree.add(rel, Entry("symlink", 0o777, target=os.readlink(path)))
            else:
                mode = 0o755 if os.access(path, os.X_OK) else 0o644
                tree.add(rel, Entry("file", mode, data=path.read_bytes()))


# --------------------------------------------------------------------------- base


def read_base(layout: Path, manifest_digest: str) -> tuple[dict, dict, list[Path]]:
    manifest = json.loads(_blob(layout, manifest_digest))
    config = json.loads(_blob(layout, manifest["config"]["digest"]))
    layers = [_blob_path(layout, d["digest"]) for d in manifest["layers"]]
    return manifest, config, layers


def base_files(layers: Sequence[Path], paths: Iterable[str],
               prefixes: Iterable[str] = ()) -> dict[str, bytes]:
    """The base's files at `paths` or under `prefixes`, as its layers leave them (a later
    layer wins; whiteouts remove)."""
    return read_base_paths(layers, paths, prefixes)[0]


def read_base_paths(layers: Sequence[Path], paths: Iterable[str], prefixes: Iterable[str] = (),
                    ) -> tuple[dict[str, bytes], dict[str, str]]:
    """(the files of base_files, every symlink of the base: path -> target), as its layers
    leave them, in one read of the layers."""
    paths, prefixes = set(paths), tuple(prefixes)
    found: dict[str, bytes] = {}
    links: dict[str, str] = {}

    def drop(gone: str, opaque: bool = False) -> None:   # a whiteout
        for d in (found, links):
            for k in [k for k in d if k.startswith(gone + "/") or (not opaque and k == gone)]:
                del d[k]

    for layer in layers:
        with tarfile.open(layer, mode="r:*") as tar:
            for m in tar:
                name = _clean(m.name)
                head, _, leaf = name.rpartition("/")
                if leaf == ".wh..wh..opq":
                    drop(head, opaque=True)
                    continue
                if leaf.startswith(".wh."):
                    drop(f"{head}/{leaf[4:]}".lstrip("/"))
                    continue
                links.pop(name, None)   # what a later layer puts at a path replaces it
                found.pop(name, None)
                if m.issym():
                    links[name] = m.linkname
                elif m.isfile() and (name in paths or name.startswith(prefixes)):
                    found[name] = tar.extractfile(m).read()
    return found, links


def check_symlinks(tree: Tree, symlinks: Mapping[str, str], platform: str) -> None:
    """The layer holds no directory or file where the base holds a symlink: applied, it would
    replace the symlink (containerd merges a directory only over a directory)."""
    for path, entry in sorted(tree.entries.items()):
        if entry.kind != "symlink" and path in symlinks:
            raise BuildError(f"{platform}: the layer holds a {entry.kind} at /{path}, where the "
                             f"base has a symlink to {symlinks[path]}: applied, it would "
                             "replace the symlink")


def installed_packages(files: Mapping[str, bytes]) -> dict[str, str]:
    """Package -> version from a dpkg status file (and status.d/ entries)."""
    from debian.deb822 import Deb822

    out = {}
    texts = [v for k, v in files.items()
             if k == "var/lib/dpkg/status" or k.startswith("var/lib/dpkg/status.d/")]
    for text in texts:
        for para in Deb822.iter_paragraphs(text.decode("utf-8", "replace")):
            status = para.get("Status", "install ok installed")
            if para.get("Package") and status.endswith(" installed"):
                out[para["Package"]] = para.get("Version", "")
                for provided in _relations(para.get("Provides", "")):
                    out.setdefault(provided[0][0], para.get("Version", ""))
    return out


def _relations(text: str) -> list[list[tuple[str, str | None, str | None]]]:
    """[[(name, op, version) alternatives], ...] of a Depends-style field."""
    from debian.deb822 import PkgRelation

    out = []
    if not text.strip():
        return out
    for group in PkgRelation.parse_relations(text):
        out.append([(r["name"], *(r["version"] or (None, None))) for r in group])
    return out


def check_depends(controls: Sequence[Mapping[str, str]], base: Mapping[str, str],
                  script_only: frozenset[str], platform: str) -> None:
    """Every Depends/Pre-Depends of the layer's packages is satisfied by the base or the
    layer, versions included; BuildError names what is missing."""
    from debian.debian_support import version_compare

    have = dict(base)
    for c in controls:
        have[c["Package"]] = c["Version"]
        for provided in _relations(c.get("Provides", "")):
            have.setdefault(provided[0][0], c["Version"])
    ops = {"<<": lambda x: x < 0, "<=": lambda x: x <= 0, "=": lambda x: x == 0,
           ">=": lambda x: x >= 0, ">>": lambda x: x > 0}
    for c in controls:
        for field_name in ("Pre-Depends", "Depends"):
            for group in _relations(c.get(field_name, "")):
                names = {name.split(":")[0] for name, _, _ in group}
                if names & script_only:
                    continue
                if not any(name.split(":")[0] in have and (
                        op is None or ops[op](version_compare(have[name.split(":")[0]],
                                                              version)))
                        for name, op, version in group):
                    wants = " | ".join(n + (f" ({o} {v})" if o else "") for n, o, v in group)
                    raise BuildError(f"{platform}: {c['Package']} {c['Version']} needs {wants}, "
                                     "which neither the base nor the layer installs")


# --------------------------------------------------------------------------- build


@dataclass(frozen=True)
class Built:
    layout: Path
    tag: str
    digest: str                      # of the index: what the catalogue pins
    platforms: dict[str, str]        # platform -> manifest digest
    diff_ids: dict[str, str] = field(default_factory=dict)  # platform -> our layer, uncompressed
    zlib: str = zlib.ZLIB_RUNTIME_VERSION   # whose deflate the digest covers


def pin_mismatch(built: Built, digest: str, diff_ids: Mapping[str, str] | None,
                 pinned_zlib: str | None) -> str:
    """Why `built` is not the pinned `digest`, from the layers' uncompressed digests pinned
    beside it: an input changed (a platform's layer holds other bytes), or only the gzip
    compressor differs (the same bytes, another zlib), and how to build the pinned bytes."""
    head = f"built {built.digest}, the catalogue pins {digest}"
    if not diff_ids:
        return (f"{head}; no layer digests are pinned beside it (BuiltLayers), so whether an "
                f"input changed or only this machine's zlib ({built.zlib}) compresses "
                "differently is not known: pin both from `python -m tools mirror --resolve`")
    changed = [f"{p}: layer {built.diff_ids.get(p, 'absent')}, pinned {d}"
               for p, d in sorted(diff_ids.items()) if built.diff_ids.get(p) != d]
    changed += [f"{p}: a layer the pin does not have" for p in sorted(built.diff_ids)
                if p not in diff_ids]
    if changed:
        return (f"{head}: the layers' content differs ({'; '.join(changed)}): an input "
                "changed (the lock, the base, or the build code)")
    return (f"{head}: the same layers uncompressed (every diff_id as pinned); only the gzip "
            f"bytes differ: this machine's zlib is {built.zlib}, the pin was compressed by zlib "
            f"{pinned_zlib}. Build where Python's zlib is {pinned_zlib} (python3 -c 'import "
            "zlib; print(zlib.ZLIB_RUNTIME_VERSION)'; Debian bookworm's zlib1g gives 1.2.13), "
            "or pin this build's digest and layers (`python -m tools mirror --resolve --only "
            "router`)")


def build(recipe: Recipe, fetcher: Fetcher, layout: Path, tag: str,
          inspect_raw: Callable[[str], bytes], pull: Callable[[str, Path, str], None]) -> Built:
    """Builds `recipe` into the OCI layout `layout` under `tag`. `inspect_raw(reference)` reads
    a manifest; `pull(reference, layout, tag)` copies one platform's image of the base into the
    layout (both skopeo)."""
    repository, _, index_digest = recipe.base.partition("@")
    if not re.fullmatch(r"sha256:[0-9a-f]{64}", index_digest):
        raise BuildError(f"the base {recipe.base} is not pinned by digest")
    raw = inspect_raw(recipe.base)
    if "sha256:" + hashlib.sha256(raw).hexdigest() != index_digest:
        raise BuildError(f"the base {recipe.base} answered with another manifest")
    base_index = json.loads(raw)
    if _TO_OCI.get(base_index.get("mediaType"), base_index.get("mediaType")) != OCI_INDEX:
        raise BuildError(f"the base {recipe.base} is not a multi-platform index")
    layout.mkdir(parents=True, exist_ok=True)
    (layout / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
    manifests, platforms, diff_ids = [], {}, {}
    for spec in recipe.layers:
        os_, arch = spec.platform.split("/", 1)
        entry = _platform_entry(base_index, os_, arch)
        if entry is None:
            raise BuildError(f"the base {recipe.base} has no {spec.platform}")
        pull(f"{repository}@{entry['digest']}", layout, f"base-{arch}")
        manifest, config, layers = read_base(layout, _tagged(layout, f"base-{arch}"))
        body, diff_ids[spec.platform] = _platform_manifest(recipe, spec, fetcher, layout,
                                                           manifest, config, layers)
        desc = _write_blob(layout, body, OCI_MANIFEST)
        platforms[spec.platform] = desc["digest"]
        manifests.append({**desc, "platform": dict(entry["platform"])})
    index = _json({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": manifests})
    desc = _write_blob(layout, index, OCI_INDEX)
    _tag(layout, tag, desc)
    return Built(layout, tag, desc["digest"], platforms, diff_ids)


def _platform_entry(index: dict, os_: str, arch: str) -> dict | None:
    """The base's manifest for os/arch (arm64: v8 or no variant; never an attestation)."""
    for m in index.get("manifests", []):
        p = m.get("platform") or {}
        if p.get("os") == os_ and p.get("architecture") == arch and p.get("variant") in (
                None, "v8" if arch == "arm64" else None):
            return m
    return None


def _platform_manifest(recipe: Recipe, spec: PlatformLayer, fetcher: Fetcher, layout: Path,
                       manifest: dict, config: dict, layers: list[Path]) -> tuple[bytes, str]:
    """The platform's manifest, and its layer's diff_id."""
    files, symlinks = read_base_paths(layers, ("var/lib/dpkg/status", "etc/passwd",
                                               "etc/group"), ("var/lib/dpkg/status.d/",))
    tree = Tree()
    controls = [add_deb(tree, fetcher.fetch(d), symlinks) for d in spec.debs]
    check_depends(controls, installed_packages(files), recipe.script_only_depends,
                  spec.platform)
    wheels = [fetcher.fetch(w) for w in spec.wheels]
    _check_wheel_tags(spec, wheels)
    add_wheels(tree, wheels, recipe)
    uid, _, gid = recipe.user.partition(":")
    for path, line in (("etc/passwd", f"{recipe.user_name}:x:{uid}:{gid}::/nonexistent:"
                                      "/usr/sbin/nologin\n"),
                       ("etc/group", f"{recipe.user_name}:x:{gid}:\n")):
        base = files.get(path, b"")
        if base and not base.endswith(b"\n"):
            base += b"\n"
        tree.add(path, Entry("file", 0o644, data=base + line.encode()))
    check_symlinks(tree, symlinks, spec.platform)
    layer = tree.tar()
    diff_id = "sha256:" + hashlib.sha256(layer).hexdigest()
    layer_desc = _write_blob(layout, gzip.compress(layer, compresslevel=GZIP_LEVEL, mtime=0),
                             OCI_LAYER_GZIP)
    cfg = json.loads(json.dumps(config))
    cfg["rootfs"]["diff_ids"] = [*cfg["rootfs"]["diff_ids"], diff_id]
    created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(EPOCH))
    cfg["history"] = [*cfg.get("history", []), {
        "created": created, "created_by": recipe.created_by,
        "comment": ", ".join(p.filename for p in (*spec.debs, *spec.wheels))}]
    cfg["created"] = created
    run = cfg.setdefault("config", {})
    run.update(User=recipe.user, Entrypoint=list(recipe.entrypoint), Cmd=None,
               Labels={**(run.get("Labels") or {}), **recipe.labels})
    if recipe.exposed_ports:
        run["ExposedPorts"] = {f"{p}/tcp": {} for p in recipe.exposed_ports}
    config_desc = _write_blob(layout, _json(cfg), OCI_CONFIG)
    base_layers = [{"mediaType": _TO_OCI.get(d["mediaType"], d["mediaType"]),
                    "digest": d["digest"], "size": d["size"]} for d in manifest["layers"]]
    return _json({"schemaVersion": 2, "mediaType": OCI_MANIFEST, "config": config_desc,
                  "layers": [*base_layers, layer_desc]}), diff_id


_WHEEL_PLATFORM = {"amd64": ("x86_64",), "arm64": ("aarch64",)}


def _check_wheel_tags(spec: PlatformLayer, wheels: Sequence[Path]) -> None:
    arch = spec.platform.split("/", 1)[1]
    for wheel in wheels:
        platform_tag = wheel.name.removesuffix(".whl").split("-")[-1]
        tags = platform_tag.split(".")
        if not all(t == "any" or (t.startswith(("manylinux", "linux"))
                                  and t.endswith(_WHEEL_PLATFORM[arch])) for t in tags):
            raise BuildError(f"{spec.platform}: {wheel.name} is not a wheel for {arch}")


# --------------------------------------------------------------------------- OCI layout


def _json(obj: object) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


def _blob_path(layout: Path, digest: str) -> Path:
    algorithm, _, hexdigest = digest.partition(":")
    return layout / "blobs" / algorithm / hexdigest


def _blob(layout: Path, digest: str) -> bytes:
    return _blob_path(layout, digest).read_bytes()


def _write_blob(layout: Path, data: bytes, media_type: str) -> dict:
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    path = _blob_path(layout, digest)
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists():
        path.write_bytes(data)
    return {"mediaType": media_type, "digest": digest, "size": len(data)}


def _index(layout: Path) -> dict:
    path = layout / "index.json"
    return json.loads(path.read_text()) if path.exists() else {"schemaVersion": 2,
                                                               "manifests": []}


def _tagged(layout: Path, tag: str) -> str:
    for m in _index(layout)["manifests"]:
        if m.get("annotations", {}).get("org.opencontainers.image.ref.name") == tag:
            return m["digest"]
    raise BuildError(f"{layout}: no {tag}")


def _tag(layout: Path, tag: str, desc: dict) -> None:
    index = _index(layout)
    index["manifests"] = [m for m in index["manifests"] if m.get("annotations", {}).get(
        "org.opencontainers.image.ref.name") != tag]
    index["manifests"].append({**desc, "annotations": {"org.opencontainers.image.ref.name":
                                                       tag}})
    (layout / "index.json").write_text(json.dumps(index))
