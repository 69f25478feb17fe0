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

Reads OUT/commands.json (the rendered commands: {"pre_stop": argv, "routers": {name: argv},
"api_key_file": path}, written by the test, which has the k8s modules loaded already) and writes
OUT/report.json: {"python": path | None, platform: {check: {"argv", "rc", "out"} |
{"skipped": why}}}. Needs root (chroot, umoci); no registry: the base is handed to `build()`.
linux/arm64 would need an arm64 CPython 3.12 and bookworm's arm64 libraries; see
docs/operations.md ("The router image") for what is and is not run here.
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
PLATFORM = "linux/amd64"
# What the base's layer is made of, besides the closure of PYTHON_SLIM and the lock's debs'
# Depends: the shell and the utilities the pod's commands call (sleep, cat).
BASE_EXTRA = ("dash", "coreutils", "libc-bin")
# Left out of the base as debian:*-slim leaves them out (/etc/dpkg/dpkg.cfg.d/docker).
BASE_EXCLUDE = ("usr/share/doc/", "usr/share/man/", "usr/share/info/", "usr/share/locale/",
                "usr/share/lintian/")
# The stdlib the routers' launchers never load (the real base ships them; they only cost time).
STDLIB_EXCLUDE = {"test", "idlelib", "tkinter", "turtledemo", "ensurepip", "lib2to3",
                  "site-packages", "unittest", "pydoc_data"}
UID = 65532
# A change here or in what the base is made of: a new cached base.
VERSION = "2"


def _status() -> dict[str, dict]:
    from debian.deb822 import Deb822

    text = Path("/var/lib/dpkg/status").read_text()
    return {p["Package"]: dict(p) for p in Deb822.iter_paragraphs(text)
            if p.get("Status", "").endswith(" installed")}


def _package_files(name: str) -> list[str]:
    for candidate in (f"/var/lib/dpkg/info/{name}.list", f"/var/lib/dpkg/info/{name}:amd64.list"):
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


def base_layout(debs: list[dict], python: Path | None) -> tuple[Path, bytes]:
    """The fake base as an OCI layout (cached: its key is what it is made of); returns the
    layout and its index's bytes."""
    status = _status()
    packages = base_packages(status, debs)
    key = hashlib.sha256(json.dumps([VERSION, [status[n]["Version"] for n in packages],
                                     packages, str(python)]).encode()).hexdigest()[:16]
    layout = CACHE / f"base-{key}"
    if not (layout / "index.json").exists():
        tmp = CACHE / f"tmp-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        stage_base(tmp / "root", packages, status, python)
        layer = tar_tree(tmp / "root")
        out = tmp / "layout"
        (out / "blobs").mkdir(parents=True)
        (out / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
        config = _write_blob(out, _json({
            "architecture": "amd64", "os": "linux", "created": "2026-10-01T00:00:00Z",
            "config": {"Env": ["PATH=/usr/local/bin:/usr/local/sbin:/usr/sbin:/usr/bin:/sbin:"
                               "/bin", "LANG=C.UTF-8"], "Cmd": ["python3"]},
            "rootfs": {"type": "layers",
                       "diff_ids": ["sha256:" + hashlib.sha256(layer).hexdigest()]},
            "history": [{"created": "2026-10-01T00:00:00Z", "created_by": "image_run"}]}),
            OCI_CONFIG)
        manifest = _write_blob(out, _json({"schemaVersion": 2, "mediaType": OCI_MANIFEST,
                                           "config": config,
                                           "layers": [_write_blob(out, layer, OCI_LAYER)]}),
                               OCI_MANIFEST)
        index = _json({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": [
            {**manifest, "platform": {"architecture": "amd64", "os": "linux"}}]})
        _tag(out, "index", _write_blob(out, index, OCI_INDEX))
        shutil.rmtree(layout, ignore_errors=True)
        out.rename(layout)
        shutil.rmtree(tmp)
    index_digest = json.loads((layout / "index.json").read_text())["manifests"][0]["digest"]
    return layout, (layout / "blobs/sha256" / index_digest.split(":")[1]).read_bytes()


def pull_from(base: Path):
    """build()'s `pull`: the base's platform manifest and its blobs, linked into the layout."""
    def pull(ref: str, layout: Path, tag: str) -> None:
        digest = ref.rpartition("@")[2]
        blob = lambda d: Path("blobs/sha256") / d.split(":")[1]   # noqa: E731
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
    """The front's preStop hook, as rendered but with no NLB grace, against a HAProxy running in
    the image: it soft-stops it and returns once it has exited."""
    if not hook[-1].isdigit():
        return {"argv": hook, "rc": "the hook's last argument is not its grace seconds",
                "out": ""}
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
        argv = [*hook[:-1], "0"]
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
                "front_rc": front_rc}
    finally:
        if front.poll() is None:
            front.kill()
            front.wait()


def run_platform(out: Path, python: Path | None, commands: dict) -> dict:
    lock = load_lock()
    fetcher = Fetcher(CACHE / "files")
    r = recipe(lock, "fake.invalid/library/python")
    spec = next(s for s in r.layers if s.platform == PLATFORM)
    from debian.debfile import DebFile
    debs = [dict(DebFile(str(fetcher.fetch(d))).debcontrol()) for d in spec.debs]
    base, index = base_layout(debs, python)
    r = replace(r, base=f"fake.invalid/library/python@sha256:{hashlib.sha256(index).hexdigest()}",
                layers=(spec,))
    image_build.GZIP_LEVEL = 0   # stored: the bytes change, not what they hold; faster here
    built = build(r, fetcher, out / "layout", "router", inspect_raw=lambda ref: index,
                  pull=pull_from(base))
    # umoci's own layer application (whiteouts, symlinks, what replaces what); `raw` skips
    # the runtime bundle's mtree, a third of its time
    rootfs = out / "rootfs"
    subprocess.run(["umoci", "raw", "unpack", "--image", f"{built.layout}:router", str(rootfs)],
                   check=True, capture_output=True, timeout=300)
    manifest = json.loads((built.layout / "blobs/sha256" / built.platforms[PLATFORM].split(
        ":")[1]).read_bytes())
    config = json.loads((built.layout / "blobs/sha256" / manifest["config"]["digest"].split(
        ":")[1]).read_bytes())["config"]
    env = config["Env"]
    # what a runtime mounts: /dev/null, the fetched key file
    (rootfs / "dev").mkdir(exist_ok=True)
    os.mknod(rootfs / "dev/null", stat.S_IFCHR | 0o666, os.makedev(1, 3))
    os.chmod(rootfs / "dev/null", 0o666)
    key = rootfs / commands["api_key_file"].lstrip("/")
    key.parent.mkdir(parents=True, exist_ok=True)
    key.write_text("test-key\n")
    report = {"haproxy -v": _run(rootfs, env, ["haproxy", "-v"]),
              "sh -c true": _run(rootfs, env, ["/bin/sh", "-c", "true"]),
              "preStop": pre_stop(rootfs, env, commands["pre_stop"]),
              "entrypoint": config["Entrypoint"]}
    for name, argv in commands["routers"].items():
        if python is None:
            report[name] = {"skipped": "no CPython 3.12 on this machine for the base"}
        else:
            report[name] = _run(rootfs, env, [*argv, "--help"])
    return report


def main() -> int:
    out = Path(sys.argv[1])
    commands = json.loads((out / "commands.json").read_text())
    python = cpython312()
    report = {"python": python and str(python),
              PLATFORM: run_platform(out, python, commands)}
    (out / "report.json").write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
