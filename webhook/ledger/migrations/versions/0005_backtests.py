"""Backtest reports kept for the console (issue 15).

Revision ID: 0005
Revises: 0004
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "backtests",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("by", sa.String(64), nullable=False),
        sa.Column("span_from", sa.DateTime(timezone=True), nullable=False),
        sa.Column("span_to", sa.DateTime(timezone=True), nullable=False),
        sa.Column("policy", sa.Text, nullable=False),
        sa.Column("report", sa.JSON, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("backtests")
