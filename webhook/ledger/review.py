"""What the review console and the trial read from the ledger, and the verdicts they write.

Incidents are listed newest first, filtered and paged in SQL (a trial of months holds tens of
thousands of decisions); an incident's page reads its decisions, their events and verdicts in
three queries.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import ColumnElement, String, cast, func, or_, select

from webhook.core.decisions import JOB_ACTIONS
from webhook.core.effects import effect, first_before
from webhook.core.failures import NodeRecord, lemons
from webhook.core.incidents import BadIncidentKey, attempt_of
from webhook.core.lifecycle import (
    AWAITING_APPROVAL,
    EXECUTED,
    NOTE,
    SUPERSEDED,
    IllegalTransition,
)
from webhook.core.notices import Open, Owner
from webhook.core.repair_view import NodeView
from webhook.core.repair_view import node_views as _node_views
from webhook.core.trial import Judged
from webhook.core.verdicts import OperatorVerdict
from webhook.ledger.schema import (
    AlertRow,
    DecisionEvent,
    DecisionRow,
    IncidentRow,
    RecoveryRow,
    VerdictRow,
    utc,
)
from webhook.ledger.settings import CorruptSetting, Modes, Nodes
from webhook.ledger.store import Ledger


@dataclass(frozen=True)
class IncidentFilter:
    """Every field narrows the list; None (or empty) leaves it open."""

    state: str | None = None
    cause: str | None = None
    action: str | None = None
    mode: str | None = None
    job: int | None = None
    partition: str | None = None
    node: str | None = None  # drained, or excluded from the requeue
    since: datetime | None = None
    until: datetime | None = None


@dataclass(frozen=True)
class IncidentPage:
    keys: list[str]  # newest first
    total: int  # incidents that match, on every page


@dataclass(frozen=True)
class IncidentRecord:
    incident: IncidentRow | None
    decisions: list[DecisionRow]
    events: dict[int, list[DecisionEvent]]
    verdicts: dict[int, list[VerdictRow]]
    # A requeue's verification: watching, recovered, failed, unverified (None: no requeue).
    recovery: RecoveryRow | None = None


def _where(f: IncidentFilter) -> list[ColumnElement[bool]]:
    clauses: list[ColumnElement[bool]] = []
    for column, value in (
        (DecisionRow.state, f.state),
        (DecisionRow.cause, f.cause),
        (DecisionRow.action, f.action),
        (DecisionRow.mode, f.mode),
        (DecisionRow.job, f.job),
        (DecisionRow.partition, f.partition),
    ):
        if value is not None and value != "":
            clauses.append(column == value)
    if f.node:
        # The node lists are JSON arrays of valid node names: the quoted name matches one whole.
        quoted = f'%"{f.node}"%'
        nodes, exclude = cast(DecisionRow.nodes, String), cast(DecisionRow.exclude, String)
        clauses.append(or_(nodes.like(quoted), exclude.like(quoted)))
    if f.since is not None:
        clauses.append(DecisionRow.at >= f.since)
    if f.until is not None:
        clauses.append(DecisionRow.at < f.until)
    return clauses


def incident_page(ledger: Ledger, f: IncidentFilter, offset: int, limit: int) -> IncidentPage:
    """The incidents with a decision that matches, newest (latest decision) first."""
    latest = func.max(DecisionRow.id)
    with ledger.session() as s:
        base = select(DecisionRow.incident).where(*_where(f)).group_by(DecisionRow.incident)
        total = s.scalar(select(func.count()).select_from(base.subquery())) or 0
        keys = s.scalars(base.order_by(latest.desc()).offset(offset).limit(limit)).all()
    return IncidentPage(list(keys), total)


def decisions_of(ledger: Ledger, incidents: Sequence[str]) -> dict[str, list[DecisionRow]]:
    with ledger.session() as s:
        rows = s.scalars(
            select(DecisionRow).where(DecisionRow.incident.in_(incidents)).order_by(DecisionRow.id)
        ).all()
    found: dict[str, list[DecisionRow]] = defaultdict(list)
    for r in rows:
        found[r.incident].append(r)
    return found


def incident_record(ledger: Ledger, key: str) -> IncidentRecord | None:
    with ledger.session() as s:
        decisions = list(
            s.scalars(
                select(DecisionRow).where(DecisionRow.incident == key).order_by(DecisionRow.id)
            ).all()
        )
        if not decisions:
            return None
        ids = [d.id for d in decisions]
        events: dict[int, list[DecisionEvent]] = defaultdict(list)
        for e in s.scalars(
            select(DecisionEvent)
            .where(DecisionEvent.decision_id.in_(ids))
            .order_by(DecisionEvent.id)
        ):
            events[e.decision_id].append(e)
        verdicts: dict[int, list[VerdictRow]] = defaultdict(list)
        for v in s.scalars(
            select(VerdictRow).where(VerdictRow.decision_id.in_(ids)).order_by(VerdictRow.id)
        ):
            verdicts[v.decision_id].append(v)
        return IncidentRecord(
            s.get(IncidentRow, key), decisions, events, verdicts, s.get(RecoveryRow, key)
        )


def waiting_since(ledger: Ledger, states: Sequence[str]) -> list[DecisionRow]:
    """Decisions in `states` (the approval queue), oldest first."""
    with ledger.session() as s:
        return list(
            s.scalars(
                select(DecisionRow).where(DecisionRow.state.in_(states)).order_by(DecisionRow.at)
            ).all()
        )


def add_verdict(ledger: Ledger, decision_id: int, v: OperatorVerdict, at: datetime) -> int:
    """Append a verdict; KeyError when the decision is not in the ledger."""
    with ledger.session.begin() as s:
        if s.get(DecisionRow, decision_id) is None:
            raise KeyError(decision_id)
        row = VerdictRow(
            decision_id=decision_id, at=at, by=v.by, verdict=v.verdict, would=v.would, note=v.note
        )
        s.add(row)
        s.flush()
        return row.id


def verdicts_of(ledger: Ledger, decision_ids: Sequence[int]) -> dict[int, list[VerdictRow]]:
    with ledger.session() as s:
        found: dict[int, list[VerdictRow]] = defaultdict(list)
        for v in s.scalars(
            select(VerdictRow)
            .where(VerdictRow.decision_id.in_(decision_ids))
            .order_by(VerdictRow.id)
        ):
            found[v.decision_id].append(v)
        return found


class NotWaiting(ValueError):
    """A decision a human cannot approve or reject (any more); the message says why."""


def judge(
    ledger: Ledger, decision_id: int, state: str, detail: dict[str, str], at: datetime
) -> DecisionRow:
    """Approve or reject a decision that awaits approval (`state`: approved | rejected)."""
    found = ledger.decision(decision_id)
    if found is None:
        raise NotWaiting(f"decision {decision_id} is not in the ledger")
    row = found[0]
    if row.state != AWAITING_APPROVAL:
        raise NotWaiting(f"decision {decision_id} is {row.state}, not {AWAITING_APPROVAL}")
    try:
        ledger.add_event(decision_id, state, detail, at)
    except IllegalTransition as e:  # superseded or moved on since it was read
        raise NotWaiting(f"decision {decision_id}: {e}") from e
    return row


def alerts_by_fingerprint(ledger: Ledger, fingerprints: Sequence[str]) -> dict[str, dict[str, Any]]:
    """The latest stored event of each alert (labels, annotations, generatorURL)."""
    with ledger.session() as s:
        found: dict[str, dict[str, Any]] = {}
        for a in s.scalars(
            select(AlertRow).where(AlertRow.fingerprint.in_(fingerprints)).order_by(AlertRow.id)
        ):
            found[a.fingerprint] = a.alert
        return found


def needs_human(ledger: Ledger, since: datetime) -> list[Open]:
    """Decisions that wait for a human: approvals, and escalations and mismatches (Slurm showed
    otherwise after a run) since `since` that nobody has recorded a verdict on yet; and stops
    carried out since then without a verdict (their owner is told: a stop's `at` is when it
    ran). Each with the owner its latest `owner` note recorded (the notifier's)."""
    judged = select(VerdictRow.decision_id)
    stopped = (DecisionRow.action == "stop") & (DecisionRow.state == EXECUTED)
    with ledger.session() as s:
        rows = s.scalars(
            select(DecisionRow)
            .where(
                or_(
                    DecisionRow.state == AWAITING_APPROVAL,
                    (
                        (DecisionRow.action == "escalate") & (DecisionRow.state != SUPERSEDED)
                        | DecisionRow.mismatch.is_not(None)
                        | stopped
                    )
                    & (DecisionRow.at >= since)
                    & DecisionRow.id.not_in(judged),
                )
            )
            .order_by(DecisionRow.id)
        ).all()
        ids = [r.id for r in rows]
        owners: dict[int, Owner] = {}
        ran: dict[int, datetime] = {}
        for decision_id, state, at, detail in s.execute(
            select(DecisionEvent.decision_id, DecisionEvent.state, DecisionEvent.at,
                   DecisionEvent.detail)
            .where(DecisionEvent.decision_id.in_(ids), DecisionEvent.state.in_((NOTE, EXECUTED)))
            .order_by(DecisionEvent.id)
        ):  # fmt: skip
            if state == EXECUTED:
                ran[decision_id] = utc(at)
            elif isinstance(detail, dict) and (o := Owner.from_json(detail.get("owner"))):
                owners[decision_id] = o
        return [
            Open(
                r.id, r.incident, r.job, r.action, r.cause, r.guard, r.state, r.reason,
                ran.get(r.id, utc(r.at)) if r.action == "stop" else utc(r.at), r.mismatch,
                partition=r.partition, owner=owners.get(r.id),
            )
            for r in rows
        ]  # fmt: skip


def record_owner(ledger: Ledger, decision_id: int, owner: Owner, at: datetime) -> None:
    """What Slurm showed of the job's owner, kept on the decision as a note (needs_human reads
    it back), so that its notices name the owner after Slurm has forgotten the job."""
    names = ", ".join(f"{k} {v}" for k, v in owner.as_json().items()) or "none known"
    detail = {"by": "notifier", "owner": owner.as_json(), "note": f"the job's owner: {names}"}
    ledger.add_note(decision_id, detail, at)


def trial_rows(ledger: Ledger, since: datetime, until: datetime) -> list[Judged]:
    """Every decision made in [since, until) but superseded ones (`none` too: a verdict that
    says it should have acted is a miss), with its latest verdict, what a requeue or stop did
    to its attempt, and, for a requeue, what became of the recovery."""
    latest = select(func.max(VerdictRow.id)).group_by(VerdictRow.decision_id)
    with ledger.session() as s:
        verdicts = {
            v.decision_id: v for v in s.scalars(select(VerdictRow).where(VerdictRow.id.in_(latest)))
        }
        decisions = s.scalars(
            select(DecisionRow)
            .where(DecisionRow.at >= since, DecisionRow.at < until)
            .where(DecisionRow.state != SUPERSEDED)
            .order_by(DecisionRow.id)
        ).all()
        job_actions = [d.id for d in decisions if d.action in JOB_ACTIONS]
        details: dict[int, list[dict[str, Any]]] = defaultdict(list)
        for decision_id, detail in s.execute(
            select(DecisionEvent.decision_id, DecisionEvent.detail)
            .where(DecisionEvent.decision_id.in_(job_actions))
            .order_by(DecisionEvent.id)
        ):
            details[decision_id].append(detail)
        incidents = [d.incident for d in decisions if d.action == "requeue"]
        recoveries = dict(
            s.execute(
                select(RecoveryRow.incident, RecoveryRow.state).where(
                    RecoveryRow.incident.in_(incidents)
                )
            ).all()
        )
    out = []
    for d in decisions:
        v = verdicts.get(d.id)
        out.append(
            Judged(
                decision_id=d.id,
                incident=d.incident,
                at=utc(d.at),
                action=d.action,
                cause=d.cause,
                mode=d.mode,
                state=d.state,
                partition=d.partition,
                nodes=tuple(d.nodes),
                job=d.job,
                fault_at=utc(d.fault_at) if d.fault_at else None,
                verdict=v.verdict if v else None,
                would=v.would if v else None,
                note=v.note if v else "",
                by=v.by if v else "",
                recovery=recoveries.get(d.incident) if d.action == "requeue" else None,
                gpus=d.gpus or 0,
                gpu_hours=d.gpu_hours,
                effect=_effect(d, details.get(d.id, [])),
                alerts=_alertnames(d.evidence),
            )
        )
    return out


def _alertnames(evidence: list[dict[str, Any]] | None) -> tuple[str, ...]:
    """The alerts a decision was made on, in its evidence's order, each once."""
    names = (str(e.get("alertname")) for e in evidence or () if e.get("alertname"))
    return tuple(dict.fromkeys(names))


def _effect(d: DecisionRow, details: list[dict[str, Any]]) -> str | None:
    try:
        attempt = attempt_of(d.incident)
    except BadIncidentKey:
        return None
    return effect(d.action, attempt, first_before(details))


def node_records(ledger: Ledger, since: datetime) -> list[NodeRecord]:
    """Each node's failures since `since`, the lemons first (`slurmedic nodes`, the console's
    nodes page), judged by the repeats of the policy the live loop last started with."""
    modes = ledger.setting(Modes)
    window = timedelta(seconds=modes.repeats_window_seconds)
    apart = timedelta(seconds=modes.repeats_apart_seconds)
    return lemons(ledger.node_failures(since), window, modes.repeats_count, apart)


def node_views(ledger: Ledger, since: datetime) -> list[NodeView]:
    """Each node's failures since `since` beside its repairs begun since then and its state in
    the loop's cluster view, the nodes waiting for replacement first, then the lemons
    (`slurmedic nodes`, the console's nodes page)."""
    try:
        seen = ledger.setting(Nodes).root
    except CorruptSetting:
        seen = {}  # the loop writes it anew; until then, no node's state is known
    statuses = {node: info.status for node, info in seen.items()}
    return _node_views(node_records(ledger, since), ledger.repairs.listed(since), statuses)
