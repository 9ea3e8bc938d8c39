"""The trial (issue 13): operators' verdicts on decisions, and the partition whose modes each
decision took (staged enablement).

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "verdicts",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("decision_id", sa.Integer, sa.ForeignKey("decisions.id"), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("by", sa.String(64), nullable=False),
        sa.Column("verdict", sa.String(16), nullable=False),
        sa.Column("would", sa.String(16), nullable=True),
        sa.Column("note", sa.Text, nullable=False),
    )
    op.create_index("ix_verdicts_decision_id", "verdicts", ["decision_id"])
    with op.batch_alter_table("decisions") as batch:
        batch.add_column(sa.Column("partition", sa.String(64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("decisions") as batch:
        batch.drop_column("partition")
    op.drop_index("ix_verdicts_decision_id", table_name="verdicts")
    op.drop_table("verdicts")
