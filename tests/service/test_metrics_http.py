"""`/metrics` of a real `slurmedic serve` (gunicorn, two workers): request counts add up across
workers, and the ledger's decisions, executions and recoveries show as the documented series."""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from tests.local_server import Server, start_server, stop_server
from tests.service.test_webhook_http import payload
from webhook.core.decisions import Decision
from webhook.core.recovery import FailurePoint, Verdict, Watch
from webhook.ledger.settings import Breaker, Heartbeat, Jobs, JobSeen, Nodes, NodeSeen
from webhook.ledger.store import Ledger


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    s = start_server(tmp_path_factory.mktemp("metrics"))
    yield s
    stop_server(s.proc)


def scrape(server: Server) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    text = requests.get(f"{server.url}/metrics", timeout=10).text
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }


def value(
    samples: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: str
) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def test_webhook_requests_and_alerts_are_counted_across_workers(server: Server) -> None:
    before = scrape(server)
    for i in range(6):  # a connection each: gunicorn hands them to either worker
        assert server.post(payload(node=f"gpu{i:02d}")).status_code == 200
    assert server.post(payload(node="gpu00")).status_code == 200  # a re-delivery
    assert server.post(None, raw=b"{not json").status_code == 400
    after = scrape(server)

    def grew(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert grew("slurmedic_webhook_requests_total", code="200") == 7
    assert grew("slurmedic_webhook_requests_total", code="400") == 1
    assert grew("slurmedic_webhook_alerts_total", outcome="new") == 6
    assert grew("slurmedic_webhook_alerts_total", outcome="duplicate") == 1
    assert grew("slurmedic_webhook_request_duration_seconds_count") == 8


def test_decisions_executions_and_recoveries_from_the_ledger(server: Server) -> None:
    ledger = Ledger(server.db)
    t0 = datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=10)
    ev = ({"alertname": "GpuXidNodeFault", "node": "gpu03", "fingerprint": "f",
           "startsAt": t0.strftime("%Y-%m-%dT%H:%M:%SZ")},)  # fmt: skip
    common = {"incident": "77.0", "job": 77, "cause": "gpu_hardware", "evidence": ev}
    drain, requeue = ledger.record(
        [
            Decision(at=t0 + timedelta(seconds=7), action="drain", nodes=("gpu03",), reason="r",
                     mode="enforce", state="pending", **common),  # type: ignore[arg-type]
            Decision(at=t0 + timedelta(seconds=7), action="requeue", exclude=("gpu03",),
                     reason="r", mode="enforce", state="pending", **common),  # type: ignore[arg-type]
        ]
    )  # fmt: skip
    ledger.add_event(drain, "executed", {"by": "test"}, t0 + timedelta(seconds=9))
    ledger.add_event(requeue, "failed", {"by": "test"}, t0 + timedelta(seconds=12))
    watch = Watch("77.0", 77, 0, "gpu_hardware", t0, t0 + timedelta(seconds=12),
                  FailurePoint(120, 100, 45.0))  # fmt: skip
    ledger.watch(watch)
    ledger.conclude("77.0", Verdict("recovered", "ok", restored_seconds=150), t0)
    ledger.put(Breaker(open=True, opened_at=t0), t0)
    ledger.put(Heartbeat(at=1234.5), t0)
    ledger.put(Jobs({"77": JobSeen(partition="train", restarts=1, eligible=True)}), t0)
    nodes = {
        "gpu03": NodeSeen(status="down*", partitions=["train", "debug"]),
        "gpu04": NodeSeen(status="allocated", partitions=["train"]),
    }
    ledger.put(Nodes(nodes), t0)
    m = scrape(server)
    assert value(m, "slurmedic_decisions_total", action="drain", cause="gpu_hardware",
                 mode="enforce") == 1  # fmt: skip
    assert value(m, "slurmedic_decisions_in_state", action="requeue", cause="gpu_hardware",
                 mode="enforce", state="failed") == 1  # fmt: skip
    assert value(m, "slurmedic_executor_runs_total", action="drain", outcome="executed") == 1
    assert value(m, "slurmedic_executor_runs_total", action="requeue", outcome="failed") == 1
    # Series for what has not happened yet exist at zero (increase() sees the first event).
    assert (
        "slurmedic_executor_runs_total",
        frozenset({("action", "stop"), ("outcome", "failed")}),
    ) in m
    assert value(m, "slurmedic_recovery_latency_seconds_count", action="stop") == 0
    # Fault (startsAt) to the drain executed: 9 s, in the 10 s bucket, not in the 5 s one.
    assert value(m, "slurmedic_recovery_latency_seconds_bucket", action="drain", le="10.0") == 1
    assert value(m, "slurmedic_recovery_latency_seconds_bucket", action="drain", le="5.0") == 0
    assert value(m, "slurmedic_recovery_latency_seconds_sum", action="drain") == 9
    assert value(m, "slurmedic_decision_latency_seconds_count") == 2
    assert value(m, "slurmedic_recoveries_total", outcome="recovered") == 1
    assert value(m, "slurmedic_recoveries_total", outcome="failed") == 0
    assert value(m, "slurmedic_time_to_restore_seconds_sum") == 150
    assert value(m, "slurmedic_work_lost_seconds_sum") == 45
    assert value(m, "slurmedic_breaker_open") == 1
    assert value(m, "slurmedic_monitor_switch") == 0
    assert value(m, "slurmedic_loop_last_tick_timestamp_seconds") == 1234.5
    assert value(m, "slurmedic_job_eligible", slurm_job_id="77", partition="train") == 1
    assert value(m, "slurmedic_job_restarts", slurm_job_id="77") == 1
    # The node states the loop published, one series a partition (slurm_node_status' shape).
    status = {dict(labels)["partition"]: dict(labels) for name, labels in m
              if name == "slurmedic_node_status" and dict(labels)["node"] == "gpu03"}  # fmt: skip
    assert set(status) == {"train", "debug"} and status["debug"]["status"] == "down*"
    assert (
        value(m, "slurmedic_node_status", node="gpu04", status="allocated", partition="train") == 1
    )


def test_metrics_need_no_credentials_and_say_their_type(server: Server) -> None:
    r = requests.get(f"{server.url}/metrics", timeout=10)
    assert r.status_code == 200 and r.headers["Content-Type"].startswith("text/plain")
    assert "# TYPE slurmedic_decisions_total counter" in r.text


DOCS = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"


def documented() -> dict[str, str]:
    """docs/metrics.md's table: each family's name (a counter's without `_total`, as
    prometheus-client parses it) and type."""
    rows = re.findall(r"^\| `(slurmedic_[a-z_]+)` \| ([a-z]+) \|", DOCS.read_text(), re.M)
    return {(n.removesuffix("_total") if t == "counter" else n): t for n, t in rows}


def test_the_series_are_the_documented_ones(server: Server) -> None:
    text = requests.get(f"{server.url}/metrics", timeout=10).text
    served = {fam.name: fam.type for fam in text_string_to_metric_families(text)}
    assert served == documented()
    assert len(served) >= 30
