"""The ledger: every notification, alert, incident, decision and decision state change.

SQLAlchemy; SQLite by default (one file, no server), PostgreSQL by URL. Append-only where it
records what happened: notifications, alerts and decision events are never updated.

The only SQL in slurmedic: store.py (the operations), schema.py (the tables), migrate.py and
migrations/ (the schema's upgrades, run when a Ledger opens), settings.py (what the processes
tell each other through the settings table), figures.py (what /metrics reads, as plain values).
"""
