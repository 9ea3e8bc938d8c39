"""The recovery drills asked for in a window, as the trial report lists them (read-only).

Apart from webhook/ledger/drills.py, which the loop and the CLI share: the report needs every
drill of its window, not the latest few, and each as plain data for the pure core.
"""

from __future__ import annotations

from datetime import datetime

from webhook.core.trial import Drilled
from webhook.ledger.store import Ledger


def trial_drills(ledger: Ledger, since: datetime, until: datetime) -> list[Drilled]:
    """The drills asked for in [since, until), oldest first, each with what its recovery
    measured once there is one."""
    return [
        Drilled(
            id=d.id,
            job=d.job,
            at=d.asked_at,
            by=d.by,
            outcome=d.outcome,
            reason=d.reason if d.recovery is None else d.recovery.reason,
            lost_steps=None if d.recovery is None else d.recovery.lost_steps,
            lost_seconds=None if d.recovery is None else d.recovery.lost_seconds,
            start_seconds=None if d.recovery is None else d.recovery.start_seconds,
        )
        for d in ledger.drills.between(since, until)
    ]
