"""The trial report: how slurmedic's recommendations compare with what operators would do.

A careful site runs slurmedic in monitor or approve mode first, records a verdict on every
recommendation, and widens its permissions per action and partition once the record shows
reliable behaviour. This module turns the record into that report: pure, over plain rows.

A disagreement is *harmful* when the recommendation disrupted something the operator would have
left alone (drained a node they would have left in service, requeued a job they would have let
finish, stopped one they would have requeued): in enforce mode it would have disrupted work.
What it disrupted is read from what happened in Slurm (webhook/core/effects.py): a stop of an
attempt that had already ended, or a requeue that only added an exclusion to a job Slurm had
requeued itself, disrupted nothing. One where the operator would have done more (slurmedic
escalated or did nothing, they would have drained; it stopped a dead attempt, they would have
requeued it) is a *miss*, not harm.

Recovery drills (webhook/core/drills.py) are an operator's test, not a recommendation: their
decisions never count in agreement or readiness, and the report lists them apart, each with the
work it lost and whether it passed.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from webhook.core.decisions import JOB_ACTIONS
from webhook.core.drills import CAUSE as DRILL_CAUSE
from webhook.core.effects import HARMLESS
from webhook.core.incidents import DRILL
from webhook.core.lifecycle import (
    AWAITING_APPROVAL,
    EXPIRED,
    FAILED,
    RECORDED,
    REJECTED,
    SUPERSEDED,
)

# What an action, or an operator's alternative (webhook/core/verdicts.py), does to the job (0:
# leaves it running, 1: ends and restarts it, 2: ends it) and to the nodes' service (0: leaves
# it, 1: changes it: drained out of service, or resumed into it). A harmful disagreement is one
# whose alternative does less on either.
IMPACT: dict[str, tuple[int, int]] = {
    "none": (0, 0),
    "escalate": (0, 0),
    "wait": (0, 0),
    "let_finish": (0, 0),
    "resume": (0, 1),
    "drain": (0, 1),
    "drain_only": (0, 1),
    "requeue": (1, 0),
    "requeue_anywhere": (1, 0),
    "stop": (2, 0),
}
# No judgement below this many agreed recommendations makes an action ready.
MIN_AGREED = 10
READY_AGREEMENT = 0.95
# ... nor a record narrower than this: agreed recommendations on this many days, and on this
# many nodes (a drain) or jobs (a requeue, a stop). One lab run, or one bad node failing all
# week, is not a trial.
MIN_DAYS = 3
MIN_SPREAD = 3


@dataclass(frozen=True)
class Judged:
    """One recommendation, with its operator's latest verdict (None: not judged yet)."""

    decision_id: int
    incident: str
    at: datetime
    action: str
    cause: str
    mode: str
    state: str
    partition: str | None
    nodes: tuple[str, ...]
    job: int | None
    fault_at: datetime | None
    verdict: str | None = None
    would: str | None = None
    note: str = ""
    by: str = ""
    recovery: str | None = None  # requeues: recovered | failed | unverified | watching
    # What it would disrupt (webhook/core/disruption.py): GPUs drained or interrupted, and a
    # requeue's or stop's GPU-hours of the attempt so far (None: not known).
    gpus: int = 0
    gpu_hours: float | None = None
    # A requeue's or stop's effect on its attempt (webhook/core/effects.py; None: not read).
    effect: str | None = None
    # The names of the alerts it was decided on, the first first (its evidence).
    alerts: tuple[str, ...] = ()

    @property
    def impact(self) -> tuple[int, int]:
        """What it did: nothing to the job when the attempt was already over."""
        job, nodes = IMPACT.get(self.action, (0, 0))
        return (0 if self.effect in HARMLESS else job, nodes)

    @property
    def disrupted_gpus(self) -> int:
        return 0 if self.effect in HARMLESS else self.gpus

    @property
    def disrupted_gpu_hours(self) -> float:
        return 0.0 if self.effect in HARMLESS else self.gpu_hours or 0.0


