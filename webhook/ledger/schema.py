"""Tables of the ledger."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, ClassVar

from sqlalchemy import (
    JSON,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
    false,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from webhook.core.incidents import MAX_LEN, RESUME, VERIFY

ONCE = f"state <> 'superseded' AND incident NOT LIKE '{VERIFY}%' AND incident NOT LIKE '{RESUME}%'"


def utc(at: datetime) -> datetime:
    """A time the database handed back, in UTC: SQLite keeps no zone (what was written was UTC)."""
    return at if at.tzinfo is not None else at.replace(tzinfo=UTC)


class Base(DeclarativeBase):
    type_annotation_map: ClassVar[dict[Any, Any]] = {dict[str, Any]: JSON, list[Any]: JSON}


class Notification(Base):
    """One POST from Alertmanager, as received (re-deliveries included: this is the audit log)."""

    __tablename__ = "notifications"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    received_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), index=True)
    remote: Mapped[str] = mapped_column(String(64), default="")
    group_key: Mapped[str] = mapped_column(Text, default="")
    payload: Mapped[dict[str, Any]]


class AlertRow(Base):
    """An alert event, once: a re-delivery (same fingerprint, startsAt and status) adds nothing."""

    __tablename__ = "alerts"
    __table_args__ = (
        UniqueConstraint("fingerprint", "starts_at", "status", name="uq_alert_event"),
    )
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    notification_id: Mapped[int] = mapped_column(ForeignKey("notifications.id"))
    received_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    fingerprint: Mapped[str] = mapped_column(String(32))
    starts_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    status: Mapped[str] = mapped_column(String(16))
    alert: Mapped[dict[str, Any]]


class IncidentRow(Base):
    """One failure of one job attempt (`<job>.<restarts>`), or of one idle node (`node:<name>`)."""

    __tablename__ = "incidents"
    # Every kind of key, the longest node name's too (`node:` + 64 + `:12`); 64 before 0009.
    key: Mapped[str] = mapped_column(String(MAX_LEN), primary_key=True)
    job: Mapped[int | None] = mapped_column(Integer, nullable=True)
    node: Mapped[str | None] = mapped_column(String(64), nullable=True)
    opened_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    decided_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    evidence: Mapped[list[Any]]
    # What rule 5 said of its evidence (webhook.core.shared_cause.Judgement): a revision after
    # a restart, past the storm's window, must not blame the nodes it spared. None: written
    # before 0006, or nothing covered.
    shared: Mapped[dict[str, Any] | None]


class DecisionRow(Base):
    __tablename__ = "decisions"
    __table_args__ = (
        Index("ix_decision_incident", "incident"),
        # One decision per incident, action and revision of the engine's incidents: a second
        # loop (a stale leader) that decides one again is refused by the database, not only
        # by the lease. The verifier's and a human's resumes may repeat a key (a node resumed
        # twice); the lease fences those.
        Index(
            "uq_decision_once",
            "incident",
            "action",
            "revision",
            unique=True,
            sqlite_where=text(ONCE),
            postgresql_where=text(ONCE),
        ),
    )
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    at: Mapped[datetime] = mapped_column(DateTime(timezone=True), index=True)
    incident: Mapped[str] = mapped_column(String(MAX_LEN))  # 64 before 0009
    job: Mapped[int | None] = mapped_column(Integer, nullable=True)
    action: Mapped[str] = mapped_column(String(16))
    cause: Mapped[str] = mapped_column(String(32))
    nodes: Mapped[list[Any]]
    exclude: Mapped[list[Any]]
    # A requeue's nodes taken back out of the job's ExcNodeList (guards.readmit); since 0007.
    readmit: Mapped[list[Any] | None] = mapped_column(JSON, nullable=True)
    reason: Mapped[str] = mapped_column(Text)
    evidence: Mapped[list[Any]]
    # When the failure began (earliest startsAt of the evidence), kept for /metrics.
    fault_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    guard: Mapped[str | None] = mapped_column(String(48), nullable=True)
    mode: Mapped[str] = mapped_column(String(16))
    # Read every step (the loop's waiting decisions, the executor's work, the expiry).
    state: Mapped[str] = mapped_column(String(24), index=True)
    # The partition whose modes it took (None: the policy's own; decisions before 0002).
    partition: Mapped[str | None] = mapped_column(String(64), nullable=True)
    # What it would disrupt (webhook/core/disruption.py); None: decided before 0003.
    gpus: Mapped[int | None] = mapped_column(Integer, nullable=True)
    gpu_hours: Mapped[float | None] = mapped_column(Float, nullable=True)
    # The engine's revision of its incident (0: the first decisions); before 0004, the order
    # of copies a second loop made.
    revision: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    # A drain's words for Slurm's reason after its key and cause (`repeat 2 in 7d`); since 0010.
    note: Mapped[str | None] = mapped_column(String(64), nullable=True)
    # A requeue's nodes where the failure it answered happened (Decision.failed_on); since
    # 0010. None before: read from its evidence's first node.
    failed_on: Mapped[list[Any] | None] = mapped_column(JSON, nullable=True)
    # What Slurm showed after the run that did not match the decision (a double requeue, a
    # drain whose reason is not its own: webhook/core/outcome.py); since 0011.
    mismatch: Mapped[str | None] = mapped_column(String(500), nullable=True)


class FailureRow(Base):
    """An application-class XID on a GPU under a job (webhook.core.failures): the same GPU
    under another job within a window points at the GPU, not at the code."""

    __tablename__ = "failures"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    at: Mapped[datetime] = mapped_column(DateTime(timezone=True), index=True)
    node: Mapped[str] = mapped_column(String(64), index=True)
    kind: Mapped[str] = mapped_column(String(32))
    incident: Mapped[str] = mapped_column(String(MAX_LEN))
    job: Mapped[int | None] = mapped_column(Integer, nullable=True)
    gpu: Mapped[str | None] = mapped_column(String(128), nullable=True)


class DecisionEvent(Base):
    """Every state a decision passes through, appended, with what caused it."""

    __tablename__ = "decision_events"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    decision_id: Mapped[int] = mapped_column(ForeignKey("decisions.id"), index=True)
    at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    state: Mapped[str] = mapped_column(String(24))
    detail: Mapped[dict[str, Any]]


class VerdictRow(Base):
    """An operator's verdict on a decision (webhook/core/verdicts.py), appended, never edited."""

    __tablename__ = "verdicts"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    decision_id: Mapped[int] = mapped_column(ForeignKey("decisions.id"), index=True)
    at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    by: Mapped[str] = mapped_column(String(64))
    verdict: Mapped[str] = mapped_column(String(16))
    would: Mapped[str | None] = mapped_column(String(16), nullable=True)
    note: Mapped[str] = mapped_column(Text, default="")


