"""The ledger's contract on both backends: SQLite (the default) and a real PostgreSQL server."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from webhook.core.alerts import Payload
from webhook.core.decisions import Decision
from webhook.core.engine import Incident
from webhook.ledger.store import Ledger

T = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


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


def test_a_postgresql_ledger_bounds_its_waits_on_a_server_it_cannot_reach(
    postgres_url: str,
) -> None:
    """libpq's defaults would wait out TCP's retransmissions (minutes) on a server cut off by
    the network; the ledger's connections carry timeouts, and a URL's own settings win."""

    def params(url: str) -> dict[str, str]:
        with Ledger(url).engine.connect() as conn:
            info = conn.connection.dbapi_connection.info  # type: ignore[union-attr]
            return dict(info.get_parameters())

    got = params(postgres_url)
    assert got["connect_timeout"] == "5" and got["tcp_user_timeout"] == "15000", got
    assert got["keepalives_idle"] == "10", got
    assert params(f"{postgres_url}?connect_timeout=2")["connect_timeout"] == "2"
