"""When an alert's condition began, when it says: a hang's `stalled_since` (its last progress),
a task failure's `failed_at` (when the node read its line), read only when it is a sane epoch
time, and `failed_at` only near the alert's start."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from webhook.core.alerts import Alert
from webhook.core.evidence import line_time, stalled_since

AT = datetime(2026, 12, 9, 10, 0, 5, tzinfo=UTC)


def alert(labels: dict[str, str] | None = None, fired: datetime = AT, **notes: str) -> Alert:
    return Alert(
        status="firing",
        startsAt=fired,
        labels={"alertname": "A", **(labels or {})},
        annotations=notes,
    )


def test_a_hang_began_at_its_last_progress() -> None:
    late = AT + timedelta(minutes=12)
    assert stalled_since(alert(fired=late, stalled_since="1796810405")) == AT


def test_a_task_failure_began_at_its_line() -> None:
    assert line_time(alert({"failed_at": "1796810405"}, AT + timedelta(seconds=30))) == AT


def test_a_line_time_far_from_the_alert_s_start_says_nothing() -> None:
    # A node's clock an hour off, or a label that is no line's time at all.
    assert line_time(alert({"failed_at": "1796810405"}, AT + timedelta(hours=1))) is None
    assert line_time(alert({"failed_at": "1"})) is None


@pytest.mark.parametrize("value", ["", "abc", "nan", "inf", "-5", "0", "1e400", "$(id)", "9e15"])
def test_anything_else_is_ignored(value: str) -> None:
    assert stalled_since(alert(stalled_since=value)) is None
    assert line_time(alert({"failed_at": value})) is None


def test_an_alert_that_says_nothing_is_no_time() -> None:
    assert stalled_since(alert()) is None and line_time(alert()) is None
