"""The ledger: every notification, alert, incident, decision and decision state change.

SQLAlchemy; SQLite by default (one file, no server), PostgreSQL by URL. Append-only where it
records what happened: notifications, alerts and decision events are never updated.
"""
