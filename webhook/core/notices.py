"""What slurmedic tells people, as alerts of its own (posted to the site's Alertmanager).

Four kinds, each open while it needs a human and resolved once handled:

    SlurmedicAwaitingApproval  a recommendation waits for approval (with its age): open until
                               approved, rejected or superseded
    SlurmedicEscalation        slurmedic hands an incident to a human: open until someone
                               records a verdict on it (`slurmedic verdict`, the console)
    SlurmedicRecoveryFailed    a requeued job's successor failed too (an escalation of guard
                               recovery_failed): open until a verdict, as an escalation
    SlurmedicActionMismatch    Slurm showed otherwise after a run than its decision set out
                               (a double requeue, a drain whose reason is not its own:
                               webhook/core/outcome.py): open until a verdict

Pure: the notices are computed from plain rows and the time; the notifier (webhook/service/
notify.py) posts them and resolves those that are gone.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal

Kind = Literal["awaiting_approval", "escalation", "recovery_failed", "mismatch"]
ALERTNAME: dict[Kind, str] = {
    "awaiting_approval": "SlurmedicAwaitingApproval",
    "escalation": "SlurmedicEscalation",
    "recovery_failed": "SlurmedicRecoveryFailed",
    "mismatch": "SlurmedicActionMismatch",
}
SEVERITY: dict[Kind, str] = {
    "awaiting_approval": "warning",
    "escalation": "critical",
    "recovery_failed": "critical",
    "mismatch": "critical",
}
# The label Alertmanager routes slurmedic's notices by (alert_rules/alertmanager.yml).
SOURCE = ("notice", "slurmedic")


@dataclass(frozen=True)
class Open:
    """A decision that needs a human, as the ledger holds it."""

    decision_id: int
    incident: str
    job: int | None
    action: str
    cause: str
    guard: str | None
    state: str
    reason: str
    at: datetime
    mismatch: str | None = None  # what Slurm showed otherwise after the decision's run


@dataclass(frozen=True)
class Notice:
    kind: Kind
    decision_id: int
    incident: str
    job: int | None
    action: str
    cause: str
    reason: str
    since: datetime

    @property
    def key(self) -> tuple[str, int]:
        return (self.kind, self.decision_id)


def notices(rows: list[Open]) -> list[Notice]:
    """The notices of the decisions that need a human (the ledger picks them: awaiting approval,
    or an escalation without a verdict)."""
    out = []
    for r in rows:
        reason = r.reason
        if r.state == "awaiting_approval":
            kind: Kind = "awaiting_approval"
        elif r.mismatch:
            kind, reason = "mismatch", r.mismatch
        elif r.action == "escalate":
            kind = "recovery_failed" if r.guard == "recovery_failed" else "escalation"
        else:
            continue
        out.append(Notice(kind, r.decision_id, r.incident, r.job, r.action, r.cause, reason, r.at))
    return out


def age(seconds: float) -> str:
    s = int(seconds)
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def as_alert(
    n: Notice, now: datetime, ends: timedelta, console: str, generator: str = ""
) -> dict[str, Any]:
    """Alertmanager's API v2 alert for a notice: firing until now + `ends` (re-posted before
    then while it is open), or resolved now when `ends` is zero."""
    waited = age((now - n.since).total_seconds())
    link = f"{console.rstrip('/')}/console/incident/{n.incident}" if console else ""
    what = {
        "awaiting_approval": f"{n.action} of incident {n.incident} waits for approval ({waited})",
        "escalation": f"incident {n.incident} needs a human ({n.cause})",
        "recovery_failed": f"the recovery of incident {n.incident} failed",
        "mismatch": f"the {n.action} of incident {n.incident} left Slurm otherwise than decided",
    }[n.kind]
    labels = {
        "alertname": ALERTNAME[n.kind],
        "severity": SEVERITY[n.kind],
        SOURCE[0]: SOURCE[1],
        "incident": n.incident,
        "action": n.action,
        "cause": n.cause,
        "decision": str(n.decision_id),
        **({"slurm_job_id": str(n.job)} if n.job is not None else {}),
    }
    return {
        "labels": labels,
        "annotations": {
            "summary": what,
            "description": n.reason,
            "waiting_since": n.since.strftime("%Y-%m-%dT%H:%M:%SZ"),
            "age": waited,
            **({"console": link} if link else {}),
        },
        "startsAt": n.since.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "endsAt": (now + ends).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "generatorURL": link or generator,
    }