def is_drill(j: Judged) -> bool:
    """A drill's decision: its requeue (incident `drill:<job>.<n>`) and, when it fails, its
    escalation (`verify:<job>.<n>`, guard drill_failed): both carry the drill's cause."""
    return j.cause == DRILL_CAUSE or j.incident.startswith(DRILL)


PASSED = "passed"


# A drill decided but whose requeue will not run, by its decision's state: monitor mode's dry
# run, an approval still awaited or refused, a run that failed.
NOT_RUN = {
    RECORDED: "dry_run",
    AWAITING_APPROVAL: "awaiting_approval",
    REJECTED: "rejected",
    EXPIRED: "expired",
    FAILED: "run_failed",
    SUPERSEDED: "superseded",
}


def drill_outcome(
    request_state: str, recovery_state: str | None, run_state: str | None = None
) -> str:
    """What became of a drill: `passed` when its recovery recovered, else its recovery's state
    (watching, failed, unverified), else what stopped its requeue (dry_run, awaiting_approval,
    rejected, expired, run_failed), else its request's (asked, decided, refused)."""
    if recovery_state is not None:
        return PASSED if recovery_state == "recovered" else recovery_state
    if request_state == "decided" and run_state in NOT_RUN:
        return NOT_RUN[run_state]
    return request_state


@dataclass(frozen=True)
class Drilled:
    """One recovery drill, as the report lists it."""

    id: int
    job: int
    at: datetime  # when it was asked for
    by: str
    outcome: str  # drill_outcome()
    reason: str  # the verifier's, else why it was refused
    lost_steps: float | None = None
    lost_seconds: float | None = None
    start_seconds: float | None = None  # from its requeue to its successor's start

    @property
    def passed(self) -> bool:
        return self.outcome == PASSED

    @property
    def why_not(self) -> str:
        """`passed`, or the outcome with its reason."""
        if self.passed:
            return PASSED
        return f"{self.outcome}: {self.reason}" if self.reason else self.outcome


@dataclass
class Group:
    """The figures of one (cause, action)."""

    cause: str
    action: str
    recommendations: int = 0
    agree: int = 0
    disagree: int = 0
    unsure: int = 0
    harmful: int = 0
    missed: int = 0
    # What the operators would have done instead, counted per action or alternative.
    instead: dict[str, int] = field(default_factory=dict)
    nodes: set[str] = field(default_factory=set)
    jobs: set[int] = field(default_factory=set)
    # Fault (its first evidence: the first alert's start less its rule's `for:`) to
    # recommendation, and the rules' share of it (their `for:`).
    latencies: list[float] = field(default_factory=list)
    rule_delays: list[float] = field(default_factory=list)
    alerts: dict[str, int] = field(default_factory=dict)  # recommendations by first alert
    recoveries: dict[str, int] = field(default_factory=dict)
    disagreements: list[Judged] = field(default_factory=list)
    # Summed over its recommendations; `harmful_` over the harmful disagreements alone (what
    # enforce mode would have disrupted for nothing).
    gpus: int = 0
    gpu_hours: float = 0.0
    harmful_gpus: int = 0
    harmful_gpu_hours: float = 0.0

    @property
    def judged(self) -> int:
        return self.agree + self.disagree + self.unsure

    @property
    def agreement(self) -> float | None:
        return self.agree / self.judged if self.judged else None

    def latency(self, q: float) -> float | None:
        """The q-quantile of fault-to-recommendation seconds (None: no fault time known)."""
        return _quantile(self.latencies, q)

    def rule_delay(self, q: float) -> float | None:
        """The q-quantile of the rules' `for:` within those times."""
        return _quantile(self.rule_delays, q)


def _quantile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    if len(values) == 1:
        return values[0]
    cuts = statistics.quantiles(values, n=100, method="inclusive")
    return cuts[min(98, max(0, round(q * 100) - 1))]


