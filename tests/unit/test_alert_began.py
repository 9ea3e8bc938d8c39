"""When an alert's condition began: a hang's `stalled_since` (its last progress), a task
failure's `failed_at` (its line), read only when it is a sane epoch time."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from webhook.core.alerts import Alert
from webhook.core.evidence import began

AT = datetime(2026, 12, 9, 10, 0, 5, tzinfo=UTC)
FIRED = datetime(2026, 12, 9, 10, 12, tzinfo=UTC)


def alert(labels: dict[str, str] | None = None, **annotations: str) -> Alert:
    return Alert(
        status="firing", startsAt=FIRED, labels={"alertname": "A", **(labels or {})},
        annotations=annotations,
    )  # fmt: skip


def test_a_hang_began_at_its_last_progress() -> None:
    assert began(alert(stalled_since="1796810405")) == AT


def test_a_task_failure_began_at_its_line() -> None:
    assert began(alert({"failed_at": "1796810405"})) == AT


@pytest.mark.parametrize("value", ["", "abc", "nan", "inf", "-5", "0", "1e400", "$(id)", "9e15"])
def test_anything_else_is_ignored(value: str) -> None:
    assert began(alert(stalled_since=value)) is None
    assert began(alert({"failed_at": value})) is None


def test_an_alert_that_says_nothing_is_no_time() -> None:
    assert began(alert()) is None
