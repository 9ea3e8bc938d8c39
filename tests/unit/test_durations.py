"""One duration syntax, Prometheus', for the policy's windows and the rule config's durations."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from webhook.cli import main
from webhook.core.durations import DurationError, parse
from webhook.core.policy import PolicyError, load_policy
from webhook.rules.render import RulesError, seconds


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("90s", timedelta(seconds=90)),
        ("5m", timedelta(minutes=5)),
        ("2d", timedelta(days=2)),
        ("1h30m", timedelta(hours=1, minutes=30)),
        ("1m30s500ms", timedelta(minutes=1, seconds=30, milliseconds=500)),
        ("500ms", timedelta(milliseconds=500)),
        ("2w", timedelta(weeks=2)),
        ("1y", timedelta(days=365)),
        (
            "1y2w3d4h5m6s7ms",
            timedelta(days=365 + 14 + 3, seconds=4 * 3600 + 5 * 60 + 6, milliseconds=7),
        ),
        ("0", timedelta(0)),
        ("0s", timedelta(0)),
    ],
)
def test_what_prometheus_accepts(text: str, expected: timedelta) -> None:
    assert parse(text) == expected


@pytest.mark.parametrize(
    "text", ["", "10", "1.5h", "-1m", "10 m", "1m1h", "1h1h", "5M", "1mo", "ten minutes", "h"]
)
def test_what_prometheus_refuses(text: str) -> None:
    with pytest.raises(DurationError, match="is not a duration like 90s, 5m, 1h30m, 2d"):
        parse(text)


def test_policy_takes_the_same_syntax_and_names_the_field() -> None:
    p = load_policy(
        {"breaker": {"window": "1h30m"}, "hang_wait": "10m30s", "verify": {"deadline": 90}}
    )
    assert p.breaker.window == timedelta(minutes=90)
    assert p.hang_wait == timedelta(minutes=10, seconds=30)
    assert p.verify.deadline == timedelta(seconds=90)  # a bare number is seconds, as before
    with pytest.raises(PolicyError, match=r"^retry_budget\.window: '1m1h' is not a duration"):
        load_policy({"retry_budget": {"window": "1m1h"}})
    with pytest.raises(PolicyError, match=r"^shared_cause\.window: -5 is negative"):
        load_policy({"shared_cause": {"window": -5}})


def test_rules_take_the_same_syntax_in_whole_seconds() -> None:
    assert seconds("1h30m") == 5400
    assert seconds("1m30s500ms") == 90
    with pytest.raises(RulesError, match="'1h1h' is not a duration"):
        seconds("1h1h")


def test_format_is_the_shortest_duration_parse_reads_back() -> None:
    from datetime import timedelta

    from webhook.core.durations import format as fmt
    from webhook.core.durations import parse

    for d, text in (
        (timedelta(hours=4), "4h"),
        (timedelta(seconds=90), "1m30s"),
        (timedelta(days=1, minutes=5), "1d5m"),
        (timedelta(0), "0s"),
    ):
        assert fmt(d) == text and parse(text) == d


def test_policy_check_writes_durations_it_reads_back(tmp_path: Path) -> None:
    """`policy check` prints the effective policy; its output is itself a valid policy with
    the same values (durations as typed: `11m`, not ISO 8601's `PT11M`)."""
    from webhook.core.durations import exact

    assert exact(timedelta(seconds=1.5)) == "1s500ms" and parse("1s500ms") == timedelta(seconds=1.5)
    given = tmp_path / "policy.yml"
    given.write_text("hang_wait: 11m\nverify: {deadline: 90s}\nretention: 1d1s\n")
    out = CliRunner().invoke(main, ["policy", "check", str(given)])
    assert out.exit_code == 0, out.output
    assert "hang_wait: 11m\n" in out.stdout and "deadline: 1m30s\n" in out.stdout
    printed = tmp_path / "printed.yml"
    printed.write_text(out.stdout)
    again = CliRunner().invoke(main, ["policy", "check", str(printed)])
    assert again.exit_code == 0, again.output
    assert again.stdout == out.stdout
    assert load_policy(yaml.safe_load(out.stdout)) == load_policy(yaml.safe_load(given.read_text()))
