"""What slurmedic would have done, beside what happened (pure: plain data in, a report out).

Per incident, each decision in force is judged against the record:
- a drain agrees when the node left service for that failure anyway (a person drained it, or
  Slurm had it down), within `window` of the fault; the time gained is how much sooner;
- a requeue agrees when the job ran again (Slurm or someone requeued it, or its user
  resubmitted it: same user and job name); the time gained is how much sooner, and the GPU-hours
  saved are that time on the job's GPUs;
- a stop, or leaving the job alone, agrees when nobody ran it again;
- an escalation hands the failure to a person: counted apart, never agreement.
What people did that slurmedic would not have is a *miss*: a drain of a node it left in
service, a job run again that it would have stopped or left alone, and actions on failures no
alert reported. What slurmedic would have done that nobody did is a *possible false positive*:
the record cannot say whether the people were wrong.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from webhook.backtest.history import Attempt, NodeEvent, span_text
from webhook.core.cluster import FAILED_STATES
from webhook.core.decisions import Decision

AGREE, MISS, EXTRA, HANDED = "agree", "miss", "possible_false_positive", "escalated"
SAME = "already_decided"  # a drain another incident's decision already made: not judged twice
# An action that happened slightly before the fault's first alert still answers it (a person
# who saw the job die before the rule's `for:` elapsed).
EARLY = timedelta(minutes=10)
# The ends after which Slurm itself runs a `--requeue` job again (a node lost, a boot that
# failed, preemption in requeue mode); after any other, someone requeued it.
SLURM_REQUEUES = frozenset({"NODE_FAIL", "BOOT_FAIL", "PREEMPTED"})


@dataclass(frozen=True)
class Happened:
    """One thing the record shows happened after a failure."""

    at: datetime
    what: str  # drained | down | requeued | requeued_by_slurm | resubmitted | ended | running
    by: str  # a user name, `slurm`, or `slurmedic`
    nodes: tuple[str, ...] = ()
    detail: str = ""  # a drain's reason, a resubmission's job id, an end state


@dataclass(frozen=True)
class Verdict:
    kind: str  # AGREE | MISS | EXTRA | HANDED
    action: str  # drain | requeue | stop | none | escalate
    nodes: tuple[str, ...] = ()
    would_at: datetime | None = None  # when slurmedic would have done it
    did_at: datetime | None = None  # when it happened
    gained: timedelta | None = None  # did_at - would_at, for agreements
    gpu_hours: float | None = None  # saved by a requeue that agrees
    note: str = ""


@dataclass(frozen=True)
class IncidentRow:
    incident: str
    job: int | None
    attempt: Attempt | None
    fault_at: datetime
    cause: str
    decisions: tuple[Decision, ...]
    happened: tuple[Happened, ...]
    verdicts: tuple[Verdict, ...]


@dataclass(frozen=True)
class Unanswered:
    """What people did about a failure no alert reported (a miss with no incident)."""

    happened: Happened
    attempt: Attempt | None = None


@dataclass
class Report:
    start: datetime
    until: datetime
    incidents: list[IncidentRow] = field(default_factory=list)
    unanswered: list[Unanswered] = field(default_factory=list)
    limits: list[str] = field(default_factory=list)
    sources: dict[str, str] = field(default_factory=dict)

    def verdicts(self) -> list[Verdict]:
        return [v for row in self.incidents for v in row.verdicts]

    def counts(self) -> dict[str, float | int | None]:
        vs = self.verdicts()
        agreed = [v for v in vs if v.kind == AGREE]
        misses = sum(v.kind == MISS for v in vs) + len(self.unanswered)
        extras = sum(v.kind == EXTRA for v in vs)
        judged = len(agreed) + misses + extras
        gains = [
            v.gained.total_seconds() for v in agreed if v.gained is not None and v.gained > ZERO
        ]
        return {
            "incidents": len(self.incidents),
            "decisions": sum(len(r.decisions) for r in self.incidents),
            "agreed": len(agreed),
            "misses": misses,
            "possible_false_positives": extras,
            "escalated": sum(v.kind == HANDED for v in vs),
            "agreement": round(len(agreed) / judged, 3) if judged else None,
            "drains_sooner": sum(
                1 for v in agreed if v.action == "drain" and v.gained and v.gained > ZERO
            ),
            "requeues_sooner": sum(
                1 for v in agreed if v.action == "requeue" and v.gained and v.gained > ZERO
            ),
            "time_gained_s": round(sum(gains)),
            "median_gain_s": round(statistics.median(gains)) if gains else None,
            "gpu_hours_saved": round(sum(v.gpu_hours or 0.0 for v in agreed), 1),
        }


ZERO = timedelta(0)


@dataclass
class _Record:
    """The history, indexed for the questions compare asks."""

    attempts: Sequence[Attempt]
    events: Sequence[NodeEvent]
    gpus_of: Mapping[str, int]
    window: timedelta
    by_key: dict[str, Attempt] = field(default_factory=dict)
    runs: dict[int, list[Attempt]] = field(default_factory=dict)
    used_events: set[int] = field(default_factory=set)

    def __post_init__(self) -> None:
        for a in self.attempts:
            self.by_key[a.key] = a
            self.runs.setdefault(a.job, []).append(a)
        for runs in self.runs.values():
            runs.sort(key=lambda a: a.attempt)

    def gpus(self, a: Attempt) -> int:
        return a.gpus or sum(self.gpus_of.get(n, 0) for n in a.nodes)

    def after(self, a: Attempt, until: datetime) -> Happened:
        """What became of the job after attempt `a` ended: run again, resubmitted, or not."""
        later = [r for r in self.runs.get(a.job, []) if r.attempt > a.attempt]
        if later:
            nxt = later[0]
            requeued_at = a.ended or nxt.submitted or nxt.started or a.started
            assert requeued_at is not None
            by_slurm = a.state in SLURM_REQUEUES
            return Happened(
                requeued_at,
                "requeued_by_slurm" if by_slurm else "requeued",
                "slurm" if by_slurm else "",
                detail=f"attempt {nxt.attempt} started {_hm(nxt.started, a.ended)}",
            )
        if a.ended is None:
            return Happened(until, "running", "", detail="still running at the end")
        for other in self.attempts:
            if (
                other.job != a.job
                and other.attempt == 0
                and other.user == a.user
                and other.name == a.name
                and other.submitted is not None
                and a.ended - EARLY <= other.submitted <= a.ended + self.window
            ):
                return Happened(
                    other.submitted,
                    "resubmitted",
                    other.user,
                    detail=f"as job {other.job}, {_hm(other.submitted, a.ended)} after it ended",
                )
        return Happened(a.ended, "ended", "", detail=a.state)


def _hm(later: datetime | None, earlier: datetime | None) -> str:
    if later is None or earlier is None:
        return "later"
    return span_text(later - earlier)


def compare(
    decisions: Sequence[Decision],
    attempts: Sequence[Attempt],
    events: Sequence[NodeEvent],
    *,
    start: datetime,
    until: datetime,
    gpus_of: Mapping[str, int],
    window: timedelta = timedelta(hours=24),
) -> Report:
    record = _Record(attempts, sorted(events, key=lambda e: e.start), gpus_of, window)
    in_force: dict[str, list[Decision]] = {}
    for d in decisions:
        if d.state != "superseded":
            in_force.setdefault(d.incident, []).append(d)
    report = Report(start=start, until=until)
    decided_attempts: set[str] = set()
    sketches = []
    for incident, ds in sorted(in_force.items(), key=lambda kv: kv[1][0].at):
        attempt = record.by_key.get(incident) if ds[0].job is not None else None
        if attempt is not None:
            decided_attempts.add(attempt.key)
        sketches.append(_Sketch(incident, ds, attempt, _fault_at(ds, attempt)))
    outages = _assign(sketches, record)
    repeats = _repeats(sketches, record.window)
    for sk in sketches:
        row = _judge(sk, outages.get(sk.incident, []), repeats.get(sk.incident, {}), record, until)
        report.incidents.append(row)
    report.unanswered = _unanswered(record, decided_attempts, start, until)
    return report


@dataclass(frozen=True)
class _Sketch:
    incident: str
    decisions: Sequence[Decision]
    attempt: Attempt | None
    fault_at: datetime

    @property
    def named(self) -> set[str]:
        """The nodes its alerts and decisions name."""
        ds = self.decisions
        out = {n for d in ds for n in (*d.nodes, *d.exclude)}
        return out | {ev["node"] for d in ds for ev in d.evidence if ev.get("node")}

    @property
    def held(self) -> set[str]:
        """The nodes its job's attempt ran on."""
        return set(self.attempt.nodes) if self.attempt else set()


