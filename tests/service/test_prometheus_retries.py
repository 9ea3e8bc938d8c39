"""What the Prometheus adapter adds to prometheus-api-client, over HTTP: busy answers retried,
bad queries not, and Prometheus' own error text in the message. Prometheus is a small HTTP
server here answering a script (the lab tests run the adapter against the real one)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse

import pytest

from webhook.adapters.prometheus import Prometheus, PrometheusError

VECTOR = {"status": "success", "data": {"resultType": "vector", "result": []}}


class Scripted(ThreadingHTTPServer):
    script: list[tuple[int, Any]]  # (status, body) per request; the last one repeats
    requests: list[tuple[str, dict[str, list[str]]]]


class Handler(BaseHTTPRequestHandler):
    server: Scripted

    def do_GET(self) -> None:
        url = urlparse(self.path)
        self.server.requests.append((url.path, parse_qs(url.query)))
        status, body = self.server.script[
            min(len(self.server.requests), len(self.server.script)) - 1
        ]
        data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def prom() -> Iterator[Scripted]:
    server = Scripted(("127.0.0.1", 0), Handler)
    server.requests = []
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.shutdown()
    server.server_close()


def url(server: Scripted) -> str:
    return f"http://127.0.0.1:{server.server_address[1]}"


def busy(error: str = "query queue full") -> tuple[int, Any]:
    return 503, {"status": "error", "errorType": "unavailable", "error": error}


def test_a_busy_answer_is_retried(prom: Scripted) -> None:
    prom.script = [busy(), (200, VECTOR)]
    assert Prometheus(url(prom)).query("up") == []
    assert len(prom.requests) == 2


def test_busy_to_the_end_is_prometheus_error_after_the_retries(prom: Scripted) -> None:
    prom.script = [busy("too many queries")]
    with pytest.raises(PrometheusError, match=rf"^{url(prom)}: too many queries$"):
        Prometheus(url(prom), retries=1).query("up")
    assert len(prom.requests) == 2


def test_a_bad_query_is_not_retried_and_reads_as_prometheus_says(prom: Scripted) -> None:
    error = "1:4: parse error: unexpected end of input inside braces"
    prom.script = [(400, {"status": "error", "errorType": "bad_data", "error": error})]
    with pytest.raises(PrometheusError, match=rf"^{url(prom)}: {error}$"):
        Prometheus(url(prom)).query("up{")
    assert len(prom.requests) == 1


@pytest.mark.parametrize(
    ("answer", "message"),
    [
        ((502, "<html>bad gateway</html>"), "HTTP 502$"),
        ((200, "not json"), "not an answer of Prometheus' API"),
        ((200, {"status": "success"}), "not an answer of Prometheus' API"),
        ((200, {"status": "success", "data": {"result": [0, "1"]}}), "expected a vector for 'up'"),
    ],
)
def test_what_is_not_an_answer_is_named(
    prom: Scripted, answer: tuple[int, Any], message: str
) -> None:
    prom.script = [answer]
    with pytest.raises(PrometheusError, match=message):
        Prometheus(url(prom), retries=0).query("up")


def test_instant_and_range_queries_ask_what_they_are_given(prom: Scripted) -> None:
    at = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
    matrix = {
        "status": "success",
        "data": {"resultType": "matrix", "result": [{"metric": {}, "values": [[1, "1"]]}]},
    }
    prom.script = [(200, VECTOR), (200, matrix)]
    p = Prometheus(url(prom))
    p.query("up", at)
    assert p.query_range("up", at - timedelta(hours=1), at, timedelta(seconds=30)) == [
        {"metric": {}, "values": [[1, "1"]]}
    ]
    (path1, q1), (path2, q2) = prom.requests
    assert path1 == "/api/v1/query" and q1 == {"query": ["up"], "time": [str(at.timestamp())]}
    assert path2 == "/api/v1/query_range"
    assert q2 == {
        "query": ["up"],
        "start": [str(int(at.timestamp()) - 3600)],
        "end": [str(int(at.timestamp()))],
        "step": ["30"],
    }