@dataclass(frozen=True)
class Readiness:
    """Whether one action, for one cause, on one partition, has earned enforce mode."""

    action: str
    cause: str
    partition: str  # "*": decisions of no partition
    agreed: int
    judged: int
    harmful: int
    ready: bool
    line: str
    # The variety of its agreed recommendations: days, nodes or jobs, alerts.
    days: int = 0
    spread: int = 0
    alerts: int = 0


@dataclass(frozen=True)
class Report:
    since: datetime
    until: datetime
    groups: list[Group]
    readiness: list[Readiness]
    recommendations: int
    judged: int
    drills: tuple[Drilled, ...] = ()
    delays_from: str = ""  # where the rules' for: were read


def harmful(j: Judged) -> bool:
    """The operator would have left alone something the recommendation disrupted."""
    if j.verdict != "disagree" or j.would is None:
        return False
    would = IMPACT.get(j.would, (0, 0))
    return any(w < did for w, did in zip(would, j.impact, strict=True))


def missed(j: Judged) -> bool:
    """The operator would have done something the recommendation did not (and nothing less)."""
    if j.verdict != "disagree" or j.would is None or harmful(j):
        return False
    would = IMPACT.get(j.would, (0, 0))
    return any(w > did for w, did in zip(would, j.impact, strict=True))


def disrupts(action: str) -> bool:
    return any(IMPACT.get(action, (0, 0)))


def report(
    rows: list[Judged],
    since: datetime,
    until: datetime,
    min_agreed: int = MIN_AGREED,
    drills: list[Drilled] | tuple[Drilled, ...] = (),
    delays: Mapping[str, float] | None = None,
    delays_from: str = "",
) -> Report:
    """The report of `rows`; `delays`: each alert's rule `for:` in seconds (webhook/rules/
    delays.py), added to the time from an alert's start to measure from the fault's first
    evidence (unknown alerts: 0)."""
    delays = delays or {}
    groups: dict[tuple[str, str], Group] = {}
    per_action: dict[tuple[str, str, str], list[Judged]] = defaultdict(list)
    rows = [j for j in rows if not is_drill(j)]
    for j in rows:
        g = groups.setdefault((j.cause, j.action), Group(j.cause, j.action))
        g.recommendations += 1
        if j.verdict == "agree":
            g.agree += 1
        elif j.verdict == "disagree":
            g.disagree += 1
            g.disagreements.append(j)
            if j.would is not None:
                g.instead[j.would] = g.instead.get(j.would, 0) + 1
            if harmful(j):
                g.harmful += 1
                g.harmful_gpus += j.disrupted_gpus
                g.harmful_gpu_hours += j.disrupted_gpu_hours
            elif missed(j):
                g.missed += 1
        elif j.verdict == "unsure":
            g.unsure += 1
        if j.action == "drain":
            g.nodes.update(j.nodes)
        if j.action in JOB_ACTIONS and j.job is not None:
            g.jobs.add(j.job)
        g.gpus += j.disrupted_gpus
        g.gpu_hours += j.disrupted_gpu_hours
        if j.alerts:
            g.alerts[j.alerts[0]] = g.alerts.get(j.alerts[0], 0) + 1
        if j.fault_at is not None:
            held = delays.get(j.alerts[0], 0.0) if j.alerts else 0.0
            g.latencies.append(max(0.0, (j.at - j.fault_at).total_seconds()) + held)
            g.rule_delays.append(held)
        if j.recovery:
            g.recoveries[j.recovery] = g.recoveries.get(j.recovery, 0) + 1
        if disrupts(j.action):
            per_action[(j.action, j.cause, j.partition or "*")].append(j)
    readiness = [
        _readiness(action, cause, partition, found, min_agreed)
        for (action, cause, partition), found in sorted(per_action.items())
    ]
    ordered = sorted(groups.values(), key=lambda g: (g.cause, g.action))
    judged = sum(g.judged for g in ordered)
    return Report(
        since,
        until,
        ordered,
        readiness,
        len(rows),
        judged,
        tuple(sorted(drills, key=_asked)),
        delays_from,
    )


def _asked(d: Drilled) -> tuple[datetime, int]:
    return (d.at, d.id)