class SettingRow(Base):
    """What the processes tell each other (webhook/ledger/settings.py: one model a key)."""

    __tablename__ = "settings"
    key: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[dict[str, Any]]
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class RecoveryRow(Base):
    """A requeued job attempt and what became of its successor (watching, recovered, failed)."""

    __tablename__ = "recoveries"
    incident: Mapped[str] = mapped_column(String(64), primary_key=True)
    job: Mapped[int] = mapped_column(Integer, index=True)
    attempt: Mapped[int] = mapped_column(Integer)
    cause: Mapped[str] = mapped_column(String(32))
    fault_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    requeued_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    failed_step: Mapped[float | None] = mapped_column(Float, nullable=True)
    checkpoint_step: Mapped[float | None] = mapped_column(Float, nullable=True)
    work_lost_seconds: Mapped[float | None] = mapped_column(Float, nullable=True)
    state: Mapped[str] = mapped_column(String(16), index=True)
    reason: Mapped[str] = mapped_column(Text, default="")
    decided_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    restored_seconds: Mapped[float | None] = mapped_column(Float, nullable=True)
    before_checkpoint: Mapped[bool] = mapped_column(Boolean, default=False)
    # How the successor resumed (webhook/core/recovery.py Resume); the failed attempt's
    # quality value is kept with its point, when the watch opens.
    quality_before: Mapped[float | None] = mapped_column(Float, nullable=True)
    resume_step: Mapped[float | None] = mapped_column(Float, nullable=True)
    lost_steps: Mapped[float | None] = mapped_column(Float, nullable=True)
    lost_seconds: Mapped[float | None] = mapped_column(Float, nullable=True)
    start_seconds: Mapped[float | None] = mapped_column(Float, nullable=True)
    quality_after: Mapped[float | None] = mapped_column(Float, nullable=True)
    # A requeue an operator asked for to test recovery: apart from every uptime figure.
    drill: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())


