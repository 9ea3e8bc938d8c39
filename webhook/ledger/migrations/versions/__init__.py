"""Revisions of the ledger's schema, oldest first (each names its down_revision)."""