def _readiness(
    action: str, cause: str, partition: str, rows: list[Judged], min_agreed: int
) -> Readiness:
    agreed = [j for j in rows if j.verdict == "agree"]
    judged = sum(j.verdict is not None for j in rows)
    bad = sum(harmful(j) for j in rows)
    days = len({j.at.date() for j in agreed})
    on_jobs = action in JOB_ACTIONS
    spread = len({j.job for j in agreed} if on_jobs else {n for j in agreed for n in j.nodes})
    alerts = len({j.alerts[0] for j in agreed if j.alerts})
    where = f"{action} for {cause}" + (
        f" on partition {partition}" if partition != "*" else " (no partition)"
    )
    what = "job(s)" if on_jobs else "node(s)"
    head = (
        f"{where}: {len(agreed)} agreed of {judged} judged, {bad} harmful disagreement(s); "
        f"agreed on {days} day(s), {spread} {what}, {alerts} kind(s) of alert"
    )
    if bad:
        verdict, ready = "not ready: look at the harmful disagreements first", False
    elif len(agreed) < min_agreed:
        verdict, ready = f"not enough agreed yet ({len(agreed)} of {min_agreed})", False
    elif len(agreed) / judged < READY_AGREEMENT:
        share = f"{len(agreed) / judged:.0%}"
        verdict, ready = f"agreement {share} is below {READY_AGREEMENT:.0%}", False
    elif days < MIN_DAYS or spread < MIN_SPREAD:
        verdict = (
            f"not varied enough: agreed on {MIN_DAYS} days and {MIN_SPREAD} {what} at least "
            "(one run, or one node failing again and again, is not a trial)"
        )
        ready = False
    else:
        verdict, ready = "ready to enforce", True
    return Readiness(
        action, cause, partition, len(agreed), judged, bad, ready, f"{head}: {verdict}",
        days, spread, alerts,
    )  # fmt: skip


# ---- formats ------------------------------------------------------------------------------
def _seconds(v: float | None) -> str:
    return "" if v is None else f"{v:.0f}s"


def as_json(r: Report) -> dict[str, Any]:
    return {
        "since": r.since.isoformat(),
        "until": r.until.isoformat(),
        "recommendations": r.recommendations,
        "judged": r.judged,
        "rule_delays_from": r.delays_from,
        "groups": [
            {
                "cause": g.cause,
                "action": g.action,
                "recommendations": g.recommendations,
                "agree": g.agree,
                "disagree": g.disagree,
                "unsure": g.unsure,
                "unjudged": g.recommendations - g.judged,
                "agreement": g.agreement,
                "harmful": g.harmful,
                "missed": g.missed,
                "instead": dict(sorted(g.instead.items())),
                "nodes_drained": sorted(g.nodes),
                "jobs": sorted(g.jobs),
                "gpus": g.gpus,
                "gpu_hours": round(g.gpu_hours, 3),
                "harmful_gpus": g.harmful_gpus,
                "harmful_gpu_hours": round(g.harmful_gpu_hours, 3),
                "fault_to_recommendation_p50_seconds": g.latency(0.5),
                "fault_to_recommendation_p90_seconds": g.latency(0.9),
                "rule_delay_p50_seconds": g.rule_delay(0.5),
                "alerts": dict(sorted(g.alerts.items())),
                "recoveries": dict(sorted(g.recoveries.items())),
                "disagreements": [
                    {
                        "decision": j.decision_id,
                        "incident": j.incident,
                        "would": j.would,
                        "by": j.by,
                        "note": j.note,
                        "harmful": harmful(j),
                        "missed": missed(j),
                        "effect": j.effect,
                        "gpus": j.gpus,
                        "gpu_hours": None if j.gpu_hours is None else round(j.gpu_hours, 3),
                    }
                    for j in g.disagreements
                ],
            }
            for g in r.groups
        ],
        "readiness": [
            {
                "action": x.action,
                "cause": x.cause,
                "partition": x.partition,
                "agreed": x.agreed,
                "judged": x.judged,
                "harmful": x.harmful,
                "days": x.days,
                "spread": x.spread,
                "alerts": x.alerts,
                "ready": x.ready,
                "line": x.line,
            }
            for x in r.readiness
        ],
        "drills": [
            {
                "drill": d.id,
                "job": d.job,
                "asked_at": d.at.isoformat(),
                "by": d.by,
                "outcome": d.outcome,
                "passed": d.passed,
                "reason": d.reason,
                "lost_steps": d.lost_steps,
                "lost_seconds": d.lost_seconds,
                "start_seconds": d.start_seconds,
            }
            for d in r.drills
        ],
    }


