"""Alembic's environment for the ledger: always handed an open connection by
webhook.ledger.migrate (there is no alembic.ini and no URL here), inside that caller's
transaction, which also holds the lock that keeps two processes from migrating at once."""

from __future__ import annotations

from alembic import context
from sqlalchemy.engine import Connection

from webhook.ledger.schema import Base

connection = context.config.attributes.get("connection")
if not isinstance(connection, Connection):
    raise RuntimeError("the ledger's migrations run from webhook.ledger.migrate, on a connection")
context.configure(
    connection=connection,
    target_metadata=Base.metadata,
    # SQLite alters a table by copying it: revisions use op.batch_alter_table.
    render_as_batch=True,
    compare_type=True,
)
with context.begin_transaction():
    context.run_migrations()