def _assign(sketches: Sequence[_Sketch], record: _Record) -> dict[str, list[NodeEvent]]:
    """Each node taken out of service (not by slurmedic) answers at most one incident, and an
    incident takes at most one answer per node: the earliest incident before it, within the
    window, that named the node and has no answer for it yet, else the earliest whose job ran
    on it. Two failures of one node a day apart each get their own drain; the alert that
    goes on about a node once its job has ended (a node incident) does not take the answer to
    the job's failure."""
    by_node: dict[str, list[_Sketch]] = {}
    for sk in sorted(sketches, key=lambda sk: sk.fault_at):
        for n in sk.named | sk.held:
            by_node.setdefault(n, []).append(sk)
    answered: set[tuple[str, str]] = set()
    out: dict[str, list[NodeEvent]] = {}
    for i, e in enumerate(record.events):
        if e.by == "slurmedic" or not (e.drained or e.state.upper().startswith("DOWN")):
            continue
        near = [
            sk
            for sk in by_node.get(e.node, [])
            if sk.fault_at - EARLY <= e.start <= sk.fault_at + record.window
            and (sk.incident, e.node) not in answered
        ]
        direct = [sk for sk in near if e.node in sk.named]
        if not near:
            continue
        best = (direct or near)[0]
        answered.add((best.incident, e.node))
        record.used_events.add(i)
        out.setdefault(best.incident, []).append(e)
    return out


