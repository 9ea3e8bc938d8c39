"""`/metrics`: slurmedic's own figures for Prometheus.

Two sources. What happens inside a webhook worker (requests, alerts, time to answer) is counted
in the worker, with prometheus-client's multiprocess mode under gunicorn (`slurmedic serve` sets
`PROMETHEUS_MULTIPROC_DIR`). Everything else - decisions, executions, recoveries, the breaker,
the loop's heartbeat, the jobs it sees - is read from the ledger at scrape time: the ledger is
the one truth every process shares, and it survives restarts, so counters never go backwards.
Names and meanings: docs/metrics.md.
"""

from __future__ import annotations

import bisect
import logging
import math
import os
import struct
import threading
import time
from collections import Counter as Tally
from collections.abc import Iterable, Iterator, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from flask import Blueprint, Response, current_app, g
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
    multiprocess,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

from webhook.core.lifecycle import EXECUTED, FAILED
from webhook.core.repair_view import awaiting_replacement
from webhook.core.repairs import REPLACE, STRENGTH, UNDER_WAY
from webhook.core.verdicts import JUDGEMENTS
from webhook.ledger.figures import DecisionCount, Figures, Outcomes, Recovery, RepairFigures
from webhook.ledger.review import node_records
from webhook.ledger.settings import (
    Breaker,
    CorruptSetting,
    Heartbeat,
    Jobs,
    Modes,
    Nodes,
    S,
    Switch,
    Unmatched,
    ViewSeen,
)
from webhook.ledger.store import Ledger

metrics = Blueprint("metrics", __name__)
log = logging.getLogger("slurmedic.metrics")

REQUESTS = Counter(
    "slurmedic_webhook_requests", "Webhook requests answered, by HTTP status.", ["code"]
)
ALERTS = Counter(
    "slurmedic_webhook_alerts",
    "Alerts received: new events, re-deliveries, resolved.",
    ["outcome"],
)
DURATION = Histogram(
    "slurmedic_webhook_request_duration_seconds",
    "Time from a webhook request's arrival to its answer (the ledger write included).",
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
)
# Series that exist from the start, at zero: increase() and rate() cannot see the first event
# of a series that appears with it.
for _code in ("200", "400", "401", "413", "503"):
    REQUESTS.labels(_code)
for _outcome in ("new", "duplicate", "resolved"):
    ALERTS.labels(_outcome)
RUN_ACTIONS = ("drain", "requeue", "stop", "resume")
# What a repair under way may be doing: every plan but replacement (that goes to a person).
PLANS_UNDER_WAY = tuple(p for p in STRENGTH if p != "replace")
# Fault to decision, to action, to productive training again: seconds to hours.
LATENCY_BUCKETS = tuple(
    float(b) for b in (1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1200, 1800, 3600, 7200, 14400)
)
# Drain to back in service: a GPU reset takes minutes, a reboot and its check an hour, a node
# waiting for a long job to end or for its turn in repair days.
RETURN_BUCKETS = tuple(
    float(b)
    for b in (300, 600, 1200, 1800, 3600, 7200, 14400, 28800, 43200, 86400, 172800, 345600, 604800)
)


def timed(bp: Blueprint) -> None:
    """Count and time every request of a blueprint (the webhook's)."""

    @bp.before_request
    def _start() -> None:
        g.slurmedic_started = time.perf_counter()

    @bp.after_request
    def _done(resp: Response) -> Response:
        REQUESTS.labels(str(resp.status_code)).inc()
        DURATION.observe(time.perf_counter() - g.get("slurmedic_started", time.perf_counter()))
        return resp


def count_alerts(new: int, duplicates: int, resolved: int) -> None:
    for outcome, n in (("new", new), ("duplicate", duplicates), ("resolved", resolved)):
        if n:
            ALERTS.labels(outcome).inc(n)


def _histogram(
    name: str,
    doc: str,
    samples: Iterable[tuple[tuple[str, ...], float]],
    labels: list[str],
    always: Iterable[tuple[str, ...]] = (),
    bounds: Sequence[float] = LATENCY_BUCKETS,
) -> HistogramMetricFamily:
    """A histogram from stored values; `always`: label sets shown (at zero) with no values."""
    always = list(always)
    fam = HistogramMetricFamily(name, doc, labels=labels)
    by_labels: dict[tuple[str, ...], list[float]] = {}
    for key, value in samples:
        by_labels.setdefault(key, []).append(max(value, 0.0))
    for key, values in sorted(by_labels.items()):
        values.sort()
        buckets = [(str(b), bisect.bisect_right(values, b)) for b in bounds]
        buckets.append(("+Inf", len(values)))
        fam.add_metric(list(key), buckets, sum(values))
    for key in [(), *always] if not labels else always:
        if key not in by_labels:
            fam.add_metric(list(key), [(str(b), 0) for b in bounds] + [("+Inf", 0)], 0)
    return fam


