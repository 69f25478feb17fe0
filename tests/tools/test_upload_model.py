"""upload-model against moto's S3: multipart with SHA-256 checksums, resume, verify, bad input."""
from __future__ import annotations

import base64
import hashlib
import json
import os
from pathlib import Path

import boto3
import pytest
from botocore.stub import Stubber
from moto import mock_aws

from config.context import environment_files
from tools.__main__ import main
from tools.upload_model import (
    MiB, Hasher, LocalFile, UploadOptions, head_remote, scan_model_dir, upload_model,
)

REGION = "us-west-2"          # the dev environment's region (cdk.json)
PREFIX = "llama31_8b"  # its endpoint's modelLocation
BIG = f"{PREFIX}/model-00001-of-00002.safetensors"
BUCKET = "kvcache-dev-storage-modelsbucket-1a2b3c"


def stub_storage_stack(monkeypatch: pytest.MonkeyPatch, *, deployed: bool = True) -> None:
    """CloudFormation's answer for the Storage stack (moto's CloudFormation needs extras this
    project does not install), while S3 stays moto's."""
    real = boto3.Session.client

    def client(self, service, *args, **kwargs):
        c = real(self, service, *args, **kwargs)
        if service == "cloudformation":
            stub = Stubber(c)
            if deployed:
                stub.add_response("describe_stacks", {"Stacks": [{
                    "StackName": "KvCache-dev-Storage", "CreationTime": "2026-01-01T00:00:00Z",
                    "StackStatus": "CREATE_COMPLETE", "Outputs": [
                        {"OutputKey": "ModelBucketName", "OutputValue": BUCKET}]}]},
                    {"StackName": "KvCache-dev-Storage"})
            else:
                stub.add_client_error(
                    "describe_stacks", service_error_code="ValidationError",
                    service_message="Stack with id KvCache-dev-Storage does not exist",
                    http_status_code=400)
            stub.activate()
        return c

    monkeypatch.setattr(boto3.Session, "client", client)


