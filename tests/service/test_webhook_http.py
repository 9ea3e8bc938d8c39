"""The webhook over real HTTP: `slurmedic serve` (gunicorn) as operators run it.

Auth, 400/401/413 with reasons, unknown fields, re-deliveries, and the 2xx promise: a
notification is in the ledger before the answer (kill -9 right after it loses nothing).
"""

from __future__ import annotations

import base64
import contextlib
import copy
import json
import signal
import socket
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.lab.conftest import eventually
from tests.local_server import TOKEN, Server, serve_children, start_server, stop_server
from webhook.app.health import NO_VIEW
from webhook.ledger.store import Ledger

# Captured from Alertmanager 0.25 (shared/reference/alertmanager/), kept with the tests.
REAL = Path(__file__).resolve().parents[1] / "data" / "alertmanager"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    s = start_server(tmp_path_factory.mktemp("serve"))
    yield s
    stop_server(s.proc)


def payload(**label_overrides: str) -> dict[str, Any]:
    p: dict[str, Any] = json.loads((REAL / "real-payload-firing.json").read_text())
    p["alerts"][0]["labels"].update(label_overrides)
    p["alerts"][0]["fingerprint"] = ""  # recomputed from the labels
    return p


def test_health_and_readiness(server: Server) -> None:
    assert requests.get(f"{server.url}/healthz", timeout=5).json() == {"status": "ok"}
    tmp = Path(server.db.removeprefix("sqlite:///")).parent
    r = eventually(
        lambda: (
            (r := requests.get(f"{server.url}/readyz", timeout=5)).json()["reason"] != NO_VIEW
            and (r.status_code, r.json())
        ),
        timeout=30,
        what="the loop's first heartbeat",
    )
    assert isinstance(r, tuple)
    code, ready = r
    # One replica alone: it leads. Its loop runs, but this server has no Slurm (its slurm_conf
    # names no file): a leader that cannot see the cluster decides nothing, so it is not
    # ready, and says what Slurm's side said, at once.
    assert code == 503
    assert ready == {
        "status": "not ready",
        "replica": ready["replica"],
        "leader": ready["replica"],
        "leading": True,
        "reason": f"{NO_VIEW}: Slurm said {tmp / 'no-slurm.conf'}: no such file "
        "(SLURM_CONF, or the config's slurm_conf)",
    }
    # /metrics says the same.
    text = requests.get(f"{server.url}/metrics", timeout=5).text
    assert "slurmedic_slurm_up 0.0" in text and "slurmedic_cluster_view_age_seconds +Inf" in text


@pytest.mark.parametrize("token", [None, "wrong", TOKEN[:-1], ""])
def test_without_the_token_401(server: Server, token: str | None) -> None:
    r = server.post(payload(), token=token)
    assert r.status_code == 401
    assert r.json()["reason"] == "missing or wrong credentials"
    assert r.headers["WWW-Authenticate"].startswith("Bearer")


def test_basic_auth(server: Server) -> None:
    good = base64.b64encode(b"alertmanager:hunter2").decode()
    bad = base64.b64encode(b"alertmanager:hunter3").decode()
    assert (
        server.post(
            payload(node="gpu77"), token=None, headers={"Authorization": f"Basic {good}"}
        ).status_code
        == 200
    )
    assert (
        server.post(payload(), token=None, headers={"Authorization": f"Basic {bad}"}).status_code
        == 401
    )
    assert (
        server.post(payload(), token=None, headers={"Authorization": "Basic !!!"}).status_code
        == 401
    )


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (b"{not json", "body is not JSON"),
        (b"\xff\xfe", "body is not JSON"),
        (b"[1, 2]", "body must be a JSON object"),
        (json.dumps({"status": "firing"}).encode(), "alerts: Field required"),
        (
            json.dumps({"status": "firing", "alerts": []}).encode(),
            "alerts: List should have at least 1 item",
        ),
        (json.dumps({**payload(), "status": "burning"}).encode(), "status: Input should be"),
        (b"[" * 100_00 + b"]" * 100_00, "body is not JSON"),  # deeper than the parser goes
        (
            json.dumps(payload()).replace('"gpu": "3"', '"gpu": NaN').encode(),
            "NaN is not a JSON number",
        ),
        (json.dumps(payload()).replace("22:07:04.696Z", "22:07:04.696").encode(), "timezone"),
        (json.dumps({**payload(), "version": "3"}).encode(), "version: Input should be '4'"),
    ],
)
def test_bad_bodies_400_with_a_reason(server: Server, raw: bytes, reason: str) -> None:
    r = server.post(None, raw=raw)
    assert r.status_code == 400
    assert reason in r.json()["reason"]


