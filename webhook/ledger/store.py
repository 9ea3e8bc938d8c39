"""The ledger's operations: every query slurmedic makes (the schema's upgrades: migrate.py)."""

from __future__ import annotations

import contextlib
import copy
import fcntl
import json
import os
from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

from pydantic import ValidationError
from sqlalchemy import (
    ColumnElement,
    Engine,
    Text,
    create_engine,
    event,
    func,
    make_url,
    select,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import CursorResult
from sqlalchemy.exc import DataError, IntegrityError, OperationalError, SQLAlchemyError
from sqlalchemy.orm import Session, defer, sessionmaker

from webhook.core import drills
from webhook.core.alerts import Alert, Payload
from webhook.core.decisions import (
    BLAMELESS,
    DRAIN_CAUSES,
    GLOBAL_SWITCH,
    LEFT_RUNNING,
    SCHEDULER_ACTIONS,
    Decision,
    PastAction,
    held,
)
from webhook.core.drills import Request
from webhook.core.engine import Incident, Restored, evidence_key
from webhook.core.failures import Failure
from webhook.core.incidents import VERIFY, BadIncidentKey, IncidentKey
from webhook.core.lifecycle import (
    AWAITING_APPROVAL,
    CARRIED_OUT,
    EXECUTED,
    FAILED,
    NOTE,
    OPEN,
    PREVIOUS,
    REFUSED,
    RUNNING,
    SUPERSEDED,
    WAITING,
    IllegalTransition,
    check,
)
from webhook.core.recovery import FailurePoint, Verdict, Watch
from webhook.core.repairs import Move, Repair
from webhook.core.shared_cause import Judgement
from webhook.core.validation import describe
from webhook.ledger import migrate
from webhook.ledger.drills import Drills
from webhook.ledger.figures import (
    REPAIRS_WINDOW,
    DecisionCount,
    Figures,
    Mismatches,
    Outcomes,
    Recovery,
    Timing,
    VerdictCount,
)
from webhook.ledger.leases import Leases, LostLease, Term, check_term, current
from webhook.ledger.repairs import Repairs
from webhook.ledger.schema import (
    AlertRow,
    BacktestRow,
    DecisionEvent,
    DecisionRow,
    FailureRow,
    IncidentRow,
    Notification,
    RecoveryRow,
    SettingRow,
    VerdictRow,
    utc,
)
from webhook.ledger.settings import CorruptSetting, S, Setting


def _alert_of(text: str) -> Alert:
    """A stored alert. Pydantic's JSON parser is the fast way, but it refuses some text the
    webhook took (it parsed with json.loads): nesting deeper than 200 in an extra field, a lone
    surrogate escape in an annotation. Those are read as the webhook read them."""
    try:
        return Alert.model_validate_json(text)
    except ValidationError:
        return Alert.model_validate(json.loads(text))


class Unavailable(RuntimeError):
    """The ledger cannot be reached or written; the message is the database's first line."""


class LoopRefused(RuntimeError):
    """A second loop on a SQLite ledger: one file takes one (replicas need PostgreSQL)."""


class Refused(ValueError):
    """The database refused a value (the sender's fault); the message says which."""


@dataclass(frozen=True)
class Stored:
    notification: int
    new: int
    duplicates: int


# libpq's defaults wait on a server cut off by the network for as long as TCP retransmits
# (about 15 minutes): a leader would sit in a renewal it cannot make, webhooks in a write.
# These bound it to seconds (a URL's own query parameters win).
POSTGRES_TIMEOUTS = {
    "connect_timeout": 5,
    "keepalives": 1,
    "keepalives_idle": 10,
    "keepalives_interval": 3,
    "keepalives_count": 3,
    "tcp_user_timeout": 15000,  # ms: unacknowledged data fails the connection
}
# Job ids per `IN (...)`: SQLite before 3.32 takes at most 999 bound parameters a statement.
IN_CHUNK = 500


def _connect_args(url: str) -> dict[str, Any]:
    parsed = make_url(url)
    if parsed.get_backend_name() != "postgresql":
        return {}
    return {k: v for k, v in POSTGRES_TIMEOUTS.items() if k not in parsed.query}


class Ledger:
    """`create`: a new SQLite ledger is made when its file does not exist (the service); without
    it (every command that reads or amends one) a missing file is Unavailable, naming it. No
    directory is ever made: a mistyped path is an error, not a new tree."""

    def __init__(self, url: str, *, create: bool = True) -> None:
        self.url = url
        self.engine: Engine = _engine(url)
        # The two statements of `store`, built once: every payload runs them (building them
        # cost more than running them on SQLite). The alerts' is one batch; RETURNING yields
        # only the rows inserted (rowcount of a batch is not portable across drivers).
        insert = (postgresql if self.engine.dialect.name == "postgresql" else sqlite).insert
        self._store_stmts = (
            insert(Notification).returning(Notification.id),
            insert(AlertRow).on_conflict_do_nothing().returning(AlertRow.id),
        )
        if self.engine.dialect.name == "sqlite":
            event.listen(self.engine, "connect", _sqlite_pragmas)
            if (path := _sqlite_file(self.engine)) is not None:
                if not create and not path.exists():
                    raise Unavailable(
                        f"database_url: no ledger at {path} (is this the service's config?)"
                    )
                if not path.exists():
                    # It holds every payload: readable by its owner only (SQLite gives its
                    # -wal and -shm files the same mode). An empty file is an empty database.
                    with contextlib.suppress(FileExistsError):
                        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
        # The schema is the migrations' (webhook/ledger/migrations), never create_all's: a
        # ledger of any earlier release is upgraded here, once.
        try:
            migrate.upgrade(self.engine)
        except OperationalError as e:
            raise Unavailable(f"database_url: {str(e.orig or e).splitlines()[0]}") from e
        self.session = sessionmaker(self.engine, expire_on_commit=False)
        self.leases = Leases(self.engine)
        self.drills = Drills(self.session)
        self.repairs = Repairs(self.session)
        # The leader's term (a loop's ledger, `fenced`): while set, every decision recorded,
        # every move of one and every recovery judged succeed only as long as the term is the
        # lease's current one (LostLease). None: a human's command, the webhook.
        self.term: Term | None = None

    def release(self) -> None:
        """Close every pooled connection (the next use opens a new one): a process about to
        fork holds none for its children to inherit."""
        self.engine.dispose()

    def _in_term(self, s: Session) -> None:
        """LostLease unless this ledger's term (if it has one) is current, for `s`'s
        transaction (webhook/ledger/leases.py, check_term)."""
        if self.term is not None:
            check_term(s.connection(), self.term)

    def plan_drill(self, request: Request, decided: Decision | None, reason: str) -> list[int]:
        """A drill request planned (webhook/ledger/drills.py): its decision recorded in this
        ledger's term, or refused with `reason`."""

        def record(s: Session, decisions: Sequence[Decision]) -> list[int]:
            self._in_term(s)
            return _insert_decisions(s, decisions, {"by": "drill"})

        try:
            return self.drills.settle(request, decided, reason, record)
        except IntegrityError:
            # One drill an attempt (the decisions' unique index): the job must run again first.
            assert decided is not None
            again = f"attempt {decided.incident} was drilled already"
            return self.drills.settle(request, None, again, record)

    def save_repair(self, repair: Repair, move: Move | None, at: datetime) -> list[int]:
        """A repair begun or moved (webhook/ledger/repairs.py), its move's decision recorded in
        this ledger's term."""

        def record(s: Session, decisions: Sequence[Decision]) -> list[int]:
            self._in_term(s)
            return _insert_decisions(s, decisions, {"by": "repair"})

        return self.repairs.save(repair, move, at, record)

    def fenced(self, term: Term) -> Ledger:
        """This ledger (the same engine and sessions) writing only in `term`: what one term's
        loop, executor and verifier write through, so that nothing a term started can write
        once it has ended, even in a process that leads again in a later term."""
        view = copy.copy(self)
        view.term = term
        return view

    def lock_for_loop(self) -> None:
        """On a SQLite file, hold it for this process's loop (LoopRefused while another holds
        it); on PostgreSQL nothing: replicas share it, and the lease says who leads."""
        database = self.engine.url.database
        if self.engine.dialect.name != "sqlite" or database in (None, "", ":memory:"):
            return
        path = Path(str(database))
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            # flock, not SQLite's own (fcntl) locks: the two never meet on Linux.
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise LoopRefused(
                f"another slurmedic loop runs on {path}: a SQLite ledger takes one "
                "(several replicas need PostgreSQL: docs/operations.md, replicas)"
            ) from None
        self._loop_lock = fd

    def unlock_loop(self) -> None:
        if (fd := getattr(self, "_loop_lock", None)) is not None:
            os.close(fd)
            del self._loop_lock

    # ---- notifications ---------------------------------------------------------------------
    def store(
        self, raw: dict[str, Any], payload: Payload, received_at: datetime, remote: str = ""
    ) -> Stored:
        """Persist one notification and its alert events in one transaction (before the 2xx).

        Two statements whatever the payload's size: the notification, then every alert event
        in one batch that skips the events already stored (re-deliveries). Refused: the
        database would not take a value of the payload; Unavailable: it could not be written.
        """
        try:
            return self._store(raw, payload, received_at, remote)
        except DataError as e:
            raise Refused(str(e.orig).splitlines()[0][:200]) from e
        except SQLAlchemyError as e:
            raise Unavailable(str(e).splitlines()[0]) from e

    def _store(
        self, raw: dict[str, Any], payload: Payload, received_at: datetime, remote: str
    ) -> Stored:
        note_stmt, alerts_stmt = self._store_stmts
        with self.engine.begin() as conn:
            note_id = conn.execute(
                note_stmt,
                {
                    "received_at": received_at,
                    "remote": remote[:64],
                    "group_key": payload.groupKey,
                    "payload": raw,
                },
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
            new = len(conn.execute(alerts_stmt, rows).all())
        return Stored(note_id, new, len(payload.alerts) - new)

    def alerts_after(
        self, last_id: int, limit: int = 5000, *, skip: frozenset[int] = frozenset()
    ) -> list[tuple[int, datetime, Alert]]:
        """Alert events with ids above `last_id`, in id order, but those in `skip` (a reader's
        trailing window: on PostgreSQL, concurrent writers commit ids out of order, so a row
        can appear below ids already read)."""
        # The loop reads every alert once, so this is its hot path: plain rows, not ORM
        # objects, and the alert's stored JSON text validated as it is (pydantic parses it;
        # json.loads and then validating a dict took twice the time).
        with self.engine.connect() as conn:
            rows = conn.execute(
                select(AlertRow.id, AlertRow.received_at, AlertRow.alert.cast(Text))
                .where(AlertRow.id > last_id, AlertRow.id.not_in(sorted(skip)))
                .order_by(AlertRow.id)
                .limit(limit)
            ).all()
        return [(i, utc(at), _alert_of(text)) for i, at, text in rows]

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
        failures: Sequence[Failure] = (),
    ) -> list[int]:
        """Decisions, their first state, the incidents they decide and the failures the engine
        remembered (take_failures), in one transaction.

        A revision (`Decision.revision` > 0) supersedes its incident's decisions that were not
        carried out yet; where a drain, requeue or stop was (it ran, or runs), the revision's
        same decision is not recorded again: the action happened, and later evidence does not
        undo it.

        A second decision of the same incident, action and revision is refused (LostLease: a
        replica that still thought it led decided what the leader had)."""
        try:
            return self._record(decisions, incidents, detail, failures)
        except IntegrityError as e:
            raise LostLease(f"already decided by another replica: {str(e.orig)[:200]}") from e

    def _record(
        self,
        decisions: list[Decision],
        incidents: Sequence[Incident],
        detail: dict[str, Any] | None,
        failures: Sequence[Failure] = (),
    ) -> list[int]:
        with self.session.begin() as s:
            self._in_term(s)
            s.add_all(
                FailureRow(
                    at=f.at,
                    node=f.node,
                    kind=f.kind,
                    incident=f.incident,
                    job=f.job,
                    gpu=f.gpu,
                )
                for f in failures
            )
            revised = {d.incident for d in decisions if d.revision}
            done: set[tuple[object, ...]] = set()
            for k in revised:
                done |= self._supersede(s, k, decisions, detail)
            decisions = [d for d in decisions if _what(d) not in done]
            for inc in incidents:
                before = s.get(IncidentRow, inc.key)
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
                        evidence=_evidence_union(
                            before.evidence if before is not None else [],
                            [e.record() for e in inc.evidence],
                        ),
                        shared=_judgement_json(inc.shared) or None,
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
                DecisionRow.incident == incident, DecisionRow.state != SUPERSEDED
            )
        ).all()
        done: set[tuple[object, ...]] = set()
        for row in rows:
            if row.state in OPEN and _move(s, row.id, OPEN, SUPERSEDED):
                s.add(
                    DecisionEvent(
                        decision_id=row.id,
                        at=new[0].at,
                        state=SUPERSEDED,
                        detail={**(detail or {"by": "engine"}), "superseded_by": why},
                    )
                )
                continue
            s.refresh(row)
            if row.action in SCHEDULER_ACTIONS and row.state in CARRIED_OUT:
                done.add((row.action, tuple(row.nodes), tuple(row.exclude)))
        return done

    def carried_out(self, incidents: Sequence[str]) -> dict[str, set[str]]:
        """Those of the incidents some of whose scheduler actions ran or run, and which actions
        (the engine says whether they close the incident: `closes`)."""
        if not incidents:
            return {}
        found: dict[str, set[str]] = {}
        with self.session() as s:
            for incident, action in s.execute(
                select(DecisionRow.incident, DecisionRow.action).where(
                    DecisionRow.incident.in_(list(incidents)),
                    DecisionRow.action.in_(SCHEDULER_ACTIONS),
                    DecisionRow.state.in_(CARRIED_OUT),
                )
            ).all():
                found.setdefault(incident, set()).add(action)
        return found

    def add_event(self, decision_id: int, state: str, detail: dict[str, Any], at: datetime) -> None:
        """Append a state change (the decision row keeps the latest state, for queries).

        The move must be one the lifecycle allows (IllegalTransition otherwise); the row is
        locked for it, so two writers cannot both move a decision out of the same state.
        With a term (the leader's loop), every move is made only in that term, in the same
        statement: a loop whose term has ended moves nothing (LostLease)."""
        fence = self.term
        with self.session.begin() as s:
            row = s.get(DecisionRow, decision_id)
            if row is None:
                raise KeyError(decision_id)
            check(row.state, state)
            # The move is made only from a state that allows it, in one statement: another
            # writer (the loop superseding, a human approving) may have moved it since it was
            # read, also on SQLite, where reads do not lock.
            if not _move(s, decision_id, PREVIOUS[state], state, fence):
                s.rollback()
                if fence is not None and not self.leases.is_current(fence):
                    raise LostLease(f"decision {decision_id} not claimed: the term has ended")
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

    def record_mismatch(self, decision_id: int, what: str, at: datetime) -> None:
        """What Slurm showed after a run that does not match the decision (webhook/core/
        outcome.py): kept on the row (an escalation until someone records a verdict) and as a
        note. Not fenced: a leader whose term ended records what its stale act did."""
        with self.session.begin() as s:
            row = s.get(DecisionRow, decision_id)
            if row is None:
                raise KeyError(decision_id)
            row.mismatch = what[:500]
            s.add(
                DecisionEvent(
                    decision_id=decision_id, at=at, state=NOTE,
                    detail={"by": "executor", "mismatch": what},
                )
            )  # fmt: skip

    # ---- settings (webhook/ledger/settings.py) ---------------------------------------------
    def setting(self, kind: type[S]) -> S:
        """The setting `kind` as last written, or its defaults when never written.
        CorruptSetting, naming the key, when the stored value is not one."""
        try:
            with self.session() as s:
                row = s.get(SettingRow, kind.key)
                value = None if row is None else row.value
        except ValueError:  # the JSON column does not hold JSON
            raise CorruptSetting(f"ledger setting {kind.key!r}: not JSON; {kind.repair}") from None
        if value is None:
            return kind()
        try:
            return kind.model_validate(value)
        except ValidationError as e:
            raise CorruptSetting(
                f"ledger setting {kind.key!r}: {describe(e)} (stored: {str(value)[:120]}); "
                f"{kind.repair}"
            ) from None

    def put(self, value: Setting, at: datetime) -> None:
        """Write a setting (its model checked it when it was made)."""
        with self.session.begin() as s:
            s.merge(SettingRow(key=value.key, value=value.model_dump(mode="json"), updated_at=at))

    def save_backtest(
        self,
        report: dict[str, Any],
        *,
        at: datetime,
        by: str,
        span: tuple[datetime, datetime],
        policy: str,
    ) -> int:
        """Keep a backtest's report (its JSON form); its id."""
        with self.session.begin() as s:
            row = BacktestRow(
                at=at,
                by=by[:64],
                span_from=span[0],
                span_to=span[1],
                policy=policy,
                report=report,
            )
            s.add(row)
            s.flush()
            return row.id

    def backtests(self, limit: int = 50) -> list[BacktestRow]:
        """The latest backtests kept, newest first."""
        with self.session() as s:
            rows = s.scalars(select(BacktestRow).order_by(BacktestRow.id.desc()).limit(limit))
            return list(rows.all())

    def backtest(self, backtest_id: int) -> BacktestRow | None:
        with self.session() as s:
            return s.get(BacktestRow, backtest_id)

    def rows(self, ids: Sequence[int]) -> list[DecisionRow]:
        with self.session() as s:
            return list(s.scalars(select(DecisionRow).where(DecisionRow.id.in_(ids))).all())

    def incident_decisions(self, incident: str) -> list[DecisionRow]:
        with self.session() as s:
            rows = s.scalars(
                select(DecisionRow).where(DecisionRow.incident == incident).order_by(DecisionRow.id)
            ).all()
            return list(rows)

    def watched(
        self, ids: Sequence[int] | None = None
    ) -> dict[int, tuple[tuple[str, str, datetime], str]]:
        """Decisions as the guards know them, and their state now: id -> ((incident, action,
        time), state). Of `ids`, whatever their state; without, every decision not carried out
        yet nor refused (waiting for approval, to run, or running). The loop reads them every
        step: no evidence."""
        where = [DecisionRow.state.in_(sorted(WAITING)) if ids is None else DecisionRow.id.in_(ids)]
        with self.session() as s:
            rows = s.execute(
                select(
                    DecisionRow.id,
                    DecisionRow.incident,
                    DecisionRow.action,
                    DecisionRow.at,
                    DecisionRow.state,
                ).where(*where)
            ).all()
        return {i: ((incident, action, utc(at)), state) for i, incident, action, at, state in rows}

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

    def restore_incidents(self, since: datetime) -> list[Restored]:
        """The engine's incidents as the ledger holds them, for a restart (Snapshot): decided
        when, from which evidence, with which decisions in force, and which of their actions
        were carried out. Incidents decided before `since` come back as keys and times alone
        (no evidence, no decisions: a restart reads what the retention keeps, not the whole
        history): a node's next failure must still get the next key, and the engine forgets
        them by its own rules. But for those watching a job they left running (guard
        job_running): whole, whatever their age."""
        out = []
        with self.session() as s:
            # Whatever their age, those whose decisions left a job running on purpose (guard
            # job_running: degraded hardware, an application's symptom): the job's failure,
            # days later, is still news for them.
            watching = select(DecisionRow.incident).where(
                DecisionRow.action == "none",
                DecisionRow.guard == LEFT_RUNNING,
                DecisionRow.state != SUPERSEDED,
            )
            recent = (IncidentRow.decided_at >= since) | IncidentRow.key.in_(watching)
            rows = {r.key: r for r in s.scalars(select(IncidentRow).where(recent)).all()}
            older = s.execute(
                select(IncidentRow.key, IncidentRow.opened_at, IncidentRow.decided_at).where(
                    ~recent
                )
            ).all()
            standing: dict[str, list[DecisionRow]] = {}
            for d in s.scalars(
                select(DecisionRow)
                .where(
                    DecisionRow.state != SUPERSEDED,
                    DecisionRow.incident.in_(select(IncidentRow.key).where(recent))
                    | (DecisionRow.at >= since),
                )
                .order_by(DecisionRow.id)
            ).all():
                standing.setdefault(d.incident, []).append(d)
            # The revision each incident reached (superseded ones count): a revision after the
            # restart takes the next number, not one the ledger holds already.
            revisions = dict(
                s.execute(
                    select(DecisionRow.incident, func.max(DecisionRow.revision))
                    .where(DecisionRow.incident.in_(list(rows.keys() | standing.keys())))
                    .group_by(DecisionRow.incident)
                ).all()
            )
        for key, opened, decided in older:
            if key in standing:
                continue  # decided again since (a ledger without the incident's new time)
            with contextlib.suppress(BadIncidentKey):
                parsed = IncidentKey.parse(key)
                out.append(
                    Restored(
                        key=str(parsed),
                        opened_at=utc(opened),
                        decided_at=utc(decided),
                        current=False,
                    )
                )
        for key in sorted(rows.keys() | standing.keys()):
            try:
                parsed = IncidentKey.parse(key)
            except BadIncidentKey:
                continue
            row, ds = rows.get(key), standing.get(key, [])
            decided_at = utc(row.decided_at) if row else max(utc(d.at) for d in ds)
            opened_at = utc(row.opened_at) if row else decided_at
            known = set()
            for e in row.evidence if row else []:
                with contextlib.suppress(KeyError, TypeError, ValueError):
                    at = datetime.fromisoformat(str(e["startsAt"]).replace("Z", "+00:00"))
                    known.add(evidence_key(str(e["fingerprint"]), at))
            # Carried out, or counted so (monitor and enforce ones): whether that closes the
            # incident is the engine's to say (Engine.restore).
            carried = frozenset(
                d.action
                for d in ds
                if d.action in SCHEDULER_ACTIONS and (d.state in CARRIED_OUT or d.mode != "approve")
            )
            # Only the engine's own incidents are revised, and only recent ones.
            ours = parsed.kind in ("attempt", "node")
            standing_now = [_decision(d) for d in ds]
            out.append(
                Restored(
                    # Keys of older ledgers (`node:gpu02#2`) as the engine spells them now.
                    key=str(parsed),
                    opened_at=opened_at,
                    decided_at=decided_at,
                    standing=tuple(standing_now),
                    revision=int(revisions.get(key) or 0),
                    known=frozenset(known),
                    current=ours
                    and (
                        decided_at >= since
                        or any(d.action == "none" and d.guard == LEFT_RUNNING for d in ds)
                    ),
                    carried=carried,
                    shared=_judgement(row.shared) if row else {},
                )
            )
        return sorted(out, key=lambda inc: inc.key)

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
                    DecisionRow.state == EXECUTED,
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
                began = next((at for st, at in events if st == RUNNING), r.at)
                done = next((at for st, at in events if st == EXECUTED), r.at)
                # Ledgers from before the column have the fault in the evidence only.
                fault = utc(r.fault_at or fault_time(r.evidence) or r.at)
                out.append((r, fault, utc(began), utc(done)))
            return out

    def watch(self, w: Watch) -> None:
        with self.session.begin() as s:
            self._in_term(s)
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
                    quality_before=w.point.quality,
                    drill=w.drill,
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
                fault_at=utc(r.fault_at),
                requeued_at=utc(r.requeued_at),
                point=FailurePoint(
                    r.failed_step, r.checkpoint_step, r.work_lost_seconds, r.quality_before
                ),
                drill=r.drill,
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
        """The verdict on a recovery and the decisions it leads to, in one transaction: in the
        leader's current term, on a recovery still watched (one another replica judged first
        stays as it judged it: LostLease)."""
        with self.session.begin() as s:
            self._in_term(s)
            row = s.get(RecoveryRow, incident)
            if row is None:
                raise KeyError(incident)
            if row.state != "watching":
                raise LostLease(f"the recovery of {incident} was judged already ({row.state})")
            row.state, row.reason, row.decided_at = verdict.state, verdict.reason, at
            row.restored_seconds = verdict.restored_seconds
            row.before_checkpoint = verdict.before_checkpoint
            if (r := verdict.resume) is not None:
                row.resume_step, row.lost_steps, row.lost_seconds = (
                    r.step,
                    r.lost_steps,
                    r.lost_seconds,
                )
                row.start_seconds, row.quality_after = r.start_seconds, r.quality_after
            return _insert_decisions(s, decisions, {"by": "verifier"})

    def recoveries(self, *states: str) -> list[RecoveryRow]:
        with self.session() as s:
            q = select(RecoveryRow).order_by(RecoveryRow.fault_at)
            if states:
                q = q.where(RecoveryRow.state.in_(states))
            return list(s.scalars(q).all())

    # ---- /metrics ----------------------------------------------------------------------------
    def figures(self) -> Figures:
        """Everything /metrics reports of the ledger but its settings, read in one session."""
        d, e = DecisionRow, DecisionEvent
        with self.session() as s:
            counts = [
                DecisionCount(action, cause, mode, state, n)
                for action, cause, mode, state, n in s.execute(
                    select(d.action, d.cause, d.mode, d.state, func.count()).group_by(
                        d.action, d.cause, d.mode, d.state
                    )
                ).all()
            ]
            outcomes = [
                Outcomes(action, state, n)
                for action, state, n in s.execute(
                    select(d.action, e.state, func.count())
                    .join(d, d.id == e.decision_id)
                    .where(e.state.in_((EXECUTED, FAILED)))
                    .group_by(d.action, e.state)
                ).all()
            ]
            executed_at = dict(
                s.execute(
                    select(e.decision_id, func.min(e.at))
                    .where(e.state == EXECUTED)
                    .group_by(e.decision_id)
                ).all()
            )
            # The engine's decisions (the verifier's have no fault of their own), with the
            # fault time kept on the row: no evidence JSON is read per scrape.
            timings = [
                Timing(
                    action,
                    utc(fault),
                    utc(at),
                    utc(done) if (done := executed_at.get(i)) else None,
                )
                for i, action, at, fault in s.execute(
                    select(d.id, d.action, d.at, d.fault_at)
                    .where(d.fault_at.is_not(None))
                    .where(d.incident.not_like(f"{VERIFY}%"))
                ).all()
                if fault is not None
            ]
            recoveries = [
                Recovery(state, restored, lost)
                for state, restored, lost in s.execute(
                    select(
                        RecoveryRow.state,
                        RecoveryRow.restored_seconds,
                        RecoveryRow.work_lost_seconds,
                    ).where(RecoveryRow.drill.is_(False))
                ).all()
            ]
            waiting = [
                utc(at) for at in s.scalars(select(d.at).where(d.state == AWAITING_APPROVAL))
            ]
            latest = select(func.max(VerdictRow.id)).group_by(VerdictRow.decision_id)
            verdicts = [
                VerdictCount(action, verdict, n)
                for action, verdict, n in s.execute(
                    select(d.action, VerdictRow.verdict, func.count())
                    .join(d, d.id == VerdictRow.decision_id)
                    .where(VerdictRow.id.in_(latest))
                    .group_by(d.action, VerdictRow.verdict)
                ).all()
            ]
            escalations = (
                s.scalar(
                    select(func.count())
                    .select_from(d)
                    .where(d.action == "escalate", d.state != SUPERSEDED)
                    .where(d.id.not_in(select(VerdictRow.decision_id)))
                )
                or 0
            )
            mismatches = [
                Mismatches(action, n)
                for action, n in s.execute(
                    select(d.action, func.count()).where(d.mismatch.is_not(None)).group_by(d.action)
                ).all()
            ]
            drills = Drills.outcomes(s)
            repairs = Repairs.figures(s, datetime.now(UTC) - REPAIRS_WINDOW)
        return Figures(
            counts,
            outcomes,
            timings,
            recoveries,
            waiting,
            verdicts,
            escalations,
            mismatches,
            drills,
            repairs,
        )

    def record_begins(self) -> datetime | None:
        """When this ledger's record begins: its first notification (None while it has none)."""
        with self.session() as s:
            first = s.scalar(select(func.min(Notification.received_at)))
        return utc(first) if first is not None else None

    def history(self, since: datetime) -> Iterator[PastAction]:
        """The guards' memory: what was decided since `since`."""
        with self.session() as s:
            for rec in s.scalars(
                select(RecoveryRow).where(
                    RecoveryRow.state == "recovered",
                    RecoveryRow.decided_at >= since,
                    RecoveryRow.drill.is_(False),
                )
            ):
                assert rec.decided_at is not None
                yield PastAction(at=utc(rec.decided_at), action="recovered", job=rec.job)
            yield from self._past(s, DecisionRow.at >= since)

    def drain_history(self, since: datetime, before: datetime) -> list[PastAction]:
        """The drains decided from `since` to `before`: older than the guards' windows, within
        `repeats.window` (a node that fails again is a repeat: Snapshot.drains)."""
        with self.session() as s:
            return list(
                self._past(
                    s,
                    DecisionRow.at >= since,
                    DecisionRow.at < before,
                    DecisionRow.action == "drain",
                    where_failed=False,
                )
            )

    def failures(self, since: datetime, node: str | None = None) -> list[Failure]:
        """The failures remembered since `since` (of one node), oldest first."""
        with self.session() as s:
            query = select(FailureRow).where(FailureRow.at >= since)
            if node is not None:
                query = query.where(FailureRow.node == node)
            return [
                Failure(
                    at=utc(r.at),
                    node=r.node,
                    kind=r.kind,
                    incident=r.incident,
                    job=r.job,
                    gpu=r.gpu,
                )
                for r in s.scalars(query.order_by(FailureRow.at, FailureRow.id))
            ]

    def own_faults(self, since: datetime) -> int:
        """The nodes' own faults slurmedic drained since `since`: one a node and incident (a
        failure seen by two jobs' incidents is two only if both drained it), rejected and
        expired drains aside: the cluster's record of failures (failures.learned_rate)."""
        return sum(
            1
            for f in self.node_failures(since)
            if not f.app_xid and f.kind in DRAIN_CAUSES - {"straggler"}
        )

    def node_failures(self, since: datetime) -> list[Failure]:
        """Every node's failures since `since`: its drains for its own faults (decided, not
        superseded, and not rejected or expired: monitor's records count, as they show what
        enforce does) and the application XIDs on its GPUs (`slurmedic nodes`)."""
        found = []
        with self.session() as s:
            for r in s.scalars(
                select(DecisionRow)
                .where(
                    DecisionRow.at >= since,
                    DecisionRow.action == "drain",
                    DecisionRow.guard.is_(None),
                    DecisionRow.state.not_in([SUPERSEDED, *REFUSED]),
                )
                .options(defer(DecisionRow.evidence))
            ):
                found += [
                    Failure(
                        at=utc(r.at),
                        node=n,
                        kind=r.cause,
                        incident=r.incident,
                        job=r.job,
                        ran=r.state == EXECUTED,
                    )
                    for n in r.nodes
                ]
        return found + self.failures(since)

    def exclusion_history(
        self, before: datetime, jobs: Collection[int] | None = None
    ) -> Iterator[PastAction]:
        """The requeues that excluded or readmitted nodes (of `jobs`, those Slurm knows; None:
        every job's), and the drains of the nodes they excluded, decided before `before`: what
        Slurm may still keep in a job's ExcNodeList (GuardState.exclusions_in_force keeps the
        same)."""
        with self.session() as s:
            older = (DecisionRow.at < before, DecisionRow.action == "requeue")
            if jobs is None:
                chunks = [self._past(s, *older, where_failed=False)]
            else:
                ids = sorted(jobs)
                chunks = [
                    self._past(
                        s, *older, DecisionRow.job.in_(ids[i : i + IN_CHUNK]), where_failed=False
                    )
                    for i in range(0, len(ids), IN_CHUNK)
                ]
            requeues = [h for chunk in chunks for h in chunk if h.exclude or h.readmit]
            excluded = {n for h in requeues for n in h.exclude}
            drains = (
                [
                    h
                    for h in self._past(s, DecisionRow.at < before, DecisionRow.action == "drain")
                    if not excluded.isdisjoint(h.nodes)
                ]
                if excluded
                else []
            )
        # In time order; a drain before the requeue its incident decided with it.
        yield from sorted([*requeues, *drains], key=lambda h: (h.at, h.action != "drain"))

    @staticmethod
    def _past(
        s: Session, *where: ColumnElement[bool], where_failed: bool = True
    ) -> Iterator[PastAction]:
        """The decisions that count as done (not superseded, no guard said no), as the guards
        remember them; rejected and expired ones marked `undone`. Streamed, each row's evidence
        read only where it is needed: a year of a large cluster's decisions does not fit in
        memory at once. Without `where_failed`, a requeue nobody was blamed for does not say
        where its failure began (its evidence is not read: what excludes nodes needs only its
        exclusions)."""
        rows = s.scalars(
            select(DecisionRow)
            .where(*where, DecisionRow.state != SUPERSEDED)
            .order_by(DecisionRow.at, DecisionRow.id)
            .options(defer(DecisionRow.evidence))
            .execution_options(yield_per=1000)
        )
        for r in rows:
            if r.cause == drills.CAUSE:
                continue  # an operator's drill: never charged to the job, nor to the cluster
            if r.guard == "recovery_failed" and r.action == "escalate":
                first = r.evidence[0] if r.evidence else {}
                if not first.get("charged"):
                    continue  # requeued again: that requeue counted itself
                yield PastAction(
                    at=utc(r.at),
                    action="recovery_failed",
                    job=r.job,
                    cause=r.cause,
                    before_checkpoint=bool(first.get("before_checkpoint")),
                    incident=r.incident,
                )
            elif r.guard in (None, GLOBAL_SWITCH):  # as the guards counted them
                nodes = tuple(r.nodes)
                if r.action == "requeue" and r.cause in REQUEUED_ONCE and where_failed:
                    # Where the failure nobody could be blamed for, or one rank's crash, was:
                    # its next time there implicates that node (requeue_once). Before 0010:
                    # the node its evidence began on.
                    nodes = tuple(r.failed_on) if r.failed_on else first_node(r.evidence)
                yield PastAction(
                    at=utc(r.at),
                    action=r.action,
                    job=r.job,
                    nodes=nodes,
                    exclude=tuple(r.exclude),
                    cause=r.cause,
                    incident=r.incident,
                    readmit=tuple(r.readmit or ()),
                    undone=r.state in REFUSED,
                    held=held(r.state),
                )