CSV_COLUMNS = (
    "cause",
    "action",
    "recommendations",
    "agree",
    "disagree",
    "unsure",
    "unjudged",
    "agreement",
    "harmful",
    "nodes_drained",
    "jobs",
    "gpus",
    "gpu_hours",
    "harmful_gpus",
    "harmful_gpu_hours",
    "fault_to_recommendation_p50_seconds",
    "fault_to_recommendation_p90_seconds",
    "rule_delay_p50_seconds",
    "recovered",
    "recovery_failed",
    "missed",
    "instead",
)


def csv_rows(r: Report) -> list[list[str]]:
    out = [list(CSV_COLUMNS)]
    for g in r.groups:
        agreement = "" if g.agreement is None else f"{g.agreement:.3f}"
        p50, p90 = g.latency(0.5), g.latency(0.9)
        out.append(
            [
                g.cause,
                g.action,
                str(g.recommendations),
                str(g.agree),
                str(g.disagree),
                str(g.unsure),
                str(g.recommendations - g.judged),
                agreement,
                str(g.harmful),
                str(len(g.nodes)),
                str(len(g.jobs)),
                str(g.gpus),
                f"{g.gpu_hours:.2f}",
                str(g.harmful_gpus),
                f"{g.harmful_gpu_hours:.2f}",
                "" if p50 is None else f"{p50:.1f}",
                "" if p90 is None else f"{p90:.1f}",
                "" if (held := g.rule_delay(0.5)) is None else f"{held:.1f}",
                str(g.recoveries.get("recovered", 0)),
                str(g.recoveries.get("failed", 0)),
                str(g.missed),
                _instead(g, " "),
            ]
        )
    if r.drills:
        # A table of its own (other columns): after an empty line, so that a reader splits
        # the file there. A window without drills keeps the one table.
        out += [[], list(DRILL_CSV_COLUMNS)]
        out += [
            [
                str(d.id),
                str(d.job),
                d.at.isoformat(),
                d.by,
                d.outcome,
                _number(d.lost_steps),
                _number(d.lost_seconds),
                _number(d.start_seconds),
                "" if d.passed else d.reason,
            ]
            for d in r.drills
        ]
    return out


DRILL_CSV_COLUMNS = (
    "drill",
    "job",
    "asked_at",
    "by",
    "outcome",
    "lost_steps",
    "lost_seconds",
    "start_seconds",
    "why_not",
)


def _number(v: float | None) -> str:
    return "" if v is None else f"{v:g}"


def _instead(g: Group, sep: str) -> str:
    return sep.join(f"{k} {v}" for k, v in sorted(g.instead.items()))


TABLE = (
    "cause",
    "action",
    "recommended",
    "agree",
    "disagree",
    "unsure",
    "agreement",
    "harmful",
    "missed",
    "would instead",
    "nodes drained",
    "jobs",
    "GPUs",
    "GPU-hours",
    "harmful: GPUs, GPU-hours",
    "fault → recommendation p50 / p90",
    "of which rules' for: p50",
    "first alerts",
    "recoveries",
)


def cell(text: object) -> str:
    """A Markdown table cell: a `|` of its own would end it, a newline the row."""
    return str(text).replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ")


def _row(cells: list[str] | tuple[str, ...]) -> str:
    return "| " + " | ".join(cell(c) for c in cells) + " |"


