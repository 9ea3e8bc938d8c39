"""The settings the processes share through the ledger, each read and written through its model:
what is put comes back equal (both backends), a key never written reads as its defaults, and a
corrupt row is an error naming its key, in the CLI a one-line one, in /metrics a logged one."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError
from sqlalchemy import text

from webhook.app.metrics import LedgerCollector
from webhook.ledger.settings import (
    SETTINGS,
    Breaker,
    CorruptSetting,
    Heartbeat,
    Jobs,
    JobSeen,
    Nodes,
    NodeSeen,
    Setting,
    Switch,
)
from webhook.ledger.store import Ledger
from webhook.service.loop import monitor_forced

T = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
VALUES: list[Setting] = [
    Breaker(open=True, opened_at=T),
    Breaker(open=False, reset_at=T),
    Switch(monitor=True),
    Heartbeat(at=T.timestamp()),
    Jobs({"7": JobSeen(partition="train", restarts=2, eligible=False)}),
    Nodes({"gpu01": NodeSeen(status="down*", partitions=["train", "debug"])}),
]


def corrupt(ledger: Ledger, key: str, raw: str) -> None:
    """Write a row no model wrote (a hand edit, a bug of another release)."""
    with ledger.engine.begin() as conn:
        conn.execute(
            text("INSERT INTO settings (key, value, updated_at) VALUES (:k, :v, :t)"),
            {"k": key, "v": raw, "t": T},
        )


@pytest.mark.parametrize("value", VALUES, ids=lambda v: f"{v.key}")
def test_a_setting_comes_back_as_it_was_put(ledger: Ledger, value: Setting) -> None:
    ledger.put(value, T)
    assert ledger.setting(type(value)) == value


def test_a_setting_never_written_reads_as_its_defaults(ledger: Ledger) -> None:
    assert ledger.setting(Breaker) == Breaker(open=False)
    assert ledger.setting(Switch).monitor is False
    assert ledger.setting(Heartbeat).at == 0
    assert ledger.setting(Jobs).root == {} and ledger.setting(Nodes).root == {}


def test_the_stored_json_is_the_one_earlier_releases_wrote(ledger: Ledger) -> None:
    """Other processes may still run the previous release while one upgrades."""
    for value in VALUES:
        ledger.put(value, T)
    with ledger.engine.connect() as conn:
        rows = dict(conn.execute(text("SELECT key, value FROM settings")).all())
    stored = {k: v if isinstance(v, dict) else json.loads(v) for k, v in rows.items()}
    assert stored["jobs"] == {"7": {"partition": "train", "restarts": 2, "eligible": False}}
    assert stored["loop"] == {"at": T.timestamp()}
    assert datetime.fromisoformat(stored["breaker"]["reset_at"]) == T


@pytest.mark.parametrize(
    ("kind", "raw", "field"),
    [
        (Breaker, '{"open": "perhaps"}', "open"),
        (Switch, '{"monitor": true, "monitr": true}', "monitr"),
        (Heartbeat, '{"at": "noon"}', "at"),
        (Jobs, '{"7": {"partition": "train"}}', "7.eligible"),
        (Nodes, '["gpu01"]', "dictionary"),
    ],
)
def test_a_corrupt_setting_is_an_error_naming_its_key(
    ledger: Ledger, kind: type[Setting], raw: str, field: str
) -> None:
    corrupt(ledger, kind.key, raw)
    with pytest.raises(CorruptSetting, match=f"setting '{kind.key}'") as err:
        ledger.setting(kind)
    assert field in str(err.value) and kind.repair in str(err.value)
    assert "\n" not in str(err.value)


def test_a_setting_that_is_not_json_is_named_too(tmp_path: Path) -> None:
    ledger = Ledger(f"sqlite:///{tmp_path / 'l.db'}")  # PostgreSQL's json type refuses it
    corrupt(ledger, "breaker", "{open")
    with pytest.raises(CorruptSetting, match="setting 'breaker': not JSON"):
        ledger.setting(Breaker)


def test_a_setting_is_checked_when_it_is_made() -> None:
    with pytest.raises(ValidationError):
        JobSeen(partition="train", restarts=-1, eligible=True)
    with pytest.raises(ValidationError):
        Breaker(open=True, opened_at=datetime(2026, 11, 29, 12, 0))  # no time zone


def test_every_key_has_one_model() -> None:
    keys = [kind.key for kind in SETTINGS]
    assert sorted(keys) == [
        "breaker", "jobs", "loop", "modes", "nodes", "switch", "unmatched", "view"
    ]  # fmt: skip


def test_the_cli_says_which_setting_is_corrupt(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'ledger.db'}"
    config = tmp_path / "config.yml"
    config.write_text(yaml.safe_dump({"database_url": db}))
    corrupt(Ledger(db), "breaker", '{"open": 1.5}')

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "webhook.cli", *args, f"--config={config}"],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip

    status = cli("breaker", "status")
    assert status.returncode == 1 and "Traceback" not in status.stderr
    assert "setting 'breaker': open:" in status.stderr
    assert len(status.stderr.strip().splitlines()) == 1
    # The repair it names mends it.
    assert cli("breaker", "reset").returncode == 0
    assert cli("breaker", "status").stdout.startswith("closed (reset ")


def test_metrics_report_the_rest_when_one_setting_is_corrupt(
    ledger: Ledger, caplog: pytest.LogCaptureFixture
) -> None:
    ledger.put(Heartbeat(at=1234.5), T)
    corrupt(ledger, "switch", '{"monitor": "yes please"}')
    with caplog.at_level(logging.ERROR, logger="slurmedic.metrics"):
        families = {f.name: f for f in LedgerCollector(ledger).collect()}
    assert families["slurmedic_loop_last_tick_timestamp_seconds"].samples[0].value == 1234.5
    assert families["slurmedic_monitor_switch"].samples[0].value == 0
    assert "setting 'switch'" in caplog.text


def test_a_corrupt_switch_holds_every_action_in_monitor_mode(
    ledger: Ledger, caplog: pytest.LogCaptureFixture
) -> None:
    assert monitor_forced(ledger) is False
    ledger.put(Switch(monitor=True), T)
    assert monitor_forced(ledger) is True
    ledger.put(Switch(monitor=False), T)
    with ledger.engine.begin() as conn:
        conn.execute(text("UPDATE settings SET value = :v WHERE key = 'switch'"), {"v": "[1]"})
    with caplog.at_level(logging.ERROR, logger="slurmedic.loop"):
        assert monitor_forced(ledger) is True
    assert "setting 'switch'" in caplog.text


def test_the_loop_refuses_to_start_on_a_corrupt_breaker(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'ledger.db'}"
    config = tmp_path / "config.yml"
    # No Slurm here: the loop starts without a cluster view, then reads the breaker.
    config.write_text(yaml.safe_dump({"database_url": db, "executor": {"enabled": False}}))
    corrupt(Ledger(db), "breaker", '{"open": true, "opened_at": "yesterday"}')
    out = subprocess.run(
        [sys.executable, "-m", "webhook.cli", "loop", f"--config={config}"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert "Error: ledger setting 'breaker': opened_at:" in out.stderr
