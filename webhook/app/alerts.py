"""POST /api/v1/alerts: Alertmanager's webhook (payload version 4)."""

from __future__ import annotations

import base64
import hmac
import json
import logging
import threading
import time
from datetime import UTC, datetime
from typing import Any

from flask import Blueprint, Response, current_app, jsonify, request
from pydantic import ValidationError

from webhook.app.metrics import count_alerts, timed
from webhook.core.alerts import Payload
from webhook.core.validation import describe
from webhook.ledger.store import Refused, Unavailable

alerts = Blueprint("alerts", __name__)
log = logging.getLogger("slurmedic.webhook")
timed(alerts)  # once, here: an app factory may run more than once in a process


def _authorized() -> bool:
    ext = current_app.extensions["slurmedic"]
    header = request.headers.get("Authorization", "")
    scheme, _, value = header.partition(" ")
    if scheme.lower() == "bearer" and ext["token"] is not None:
        return hmac.compare_digest(value.strip().encode(), ext["token"])
    if scheme.lower() == "basic" and ext["basic"] is not None:
        try:
            user, _, password = base64.b64decode(value.strip(), validate=True).partition(b":")
        except ValueError:
            return False
        want_user, want_password = ext["basic"]
        # Both compared, always, so the time taken says nothing about which was wrong.
        ok_user = hmac.compare_digest(user, want_user)
        ok_password = hmac.compare_digest(password, want_password)
        return ok_user and ok_password
    return False


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _holds_nul(value: Any) -> bool:
    """Whether a NUL character is in any string of the decoded body (PostgreSQL takes none); a
    literal text `\\u0000` is harmless and passes. A stack, not recursion: as deep as the
    parser went."""
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, str):
            if "\x00" in v:
                return True
        elif isinstance(v, dict):
            stack.extend(v.keys())
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)
    return False


def _may_hold_nul(body: bytes) -> bool:
    """Whether the decoded body may hold a NUL, from its bytes alone. Strict JSON has no raw
    control character in a string, so a NUL comes from a `\\u0000` escape: in UTF-8, those six
    ASCII bytes. A body in UTF-16 or UTF-32 (json.loads reads them too) is searched in full."""
    return json.detect_encoding(body) != "utf-8" or b"\\u0000" in body


# A refused request is logged, at most once a minute per status and sender (a client that
# keeps sending the same bad request must not flood the log); the count says how many.
REFUSED_LOG_EVERY = 60.0
_refused: dict[tuple[int, str], tuple[float, int]] = {}
_refused_lock = threading.Lock()


def _error(status: int, reason: str) -> tuple[Response, int]:
    _log_refused(status, reason)
    return jsonify(error="bad request" if status == 400 else "unauthorized", reason=reason), status


def _log_refused(status: int, reason: str) -> None:
    sender = request.remote_addr or "?"
    now = time.monotonic()
    with _refused_lock:
        last, held = _refused.get((status, sender), (-REFUSED_LOG_EVERY, 0))
        if now - last < REFUSED_LOG_EVERY:
            _refused[(status, sender)] = (last, held + 1)
            return
        if len(_refused) > 10_000:
            _refused.clear()
        _refused[(status, sender)] = (now, 0)
    more = f" ({held} more since the last line)" if held else ""
    log.warning("refused a webhook request from %s: %d %s%s", sender, status, reason[:300], more)


@alerts.post("/api/v1/alerts")
def receive() -> Any:
    if not _authorized():
        resp, status = _error(401, "missing or wrong credentials")
        resp.headers["WWW-Authenticate"] = 'Bearer realm="slurmedic"'
        return resp, status
    body = request.get_data(cache=False)  # over MAX_CONTENT_LENGTH: 413 before we read it
    try:
        raw = json.loads(body, parse_constant=_no_constants)
    except (ValueError, UnicodeDecodeError) as e:
        return _error(400, f"body is not JSON: {e}")
    except RecursionError:
        return _error(400, "body is not JSON: nested too deeply")
    if _may_hold_nul(body) and _holds_nul(raw):
        return _error(400, "body holds a NUL character, which no alert field may")
    if not isinstance(raw, dict):
        return _error(400, "body must be a JSON object (an Alertmanager v4 payload)")
    try:
        payload = Payload.model_validate(raw)
    except ValidationError as e:
        return _error(400, describe(e))
    ledger = current_app.extensions["slurmedic"]["ledger"]
    try:
        stored = ledger.store(raw, payload, datetime.now(UTC), request.remote_addr or "")
    except Refused as e:
        # The database refused a value the client sent: the client's fault, say which.
        return _error(400, f"a value cannot be stored: {e}")
    except Unavailable:
        current_app.logger.exception("ledger write failed")
        # Not the client's fault, and Alertmanager retries a 5xx: nothing is lost.
        return jsonify(error="unavailable", reason="the ledger cannot be written"), 503
    resolved = sum(1 for a in payload.alerts if a.status == "resolved")
    count_alerts(stored.new, stored.duplicates, resolved)
    return jsonify(status="stored", notification=stored.notification, new=stored.new,
                   duplicates=stored.duplicates), 200  # fmt: skip
