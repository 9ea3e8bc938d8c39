"""/healthz (the process answers) and /readyz (it can write what it receives, its loop runs, and
it can run playbooks)."""

from __future__ import annotations

import time
from typing import Any

from flask import Blueprint, current_app, jsonify
from sqlalchemy.exc import SQLAlchemyError

from webhook.executor.fitness import unfit_to_run
from webhook.ledger.settings import CorruptSetting, Heartbeat, ViewSeen
from webhook.ledger.store import Ledger, Unavailable

health = Blueprint("health", __name__)
NO_VIEW = "the loop has not read the cluster from Slurm yet"


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
    if body["leading"] and (why := _not_deciding(ledger, ext)) is not None:
        return jsonify(status="not ready", reason=why, **body), 503
    return jsonify(status="ready", **body)


def _not_deciding(ledger: Ledger, ext: dict[str, Any]) -> str | None:
    """Why the leader's loop does not decide now: it has not completed a step lately, or its
    view of the cluster is stale (Slurm's own answer, when it gave one). None: it decides."""
    try:
        beat, view = ledger.setting(Heartbeat), ledger.setting(ViewSeen)
    except CorruptSetting as e:
        return str(e)
    now = time.time()
    slurm = f": Slurm said {view.slurm_error}" if view.slurm_error else ""
    if not view.at:
        return f"{NO_VIEW}{slurm}"
    if now - view.at > ext["view_stale"]:
        return f"the cluster view is {now - view.at:.0f} s old{slurm}"
    if not beat.at or now - beat.at > ext["tick_stale"]:
        since = "never" if not beat.at else f"{now - beat.at:.0f} s ago"
        return f"the loop has not completed a step lately (last: {since})"
    return None
