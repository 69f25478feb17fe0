"""Catalogue of bad cdk.json input: each case is refused as app.py refuses, one clear line.

The cases are the classes of issue 18 (values that look right and are not, files that are not
what they seem, text that reaches other languages); tests/catalogue.py asserts the same property
for every one. Validation runs in-process (it is what app.py runs before jsii); one subprocess
per kind of file proves the app exits before writing anything.
"""
from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from config import resolve_environment
from config.context import cli_context, repository_context
from config.errors import excerpt
from tests.catalogue import assert_one_clear_line, refused
from tests.conftest import ROOT, context_for

CERT = "arn:aws:acm:us-west-2:111111111111:certificate/0a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d"


def _env(**fields) -> dict:
    """dev's context with `fields` replaced (None: removed)."""
    ctx = copy.deepcopy(context_for(env="dev"))
    raw = ctx["environments"]["dev"]
    raw.update(fields)
    return ctx


def _public(*ranges: str) -> dict:
    return _env(publicListener=True, listener={"certificateArn": CERT,
                                               "sourceRanges": list(ranges)})


def _with(ctx: dict, **top) -> dict:
    return {**ctx, **top}


ENVIRONMENTS = [
    # values that look right and are not
    ("full-width digits in the account", _env(account="１" * 12), "account"),
    ("version as a number", _env(kubernetesVersion=1.35), "kubernetesVersion"),
    ("engine version as a number", _env(cache={"kind": "elasticache", "engineVersion": 8.0}),
     "cache.engineVersion"),
    ("AMI release of the old minor after a bump",
     _env(kubernetesVersion="1.36", amiReleaseVersion="1.35.2-20260115"), "amiReleaseVersion"),
    ("netmask spelling of the whole internet", _public("0.0.0.0/0.0.0.0"),
     "listener.sourceRanges[0]"),
    ("two /1 halves are the whole internet", _public("0.0.0.0/1", "128.0.0.0/1"),
     "listener.sourceRanges"),
    ("a /4 of public space", _public("16.0.0.0/4"), "listener.sourceRanges"),
    ("host bits set", _public("203.0.113.7/24"), "listener.sourceRanges[0]"),
    ("public API endpoint open to all",
     _env(clusterEndpoint={"public": True, "publicCidrs": ["0.0.0.0/0"]}),
     "clusterEndpoint.publicCidrs"),
    ("tag key AWS reserves", _env(tags={"aws:owner": "me"}), "tags"),
    ("tag key with a character AWS refuses", _env(tags={"team#1": "x"}), "tags"),
    ("tag value too long", _env(tags={"owner": "x" * 300}), "tags.owner"),
    ("empty tag value (a stack tag needs one)", _env(tags={"owner": ""}), "tags.owner"),
    ("too many tags", _env(tags={f"t{i}": "x" for i in range(60)}), "tags"),
    ("tag value not a string", _env(tags={"cost-center": 42}), "tags.cost-center"),
    ("role name with a non-ASCII letter", _env(adminRoleNames=["Rôle"]), "adminRoleNames[0]"),
    ("instance price not finite", _env(instanceHourlyUsd={"g5.24xlarge": float("nan")}),
     "instanceHourlyUsd.g5.24xlarge"),
    ("instance price key not a type", _env(instanceHourlyUsd={"g5 24xlarge\n": 1.0}),
     "instanceHourlyUsd"),
    ("alert e-mail with a control character",
     _env(alerts={"subscriptions": [{"protocol": "email", "endpoint": "a\x1b@example.com"}]}),
     "alerts.subscriptions[0].endpoint"),
    ("alert URL with a space", _env(alerts={"subscriptions": [
        {"protocol": "https", "endpoint": "https://hooks.example.com/a b"}]}),
     "alerts.subscriptions[0].endpoint"),
    # shapes that are not an environment
    ("environment not a mapping", _with(_env(), environments={"dev": ["account"]}),
     "<environment>"),
    ("environment a string", _with(_env(), environments={"dev": "111111111111"}),
     "<environment>"),
    ("chinaVariant not a mapping", _env(chinaVariant="cn-northwest-1"), "chinaVariant"),
    ("env name not a string", _with(_env(), env=["dev"]), "env"),
    ("env name of a megabyte", _with(_env(), env="d" * 1_000_000), "env"),
]


