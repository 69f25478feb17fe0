"""upload-model from `s3://BUCKET/PREFIX` (moto's S3): copied inside S3 under the endpoint's
modelLocation, tagged with each source object, so a second run copies nothing and a cut run
copies only what is missing."""
from __future__ import annotations

import json
import os

import boto3
import pytest

from tools.__main__ import main
from tools.upload_model import MiB
from tests.tools.test_upload_model import (  # noqa: F401 (bucket: a fixture)
    PREFIX, REGION, bucket, keys, s3_client, stub_storage_stack,
)

SOURCE = "team-weights"
SRC = "carried/Llama-3.1-8B-Instruct"
NAMES = ("config.json", "tokenizer.json", "model-00001-of-00002.safetensors",
         "model-00002-of-00002.safetensors")


def make_source(big: int) -> str:
    """A model in another bucket of the account, as a team's own transfer left it."""
    s3 = s3_client()
    s3.create_bucket(Bucket=SOURCE, CreateBucketConfiguration={"LocationConstraint": REGION})
    body = {"config.json": json.dumps({"model_type": "llama"}).encode(),
            "tokenizer.json": b"{}", "model-00001-of-00002.safetensors": os.urandom(big),
            "model-00002-of-00002.safetensors": os.urandom(MiB), ".cache/lock": b"hidden"}
    for name, data in body.items():
        s3.put_object(Bucket=SOURCE, Key=f"{SRC}/{name}", Body=data)
    return f"s3://{SOURCE}/{SRC}"


@pytest.fixture
def source(bucket) -> str:
    return make_source(7 * MiB)   # copied in 2 parts of --chunk-mib 5: 5 + 2 MiB


@pytest.fixture
def small_source(bucket) -> str:
    """The same objects, none of them needing a multipart copy: for refusals."""
    return make_source(1024)


def test_a_model_in_s3_is_copied_under_the_endpoint_location_once(source, bucket, capsys):
    argv = ["upload-model", "--env", "dev", "--chunk-mib", "5", source]
    assert main([*argv[:-1], "--dry-run", source]) == 0
    out = capsys.readouterr().out
    assert "4 of 4 files to copy, 0 already there" in out and not keys(bucket)

    assert main(argv) == 0
    assert "4 copied, 0 already there, 4 verified (source tag)" in capsys.readouterr().out
    assert keys(bucket) == {f"{PREFIX}/{n}" for n in NAMES}   # the hidden object stays behind
    s3 = s3_client()
    for name in NAMES:   # byte-exact, with a checksum S3 computed
        got = s3.get_object(Bucket=bucket, Key=f"{PREFIX}/{name}", ChecksumMode="ENABLED")
        assert got["Body"].read() == s3.get_object(Bucket=SOURCE, Key=f"{SRC}/{name}")[
            "Body"].read()
    assert main(argv) == 0
    assert "0 copied, 4 already there" in capsys.readouterr().out

    # the source changes: that object, and only it, is copied again
    s3.put_object(Bucket=SOURCE, Key=f"{SRC}/tokenizer.json", Body=b'{"v": 2}')
    assert main(argv) == 0
    assert "1 copied, 3 already there" in capsys.readouterr().out


def test_an_interrupted_copy_resumes_with_only_what_is_missing(source, bucket, capsys,
                                                               monkeypatch):
    real = boto3.Session.client
    cut = {"parts": 0}

    def client(self, service, *args, **kwargs):
        c = real(self, service, *args, **kwargs)
        if service == "s3":
            def drop(params, **_):
                cut["parts"] += 1
                raise ConnectionError("network dropped")
            c.meta.events.register("before-parameter-build.s3.UploadPartCopy", drop)
        return c

    monkeypatch.setattr(boto3.Session, "client", client)
    argv = ["upload-model", "--env", "dev", "--chunk-mib", "5", source]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert "1 of 4 files not copied" in err and "run the same command again" in err
    assert cut["parts"] and f"{PREFIX}/model-00001-of-00002.safetensors" not in keys(bucket)
    monkeypatch.setattr(boto3.Session, "client", real)
    stub_storage_stack(monkeypatch)
    assert main(argv) == 0
    assert "1 copied, 3 already there, 4 verified" in capsys.readouterr().out


@pytest.mark.parametrize("model, message", [
    ("s3://Bad_Bucket/x", "s3://BUCKET/PREFIX"),
    ("s3://team-weights", "s3://BUCKET/PREFIX"),
    (f"s3://{SOURCE}/nothing-here", "weights at its top level"),
])
def test_a_bad_s3_source_is_one_line(model, message, small_source, bucket, capsys):
    assert main(["upload-model", "--env", "dev", model]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err, err
