"""The repairs of nodes slurmedic drained (webhook/core/repairs.py): the ledger's SQL for them.

A repair is a row (its plan and where it stands) and decisions under its key (its steps: a reset
or reboot, the health check, the resume, or the escalation for replacement), written together in
the leader's term, so that a repair moves once whichever replica leads.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import func, or_, select
from sqlalchemy.orm import Session, sessionmaker

from webhook.core.decisions import Decision
from webhook.core.lifecycle import EXECUTED, FAILED, RECORDED
from webhook.core.repairs import CLOSED, REPLACE, UNDER_WAY, Drained, Move, Repair, Step
from webhook.core.validation import is_number
from webhook.ledger.figures import RepairFigures
from webhook.ledger.schema import AlertRow, DecisionEvent, DecisionRow, RepairRow, utc

# Drains a repair follows: carried out, or a dry run (monitor mode) to follow in dry runs too.
FOLLOWED = (EXECUTED, RECORDED)
Record = Callable[[Session, Sequence[Decision]], list[int]]


class Repairs:
    def __init__(self, session: sessionmaker[Session]) -> None:
        self.session = session

    def new_drains(self, since: datetime, causes: frozenset[str]) -> list[Drained]:
        """Drains since `since` for the nodes' own faults (`causes`), carried out or dry-run,
        whose nodes have no repair for them yet: one Drained per node."""
        with self.session() as s:
            rows = s.scalars(
                select(DecisionRow)
                .where(
                    DecisionRow.action == "drain",
                    DecisionRow.at >= since,
                    DecisionRow.state.in_(FOLLOWED),
                    DecisionRow.cause.in_(causes),
                )
                .order_by(DecisionRow.id)
            ).all()
            if not rows:
                return []
            known = set(
                s.execute(
                    select(RepairRow.drain, RepairRow.node).where(
                        RepairRow.drain.in_([r.id for r in rows])
                    )
                ).all()
            )
            labels = _labels(s, {e["fingerprint"] for r in rows for e in _alerts(r.evidence)})
        out = []
        for r in rows:
            alerts = tuple(_named(e, labels) for e in _alerts(r.evidence))
            for node in r.nodes:
                if (r.id, node) in known:
                    continue
                mine = tuple((name, xid) for name, xid, on in alerts if on in (node, None))
                out.append(
                    Drained(
                        node=node,
                        drain=r.id,
                        incident=r.incident,
                        cause=r.cause,
                        at=utc(r.at),
                        ran=r.state == EXECUTED,
                        alerts=mine,
                        partition=r.partition,
                    )
                )
        return out

    def of_node(self, node: str, since: datetime) -> list[Repair]:
        """The node's repairs begun since `since`, oldest first."""
        with self.session() as s:
            rows = s.scalars(
                select(RepairRow)
                .where(RepairRow.node == node, RepairRow.started_at >= since)
                .order_by(RepairRow.id)
            ).all()
            return [_repair(r, _steps(s, [r.key]).get(r.key, ())) for r in rows]

    def last_seq(self, node: str) -> int:
        """The count of the node's last repair (0: none yet)."""
        with self.session() as s:
            return s.scalar(select(func.max(RepairRow.seq)).where(RepairRow.node == node)) or 0

    def under_way(self) -> list[Repair]:
        """Every repair not closed (on probation included), oldest first, with its steps."""
        with self.session() as s:
            rows = s.scalars(
                select(RepairRow).where(RepairRow.state.not_in(CLOSED)).order_by(RepairRow.id)
            ).all()
            steps = _steps(s, [r.key for r in rows])
            return [_repair(r, steps.get(r.key, ())) for r in rows]

    def listed(self, since: datetime) -> list[tuple[Repair, str]]:
        """The repairs begun since `since`, newest first, with why each is where it stands:
        what `slurmedic repairs`, the console and /metrics read."""
        with self.session() as s:
            rows = s.scalars(
                select(RepairRow).where(RepairRow.started_at >= since).order_by(RepairRow.id.desc())
            ).all()
            steps = _steps(s, [r.key for r in rows])
            return [(_repair(r, steps.get(r.key, ())), r.reason) for r in rows]

    def save(self, repair: Repair, move: Move | None, at: datetime, record: Record) -> list[int]:
        """The repair (new, or moved by `move`) and its move's decision, in one transaction
        (`record` writes decisions in the ledger's term); the decision's ids."""
        with self.session.begin() as s:
            row = s.scalar(select(RepairRow).where(RepairRow.key == repair.key))
            if row is None:
                d = repair.drained
                row = RepairRow(
                    key=repair.key,
                    node=repair.node,
                    seq=repair.seq,
                    drain=d.drain,
                    drain_incident=d.incident,
                    cause=d.cause,
                    drained_at=d.at,
                    ran=d.ran,
                    alerts=[list(a) for a in d.alerts],
                    partition=d.partition,
                    plan=repair.plan,
                    why=repair.why,
                    started_at=repair.started,
                    state=repair.state,
                    since=repair.since or at,
                    reason="",
                )
                s.add(row)
            ids: list[int] = []
            if move is not None:
                moved = repair.moved(move.state, at)
                row.state, row.since, row.reason = moved.state, at, move.reason
                if move.decision is not None:
                    ids = record(s, [move.decision])
            return ids

    @staticmethod
    def figures(s: Session, since: datetime) -> RepairFigures:
        """What /metrics reports of the repairs: how many by state, plan and the drain's cause
        (every repair under way, whatever its age; the others begun since `since`), the seconds
        from each drain to its node back in service (its resume executed) of the repairs begun
        since `since`, and the nodes whose latest repair sent them to a person for
        replacement."""
        r, d, e = RepairRow, DecisionRow, DecisionEvent
        by_state = {
            (state, plan, cause): n
            for state, plan, cause, n in s.execute(
                select(r.state, r.plan, r.cause, func.count())
                .where(or_(r.state.in_(UNDER_WAY), r.started_at >= since))
                .group_by(r.state, r.plan, r.cause)
            ).all()
        }
        returned = [
            (utc(back) - utc(drained)).total_seconds()
            for drained, back in s.execute(
                select(r.drained_at, func.min(e.at))
                .join(d, d.incident == r.key)
                .join(e, e.decision_id == d.id)
                .where(r.started_at >= since, d.action == "resume", e.state == EXECUTED)
                .group_by(r.id, r.drained_at)
            ).all()
        ]
        last = select(r.node, func.max(r.seq).label("seq")).group_by(r.node).subquery()
        replace = s.scalars(
            select(r.node)
            .join(last, (last.c.node == r.node) & (last.c.seq == r.seq))
            .where(r.state == REPLACE)
            .order_by(r.node)
        ).all()
        return RepairFigures(by_state, returned, list(replace))


