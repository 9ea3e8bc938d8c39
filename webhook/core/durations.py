"""Durations as Prometheus writes them, for every duration an operator types.

The policy's windows and the rule config's `for:` durations share one syntax, so that a value
copied between the two means the same thing. Prometheus' own (`model.ParseDuration`): a whole
number and a unit, `ms s m h d w y`, with a day of 24 h, a week of 7 d and a year of 365 d;
several may be concatenated from the longest unit to the shortest, each at most once (`1h30m`,
`2d12h`, `1m30s500ms`); `0` alone is zero.
"""

from __future__ import annotations

import re
from datetime import timedelta

UNIT_MS = {
    "y": 365 * 86_400_000,
    "w": 7 * 86_400_000,
    "d": 86_400_000,
    "h": 3_600_000,
    "m": 60_000,
    "s": 1000,
    "ms": 1,
}
# One optional group per unit, longest first; the regex backtracks `500ms` past the `m` group.
_PATTERN = re.compile("".join(rf"(?:(?P<{u}>\d+){u})?" for u in UNIT_MS))
EXAMPLES = "90s, 5m, 1h30m, 2d"


class DurationError(ValueError):
    """Text that is not a Prometheus duration."""


def parse(text: str) -> timedelta:
    """`1h30m` as a timedelta; DurationError for anything Prometheus would not accept."""
    if text == "0":  # as in Prometheus
        return timedelta(0)
    match = _PATTERN.fullmatch(text)
    if not text or match is None:
        raise DurationError(f"{text!r} is not a duration like {EXAMPLES}")
    ms = sum(int(n) * UNIT_MS[u] for u, n in match.groupdict().items() if n is not None)
    return timedelta(milliseconds=ms)


def format(d: timedelta) -> str:
    """`4h`, `1h30m`, `90s` → `1m30s`: the shortest Prometheus duration for whole seconds."""
    return _units(int(d.total_seconds()) * 1000)


def exact(d: timedelta) -> str:
    """As `format`, to the millisecond (`1.5s` → `1s500ms`): what `parse` reads back as the
    same value."""
    return _units(round(d.total_seconds() * 1000))


def _units(ms: int) -> str:
    if ms == 0:
        return "0s"
    parts = []
    for unit, size in (("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1000), ("ms", 1)):
        n, ms = divmod(ms, size)
        if n:
            parts.append(f"{n}{unit}")
    return "".join(parts)
