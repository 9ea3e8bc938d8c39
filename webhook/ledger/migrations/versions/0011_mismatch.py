"""What Slurm showed after a run that did not match its decision (issue 37): a double requeue,
a drain whose reason is not its own (`decisions.mismatch`).

Revision ID: 0011
Revises: 0010
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("decisions", sa.Column("mismatch", sa.String(500), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("decisions") as batch:
        batch.drop_column("mismatch")
