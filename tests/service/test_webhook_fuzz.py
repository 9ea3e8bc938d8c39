"""A bounded fuzz of the webhook (hypothesis) against `slurmedic serve` itself: payloads near
Alertmanager's shape (odd labels, text, times at the limits, wrong types) and bytes that are
not JSON. Every answer is a 2xx or a 4xx with a reason, never a 5xx; every alert a 2xx
acknowledged is in the ledger. Requests share kept-alive connections, as Alertmanager's do."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import requests
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import select

from tests.local_server import TOKEN, Server, loop_runs, start_server, stop_server
from webhook.core.alerts import fingerprint
from webhook.ledger.schema import AlertRow
from webhook.ledger.store import Ledger


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    s = start_server(tmp_path_factory.mktemp("fuzz"))
    yield s
    stop_server(s.proc)


text = st.text(st.characters(codec="utf-8"), max_size=40)
times = st.one_of(
    st.sampled_from(
        [
            "2026-11-29T22:07:04.696Z",
            "0001-01-01T00:00:00Z",
            "0001-01-01T00:00:00+05:00",
            "9999-12-31T23:59:59-05:00",
            "2026-13-01T00:00:00Z",
            "yesterday",
        ]
    ),
    st.datetimes(timezones=st.timezones()).map(lambda d: d.isoformat()),
    text,
)
labels = st.dictionaries(
    st.sampled_from(["alertname", "node", "slurm_job_id", "signal", "gpu", "xid"]) | text,
    text | st.integers(),
    max_size=6,
)
alert = st.fixed_dictionaries(
    {"status": st.sampled_from(["firing", "resolved", "burning"]), "labels": labels},
    optional={
        "startsAt": times,
        "endsAt": times,
        "annotations": st.dictionaries(text, text, max_size=3),
        "generatorURL": text,
        "fingerprint": st.text("0123456789abcdefg", max_size=20),
    },
)
payload = st.fixed_dictionaries(
    {"status": st.sampled_from(["firing", "resolved"]), "alerts": st.lists(alert, max_size=5)},
    optional={"version": text, "groupKey": text, "truncatedAlerts": st.integers()},
)
bodies = st.one_of(
    payload.map(lambda p: json.dumps(p).encode()),
    st.binary(max_size=200),
    st.recursive(st.none() | st.booleans() | st.floats() | text, st.lists, max_leaves=20).map(
        lambda v: json.dumps(v).encode()
    ),
)


@settings(
    max_examples=2000,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(body=bodies)
def test_no_body_gets_a_5xx_and_no_acknowledged_alert_is_lost(
    server: Server, http: requests.Session, body: bytes
) -> None:
    r = http.post(
        f"{server.url}/api/v1/alerts",
        data=body,
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {TOKEN}"},
        timeout=10,
    )
    assert r.status_code in (200, 400, 413), (r.status_code, r.text, body[:300])
    assert r.json()["reason" if r.status_code != 200 else "status"]
    if r.status_code != 200:
        return
    sent: dict[str, Any] = json.loads(body)
    answer = r.json()
    assert answer["new"] + answer["duplicates"] == len(sent["alerts"])
    sent_fps = {a.get("fingerprint") or fingerprint(a["labels"]) for a in sent["alerts"]}
    with LEDGERS[server.db].session() as s:
        stored = set(
            s.scalars(select(AlertRow.fingerprint).where(AlertRow.fingerprint.in_(sent_fps)))
        )
    assert stored == sent_fps


LEDGERS: dict[str, Ledger] = {}


@pytest.fixture(scope="module")
def http(server: Server) -> Iterator[requests.Session]:
    LEDGERS[server.db] = Ledger(server.db)
    with requests.Session() as s:
        yield s


def test_the_fuzz_left_the_server_answering(server: Server) -> None:
    assert loop_runs(server.url)