def test_refused_requests_are_logged_once_a_minute_per_sender(tmp_path: Path) -> None:
    server = start_server(tmp_path)
    try:
        for token in ("wrong", "", "again wrong"):
            assert server.post(payload(), token=token).status_code == 401
        assert server.post(None, raw=b"{not json").status_code == 400
        assert server.post({**payload(), "version": "3"}).status_code == 400
    finally:
        stop_server(server.proc)
    lines = [
        line.split("slurmedic.webhook ", 1)[1]
        for line in (tmp_path / "serve.out").read_text().splitlines()
        if "refused a webhook request" in line
    ]
    # Two workers: each says what it refused first; no line repeats within a worker's minute.
    assert lines, (tmp_path / "serve.out").read_text()
    assert all(line.startswith("refused a webhook request from 127.0.0.1: 40") for line in lines), (
        lines
    )
    said = {line.split(": ", 1)[1] for line in lines}
    assert "401 missing or wrong credentials" in said
    assert len(lines) <= 4, lines  # 401 and 400, once per worker


def test_a_bad_alert_field_is_named(server: Server) -> None:
    p = payload()
    p["alerts"][0]["startsAt"] = "yesterday"
    r = server.post(p)
    assert r.status_code == 400 and r.json()["reason"].startswith("alerts.0.startsAt:")
    del p["alerts"][0]["labels"]
    p["alerts"][0]["startsAt"] = "2026-11-29T22:07:04.696Z"
    assert server.post(p).json()["reason"].startswith("alerts.0.labels: Field required")


def test_too_large_413(server: Server) -> None:
    p = payload()
    p["alerts"][0]["annotations"]["description"] = "x" * 70000
    r = server.post(p)
    assert r.status_code == 413
    assert r.json()["reason"]


