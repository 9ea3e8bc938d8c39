"""`stalled_since`: a hang alert's last progress, read only when it is a sane epoch time."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from webhook.core.evidence import stalled_since


def test_a_good_value_is_the_time_of_the_last_progress() -> None:
    assert stalled_since({"stalled_since": "1796810405"}) == datetime(
        2026, 12, 9, 10, 0, 5, tzinfo=UTC
    )


@pytest.mark.parametrize("value", ["", "abc", "nan", "inf", "-5", "0", "1e400", "$(id)", "9e15"])
def test_anything_else_is_ignored(value: str) -> None:
    assert stalled_since({"stalled_since": value}) is None


def test_no_annotation_is_no_time() -> None:
    assert stalled_since({}) is None
