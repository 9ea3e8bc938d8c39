"""The ledger's operations; the only module that speaks SQL."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

from sqlalchemy import Engine, create_engine, event, func, inspect, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import CursorResult
from sqlalchemy.orm import Session, sessionmaker

from webhook.core.alerts import Alert, Payload
from webhook.core.decisions import BLAMELESS, SCHEDULER_ACTIONS, Decision, PastAction
from webhook.core.engine import Incident, evidence_key, until_job_ends
from webhook.core.incidents import BadIncidentKey, IncidentKey
from webhook.core.lifecycle import CARRIED_OUT, NOTE, OPEN, PREVIOUS, IllegalTransition, check
from webhook.core.recovery import FailurePoint, Verdict, Watch
from webhook.ledger.schema import (
    AlertRow,
    Base,
    DecisionEvent,
    DecisionRow,
    IncidentRow,
    Notification,
    RecoveryRow,
    Setting,
)


def _utc(dt: datetime) -> datetime:
    """SQLite hands datetimes back naive; the ledger stores UTC only."""
    return dt if dt.tzinfo else dt.replace(tzinfo=UTC)


@dataclass(frozen=True)
class Stored:
    notification: int
    new: int
    duplicates: int


class Ledger:
    def __init__(self, url: str) -> None:
        self.url = url
        self.engine: Engine = create_engine(url, pool_pre_ping=True)
        if self.engine.dialect.name == "sqlite":
            event.listen(self.engine, "connect", _sqlite_pragmas)
            if self.engine.url.database not in (None, "", ":memory:"):
                Path(self.engine.url.database).parent.mkdir(parents=True, exist_ok=True)
        Base.metadata.create_all(self.engine)
        self._add_missing_columns()
        self.session = sessionmaker(self.engine, expire_on_commit=False)

    def _add_missing_columns(self) -> None:
        """Columns added to existing tables since a ledger was created (create_all only makes
        tables): added empty, nullable, so older ledgers keep working."""
        found = inspect(self.engine)
        with self.engine.begin() as conn:
            for table in Base.metadata.sorted_tables:
                have = {c["name"] for c in found.get_columns(table.name)}
                for col in table.columns:
                    if col.name not in have and col.nullable:
                        kind = col.type.compile(dialect=self.engine.dialect)
                        conn.exec_driver_sql(
                            f'ALTER TABLE {table.name} ADD COLUMN "{col.name}" {kind}'
                        )

    def ping(self) -> None:
        with self.engine.connect() as conn:
            conn.exec_driver_sql("SELECT 1")

    # ---- notifications ---------------------------------------------------------------------
    def store(
        self, raw: dict[str, Any], payload: Payload, received_at: datetime, remote: str = ""
    ) -> Stored:
        """Persist one notification and its alert events in one transaction (before the 2xx).

        Two statements whatever the payload's size: the notification, then every alert event
        in one batch that skips the events already stored (re-deliveries).
        """
        insert = (postgresql if self.engine.dialect.name == "postgresql" else sqlite).insert
        with self.engine.begin() as conn:
            note_id = conn.execute(
                insert(Notification)
                .values(
                    received_at=received_at,
                    remote=remote[:64],
                    group_key=payload.groupKey,
                    payload=raw,
                )
                .returning(Notification.id)
            ).scalar_one()
            rows = [
                {
                    "notification_id": note_id,
                    "received_at": received_at,
                    "fingerprint": a.fingerprint,
                    "starts_at": a.startsAt.astimezone(UTC),
                    "status": a.status,
                    # The alert as received (already JSON), with the fingerprint filled in.
                    "alert": {**raw_alert, "fingerprint": a.fingerprint},
                }
                for a, raw_alert in zip(payload.alerts, raw["alerts"], strict=True)
            ]
            # One batch; RETURNING yields only the rows inserted (rowcount of a batch is not
            # portable across drivers).
            stmt = insert(AlertRow).on_conflict_do_nothing().returning(AlertRow.id)
            new = len(conn.execute(stmt, rows).all())
        return Stored(note_id, new, len(payload.alerts) - new)

    def alerts_after(self, last_id: int, limit: int = 5000) -> list[tuple[int, datetime, Alert]]:
        with self.session() as s:
            rows = s.scalars(
                select(AlertRow).where(AlertRow.id > last_id).order_by(AlertRow.id).limit(limit)
            ).all()
            return [(r.id, _utc(r.received_at), Alert.model_validate(r.alert)) for r in rows]

    def last_alert_id(self) -> int:
        with self.session() as s:
            return int(s.scalar(select(func.max(AlertRow.id))) or 0)

    def notification_count(self) -> int:
        with self.session() as s:
            return len(s.scalars(select(Notification.id)).all())

    # ---- decisions -------------------------------------------------------------------------
    def record(
        self,
        decisions: list[Decision],
        incidents: Sequence[Incident] = (),
        detail: dict[str, Any] | None = None,
    ) -> list[int]:
        """Decisions, their first state and the incidents they decide, in one transaction.

        A revision (`Decision.revision` > 0) supersedes its incident's decisions that were not
        carried out yet; where a drain, requeue or stop was (it ran, or runs), the revision's
        same decision is not recorded again: the action happened, and later evidence does not
        undo it."""
        with self.session.begin() as s:
            revised = {d.incident for d in decisions if d.revision}
            done: set[tuple[object, ...]] = set()
            for k in revised:
                done |= self._supersede(s, k, decisions, detail)
            decisions = [d for d in decisions if _what(d) not in done]
            for inc in incidents:
                s.merge(
                    IncidentRow(
                        key=inc.key,
                        job=inc.job,
                        node=inc.node,
                        opened_at=inc.opened_at,
                        decided_at=max(
                            (d.at for d in decisions if d.incident == inc.key),
                            default=inc.decided_at or inc.opened_at,
                        ),
                        evidence=[e.record() for e in inc.evidence],
                    )
                )
            ids = _insert_decisions(s, decisions, detail or {"by": "engine"})
        return ids

    @staticmethod
    def _supersede(
        s: Session, incident: str, decisions: Sequence[Decision], detail: dict[str, Any] | None
    ) -> set[tuple[object, ...]]:
        """Mark the incident's open decisions superseded by this revision (each by a
        conditional update: a decision the executor claimed meanwhile is not touched); what of
        the incident was carried out already, which the revision must not repeat."""
        new = [d for d in decisions if d.incident == incident]
        why = "; ".join(
            f"{d.action} {','.join(d.nodes or d.exclude) or '-'} ({d.cause}): {d.reason}"
            for d in new
        )[:2000]
        rows = s.scalars(
            select(DecisionRow).where(
                DecisionRow.incident == incident, DecisionRow.state != "superseded"
            )
        ).all()
        done: set[tuple[object, ...]] = set()
        for row in rows:
            if row.state in OPEN and _move(s, row.id, OPEN, "superseded"):
                s.add(
                    DecisionEvent(
                        decision_id=row.id,
                        at=new[0].at,
                        state="superseded",
                        detail={**(detail or {"by": "engine"}), "superseded_by": why},
                    )
                )
                continue
            s.refresh(row)
            if row.action in SCHEDULER_ACTIONS and row.state in CARRIED_OUT:
                done.add((row.action, tuple(row.nodes), tuple(row.exclude)))
        return done

    def carried_out(self, incidents: Sequence[str]) -> set[str]:
        """Those of the incidents one of whose scheduler actions ran or runs: later evidence
        does not revise them."""
        if not incidents:
            return set()
        with self.session() as s:
            return set(
                s.scalars(
                    select(DecisionRow.incident).where(
                        DecisionRow.incident.in_(list(incidents)),
                        DecisionRow.action.in_(SCHEDULER_ACTIONS),
                        DecisionRow.state.in_(CARRIED_OUT),
                    )
                ).all()
            )

    def add_event(self, decision_id: int, state: str, detail: dict[str, Any], at: datetime) -> None:
        """Append a state change (the decision row keeps the latest state, for queries).

        The move must be one the lifecycle allows (IllegalTransition otherwise); the row is
        locked for it, so two writers cannot both move a decision out of the same state."""
        with self.session.begin() as s:
            row = s.get(DecisionRow, decision_id)
            if row is None:
                raise KeyError(decision_id)
            check(row.state, state)
            # The move is made only from a state that allows it, in one statement: another
            # writer (the loop superseding, a human approving) may have moved it since it was
            # read, also on SQLite, where reads do not lock.
            if not _move(s, decision_id, PREVIOUS[state], state):
                s.rollback()
                current = self.decision(decision_id)
                check(current[0].state if current else "", state)
                raise IllegalTransition(f"decision {decision_id} moved on meanwhile")
            s.add(DecisionEvent(decision_id=decision_id, at=at, state=state, detail=detail))

    def add_note(self, decision_id: int, detail: dict[str, Any], at: datetime) -> None:
        """Append something learnt about a decision (diagnostics) that does not change its
        state: an event in state `note`."""
        with self.session.begin() as s:
            row = s.get(DecisionRow, decision_id)
            if row is None:
                raise KeyError(decision_id)
            s.add(DecisionEvent(decision_id=decision_id, at=at, state=NOTE, detail=detail))

    def setting(self, key: str) -> dict[str, Any] | None:
        with self.session() as s:
            row = s.get(Setting, key)
            return dict(row.value) if row else None

    def set_setting(self, key: str, value: dict[str, Any], at: datetime) -> None:
        with self.session.begin() as s:
            s.merge(Setting(key=key, value=value, updated_at=at))

    def rows(self, ids: Sequence[int]) -> list[DecisionRow]:
        with self.session() as s:
            return list(s.scalars(select(DecisionRow).where(DecisionRow.id.in_(ids))).all())

    def incident_decisions(self, incident: str) -> list[DecisionRow]:
        with self.session() as s:
            rows = s.scalars(
                select(DecisionRow).where(DecisionRow.incident == incident).order_by(DecisionRow.id)
            ).all()
            return list(rows)

    def in_state(self, *states: str) -> list[DecisionRow]:
        with self.session() as s:
            rows = s.scalars(
                select(DecisionRow).where(DecisionRow.state.in_(states)).order_by(DecisionRow.id)
            ).all()
            return list(rows)

    def decisions(self, limit: int = 100) -> list[DecisionRow]:
        with self.session() as s:
            rows = s.scalars(select(DecisionRow).order_by(DecisionRow.id.desc()).limit(limit)).all()
            return list(rows)

    def decision(self, decision_id: int) -> tuple[DecisionRow, list[DecisionEvent]] | None:
        with self.session() as s:
            row = s.get(DecisionRow, decision_id)
            if row is None:
                return None
            events = s.scalars(
                select(DecisionEvent)
                .where(DecisionEvent.decision_id == decision_id)
                .order_by(DecisionEvent.id)
            ).all()
            return row, list(events)

    def restore_incidents(self, since: datetime) -> list[Incident]:
        """The engine's incidents as the ledger holds them, for a restart: decided when, from
        which evidence, with which decisions in force, and whether one was carried out.
        Incidents decided before `since` come back closed (only their keys matter: a node's
        next failure must get the next key)."""
        out = []
        with self.session() as s:
            rows = {r.key: r for r in s.scalars(select(IncidentRow)).all()}
            standing: dict[str, list[DecisionRow]] = {}
            for d in s.scalars(
                select(DecisionRow)
                .where(DecisionRow.state != "superseded")
                .order_by(DecisionRow.id)
            ).all():
                standing.setdefault(d.incident, []).append(d)
        for key in sorted(rows.keys() | standing.keys()):
            try:
                parsed = IncidentKey.parse(key)
            except BadIncidentKey:
                continue
            row, ds = rows.get(key), standing.get(key, [])
            decided_at = _utc(row.decided_at) if row else max(_utc(d.at) for d in ds)
            opened_at = _utc(row.opened_at) if row else decided_at
            known = set()
            for e in row.evidence if row else []:
                with contextlib.suppress(KeyError, TypeError, ValueError):
                    at = datetime.fromisoformat(str(e["startsAt"]).replace("Z", "+00:00"))
                    known.add(evidence_key(str(e["fingerprint"]), at))
            # Carried out, or counted so (monitor and enforce ones: see the engine).
            carried = any(
                d.action in SCHEDULER_ACTIONS and (d.state in CARRIED_OUT or d.mode != "approve")
                for d in ds
            )
            # Only the engine's own incidents are revised, and only recent ones.
            ours = parsed.kind in ("attempt", "node")
            standing_now = [_decision(d) for d in ds]
            out.append(
                Incident(
                    # Keys of older ledgers (`node:gpu02#2`) as the engine spells them now.
                    key=str(parsed),
                    job=parsed.job if parsed.kind == "attempt" else None,
                    node=parsed.node,
                    opened_at=opened_at,
                    decided=True,
                    decided_at=decided_at,
                    standing=standing_now,
                    known=known,
                    closed=carried or not ours or decided_at < since,
                    until_job_ends=until_job_ends(standing_now, None),
                )
            )
        return out

    # ---- recoveries ------------------------------------------------------------------------
    def unwatched_requeues(
        self, since: datetime
    ) -> list[tuple[DecisionRow, datetime, datetime, datetime]]:
        """Requeues executed since `since` with no recovery row yet: (decision, fault time,
        when its run began, when it was executed).

        The fault time is the earliest startsAt of the evidence; the run's start is the last
        moment the failed attempt's own progress reports are sure to be there (its successor's
        ranks replace them once Slurm starts it)."""
        with self.session() as s:
            watched = select(RecoveryRow.incident)
            rows = s.scalars(
                select(DecisionRow).where(
                    DecisionRow.action == "requeue",
                    DecisionRow.state == "executed",
                    DecisionRow.at >= since,
                    DecisionRow.incident.not_in(watched),
                )
            ).all()
            out = []
            for r in rows:
                events = s.execute(
                    select(DecisionEvent.state, DecisionEvent.at)
                    .where(DecisionEvent.decision_id == r.id)
                    .order_by(DecisionEvent.id)
                ).all()
                began = next((at for st, at in events if st == "running"), r.at)
                done = next((at for st, at in events if st == "executed"), r.at)
                # Ledgers from before the column have the fault in the evidence only.
                fault = _utc(r.fault_at or fault_time(r.evidence) or r.at)
                out.append((r, fault, _utc(began), _utc(done)))
            return out

    def watch(self, w: Watch) -> None:
        with self.session.begin() as s:
            s.merge(
                RecoveryRow(
                    incident=w.incident,
                    job=w.job,
                    attempt=w.attempt,
                    cause=w.cause,
                    fault_at=w.fault_at,
                    requeued_at=w.requeued_at,
                    failed_step=w.point.step,
                    checkpoint_step=w.point.checkpoint_step,
                    work_lost_seconds=w.point.work_lost_seconds,
                    state="watching",
                )
            )

    def watching(self) -> list[Watch]:
        return [
            Watch(
                incident=r.incident,
                job=r.job,
                attempt=r.attempt,
                cause=r.cause,
                fault_at=_utc(r.fault_at),
                requeued_at=_utc(r.requeued_at),
                point=FailurePoint(r.failed_step, r.checkpoint_step, r.work_lost_seconds),
            )
            for r in self.recoveries("watching")
        ]

    def conclude(
        self,
        incident: str,
        verdict: Verdict,
        at: datetime,
        decisions: Sequence[Decision] = (),
    ) -> list[int]:
        """The verdict on a recovery and the decisions it leads to, in one transaction."""
        with self.session.begin() as s:
            row = s.get(RecoveryRow, incident)
            if row is None:
                raise KeyError(incident)
            row.state, row.reason, row.decided_at = verdict.state, verdict.reason, at
            row.restored_seconds = verdict.restored_seconds
            row.before_checkpoint = verdict.before_checkpoint
            return _insert_decisions(s, decisions, {"by": "verifier"})

    def recoveries(self, *states: str) -> list[RecoveryRow]:
        with self.session() as s:
            q = select(RecoveryRow).order_by(RecoveryRow.fault_at)
            if states:
                q = q.where(RecoveryRow.state.in_(states))
            return list(s.scalars(q).all())

    def history(self, since: datetime) -> Iterator[PastAction]:
        with self.session() as s:
            for rec in s.scalars(
                select(RecoveryRow).where(
                    RecoveryRow.state == "recovered", RecoveryRow.decided_at >= since
                )
            ):
                assert rec.decided_at is not None
                yield PastAction(at=_utc(rec.decided_at), action="recovered", job=rec.job)
            for r in s.scalars(
                select(DecisionRow).where(
                    DecisionRow.at >= since, DecisionRow.state != "superseded"
                )
            ):
                if r.guard == "recovery_failed" and r.action == "escalate":
                    first = r.evidence[0] if r.evidence else {}
                    if not first.get("charged"):
                        continue  # requeued again: that requeue counted itself
                    yield PastAction(
                        at=_utc(r.at),
                        action="recovery_failed",
                        job=r.job,
                        cause=r.cause,
                        before_checkpoint=bool(first.get("before_checkpoint")),
                    )
                elif r.guard is None:
                    nodes = tuple(r.nodes)
                    if r.action == "requeue" and r.cause in BLAMELESS:
                        # Where the failure nobody could be blamed for began: its next time there
                        # implicates that node.
                        nodes = first_node(r.evidence)
                    yield PastAction(
                        at=_utc(r.at),
                        action=r.action,
                        job=r.job,
                        nodes=nodes,
                        exclude=tuple(r.exclude),
                        cause=r.cause,
                        incident=r.incident,
                    )


def _move(s: Session, decision_id: int, allowed: frozenset[str], state: str) -> bool:
    """Set a decision's state if it is still in one of `allowed`; whether it was."""
    done = s.execute(
        update(DecisionRow)
        .where(DecisionRow.id == decision_id, DecisionRow.state.in_(sorted(allowed)))
        .values(state=state)
        .execution_options(synchronize_session=False)
    )
    return bool(cast(CursorResult[Any], done).rowcount)


