"""The ledger as release a61be39 (the last before migrations) wrote it.

Ledgers of that release and older ones have these tables but no alembic_version: this revision
creates the tables a ledger lacks and adds the nullable columns an older ledger lacks (as that
release did by hand on every start), so every ledger leaves it with the same schema, stamped.

Revision ID: 0001
Revises:
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

UTC_TIME = sa.DateTime(timezone=True)


def tables(meta: sa.MetaData) -> list[sa.Table]:
    """The schema of this revision, frozen here (the models in schema.py move on)."""
    return [
        sa.Table(
            "notifications",
            meta,
            sa.Column("id", sa.Integer, primary_key=True),
            sa.Column("received_at", UTC_TIME, nullable=False, index=True),
            sa.Column("remote", sa.String(64), nullable=False),
            sa.Column("group_key", sa.Text, nullable=False),
            sa.Column("payload", sa.JSON, nullable=False),
        ),
        sa.Table(
            "alerts",
            meta,
            sa.Column("id", sa.Integer, primary_key=True),
            sa.Column(
                "notification_id", sa.Integer, sa.ForeignKey("notifications.id"), nullable=False
            ),
            sa.Column("received_at", UTC_TIME, nullable=False),
            sa.Column("fingerprint", sa.String(32), nullable=False),
            sa.Column("starts_at", UTC_TIME, nullable=False),
            sa.Column("status", sa.String(16), nullable=False),
            sa.Column("alert", sa.JSON, nullable=False),
            sa.UniqueConstraint("fingerprint", "starts_at", "status", name="uq_alert_event"),
        ),
        sa.Table(
            "incidents",
            meta,
            sa.Column("key", sa.String(64), primary_key=True),
            sa.Column("job", sa.Integer, nullable=True),
            sa.Column("node", sa.String(64), nullable=True),
            sa.Column("opened_at", UTC_TIME, nullable=False),
            sa.Column("decided_at", UTC_TIME, nullable=False),
            sa.Column("evidence", sa.JSON, nullable=False),
        ),
        sa.Table(
            "decisions",
            meta,
            sa.Column("id", sa.Integer, primary_key=True),
            sa.Column("at", UTC_TIME, nullable=False, index=True),
            sa.Column("incident", sa.String(64), nullable=False),
            sa.Column("job", sa.Integer, nullable=True),
            sa.Column("action", sa.String(16), nullable=False),
            sa.Column("cause", sa.String(32), nullable=False),
            sa.Column("nodes", sa.JSON, nullable=False),
            sa.Column("exclude", sa.JSON, nullable=False),
            sa.Column("reason", sa.Text, nullable=False),
            sa.Column("evidence", sa.JSON, nullable=False),
            sa.Column("fault_at", UTC_TIME, nullable=True),
            sa.Column("guard", sa.String(48), nullable=True),
            sa.Column("mode", sa.String(16), nullable=False),
            sa.Column("state", sa.String(24), nullable=False),
            sa.Index("ix_decision_incident", "incident"),
        ),
        sa.Table(
            "decision_events",
            meta,
            sa.Column("id", sa.Integer, primary_key=True),
            sa.Column(
                "decision_id",
                sa.Integer,
                sa.ForeignKey("decisions.id"),
                nullable=False,
                index=True,
            ),
            sa.Column("at", UTC_TIME, nullable=False),
            sa.Column("state", sa.String(24), nullable=False),
            sa.Column("detail", sa.JSON, nullable=False),
        ),
        sa.Table(
            "settings",
            meta,
            sa.Column("key", sa.String(64), primary_key=True),
            sa.Column("value", sa.JSON, nullable=False),
            sa.Column("updated_at", UTC_TIME, nullable=False),
        ),
        sa.Table(
            "recoveries",
            meta,
            sa.Column("incident", sa.String(64), primary_key=True),
            sa.Column("job", sa.Integer, nullable=False, index=True),
            sa.Column("attempt", sa.Integer, nullable=False),
            sa.Column("cause", sa.String(32), nullable=False),
            sa.Column("fault_at", UTC_TIME, nullable=False),
            sa.Column("requeued_at", UTC_TIME, nullable=False),
            sa.Column("failed_step", sa.Float, nullable=True),
            sa.Column("checkpoint_step", sa.Float, nullable=True),
            sa.Column("work_lost_seconds", sa.Float, nullable=True),
            sa.Column("state", sa.String(16), nullable=False, index=True),
            sa.Column("reason", sa.Text, nullable=False),
            sa.Column("decided_at", UTC_TIME, nullable=True),
            sa.Column("restored_seconds", sa.Float, nullable=True),
            sa.Column("before_checkpoint", sa.Boolean, nullable=False),
        ),
    ]


def upgrade() -> None:
    bind = op.get_bind()
    found = sa.inspect(bind)
    for table in tables(sa.MetaData()):
        if not found.has_table(table.name):
            table.create(bind)
            continue
        have = {c["name"] for c in found.get_columns(table.name)}
        missing = [c for c in table.columns if c.name not in have]
        # Only nullable columns were ever added to a table after its release (decisions.fault_at).
        if missing:
            with op.batch_alter_table(table.name) as batch:
                for col in missing:
                    batch.add_column(sa.Column(col.name, col.type, nullable=True))


def downgrade() -> None:
    for table in reversed(tables(sa.MetaData())):
        op.drop_table(table.name)
