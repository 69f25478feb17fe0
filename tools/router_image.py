"""The router image: the catalogue's Python base + one layer of the pinned router wheels
(vllm-router, sglang-router and what they need) and HAProxy from the base's Debian release, for
linux/amd64 and linux/arm64 (a system node group may be Graviton). `python -m tools mirror`
builds it (tools/image_build.py) and pushes it to the environment's ECR; nothing is built or
fetched at `cdk deploy`.

`images/router/lock.json` pins every input by URL and sha256; `python -m tools router-lock`
writes it again (maintainers, outside China: it reads PyPI, deb.debian.org and the base image
from its registry): pip's resolver for the wheels of each platform, and the Debian Packages
indices of bookworm, bookworm-updates and bookworm-security, checked against their signed
InRelease files, for HAProxy and the libraries the base lacks.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import lzma
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Iterable, Mapping

from config.arguments import ToolError, add_command, out_console
from config.context import ROOT
from config.images import IMAGES, ROUTER_LOCK as LOCK, router_tag
from tools.image_build import Pinned, PlatformLayer, Recipe, _http_get, _relations

PLATFORMS = ("linux/amd64", "linux/arm64")
_ARCH = {"linux/amd64": ("amd64", "x86_64"), "linux/arm64": ("arm64", "aarch64")}
# The user the router pods run as (k8s/router.py runs them as this uid).
USER, USER_NAME = "65532:65532", "router"
PORTS = (8000, 29000)


def load_lock(path: Path = LOCK) -> dict:
    return json.loads(path.read_text())


def recipe(lock: Mapping, base_source: str) -> Recipe:
    """The build of the lock on the base at `base_source` (registry/repository)."""
    py = lock["python"]
    return Recipe(
        base=f"{base_source}@{lock['base']['digest']}",
        layers=tuple(PlatformLayer(
            platform, wheels=tuple(Pinned(w["filename"], w["url"], w["sha256"])
                                   for w in spec["wheels"]),
            debs=tuple(Pinned(d["filename"], d["url"], d["sha256"]) for d in spec["debs"]))
            for platform, spec in sorted(lock["platforms"].items())),
        python=py["interpreter"], site_packages=py["site_packages"], scripts_dir=py["scripts"],
        user=USER, user_name=USER_NAME, entrypoint=("vllm-router",), exposed_ports=PORTS,
        labels={"org.opencontainers.image.title": "kvcache-eks router",
                "org.opencontainers.image.description": "vllm-router and sglang-router "
                "behind HAProxy, built by python -m tools mirror from images/router/lock.json"},
        script_only_depends=frozenset(lock["debian"]["script_only_depends"]),
        created_by="kvcache-eks tools/router_image.py from images/router/lock.json")


# --------------------------------------------------------------------------- re-lock

PYPI = "https://pypi.org/simple"
DEBIAN = "https://deb.debian.org/debian"
DEBIAN_SECURITY = "https://deb.debian.org/debian-security"
KEYRING = "/usr/share/keyrings/debian-archive-keyring.gpg"
# What a python:<ver>-slim-<release> base installs (docker-library/python's Dockerfile:
# debian:<release>-slim, i.e. Priority required + apt, then these and the libraries its Python
# was linked against). The lock leaves them out; the build checks them against the real base.
PYTHON_SLIM = ("apt", "ca-certificates", "netbase", "tzdata", "libbz2-1.0", "libexpat1",
               "libffi8", "liblzma5", "libncursesw6", "libreadline8", "libsqlite3-0", "libssl3",
               "libtinfo6", "libuuid1", "zlib1g", "libgdbm6", "libdb5.3")
# Depends that only maintainer scripts use (user creation, init scripts, debconf): the layer
# unpacks files and runs no script.
SCRIPT_ONLY = ("adduser", "lsb-base", "init-system-helpers", "dpkg", "debconf",
               "sysvinit-utils")


def relock(args: argparse.Namespace) -> int:
    old = load_lock()
    base = IMAGES[old["base"]["key"]]
    lock = {**old, "base": {"key": base.key, "source": base.source, "tag": base.tag,
                            "digest": base.digest}, "platforms": {}}
    suites = _debian_suites(old["debian"]["release"])
    for platform in PLATFORMS:
        arch, machine = _ARCH[platform]
        wheels = resolve_wheels(old["requirements"], old["python"]["version"], machine,
                                old["python"]["glibc"])
        index = _debian_index(suites, arch)
        debs = resolve_debs(index, old["debian"]["packages"], base_packages(index))
        haproxy = next(d for d in debs if d["package"] == "haproxy")
        if not haproxy["version"].startswith(old["debian"]["haproxy_series"] + "."):
            raise ToolError(f"haproxy {haproxy['version']} in {old['debian']['release']} is "
                            f"not the {old['debian']['haproxy_series']} series the front's "
                            "configuration is written for")
        lock["platforms"][platform] = {"wheels": wheels, "debs": debs}
    text = json.dumps(lock, indent=1, sort_keys=True) + "\n"
    LOCK.write_text(text)
    out_console.print(f"wrote {LOCK.relative_to(ROOT)}: tag {router_tag(text.encode())}")
    return 0


def resolve_wheels(requirements: Iterable[str], python: str, machine: str,
                   glibc: str) -> list[dict]:
    """pip's own resolver, for CPython `python` on manylinux up to glibc `glibc`."""
    major, minor = (int(x) for x in glibc.split("."))
    platforms = [f"manylinux_{major}_{m}_{machine}" for m in range(minor, 16, -1)]
    platforms.append(f"manylinux2014_{machine}")
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        cmd = [sys.executable, "-m", "pip", "install", "--isolated", "--dry-run",
               "--ignore-installed", "--quiet", "--report", str(report), "--only-binary=:all:",
               "--index-url", PYPI, "--python-version", python, "--implementation", "cp",
               "--abi", f"cp{python.replace('.', '')}", "--abi", "abi3", "--abi", "none",
               *(a for p in platforms for a in ("--platform", p)), "--target", f"{tmp}/t",
               *requirements]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        if proc.returncode != 0:
            raise ToolError(f"pip could not resolve the router wheels for {machine}: "
                            f"{proc.stderr.strip().splitlines()[-1:]}")
        installs = json.loads(report.read_text())["install"]
    out = []
    for item in installs:
        info = item["download_info"]
        out.append({"name": item["metadata"]["name"], "version": item["metadata"]["version"],
                    "filename": info["url"].rsplit("/", 1)[1], "url": info["url"],
                    "sha256": info["archive_info"]["hashes"]["sha256"]})
    return sorted(out, key=lambda w: w["name"].lower())


