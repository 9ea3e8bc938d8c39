"""What failed before (issue 36): the application-class XIDs seen on each GPU, under which job
(`failures`), a drain's words for Slurm's reason after its key and cause (`decisions.note`:
`repeat 2 in 7d`), and where a requeued failure happened (`decisions.failed_on`: one rank's
crash, its nodes).

Revision ID: 0010
Revises: 0009
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("decisions", sa.Column("note", sa.String(64), nullable=True))
    op.add_column("decisions", sa.Column("failed_on", sa.JSON, nullable=True))
    op.create_table(
        "failures",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False, index=True),
        sa.Column("node", sa.String(64), nullable=False, index=True),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("incident", sa.String(128), nullable=False),
        sa.Column("job", sa.Integer, nullable=True),
        sa.Column("gpu", sa.String(128), nullable=True),
    )


def downgrade() -> None:
    op.drop_table("failures")
    with op.batch_alter_table("decisions") as batch:
        batch.drop_column("note")
        batch.drop_column("failed_on")