# The requeues whose failure's first node requeue_once reads back.
REQUEUED_ONCE = frozenset({*BLAMELESS, "application"})


def _move(
    s: Session, decision_id: int, allowed: frozenset[str], state: str, fence: Term | None = None
) -> bool:
    """Set a decision's state if it is still in one of `allowed` (and, with a fence, while
    that term is current); whether it was."""
    where = [DecisionRow.id == decision_id, DecisionRow.state.in_(sorted(allowed))]
    if fence is not None:
        where.append(current(s.connection(), fence))
    done = s.execute(
        update(DecisionRow)
        .where(*where)
        .values(state=state)
        .execution_options(synchronize_session=False)
    )
    return bool(cast(CursorResult[Any], done).rowcount)


def _judgement_json(judged: Judgement) -> dict[str, Any]:
    return {
        node: [start.astimezone(UTC).isoformat(), why, list(away)]
        for node, (start, why, away) in judged.items()
    }


def _judgement(raw: Any) -> Judgement:
    """A kept judgement as written by _judgement_json; what cannot be read is left out."""
    out: Judgement = {}
    for node, entry in (raw or {}).items() if isinstance(raw, dict) else ():
        with contextlib.suppress(TypeError, ValueError):
            start, why, away = entry
            out[str(node)] = (utc(datetime.fromisoformat(start)), str(why), tuple(map(str, away)))
    return out


