"""What every refusal of bad input holds, asserted the same way for every catalogue of cases:
exit 2, exactly one line on stderr, the field named, the value quoted as a short printable
excerpt, what is allowed, no secret, no traceback."""
from __future__ import annotations

from contextlib import contextmanager
from typing import Callable, Iterator

import pytest

from config.context import exit_on_config_error

# Secrets planted in the catalogues; none may appear in any output.
SECRETS = ("hunter2", "s3cr3t-t0ken", "b3BlbnNzaC1rZXktdjEAAAAA")
MAX_EXCERPT = 80


def assert_one_clear_line(code: int | str | None, stderr: str, field: str) -> str:
    assert code == 2, (code, stderr[-2000:])
    assert "Traceback" not in stderr and "jsii" not in stderr, stderr[-2000:]
    lines = stderr.splitlines()
    assert len(lines) == 1, stderr[:2000]
    line = lines[0]
    assert line.startswith("error: "), line
    assert all(" " <= c <= "~" for c in line), line          # printable ASCII, one line
    assert field in line, (field, line)
    head, sep, allowed = line.partition(" is not valid; allowed: ")
    assert sep and allowed.strip(), line                     # says what is allowed
    value = head.split(" = ", 1)[1] if " = " in head else head.rsplit(": ", 1)[1]
    assert len(value) <= MAX_EXCERPT, (len(value), value)    # a short excerpt of the value
    for secret in SECRETS:
        assert secret not in stderr, (secret, line)
    return line


@contextmanager
def as_app(capsys: pytest.CaptureFixture) -> Iterator[dict]:
    """Runs the block as `app.py` runs validation: a ConfigError becomes exit 2 and one line.
    Yields a dict that receives `code` and `stderr`."""
    out: dict = {}
    with pytest.raises(SystemExit) as exit_:
        with exit_on_config_error():
            yield out
    out["code"], out["stderr"] = exit_.value.code, capsys.readouterr().err


def refused(capsys: pytest.CaptureFixture, validate: Callable[[], object], field: str) -> str:
    """`validate()` must be refused the way app.py refuses: returns the line."""
    with as_app(capsys) as out:
        validate()
    return assert_one_clear_line(out["code"], out["stderr"], field)
