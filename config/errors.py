"""The one error type bad input becomes: it names environment, field, value and what is allowed."""
from __future__ import annotations

from typing import Any, Iterable


class ConfigError(ValueError):
    """Raised for any bad input; `app.py` prints it as one line and exits 2."""

    def __init__(self, environment: str, field: str, value: Any, allowed: str | Iterable[str]):
        if not isinstance(allowed, str):
            allowed = ", ".join(str(a) for a in allowed)
        self.environment, self.field, self.value, self.allowed = environment, field, value, allowed
        super().__init__(
            f"environment '{environment}': {field} = {value!r} is not valid; allowed: {allowed}"
        )
