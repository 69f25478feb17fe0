"""The one error type bad input becomes, and the one way an error line quotes what it refuses.

An error line names the field, quotes a short excerpt of the value and says what is allowed. The
value is the user's: it may be 50 MB long, hold control characters or a terminal escape, or be a
secret (a key file behind a symlink, a password in a URL). `excerpt` is the only way a value
reaches an error line: printable ASCII, at most `EXCERPT_CHARS` characters, secrets redacted.
"""
from __future__ import annotations

import re
from typing import Any, Iterable, Mapping

EXCERPT_CHARS = 80         # a quoted value in an error line is at most this long
_WINDOW = 4096             # characters of a long string looked at (for redaction) at all
REDACTED = "<redacted>"

# Names under which a value is a secret: query parameters, mapping keys, `NAME=value`, flags.
_SECRET_NAME = (r"[A-Za-z0-9_.-]*(?:pass(?:word|wd)?|pwd|secret|token|api[_-]?key|auth|credential"
                r"|signature|private[_-]?key)[A-Za-z0-9_.-]*")
_SECRET_NAME_RE = re.compile(_SECRET_NAME, re.I | re.A)
_REDACTIONS = (
    # a PEM block (private keys, certificates): to its END line, or to the end of what we read
    (re.compile(r"-----BEGIN [A-Z0-9 ]+-----.*?(?:-----END [A-Z0-9 ]+-----|\Z)", re.S),
     REDACTED),
    # user:password@ (or token@) in any URL
    (re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)[^/@\s]*@"),
     r"\g<scheme>" + REDACTED + "@"),
    # ?password=..., &token=...: the parameters redis-py and most clients read as credentials
    (re.compile(r"(?P<name>[?&;]" + _SECRET_NAME + r"=)[^&#\s]*", re.I | re.A),
     r"\g<name>" + REDACTED),
    # PASSWORD=..., api_key: ... (a .env or config file)
    # (not a host's name: `http://auth-gw:8000` keeps its port)
    (re.compile(r"(?<![/@.:\w-])(?P<name>" + _SECRET_NAME + r"\s*[=:]\s*)[^\s,;'\"&<]+",
                re.I | re.A),
     r"\g<name>" + REDACTED),
    (re.compile(r"(?P<name>\bbearer\s+)\S+", re.I), r"\g<name>" + REDACTED),
)


def redact(text: str) -> str:
    """`text` with every credential we can recognise replaced by <redacted>."""
    for pattern, replacement in _REDACTIONS:
        text = pattern.sub(replacement, text)
    return text


def printable(text: str, limit: int) -> str:
    """Printable ASCII on one line (anything else escaped), cut to `limit` characters."""
    text = text[:limit * 10]
    out = "".join(c if " " <= c <= "~" else ascii(c)[1:-1] for c in text)
    return out if len(out) <= limit else out[:limit - 3] + "..."


def excerpt(value: Any, limit: int = EXCERPT_CHARS) -> str:
    """A value as an error line quotes it: Python-literal style (`'x'`, `['a', 'b']`, `1.35`),
    printable ASCII, secrets redacted, at most `limit` characters (a longer string's length
    included)."""
    text = _render(value, 0)
    if len(text) <= limit:
        return text
    note = f" ({len(value):,} characters)" if isinstance(value, (str, bytes)) else ""
    return text[:limit - len(note) - 3] + "..." + note


def _render(value: Any, depth: int) -> str:
    """Bounded: a few items of a few levels, so an alias bomb or a 50 MB string costs nothing."""
    if isinstance(value, str):
        body = ascii(redact(value[:_WINDOW]))
        return body if len(value) <= _WINDOW else body[:-1] + "..." + body[-1]
    if isinstance(value, bytes):
        return _render(value[:_WINDOW].decode("latin-1"), depth)
    if isinstance(value, bool) or value is None:
        return str(value)
    if isinstance(value, int):
        bits = value.bit_length()
        return str(value) if bits < 200 else f"<an integer of {bits} bits>"
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, Mapping):
        if depth >= 2:
            return "{...}" if value else "{}"
        items = [f"{_render(k, depth + 1)}: "
                 + (repr(REDACTED) if isinstance(k, str) and _SECRET_NAME_RE.fullmatch(k)
                    else _render(v, depth + 1))
                 for k, v in list(value.items())[:4]]
        return "{" + ", ".join(items) + (", ..." if len(value) > 4 else "") + "}"
    if isinstance(value, (list, tuple)):
        if depth >= 2:
            return "[...]" if value else "[]"
        items, secret_next = [], False
        for v in list(value[:6]):
            items.append(repr(REDACTED) if secret_next else _render(v, depth + 1))
            # `--api-key VALUE`: the item after a secret-named flag is the secret
            secret_next = (isinstance(v, str) and v.startswith("-") and "=" not in v
                           and bool(_SECRET_NAME_RE.fullmatch(v.lstrip("-"))))
        more = ", ..." if len(value) > 6 else ""
        return ("[" if isinstance(value, list) else "(") + ", ".join(items) + more + \
            ("]" if isinstance(value, list) else ")")
    return printable(f"<{type(value).__name__}>", 40)


def type_name(kind: Any) -> str:
    """A Python type as an error line says what is allowed."""
    names = {str: "a string", int: "an integer", bool: "true or false", list: "a list",
             Mapping: "a mapping", float: "a number", (int, float): "a number"}
    return names.get(kind, getattr(kind, "__name__", str(kind)))


def allowed_for(allowed: str, value: Any, want_string: bool) -> str:
    """What is allowed, and why a number that prints like an allowed string (`1.35` where
    "1.35" goes) is not one."""
    if want_string and isinstance(value, (int, float)) and not isinstance(value, bool):
        return f'{allowed} (in quotes: "{value}"; {value} is a number)'
    return allowed


class ConfigError(ValueError):
    """Raised for any bad input; `app.py` prints it as one line and exits 2.

    `value` keeps what was refused (tests compare it); the message quotes only `excerpt(value)`.
    """

    def __init__(self, environment: str, field: str, value: Any, allowed: str | Iterable[str]):
        if not isinstance(allowed, str):
            allowed = ", ".join(str(a) for a in allowed)
        self.environment, self.field, self.value, self.allowed = environment, field, value, allowed
        super().__init__(
            f"environment {excerpt(str(environment))}: {printable(str(field), 200)} = "
            f"{excerpt(value)} is not valid; allowed: {printable(allowed, 1000)}"
        )
