"""Several replicas on one ledger (issue 14): the leader's lease with its fencing token, each
replica's heartbeat, and a unique key that makes a second decision per incident, action and
revision impossible.

Revision ID: 0004
Revises: 0003
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


# The engine's incidents only: the verifier's and a human's resumes may repeat a key.
ONCE = "state <> 'superseded' AND incident NOT LIKE 'verify:%' AND incident NOT LIKE 'resume:%'"


def upgrade() -> None:
    op.create_table(
        "leases",
        sa.Column("name", sa.String(32), primary_key=True),
        sa.Column("holder", sa.String(128), nullable=False),
        sa.Column("token", sa.Integer, nullable=False),
        # Seconds since the epoch on the database's clock: replicas' clocks may differ.
        sa.Column("expires_at", sa.Float, nullable=False),
        sa.Column("acquired_at", sa.Float, nullable=False),
    )
    op.create_table(
        "replicas",
        sa.Column("name", sa.String(128), primary_key=True),
        sa.Column("loop_at", sa.Float, nullable=True),
        sa.Column("web_at", sa.Float, nullable=True),
        sa.Column("leading", sa.Boolean, nullable=False, server_default=sa.false()),
    )
    with op.batch_alter_table("decisions") as batch:
        batch.add_column(sa.Column("revision", sa.Integer, nullable=False, server_default="0"))
    # Ledgers written by two loops at once (before this release) may hold the same decision
    # twice: number the copies so the key can be made, and keep every row.
    op.execute(
        """
        UPDATE decisions SET revision = (
            SELECT COUNT(*) FROM decisions AS d
            WHERE d.incident = decisions.incident AND d.action = decisions.action
              AND d.state <> 'superseded' AND d.id < decisions.id)
        WHERE state <> 'superseded'
        """
    )
    op.create_index(
        "uq_decision_once",
        "decisions",
        ["incident", "action", "revision"],
        unique=True,
        sqlite_where=sa.text(ONCE),
        postgresql_where=sa.text(ONCE),
    )


def downgrade() -> None:
    op.drop_index("uq_decision_once", table_name="decisions")
    with op.batch_alter_table("decisions") as batch:
        batch.drop_column("revision")
    op.drop_table("replicas")
    op.drop_table("leases")
