"""Incident keys of long node names (issue 36): a node name may have 64 characters (Linux's
HOST_NAME_MAX; cloud providers' host names run to 60 and more), so an idle node's n-th failure
is `node:` + 64 + `:` + 6 digits, 76 characters, and a resume of many long names up to 90 or
so; the columns held 64 (PostgreSQL refuses a longer value, SQLite kept it). Now 128
(webhook.core.incidents.MAX_LEN). Widening a varchar rewrites nothing on PostgreSQL; SQLite
copies the table (batch mode), its indexes with it.

Revision ID: 0009
Revises: 0008
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

# As this revision made them, whatever webhook.core.incidents says later.
KEY_LEN = 128


def upgrade() -> None:
    with op.batch_alter_table("incidents") as batch:
        batch.alter_column(
            "key", type_=sa.String(KEY_LEN), existing_type=sa.String(64), existing_nullable=False
        )
    with op.batch_alter_table("decisions") as batch:
        batch.alter_column(
            "incident",
            type_=sa.String(KEY_LEN),
            existing_type=sa.String(64),
            existing_nullable=False,
        )


def downgrade() -> None:
    # Keys longer than 64 would not fit: a downgrade with them in the ledger fails, as it should.
    with op.batch_alter_table("decisions") as batch:
        batch.alter_column(
            "incident",
            type_=sa.String(64),
            existing_type=sa.String(KEY_LEN),
            existing_nullable=False,
        )
    with op.batch_alter_table("incidents") as batch:
        batch.alter_column(
            "key", type_=sa.String(64), existing_type=sa.String(KEY_LEN), existing_nullable=False
        )
