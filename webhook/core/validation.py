"""Pydantic validation errors as one line naming the field: what the CLI prints, what a 400
says. Every model the service validates (policy, config, scenarios, webhook payloads) reports
through here, so a bad key reads the same wherever it is."""

from __future__ import annotations

import difflib

from pydantic import ValidationError


def describe(err: ValidationError, prefix: str = "") -> str:
    """`key.sub: reason` for the first error of a pydantic validation. An unknown key comes
    first, with the missing key it may be a misspelling of: `hang_afetr: unknown key (did you
    mean hang_after?)` says more than `hang_after: Field required`."""
    errors = err.errors()
    unknown = [e for e in errors if e["type"] == "extra_forbidden"]
    first = unknown[0] if unknown else errors[0]
    loc = ".".join(str(p) for p in first["loc"])
    msg = first["msg"].removeprefix("Value error, ")
    if first["type"] == "extra_forbidden":
        msg = "unknown key"
        parent, name = first["loc"][:-1], str(first["loc"][-1])
        missing = [
            str(e["loc"][-1]) for e in errors if e["type"] == "missing" and e["loc"][:-1] == parent
        ]
        if close := difflib.get_close_matches(name, missing, n=1):
            msg += f" (did you mean {close[0]}?)"
    return f"{prefix}{loc}: {msg}" if loc else f"{prefix}{msg}"


def is_number(text: str) -> bool:
    """Whether `text` is a whole number in ASCII digits: `str.isdigit` takes `²` and `٣`, and
    `int()` refuses the first (an alert's label, a query parameter, must not raise)."""
    return text.isascii() and text.isdigit()