def _debian_suites(release: str) -> list[tuple[str, str]]:
    return [(DEBIAN, release), (DEBIAN, f"{release}-updates"),
            (DEBIAN_SECURITY, f"{release}-security")]


def _debian_index(suites: list[tuple[str, str]], arch: str) -> dict[str, dict]:
    """Package -> its newest paragraph across the suites (main), each index checked against
    its suite's InRelease, whose signature gpgv checks with Debian's archive keyring."""
    from debian.deb822 import Deb822
    from debian.debian_support import version_compare

    newest: dict[str, dict] = {}
    for archive, suite in suites:
        inrelease = _http_get(f"{archive}/dists/{suite}/InRelease", 60)
        with tempfile.NamedTemporaryFile() as fh:
            fh.write(inrelease)
            fh.flush()
            check = subprocess.run(["gpgv", "--keyring", KEYRING, fh.name],
                                   capture_output=True, timeout=60)
        if check.returncode != 0:
            raise ToolError(f"{archive}/dists/{suite}/InRelease: signature not valid")
        name = f"main/binary-{arch}/Packages.xz"
        sums = Deb822(inrelease.decode())["SHA256"]
        expected = next(line.split()[0] for line in sums.splitlines() if line.endswith(name))
        data = _http_get(f"{archive}/dists/{suite}/{name}", 300)
        if hashlib.sha256(data).hexdigest() != expected:
            raise ToolError(f"{archive}/dists/{suite}/{name}: sha256 differs from InRelease")
        for para in Deb822.iter_paragraphs(lzma.decompress(data).decode()):
            p = {**dict(para), "_archive": archive}
            old = newest.get(p["Package"])
            if old is None or version_compare(p["Version"], old["Version"]) > 0:
                newest[p["Package"]] = p
    return newest


def _depends(p: Mapping) -> list[str]:
    """First alternatives of Pre-Depends and Depends (architecture qualifiers dropped)."""
    return [group[0][0].split(":")[0] for f in ("Pre-Depends", "Depends")
            for group in _relations(p.get(f, ""))]


def _closure(index: Mapping[str, dict], roots: Iterable[str], skip: set[str]) -> list[str]:
    seen: list[str] = []
    todo = [r for r in roots]
    while todo:
        name = todo.pop()
        if name in seen or name in skip or name not in index:
            continue
        seen.append(name)
        todo += _depends(index[name])
    return seen


def base_packages(index: Mapping[str, dict]) -> set[str]:
    required = [n for n, p in index.items() if p.get("Priority") == "required"]
    return set(_closure(index, [*required, *PYTHON_SLIM], set()))


def resolve_debs(index: Mapping[str, dict], roots: Iterable[str], base: set[str]) -> list[dict]:
    names = _closure(index, roots, base | set(SCRIPT_ONLY))
    out = []
    for name in sorted(names):
        p = index[name]
        out.append({"package": name, "version": p["Version"], "filename":
                    p["Filename"].rsplit("/", 1)[1], "url": f"{p['_archive']}/{p['Filename']}",
                    "sha256": p["SHA256"]})
    return out


def register(sub: argparse._SubParsersAction) -> None:
    add_command(sub, "router-lock", relock, "re-resolve the router image's pinned wheels and "
                "Debian packages into images/router/lock.json (maintainers)", __doc__,
                env=False)
