"""The recovery drills asked for in a window, as the trial report lists them (read-only).

Apart from webhook/ledger/drills.py, which the loop and the CLI share: the report needs every
drill of its window, not the latest few, and each as plain data for the pure core.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import select

from webhook.core.trial import Drilled, drill_outcome
from webhook.ledger.schema import DrillRow, RecoveryRow
from webhook.ledger.store import Ledger, _utc


def trial_drills(ledger: Ledger, since: datetime, until: datetime) -> list[Drilled]:
    """The drills asked for in [since, until), oldest first, each with what its recovery
    measured once there is one."""
    with ledger.session() as s:
        rows = s.scalars(
            select(DrillRow)
            .where(DrillRow.asked_at >= since, DrillRow.asked_at < until)
            .order_by(DrillRow.id)
        ).all()
        incidents = [r.incident for r in rows if r.incident]
        recoveries = {
            r.incident: r
            for r in s.scalars(select(RecoveryRow).where(RecoveryRow.incident.in_(incidents)))
        }
    out = []
    for d in rows:
        rec = recoveries.get(d.incident) if d.incident else None
        out.append(
            Drilled(
                id=d.id,
                job=d.job,
                at=_utc(d.asked_at),
                by=d.by,
                outcome=drill_outcome(d.state, None if rec is None else rec.state),
                reason=d.reason if rec is None else rec.reason,
                lost_steps=None if rec is None else rec.lost_steps,
                lost_seconds=None if rec is None else rec.lost_seconds,
                start_seconds=None if rec is None else rec.start_seconds,
            )
        )
    return out
