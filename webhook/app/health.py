"""/healthz (the process answers) and /readyz (it can write what it receives, its loop runs, and
it can run playbooks)."""

from __future__ import annotations

from typing import Any

from flask import Blueprint, current_app, jsonify
from sqlalchemy.exc import SQLAlchemyError

from webhook.executor.fitness import unfit_to_run
from webhook.ledger.store import Unavailable

health = Blueprint("health", __name__)


@health.get("/healthz")
def healthz() -> Any:
    return jsonify(status="ok")


@health.get("/readyz")
def readyz() -> Any:
    """Ready: the ledger took a write just now (a full disk, a read-only replica of the
    database fail it, where `SELECT 1` would not) and this replica's loop beat recently (it
    runs, leading or following). Says which replica leads."""
    ext = current_app.extensions["slurmedic"]
    ledger, name = ext["ledger"], ext["replica"]
    try:
        ledger.leases.beat(name, web=True)
        me = ledger.leases.replica(name)
        leader = ledger.leases.leader()
    except (SQLAlchemyError, Unavailable) as e:
        reason = f"the ledger does not take a write: {str(e).splitlines()[0]}"
        return jsonify(status="not ready", replica=name, reason=reason), 503
    leads = leader.running if leader is not None else None
    body = {"replica": name, "leader": leads, "leading": leads == name}
    if (unfit := unfit_to_run()) is not None:
        # The loop on this host cannot carry out a decision: it does not lead (leadership.py).
        reason = f"this host cannot run playbooks: {unfit}"
        return jsonify(status="not ready", reason=reason, **body), 503
    if me is None or me.loop_age is None or me.loop_age > ext["loop_stale"]:
        since = "never" if me is None or me.loop_age is None else f"{me.loop_age:.0f} s ago"
        reason = f"no loop runs for this replica (last beat: {since})"
        return jsonify(status="not ready", reason=reason, **body), 503
    return jsonify(status="ready", **body)