def _group_cells(g: Group) -> list[str]:
    agreement = "—" if g.agreement is None else f"{g.agreement:.0%}"
    rec = ", ".join(f"{k} {v}" for k, v in sorted(g.recoveries.items())) or "—"
    return [
        g.cause,
        g.action,
        str(g.recommendations),
        str(g.agree),
        str(g.disagree),
        str(g.unsure),
        agreement,
        str(g.harmful),
        str(g.missed),
        _instead(g, ", ") or "—",
        str(len(g.nodes)),
        str(len(g.jobs)),
        str(g.gpus),
        f"{g.gpu_hours:.1f}",
        f"{g.harmful_gpus}, {g.harmful_gpu_hours:.1f}",
        f"{_seconds(g.latency(0.5))} / {_seconds(g.latency(0.9))}",
        _seconds(g.rule_delay(0.5)) or "—",
        ", ".join(f"{k} {v}" for k, v in sorted(g.alerts.items())) or "—",
        rec,
    ]


EFFECT_WORDS = {
    "ended": "the attempt had already ended",
    "requeued": "Slurm had already requeued the attempt",
}


def as_markdown(r: Report) -> str:
    lines = [
        f"# Trial report, {r.since:%Y-%m-%d %H:%M} to {r.until:%Y-%m-%d %H:%M} UTC",
        "",
        f"{r.recommendations} recommendations, {r.judged} judged.",
        "",
        "## Readiness",
        "",
        *([f"- {x.line}" for x in r.readiness] or ["- nothing recommended yet"]),
        "",
        "## By cause and action",
        "",
        _row(TABLE),
        "|" + "---|" * len(TABLE),
        *(_row(_group_cells(g)) for g in r.groups),
        "",
        "Fault → recommendation runs from the fault's first evidence: its first alert's start "
        "less that alert's rule `for:` (the rules' share beside it"
        + (f"; read from {r.delays_from}" if r.delays_from else "")
        + "). The scrape and rule evaluation intervals add up to one of each more.",
    ]
    dis = [(g, j) for g in r.groups for j in g.disagreements]
    lines += ["", "## Disagreements", ""]
    if not dis:
        lines.append("None.")
    for g, j in dis:
        flag = " (harmful)" if harmful(j) else " (missed)" if missed(j) else ""
        if j.effect in EFFECT_WORDS:
            flag += f" ({EFFECT_WORDS[j.effect]})"
        if j.disrupted_gpus:
            hours = f", {j.gpu_hours:.1f} GPU-hours" if j.gpu_hours is not None else ""
            flag += f" [{j.gpus} GPUs{hours}]"
        note = ": " + " ".join(j.note.split()) if j.note else ""
        did = "did nothing" if g.action == "none" else g.action
        lines.append(
            f"- decision {j.decision_id} ({j.incident}): slurmedic {did} for {g.cause}, "
            f"{j.by} would {j.would}{flag}{note}"
        )
    lines += ["", "## Recovery drills", ""]
    if not r.drills:
        lines.append("None in this window (`slurmedic drill JOB`).")
    else:
        lines += [
            "Operators' tests of recovery: not counted in the figures above.",
            "",
            _row(DRILL_TABLE),
            "|" + "---|" * len(DRILL_TABLE),
            *(_row(drill_cells(d)) for d in r.drills),
        ]
    return "\n".join(lines) + "\n"


DRILL_TABLE = ("drill", "job", "asked", "by", "lost work", "time to resume", "passed or why not")


def lost_work(d: Drilled) -> str:
    """`120 steps, 300s`, what is known of it, or `—`."""
    parts = []
    if d.lost_steps is not None:
        parts.append(f"{d.lost_steps:g} steps")
    if d.lost_seconds is not None:
        parts.append(_seconds(d.lost_seconds))
    return ", ".join(parts) or "—"


def drill_cells(d: Drilled) -> list[str]:
    return [
        str(d.id),
        str(d.job),
        f"{d.at:%Y-%m-%d %H:%M}",
        d.by,
        lost_work(d),
        _seconds(d.start_seconds) or "—",
        d.why_not,
    ]
