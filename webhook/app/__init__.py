"""The Flask application: the Alertmanager webhook and health endpoints.

The webhook only authenticates, validates and persists (then answers); the live loop does the
rest from the ledger, so a slow decision never delays Alertmanager and a crash after the 2xx
loses nothing.
"""

from __future__ import annotations

from flask import Flask, jsonify
from werkzeug.exceptions import HTTPException

from webhook.ledger.store import Ledger
from webhook.service.config import ServiceConfig


def create_app(config: ServiceConfig, ledger: Ledger | None = None) -> Flask:
    from webhook.app.alerts import alerts
    from webhook.app.health import health
    from webhook.app.metrics import metrics, timed

    app = Flask("slurmedic")
    app.config["MAX_CONTENT_LENGTH"] = config.max_body_bytes
    token, basic = config.auth.secrets()
    app.extensions["slurmedic"] = {
        "ledger": ledger or Ledger(config.database_url),
        "token": token,
        "basic": basic,
        "metrics_ttl": config.metrics_cache_seconds,
    }
    timed(alerts)
    app.register_blueprint(alerts)
    app.register_blueprint(health)
    app.register_blueprint(metrics)

    @app.errorhandler(HTTPException)
    def http_error(e: HTTPException):  # type: ignore[no-untyped-def]
        # Every error a client can cause is a 4xx with a reason, as JSON.
        return jsonify(error=e.name, reason=e.description), e.code

    return app
