"""mirror against two real registries on 127.0.0.1 (Debian's docker-registry), with skopeo.

The source is seeded with images and charts built here as OCI layouts: a multi-arch image
pinned by digest, a single-arch image pinned by tag only, a Helm chart in an OCI registry and a
Helm chart in a plain HTTP chart repository.
"""
from __future__ import annotations

import argparse
import contextlib
import functools
import gzip
import hashlib
import http.server
import io
import json
import os
import shutil
import socket
import stat
import subprocess
import tarfile
import threading
import time
import urllib.request
from pathlib import Path
from types import SimpleNamespace
from typing import Iterator

import boto3
import pytest
from botocore.stub import Stubber

import config.images
import k8s.serving  # noqa: F401  (its module-level tables read the real catalogue: loaded
#                    before a test patches config.images.IMAGES, whatever ran first)
from config.images import Image
from tools.__main__ import main
from config.arguments import ToolError, load_environment
from tools.cli import Aws
from tools.mirror import (
    OCI_MANIFEST, ChartRef, Mirror, Skopeo, ecr_authfile, write_blob, write_oci_layout,
)
from tools.mirror import main as mirror_main
import tools.mirror as mirror_module

INDEX = "application/vnd.oci.image.index.v1+json"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def targz(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, content in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mtime = len(content), 0
            tar.addfile(info, io.BytesIO(content))
    return gzip.compress(buf.getvalue(), mtime=0)


def image_manifest(root: Path, arch: str, text: str) -> bytes:
    layer = targz({"hello.txt": text.encode()})
    diff_id = "sha256:" + hashlib.sha256(gzip.decompress(layer)).hexdigest()
    cfg = write_blob(root, json.dumps({"architecture": arch, "os": "linux", "config": {},
                                       "rootfs": {"type": "layers", "diff_ids": [diff_id]}}
                                      ).encode(), "application/vnd.oci.image.config.v1+json")
    return json.dumps({"schemaVersion": 2, "mediaType": OCI_MANIFEST, "config": cfg, "layers": [
        write_blob(root, layer, "application/vnd.oci.image.layer.v1.tar+gzip")]}).encode()


def chart_tgz(name: str, version: str) -> bytes:
    return targz({f"{name}/Chart.yaml": f"apiVersion: v2\nname: {name}\nversion: {version}\n"
                  .encode(), f"{name}/values.yaml": b"replicas: 1\n"})


@contextlib.contextmanager
def registry(root: Path, access_log: Path | None = None) -> Iterator[str]:
    """docker-registry on 127.0.0.1; with `access_log`, its access log (a line per request)
    goes to that file."""
    port = free_port()
    (root / "data").mkdir(parents=True)
    conf = root / "config.yml"
    logging = "  accesslog:\n    disabled: false\n" if access_log else ""
    conf.write_text(f"version: 0.1\nlog:\n  level: error\n{logging}storage:\n  filesystem:\n"
                    f"    rootdirectory: {root / 'data'}\nhttp:\n  addr: 127.0.0.1:{port}\n")
    with open(access_log or os.devnull, "wb") as out:
        proc = subprocess.Popen(["docker-registry", "serve", str(conf)], stdout=out,
                                stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/", timeout=1)
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError("docker-registry did not start")
                time.sleep(0.05)
        yield f"127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=5)


@contextlib.contextmanager
def chart_repository(root: Path, name: str, version: str) -> Iterator[str]:
    """A plain HTTP Helm repository: index.yaml and one chart archive."""
    root.mkdir()
    data = chart_tgz(name, version)
    (root / f"{name}-{version}.tgz").write_bytes(data)
    (root / "index.yaml").write_text(
        f"apiVersion: v1\nentries:\n  {name}:\n  - name: {name}\n    version: {version}\n"
        f"    digest: {hashlib.sha256(data).hexdigest()}\n    urls: [{name}-{version}.tgz]\n")
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    handler.log_message = lambda *a: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                     daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def publish_world(layout: Path, src: str, image_text: str, tool_text: str
                  ) -> tuple[bytes, Skopeo]:
    """Pushes the test world's artifacts to the registry `src`: a two-platform image
    (test/app:1.0, its index returned), a one-platform image (test/tool:2.1) and an OCI Helm
    chart (charts/demo:0.1.0)."""
    plat = [(arch, image_manifest(layout, arch, f"{image_text} {arch}"))
            for arch in ("amd64", "arm64")]
    index = json.dumps({"schemaVersion": 2, "mediaType": INDEX, "manifests": [
        {**write_blob(layout, body, OCI_MANIFEST), "platform": {"architecture": arch,
                                                                "os": "linux"}}
        for arch, body in plat]}).encode()
    helm = json.dumps({"schemaVersion": 2, "mediaType": OCI_MANIFEST,
                       "config": write_blob(layout, b'{"name":"demo","version":"0.1.0"}',
                                            "application/vnd.cncf.helm.config.v1+json"),
                       "layers": [write_blob(layout, chart_tgz("demo", "0.1.0"),
                                             "application/vnd.cncf.helm.chart.content.v1"
                                             ".tar+gzip")]}).encode()
    write_oci_layout(layout, [("1.0", index, {"mediaType": INDEX}),
                              ("2.1", image_manifest(layout, "amd64", tool_text),
                               {"mediaType": OCI_MANIFEST}),
                              ("0.1.0", helm, {"mediaType": OCI_MANIFEST})])
    skopeo = Skopeo(src_tls_verify=False, dest_tls_verify=False)
    for tag, ref in (("1.0", "test/app:1.0"), ("2.1", "test/tool:2.1"),
                     ("0.1.0", "charts/demo:0.1.0")):
        skopeo.copy(f"oci:{layout}:{tag}", f"docker://{src}/{ref}")
    return index, skopeo


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> Iterator[dict]:
    for tool in ("skopeo", "docker-registry"):
        assert shutil.which(tool), f"{tool} is needed: apt-get install skopeo docker-registry"
    tmp = tmp_path_factory.mktemp("mirror")
    with registry(tmp / "src") as src, registry(tmp / "dst") as dst, \
            chart_repository(tmp / "charts", "web", "1.2.3") as repo:
        index, skopeo = publish_world(tmp / "layout", src, "hello", "tool")
        yield {
            "src": src, "dst": dst, "skopeo": skopeo,
            "images": [
                Image("app", f"{src}/test/app", "1.0",
                      "sha256:" + hashlib.sha256(index).hexdigest(), "multi-arch, pinned"),
                Image("tool", f"{src}/test/tool", "2.1", None, "pinned by tag only"),
            ],
            "charts": [
                ChartRef.of("demo", {"repository": f"oci://{src}/charts", "chart": "demo",
                                     "version": "0.1.0"}),
                ChartRef.of("web", {"repository": repo, "name": "web", "version": "1.2.3"}),
            ],
        }


def test_mirror_copies_by_digest_then_a_second_run_copies_nothing(world, monkeypatch, capsys,
                                                                  tmp_path):
    skopeo, dst = world["skopeo"], world["dst"]
    first = Mirror(skopeo, dst).run(world["images"], world["charts"], progress=False)
    assert [(r.key, r.action) for r in first.rows] == [
        ("app", "copied"), ("tool", "copied"), ("demo", "copied"), ("web", "copied")], first.rows
    for image in world["images"]:
        src_digest = skopeo.digest(f"{image.source}:{image.tag}", dest=False)
        assert skopeo.digest(f"{dst}/kvcache/test/{image.key}:{image.tag}", dest=True) \
            == src_digest == next(r.digest for r in first.rows if r.key == image.key)
    assert skopeo.digest(f"{dst}/kvcache/charts/demo:0.1.0", dest=True) == skopeo.digest(
        f"{world['src']}/charts/demo:0.1.0", dest=False)
    # --all: every platform of the index came along, addressable by its own digest
    index = json.loads(skopeo.manifest(f"{dst}/kvcache/test/app:1.0", dest=True))
    for m in index["manifests"]:
        assert skopeo.digest(f"{dst}/kvcache/test/app@{m['digest']}", dest=True) == m["digest"]
    # the HTTP chart became a Helm OCI artifact holding the very archive the index pins
    web = json.loads(skopeo.manifest(f"{dst}/kvcache/charts/web:1.2.3", dest=True))
    assert web["config"]["mediaType"] == "application/vnd.cncf.helm.config.v1+json"
    assert web["layers"][0]["digest"] == next(r.digest for r in first.rows if r.key == "web")

    # Second run, through the command line with this catalogue: nothing copied.
    # The catalogue holds `app`; `tool` is an endpoint file's worker image: both are mirrored.
    monkeypatch.setattr(config.images, "IMAGES", {i.key: i for i in world["images"][:1]})
    monkeypatch.setattr(config.images, "IMAGES_LOCK", tmp_path / "images.lock.json")
    monkeypatch.setattr(config.images, "CHARTS", {c.key: c for c in world["charts"]},
                        raising=False)
    monkeypatch.setattr(mirror_module, "load_endpoints",
                        lambda cfg: (SimpleNamespace(image=world["images"][1],
                                                     l2_enabled=False, l2_url=None,
                                                     pod=SimpleNamespace(init_containers=())),))
    assert main(["mirror", "--env", "dev", "--dest-registry", dst, "--src-tls-verify",
                 "false", "--dest-tls-verify", "false"]) == 0
    out = capsys.readouterr().out
    assert out.count("present") == 4 and "copied" not in out
    tool_digest = next(r.digest for r in first.rows if r.key == "tool")
    assert f'pin tool: digest="{tool_digest}"' in out  # to paste into the catalogue
    # the worker image's pair was read from its layers (it has neither package) and recorded
    (record,) = config.images.load_lock(tmp_path / "images.lock.json").values()
    assert (record.digest, record.vllm, record.lmcache) == (tool_digest, None, None)


def test_a_tag_holding_another_digest_is_reported_not_overwritten(world):
    skopeo, dst = world["skopeo"], world["dst"]
    app, tool = world["images"]
    Mirror(skopeo, dst).run([tool], progress=False)
    other = skopeo.digest(f"{tool.source}:{tool.tag}", dest=False)
    moved = Image("app", app.source, app.tag, other, "pin changed, tag kept")
    Mirror(skopeo, dst).run([app], progress=False)
    row, = Mirror(skopeo, dst).run([moved], progress=False).rows
    assert row.action == "failed" and "immutable" in row.note and other in row.note


def test_missing_source_fails_that_row_only(world):
    ghost = Image("ghost", f"{world['src']}/test/ghost", "9.9", None, "not there")
    rows = Mirror(world["skopeo"], world["dst"]).run(
        [ghost, world["images"][1]], progress=False).rows
    assert [r.action for r in rows] == ["failed", "present"]
    assert "not found upstream" in rows[0].note


def ecr_aws(repositories: list[str]) -> Aws:
    cfg = load_environment(argparse.Namespace(env="china", china=False))
    ecr = boto3.client("ecr", region_name=cfg.region, aws_access_key_id="x",
                       aws_secret_access_key="y")
    stub = Stubber(ecr)
    stub.add_response("describe_repositories", {"repositories": [
        {"repositoryName": n} for n in repositories]})
    stub.add_response("get_authorization_token", {"authorizationData": [{
        "authorizationToken": "QVdTOnNlY3JldA==",  # AWS:secret
        "proxyEndpoint": f"https://{cfg.account}.{cfg.facts.ecr_host_suffix}"}]})
    stub.activate()
    return Aws(cfg, factory=lambda service: {"ecr": ecr}[service])


def _args(**kw) -> argparse.Namespace:
    return argparse.Namespace(**{**dict(
        env="china", china=False, profile=None, only=None, resolve=False, dry_run=False,
        dest_registry=None, dest_authfile=None, src_authfile=None, src_tls_verify="true",
        dest_tls_verify="true", jobs=1, cache="~/.cache/kvcache-eks/build",
        pypi_files_mirror=None, debian_mirror=None, debian_security_mirror=None), **kw})


def test_ecr_needs_the_storage_stack_repositories():
    with pytest.raises(ToolError, match=r"ECR repositories missing in cn-northwest-1: "
                       r"kvcache/router; deploy KvCache-china-Storage first"):
        mirror_main(_args(only=["router"]), ecr_aws(["kvcache/amazon/aws-cli"]))


def test_only_what_the_environment_deploys_is_mirrored():
    """china: ElastiCache (no in-cluster Valkey), the in-cluster Prometheus and Grafana, the
    shipped file's lmcache/vllm-openai:v0.3.7; not the catalogue's v0.5.4 no file names, nor
    the Python base (its layers travel inside the router image)."""
    from k8s.serving import environment_images
    cfg = load_environment(argparse.Namespace(env="china", china=False))
    keys = {i.key for i in environment_images(cfg, mirror_module.load_endpoints(cfg))}
    assert {"router", "aws-cli", "grafana", "alertmanager", "lmcache/vllm-openai:v0.3.7"} <= keys
    assert not keys & {"vllm-lmcache", "valkey", "redis-exporter", "python"}
    with pytest.raises(ToolError, match=r"--only = 'vllm-lmcache' is not valid"):
        mirror_main(_args(only=["vllm-lmcache"]), ecr_aws([]))
    dev = load_environment(argparse.Namespace(env="dev", china=False))   # managed observability
    dev_keys = {i.key for i in environment_images(dev, mirror_module.load_endpoints(dev))}
    assert "router" in dev_keys and not dev_keys & {"grafana", "alertmanager", "k8s-sidecar"}


def test_ecr_credentials_go_to_a_private_authfile(tmp_path):
    aws = ecr_aws([])
    aws.client("ecr").describe_repositories()
    registry = "222222222222.dkr.ecr.cn-northwest-1.amazonaws.com.cn"
    path = Path(ecr_authfile(aws, registry, tmp_path))
    assert json.loads(path.read_text()) == {"auths": {registry: {"auth": "QVdTOnNlY3JldA=="}}}
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600


def test_the_endpoint_picker_is_mirrored_where_an_endpoint_joins_a_gateway():
    """corp-cn joins its endpoints to a gateway (k8s/gateway.py): its mirror and export copy the
    EPP image; china, which does not, leaves it out."""
    from k8s.serving import environment_images
    images = {}
    for env in ("corp-cn", "china"):
        cfg = load_environment(argparse.Namespace(env=env, china=False))
        images[env] = {i.key: i for i in environment_images(cfg, mirror_module.load_endpoints(cfg))}
    epp = images["corp-cn"]["epp"]
    assert epp.source_ref.startswith("registry.k8s.io/gateway-api-inference-extension/epp:v1.5.0")
    assert epp.mirror_repository == "kvcache/gateway-api-inference-extension/epp"
    assert "epp" not in images["china"]


def test_digest_only_images_mirror_under_a_tag_of_their_digest():
    """Two images of one repository a file names by digest alone: each goes to its own ECR
    tag, `sha256-<hex>` (a `latest` for both would collide under immutable tags), pulled by
    its digest; an image with a tag keeps it."""
    from config.images import ImageResolver, image_for
    from config.regions import region_facts

    a, b = ("registry.example.com/team/vllm@sha256:" + c * 64 for c in "ab")
    images = [image_for(a), image_for(b)]
    assert [i.tag for i in images] == ["sha256-" + "a" * 64, "sha256-" + "b" * 64]
    resolver = ImageResolver(True, "222222222222", region_facts("cn-northwest-1"))
    ecr = [resolver.resolve(i) for i in images]
    assert len(set(ecr)) == 2 and not any(":latest" in r for r in ecr)
    assert all(r.endswith(f":{i.tag}@{i.digest}") for r, i in zip(ecr, images))
    tagged = image_for("registry.example.com/team/vllm:1.2@sha256:" + "c" * 64)
    assert tagged.tag == "1.2"
