"""The Flask application: the Alertmanager webhook and health endpoints.

The webhook only authenticates, validates and persists (then answers); the live loop does the
rest from the ledger, so a slow decision never delays Alertmanager and a crash after the 2xx
loses nothing.
"""

from __future__ import annotations

from typing import Any

from flask import Flask, jsonify, render_template, request
from werkzeug.exceptions import HTTPException

from webhook.ledger.settings import Heartbeat
from webhook.ledger.store import Ledger
from webhook.service.config import ServiceConfig

HEADER_FIELD_LIMIT = 8190  # bytes of one header field, name and value (gunicorn's default)


def create_app(config: ServiceConfig, ledger: Ledger | None = None) -> Flask:
    from webhook.app.alerts import alerts
    from webhook.app.health import health
    from webhook.app.metrics import metrics

    app = Flask("slurmedic")
    app.config["MAX_CONTENT_LENGTH"] = config.max_body_bytes
    token, basic = config.auth.secrets()
    # A loop that has not beaten for this long is not running (/readyz); the leader's loop
    # writes its last step every Heartbeat.EVERY on top of that.
    loop_stale = max(config.replicas.lease_seconds, 3 * config.tick_seconds)
    app.extensions["slurmedic"] = {
        "ledger": ledger or Ledger(config.database_url),
        "token": token,
        "basic": basic,
        "metrics_ttl": config.metrics_cache_seconds,
        "replica": config.replica_name(),
        "loop_stale": loop_stale,
        "tick_stale": loop_stale + Heartbeat.EVERY,
        # A view of the cluster older than this is stale (a few refreshes missed).
        "view_stale": max(30.0, 6 * config.cluster.refresh_seconds),
        # The console times a drill before a job's next checkpoint from its reported ones.
        "prometheus_url": config.verification.prometheus_url,
    }

    @app.before_request
    def header_fields() -> Any:
        for name, value in request.headers.items():
            if len(name) + len(value) + 2 > HEADER_FIELD_LIMIT:
                reason = f"header field {name[:64]!r} is over {HEADER_FIELD_LIMIT} bytes"
                return jsonify(error="Request Header Fields Too Large", reason=reason), 431
        return None

    app.register_blueprint(alerts)
    app.register_blueprint(health)
    app.register_blueprint(metrics)
    app.extensions["slurmedic"]["console"] = config.console
    if config.console.enabled:
        from flask_wtf.csrf import CSRFProtect

        from webhook.app.console import console

        app.secret_key = config.console.secret_key()
        app.config.update(
            SESSION_COOKIE_HTTPONLY=True,
            SESSION_COOKIE_SAMESITE="Lax",
            SESSION_COOKIE_SECURE=config.console.public_url.startswith("https://"),
            WTF_CSRF_TIME_LIMIT=None,  # a token lasts the session: a review can take a while
        )
        csrf = CSRFProtect(app)
        # Alertmanager posts with its bearer token, never a browser's cookie.
        csrf.exempt(alerts)
        app.register_blueprint(console)

    @app.errorhandler(HTTPException)
    def http_error(e: HTTPException):  # type: ignore[no-untyped-def]
        # Every error a client can cause is a 4xx with a reason: a page in the console, JSON
        # everywhere else.
        if request.blueprint == "console" or request.path.startswith("/console/"):
            page = render_template(
                "console/error.html", code=e.code, name=e.name, reason=e.description
            )
            return page, e.code
        return jsonify(error=e.name, reason=e.description), e.code

    return app
