"""The ledger's contract on both backends: SQLite (the default) and a real PostgreSQL server."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

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


def decided(at: datetime, incident: str, action: str, **kw: object) -> Decision:
    """A decision of `incident` (its job from its key), of a GPU's fault unless `kw` says."""
    job = int(incident.split(".")[0]) if incident[0].isdigit() else None
    fields: dict[str, Any] = {"cause": "gpu_hardware", "reason": "XID 79"} | kw
    return Decision(at=at, incident=incident, job=job, action=action, **fields)


def test_a_restart_reads_the_older_exclusions_of_the_jobs_slurm_knows(ledger: Ledger) -> None:
    """exclusion_history: the requeues of the jobs asked for that excluded or readmitted nodes,
    and the drains of those nodes (no other), before the time asked for, in time order; what
    a revision superseded, or a guard refused, is not there."""

    days = [T - timedelta(days=d) for d in (4, 3, 2, 1)]
    ledger.record(
        [
            decided(days[0], "7.0", "drain", nodes=("gpu01",)),
            decided(days[0], "7.0", "requeue", exclude=("gpu01",)),
            decided(days[0], "8.0", "drain", nodes=("gpu02",)),
            decided(days[0], "8.0", "requeue", exclude=("gpu02",)),
            decided(days[1], "node:gpu03", "drain", nodes=("gpu03",)),  # excluded by no one
            decided(days[1], "7.5", "requeue", exclude=("gpu09",), state="superseded"),
            decided(days[1], "7.6", "requeue", exclude=("gpu08",), guard="retry_budget_exhausted"),
            decided(days[2], "7.1", "drain", nodes=("gpu04",)),
            decided(days[2], "7.1", "requeue", exclude=("gpu04",), readmit=("gpu01",)),
            decided(T, "7.2", "requeue", exclude=("gpu05",)),  # not before T
        ]
    )
    got = [(h.at, h.action, h.job, h.nodes or h.exclude) for h in ledger.exclusion_history(T, {7})]
    assert got == [
        (days[0], "drain", 7, ("gpu01",)),
        (days[0], "requeue", 7, ("gpu01",)),
        (days[2], "drain", 7, ("gpu04",)),
        (days[2], "requeue", 7, ("gpu04",)),
    ]
    assert {h.job for h in ledger.exclusion_history(T, {8, 9})} == {8}
    every = list(ledger.exclusion_history(T))  # before the first view of Slurm: every job's
    assert {h.job for h in every if h.action == "requeue"} == {7, 8}
    assert len(every) == 6
    # More jobs than one statement takes bound parameters (SQLite 32,766, PostgreSQL 65,535).
    assert len(list(ledger.exclusion_history(T, set(range(5, 70_000))))) == 6


def test_a_blameless_requeue_is_remembered_with_the_node_its_failure_began_on(
    ledger: Ledger,
) -> None:
    """The guards' memory reads a decision's evidence only where it needs it (a requeue nobody
    was blamed for: the node of its earliest evidence)."""
    first = {
        "alertname": "TrainingNcclTimeout",
        "node": "gpu06",
        "startsAt": "2026-11-29T11:50:00Z",
    }
    later = {
        "alertname": "TrainingNcclTimeout",
        "node": "gpu02",
        "startsAt": "2026-11-29T11:55:00Z",
    }
    ledger.record([decided(T, "7.0", "requeue", cause="hang", evidence=(later, first))])
    assert [h.nodes for h in ledger.history(T - timedelta(hours=1))] == [("gpu06",)]


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


def test_alerts_the_webhook_took_are_read_back_whatever_their_json(ledger: Ledger) -> None:
    """The loop reads the stored text with pydantic's JSON parser, which refuses some text the
    webhook took with json.loads: an extra field nested 250 deep, a lone surrogate escape. A
    row the loop cannot read would stop it at every step."""
    deep: Any = "leaf"
    for _ in range(250):
        deep = [deep]
    raw = raw_payload("gpu01", "gpu02")
    raw["alerts"][0]["nested"] = deep  # type: ignore[index]
    stored = ledger.store(raw, Payload.model_validate(raw), T)
    assert stored.new == 2
    if ledger.engine.dialect.name == "sqlite":  # PostgreSQL's json refuses it at the insert
        lone = raw_payload("gpu03")
        lone["alerts"][0]["annotations"]["summary"] = "\ud83d"  # type: ignore[index]
        assert ledger.store(lone, Payload.model_validate(lone), T).new == 1
    rows = ledger.alerts_after(0)
    assert rows[0][2].model_extra == {"nested": deep}
    assert [a.labels["node"] for _, _, a in rows][:2] == ["gpu01", "gpu02"]
    if ledger.engine.dialect.name == "sqlite":
        assert rows[2][2].annotations["summary"] == "\ud83d"