class DrillRow(Base):
    """An operator's request for a recovery drill (webhook/core/drills.py) and what became of
    it: `asked` until the leader's loop plans it (from `not_before`), then `decided` (its
    decision under incident `drill:<job>.<n>`) or `refused` (why not, in `reason`)."""

    __tablename__ = "drills"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    job: Mapped[int] = mapped_column(Integer, index=True)
    exclude: Mapped[str | None] = mapped_column(String(128), nullable=True)
    by: Mapped[str] = mapped_column(String(128))
    asked_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    not_before: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    state: Mapped[str] = mapped_column(String(16), index=True)
    reason: Mapped[str] = mapped_column(Text, default="")
    incident: Mapped[str | None] = mapped_column(String(MAX_LEN), nullable=True)


class RepairRow(Base):
    """The repair of a node slurmedic drained (webhook/core/repairs.py): one row per node and
    drain, its plan and where it stands; its steps are decisions under its key
    (`repair:<node>[:<n>]`)."""

    __tablename__ = "repairs"
    __table_args__ = (UniqueConstraint("drain", "node", name="uq_repair_drain"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    key: Mapped[str] = mapped_column(String(MAX_LEN), unique=True)
    node: Mapped[str] = mapped_column(String(64), index=True)
    seq: Mapped[int] = mapped_column(Integer)
    drain: Mapped[int] = mapped_column(ForeignKey("decisions.id"))
    drain_incident: Mapped[str] = mapped_column(String(MAX_LEN))
    cause: Mapped[str] = mapped_column(String(32))
    drained_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    ran: Mapped[bool] = mapped_column(Boolean)
    alerts: Mapped[list[Any]]
    partition: Mapped[str | None] = mapped_column(String(64), nullable=True)
    plan: Mapped[str] = mapped_column(String(16))
    why: Mapped[str] = mapped_column(Text)
    started_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), index=True)
    state: Mapped[str] = mapped_column(String(16), index=True)
    since: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    reason: Mapped[str] = mapped_column(Text, default="")  # why it is in its state


class LeaseRow(Base):
    """Who leads (decides and executes) among the replicas on this ledger, until when, and the
    fencing token of its term: every claim of a decision names the token, and a term that
    ended can claim nothing (webhook/service/leadership.py)."""

    __tablename__ = "leases"
    name: Mapped[str] = mapped_column(String(32), primary_key=True)
    holder: Mapped[str] = mapped_column(String(128))
    token: Mapped[int] = mapped_column(Integer)
    # Seconds since the epoch on the database's clock: replicas' clocks may differ.
    expires_at: Mapped[float] = mapped_column(Float)
    acquired_at: Mapped[float] = mapped_column(Float)


class ReplicaRow(Base):
    """Each replica's last signs of life (database clock): its loop, its web workers."""

    __tablename__ = "replicas"
    name: Mapped[str] = mapped_column(String(128), primary_key=True)
    loop_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    web_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    leading: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())


class BacktestRow(Base):
    """A backtest's report (`slurmedic backtest --save`), kept for the console and for the
    team's review: the span, the policy it judged, the report as its JSON (webhook/backtest)."""

    __tablename__ = "backtests"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    by: Mapped[str] = mapped_column(String(64))
    span_from: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    span_to: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    policy: Mapped[str] = mapped_column(Text, default="")
    report: Mapped[dict[str, Any]]
