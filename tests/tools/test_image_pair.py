"""Any worker image by what it contains: mirror reads the vLLM/LMCache pair from the image's own
layers (an upper layer overriding a lower one, a whiteout hiding one), records it with the digest
in images.lock.json, and the next synth's L2 verdict uses it; an image nobody read gets one line
naming what to run. The team's lock file pins digests (the router's too) without touching
config/images.py. A real registry (Debian's docker-registry) and skopeo, as tests/tools/
test_mirror.py."""
from __future__ import annotations

import copy
import io
import json
import shutil
import tarfile
from pathlib import Path

import pytest

import config.images as images
from config import resolve_environment
from config.endpoint_spec import parse_endpoint
from config.images import (
    CATALOGUE, IMAGES, RECORDED, UNKNOWN, ImageResolver, LockError, image_for, image_release,
    load_lock, unpinned_images,
)
from k8s.serving import fit_endpoint
from tests.conftest import context_for
from tests.k8s.test_charts import SEED
from tests.tools.test_mirror import OCI_MANIFEST, registry, write_blob, write_oci_layout
from tools.image_pair import Pair, read_pair, record_pair
from tools.mirror import Mirror, Skopeo, unread_pairs

SITE = "opt/venv/lib/python3.12/site-packages"
DIST = "usr/local/lib/python3.12/dist-packages"
DIGEST = "sha256:" + "ab" * 32


def _metadata(name: str, version: str) -> bytes:
    return f"Metadata-Version: 2.4\nName: {name}\nVersion: {version}\n\nA package.\n".encode()


