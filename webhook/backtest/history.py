"""A site's history as plain data, and the replay scenario it makes (pure: no clock, no I/O).

Three records, each from its own adapter:
- the alerts slurmedic's rules fired (Prometheus keeps them as the `ALERTS` series: one sample
  per rule evaluation while an alert fires, none once it resolves), as `FiringSpan`s;
- every attempt of every job (Slurm accounting: `sacct --duplicates`), as `Attempt`s;
- node events (Slurm accounting: `sacctmgr show event`), who took a node out of service, when
  and why, as `NodeEvent`s.

`scenario` turns them into the replay contract's format (docs/scenarios.md), so the
backtest runs the real core exactly as `slurmedic replay` does, and the scenario can be saved
and replayed on its own.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import hostlist

from webhook.core.cluster import ACTIVE_STATES, NODE_NAME

# slurmedic's drains say so (playbooks/vars/slurmedic.yml: `slurmedic: <incident> <cause>`).
SLURMEDIC_REASON = "slurmedic:"
# Reasons Slurm gives nodes itself (slurmctld's node_mgr, slurmd, the health check): not a
# person's judgement. Compared case-insensitively as prefixes.
SLURM_REASONS = (
    "not responding",
    "node unexpectedly rebooted",
    "kill task failed",
    "batch job complete failure",
    "prolog error",
    "epilog error",
    "launch failed",
    "job env setup error",
    "low realmemory",
    "low cpus",
    "low tmpdisk",
    "gres/gpu count",
    "duplicate jobid",
    "reboot",
    "nhc:",
)
SLURM_ADDED = " : "  # how Slurm joins a reason it adds to a node's earlier one


def utc(t: float) -> datetime:
    return datetime.fromtimestamp(t, UTC)


def iso(at: datetime) -> str:
    return at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def span_text(d: timedelta, *, plus: str = "") -> str:
    """A duration for people: `40 s`, `12 min`, `3.0 h`; negative with `-`, positive with
    `plus` (`+` where the sign matters)."""
    s = round(d.total_seconds())
    sign, s = ("-" if s < 0 else plus), abs(s)
    if s < 120:
        return f"{sign}{s} s"
    if s < 7200:
        return f"{sign}{s // 60} min"
    return f"{sign}{s / 3600:.1f} h"


# ---- alerts -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class FiringSpan:
    """One alert from when it fired to when it resolved, as Alertmanager would have had it."""

    labels: Mapping[str, str]
    starts_at: datetime
    last_seen: datetime
    # None: still firing when the record ends.
    resolved_at: datetime | None

    @property
    def alertname(self) -> str:
        return self.labels.get("alertname", "")


def firing_spans(
    series: Iterable[tuple[Mapping[str, str], Sequence[float]]],
    interval_of: Mapping[str, timedelta],
    default_interval: timedelta,
    record_end: datetime,
) -> list[FiringSpan]:
    """Spans from the `ALERTS{alertstate="firing"}` samples of each label set.

    A rule writes one sample per evaluation while its alert fires; a gap longer than two
    evaluations means it resolved and fired again (Alertmanager sees a new startsAt). An alert
    resolves at the evaluation after its last sample; one whose last sample is within an
    evaluation of the record's end may still fire.
    """
    spans: list[FiringSpan] = []
    for raw_labels, times in series:
        labels = {k: v for k, v in raw_labels.items() if k not in ("__name__", "alertstate")}
        interval = interval_of.get(labels.get("alertname", ""), default_interval)
        # Chunks of a split query may share a boundary sample (Prometheus 2's closed ranges).
        ordered = sorted(set(times))
        if not ordered:
            continue
        start = prev = ordered[0]
        for t in [*ordered[1:], None]:
            if t is not None and t - prev <= 2 * interval.total_seconds():
                prev = t
                continue
            resolved = utc(prev) + interval
            spans.append(
                FiringSpan(
                    labels=labels,
                    starts_at=utc(start),
                    last_seen=utc(prev),
                    resolved_at=None if resolved > record_end else resolved,
                )
            )
            if t is not None:
                start = prev = t
    spans.sort(key=lambda s: (s.starts_at, sorted(s.labels.items())))
    return spans


def began_in(
    spans: Iterable[FiringSpan], start: datetime
) -> tuple[list[FiringSpan], list[FiringSpan]]:
    """The spans that began at or after `start`, and those already firing then: an earlier
    fault, whose alert and answer may both predate the backtest's span, is not judged by it.
    Spans over before `start` are in neither."""
    kept: list[FiringSpan] = []
    earlier: list[FiringSpan] = []
    for span in spans:
        if span.starts_at >= start:
            kept.append(span)
        elif span.resolved_at is None or span.resolved_at > start:
            earlier.append(span)
    return kept, earlier


# ---- accounting -------------------------------------------------------------------------------


UNKNOWN = -1  # an attempt whose restart count accounting does not give


@dataclass(frozen=True)
class Attempt:
    """One run of a job, as accounting recorded it (a requeued job has one per run)."""

    job: int
    attempt: int  # 0 for the first run: Slurm's restart count when it started
    name: str
    user: str
    partition: str
    nodes: tuple[str, ...]
    submitted: datetime | None
    started: datetime | None
    ended: datetime | None
    state: str  # Slurm's base state: COMPLETED, FAILED, NODE_FAIL, REQUEUED, RUNNING, ...
    exit_code: int | None = None
    gpus: int = 0  # allocated GPUs (TRES gres/gpu), 0 when accounting does not track them

    @property
    def key(self) -> str:
        return f"{self.job}.{self.attempt}"


@dataclass(frozen=True)
class NodeEvent:
    """A node out of service for a while: DOWN or DRAIN, the reason, who set it."""

    node: str
    start: datetime
    end: datetime | None  # None: still out of service
    state: str  # as sacctmgr prints it: DOWN, DRAIN, IDLE+DRAIN, DOWN*+DRAIN, ...
    reason: str
    user: str

    @property
    def drained(self) -> bool:
        return "DRAIN" in self.state.upper() or "FAIL" in self.state.upper()

    @property
    def by(self) -> str:
        """Who took the node out: `slurmedic`, `slurm` (its own reasons), or `person`."""
        reason = self.reason.strip().lower()
        if reason.startswith(SLURMEDIC_REASON):
            return "slurmedic"
        # A node already out that stops answering too: Slurm adds its own reason to the one it
        # had ("bad HBM : Not responding", under the user slurmctld runs as), and the new state
        # is a new event. That event is Slurm's; the person's drain is the one before it.
        latest = reason.rsplit(SLURM_ADDED, 1)[-1]
        if not reason or any(latest.startswith(r) for r in SLURM_REASONS):
            return "slurm"
        return "person"


def number_attempts(records: Iterable[Attempt]) -> list[Attempt]:
    """Attempts in time order. A job's runs keep Slurm's restart count when accounting gives
    one to each, all different (24.11 and later); otherwise (`UNKNOWN`, or the same count
    twice: records from before the release) each is numbered by its place among its job's runs
    (accounting keeps one record per run of a requeued job, in no stated order)."""
    by_job: dict[int, list[Attempt]] = {}
    for r in records:
        by_job.setdefault(r.job, []).append(r)
    out: list[Attempt] = []
    for runs in by_job.values():
        runs.sort(key=lambda a: a.started or a.submitted or datetime.max.replace(tzinfo=UTC))
        counts = [a.attempt for a in runs]
        if UNKNOWN not in counts and len(set(counts)) == len(counts):
            out += runs
            continue
        out += [
            Attempt(**{**a.__dict__, "attempt": i}) if a.attempt != i else a
            for i, a in enumerate(runs)
        ]
    out.sort(key=lambda a: (a.started or a.submitted or datetime.max.replace(tzinfo=UTC), a.job))
    return out


# ---- the scenario -----------------------------------------------------------------------------


@dataclass(frozen=True)
class ClusterShape:
    """What does not change over the span: nodes, their partition and GPUs, the switches."""

    nodes: Mapping[str, tuple[str, int]]  # node -> (partition, gpus)
    switches: Mapping[str, tuple[str, ...]] = field(default_factory=dict)


def _node_word(state: str) -> str:
    s = state.upper()
    if "DRAIN" in s or "FAIL" in s:
        return "drain"
    if "DOWN" in s:
        return "down"
    return "idle"


def _collect(nodes: Iterable[str]) -> str:
    return str(hostlist.collect_hostlist(sorted(nodes)))


def _alert(span: FiringSpan, status: str) -> dict[str, Any]:
    labels = span.labels
    # Prometheus keeps no annotations: a summary from the labels says what fired, and where.
    where = " ".join(
        f"{k} {labels[k]}" for k in ("node", "gpu", "xid", "slurm_job_id") if labels.get(k)
    )
    alert: dict[str, Any] = {
        "status": status,
        "labels": dict(labels),
        "annotations": {"summary": f"{span.alertname} ({where})" if where else span.alertname},
        "startsAt": iso(span.starts_at),
    }
    if status == "resolved" and span.resolved_at is not None:
        alert["endsAt"] = iso(span.resolved_at)
    return alert


def scenario(
    *,
    name: str,
    start: datetime,
    until: datetime,
    shape: ClusterShape,
    spans: Sequence[FiringSpan],
    attempts: Sequence[Attempt],
    events: Sequence[NodeEvent],
    policy: Mapping[str, Any] | None,
    delay: timedelta,
) -> dict[str, Any]:
    """The replay scenario of the span: the cluster as it was at `start`, then every delivery
    (an alert `delay` after it fired, and again when it resolved) and every change of a job's
    or a node's state, in time order.

    Nodes accounting names that the cluster no longer has are added (partition unknown), so a
    job that ran on them still reads. Node names that are not valid slurmedic node names are
    left out with what names them (the core would refuse them anyway).
    """
    known = dict(shape.nodes)
    for a in attempts:
        for n in a.nodes:
            known.setdefault(n, ("", 0))
    for e in events:
        known.setdefault(e.node, ("", 0))
    known = {n: v for n, v in known.items() if NODE_NAME.match(n)}

    def valid(nodes: Iterable[str]) -> tuple[str, ...]:
        return tuple(n for n in nodes if n in known)

    timeline: list[tuple[datetime, int, dict[str, Any]]] = []

    def at(when: datetime, order: int, event: dict[str, Any]) -> None:
        if start <= when <= until:
            timeline.append((when, order, {"at": iso(when), **event}))

    # Node state at the start, then every event's beginning and end inside the span.
    state_at_start: dict[str, tuple[str, str]] = {}
    for e in sorted(events, key=lambda e: e.start):
        if e.node not in known:
            continue
        if e.start <= start and (e.end is None or e.end > start):
            state_at_start[e.node] = (_node_word(e.state), e.reason)
        at(e.start, 0, {"cluster": {"nodes": [_group(e.node, known, e.state, e.reason)]}})
        if e.end is not None:
            at(e.end, 0, {"cluster": {"nodes": [_group(e.node, known, "idle", "")]}})

    # Every job of the span is in the view from the start: running if an attempt ran then,
    # else waiting (a change cannot name a job's partition or user: they are set here).
    jobs_at_start: dict[int, dict[str, Any]] = {}
    for a in attempts:
        nodes = valid(a.nodes)
        running_at_start = (
            a.started is not None and a.started <= start and (a.ended is None or a.ended > start)
        )
        if running_at_start:
            jobs_at_start[a.job] = _job_spec(a, nodes, "RUNNING")
        elif a.started is not None and a.started > start:
            jobs_at_start.setdefault(a.job, _job_spec(a, (), "PENDING"))
            change = {
                "id": a.job,
                "state": "RUNNING",
                "restarts": a.attempt,
                "started": iso(a.started),
                "nodes": _collect(nodes),
            }
            at(a.started, 1, {"cluster": {"jobs": [change]}})
        if a.ended is not None and a.started is not None and a.state not in ACTIVE_STATES:
            end: dict[str, Any] = {"id": a.job, "state": a.state, "ended": iso(a.ended)}
            if a.exit_code is not None and 0 <= a.exit_code <= 255:
                end["exit_code"] = a.exit_code  # the job's own word (NVRx's 93)
            at(a.ended, 1, {"cluster": {"jobs": [end]}})

    for span in spans:
        at(span.starts_at + delay, 2, {"alerts": [_alert(span, "firing")]})
        if span.resolved_at is not None:
            at(span.resolved_at + delay, 2, {"alerts": [_alert(span, "resolved")]})

    timeline.sort(key=lambda t: (t[0], t[1]))
    groups = []
    for node, (partition, gpus) in sorted(known.items()):
        state, reason = state_at_start.get(node, ("idle", ""))
        groups.append(
            {"names": node, "partition": partition, "gpus": gpus, "state": state, "reason": reason}
        )
    switches = [
        {"name": s, "nodes": _collect(valid(members))}
        for s, members in sorted(shape.switches.items())
        if valid(members)
    ]
    data: dict[str, Any] = {
        "name": name,
        "description": f"backtest of {iso(start)} .. {iso(until)}",
        "start": iso(start),
        "until": iso(until),
        "cluster": {"nodes": groups, "switches": switches, "jobs": list(jobs_at_start.values())},
        "events": [e for _, _, e in timeline],
    }
    if policy is not None:
        data["policy"] = dict(policy)
    return data


def _group(
    node: str, known: Mapping[str, tuple[str, int]], state: str, reason: str
) -> dict[str, Any]:
    partition, gpus = known[node]
    return {
        "names": node,
        "partition": partition,
        "gpus": gpus,
        "state": _node_word(state),
        "reason": reason,
    }


def _job_spec(a: Attempt, nodes: tuple[str, ...], state: str) -> dict[str, Any]:
    running = state == "RUNNING"
    return {
        "id": a.job,
        "name": a.name,
        "user": a.user,
        "partition": a.partition,
        "nodes": _collect(nodes),
        "state": state,
        "restarts": a.attempt if running else 0,
        "started": iso(a.started) if running and a.started else None,
    }
