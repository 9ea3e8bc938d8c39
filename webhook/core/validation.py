"""Pydantic validation errors as one line naming the field: what the CLI prints, what a 400
says. Every model the service validates (policy, config, scenarios, webhook payloads) reports
through here, so a bad key reads the same wherever it is."""

from __future__ import annotations

from pydantic import ValidationError


def describe(err: ValidationError, prefix: str = "") -> str:
    """`key.sub: reason` for the first error of a pydantic validation."""
    first = err.errors()[0]
    loc = ".".join(str(p) for p in first["loc"])
    msg = first["msg"].removeprefix("Value error, ")
    if first["type"] == "extra_forbidden":
        msg = "unknown key"
    return f"{prefix}{loc}: {msg}" if loc else f"{prefix}{msg}"


def is_number(text: str) -> bool:
    """Whether `text` is a whole number in ASCII digits: `str.isdigit` takes `²` and `٣`, and
    `int()` refuses the first (an alert's label, a query parameter, must not raise)."""
    return text.isascii() and text.isdigit()