def _repeats(sketches: Sequence[_Sketch], window: timedelta) -> dict[str, dict[str, str]]:
    """Drains of a node slurmedic would already have drained for an earlier incident within
    the window (by incident: node -> that incident). The backtest runs as monitor mode does:
    its own drains do not change the view, so the alert that goes on about the node once its
    job has ended opens a node incident that drains it again. In enforce mode the node would
    be drained by then; judging the second drain would count one action twice."""
    last: dict[str, tuple[str, datetime]] = {}
    out: dict[str, dict[str, str]] = {}
    drains = sorted(
        (d.at, sk.incident, node)
        for sk in sketches
        for d in sk.decisions
        if d.action == "drain"
        for node in d.nodes
    )
    for at, incident, node in drains:
        prev = last.get(node)
        if prev is not None and prev[0] != incident and at - prev[1] <= window:
            out.setdefault(incident, {})[node] = prev[0]
            continue
        last[node] = (incident, at)
    return out


def _fault_at(ds: Sequence[Decision], attempt: Attempt | None) -> datetime:
    starts = []
    for d in ds:
        for ev in d.evidence:
            raw = ev.get("startsAt")
            if isinstance(raw, str):
                starts.append(datetime.fromisoformat(raw.replace("Z", "+00:00")))
    if starts:
        return min(starts)
    if attempt is not None and attempt.ended is not None:
        return attempt.ended
    return min(d.at for d in ds)


def _judge(
    sk: _Sketch,
    outages: list[NodeEvent],
    repeats: dict[str, str],
    record: _Record,
    until: datetime,
) -> IncidentRow:
    incident, ds, attempt, fault_at = sk.incident, sk.decisions, sk.attempt, sk.fault_at
    happened: list[Happened] = [
        Happened(e.start, "drained" if e.drained else "down", _who(e), (e.node,), e.reason)
        for e in outages
    ]
    verdicts: list[Verdict] = []
    drained_by_slurmedic: set[str] = set()
    for d in ds:
        if d.action != "drain":
            continue
        for node in d.nodes:
            drained_by_slurmedic.add(node)
            if node in repeats:
                verdicts.append(
                    Verdict(SAME, "drain", (node,), d.at, note=f"drained for {repeats[node]}")
                )
                continue
            match = next((e for e in outages if e.node == node), None)
            if match is None:
                verdicts.append(
                    Verdict(EXTRA, "drain", (node,), d.at, note="nobody took it out of service")
                )
                continue
            who = "Slurm had it down" if match.by == "slurm" else f"{match.user} drained it"
            verdicts.append(
                Verdict(
                    AGREE,
                    "drain",
                    (node,),
                    d.at,
                    match.start,
                    match.start - d.at,
                    note=f"{who}: {match.reason}" if match.reason else who,
                )
            )
    for d in ds:
        if d.action == "escalate" and d.nodes:  # a drain the guards gave to a person
            for node in d.nodes:
                drained_by_slurmedic.add(node)
                match = next((e for e in outages if e.node == node), None)
                then = (
                    f"then: {match.user or match.by} took it out ({match.reason})"
                    if match
                    else "then: nobody took it out of service"
                )
                verdicts.append(Verdict(HANDED, "escalate", (node,), d.at, None, note=then))
    # The guard that found the node out of service already: whoever did it was first.
    first = next((d for d in ds if d.guard == "already_drained"), None)
    for e in outages:
        if e.node not in drained_by_slurmedic and e.by == "person" and e.drained:
            if first is not None and e.node in sk.named:
                verdicts.append(
                    Verdict(
                        AGREE,
                        "drain",
                        (e.node,),
                        first.at,
                        e.start,
                        e.start - first.at,
                        note=f"{e.user} drained it first: {e.reason}",
                    )
                )
                continue
            verdicts.append(
                Verdict(
                    MISS,
                    "drain",
                    (e.node,),
                    None,
                    e.start,
                    note=f"{e.user} drained it ({e.reason}); slurmedic would not have",
                )
            )
    if attempt is not None and ds[0].job is not None:
        outcome = record.after(attempt, until)
        happened.append(outcome)
        verdicts += _judge_job(ds, attempt, outcome, record)
    happened.sort(key=lambda h: h.at)
    cause = next((d.cause for d in ds if d.action != "none"), ds[0].cause)
    return IncidentRow(
        incident,
        ds[0].job,
        attempt,
        fault_at,
        cause,
        tuple(ds),
        tuple(happened),
        tuple(verdicts),
    )


