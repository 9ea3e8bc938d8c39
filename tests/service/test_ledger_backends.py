"""The ledger's contract on both backends: SQLite (the default) and a real PostgreSQL server."""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from webhook.core.alerts import Payload
from webhook.core.decisions import Decision
from webhook.core.engine import Incident
from webhook.ledger.store import Ledger

PG_BIN = sorted(Path("/usr/lib/postgresql").glob("*/bin"))
T = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def postgres_url() -> Iterator[str]:
    """A throwaway PostgreSQL cluster on loopback, run as the postgres user, stopped after."""
    assert PG_BIN, "PostgreSQL is not installed (scripts/setup.sh installs it)"
    bin_dir = PG_BIN[-1]
    data = Path(tempfile.mkdtemp(prefix="slurmedic-pg-"))
    shutil.chown(data, "postgres", "postgres")
    port = free_port()
    as_pg = ["runuser", "-u", "postgres", "--"]
    subprocess.run(
        [*as_pg, str(bin_dir / "initdb"), "-D", str(data / "db"), "-A", "trust", "-U", "slurmedic"],
        check=True,
        capture_output=True,
    )
    subprocess.run(
        [
            *as_pg,
            str(bin_dir / "pg_ctl"),
            "-D",
            str(data / "db"),
            "-l",
            str(data / "log"),
            "-w",
            "-o",
            f"-p {port} -k {data} -c listen_addresses=127.0.0.1",
            "start",
        ],
        check=True,
        capture_output=True,
    )
    try:
        yield f"postgresql+psycopg://slurmedic@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run(
            [*as_pg, str(bin_dir / "pg_ctl"), "-D", str(data / "db"), "-m", "fast", "stop"],
            check=False,
            capture_output=True,
        )
        shutil.rmtree(data, ignore_errors=True)


@pytest.fixture(params=["sqlite", "postgresql"])
def ledger(request: pytest.FixtureRequest, tmp_path: Path) -> Ledger:
    if request.param == "sqlite":
        return Ledger(f"sqlite:///{tmp_path / 'ledger.db'}")
    url = request.getfixturevalue("postgres_url")
    ledger = Ledger(url)
    with ledger.engine.begin() as conn:  # a clean slate per test
        for table in ("decision_events", "decisions", "incidents", "alerts", "notifications"):
            conn.exec_driver_sql(f"TRUNCATE {table} RESTART IDENTITY CASCADE")
    return ledger


def raw_payload(*nodes: str, status: str = "firing") -> dict[str, object]:
    return {
        "status": status,
        "alerts": [
            {
                "status": status,
                "labels": {"alertname": "GpuXidNodeFault", "node": n, "signal": "gpu_hw"},
                "annotations": {"summary": f"XID 79 on {n}"},
                "startsAt": "2026-11-29T12:00:00Z",
            }
            for n in nodes
        ],
    }


def test_store_dedups_redeliveries_and_keeps_the_audit_log(ledger: Ledger) -> None:
    raw = raw_payload("gpu01", "gpu02")
    first = ledger.store(raw, Payload.model_validate(raw), T)
    again = ledger.store(raw, Payload.model_validate(raw), T + timedelta(seconds=15))
    assert (first.new, first.duplicates) == (2, 0)
    assert (again.new, again.duplicates) == (0, 2)
    resolved = raw_payload("gpu01", status="resolved")
    assert ledger.store(resolved, Payload.model_validate(resolved), T).new == 1
    rows = ledger.alerts_after(0)
    assert [(a.labels["node"], a.status) for _, _, a in rows] == [
        ("gpu01", "firing"),
        ("gpu02", "firing"),
        ("gpu01", "resolved"),
    ]
    assert all(received.tzinfo is not None for _, received, _ in rows)
    assert ledger.notification_count() == 3
    assert ledger.alerts_after(rows[1][0]) == rows[2:]


def test_decisions_and_their_events(ledger: Ledger) -> None:
    d = Decision(
        at=T,
        incident="7.0",
        job=7,
        action="drain",
        cause="gpu_hardware",
        reason="XID 79 on gpu01",
        nodes=("gpu01",),
        evidence=({"alertname": "GpuXidNodeFault", "node": "gpu01"},),
    )
    incident = Incident(key="7.0", job=7, node=None, opened_at=T - timedelta(seconds=20))
    (decision_id,) = ledger.record([d], [incident])
    row, events = ledger.decision(decision_id)  # type: ignore[misc]
    assert (row.action, row.nodes, row.state, row.incident) == (
        "drain",
        ["gpu01"],
        "recorded",
        "7.0",
    )
    assert [e.state for e in events] == ["recorded"]
    assert {i.key for i in ledger.restore_incidents(since=T - timedelta(hours=1))} == {"7.0"}
    with ledger.session() as s:
        from webhook.ledger.schema import IncidentRow

        inc = s.get(IncidentRow, "7.0")
        assert inc is not None and inc.job == 7
        assert inc.decided_at.replace(tzinfo=UTC) == T  # SQLite hands back naive UTC
    assert [h.nodes for h in ledger.history(T - timedelta(hours=1))] == [("gpu01",)]
    assert ledger.decision(decision_id + 1) is None