@pytest.mark.parametrize("case, ctx, field", ENVIRONMENTS, ids=[c[0] for c in ENVIRONMENTS])
def test_bad_environment_is_one_clear_line(capsys, case, ctx, field):
    refused(capsys, lambda: resolve_environment(ctx), field)


def test_a_number_for_a_version_says_to_quote_it(capsys):
    line = refused(capsys, lambda: resolve_environment(_env(kubernetesVersion=1.35)),
                   "kubernetesVersion")
    assert line.endswith('allowed: 1.33, 1.34, 1.35, 1.36 (in quotes: "1.35"; 1.35 is a number)')


def test_narrow_and_private_ranges_pass():
    cfg = resolve_environment(_public("203.0.113.0/24", "10.0.0.0/8", "172.16.0.0/12",
                                      "100.0.0.0/8"))
    assert cfg.listener.source_ranges[0] == "203.0.113.0/24"


# The files themselves, read strictly: (case, file, bytes, field). cdk.json holds CDK's flags,
# environments/NAME.json one environment each.
GOOD = (ROOT / "cdk.json").read_bytes()
DEV = (ROOT / "environments" / "dev.json").read_bytes()
FILES = [
    ("duplicate key (the last would win)", "environments/dev.json",
     DEV.replace(b'"natGateways": 1,', b'"natGateways": 1, "natGateways": 3,'),
     "environments/dev.json"),
    ("NaN price", "environments/dev.json",
     DEV.replace(b'"g5.24xlarge": 8.144', b'"g5.24xlarge": NaN'), "environments/dev.json"),
    ("not UTF-8", "environments/dev.json", DEV.replace(b'"stage": "dev"', b'"stage": "d\xe9v"'),
     "environments/dev.json: line"),
    ("malformed", "environments/dev.json", DEV[:-20], "environments/dev.json: line"),
    ("escape character in a string", "environments/dev.json",
     DEV.replace(b'"stage": "dev"', b'"stage": "\\u001b[2J"'), "environments/dev.json"),
    ("environment not an object", "environments/dev.json", b"[1, 2]", "environments/dev.json"),
    ("nested too deep", "environments/dev.json", b"[" * 5_000, "environments/dev.json"),
    ("a YAML environment file", "environments/prod.yaml", b"account: '1'",
     "environments/prod.yaml"),
    ("an upper-case name", "environments/Prod.json", DEV, "environments/Prod.json"),
    ("a file named as a China variant", "environments/dev-cn.json", DEV, "chinaVariant"),
    ("duplicate flag in cdk.json", "cdk.json",
     GOOD.replace(b'"@aws-cdk/aws-iam:minimizePolicies": true,',
                  b'"@aws-cdk/aws-iam:minimizePolicies": true, '
                  b'"@aws-cdk/aws-iam:minimizePolicies": false,'), "cdk.json"),
    ("cdk.json not an object", "cdk.json", b"[1, 2]", "cdk.json"),
    ("environments left in cdk.json", "cdk.json",
     GOOD.replace(b'"context": {', b'"context": {"environments": {"dev": {}},'),
     "cdk.json: context.environments"),
]


@pytest.mark.parametrize("case, name, body, field", FILES, ids=[c[0] for c in FILES])
def test_bad_files_are_one_clear_line(tmp_path, capsys, case, name, body, field):
    (tmp_path / "environments").mkdir()
    (tmp_path / "cdk.json").write_bytes(GOOD)
    (tmp_path / "environments" / "dev.json").write_bytes(DEV)
    (tmp_path / name).write_bytes(body)
    refused(capsys, lambda: repository_context(tmp_path), field)


