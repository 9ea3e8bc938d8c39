"""The engine, sans-I/O: payloads and ticks in (with their time), decisions out.

State: the alerts seen (fingerprint + startsAt, so re-deliveries change nothing), the evidence,
the incidents (keys: webhook.core.incidents) and the guards' memory.

When an incident is decided:
- `settle_seconds` after its first evidence was received, so that the XID explaining a wave of
  NCCL timeouts is in hand first;
- unless all it can say is "stalled" (a hang signal, NCCL timeouts, nothing that names a node):
  then it waits, up to `hang_wait` after it opened, for the evidence that names one (the silent
  rank's peers time out a little after the stall is seen). Evidence that arrives during the wait
  is given a settle window of its own.

Once decided, an incident is revisited when new evidence arrives for it, or when the job whose
running made the decision `none` ends. A revision that changes the decisions supersedes them
(`Decision.revision` counts up; the ledger marks the earlier ones superseded, unless they were
carried out already). An incident whose decision was carried out is closed: what arrives later is
the consequence of the action, not news about the failure. A drain, requeue or stop in monitor
or enforce mode counts as carried out when it is decided (monitor shows what enforce would do);
one waiting for approval is closed by the loop (`close`) once it runs.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta

from webhook.core.alerts import Payload
from webhook.core.attribution import Attribution, attribute, stall_only
from webhook.core.cluster import ClusterView, Job
from webhook.core.decisions import (
    SCHEDULER_ACTIONS,
    Decision,
    GuardState,
    PastAction,
    decide,
    job_ended,
)
from webhook.core.evidence import HARDWARE, Evidence, from_alert
from webhook.core.incidents import IncidentKey
from webhook.core.policy import Policy

EvidenceKey = tuple[str, datetime]  # fingerprint, startsAt to the second (as the ledger keeps it)


def evidence_key(fingerprint: str, starts_at: datetime) -> EvidenceKey:
    return fingerprint, starts_at.replace(microsecond=0)


@dataclass
class Incident:
    key: str
    job: int | None
    node: str | None  # for node incidents
    opened_at: datetime
    evidence: list[Evidence] = field(default_factory=list)
    decided: bool = False
    decided_at: datetime | None = None
    # The decisions in force (the latest revision) and the evidence they were made from.
    standing: list[Decision] = field(default_factory=list)
    known: set[EvidenceKey] = field(default_factory=set)
    revision: int = 0
    # Undecided: the next time to look (a stall's wait); decided: when to look again.
    check_at: datetime | None = None
    # The decision holds only while the job runs (an application symptom): look at its end.
    until_job_ends: bool = False
    closed: bool = False  # carried out: no more revisions


@dataclass(frozen=True)
class Receipt:
    """What one payload did: new evidence, re-deliveries, and alerts that cannot be acted on."""

    new: int
    duplicates: int
    resolved: int
    rejected: tuple[str, ...]
    incidents: tuple[str, ...]


def signature(decisions: Iterable[Decision]) -> set[tuple[object, ...]]:
    """What a set of decisions does, whatever its wording: revisions compare these."""
    return {(d.action, d.cause, tuple(d.nodes), tuple(d.exclude), d.guard) for d in decisions}


@dataclass
class Engine:
    view: ClusterView
    policy: Policy = field(default_factory=Policy)
    guards: GuardState = field(default_factory=GuardState)
    seen: set[tuple[str, datetime]] = field(default_factory=set)
    evidence: list[Evidence] = field(default_factory=list)
    incidents: dict[str, Incident] = field(default_factory=dict)
    # Evidence a restored incident was decided on, and that incident: fed again after a
    # restart, it goes back there, whatever the cluster looks like now (the job it hit has
    # moved on, its node is idle: it is not a new failure of that node).
    decided_on: dict[EvidenceKey, str] = field(default_factory=dict)

    @classmethod
    def with_history(cls, view: ClusterView, policy: Policy, history: list[PastAction]) -> Engine:
        return cls(view=view, policy=policy, guards=GuardState(history=list(history)))

    def restore(self, incidents: Iterable[Incident]) -> None:
        """Incidents decided before a restart (the ledger's), so that their evidence, fed again,
        is known, and a node's next failure is a new incident."""
        for inc in incidents:
            inc.decided = True
            self.incidents[inc.key] = inc
            for key in inc.known:
                self.decided_on.setdefault(key, inc.key)

    def close(self, keys: Iterable[str]) -> None:
        """Incidents whose decisions were carried out: not revised any more."""
        for k in keys:
            if k in self.incidents:
                self.incidents[k].closed = True
                self.incidents[k].check_at = None

    def revisable(self) -> list[str]:
        """Decided incidents a revision is due for (the loop asks the ledger which of them were
        carried out meanwhile, and closes those first)."""
        return [
            i.key
            for i in self.incidents.values()
            if i.decided and not i.closed and i.check_at is not None
        ]

    # ---- input -------------------------------------------------------------------------
    def receive(self, payload: Payload, at: datetime) -> Receipt:
        new = dup = resolved = 0
        rejected: list[str] = []
        touched: set[str] = set()
        for alert in payload.alerts:
            if alert.status != "firing":
                resolved += 1  # a resolved alert is not evidence of a failure
                continue
            key = (alert.fingerprint, alert.startsAt)
            if key in self.seen:
                dup += 1
                continue
            self.seen.add(key)
            new += 1
            ev = from_alert(alert, at, self.view)
            self.evidence.append(ev)
            if not ev.actionable:
                rejected.append(f"{ev.alertname or alert.fingerprint}: {'; '.join(ev.problems)}")
                continue
            before = self.decided_on.get(evidence_key(*key))
            targets = (
                [self.incidents[before]]
                if before in self.incidents
                else self._incidents_for(ev, at)
            )
            for incident in targets:
                incident.evidence.append(ev)
                touched.add(incident.key)
                self._news(incident, evidence_key(*key), at)
        return Receipt(new, dup, resolved, tuple(rejected), tuple(sorted(touched)))

    def _news(self, incident: Incident, key: EvidenceKey, at: datetime) -> None:
        """Evidence arrived: look again a settle window from now (a stall's wait, or a
        revision), unless the incident is undecided and not waiting (its own window runs)."""
        if key in incident.known or incident.closed:
            return
        if incident.decided or incident.check_at is not None:
            self._look_by(incident, at + timedelta(seconds=self.policy.settle_seconds))

    @staticmethod
    def _look_by(incident: Incident, when: datetime) -> None:
        """Look at the incident by `when` at the latest: news never postpones a look already
        due (a trickle of evidence must not hold a decision back)."""
        incident.check_at = min(incident.check_at or when, when)

    def update_view(self, view: ClusterView, at: datetime | None = None) -> None:
        self.view = view
        if at is None:
            return
        settle = at + timedelta(seconds=self.policy.settle_seconds)
        for inc in self.incidents.values():
            if inc.closed or inc.job is None:
                continue
            job = view.jobs.get(inc.job)
            if not inc.decided and inc.check_at is not None and job is not None and job.failed:
                self._look_by(inc, settle)  # a stall's wait ends with the job: nothing more comes
            if inc.until_job_ends and (job is None or job_ended(job)):
                inc.until_job_ends = False
                # Only a failure is news: a job that completed, or that its owner cancelled,
                # leaves the decision (and what people were told) as it was.
                if job is not None and job.failed:
                    self._look_by(inc, settle)

    def _incidents_for(self, ev: Evidence, at: datetime) -> list[Incident]:
        if ev.job is not None:
            job = self.view.jobs.get(ev.job)
            # A job label is believed when the view confirms it (or names no node to check).
            if job is not None and (ev.node is None or ev.node in job.nodes):
                return [self._incident(self._attempt_key(job, ev), job.id, None, at)]
        if ev.node is None:
            return []
        # No job label (or one the view contradicts): the job(s) on the node at startsAt.
        jobs = self.view.jobs_on(ev.node, ev.starts_at)
        if jobs:
            return [self._incident(self._attempt_key(j, ev), j.id, None, at) for j in jobs]
        if ev.signal not in HARDWARE:
            return []  # nothing ran there: only evidence against the node itself matters
        return [self._incident(self._node_key(ev), None, ev.node, at)]

    @staticmethod
    def _attempt_key(job: Job, ev: Evidence) -> str:
        """The attempt that was running when the failure began: a late alert about the attempt
        slurmedic already requeued belongs to that attempt, not to its successor; so does a
        stall whose last progress predates the successor (it has not reported yet)."""
        began = ev.since or ev.starts_at
        attempt = job.restarts
        if job.restarts > 0 and job.started is not None and began < job.started:
            attempt -= 1
        return str(IncidentKey.of_attempt(job.id, attempt))

    def _node_key(self, ev: Evidence) -> str:
        """One incident per failure of an idle node: a failure that starts after the last one
        was decided is a new one."""
        assert ev.node is not None
        key = IncidentKey.of_node(ev.node)
        while str(key) in self.incidents:
            inc = self.incidents[str(key)]
            if not inc.decided or inc.decided_at is None or ev.starts_at <= inc.decided_at:
                break
            key = key.next_failure()
        return str(key)

    def _incident(self, key: str, job: int | None, node: str | None, at: datetime) -> Incident:
        if key not in self.incidents:
            self.incidents[key] = Incident(key=key, job=job, node=node, opened_at=at)
        return self.incidents[key]

    # ---- time --------------------------------------------------------------------------
    def due_at(self, incident: Incident) -> datetime | None:
        if incident.closed:
            return None
        if incident.decided:
            return incident.check_at
        return incident.check_at or incident.opened_at + timedelta(
            seconds=self.policy.settle_seconds
        )

    def next_due(self) -> datetime | None:
        due = [d for i in self.incidents.values() if (d := self.due_at(i)) is not None]
        return min(due) if due else None

    def tick(self, now: datetime) -> list[Decision]:
        """Decide (or revise) every incident that is due, earliest first."""
        due = sorted(
            (
                (d, i)
                for i in self.incidents.values()
                if (d := self.due_at(i)) is not None and d <= now
            ),
            key=lambda p: (p[0], p[1].key),
        )
        decisions: list[Decision] = []
        for _, incident in due:
            decisions += self._decide(incident, now)
        return decisions

    def _decide(self, incident: Incident, now: datetime) -> list[Decision]:
        job = self.view.jobs.get(incident.job) if incident.job is not None else None
        job_nodes = job.nodes if job else ((incident.node,) if incident.node else ())
        # A revision is tried on a copy of the guards without this incident's own actions: it
        # replaces them, and changes nothing when it decides the same.
        trial = self.guards.without(incident.key) if incident.decided else self.guards
        try:
            attr = attribute(
                incident.evidence,
                job_nodes,
                self.view,
                self.evidence,
                self.policy.shared_cause,
                now,
            )
            wait_until = incident.opened_at + self.policy.hang_wait
            # A job that ended (a fault, scancel, its time limit) has nothing more to say: its
            # ranks are gone. Only a running one is waited for.
            waits = stall_only(attr, incident.evidence) and not (job and job_ended(job))
            if not incident.decided and waits and now < wait_until:
                incident.check_at = wait_until  # evidence that arrives sooner looks sooner
                return []
            made = decide(
                incident=incident.key,
                attr=attr,
                job=job,
                evidence=incident.evidence,
                view=self.view,
                policy=self.policy,
                guards=trial,
                now=now,
            )
        except Exception as e:  # one bad incident must not stop the others
            attr = Attribution("unknown", (), "")
            made = [
                Decision(
                    at=now,
                    incident=incident.key,
                    job=incident.job,
                    action="escalate",
                    cause="unknown",
                    reason=f"slurmedic could not decide: {e!r}"[:300],
                    guard="engine_error",
                )
            ]
        incident.check_at = None
        incident.known |= {evidence_key(e.fingerprint, e.starts_at) for e in incident.evidence}
        incident.until_job_ends = until_job_ends(made, job)
        # A scheduler action in monitor or enforce mode is carried out now (monitor's dry run
        # stands for it: monitor shows what enforce does); approve waits for a human, and the
        # loop closes the incident once the action runs.
        if any(d.action in SCHEDULER_ACTIONS and d.mode != "approve" for d in made):
            incident.closed = True
        if incident.decided:
            # Nothing to decide any more (Slurm forgot the job) is no reason to undo anything.
            if not made or signature(made) == signature(incident.standing):
                return []
            self.guards.adopt(trial)
            incident.revision += 1
            made = [_superseding(d, incident) for d in made]
        incident.decided, incident.decided_at = True, now
        incident.standing = made
        return made


def until_job_ends(made: Iterable[Decision], job: Job | None) -> bool:
    """Whether decisions were made because the job still runs (an application's symptom, an
    unknown failure of a running job): its end, when it fails, is news."""
    made = list(made)
    if any(d.guard == "job_running" for d in made):
        return True
    unknown = any(d.cause == "unknown" and d.action == "escalate" and not d.guard for d in made)
    return unknown and (job is None or not job_ended(job))


def _superseding(d: Decision, incident: Incident) -> Decision:
    """A revision's decision, saying what it replaces."""
    old = "; ".join(sorted({f"{o.action} ({o.cause})" for o in incident.standing}))
    why = next((o.reason for o in incident.standing if o.action != "none"), "")
    if not why and incident.standing:
        why = incident.standing[0].reason
    reason = f"{d.reason} [supersedes {old}: {why}]"
    return replace(d, revision=incident.revision, reason=reason[:1000])