def test_a_413_closes_the_connection_it_did_not_read(server: Server) -> None:
    """Its body is never read: kept alive, the client's next request would be read from the
    middle of it and dropped. The answer says so, and the server closes."""
    host, port = server.url.removeprefix("http://").split(":")
    body = b'{"a": "' + b"x" * 200_000 + b'"}'
    head = (
        f"POST /api/v1/alerts HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    with socket.create_connection((host, int(port)), timeout=10) as s:
        with contextlib.suppress(OSError):  # the server may close before it has all of it
            s.sendall(head.encode() + body + b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        answer = b""
        with contextlib.suppress(OSError):
            while chunk := s.recv(65536):  # until the server closes: it must
                answer += chunk
    status, *headers = answer.split(b"\r\n\r\n")[0].split(b"\r\n")
    assert status.startswith(b"HTTP/1.1 413")
    assert b"Connection: close" in headers
    assert requests.get(f"{server.url}/healthz", timeout=5).status_code == 200


@pytest.mark.parametrize("starts", ["0001-01-01T00:00:00+05:00", "9999-12-31T23:59:59-05:00"])
def test_a_time_outside_utc_s_range_is_400_not_500(server: Server, starts: str) -> None:
    p = payload()
    p["alerts"][0]["startsAt"] = starts
    r = server.post(p)
    assert r.status_code == 400
    assert r.json()["reason"].startswith("alerts.0.startsAt: out of range: in UTC")
    p["alerts"][0]["startsAt"] = "2026-11-29T22:07:04.696Z"
    p["alerts"][0]["endsAt"] = starts
    assert server.post(p).json()["reason"].startswith("alerts.0.endsAt: out of range")
    # Alertmanager's own zero time (an alert that has not ended) is fine.
    p["alerts"][0]["endsAt"] = "0001-01-01T00:00:00Z"
    assert server.post(p).status_code == 200


def test_a_nul_character_is_refused_and_its_literal_text_is_not(server: Server) -> None:
    p = payload()
    p["alerts"][0]["annotations"]["description"] = "a\x00b"
    r = server.post(p)
    assert r.status_code == 400 and "NUL character" in r.json()["reason"]
    p = payload()
    p["alerts"][0]["labels"]["x\x00"] = "y"
    assert server.post(p).status_code == 400
    # The six characters \u0000 in a description are text, and harmless.
    p = payload()
    p["alerts"][0]["annotations"]["description"] = "escaped: \\u0000"
    assert '"escaped: \\\\u0000"' in json.dumps(p)
    r = server.post(p)
    assert r.status_code == 200, r.text


def test_a_header_field_over_8190_bytes_is_431_with_a_reason(server: Server) -> None:
    r = server.post(payload(), headers={"X-Padding": "p" * 9000})
    assert r.status_code == 431
    assert r.json()["reason"] == "header field 'X-Padding' is over 8190 bytes"
    assert server.post(payload(), headers={"X-Padding": "p" * 8000}).status_code == 200


def test_the_sqlite_ledger_is_readable_by_its_owner_only(server: Server) -> None:
    path = Path(server.db.removeprefix("sqlite:///"))
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_unknown_fields_are_accepted(server: Server) -> None:
    p = payload(node="gpu42")
    p["notification_reason"] = "new"  # Alertmanager >= 0.32
    p["alerts"][0]["somethingNew"] = {"x": 1}
    assert server.post(p).status_code == 200


def test_redeliveries_change_nothing(server: Server) -> None:
    p = payload(node="gpu31", alertname="RedeliveryTest")
    first = server.post(p).json()
    again = server.post(copy.deepcopy(p)).json()  # an HA peer, or repeat_interval
    assert (first["new"], first["duplicates"]) == (1, 0)
    assert (again["new"], again["duplicates"]) == (0, 1)
    ledger = Ledger(server.db)
    rows = [
        a for _, _, a in ledger.alerts_after(0) if a.labels.get("alertname") == "RedeliveryTest"
    ]
    assert len(rows) == 1
    # A resolved notification of the same alert is a new event.
    resolved = copy.deepcopy(p)
    resolved["status"] = resolved["alerts"][0]["status"] = "resolved"
    resolved["alerts"][0]["endsAt"] = "2026-11-29T22:09:04.696Z"
    assert server.post(resolved).json()["new"] == 1


def test_the_2xx_means_it_is_in_the_ledger(tmp_path: Path) -> None:
    server = start_server(tmp_path)
    try:
        p = payload(node="gpu55", alertname="KillNineTest")
        r = server.post(p)
        assert r.status_code == 200
    finally:
        stop_server(server.proc, signal.SIGKILL)  # no graceful shutdown, no flush
    alerts = [a for _, _, a in Ledger(server.db).alerts_after(0)]
    assert [a.labels["alertname"] for a in alerts] == ["KillNineTest"]
    assert Ledger(server.db).notification_count() == 1


def ledger_files_open(pid: int, db: str) -> list[str]:
    path = db.removeprefix("sqlite:///")
    fds = Path(f"/proc/{pid}/fd")
    with contextlib.suppress(FileNotFoundError):  # a process that ended meanwhile
        return [t for f in fds.iterdir() if (t := str(f.readlink())).startswith(path)]
    return []


def test_the_master_keeps_no_ledger_connection_for_its_workers_to_inherit(server: Server) -> None:
    """The app is loaded once, in gunicorn's master (its workers share its pages): the ledger
    it opened there is closed before the workers fork, and a worker that answered opened its
    own."""
    assert server.post(payload(node="gpu61", alertname="ForkTest")).status_code == 200
    assert ledger_files_open(server.proc.pid, server.db) == []
    workers = serve_children(server.proc.pid, loop=False)
    assert any(ledger_files_open(w, server.db) for w in workers), workers