class LedgerCollector(Collector):
    """The ledger's figures, read at most every `ttl` seconds per worker (a scrape storm on the
    unauthenticated /metrics must not become a query storm on the ledger)."""

    def __init__(self, ledger: Ledger, ttl: float = 10.0, replica: str = "") -> None:
        self.ledger, self.ttl, self.replica = ledger, ttl, replica
        self.cached: tuple[float, list[Any]] | None = None
        self.lock = threading.Lock()

    def collect(self) -> Iterator[Any]:
        with self.lock:
            if self.cached is None or time.monotonic() - self.cached[0] >= self.ttl:
                self.cached = (time.monotonic(), list(self._read()))
            yield from self.cached[1]

    def _read(self) -> Iterator[Any]:
        fig = self.ledger.figures()
        yield from self._decisions(fig.decisions, fig.outcomes)
        yield _histogram(
            "slurmedic_decision_latency_seconds",
            "From the fault (the first alert's startsAt) to the incident's decisions.",
            (((), (t.decided_at - t.fault_at).total_seconds()) for t in fig.timings),
            [],
        )
        yield _histogram(
            "slurmedic_recovery_latency_seconds",
            "From the fault to the drain, requeue or stop executed on Slurm.",
            (
                ((t.action,), (t.executed_at - t.fault_at).total_seconds())
                for t in fig.timings
                if t.executed_at is not None and t.action in ("drain", "requeue", "stop")
            ),
            ["action"],
            always=[("drain",), ("requeue",), ("stop",)],
        )
        yield from self._recoveries(fig.recoveries)
        drills = GaugeMetricFamily(
            "slurmedic_drills",
            "Recovery drills by outcome: asked, refused, watching, passed, failed, unverified "
            "(apart from every figure of real recoveries).",
            labels=["outcome"],
        )
        for outcome, n in fig.drills.items():
            drills.add_metric([outcome], n)
        yield drills
        yield from self._repairs(fig.repairs)
        yield from self._review(fig)
        yield from self._nodes()
        yield from self._settings()
        yield from self._leadership()

    def _leadership(self) -> Iterator[Any]:
        """Which replica leads: this one's view, so every replica's /metrics says it."""
        leader = self.ledger.leases.leader()
        leading = leader is not None and leader.running == self.replica
        fam = GaugeMetricFamily(
            "slurmedic_replica_leading",
            "1 while this replica leads (decides and executes), 0 while it follows.",
            labels=["replica"],
        )
        fam.add_metric([self.replica], int(leading))
        yield fam
        yield GaugeMetricFamily(
            "slurmedic_leader_term",
            "The fencing token of the leader's current term (0: no term yet); it rises by one "
            "at every takeover.",
            value=leader.token if leader is not None else 0,
        )

    @staticmethod
    def _review(fig: Figures) -> Iterator[Any]:
        """The human side: approvals waiting, escalations nobody judged, the trial's verdicts."""
        yield GaugeMetricFamily(
            "slurmedic_approvals_waiting",
            "Decisions awaiting a human's approval.",
            value=len(fig.waiting_since),
        )
        now = datetime.now(UTC)
        oldest = min(fig.waiting_since, default=None)
        yield GaugeMetricFamily(
            "slurmedic_approval_oldest_age_seconds",
            "How long the oldest decision awaiting approval has waited (0: none waits).",
            value=(now - oldest).total_seconds() if oldest else 0.0,
        )
        yield GaugeMetricFamily(
            "slurmedic_escalations_open",
            "Escalations nobody has recorded a verdict on yet.",
            value=fig.open_escalations,
        )
        mismatches = CounterMetricFamily(
            "slurmedic_action_mismatches",
            "Runs after which Slurm showed otherwise than decided (a double requeue, a drain "
            "whose reason is not its own), by action.",
            labels=["action"],
        )
        found = {m.action: m.n for m in fig.mismatches}
        for action in RUN_ACTIONS:
            mismatches.add_metric([action], found.get(action, 0))
        yield mismatches
        fam = GaugeMetricFamily(
            "slurmedic_verdicts",
            "Decisions by their operator's latest verdict (agree, disagree, unsure), by action.",
            labels=["action", "verdict"],
        )
        # Every action that changes Slurm and every judgement, 0 until judged: the series exist
        # from the start (a trial's agreement reads "no verdicts yet", not "no data").
        counts: dict[tuple[str, str], int] = {
            (a, j): 0 for a in (*RUN_ACTIONS, "escalate") for j in JUDGEMENTS
        }
        for v in fig.verdicts:
            counts[(v.action, v.verdict)] = v.n
        for (action, judgement), n in sorted(counts.items()):
            fam.add_metric([action, judgement], n)
        yield fam

    @staticmethod
    def _decisions(rows: Sequence[DecisionCount], runs: Sequence[Outcomes]) -> Iterator[Any]:
        total = CounterMetricFamily(
            "slurmedic_decisions",
            "Decisions recorded, by action, cause and mode.",
            labels=["action", "cause", "mode"],
        )
        now = GaugeMetricFamily(
            "slurmedic_decisions_in_state",
            "Decisions by their current state.",
            labels=["action", "cause", "mode", "state"],
        )
        tally: Tally[tuple[str, str, str]] = Tally()
        for r in rows:
            tally[(r.action, r.cause, r.mode)] += r.n
            now.add_metric([r.action, r.cause, r.mode, r.state], r.n)
        for key, n in sorted(tally.items()):
            total.add_metric(list(key), n)
        yield total
        yield now
        fam = CounterMetricFamily(
            "slurmedic_executor_runs",
            "Playbook runs that changed (or failed to change) Slurm, by action and outcome.",
            labels=["action", "outcome"],
        )
        counts = {(a, o): 0 for a in RUN_ACTIONS for o in (EXECUTED, FAILED)}
        for run in runs:
            if run.action in RUN_ACTIONS:
                counts[(run.action, run.state)] = run.n
        for (action, outcome), n in sorted(counts.items()):
            fam.add_metric([action, outcome], n)
        yield fam

    @staticmethod
    def _recoveries(rows: Sequence[Recovery]) -> Iterator[Any]:
        outcomes = CounterMetricFamily(
            "slurmedic_recoveries",
            "Requeued jobs whose successor made progress again (recovered), did not (failed), or "
            "could not be judged (unverified).",
            labels=["outcome"],
        )
        tally = Tally(r.state for r in rows)
        for outcome in ("recovered", "failed", "unverified"):
            outcomes.add_metric([outcome], tally[outcome])
        yield outcomes
        yield GaugeMetricFamily(
            "slurmedic_recoveries_watching",
            "Requeued jobs whose successor is being watched.",
            value=tally["watching"],
        )
        yield _histogram(
            "slurmedic_time_to_restore_seconds",
            "From the fault until the successor passed the step at failure.",
            (((), r.restored_seconds) for r in rows if r.restored_seconds is not None),
            [],
        )
        yield _histogram(
            "slurmedic_work_lost_seconds",
            "Training done since the last checkpoint when the job failed (lost with it).",
            (((), r.work_lost_seconds) for r in rows if r.work_lost_seconds is not None),
            [],
        )

    def _repairs(self, fig: RepairFigures) -> Iterator[Any]:
        """The repairs of the nodes slurmedic drained: where they stand, how long a node took
        to return to service, and the nodes a person must replace."""
        fam = GaugeMetricFamily(
            "slurmedic_repairs",
            "Repairs of nodes slurmedic drained, by state, plan and the cause of the drain: "
            "every one under way (waiting, repairing, checking, resuming), the others begun "
            "within the last 7 days.",
            labels=["state", "plan", "cause"],
        )
        # The states the Recovery dashboard draws exist from the start, at zero and with no
        # cause (an empty label is no label to Prometheus): under way, by every plan that has
        # steps, and replace, by every plan: a panel shows none rather than no data.
        counts = {(state, plan, ""): 0 for state in UNDER_WAY for plan in PLANS_UNDER_WAY}
        counts.update({(REPLACE, plan, ""): 0 for plan in STRENGTH})
        counts.update(fig.by_state)
        for key, n in sorted(counts.items()):
            fam.add_metric(list(key), n)
        yield fam
        yield _histogram(
            "slurmedic_repair_return_seconds",
            "From a node's drain to its return to service (its repair's resume executed), of "
            "the repairs begun within the last 7 days.",
            (((), s) for s in fig.returned),
            [],
            bounds=RETURN_BUCKETS,
        )
        view = self._setting(Nodes).root
        yield GaugeMetricFamily(
            "slurmedic_nodes_awaiting_replacement",
            "Nodes whose latest repair sent them to a person for replacement and that the "
            "loop's cluster view does not show back in service.",
            value=sum(
                awaiting_replacement(REPLACE, seen.status if (seen := view.get(n)) else None)
                for n in fig.replace
            ),
        )

    def _nodes(self) -> Iterator[Any]:
        """Each node's failures within the policy's repeats window, and the suspects: a series
        only for a node that failed (a fleet of thousands of nodes has a few lemons)."""
        modes = self._setting(Modes)
        since = datetime.now(UTC) - timedelta(seconds=modes.repeats_window_seconds)
        failures = GaugeMetricFamily(
            "slurmedic_node_failures",
            "A node's failures within the policy's repeats window: its drains for its own "
            "faults and the application XIDs on its GPUs.",
            labels=["node"],
        )
        suspect = GaugeMetricFamily(
            "slurmedic_node_suspect",
            "1 for a node whose failures repeat within the repeats window (a hardware "
            "suspect: replace or return it rather than resume it).",
            labels=["node"],
        )
        for r in node_records(self.ledger, since):
            failures.add_metric([r.node], r.failures)
            suspect.add_metric([r.node], 1.0 if r.suspect else 0.0)
        yield failures
        yield suspect

    def _setting(self, kind: type[S]) -> S:
        """A setting, or its defaults when it is corrupt (said in the log): one bad row must
        not take every other series down with it."""
        try:
            return self.ledger.setting(kind)
        except CorruptSetting as e:
            log.error("/metrics: %s", e)
            return kind()

    def _settings(self) -> Iterator[Any]:
        yield GaugeMetricFamily(
            "slurmedic_breaker_open",
            "1 while the circuit breaker holds drains (until a human resets it).",
            value=1 if self._setting(Breaker).open else 0,
        )
        yield GaugeMetricFamily(
            "slurmedic_monitor_switch",
            "1 while the global switch holds every action in monitor mode.",
            value=1 if self._setting(Switch).monitor else 0,
        )
        # 0 until the loop first reports: a loop that never starts is stalled too.
        yield GaugeMetricFamily(
            "slurmedic_loop_last_tick_timestamp_seconds",
            "When the decision loop last completed a step (0: never).",
            value=self._setting(Heartbeat).at,
        )
        view = self._setting(ViewSeen)
        yield GaugeMetricFamily(
            "slurmedic_cluster_view_age_seconds",
            "How old the loop's view of the cluster is: since it last read Slurm successfully "
            "(+Inf: never).",
            value=time.time() - view.at if view.at else math.inf,
        )
        yield GaugeMetricFamily(
            "slurmedic_slurm_up",
            "1 when the loop's last read of Slurm succeeded, 0 while it fails (its log and "
            "/readyz say what Slurm answered).",
            value=0 if view.slurm_error or not view.at else 1,
        )
        unmatched = self._setting(Unmatched)
        yield CounterMetricFamily(
            "slurmedic_alerts_unmatched",
            "Alerts whose host is no node of the cluster: never acted on (node_names maps "
            "host names to Slurm's).",
            value=unmatched.alerts,
        )
        yield GaugeMetricFamily(
            "slurmedic_unmatched_hosts",
            "Hosts alerts named that are no node of the cluster (the last 100 kept).",
            value=len(unmatched.hosts),
        )
        eligible = GaugeMetricFamily(
            "slurmedic_job_eligible",
            "1 while the job is eligible to run (running, or waiting again after a requeue).",
            labels=["slurm_job_id", "partition"],
        )
        restarts = GaugeMetricFamily(
            "slurmedic_job_restarts", "Slurm's restart count of the job.", labels=["slurm_job_id"]
        )
        for job, seen in sorted(self._setting(Jobs).root.items()):
            eligible.add_metric([job, seen.partition], int(seen.eligible))
            restarts.add_metric([job], seen.restarts)
        yield eligible
        yield restarts
        status = GaugeMetricFamily(
            "slurmedic_node_status",
            "Always 1: the node's state as Slurm reports it (sinfo's long state, `*` when it "
            "does not respond), per partition; the same shape as the Slurm exporter's "
            "slurm_node_status.",
            labels=["node", "status", "partition"],
        )
        for node, info in sorted(self._setting(Nodes).root.items()):
            for partition in info.partitions or [""]:
                status.add_metric([node, info.status, partition], 1)
        yield status


def _registry(ledger: Ledger, ttl: float, replica: str) -> CollectorRegistry:
    registry = CollectorRegistry()
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
    else:
        for c in (REQUESTS, ALERTS, DURATION):
            registry.register(c)
    registry.register(LedgerCollector(ledger, ttl, replica))
    return registry


@metrics.get("/metrics")
def scrape() -> Response:
    ext = current_app.extensions["slurmedic"]
    if "registry" not in ext:
        ext["registry"] = _registry(
            ext["ledger"], ext.get("metrics_ttl", 10.0), ext.get("replica", "")
        )
    for _ in range(5):
        try:
            return Response(generate_latest(ext["registry"]), mimetype=CONTENT_TYPE_LATEST)
        except struct.error:
            # prometheus-client's multiprocess mode: another worker has just created its value
            # file and not yet written its header (an empty file for microseconds). Read again.
            time.sleep(0.02)
    return Response(generate_latest(ext["registry"]), mimetype=CONTENT_TYPE_LATEST)
