"""The verifier in the live loop's place: opening watches from executed requeues, judging them
from Prometheus' answers, and riding out a Prometheus that answers nonsense. Prometheus is a
small HTTP server here serving the API's JSON (the lab tests use the real one)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

import pytest

from webhook.adapters.prometheus import Prometheus
from webhook.core.cluster import ClusterView, Job
from webhook.core.decisions import Decision, GuardState
from webhook.core.engine import Engine
from webhook.core.policy import load_policy
from webhook.ledger.store import Ledger
from webhook.service.verify import Verifier

T0 = datetime(2026, 11, 30, 3, 0, tzinfo=UTC)
NOW = T0 + timedelta(minutes=5)  # the verifiers' clock: fixed, whatever the suite's length


class FakePrometheus(ThreadingHTTPServer):
    answer: Any = None  # the JSON body to send
    queries: list[dict[str, list[str]]]


class Handler(BaseHTTPRequestHandler):
    server: FakePrometheus

    def do_GET(self) -> None:
        self.server.queries.append(parse_qs(urlparse(self.path).query))
        body = json.dumps(self.server.answer).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def prom() -> Iterator[FakePrometheus]:
    server = FakePrometheus(("127.0.0.1", 0), Handler)
    server.queries = []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()


def vector(*series: tuple[str, int, int, float]) -> dict[str, Any]:
    """(metric, job, rank, value) samples as Prometheus' instant-query answer."""
    return {
        "status": "success",
        "data": {
            "resultType": "vector",
            "result": [
                {
                    "metric": {"__name__": n, "slurm_job_id": str(j), "rank": str(r)},
                    "value": [0, str(v)],
                }
                for n, j, r, v in series
            ],
        },
    }


def progress(job: int, attempt: int, *steps: float) -> list[tuple[str, int, int, float]]:
    out = []
    for rank, step in enumerate(steps):
        out += [("training_attempt", job, rank, attempt), ("training_step", job, rank, step)]
    return out


def executed_requeue(ledger: Ledger, job: int) -> None:
    ev = ({"alertname": "GpuXidNodeFault", "node": "gpu01", "fingerprint": "f",
           "startsAt": T0.strftime("%Y-%m-%dT%H:%M:%SZ")},)  # fmt: skip
    (rid,) = ledger.record(
        [
            Decision(
                at=T0 + timedelta(seconds=6),
                incident=f"{job}.0",
                job=job,
                action="requeue",
                cause="gpu_hardware",
                reason="r",
                evidence=ev,
                mode="enforce",
                state="pending",
            )
        ]
    )
    ledger.add_event(rid, "running", {"by": "test"}, T0 + timedelta(seconds=7))
    ledger.add_event(rid, "executed", {"by": "test"}, T0 + timedelta(seconds=9))


def sees(engine: Engine, v: ClusterView) -> Engine:
    """The engine the verifier judges with, its cluster view `v` now."""
    engine.update_view(v)
    return engine


def afresh(verifier: Verifier, v: ClusterView) -> Engine:
    """A new engine of the verifier's policy, seeing `v`."""
    return sees(Engine(ClusterView(), verifier.policy), v)


def view(job: int, restarts: int = 1, state: str = "RUNNING") -> ClusterView:
    v = ClusterView()
    v.set_job(Job(id=job, nodes=("gpu02",), state=state, restarts=restarts,
                  started=T0 + timedelta(seconds=20)))  # fmt: skip
    return v


def watching(prom: FakePrometheus, tmp_path: Path, job: int) -> tuple[Ledger, Verifier]:
    """A ledger with an executed requeue of `job`, and an enforce-mode verifier of it."""
    ledger = Ledger(f"sqlite:///{tmp_path / 'l.db'}")
    executed_requeue(ledger, job)
    url = f"http://127.0.0.1:{prom.server_address[1]}"
    verifier = Verifier(
        ledger, Prometheus(url), load_policy({"mode": "enforce"}), clock=lambda: NOW
    )
    return ledger, verifier


def test_a_requeue_is_watched_then_verified(prom: FakePrometheus, tmp_path: Path) -> None:
    ledger, verifier = watching(prom, tmp_path, 7)
    engine = Engine(view=ClusterView(), policy=verifier.policy)
    prom.answer = vector(*progress(7, 0, 120, 118))  # the failed attempt, as of the requeue
    assert verifier.step(sees(engine, view(7))) == []
    (watch,) = ledger.watching()
    assert watch.point.step == 120 and watch.fault_at == T0
    # The failure point was read as of the run's start (before scontrol), not later.
    assert float(prom.queries[0]["time"][0]) == (T0 + timedelta(seconds=7)).timestamp()
    prom.answer = vector(*progress(7, 1, 121, 119))
    assert verifier.step(sees(engine, view(7))) == [] and ledger.watching()
    prom.answer = vector(*progress(7, 1, 125, 121))
    verifier.step(sees(engine, view(7)))
    (rec,) = ledger.recoveries("recovered")
    assert rec.restored_seconds is not None and rec.restored_seconds > 0
    assert rec.restored_seconds == (NOW - T0).total_seconds()
    assert [h.action for h in engine.guards.history] == ["recovered"]


@pytest.mark.parametrize(
    "answer",
    [
        [],
        {"status": "error", "error": "boom"},
        {"status": "success", "data": {"resultType": "scalar", "result": [0, "1"]}},
        "x",
    ],
)
def test_a_prometheus_that_answers_nonsense_judges_nothing_and_breaks_nothing(
    prom: FakePrometheus, tmp_path: Path, answer: Any
) -> None:
    ledger, verifier = watching(prom, tmp_path, 8)
    prom.answer = vector(*progress(8, 0, 50))
    verifier.step(afresh(verifier, view(8)))
    prom.answer = answer
    # The successor ended: with progress it would be a failed recovery; without, nothing yet.
    assert verifier.step(afresh(verifier, view(8, state="FAILED"))) == []
    assert len(ledger.watching()) == 1


def test_old_requeues_are_not_judged_when_verification_is_turned_on(
    prom: FakePrometheus, tmp_path: Path
) -> None:
    ledger = Ledger(f"sqlite:///{tmp_path / 'l.db'}")
    executed_requeue(ledger, 9)
    url = f"http://127.0.0.1:{prom.server_address[1]}"
    policy = load_policy({"verify": {"deadline": "1m", "pending_limit": "1m"}})
    verifier = Verifier(ledger, Prometheus(url), policy, clock=lambda: T0 + timedelta(hours=1))
    prom.answer = vector()
    assert verifier.step(afresh(verifier, view(9, state="FAILED"))) == []
    assert ledger.watching() == [] and ledger.recoveries() == []


def test_a_failed_recovery_from_the_ledger_is_counted_once_by_its_attempts_requeue(
    prom: FakePrometheus, tmp_path: Path
) -> None:
    ledger, verifier = watching(prom, tmp_path, 7)
    prom.answer = vector(*progress(7, 0, 120))
    verifier.step(afresh(verifier, view(7)))
    prom.answer = vector(*progress(7, 1, 100))
    assert verifier.step(afresh(verifier, view(7, state="FAILED")))  # 7.1 ended short of step 120
    (failed,) = [h for h in ledger.history(T0) if h.action == "recovery_failed"]
    assert failed.incident == "verify:7.0"
    guards = GuardState(history=list(ledger.history(T0)))
    assert guards.requeues(7, T0) == 2  # the requeue of 7.0, and 7.1's failure
    assert guards.requeues(7, T0, deciding="7.1") == 1  # the requeue for 7.1 is that failure