def make_model(root: Path, big: int) -> Path:
    d = root / "Llama-3.1-8B-Instruct"
    (d / ".cache").mkdir(parents=True)
    (d / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (d / "tokenizer.json").write_text("{}")
    (d / "model-00001-of-00002.safetensors").write_bytes(os.urandom(big))
    (d / "model-00002-of-00002.safetensors").write_bytes(os.urandom(MiB))
    (d / ".cache" / "download.lock").write_text("hidden: never uploaded")
    return d


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    return make_model(tmp_path, 7 * MiB)  # multipart at either part size: 5 + 2 MiB, 6 + 1 MiB


@pytest.fixture
def small_model(tmp_path: Path) -> Path:
    return make_model(tmp_path, 1024)


@pytest.fixture
def bucket(aws_env, monkeypatch) -> str:
    """The dev environment's Storage stack, deployed: its bucket in moto's S3."""
    stub_storage_stack(monkeypatch)
    with mock_aws():
        boto3.client("s3", region_name=REGION).create_bucket(
            Bucket=BUCKET, CreateBucketConfiguration={"LocationConstraint": REGION})
        yield BUCKET


def s3_client():
    return boto3.client("s3", region_name=REGION)


def keys(bucket: str) -> set[str]:
    return {o["Key"] for o in s3_client().list_objects_v2(Bucket=bucket).get("Contents", [])}


def run(model_dir: Path, s3=None, bucket: str = "", chunk_mib: int = 5):
    files = scan_model_dir(model_dir, PREFIX)
    return upload_model(s3 or s3_client(), files, bucket, PREFIX,
                        UploadOptions(chunk_mib=chunk_mib, concurrency=4), show_progress=False)


def test_cli_uploads_to_the_endpoint_location_then_a_second_run_uploads_nothing(
        model_dir, bucket, capsys):
    assert main(["upload-model", "--env", "dev", "--chunk-mib", "6", str(model_dir)]) == 0
    assert "4 uploaded, 0 already there, 4 verified" in capsys.readouterr().out
    assert keys(bucket) == {f"{PREFIX}/{n}" for n in (
        "config.json", "tokenizer.json", "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors")}
    big = head_remote(s3_client(), bucket, BIG)
    assert (big.parts, big.part_size) == (2, 6 * MiB)  # composite SHA-256 of 2 parts
    assert head_remote(s3_client(), bucket, f"{PREFIX}/config.json").parts == 0  # full object

    # Another part size next time: the checksum is recomputed with the object's own part size.
    report = run(model_dir, bucket=bucket, chunk_mib=5)
    assert (report.uploaded, len(report.skipped), report.verified) == ([], 4, 4)
    assert main(["upload-model", "--env", "dev", str(model_dir)]) == 0
    assert "0 uploaded, 4 already there" in capsys.readouterr().out
    (model_dir / "generation_config.json").write_text("{}")
    assert main(["upload-model", "--env", "dev", "--dry-run", str(model_dir)]) == 0
    assert f"1 of 5 files to upload, 4 already there\n  upload {PREFIX}/generation_config.json" \
        in capsys.readouterr().out
    assert f"{PREFIX}/generation_config.json" not in keys(bucket)


def test_an_interrupted_upload_resumes_with_only_what_is_missing(model_dir, bucket):
    s3 = s3_client()
    parts_seen = []

    def cut_the_line(params, **_):
        if params.get("Key") == BIG:
            parts_seen.append(params["PartNumber"])
            if len(parts_seen) >= 2:
                raise ConnectionError("network dropped")

    s3.meta.events.register("before-parameter-build.s3.UploadPart", cut_the_line)
    first = run(model_dir, s3, bucket)
    assert list(first.failed) == [BIG] and len(first.uploaded) == 3
    assert BIG not in keys(bucket)
    assert not s3_client().list_multipart_uploads(Bucket=bucket).get("Uploads")  # aborted

    second = run(model_dir, bucket=bucket)
    assert (second.uploaded, len(second.skipped), second.failed) == ([BIG], 3, {})
    assert second.verified == 4
    third = run(model_dir, bucket=bucket)
    assert (third.uploaded, len(third.skipped)) == ([], 4)


def test_a_changed_or_foreign_object_is_uploaded_again(model_dir, bucket):
    run(model_dir, bucket=bucket)
    (model_dir / "config.json").write_text(json.dumps({"model_type": "llama", "v": 2}))
    # Same size, other bytes, and no checksum: uploaded by something else, so not trusted.
    s3_client().put_object(Bucket=bucket, Key=f"{PREFIX}/tokenizer.json", Body=b"[]",
                           ChecksumAlgorithm="CRC32")
    report = run(model_dir, bucket=bucket)
    assert sorted(report.uploaded) == [f"{PREFIX}/config.json", f"{PREFIX}/tokenizer.json"]
    assert report.verified == 4


def test_local_checksums_are_the_ones_s3_computes(tmp_path):
    f = tmp_path / "w.safetensors"
    f.write_bytes(b"x" * (2 * MiB + 5))
    local = LocalFile(f, "k", f.stat().st_size)
    with mock_aws():
        s3 = s3_client()
        s3.create_bucket(Bucket="b-1", CreateBucketConfiguration={"LocationConstraint": REGION})
        s3.put_object(Bucket="b-1", Key="k", Body=f.read_bytes(), ChecksumAlgorithm="SHA256")
        single = s3.head_object(Bucket="b-1", Key="k", ChecksumMode="ENABLED")["ChecksumSHA256"]
    assert Hasher().checksum(local, 0, 0) == single
    # composite: SHA-256 over the parts' raw SHA-256 digests
    data = f.read_bytes()
    parts = b"".join(hashlib.sha256(data[i:i + MiB]).digest() for i in range(0, len(data), MiB))
    composite = base64.b64encode(hashlib.sha256(parts).digest()).decode()
    assert Hasher().checksum(local, 3, MiB) == composite


@pytest.mark.parametrize("case, argv, message", [
    ("missing dir", ["upload-model", "--env", "dev", "{tmp}/nope"],
     "model_dir = '{tmp}/nope' is not valid; allowed: an existing directory"),
    ("no weights", ["upload-model", "--env", "dev", "{tmp}/empty"],
     "allowed: a model directory with *.safetensors weights at its top level"),
    ("wrong bucket", ["upload-model", "--env", "dev", "--bucket", "not-our-bucket", "{model}"],
     "bucket = 'not-our-bucket' is not valid; allowed: an existing bucket"),
    ("unknown endpoint", ["upload-model", "--env", "dev", "--endpoint", "gpt", "{model}"],
     "--endpoint = 'gpt' is not valid; allowed: llama-8b-intel-routing"),
    ("unknown env", ["upload-model", "--env", "prod", "{model}"],
     "environment 'prod': env = 'prod' is not valid; allowed: "
     + ", ".join(sorted(environment_files()))),
    ("bad chunk", ["upload-model", "--env", "dev", "--chunk-mib", "1", "{model}"],
     "--chunk-mib = 1 is not valid; allowed: 5 to 5120"),
])
def test_bad_input_is_one_line_and_exit_2(case, argv, message, small_model, bucket, tmp_path,
                                          capsys):
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "config.json").write_text("{}")
    fill = {"tmp": str(tmp_path), "model": str(small_model)}
    assert main([a.format(**fill) for a in argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"error: {message.format(**fill)}" or (
        err.startswith("error: ") and message.format(**fill) in err), err
    assert "\n" not in err and "Traceback" not in err


def test_missing_storage_stack_says_what_to_deploy(small_model, aws_env, monkeypatch, capsys):
    stub_storage_stack(monkeypatch, deployed=False)
    with mock_aws():
        assert main(["upload-model", "--env", "dev", str(small_model)]) == 1
    err = capsys.readouterr().err
    assert "stack KvCache-dev-Storage not found" in err and "cdk deploy" in err