def _what(d: Decision) -> tuple[object, ...]:
    return (d.action, tuple(sorted(d.nodes)), tuple(sorted(d.exclude)))


def _decision(r: DecisionRow) -> Decision:
    return Decision(
        at=_utc(r.at),
        incident=r.incident,
        job=r.job,
        action=r.action,
        cause=r.cause,
        reason=r.reason,
        nodes=tuple(r.nodes),
        exclude=tuple(r.exclude),
        evidence=tuple(r.evidence),
        guard=r.guard,
        mode=r.mode,
        state=r.state,
    )


def first_node(evidence: list[Any]) -> tuple[str, ...]:
    """The node of the evidence that started first, as a decision's records hold it."""
    named = []
    for e in evidence:
        with contextlib.suppress(KeyError, TypeError, ValueError, AttributeError):
            if e.get("node"):
                at = datetime.fromisoformat(str(e["startsAt"]).replace("Z", "+00:00"))
                named.append((at, str(e["node"])))
    return (min(named)[1],) if named else ()


def _insert_decisions(
    s: Session, decisions: Sequence[Decision], detail: dict[str, Any]
) -> list[int]:
    ids = []
    for d in decisions:
        j = d.to_json()
        row = DecisionRow(
            at=d.at,
            incident=d.incident,
            job=d.job,
            action=d.action,
            cause=d.cause,
            nodes=j["nodes"],
            exclude=j["exclude"],
            reason=d.reason,
            evidence=j["evidence"],
            fault_at=fault_time(j["evidence"]),
            guard=d.guard,
            mode=d.mode,
            state=d.state,
        )
        s.add(row)
        s.flush()
        s.add(DecisionEvent(decision_id=row.id, at=d.at, state=d.state, detail=detail))
        ids.append(row.id)
    return ids


def fault_time(evidence: list[Any]) -> datetime | None:
    """When the failure began: the earliest startsAt among a decision's evidence (None when
    its evidence names no alert, as the verifier's decisions)."""
    starts = []
    for e in evidence:
        with contextlib.suppress(KeyError, TypeError, ValueError):
            starts.append(datetime.fromisoformat(str(e["startsAt"]).replace("Z", "+00:00")))
    return min(starts, default=None)


def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
    # WAL: the webhook writes while the loop and the CLI read. synchronous=NORMAL keeps every
    # committed transaction through a process crash (kill -9), which is what the 2xx promises.
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.execute("PRAGMA busy_timeout=10000")
    cur.close()
