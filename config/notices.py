"""Synth warnings sorted by what they mean.

- CHANGED: we served something other than what was asked (an L2 not deployed, requests capped,
  another instance type): each has its own id, `kvcache:changed:<endpoint>:<field>`, so a team
  acknowledges exactly the one it accepts (`acknowledgedWarnings` in the environment file), or
  forces its request where a field says how.
- IGNORED: a field we do not act on (`kvcache:ignored`).
- CHECK: advice to look at (`kvcache:check`), and images still without a digest
  (`kvcache:image-without-digest`).

Warnings are strings (one line each); a `Notice` is one that also knows its kind and id, and a
plain string is sorted by its text (`: ignored: ` marks an ignored field).
"""
from __future__ import annotations

CHANGED, IGNORED, CHECK = "changed", "ignored", "check"
KINDS = (CHANGED, IGNORED, CHECK)
IMAGE_WITHOUT_DIGEST = "kvcache:image-without-digest"
ACK_PATTERN = r"kvcache:(?:changed:[a-z0-9.-]+:[A-Za-z0-9.\[\]]+|ignored|check|image-without-digest)"


class Notice(str):
    """A warning's text, with its kind and acknowledgement id."""

    kind: str
    ack: str

    def __new__(cls, text: str, kind: str, ack: str) -> "Notice":
        obj = super().__new__(cls, text)
        obj.kind, obj.ack = kind, ack
        return obj


def changed(text: str, scope: str, field: str) -> Notice:
    """We changed the request of `scope` (an endpoint, or `environment`) at `field`."""
    return Notice(text, CHANGED, f"kvcache:changed:{scope}:{field}")


def kind_of(warning: str) -> str:
    return getattr(warning, "kind", None) or (IGNORED if ": ignored: " in warning else CHECK)


def ack_id(warning: str) -> str:
    return getattr(warning, "ack", None) or f"kvcache:{kind_of(warning)}"