def test_no_environment_file_is_one_clear_line(tmp_path, capsys):
    (tmp_path / "cdk.json").write_bytes(GOOD)
    refused(capsys, lambda: repository_context(tmp_path), "environments/")
    (tmp_path / "environments").mkdir()
    refused(capsys, lambda: repository_context(tmp_path), "environments/")


def test_the_clis_context_is_read_strictly_too(tmp_path, capsys):
    (tmp_path / "cdk.json").write_bytes(GOOD)
    (tmp_path / "environments").mkdir()
    (tmp_path / "environments" / "dev.json").write_bytes(DEV)
    refused(capsys, lambda: cli_context({"CDK_CONTEXT_JSON": '{"env": "dev", "env": "x"}'},
                                        tmp_path), "CDK_CONTEXT_JSON")
    refused(capsys, lambda: cli_context({"CDK_CONTEXT_JSON": "{"}, tmp_path), "CDK_CONTEXT_JSON")


def _app(tmp_path: Path, ctx: dict) -> tuple[subprocess.CompletedProcess, list]:
    dist = ROOT / "dist"
    before = sorted(p.stat().st_mtime_ns for p in dist.rglob("*")) if dist.exists() else None
    env = {**os.environ, "CDK_CONTEXT_JSON": json.dumps(ctx),
           "CDK_OUTDIR": str(tmp_path / "cdk.out")}
    proc = subprocess.run([sys.executable, "app.py"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=60)
    after = sorted(p.stat().st_mtime_ns for p in dist.rglob("*")) if dist.exists() else None
    return proc, [before, after]


@pytest.mark.parametrize("kind", ["environment", "endpoint file"])
def test_the_app_exits_2_before_writing_anything(tmp_path, kind):
    """Through app.py: an account jsii used to choke on (files already written), and an endpoint
    path resolving to a key file outside the repository."""
    if kind == "environment":
        ctx, field = _env(account="１" * 12), "account"
    else:   # outside the repository even when pytest's --basetemp is inside it
        outside = Path(tempfile.mkdtemp())
        key = outside / "id_ed25519"
        key.write_text("-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA\n"
                       "-----END OPENSSH PRIVATE KEY-----\n")
        (outside / "endpoint.yaml").symlink_to(key)
        ctx, field = _env(endpoints=[str(outside / "endpoint.yaml")]), "endpoints[0]"
    try:
        proc, (before, after) = _app(tmp_path, ctx)
    finally:
        if kind != "environment":
            shutil.rmtree(outside)
    assert_one_clear_line(proc.returncode, proc.stderr, field)
    assert proc.stdout == ""
    assert not (tmp_path / "cdk.out").exists() and before == after


def _bomb(depth: int) -> list:
    node: list = ["lol"] * 9
    for _ in range(depth):
        node = [node] * 9
    return node


@pytest.mark.parametrize("value, secret", [
    ("x" * 50_000_000, None), (_bomb(9), None), (10 ** 5000, None), (b"\xff" * 100, None),
    ("redis://default:hunter2@h:6379", "hunter2"),
    ("https://h/?X-Amz-Signature=hunter2", "hunter2"),
    ({"password": "hunter2", "user": "a"}, "hunter2"), (["--api-key", "hunter2"], "hunter2"),
    ("-----BEGIN RSA PRIVATE KEY-----\nhunter2", "hunter2"), ("\x1b]0;title\x07\u202e", None),
], ids=["50 MB", "alias bomb", "5,000 digits", "bytes", "URL password", "signed URL",
        "mapping", "flag", "PEM", "terminal escapes"])
def test_an_excerpt_is_short_printable_and_without_the_secret(value, secret):
    text = excerpt(value)
    assert len(text) <= 80 and all(" " <= c <= "~" for c in text), text
    assert secret is None or secret not in text