def _what(d: Decision) -> tuple[object, ...]:
    return (d.action, tuple(sorted(d.nodes)), tuple(sorted(d.exclude)))


def _decision(r: DecisionRow) -> Decision:
    return Decision(
        at=utc(r.at),
        incident=r.incident,
        job=r.job,
        action=r.action,
        cause=r.cause,
        reason=r.reason,
        nodes=tuple(r.nodes),
        exclude=tuple(r.exclude),
        readmit=tuple(r.readmit or ()),
        evidence=tuple(r.evidence),
        guard=r.guard,
        mode=r.mode,
        state=r.state,
        partition=r.partition,
        gpus=r.gpus or 0,
        gpu_hours=r.gpu_hours,
        revision=r.revision or 0,
        note=r.note or "",
        failed_on=tuple(r.failed_on or ()),
    )


def last_dry_run(events: Sequence[DecisionEvent]) -> list[str] | None:
    """The commands of a decision's latest dry run (None: none recorded yet)."""
    for e in reversed(events):
        if isinstance(run := e.detail.get("dry_run"), dict):
            return [str(c) for c in run.get("commands", [])]
    return None


def _evidence_union(kept: list[Any], now: list[dict[str, Any]]) -> list[Any]:
    """An incident's evidence as kept, and what the engine holds now: a restart that could not
    give an alert back (its node left the cluster) must not drop it from the record."""
    seen = {(e.get("fingerprint"), e.get("startsAt")) for e in now}
    old = [
        e
        for e in kept
        if isinstance(e, dict) and (e.get("fingerprint"), e.get("startsAt")) not in seen
    ]
    return old + now


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
            readmit=sorted(d.readmit),
            reason=d.reason,
            evidence=j["evidence"],
            fault_at=fault_time(j["evidence"]),
            guard=d.guard,
            mode=d.mode,
            state=d.state,
            partition=d.partition,
            gpus=d.gpus,
            gpu_hours=d.gpu_hours,
            revision=d.revision,
            note=d.note or None,
            failed_on=sorted(d.failed_on) or None,
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


