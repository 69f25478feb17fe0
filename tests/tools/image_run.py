"""The router image as tools/image_build.py builds it, run: `python -m tests.tools.image_run OUT`.

The base is shaped like python:3.12-slim-bookworm and made from this Debian machine's own
installed packages (their files as dpkg placed them, their dpkg status): merged-/usr (`/bin`,
`/sbin`, `/lib`, `/lib64` symlinks into `usr/`, taken from this machine's root), the libraries
its Python links and the lock's Debian packages need, dash and coreutils, and a real CPython
3.12 in /usr/local (this machine's, the first of KVCACHE_CPYTHON312 or the `python3.12`s found;
none: the launchers are not run, and the report says so). The router image is then built from
the real lock (its wheels and .debs, fetched and cached under .build/router-image/) by the
project's own `build()`, unpacked by umoci (a real OCI runtime's unpacker) and its programs run
under chroot as the image's user: `haproxy -v`, `/bin/sh -c true`, the front's preStop hook
against a running HAProxy, and both routers' container commands with `--help`.

linux/arm64, where the kernel runs aarch64 programs through qemu-user (binfmt_misc, see
`binfmt_arm64`): the same on a base of bookworm's arm64 packages of the same shape, pinned in
tests/tools/arm64_base.json (`python -m tests.tools.image_run --lock-arm64-base` writes it from
Debian's signed indices), without a Python (no arm64 CPython 3.12 installs here): haproxy, sh
and the preStop hook run, the routers' launchers do not, and the report says so.

Reads OUT/commands.json (the rendered commands: {"pre_stop": argv, "router_pre_stop": argv,
"routers": {name: argv},
"api_key_file": path}, written by the test, which has the k8s modules loaded already) and writes
OUT/report.json: {"python": path | None, platform: {check: {"argv", "rc", "out"} |
{"skipped": why}} | {"skipped": why}}. Needs root (chroot, umoci); no registry: the base is
handed to `build()`.
"""
from __future__ import annotations

import glob
import hashlib
import io
import json
import os
import shutil
import socket
import stat
import subprocess
import sys
import tarfile
import time
from dataclasses import replace
from pathlib import Path

from tools import image_build
from tools.image_build import (
    OCI_CONFIG, OCI_INDEX, OCI_LAYER, OCI_MANIFEST, Fetcher, _json, _tag, _write_blob, build,
)
from tools.router_image import PYTHON_SLIM, SCRIPT_ONLY, _closure, load_lock, recipe

ROOT = Path(__file__).resolve().parents[2]
CACHE = ROOT / ".build" / "router-image"
PLATFORMS = ("linux/amd64", "linux/arm64")
ARM64_BASE = Path(__file__).with_name("arm64_base.json")
# bookworm's merged /usr, as the arm64 base lays its packages out
MERGED_USR = {"bin": "usr/bin", "sbin": "usr/sbin", "lib": "usr/lib"}
# What the base's layer is made of, besides the closure of PYTHON_SLIM and the lock's debs'
# Depends: the shell and the utilities the pod's commands call (sleep, cat).
BASE_EXTRA = ("dash", "coreutils", "libc-bin")
# Left out of the base as debian:*-slim leaves them out (/etc/dpkg/dpkg.cfg.d/docker).
BASE_EXCLUDE = ("usr/share/doc/", "usr/share/man/", "usr/share/info/", "usr/share/locale/",
                "usr/share/lintian/")
# The stdlib the routers' launchers never load (the real base ships them; they only cost time).
STDLIB_EXCLUDE = {"test", "idlelib", "tkinter", "turtledemo", "ensurepip", "lib2to3",
                  "site-packages", "pydoc_data"}
UID = 65532
# A change here or in what the base is made of: a new cached base.
VERSION = "4"


def _status() -> dict[str, dict]:
    from debian.deb822 import Deb822

    text = Path("/var/lib/dpkg/status").read_text()
    return {p["Package"]: dict(p) for p in Deb822.iter_paragraphs(text)
            if p.get("Status", "").endswith(" installed")}


def _package_files(name: str) -> list[str]:
    for candidate in (f"/var/lib/dpkg/info/{name}.list",
                      *glob.glob(f"/var/lib/dpkg/info/{name}:*.list")):
        if os.path.exists(candidate):
            return Path(candidate).read_text().splitlines()
    raise SystemExit(f"no file list of the installed package {name}")


