"""`slurmedic backtest`: a site's history through the real core, beside what happened.

The named stages, in order: read the alerts (Prometheus), the jobs and the node events (Slurm
accounting) and the cluster's shape (Slurm); make the replay scenario; run the core on it as
`slurmedic replay` does; compare. Each adapter is passed in, so a test or a bench can hand in
the lab's.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from pydantic import ValidationError

from webhook import replay
from webhook.adapters.accounting import Accounting
from webhook.adapters.prometheus import Prometheus, PrometheusError
from webhook.adapters.slurm import SlurmCluster
from webhook.backtest import history
from webhook.backtest.compare import Report, compare
from webhook.core import durations
from webhook.core.policy import PolicyError, load_policy
from webhook.core.signals import SIGNALS
from webhook.core.validation import describe

# Prometheus' default evaluation interval: the gap tolerance of a rule it cannot name.
DEFAULT_INTERVAL = timedelta(minutes=1)
CHUNK = timedelta(hours=6)


class BacktestError(RuntimeError):
    """The history could not be read or replayed; the message says which part and why."""


@dataclass(frozen=True)
class Inputs:
    spans: list[history.FiringSpan]
    attempts: list[history.Attempt]
    events: list[history.NodeEvent]
    shape: history.ClusterShape
    limits: list[str]


def read(
    prometheus: Prometheus,
    accounting: Accounting,
    slurm: SlurmCluster,
    start: datetime,
    until: datetime,
    now: datetime,
) -> Inputs:
    limits: list[str] = []
    try:
        intervals = prometheus.rule_intervals()
    except PrometheusError as e:
        intervals = {}
        limits.append(f"rule intervals unknown ({e}); alert gaps judged at 1 min")
    # From a little before the span: an alert with a sample there was firing when the span
    # began (two evaluations cover any gap a firing alert leaves).
    before = 2 * max([*intervals.values(), DEFAULT_INTERVAL])
    try:
        series = prometheus.raw_samples(
            "ALERTS", {"alertstate": "firing"}, start - before, until, CHUNK
        )
    except PrometheusError as e:
        raise BacktestError(f"alert history: {e}") from e
    ours = [(labels, ts) for labels, ts in series if labels.get("signal") in SIGNALS]
    others = {labels.get("alertname", "") for labels, _ in series} - {
        labels.get("alertname", "") for labels, _ in ours
    }
    spans, earlier = history.began_in(
        history.firing_spans(ours, intervals, DEFAULT_INTERVAL, until), start
    )
    if earlier:
        limits.append(
            f"{len(earlier)} alert(s) already firing when the span began left out: earlier "
            "faults, whose answers may predate the span"
        )
    limits += _retention(prometheus, start, now)
    if others:
        names = ", ".join(sorted(others)[:5]) + (" ..." if len(others) > 5 else "")
        limits.append(f"alerts without a known `signal` left out (not slurmedic's): {names}")
    try:
        attempts = accounting.attempts(start, until)
        events = accounting.node_events(start, until)
    except RuntimeError as e:
        raise BacktestError(f"accounting: {e}") from e
    try:
        snap = slurm.snapshot()
    except RuntimeError as e:
        raise BacktestError(f"the cluster's nodes and switches: {e}") from e
    shape = history.ClusterShape(
        nodes={n.name: (n.partitions[0] if n.partitions else "", n.gpus) for n in snap.nodes},
        switches=snap.switches,
    )
    if attempts:
        first = min((a.submitted or a.started or until) for a in attempts)
        limits.append(
            f"jobs: {len(attempts)} attempt record(s) from accounting, the first submitted "
            f"{history.iso(first)}; jobs accounting has purged (PurgeJobAfter) are not in it"
        )
    else:
        limits.append("jobs: accounting holds no job record in the span")
    return Inputs(spans, attempts, events, shape, limits)


def _retention(prometheus: Prometheus, start: datetime, now: datetime) -> list[str]:
    try:
        raw = prometheus.flags().get("storage.tsdb.retention.time", "")
    except PrometheusError as e:
        return [f"Prometheus' retention unknown ({e})"]
    try:
        kept = durations.parse(raw)
    except ValueError:
        return [f"Prometheus' retention unknown ({raw!r})"]
    if kept.total_seconds() == 0:
        kept = timedelta(days=15)  # Prometheus 2's flag says 0s for its default
    edge = now - kept
    if start < edge:
        return [
            f"alerts before {history.iso(edge)} are beyond Prometheus' retention "
            f"({raw or '15d'}): that part of the span has no alerts"
        ]
    return []


# What no backtest can reconstruct from these sources, whatever the site keeps.
ALWAYS = (
    "alert annotations are not kept by Prometheus: decisions carry no summary, a hang's "
    "onset is its alert's start, and a slow job's requeue is not weighed against its checkpoint",
    "the guards' memory (retry budgets, the breaker) starts empty at the span's start",
    "attempt numbers count from the first run accounting holds for each job in the span",
    "whether a job allowed requeue is not in accounting: every job is taken to allow it",
    "recoveries are not verified (that needs the training progress of the new attempt)",
)


def run(
    inputs: Inputs,
    *,
    start: datetime,
    until: datetime,
    policy: dict[str, Any] | None,
    delay: timedelta,
    window: timedelta,
) -> tuple[Report, dict[str, Any]]:
    data = history.scenario(
        name=f"backtest-{start:%Y%m%dT%H%M}-{until:%Y%m%dT%H%M}",
        start=start,
        until=until,
        shape=inputs.shape,
        spans=inputs.spans,
        attempts=inputs.attempts,
        events=inputs.events,
        policy=policy,
        delay=delay,
    )
    try:
        hold = load_policy(policy, prefix="policy.").shared_cause.burst_wait
    except PolicyError as e:
        raise BacktestError(str(e)) from e
    # A node that stopped answering near the end is decided after its hold: the clock runs on
    # by it, with nothing more from the record.
    data["until"] = history.iso(until + hold)
    try:
        scenario = replay.Scenario.model_validate(data)
    except ValidationError as e:
        raise BacktestError(f"the history makes no valid scenario: {describe(e)}") from e
    try:
        decisions = replay.run(scenario)
    except replay.ScenarioError as e:
        raise BacktestError(str(e)) from e
    gpus_of = {n: g for n, (_, g) in inputs.shape.nodes.items()}
    report = compare(
        decisions,
        inputs.attempts,
        inputs.events,
        start=start,
        until=until,
        gpus_of=gpus_of,
        window=window,
    )
    report.limits = [*inputs.limits, *ALWAYS]
    report.sources = {
        "alerts": str(len(inputs.spans)),
        "attempts": str(len(inputs.attempts)),
        "node_events": str(len(inputs.events)),
        "nodes": str(len(inputs.shape.nodes)),
    }
    return report, data