def _engine(url: str) -> Engine:
    """The engine of `url`; Unavailable, naming database_url, when it cannot be made."""
    try:
        # A ping before each checkout finds a PostgreSQL connection the server dropped; a
        # SQLite connection is a file handle, which nothing drops (the ping cost every
        # payload 2 % of the webhook's CPU in a profile of bench.peer_eda).
        return create_engine(
            url,
            pool_pre_ping=make_url(url).get_backend_name() != "sqlite",
            connect_args=_connect_args(url),
        )
    except ModuleNotFoundError as e:
        # The driver is an extra: `pip install 'slurmedic[postgres]'`, or from a wheel
        # `pip install 'slurmedic-VERSION-py3-none-any.whl[postgres]'`.
        raise Unavailable(
            f"database_url: {make_url(url).get_backend_name()} needs the driver "
            f"{e.name or 'its driver'}, which is not installed: install slurmedic with its "
            "postgres extra (pip install 'slurmedic[postgres]', or 'FILE.whl[postgres]')"
        ) from e
    except (SQLAlchemyError, ValueError) as e:
        raise Unavailable(f"database_url: {str(e).splitlines()[0]}") from e


def _sqlite_file(engine: Engine) -> Path | None:
    """A SQLite ledger's file (None: not SQLite, or in memory); Unavailable when its directory
    does not exist (no directory is ever made: a mistyped path is an error, not a new tree)."""
    if engine.dialect.name != "sqlite" or engine.url.database in (None, "", ":memory:"):
        return None
    path = Path(engine.url.database)
    if not path.parent.is_dir():
        raise Unavailable(
            f"database_url: directory {path.parent} does not exist (serve makes none)"
        )
    return path


def probe(url: str) -> str:
    """What a ledger at `url` is, read without changing it (`slurmedic doctor`): its schema
    against this release's. Unavailable, naming database_url, when it cannot be reached or
    read."""
    engine = _engine(url)
    try:
        path = _sqlite_file(engine)
        if path is not None and not path.exists():
            return f"no ledger at {path} yet: serve creates it"
        with engine.connect() as conn:
            found = migrate.revision(conn)
    except SQLAlchemyError as e:
        reason = str(getattr(e, "orig", None) or e).splitlines()[0]
        raise Unavailable(f"database_url: {reason}") from e
    finally:
        engine.dispose()
    if found == migrate.head():
        return f"reachable, schema at this release's ({found})"
    return (
        f"reachable, schema {found or 'unstamped'}: serve upgrades it to {migrate.head()} "
        "when it starts"
    )
