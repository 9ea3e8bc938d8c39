"""/healthz (the process answers) and /readyz (it can write what it receives)."""

from __future__ import annotations

from typing import Any

from flask import Blueprint, current_app, jsonify
from sqlalchemy.exc import SQLAlchemyError

health = Blueprint("health", __name__)


@health.get("/healthz")
def healthz() -> Any:
    return jsonify(status="ok")


@health.get("/readyz")
def readyz() -> Any:
    try:
        current_app.extensions["slurmedic"]["ledger"].ping()
    except SQLAlchemyError as e:
        return jsonify(status="not ready", reason=str(e).splitlines()[0]), 503
    return jsonify(status="ready")