def _alerts(evidence: Any) -> list[dict[str, Any]]:
    return [e for e in evidence or () if isinstance(e, dict) and e.get("fingerprint")]


def _labels(s: Session, fingerprints: set[str]) -> dict[str, dict[str, Any]]:
    """The labels of the alerts with these fingerprints (their latest event's)."""
    if not fingerprints:
        return {}
    found: dict[str, dict[str, Any]] = {}
    for fp, alert in s.execute(
        select(AlertRow.fingerprint, AlertRow.alert)
        .where(AlertRow.fingerprint.in_(fingerprints))
        .order_by(AlertRow.id)
    ):
        labels = alert.get("labels") if isinstance(alert, dict) else None
        if isinstance(labels, dict):
            found[fp] = labels
    return found


def _named(e: dict[str, Any], labels: dict[str, dict[str, Any]]) -> tuple[str, int | None, Any]:
    """(alertname, its XID, the node it names) of an evidence record."""
    xid = labels.get(e["fingerprint"], {}).get("xid", "")
    return (
        str(e.get("alertname", "")),
        int(xid) if is_number(str(xid)) else None,
        e.get("node"),
    )


def _steps(s: Session, keys: list[str]) -> dict[str, tuple[Step, ...]]:
    """Each repair's steps: its decisions, with when their run ended and what it said."""
    if not keys:
        return {}
    rows = s.scalars(
        select(DecisionRow).where(DecisionRow.incident.in_(keys)).order_by(DecisionRow.id)
    ).all()
    events: dict[int, list[DecisionEvent]] = {}
    for ev in s.scalars(
        select(DecisionEvent)
        .where(DecisionEvent.decision_id.in_([r.id for r in rows]))
        .order_by(DecisionEvent.id)
    ):
        events.setdefault(ev.decision_id, []).append(ev)
    out: dict[str, list[Step]] = {}
    for r in rows:
        ran = [
            e
            for e in events.get(r.id, [])
            if e.state in (EXECUTED, FAILED) or (e.state == RECORDED and "dry_run" in e.detail)
        ]
        detail = ran[-1].detail if ran else {}
        passed, said = _verdict(r, detail)
        out.setdefault(r.incident, []).append(
            Step(
                id=r.id,
                action=r.action,
                state=r.state,
                at=utc(r.at),
                done_at=utc(ran[-1].at) if ran else None,
                passed=passed,
                detail=said,
            )
        )
    return {k: tuple(v) for k, v in out.items()}


def _verdict(row: DecisionRow, detail: dict[str, Any]) -> tuple[bool | None, str]:
    """A health check's verdict from its run (every node's command exited 0), and what its run
    said (a failure's error, the exit status of a check that failed and its output's last
    line where the run kept it)."""
    if "error" in detail:
        return None, str(detail["error"])[:300]
    run = detail.get("run") or {}
    if row.action != "health_check" or not isinstance(run, dict):
        return None, ""
    health = run.get("health") or {}
    rcs = [health.get(n) for n in row.nodes]
    if not rcs or not all(isinstance(rc, int) for rc in rcs):
        return False, "no result from the node"
    failed = [(n, rc) for n, rc in zip(row.nodes, rcs, strict=True) if rc != 0]
    if not failed:
        return True, ""
    node, rc = failed[0]
    said = (run.get("health_output") or {}).get(node, "")
    lines = [ln for ln in str(said).splitlines() if ln.strip()]
    return False, f"{node}: exit {rc}" + (f": {lines[-1][:200]}" if lines else "")


def _repair(r: RepairRow, steps: tuple[Step, ...]) -> Repair:
    return Repair(
        node=r.node,
        seq=r.seq,
        drained=Drained(
            node=r.node,
            drain=r.drain,
            incident=r.drain_incident,
            cause=r.cause,
            at=utc(r.drained_at),
            ran=r.ran,
            alerts=tuple((str(a[0]), a[1] if isinstance(a[1], int) else None) for a in r.alerts),
            partition=r.partition,
        ),
        plan=r.plan,  # type: ignore[arg-type]
        why=r.why,
        started=utc(r.started_at),
        state=r.state,
        since=utc(r.since),
        steps=steps,
    )
