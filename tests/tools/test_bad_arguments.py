"""Catalogue of bad tool arguments: `python -m tools bench` and `bench-compare` refuse each with
one clear line and exit 2, before any request is sent and before anything is written."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.catalogue import assert_one_clear_line
from tools.__main__ import main
from config.arguments import base_url

# Enough to run: a run would start right after the arguments are accepted.
RUN = ["--model", "m", "--scenarios", "cold-warm", "--requests", "1", "--repeats", "1",
       "--warmup", "0", "--timeout", "2"]
URL = "http://127.0.0.1:9"


def _tool(capsys: pytest.CaptureFixture, argv: list[str]) -> tuple[int, str]:
    try:
        code = main(argv)
    except SystemExit as exit_:
        code = exit_.code
    return code, capsys.readouterr().err


def _file(root: Path) -> Path:
    (root / "results.json").write_text("{}")
    return root / "results.json"


# (case, arguments after `bench`, field); every case's --out is a fresh tmp/out unless given
BENCH = [
    ("IPv6 URL left open", ["--url", "http://[::1"], "--url"),
    ("port out of range", ["--url", "http://127.0.0.1:99999"], "--url"),
    ("port not a number", ["--url", "http://127.0.0.1:abc/"], "--url"),
    ("port 0", ["--url", "http://127.0.0.1:0"], "--url"),
    ("not http", ["--url", "ftp://127.0.0.1/"], "--url"),
    ("no host", ["--url", "http://"], "--url"),
    ("a space in the URL", ["--url", "http://127.0.0.1/a b"], "--url"),
    ("user and password in the URL", ["--url", "http://user:hunter2@127.0.0.1:9"], "--url"),
    ("a token in the query", ["--url", "http://127.0.0.1:9/?token=s3cr3t-t0ken"], "--url"),
    ("a query in a base URL", ["--url", "http://127.0.0.1:9/?x=1"], "--url"),
    ("password in a metrics URL",
     ["--url", URL, "--worker-metrics", "http://u:hunter2@127.0.0.1:9/metrics"],
     "--worker-metrics"),
    ("password in the direct URL", ["--url", URL, "--direct-url", "http://:hunter2@w:8000"],
     "--direct-url"),
    ("NaN jitter", ["--url", URL, "--jitter", "nan"], "--jitter"),
    ("NaN timeout", ["--url", URL, "--timeout", "NaN"], "--timeout"),
    ("infinite time limit", ["--url", URL, "--time-limit", "inf"], "--time-limit"),
    ("NaN price", ["--url", URL, "--hourly-usd", "nan"], "--hourly-usd"),
    ("NaN request rate", ["--url", URL, "--request-rate", "nan"], "--request-rate"),
    ("full-width digits as a number", ["--url", URL, "--jitter", "１"], "--jitter"),
    ("no instances", ["--url", URL, "--instances", "0"], "--instances"),
    ("negative jitter", ["--url", URL, "--jitter", "-1"], "--jitter"),
    ("a megabyte URL", ["--url", "http://" + "a" * 1_000_000], "--url"),
]


@pytest.mark.parametrize("case, argv, field", BENCH, ids=[c[0] for c in BENCH])
def test_bad_bench_argument_is_one_clear_line(tmp_path, capsys, case, argv, field):
    out = tmp_path / "out"
    code, err = _tool(capsys, ["bench", *RUN, "--out", str(out), *argv])
    assert_one_clear_line(code, err, field)
    assert not out.exists()


@pytest.mark.parametrize("case, out", [
    ("an existing file", lambda tmp: _file(tmp)),
    ("under a file", lambda tmp: _file(tmp) / "run"),
    ("a read-only directory", lambda tmp: (tmp / "ro").mkdir(mode=0o500) or tmp / "ro" / "run"),
    # /proc takes no new directory, though an access test passes there for root: refused
    # before the run, not after it in a traceback from the report writer
    ("under /proc", lambda tmp: Path("/proc/kvcache-bench")),
])
def test_unwritable_out_is_refused_before_the_run(tmp_path, capsys, case, out):
    if case == "a read-only directory" and os.geteuid() == 0:
        pytest.skip("root writes into any directory")
    out = out(tmp_path)
    before = sorted(tmp_path.rglob("*"))
    code, err = _tool(capsys, ["bench", "--url", URL, *RUN, "--out", str(out)])
    assert_one_clear_line(code, err, "--out")
    assert sorted(tmp_path.rglob("*")) == before


def test_a_run_in_which_nothing_succeeded_exits_1(tmp_path, capsys):
    """Nothing listens on port 9: every request fails, the results are written, exit 1."""
    code, err = _tool(capsys, ["bench", "--url", URL, *RUN, "--out", str(tmp_path / "out")])
    assert code == 1
    assert err.strip().splitlines()[-1].startswith("error: no request succeeded (0 of 2)")
    assert (tmp_path / "out" / "results.json").exists()


GOOD_RESULT = {"meta": {"label": "a", "url": URL, "started": "2026-11-01T00:00:00+0000",
                        "repeats": 1},
               "scenarios": {"cold": {"errors": 0, "ttft_s": {"p50": 0.1}, "cache_hit_rate": None,
                                      "spread": {"ttft_s.p50": [0.1, 0.1]}}}}


def _edit(path: str, value) -> dict:
    result = json.loads(json.dumps(GOOD_RESULT))
    *parents, leaf = path.split(".")
    node = result
    for p in parents:
        node = node[p]
    node[leaf] = value
    return result


COMPARE = [
    ("not JSON", b"{", "baseline"),
    ("not UTF-8", b'{"meta": "\xff"}', "baseline"),
    ("a list", b"[]", "baseline"),
    ("no scenarios", json.dumps({"meta": GOOD_RESULT["meta"]}).encode(), "scenarios"),
    ("a label that is a number", json.dumps(_edit("meta.label", 3)).encode(), "meta.label"),
    ("a TTFT that is text", json.dumps(_edit("scenarios.cold.ttft_s", {"p50": "fast"})).encode(),
     "scenarios.cold.ttft_s.p50"),
    ("errors not a count", json.dumps(_edit("scenarios.cold.errors", -1)).encode(),
     "scenarios.cold.errors"),
    ("a spread that is not [min, max]",
     json.dumps(_edit("scenarios.cold.spread", {"ttft_s.p50": [1]})).encode(),
     "scenarios.cold.spread"),
    ("a scenario that is a string", json.dumps(_edit("scenarios.cold", "x")).encode(),
     "scenarios.cold"),
    ("nested too deep", b"[" * 5_000, "baseline"),
    ("a directory", None, "baseline"),
]


@pytest.mark.parametrize("case, body, field", COMPARE, ids=[c[0] for c in COMPARE])
def test_bad_result_file_for_compare_is_one_clear_line(tmp_path, capsys, case, body, field):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    if body is None:
        a.mkdir()
    else:
        a.write_bytes(body)
    b.write_text(json.dumps(GOOD_RESULT))
    code, err = _tool(capsys, ["bench-compare", str(a), str(b), "--out", str(tmp_path / "cmp")])
    assert_one_clear_line(code, err, field)
    assert not (tmp_path / "cmp").exists()


def test_compare_reads_what_bench_writes_and_checks_out_first(tmp_path, capsys):
    a = tmp_path / "a.json"
    a.write_text(json.dumps(GOOD_RESULT))
    code, err = _tool(capsys, ["bench-compare", str(a), str(a), "--out", str(_file(tmp_path))])
    assert_one_clear_line(code, err, "--out")
    code, _ = _tool(capsys, ["bench-compare", str(a), str(a), "--out", str(tmp_path / "cmp")])
    assert code == 0 and (tmp_path / "cmp" / "compare.md").exists()


@pytest.mark.parametrize("url", ["http://auth-gw:8000", "http://keycloak-auth.example:8000/v1",
                                 "https://tokenizer.svc:443/", "http://[::1]:8000",
                                 "http://10.0.0.5:8000/v1/chat/completions"])
def test_urls_that_only_look_like_credentials_pass(url):
    assert base_url(url) == url
