"""`python -m tools`: one entry point, one line per usage mistake."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tools.__main__ import main

ROOT = Path(__file__).resolve().parents[2]


def test_python_dash_m_tools_lists_every_command():
    out = subprocess.run([sys.executable, "-m", "tools", "--help"], cwd=ROOT, check=True,
                         capture_output=True, text=True).stdout
    for command in ("upload-model", "mirror", "preflight", "bench", "bench-compare"):
        assert f"\n  {command} " in out or f"\n    {command}" in out, out


@pytest.mark.parametrize("argv, message", [
    (["bench"], "error: python -m tools bench: the following arguments are required: --url"),
    (["nope"], "error: python -m tools: argument COMMAND: invalid choice: 'nope'"),
    (["upload-model", "--env", "dev", "--chunk-mib", "x", "d"],
     "error: python -m tools upload-model: argument --chunk-mib: invalid int value: 'x'"),
])
def test_usage_mistakes_are_one_line_and_exit_2(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(message) and err.count("\n") == 1, err
