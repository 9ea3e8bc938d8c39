"""How a requeued job resumed (issue 39): the checkpoint its successor loaded, the work lost,
the time to its start, its quality value before and after; whether the requeue was a drill;
and operators' requests for drills (`drills`).

Revision ID: 0012
Revises: 0011
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None

FLOATS = (
    "quality_before",
    "resume_step",
    "lost_steps",
    "lost_seconds",
    "start_seconds",
    "quality_after",
)


def upgrade() -> None:
    for name in FLOATS:
        op.add_column("recoveries", sa.Column(name, sa.Float, nullable=True))
    op.add_column(
        "recoveries",
        sa.Column("drill", sa.Boolean, nullable=False, server_default=sa.false()),
    )
    op.create_table(
        "drills",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("job", sa.Integer, nullable=False, index=True),
        sa.Column("exclude", sa.String(128), nullable=True),
        sa.Column("by", sa.String(128), nullable=False),
        sa.Column("asked_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("not_before", sa.DateTime(timezone=True), nullable=False),
        sa.Column("state", sa.String(16), nullable=False, index=True),
        sa.Column("reason", sa.Text, nullable=False),
        sa.Column("incident", sa.String(128), nullable=True),
    )


def downgrade() -> None:
    op.drop_table("drills")
    with op.batch_alter_table("recoveries") as batch:
        for name in (*FLOATS, "drill"):
            batch.drop_column(name)
