"""The ledger's Alembic migrations (run by webhook.ledger.migrate when a Ledger opens)."""