def _judge_job(
    ds: Sequence[Decision], attempt: Attempt, outcome: Happened, record: _Record
) -> list[Verdict]:
    job_ds = [
        d
        for d in ds
        if d.action in ("requeue", "stop") or (d.action in ("escalate", "none") and not d.nodes)
    ]
    if not job_ds:
        return []
    d = next((d for d in job_ds if d.action != "none"), job_ds[0])
    ran_again = outcome.what in ("requeued", "requeued_by_slurm", "resubmitted")
    who = {"requeued_by_slurm": "Slurm requeued it", "resubmitted": "its user resubmitted it"}
    did = who.get(outcome.what, "it was requeued")
    if d.action == "escalate":
        return [Verdict(HANDED, "escalate", (), d.at, outcome.at, note=f"then: {_said(outcome)}")]
    if d.action == "requeue":
        if ran_again:
            gained = outcome.at - d.at
            hours = record.gpus(attempt) * gained.total_seconds() / 3600
            return [
                Verdict(
                    AGREE,
                    "requeue",
                    (),
                    d.at,
                    outcome.at,
                    gained,
                    round(hours, 2) if gained > ZERO else None,
                    note=did,
                )
            ]
        why = (
            "the job went on running"
            if outcome.what == "running"
            else f"nobody ran it again ({_said(outcome)})"
        )
        return [Verdict(EXTRA, "requeue", (), d.at, None, note=why)]
    # stop, or leave the job alone (the failure was the application's, or still running)
    if outcome.what == "resubmitted":
        # A new submission is its user's, after a fix of their own: not what slurmedic does
        # (it requeues the same job), and no operator's requeue it failed to make.
        return [
            Verdict(
                AGREE, d.action, (), d.at, outcome.at, note=f"not requeued; {did} {outcome.detail}"
            )
        ]
    if ran_again:
        return [Verdict(MISS, d.action, (), d.at, outcome.at, note=f"{did}; slurmedic would not")]
    return [Verdict(AGREE, d.action, (), d.at, outcome.at, note=_said(outcome))]


def _who(e: NodeEvent) -> str:
    """Who took a node out, for people: Slurm for its own reasons (whatever uid it ran as)."""
    return "slurm" if e.by == "slurm" else e.user or e.by


def _said(h: Happened) -> str:
    words = {
        "ended": f"ended {h.detail}",
        "running": "still running",
        "requeued": "requeued",
        "requeued_by_slurm": "requeued by Slurm",
        "resubmitted": f"resubmitted {h.detail}",
    }
    return words.get(h.what, h.what)


def _unanswered(
    record: _Record, decided: set[str], start: datetime, until: datetime
) -> list[Unanswered]:
    """People's actions no incident answers: drains of nodes no alert named, and failed
    attempts with no incident that were run again by someone (not Slurm's own requeue)."""
    out = [
        Unanswered(
            Happened(e.start, "drained", e.user, (e.node,), e.reason),
        )
        for i, e in enumerate(record.events)
        if i not in record.used_events
        and e.by == "person"
        and e.drained
        and start <= e.start <= until
    ]
    for a in record.attempts:
        if a.key in decided or a.ended is None or not start <= a.ended <= until:
            continue
        if a.state not in FAILED_STATES and a.state != "REQUEUED":
            continue
        outcome = record.after(a, until)
        if outcome.what in ("requeued", "resubmitted"):
            out.append(Unanswered(outcome, a))
    out.sort(key=lambda u: u.happened.at)
    return out
