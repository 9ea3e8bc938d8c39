"""Operators' requests for recovery drills (webhook/core/drills.py): the ledger's SQL for them.

`slurmedic drill` and the console ask; the leader's loop takes the requests that are due,
plans each and records its decision (or why not) in the same transaction, so a request is
planned once whichever replica leads.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from webhook.core.decisions import Decision
from webhook.core.drills import Request
from webhook.core.lifecycle import APPROVED, AWAITING_APPROVAL, EXECUTED, PENDING, RUNNING
from webhook.core.trial import Drilled, drill_outcome
from webhook.ledger.schema import DecisionRow, DrillRow, RecoveryRow, utc

ASKED, DECIDED, REFUSED = "asked", "decided", "refused"
# A drill's requeue in these states interrupts its job, or is about to (monitor mode's record,
# a rejection, an expiry or a failure interrupt nothing).
INTERRUPTING = (PENDING, AWAITING_APPROVAL, APPROVED, RUNNING, EXECUTED)


@dataclass(frozen=True)
class Drill:
    """A drill as an operator follows it: the request, and the recovery it led to."""

    id: int
    job: int
    by: str
    asked_at: datetime
    not_before: datetime
    state: str  # asked, decided, refused
    reason: str
    incident: str | None
    exclude: str | None
    recovery: RecoveryRow | None  # once its requeue ran: how the job came back
    run_state: str | None = None  # its requeue decision's state, once decided

    @property
    def outcome(self) -> str:
        """passed, failed, watching...: webhook/core/trial.py drill_outcome."""
        return drill_outcome(
            self.state, None if self.recovery is None else self.recovery.state, self.run_state
        )

    def as_trial(self) -> Drilled:
        """The drill as the trial report lists it: plain data for the pure core."""
        r = self.recovery
        return Drilled(
            id=self.id,
            job=self.job,
            at=self.asked_at,
            by=self.by,
            outcome=self.outcome,
            reason=self.reason if r is None else r.reason,
            lost_steps=None if r is None else r.lost_steps,
            lost_seconds=None if r is None else r.lost_seconds,
            start_seconds=None if r is None else r.start_seconds,
        )


class Drills:
    def __init__(self, session: sessionmaker[Session]) -> None:
        self.session = session

    def ask(
        self, job: int, by: str, at: datetime, not_before: datetime, exclude: str | None
    ) -> int:
        with self.session.begin() as s:
            row = DrillRow(
                job=job, by=by, asked_at=at, not_before=not_before, exclude=exclude, state=ASKED
            )
            s.add(row)
            s.flush()
            return row.id

    def due(self, now: datetime) -> list[Request]:
        with self.session() as s:
            rows = s.scalars(
                select(DrillRow)
                .where(DrillRow.state == ASKED, DrillRow.not_before <= now)
                .order_by(DrillRow.id)
            ).all()
            return [Request(r.id, r.job, r.by, utc(r.asked_at), r.exclude) for r in rows]

    def settle(
        self,
        request: Request,
        decided: Decision | None,
        reason: str,
        record: Callable[[Session, Sequence[Decision]], list[int]],
    ) -> list[int]:
        """The request planned: its decision recorded by `record` (the ledger's, in its term)
        in the same transaction, or refused with `reason`. A request another replica settled
        first is left as it is (nothing recorded)."""
        with self.session.begin() as s:
            row = s.get(DrillRow, request.id, with_for_update=True)
            if row is None or row.state != ASKED:
                return []
            row.state = REFUSED if decided is None else DECIDED
            row.reason = reason[:2000]
            row.incident = None if decided is None else decided.incident
            return [] if decided is None else record(s, [decided])

    def in_flight(self, since: datetime) -> set[int]:
        """The jobs a drill decided since `since` is interrupting: its requeue waits, runs or
        ran, and its recovery is not judged yet. Their time is no goodput's concern: the
        interruption is an operator's test, not a failure."""
        with self.session() as s:
            judged = select(RecoveryRow.incident).where(RecoveryRow.state != "watching")
            jobs = s.scalars(
                select(DecisionRow.job)
                .join(DrillRow, DrillRow.incident == DecisionRow.incident)
                .where(
                    DrillRow.state == DECIDED,
                    DrillRow.asked_at >= since,
                    DecisionRow.action == "requeue",
                    DecisionRow.state.in_(INTERRUPTING),
                    DecisionRow.incident.not_in(judged),
                    DecisionRow.job.is_not(None),
                )
            ).all()
            return {j for j in jobs if j is not None}

    @staticmethod
    def outcomes(s: Session) -> dict[str, int]:
        """Drills by outcome, for /metrics: asked (not planned yet), refused, and those planned
        by what became of their recovery: watching, passed, failed, unverified."""
        requests = dict(
            s.execute(
                select(DrillRow.state, func.count())
                .where(DrillRow.state != DECIDED)
                .group_by(DrillRow.state)
            ).all()
        )
        judged = dict(
            s.execute(
                select(RecoveryRow.state, func.count())
                .where(RecoveryRow.drill.is_(True))
                .group_by(RecoveryRow.state)
            ).all()
        )
        return {
            ASKED: requests.get(ASKED, 0),
            REFUSED: requests.get(REFUSED, 0),
            "watching": judged.get("watching", 0),
            "passed": judged.get("recovered", 0),
            "failed": judged.get("failed", 0),
            "unverified": judged.get("unverified", 0),
        }

    def latest(self, limit: int = 100) -> list[Drill]:
        """The latest drills, newest first."""
        with self.session() as s:
            query = select(DrillRow).order_by(DrillRow.id.desc()).limit(limit)
            return self._read(s, s.scalars(query).all())

    def between(self, since: datetime, until: datetime) -> list[Drill]:
        """The drills asked for in [since, until), oldest first."""
        with self.session() as s:
            query = (
                select(DrillRow)
                .where(DrillRow.asked_at >= since, DrillRow.asked_at < until)
                .order_by(DrillRow.id)
            )
            return self._read(s, s.scalars(query).all())

    @staticmethod
    def _read(s: Session, rows: Sequence[DrillRow]) -> list[Drill]:
        """Each drill with its requeue's state and its recovery, once there are."""
        incidents = [r.incident for r in rows if r.incident]
        recoveries = {
            r.incident: r
            for r in s.scalars(select(RecoveryRow).where(RecoveryRow.incident.in_(incidents)))
        }
        runs = dict(
            s.execute(
                select(DecisionRow.incident, DecisionRow.state).where(
                    DecisionRow.incident.in_(incidents), DecisionRow.action == "requeue"
                )
            ).all()
        )
        return [
            Drill(
                id=r.id,
                job=r.job,
                by=r.by,
                asked_at=utc(r.asked_at),
                not_before=utc(r.not_before),
                state=r.state,
                reason=r.reason,
                incident=r.incident,
                exclude=r.exclude,
                recovery=recoveries.get(r.incident) if r.incident else None,
                run_state=runs.get(r.incident) if r.incident else None,
            )
            for r in rows
        ]
