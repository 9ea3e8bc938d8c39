"""The repairs of nodes slurmedic drained (issue 40): one row per node and drain, its plan and
where it stands (webhook/core/repairs.py); its steps are decisions under its key.

Revision ID: 0013
Revises: 0012
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "repairs",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("key", sa.String(128), nullable=False, unique=True),
        sa.Column("node", sa.String(64), nullable=False, index=True),
        sa.Column("seq", sa.Integer, nullable=False),
        sa.Column("drain", sa.Integer, sa.ForeignKey("decisions.id"), nullable=False),
        sa.Column("drain_incident", sa.String(128), nullable=False),
        sa.Column("cause", sa.String(32), nullable=False),
        sa.Column("drained_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("ran", sa.Boolean, nullable=False),
        sa.Column("alerts", sa.JSON, nullable=False),
        sa.Column("partition", sa.String(64), nullable=True),
        sa.Column("plan", sa.String(16), nullable=False),
        sa.Column("why", sa.Text, nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False, index=True),
        sa.Column("state", sa.String(16), nullable=False, index=True),
        sa.Column("since", sa.DateTime(timezone=True), nullable=False),
        sa.Column("reason", sa.Text, nullable=False),
        sa.UniqueConstraint("drain", "node", name="uq_repair_drain"),
    )


def downgrade() -> None:
    op.drop_table("repairs")
