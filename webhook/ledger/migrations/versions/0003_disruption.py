"""What each decision would disrupt, in GPUs (the trial report's GPU-hours, issue 13).

Revision ID: 0003
Revises: 0002
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("decisions") as batch:
        batch.add_column(sa.Column("gpus", sa.Integer, nullable=True))
        batch.add_column(sa.Column("gpu_hours", sa.Float, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("decisions") as batch:
        batch.drop_column("gpu_hours")
        batch.drop_column("gpus")