def cpython312() -> Path | None:
    """A CPython 3.12 of this machine (its executable), or None."""
    found = [os.environ.get("KVCACHE_CPYTHON312", ""), shutil.which("python3.12") or "",
             "/usr/local/bin/python3.12", "/usr/bin/python3.12",
             *sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.12*/bin/python3.12")))]
    for exe in filter(None, found):
        try:
            out = subprocess.run([exe, "-c", "import sys, platform; print(sys.version_info[:2] "
                                  "== (3, 12) and platform.python_implementation() == 'CPython'"
                                  ", sys.executable)"], capture_output=True, text=True,
                                 timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            continue
        ok, _, path = out.stdout.strip().partition(" ")
        if out.returncode == 0 and ok == "True":
            return Path(os.path.realpath(path))
    return None


def base_packages(status: dict[str, dict], debs: list[dict]) -> list[str]:
    lock_names = {d["Package"] for d in debs}
    roots = [*PYTHON_SLIM, *BASE_EXTRA]
    roots.remove("apt")   # the base's apt: nothing here runs it
    for d in debs:
        roots += [g[0][0].split(":")[0] for f in ("Pre-Depends", "Depends")
                  for g in image_build._relations(d.get(f, ""))]
    return sorted(_closure(status, roots, lock_names | set(SCRIPT_ONLY)))


def _copy(src: str, rel: str, stage: Path) -> None:
    dst = stage / rel
    if os.path.islink(src):
        dst.parent.mkdir(parents=True, exist_ok=True)
        if not dst.is_symlink():
            os.symlink(os.readlink(src), dst)
    elif os.path.isdir(src):
        dst.mkdir(parents=True, exist_ok=True)
    elif os.path.isfile(src):
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dst)


def stage_base(stage: Path, packages: list[str], status: dict[str, dict],
               python: Path | None) -> None:
    """The base's root: this machine's top-level symlinks, the packages' files where they lie
    here (a package's `/lib/...` is this machine's `/usr/lib/...`), the Python."""
    stage.mkdir(parents=True)
    for entry in sorted(os.listdir("/")):
        if os.path.islink(f"/{entry}") and os.readlink(f"/{entry}").startswith("usr/"):
            os.symlink(os.readlink(f"/{entry}"), stage / entry)
    for name in packages:
        for path in _package_files(name):
            real = os.path.join(os.path.realpath(os.path.dirname(path) or "/"),
                                os.path.basename(path))
            rel = real.lstrip("/")
            if rel and not (rel + "/").startswith(BASE_EXCLUDE):
                _copy(real, rel, stage)
    if not (stage / "usr/bin/sh").exists():
        os.symlink("dash", stage / "usr/bin/sh")   # dash's postinst makes it
    for d, mode in (("tmp", 0o1777), ("root", 0o700), ("etc", 0o755)):
        (stage / d).mkdir(exist_ok=True)
        os.chmod(stage / d, mode)
    (stage / "etc/passwd").write_text("root:x:0:0:root:/root:/bin/bash\n"
                                      "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n")
    (stage / "etc/group").write_text("root:x:0:\nnogroup:x:65534:\n")
    (stage / "var/lib/dpkg").mkdir(parents=True, exist_ok=True)
    from debian.deb822 import Deb822
    (stage / "var/lib/dpkg/status").write_text(
        "".join(Deb822(status[n]).dump() + "\n" for n in packages))
    if python is not None:
        prefix = python.parent.parent
        local = stage / "usr/local"
        (local / "bin").mkdir(parents=True)
        shutil.copy2(python, local / "bin/python3.12")
        for link in ("python3", "python"):
            os.symlink("python3.12", local / "bin" / link)
        (local / "lib").mkdir(parents=True)
        for lib in prefix.glob("lib/libpython3.12.so*"):
            _copy(str(lib), f"usr/local/lib/{lib.name}", stage)
        src = prefix / "lib/python3.12"
        for dirpath, dirnames, filenames in os.walk(src):
            rel = Path(dirpath).relative_to(src)
            if rel == Path("."):
                dirnames[:] = [d for d in dirnames if d not in STDLIB_EXCLUDE
                               and not d.startswith("config-")]
            dirnames[:] = [d for d in dirnames if d not in ("test", "tests")]
            (local / "lib/python3.12" / rel).mkdir(parents=True, exist_ok=True)
            for f in filenames:
                if f.endswith((".py", ".so")) or f.endswith(".cpython-312.pyc"):
                    _copy(os.path.join(dirpath, f), f"usr/local/lib/python3.12/{rel}/{f}", stage)
        (local / "lib/python3.12/site-packages").mkdir()
        if shutil.which("strip"):   # debug info: a third of the base, and unpacked each run
            subprocess.run(["strip", "--strip-debug", str(local / "bin/python3.12"),
                            *map(str, local.glob("lib/libpython3.12.so.*")),
                            *map(str, local.glob("lib/python3.12/lib-dynload/*.so"))],
                           check=True, capture_output=True)
    # the dynamic linker's cache, /usr/local/lib included (the real base runs ldconfig)
    subprocess.run(["ldconfig", "-r", str(stage)], check=True, capture_output=True)


def tar_tree(stage: Path) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for dirpath, dirnames, filenames in os.walk(stage):
            dirnames.sort()
            for name in sorted([*dirnames, *filenames]):
                path = os.path.join(dirpath, name)
                info = tar.gettarinfo(path, os.path.relpath(path, stage))
                info.uid = info.gid = 0
                info.uname = info.gname = ""
                if info.isreg():
                    with open(path, "rb") as fh:
                        tar.addfile(info, fh)
                else:
                    tar.addfile(info)
    return buf.getvalue()


def _layout(layer: bytes, arch: str, cmd: list[str]) -> Path:
    """A one-layer OCI layout in a scratch folder of CACHE; returns it."""
    out = CACHE / f"tmp-{os.getpid()}-{arch}"
    shutil.rmtree(out, ignore_errors=True)
    (out / "blobs").mkdir(parents=True)
    (out / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
    config = _write_blob(out, _json({
        "architecture": arch, "os": "linux", "created": "2026-10-01T00:00:00Z",
        "config": {"Env": ["PATH=/usr/local/bin:/usr/local/sbin:/usr/sbin:/usr/bin:/sbin:/bin",
                           "LANG=C.UTF-8"], "Cmd": cmd},
        "rootfs": {"type": "layers", "diff_ids": ["sha256:" + hashlib.sha256(layer).hexdigest()]},
        "history": [{"created": "2026-10-01T00:00:00Z", "created_by": "image_run"}]}), OCI_CONFIG)
    manifest = _write_blob(out, _json({"schemaVersion": 2, "mediaType": OCI_MANIFEST,
                                       "config": config,
                                       "layers": [_write_blob(out, layer, OCI_LAYER)]}),
                           OCI_MANIFEST)
    _tag(out, "base", manifest)
    return out


def _cached(arch: str, key: str, make) -> Path:
    """CACHE/base-<arch>-<key>, made by `make()` where absent; older bases of `arch` go."""
    layout = CACHE / f"base-{arch}-{key}"
    if not (layout / "index.json").exists():
        made = make()
        for old in CACHE.glob(f"base-{arch}-*"):
            shutil.rmtree(old)
        made.rename(layout)
    return layout


def amd64_base(debs: list[dict], python: Path | None) -> Path:
    """The amd64 base from this machine's packages, as an OCI layout (cached under the key of
    what it is made of)."""
    status = _status()
    packages = base_packages(status, debs)
    key = hashlib.sha256(json.dumps([VERSION, [status[n]["Version"] for n in packages],
                                     packages, str(python)]).encode()).hexdigest()[:16]

    def make() -> Path:
        stage = CACHE / f"tmp-{os.getpid()}-root"
        shutil.rmtree(stage, ignore_errors=True)
        stage_base(stage, packages, status, python)
        layout = _layout(tar_tree(stage), "amd64", ["python3"])
        shutil.rmtree(stage)
        return layout
    return _cached("amd64", key, make)


def arm64_base(fetcher: Fetcher) -> Path:
    """The arm64 base from the pinned bookworm packages, unpacked as on merged /usr."""
    from debian.debfile import DebFile

    pins = json.loads(ARM64_BASE.read_text())["packages"]
    key = hashlib.sha256(json.dumps([VERSION, pins]).encode()).hexdigest()[:16]

    def make() -> Path:
        buf = io.BytesIO()
        controls = []
        with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
            def add(info: tarfile.TarInfo, data: bytes | None = None) -> None:
                info.uid = info.gid = 0
                info.uname = info.gname = ""
                tar.addfile(info, io.BytesIO(data) if data is not None else None)

            for top, target in MERGED_USR.items():
                info = tarfile.TarInfo(top)
                info.type, info.linkname, info.mode = tarfile.SYMTYPE, target, 0o777
                add(info)
            for pin in pins:
                deb = DebFile(str(fetcher.fetch(image_build.Pinned(
                    pin["filename"], pin["url"], pin["sha256"]))))
                controls.append(dict(deb.debcontrol()))
                with deb.data.tgz() as data:
                    for m in data.getmembers():
                        name = _merged(m.name)
                        if not name or name in MERGED_USR or (name + "/").startswith(
                                BASE_EXCLUDE):
                            continue
                        body = data.extractfile(m).read() if m.isfile() else None
                        m.name = name
                        if m.islnk():
                            m.linkname = _merged(m.linkname)
                        add(m, body)
            for name, text in (("etc/passwd", "root:x:0:0:root:/root:/bin/bash\n"),
                               ("etc/group", "root:x:0:\n"), ("var/lib/dpkg/status", "".join(
                                   _paragraph(c) for c in controls))):
                info = tarfile.TarInfo(name)
                info.size, info.mode = len(text.encode()), 0o644
                add(info, text.encode())
            for name, target in (("usr/bin/sh", "dash"),):   # dash's postinst makes it
                info = tarfile.TarInfo(name)
                info.type, info.linkname, info.mode = tarfile.SYMTYPE, target, 0o777
                add(info)
            info = tarfile.TarInfo("tmp")
            info.type, info.mode = tarfile.DIRTYPE, 0o1777
            add(info)
        return _layout(buf.getvalue(), "arm64", ["sh"])
    return _cached("arm64", key, make)


def _merged(name: str) -> str:
    """A package's path on merged /usr (`lib/x` is `usr/lib/x`)."""
    name = image_build._clean(name)
    top, _, rest = name.partition("/")
    return f"{MERGED_USR[top]}/{rest}".rstrip("/") if top in MERGED_USR and rest else name


def _paragraph(control: dict) -> str:
    from debian.deb822 import Deb822

    return Deb822({**control, "Status": "install ok installed"}).dump() + "\n"


def lock_arm64_base() -> None:
    """Writes ARM64_BASE: the arm64 packages of the amd64 base's shape (PYTHON_SLIM's libraries,
    dash, coreutils, what the lock's debs depend on), from bookworm's signed indices."""
    from tools.router_image import _debian_index, _debian_suites, _depends

    lock = load_lock()
    index = _debian_index(_debian_suites(lock["debian"]["release"]), "arm64")
    layer = {d["package"] for d in lock["platforms"]["linux/arm64"]["debs"]}
    roots = [*(p for p in PYTHON_SLIM if p != "apt"), *BASE_EXTRA,
             *(d for n in sorted(layer) for d in _depends(index[n]))]
    names = sorted(_closure(index, roots, layer | set(SCRIPT_ONLY)))
    ARM64_BASE.write_text(json.dumps({"release": lock["debian"]["release"], "packages": [
        {"package": n, "version": index[n]["Version"],
         "filename": index[n]["Filename"].rsplit("/", 1)[1],
         "url": f"{index[n]['_archive']}/{index[n]['Filename']}",
         "sha256": index[n]["SHA256"]} for n in names]}, indent=1) + "\n")


def pull_from(bases: list[Path]):
    """build()'s `pull`: a base's platform manifest and its blobs, linked into the layout."""
    def pull(ref: str, layout: Path, tag: str) -> None:
        digest = ref.rpartition("@")[2]
        blob = lambda d: Path("blobs/sha256") / d.split(":")[1]   # noqa: E731
        base = next(b for b in bases if (b / blob(digest)).exists())
        manifest = json.loads((base / blob(digest)).read_bytes())
        for d in (digest, manifest["config"]["digest"], *(l["digest"] for l in
                                                           manifest["layers"])):
            dst = layout / blob(d)
            dst.parent.mkdir(parents=True, exist_ok=True)
            if not dst.exists():
                os.link(base / blob(d), dst)
        _tag(layout, tag, {"mediaType": OCI_MANIFEST, "digest": digest,
                           "size": (base / blob(digest)).stat().st_size})
    return pull


def binfmt_arm64() -> tuple[str | None, str | None]:
    """(why aarch64 programs cannot run here or None, the interpreter path a chroot must hold
    or None): the kernel's binfmt_misc entry for aarch64 ELF files (qemu-user-static's)."""
    entry = Path("/proc/sys/fs/binfmt_misc/qemu-aarch64")
    try:
        text = entry.read_text()
    except OSError:
        return ("binfmt_misc has no qemu-aarch64 entry (mounted at /proc/sys/fs/binfmt_misc, "
                "with Debian's qemu-user-static and binfmt-support: scripts/debian-tools)", None)
    if not text.startswith("enabled"):
        return "binfmt_misc's qemu-aarch64 entry is disabled", None
    fields = dict(line.split(" ", 1) for line in text.splitlines()[1:] if " " in line)
    # F: the kernel opened the interpreter when it was registered; otherwise it opens it at
    # exec time, inside the chroot
    return None, None if "F" in fields.get("flags:", "") else fields["interpreter"]


def _run(rootfs: Path, env: list[str], argv: list[str], timeout: float = 60) -> dict:
    cmd = ["chroot", f"--userspec={UID}:{UID}", str(rootfs), *argv]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=dict(
            e.split("=", 1) for e in env))
    except subprocess.TimeoutExpired:
        return {"argv": argv, "rc": "timeout", "out": ""}
    return {"argv": argv, "rc": proc.returncode, "out": _cut(proc.stdout + proc.stderr)}


def _cut(text: str) -> str:
    """Its head (a usage line) and its tail (an error), at most 4000 characters."""
    return text if len(text) <= 4000 else f"{text[:2000]}\n[...]\n{text[-2000:]}"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pre_stop(rootfs: Path, env: list[str], hook: list[str]) -> dict:
    """The front's preStop hook, as the test passes it (rendered, with no NLB grace), against a
    HAProxy running in the image: it soft-stops it, returns once it has exited, and leaves the
    file (its last argument) that the router's hook waits for, on the pod's shared emptyDir."""
    done = rootfs / hook[-1].lstrip("/")
    done.parent.mkdir(parents=True, exist_ok=True)
    os.chmod(done.parent, 0o777)   # an emptyDir is world-writable; the hook runs as UID
    port = _free_port()
    (rootfs / "tmp/front.cfg").write_text(
        "defaults\n  mode http\n  timeout connect 1s\n  timeout client 5s\n  timeout server 5s\n"
        f"frontend f\n  bind 127.0.0.1:{port}\n  http-request return status 200\n")
    front = subprocess.Popen(["chroot", f"--userspec={UID}:{UID}", str(rootfs), "haproxy",
                              "-db", "-f", "/tmp/front.cfg"], stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True,
                             env=dict(e.split("=", 1) for e in env))
    try:
        for _ in range(100):   # at most 10 s for it to listen
            if front.poll() is not None:
                return {"argv": ["haproxy", "-db"], "rc": front.returncode,
                        "out": _cut(front.stderr.read())}
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            except OSError:
                time.sleep(0.1)
        argv = hook
        hook_run = subprocess.Popen(["chroot", f"--userspec={UID}:{UID}", str(rootfs), *argv],
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                    env=dict(e.split("=", 1) for e in [*env,
                                                                       f"FRONT_PID={front.pid}"]))
        try:
            front_rc = front.wait(20)   # reaped here, as a runtime reaps its PID 1
            out, _ = hook_run.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            hook_run.kill()
            return {"argv": argv, "rc": "timeout", "out": hook_run.communicate()[0]}
        return {"argv": argv, "rc": hook_run.returncode, "out": _cut(out),
                "front_rc": front_rc, "front_done": done.exists()}
    finally:
        if front.poll() is None:
            front.kill()
            front.wait()


def run_platform(built, platform: str, out: Path, python: Path | None, commands: dict,
                 interpreter: str | None) -> dict:
    """Unpacks `platform`'s image of `built` with umoci and runs the checks in it."""
    arch = platform.split("/")[1]
    blob = lambda d: built.layout / "blobs/sha256" / d.split(":")[1]   # noqa: E731
    _tag(built.layout, f"router-{arch}", {"mediaType": OCI_MANIFEST,
                                           "digest": built.platforms[platform],
                                           "size": blob(built.platforms[platform]).stat().st_size})
    # umoci's own layer application (whiteouts, symlinks, what replaces what); `raw` skips
    # the runtime bundle's mtree, a third of its time
    rootfs = out / f"rootfs-{arch}"
    subprocess.run(["umoci", "raw", "unpack", "--image", f"{built.layout}:router-{arch}",
                    str(rootfs)], check=True, capture_output=True, timeout=300)
    manifest = json.loads(blob(built.platforms[platform]).read_bytes())
    config = json.loads(blob(manifest["config"]["digest"]).read_bytes())["config"]
    env = config["Env"]
    # what a runtime mounts: /dev/null, the fetched key file
    (rootfs / "dev").mkdir(exist_ok=True)
    os.mknod(rootfs / "dev/null", stat.S_IFCHR | 0o666, os.makedev(1, 3))
    os.chmod(rootfs / "dev/null", 0o666)
    key = rootfs / commands["api_key_file"].lstrip("/")
    key.parent.mkdir(parents=True, exist_ok=True)
    key.write_text("test-key\n")
    if interpreter:   # qemu-user, where binfmt_misc looks for it from inside the chroot
        dst = rootfs / interpreter.lstrip("/")
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(os.path.realpath(interpreter), dst)
    report = {"haproxy -v": _run(rootfs, env, ["haproxy", "-v"]),
              "sh -c true": _run(rootfs, env, ["/bin/sh", "-c", "true"]),
              "preStop": pre_stop(rootfs, env, commands["pre_stop"]),
              "routerPreStop": _run(rootfs, env, commands["router_pre_stop"]),
              "entrypoint": config["Entrypoint"]}
    for name, argv in commands["routers"].items():
        if python is None:
            report[name] = {"skipped": f"no CPython 3.12 for {arch} on this machine to be "
                                       "the base's Python"}
        else:
            report[name] = _run(rootfs, env, [*argv, "--help"])
    return report


def main() -> int:
    if sys.argv[1:] == ["--lock-arm64-base"]:
        lock_arm64_base()
        return 0
    from debian.debfile import DebFile

    if os.uname().machine != "x86_64":
        raise SystemExit("the amd64 base is made of this machine's packages: run on x86_64")
    out = Path(sys.argv[1])
    commands = json.loads((out / "commands.json").read_text())
    python = cpython312()
    arm64_not_run, interpreter = binfmt_arm64()
    fetcher = Fetcher(CACHE / "files")
    r = recipe(load_lock(), "fake.invalid/library/python")
    layers = {s.platform: s for s in r.layers}
    debs = [dict(DebFile(str(fetcher.fetch(d))).debcontrol())
            for d in layers["linux/amd64"].debs]
    bases = {"linux/amd64": amd64_base(debs, python)}
    if not arm64_not_run:
        bases["linux/arm64"] = arm64_base(fetcher)
    manifests = []
    for platform, base in bases.items():
        (desc,) = json.loads((base / "index.json").read_text())["manifests"]
        os_, arch = platform.split("/")
        manifests.append({"mediaType": OCI_MANIFEST, "digest": desc["digest"],
                          "size": desc["size"], "platform": {"architecture": arch, "os": os_,
                          **({"variant": "v8"} if arch == "arm64" else {})}})
    index = _json({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": manifests})
    r = replace(r, base=f"fake.invalid/library/python@sha256:{hashlib.sha256(index).hexdigest()}",
                layers=tuple(layers[p] for p in bases))
    image_build.GZIP_LEVEL = 0   # stored: the bytes change, not what they hold; faster here
    built = build(r, fetcher, out / "layout", "router", inspect_raw=lambda ref: index,
                  pull=pull_from(list(bases.values())))
    report: dict = {"python": python and str(python)}
    for platform in PLATFORMS:
        if platform not in bases:
            report[platform] = {"skipped": arm64_not_run}
            continue
        report[platform] = run_platform(
            built, platform, out, python if platform == "linux/amd64" else None, commands,
            interpreter if platform == "linux/arm64" else None)
    (out / "report.json").write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
