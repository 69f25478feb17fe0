"""upload-model from a hub: the real `modelscope` and `huggingface_hub` SDKs against fake hubs on
127.0.0.1 (the routes and answers the SDKs read: ModelScope's `repo/files` list and `repo?FilePath`
download, the Hub's `tree` list and `resolve` download), into moto's S3."""
from __future__ import annotations

import hashlib
import http.server
import json
import os
import threading
import urllib.parse
from typing import Iterator

import boto3
import pytest

from tests.tools.test_upload_model import BUCKET, PREFIX, REGION, bucket, keys  # noqa: F401
from tools.__main__ import main

COMMIT = "0123456789abcdef0123456789abcdef01234567"
WEIGHTS = "model-00002-of-00002.safetensors"


class FakeHub(http.server.ThreadingHTTPServer):
    """ModelScope's and the Hugging Face Hub's read routes over one set of files; `broken`
    files answer 500 (a cut transfer); `requests` records every path asked for."""

    def __init__(self, files: dict[str, bytes]) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.files, self.broken, self.requests = files, set(), []
        self.token_seen: set[str] = set()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def downloads(self) -> list[str]:
        return [p for p in self.requests if p.startswith("GET file:")]


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: FakeHub

    def log_message(self, *args) -> None:
        pass

    def _send(self, code: int, body: bytes = b"", headers: dict | None = None) -> None:
        self.send_response(code)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _file(self, path: str) -> None:
        hub = self.server
        hub.requests.append(f"{self.command} file:{path}")
        if path in hub.broken:
            return self._send(500, b'{"error": "cut"}')
        body = hub.files.get(path)
        if body is None:
            return self._send(404, b"{}")
        etag = hashlib.sha256(body).hexdigest() if path.endswith(".safetensors") else \
            hashlib.sha1(body).hexdigest()
        self._send(200, body, {"ETag": f'"{etag}"', "X-Repo-Commit": COMMIT,
                               "Content-Type": "application/octet-stream"})

    def do_GET(self) -> None:
        url = urllib.parse.urlparse(self.path)
        query = urllib.parse.parse_qs(url.query)
        hub = self.server
        if auth := self.headers.get("Authorization"):
            hub.token_seen.add(auth)
        if url.path.endswith("/repo/files"):        # ModelScope: the file list
            hub.requests.append("GET list")
            listed = [{"Name": p.rsplit("/", 1)[-1], "Path": p, "Type": "blob", "Size": len(b),
                       "Sha256": hashlib.sha256(b).hexdigest()} for p, b in hub.files.items()]
            return self._send(200, json.dumps({"Code": 200, "Success": True, "Data": {
                "Files": listed}}).encode(), {"Content-Type": "application/json"})
        if url.path.endswith("/repo") and "FilePath" in query:   # ModelScope: a file
            return self._file(query["FilePath"][0])
        if "/tree/" in url.path:                     # the Hugging Face Hub: the file list
            hub.requests.append("GET list")
            tree = [{"type": "file", "path": p, "size": len(b),
                     "oid": hashlib.sha1(b).hexdigest(), **({"lfs": {
                         "oid": hashlib.sha256(b).hexdigest(), "size": len(b),
                         "pointerSize": 134}} if p.endswith(".safetensors") else {})}
                    for p, b in hub.files.items()]
            return self._send(200, json.dumps(tree).encode(), {"Content-Type":
                                                                "application/json"})
        if "/resolve/" in url.path:                  # the Hugging Face Hub: a file
            return self._file(urllib.parse.unquote(url.path.split("/resolve/", 1)[1]
                                                   .split("/", 1)[1]))
        hub.requests.append(f"GET other:{url.path}")
        self._send(404, b"{}")

    do_HEAD = do_GET


