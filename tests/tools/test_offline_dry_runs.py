"""`mirror --dry-run` (the direct path) and `preflight --offline` say what they would copy and
check with no AWS credentials at all: botocore is never asked for a client."""
from __future__ import annotations

import hashlib
import re

import botocore.session
import pytest

import tools.carry as carry
import tools.mirror as mirror_module
from config import resolve_environment
from k8s.serving import environment_images, load_endpoints
from tests.conftest import DECLARED, ENVIRONMENTS, ROOT, context_for
from tests.tools.test_carry import RecordedRegistries
from tools.__main__ import main
from tools.preflight import FAIL, TO_CHECK, offline_rows


@pytest.fixture
def no_credentials(monkeypatch):
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE",
                "AWS_DEFAULT_PROFILE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", "/dev/null")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/dev/null")

    def no_client(*a, **kw):
        raise AssertionError("an AWS client was made")
    monkeypatch.setattr(botocore.session.Session, "create_client", no_client)


def _cfg(name: str):
    return resolve_environment({**context_for(), **DECLARED[name]})


def test_mirror_dry_run_lists_what_it_would_copy_into_ecr(no_credentials, monkeypatch,
                                                          capsys):
    monkeypatch.setattr(carry, "fetch_https_chart", lambda chart: (b"c" * 5000, "sha256:" + (
        hashlib.sha256(chart.name.encode()).hexdigest())))
    monkeypatch.setattr(mirror_module, "Skopeo", lambda **kw: RecordedRegistries())
    monkeypatch.setattr(mirror_module.shutil, "which", lambda tool: "/usr/bin/" + tool)
    name = next(n for n in ENVIRONMENTS if _cfg(n).use_ecr_images)
    cfg = _cfg(name)
    assert main(["mirror", *_selects(name), "--dry-run", "--rate", "50MB/s"]) == 0
    out = capsys.readouterr().out
    listed = set(re.findall(r"^image +(\S+) ", out, re.M))
    assert listed == {i.key for i in environment_images(cfg, load_endpoints(cfg, ROOT))}
    registry = f"{cfg.account}.{cfg.facts.ecr_host_suffix}"
    assert re.search(rf"mirror of {cfg.name} into {re.escape(registry)}: \d+ artifacts", out)


def _selects(name: str) -> list[str]:
    ctx = DECLARED[name]
    return ["--env", ctx["env"], *(["--china"] if ctx.get("china") == "true" else [])]


@pytest.mark.parametrize("name", ENVIRONMENTS)
def test_preflight_offline_lists_every_check_without_credentials(no_credentials, capsys, name):
    cfg = _cfg(name)
    endpoints = load_endpoints(cfg, ROOT)
    rows = offline_rows(cfg, endpoints)
    checks = {r.check for r in rows}
    assert {r.status for r in rows} == {TO_CHECK} and FAIL not in {r.status for r in rows}
    assert {"credentials", "services", "zones", f"EKS {cfg.kubernetes_version}"} <= checks
    types = {t for g in (cfg.system_nodes, *cfg.gpu_node_groups) for t in g.instance_types}
    assert {f"offered: {t}" for t in types} <= checks
    assert {f"model: {e.name}" for e in endpoints} <= checks
    for sub in cfg.network.private_subnets:   # an existing VPC: each subnet and its reach
        assert f"subnet {sub.subnet_id}" in checks
        assert f"reach: {sub.subnet_id} ({sub.zone})" in checks
    if cfg.use_ecr_images:
        assert {f"image: {i.key}" for i in environment_images(cfg, endpoints)} <= checks
    assert main(["preflight", *_selects(name), "--offline"]) == 0
    assert "preflight: " in capsys.readouterr().out


@pytest.mark.parametrize("export", [False, True])
def test_a_dry_run_where_no_chart_repository_answers_says_so_in_one_line_each(
        no_credentials, monkeypatch, capsys, tmp_path, export):
    """Behind a proxy or air-gapped: the HTTPS chart repositories do not answer (requests
    raises, as it does there). The dry run still lists every artifact; each unreachable chart
    is one line naming its URL, and no traceback (issue 42: 103 lines)."""
    import requests

    def unreachable(url, **kw):
        raise requests.ConnectionError(f"HTTPSConnectionPool(host='{url.split('/')[2]}', "
                                       "port=443): Max retries exceeded\nwith url")
    monkeypatch.setattr(requests, "get", unreachable)
    monkeypatch.setattr(mirror_module, "Skopeo", lambda **kw: RecordedRegistries())
    monkeypatch.setattr(mirror_module.shutil, "which", lambda tool: "/usr/bin/" + tool)
    name = next(n for n in ENVIRONMENTS if _cfg(n).use_ecr_images)
    extra = ["--export", str(tmp_path / "out")] if export else []
    code = main(["mirror", *_selects(name), "--dry-run", *extra])
    captured = capsys.readouterr()
    out = captured.out + captured.err
    assert "Traceback" not in out
    https = [c for c in mirror_module.catalogue_charts()
             if c.repository.startswith("https://")]
    assert https
    for chart in https:
        (line,) = [ln for ln in out.splitlines() if ln.startswith("chart ")
                   and f" {chart.key} " in ln and "unreachable" in ln]
        assert f"{chart.repository}/index.yaml" in line
    assert code in (0, 1)
