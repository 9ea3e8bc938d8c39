"""An index on a decision's state: the loop reads the decisions not carried out yet every step,
and the executor and the expiry theirs, from a table that keeps every decision (issue 16).

Revision ID: 0008
Revises: 0007
"""

from __future__ import annotations

from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_decisions_state", "decisions", ["state"])


def downgrade() -> None:
    op.drop_index("ix_decisions_state", table_name="decisions")
