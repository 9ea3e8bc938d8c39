"""Write a ledger with the code of a previous release, for the upgrade test.

Run with that release's tree first on the path (it imports `webhook` from there):

    git archive a61be39 | tar -x -C /tmp/prev
    PYTHONPATH=/tmp/prev python tests/data/ledger/write_previous.py URL

URL `sqlite:///tests/data/ledger/a61be39.db` writes the committed SQLite file; a PostgreSQL URL
fills a database whose `pg_dump --inserts` is the committed `a61be39.pg.sql`. The rows written
here are the ones tests/service/test_ledger_migrations.py expects to read back.
"""

from __future__ import annotations

import sys
from datetime import UTC, datetime, timedelta

from webhook.core.alerts import Payload
from webhook.core.decisions import Decision
from webhook.core.engine import Incident
from webhook.core.recovery import FailurePoint, Verdict, Watch
from webhook.ledger.store import Ledger

T = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


def main(url: str) -> None:
    ledger = Ledger(url)
    raw = {
        "status": "firing",
        "groupKey": "{}:{alertname=GpuXidNodeFault}",
        "alerts": [
            {
                "status": "firing",
                "labels": {"alertname": "GpuXidNodeFault", "node": n, "signal": "gpu_hw"},
                "annotations": {"summary": f"XID 79 on {n}"},
                "startsAt": "2026-11-29T12:00:00Z",
            }
            for n in ("gpu01", "gpu02")
        ],
    }
    ledger.store(raw, Payload.model_validate(raw), T, "10.0.0.9")
    ev = (
        {
            "alertname": "GpuXidNodeFault",
            "node": "gpu01",
            "fingerprint": "f1",
            "startsAt": "2026-11-29T12:00:00Z",
        },
    )
    common = {"incident": "7.0", "job": 7, "cause": "gpu_hardware", "evidence": ev}
    incident = Incident(key="7.0", job=7, node=None, opened_at=T, decided_at=T)
    drain, requeue = ledger.record(
        [
            Decision(
                at=T + timedelta(seconds=20),
                action="drain",
                nodes=("gpu01",),
                reason="XID 79 on gpu01",
                mode="enforce",
                state="pending",
                **common,  # type: ignore[arg-type]
            ),
            Decision(
                at=T + timedelta(seconds=20),
                action="requeue",
                exclude=("gpu01",),
                reason="from its checkpoint",
                mode="enforce",
                state="pending",
                **common,  # type: ignore[arg-type]
            ),
        ],
        [incident],
    )
    for d, at in ((drain, 22), (requeue, 25)):
        ledger.add_event(d, "running", {"by": "executor"}, T + timedelta(seconds=at))
        ledger.add_event(d, "executed", {"by": "executor"}, T + timedelta(seconds=at + 3))
    ledger.add_note(
        drain, {"by": "executor", "diagnostics": {"nodes": {}}}, T + timedelta(seconds=40)
    )
    ledger.watch(
        Watch("7.0", 7, 0, "gpu_hardware", T, T + timedelta(seconds=28), FailurePoint(120, 100, 45))
    )
    ledger.conclude(
        "7.0",
        Verdict("recovered", "passed step 120", restored_seconds=300),
        T + timedelta(seconds=600),
    )
    ledger.set_setting(
        "breaker",
        {"open": False, "reset_at": "2026-11-29T11:00:00+00:00"},
        T - timedelta(seconds=3600),
    )
    ledger.set_setting("switch", {"monitor": True}, T)
    ledger.set_setting("loop", {"at": T.timestamp()}, T)
    ledger.set_setting("jobs", {"7": {"partition": "train", "restarts": 1, "eligible": True}}, T)
    ledger.set_setting("nodes", {"gpu01": {"status": "drained", "partitions": ["train"]}}, T)
    ledger.engine.dispose()


if __name__ == "__main__":
    main(sys.argv[1])
