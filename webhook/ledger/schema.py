"""Tables of the ledger."""

from __future__ import annotations

from datetime import datetime
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
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


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
    key: Mapped[str] = mapped_column(String(64), primary_key=True)
    job: Mapped[int | None] = mapped_column(Integer, nullable=True)
    node: Mapped[str | None] = mapped_column(String(64), nullable=True)
    opened_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    decided_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    evidence: Mapped[list[Any]]


class DecisionRow(Base):
    __tablename__ = "decisions"
    __table_args__ = (Index("ix_decision_incident", "incident"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    at: Mapped[datetime] = mapped_column(DateTime(timezone=True), index=True)
    incident: Mapped[str] = mapped_column(String(64))
    job: Mapped[int | None] = mapped_column(Integer, nullable=True)
    action: Mapped[str] = mapped_column(String(16))
    cause: Mapped[str] = mapped_column(String(32))
    nodes: Mapped[list[Any]]
    exclude: Mapped[list[Any]]
    reason: Mapped[str] = mapped_column(Text)
    evidence: Mapped[list[Any]]
    # When the failure began (earliest startsAt of the evidence), kept for /metrics.
    fault_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    guard: Mapped[str | None] = mapped_column(String(48), nullable=True)
    mode: Mapped[str] = mapped_column(String(16))
    state: Mapped[str] = mapped_column(String(24))


class DecisionEvent(Base):
    """Every state a decision passes through, appended, with what caused it."""

    __tablename__ = "decision_events"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    decision_id: Mapped[int] = mapped_column(ForeignKey("decisions.id"), index=True)
    at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    state: Mapped[str] = mapped_column(String(24))
    detail: Mapped[dict[str, Any]]


class Setting(Base):
    """Switches a human flips while the service runs: the global monitor switch, the breaker."""

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