def _layer(files: dict[str, bytes | None]) -> bytes:
    """An uncompressed layer tar: None marks a whiteout of that path."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, content in files.items():
            if content is None:
                head, _, base = name.rpartition("/")
                name, content = f"{head}/.wh.{base}", b""
            info = tarfile.TarInfo(name)
            info.size, info.mtime = len(content), 0
            tar.addfile(info, io.BytesIO(content))
    return buf.getvalue()


def _layout(root: Path, layers: list[dict[str, bytes | None]]) -> Path:
    """A single-arch OCI layout whose layers (oldest first) hold `layers`."""
    blobs = [_layer(files) for files in layers]
    cfg = write_blob(root, json.dumps({"architecture": "amd64", "os": "linux", "rootfs": {
        "type": "layers", "diff_ids": [write_blob(root, b)["digest"] for b in blobs]}}).encode(),
        "application/vnd.oci.image.config.v1+json")
    manifest = json.dumps({"schemaVersion": 2, "mediaType": OCI_MANIFEST, "config": cfg,
                           "layers": [write_blob(root, b, "application/vnd.oci.image.layer.v1.tar")
                                      for b in blobs]}).encode()
    write_oci_layout(root, [("latest", manifest, {"mediaType": OCI_MANIFEST})])
    return root


# The base holds old releases; the upgrade layer removes vLLM's (a whiteout) and adds new ones;
# a stale copy under dist-packages is hidden by an opaque directory; LMCache's METADATA is
# overwritten in place by the top layer.
LAYERS = [
    {f"{SITE}/vllm-0.10.2.dist-info/METADATA": _metadata("vllm", "0.10.2"),
     f"{SITE}/lmcache-0.3.7.dist-info/METADATA": _metadata("lmcache", "0.3.7"),
     f"{DIST}/vllm-0.9.0.dist-info/METADATA": _metadata("vllm", "0.9.0")},
    {f"{SITE}/vllm-0.10.2.dist-info": None,
     f"{SITE}/vllm-0.28.0.dist-info/METADATA": _metadata("vllm", "0.28.0+cu129"),
     f"{DIST}/.wh..wh..opq": b""},
    {f"{SITE}/lmcache-0.3.7.dist-info/METADATA": _metadata("lmcache", "0.5.6.post1")},
]


def test_the_pair_is_what_the_container_sees(tmp_path):
    assert read_pair(_layout(tmp_path / "a", LAYERS)) == Pair("0.28.0+cu129", "0.5.6.post1")
    # a whiteout of LMCache's dist-info above every copy: the image carries none
    gone = [*LAYERS, {f"{SITE}/lmcache-0.3.7.dist-info": None}]
    assert read_pair(_layout(tmp_path / "b", gone)) == Pair("0.28.0+cu129", None)


def _lock(tmp_path, monkeypatch, data: dict | None) -> Path:
    path = tmp_path / "images.lock.json"
    if data is not None:
        path.write_text(json.dumps(data))
    monkeypatch.setattr(images, "IMAGES_LOCK", path)
    return path


def _fit(image: str, backend: str = "valkey"):
    ctx = context_for(env="dev")
    ctx["environments"]["dev"]["cache"] = {"kind": "self-hosted"}
    cfg = resolve_environment(ctx)
    raw = copy.deepcopy(SEED)
    raw["spec"]["worker"]["image"] = image
    raw["spec"]["kvCacheSpec"]["l2CacheSpec"]["l2CacheBackend"] = backend
    raw["spec"]["kvCacheSpec"]["forceL2Cache"] = False
    return fit_endpoint(cfg, parse_endpoint(cfg.name, "endpoints/seed.yaml", raw))


@pytest.mark.usefixtures("sound_l2_client")
def test_mirror_records_the_pair_and_synth_uses_it(tmp_path, monkeypatch):
    for tool in ("skopeo", "docker-registry"):
        assert shutil.which(tool), f"{tool} is needed: apt-get install skopeo docker-registry"
    lock = _lock(tmp_path, monkeypatch, None)
    layout = _layout(tmp_path / "layout", LAYERS)
    with registry(tmp_path / "src") as src, registry(tmp_path / "dst") as dst:
        written = f"{src}/lmcache/vllm-openai:latest"
        skopeo = Skopeo(src_tls_verify=False, dest_tls_verify=False)
        skopeo.copy(f"oci:{layout}:latest", f"docker://{written}")
        image = image_for(written)
        assert image_release(image).origin == UNKNOWN
        assert unread_pairs([image, IMAGES["vllm-lmcache"]], {image.key, "vllm-lmcache"}) \
            == [image.key]
        mirror = Mirror(skopeo, dst, read_pairs=[image.key])
        (row,) = mirror.run([image], progress=False).rows
        assert row.action == "copied", row.note
        reference, digest, pair = mirror.pairs[image.key]
        record_pair(reference, digest, pair, "mirror, in a test", lock)
        assert load_lock(lock)[f"{src}/lmcache/vllm-openai:latest"].digest == row.digest
        spec = _fit(written, backend="tieredstorage")
    release = image_release(spec.image)
    assert (release.vllm, release.lmcache, release.origin) == ((0, 28, 0), (0, 5, 6), RECORDED)
    assert spec.l2_enabled and spec.image.digest == digest
    assert spec.image.written == f"{src}/lmcache/vllm-openai:latest@{digest}"   # what was read
    said = [w for w in spec.warnings if "the L2 verdict assumes" in w]
    assert len(said) == 1 and "vLLM 0.28.0 + LMCache 0.5.6" in said[0] and lock.name in said[0]
    assert any("tieredstorage is HyperPod-only; the L2 is the in-cluster" in w
               for w in spec.warnings)


@pytest.mark.usefixtures("sound_l2_client")
def test_an_unread_image_gets_one_line_naming_what_to_run(tmp_path, monkeypatch):
    _lock(tmp_path, monkeypatch, None)
    spec = _fit("lmcache/vllm-openai:latest", backend="tieredstorage")
    assert not spec.l2_enabled
    l2 = [w for w in spec.warnings if "L2" in w or "Valkey" in w or "tieredstorage" in w]
    assert len(l2) == 1, l2
    assert "python -m tools mirror" in l2[0] and "images.lock.json" in l2[0]
    # a record of other bytes (the file pins another digest) says nothing of these
    _lock(tmp_path, monkeypatch, {"docker.io/lmcache/vllm-openai:latest": {
        "digest": DIGEST, "vllm": "0.28.0", "lmcache": "0.5.6", "read": "test"}})
    assert image_release(image_for("lmcache/vllm-openai:latest")).origin == RECORDED
    other = image_for("lmcache/vllm-openai:latest@sha256:" + "cd" * 32)
    assert image_release(other).origin == UNKNOWN
    assert image_release(IMAGES["vllm-lmcache"]).origin == CATALOGUE


def test_the_team_pins_any_digest_without_editing_the_catalogue(tmp_path, monkeypatch):
    router = IMAGES["router"]
    assert router.digest is None and router in unpinned_images()
    _lock(tmp_path, monkeypatch, {f"{router.source}:{router.tag}": {"digest": DIGEST}})
    assert router.key not in {i.key for i in unpinned_images()}
    resolver = ImageResolver(use_ecr=True, account="111111111111",
                             facts=resolve_environment(context_for(env="dev")).facts)
    assert resolver.uri("router").endswith(f":{router.tag}@{DIGEST}")


@pytest.mark.parametrize("entry, said", [
    ({"lmcache/vllm-openai:latest": {"digest": "sha256:12"}},
     "images.lock.json: lmcache/vllm-openai:latest.digest = "),
    ({"lmcache/vllm-openai:latest": {"digest": DIGEST, "vllm": "0.28.0"}}, ".vllm = "),
    ({"lmcache/vllm-openai:latest": {"digest": DIGEST, "size": 1}}, ".size = "),
    ({"lmcache/vllm-openai:latest": {"digest": DIGEST, "vllm": "new", "lmcache": None,
                                     "read": "x"}}, ".vllm = "),
    ({"Bad Ref": {"digest": DIGEST}}, "'Bad Ref'"),
])
def test_a_bad_lock_entry_is_one_line(tmp_path, monkeypatch, entry, said):
    path = _lock(tmp_path, monkeypatch, entry)
    with pytest.raises(LockError) as err:
        load_lock(path)
    assert said in str(err.value) and "allowed: " in str(err.value)
    assert "\n" not in str(err.value)
