"""`python -m tools calibrate`: what it measures on the emulated worker gives that worker's
parameters back within 10%; it reads KV capacity from a worker's real /metrics; bad input is
one line and exit 2; the profile it writes is one `bench-routing --profile-file` reads."""
from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace

import pytest

from bench.calibrate import EmulatedProbe, HttpProbe, calibrate, cache_config_labels
from bench.emulator import PROFILES, load_profile_file, profile
from bench.fake_worker import FakeWorker
from tests.conftest import ROOT

FITTED = ("mfu", "attention_efficiency", "bandwidth_efficiency", "frontend_fixed_ms",
          "frontend_us_per_token", "activation_reserve_gb")


@pytest.mark.parametrize("name", ["h100-8b", "g5.24xlarge"])
def test_calibrating_the_emulated_worker_recovers_its_parameters(name):
    truth = profile(name)
    # start the fit from a profile that is wrong in everything it fits
    base = replace(truth, mfu=0.4, attention_efficiency=0.9, bandwidth_efficiency=0.5,
                   frontend_fixed_ms=1.0, frontend_us_per_token=5.0, activation_reserve_gb=4.0)
    got, report = calibrate(EmulatedProbe(truth), base, "fitted",
                            lengths=(2048, 8192, 32768), reps=1)
    for field in FITTED:
        assert getattr(got, field) == pytest.approx(getattr(truth, field), rel=0.10), field
    assert got.kv_tokens == pytest.approx(truth.kv_tokens, rel=0.01)
    assert max(abs(v) for v in report["residuals"].values()) < 0.05


def test_it_reads_kv_capacity_from_a_worker_over_http():
    with FakeWorker(0, "w0", cache_blocks=1234) as w:
        probe = HttpProbe(w.url)
        assert probe.model == "fake-model"
        labels = probe.cache_config()
        ttft, cached = probe.ttft(list(range(600)))
    assert labels["num_gpu_blocks"] == "1234" and labels["block_size"] == "16"
    assert ttft > 0 and cached == 0
    assert cache_config_labels('vllm:cache_config_info{block_size="16",num_gpu_blocks="9"} 1'
                               )["num_gpu_blocks"] == "9"


def test_bad_input_is_one_line_and_exit_2(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "tools", "calibrate", "--url", "ftp://x",
                           "--out", str(tmp_path / "p.json")], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2 and not (tmp_path / "p.json").exists()
    line = proc.stderr.strip().splitlines()[-1]
    assert line.startswith("error: python -m tools calibrate: argument --url: 'ftp://x' is "
                           "not valid; allowed: an http:// or https:// base URL"), line


def test_the_profile_it_writes_is_one_bench_routing_reads(tmp_path):
    gpu = replace(profile("g5.24xlarge"), name="my-g5", mfu=0.35)
    path = tmp_path / "p.json"
    path.write_text(json.dumps(gpu.to_json() | {"about": "test", "calibration": {}}))
    from bench import routing, tiered

    before = routing.PROFILE, tiered.PROFILE
    try:
        assert load_profile_file(path) == gpu and PROFILES["my-g5"] == gpu
        routing.use_profile_file(path)
        assert routing.PROFILE == tiered.PROFILE == "my-g5"
    finally:
        PROFILES.pop("my-g5", None)
        routing.PROFILE, tiered.PROFILE = before
    path.write_text('{"name": "x", "nonsense": 1}')
    with pytest.raises(ValueError, match="not an emulator profile"):
        load_profile_file(path)
