"""A benchmark's usage mistake is one line naming the argument and every allowed value, exit 2:
never a traceback from deep in a run."""
from __future__ import annotations

import pytest

from bench import fake_worker, loopback_bench
from bench.emulator import PROFILES


@pytest.mark.parametrize("parse", [
    lambda argv: loopback_bench.main(["--out", "unused", *argv]),
    lambda argv: fake_worker._parser().parse_args(["--port", "0", *argv]),
], ids=["loopback_bench", "fake_worker"])
def test_an_unknown_profile_is_one_line_listing_the_profiles(parse, capsys, tmp_path,
                                                            monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_:
        parse(["--profile", "g5.12xlarge"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if "g5.12xlarge" in line]
    assert len(lines) == 1 and "argument --profile" in lines[0]
    assert all(repr(name) in lines[0] for name in PROFILES)
    assert "Traceback" not in err and not (tmp_path / "unused").exists()


def test_loopback_bench_usage_mistakes_are_one_line(capsys):
    with pytest.raises(SystemExit) as exit_:
        loopback_bench.main(["--profile", "none"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--out" in err, err