@pytest.fixture
def hub(tmp_path, monkeypatch) -> Iterator[FakeHub]:
    files = {"config.json": json.dumps({"model_type": "llama"}).encode(),
             "tokenizer.json": b"{}", "model-00001-of-00002.safetensors": os.urandom(300_000),
             WEIGHTS: os.urandom(200_000), "tokenizer/extra.model": os.urandom(1000)}
    server = FakeHub(files)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                     daemon=True).start()
    monkeypatch.setenv("MODELSCOPE_CACHE", str(tmp_path / "ms-cache"))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.setenv("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    monkeypatch.delenv("HF_TOKEN", raising=False)
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def landed(bucket_name: str) -> dict[str, str]:
    """key -> sha256 hex of what S3 holds under the endpoint's prefix."""
    s3 = boto3.client("s3", region_name=REGION)
    return {k: hashlib.sha256(s3.get_object(Bucket=bucket_name, Key=k)["Body"].read()
                              ).hexdigest() for k in keys(bucket_name)}


def expected(hub: FakeHub) -> dict[str, str]:
    return {f"{PREFIX}/{p}": hashlib.sha256(b).hexdigest() for p, b in hub.files.items()}


def test_modelscope_model_lands_under_the_endpoint_location_and_a_cut_run_resumes(
        hub, bucket, tmp_path, capsys, monkeypatch):
    argv = ["upload-model", "--env", "dev", "modelscope:Qwen/Tiny-Instruct", "--revision",
            "v1.0.0", "--hub-endpoint", hub.url, "--download-dir", str(tmp_path / "dl"),
            "--sha256", f"{WEIGHTS}={hashlib.sha256(hub.files[WEIGHTS]).hexdigest()}",
            "--chunk-mib", "5"]
    hub.broken = {WEIGHTS}
    # the SDK's retries spent at once (what a long outage ends in), not after its backoff
    monkeypatch.setattr("modelscope_hub._download.DOWNLOAD_RETRY_TIMES", 0)
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert "run the same command again to resume" in err and keys(bucket) == set()
    first = hub.downloads()

    hub.broken = set()
    assert main(argv) == 0
    out, err = capsys.readouterr()
    assert "5 uploaded, 0 already there, 5 verified" in out
    assert "5 files as listed, 5 checked by sha256" in err
    assert landed(bucket) == expected(hub)
    # the second run fetched only what the first did not finish
    again = hub.downloads()[len(first):]
    assert [p for p in again if p.startswith("GET")] == [f"GET file:{WEIGHTS}"]

    # A third run downloads nothing, uploads nothing.
    mark = len(hub.downloads())
    assert main(argv) == 0
    assert "0 uploaded, 5 already there" in capsys.readouterr().out
    assert hub.downloads()[mark:] == []


def test_a_hash_that_differs_is_refused_naming_the_file(hub, tmp_path, capsys):
    """Refused before anything reaches AWS (no bucket here: any AWS call would fail)."""
    assert main(["upload-model", "--env", "dev", "modelscope:Qwen/Tiny-Instruct", "--revision",
                 "v1.0.0", "--hub-endpoint", hub.url, "--download-dir", str(tmp_path / "dl"),
                 "--sha256", f"config.json={'0' * 64}"]) == 1
    assert f"config.json: sha256 {hashlib.sha256(hub.files['config.json']).hexdigest()}, you " \
           f"gave {'0' * 64}: not uploaded" in capsys.readouterr().err


def test_hugging_face_model_with_a_token_from_secrets_manager_never_printed(
        hub, bucket, tmp_path, capsys):
    token = "hf_" + "s3cr3t" * 6
    boto3.client("secretsmanager", region_name=REGION).create_secret(
        Name="hf-token", SecretString=token)
    assert main(["upload-model", "--env", "dev", "hf:meta-llama/Tiny", "--revision", COMMIT,
                 "--hub-endpoint", hub.url, "--download-dir", str(tmp_path / "dl"),
                 "--hf-token-secret", "hf-token", "--chunk-mib", "5"]) == 0
    out, err = capsys.readouterr()
    assert "5 uploaded" in out and token not in out + err
    assert hub.token_seen == {f"Bearer {token}"}
    assert landed(bucket) == expected(hub)


def test_dry_run_lists_the_hubs_files_and_time_without_aws(hub, tmp_path, capsys, monkeypatch):
    def no_aws(*a, **kw):
        raise AssertionError("the dry run made an AWS client")
    monkeypatch.setattr(boto3, "client", no_aws)
    monkeypatch.setattr(boto3.Session, "client", no_aws)
    for source, revision in (("modelscope:Qwen/Tiny-Instruct", "v1.0.0"),
                             ("hf:meta-llama/Tiny", COMMIT)):
        assert main(["upload-model", "--env", "dev", source, "--revision", revision,
                     "--hub-endpoint", hub.url, "--dry-run", "--rate", "100KB/s",
                     "--download-dir", str(tmp_path / "dl")]) == 0
        out = capsys.readouterr().out
        total = sum(len(b) for b in hub.files.values())
        for path in hub.files:
            assert path in out
        assert f"5 files, {total / 1024:.1f} KiB, download about " in out
        assert f"{round(total / 100_000)} s at 0.1 MB/s" in out
    assert hub.downloads() == [] and not (tmp_path / "dl").exists()


@pytest.mark.parametrize("argv, message", [
    (["hf:meta-llama/Tiny", "--revision", "main"], "--revision = 'main' is not valid"),
    (["hf:meta-llama/Tiny", "--revision", "v1.0"], "the 40-hex commit of meta-llama/Tiny"),
    (["modelscope:Qwen/Tiny"], "--revision = None is not valid"),
    (["modelscope:Qwen/Tiny", "--revision", "v1", "--sha256", "x=12"], "PATH=<64 hex sha256>"),
    (["--env", "china", "hf:meta-llama/Tiny", "--revision", COMMIT],
     "the Hugging Face Hub is not reachable from AWS China"),
])
def test_bad_hub_input_is_one_line(argv, message, capsys):
    env = [] if "--env" in argv else ["--env", "dev"]
    assert main(["upload-model", *env, *argv, "--dry-run"]) == 2
    assert message in capsys.readouterr().err


def test_a_local_dry_run_without_credentials_lists_the_files(tmp_path, monkeypatch, capsys):
    from tests.tools.test_upload_model import make_model

    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", "/dev/null")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/dev/null")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    model = make_model(tmp_path, 2_000_000)
    assert main(["upload-model", "--env", "dev", str(model), "--dry-run", "--rate",
                 "1MB/s"]) == 0
    out = capsys.readouterr().out
    assert f"{PREFIX}/model-00001-of-00002.safetensors" in out and ".cache" not in out
    assert "4 files, 2.9 MiB, upload about 3 s at 1.0 MB/s" in out
    assert "no AWS credentials: not compared with what the bucket holds" in out
