"""The engine, sans-I/O: payloads and ticks in (with their time), decisions out.

State: the alerts seen (fingerprint + startsAt, so re-deliveries change nothing), the evidence,
the incidents (one per job attempt, `<job>.<restarts>`, or one per idle node, `node:<name>`) and
the guards' memory. An incident is decided once, `settle_seconds` after its first evidence was
received, so that the XID explaining a wave of NCCL timeouts is in hand first.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta

from webhook.core.alerts import Payload
from webhook.core.attribution import attribute
from webhook.core.cluster import ClusterView, Job
from webhook.core.decisions import Decision, GuardState, PastAction, decide
from webhook.core.evidence import HARDWARE, Evidence, from_alert
from webhook.core.policy import Policy


@dataclass
class Incident:
    key: str
    job: int | None
    node: str | None  # for node incidents
    opened_at: datetime
    evidence: list[Evidence] = field(default_factory=list)
    decided: bool = False
    decided_at: datetime | None = None


@dataclass(frozen=True)
class Receipt:
    """What one payload did: new evidence, re-deliveries, and alerts that cannot be acted on."""

    new: int
    duplicates: int
    resolved: int
    rejected: tuple[str, ...]
    incidents: tuple[str, ...]


@dataclass
class Engine:
    view: ClusterView
    policy: Policy = field(default_factory=Policy)
    guards: GuardState = field(default_factory=GuardState)
    seen: set[tuple[str, datetime]] = field(default_factory=set)
    evidence: list[Evidence] = field(default_factory=list)
    incidents: dict[str, Incident] = field(default_factory=dict)

    @classmethod
    def with_history(cls, view: ClusterView, policy: Policy, history: list[PastAction]) -> Engine:
        return cls(view=view, policy=policy, guards=GuardState(history=list(history)))

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
            for incident in self._incidents_for(ev, at):
                incident.evidence.append(ev)
                touched.add(incident.key)
        return Receipt(new, dup, resolved, tuple(rejected), tuple(sorted(touched)))

    def update_view(self, view: ClusterView) -> None:
        self.view = view

    def _incidents_for(self, ev: Evidence, at: datetime) -> list[Incident]:
        if ev.job is not None:
            job = self.view.jobs.get(ev.job)
            # A job label is believed when the view confirms it (or names no node to check).
            if job is not None and (ev.node is None or ev.node in job.nodes):
                return [self._incident(self._attempt_key(job, ev.starts_at), job.id, None, at)]
        if ev.node is None:
            return []
        # No job label (or one the view contradicts): the job(s) on the node at startsAt.
        jobs = self.view.jobs_on(ev.node, ev.starts_at)
        if jobs:
            return [
                self._incident(self._attempt_key(j, ev.starts_at), j.id, None, at) for j in jobs
            ]
        if ev.signal not in HARDWARE:
            return []  # nothing ran there: only evidence against the node itself matters
        return [self._incident(self._node_key(ev), None, ev.node, at)]

    @staticmethod
    def _attempt_key(job: Job, starts_at: datetime) -> str:
        """The attempt that was running when the alert started: a late alert about the attempt
        slurmedic already requeued belongs to that attempt, not to its successor."""
        if job.restarts > 0 and job.started is not None and starts_at < job.started:
            return f"{job.id}.{job.restarts - 1}"
        return job.attempt

    def _node_key(self, ev: Evidence) -> str:
        """One incident per failure of an idle node: a new failure after a decision is new."""
        key, n = f"node:{ev.node}", 1
        while key in self.incidents:
            inc = self.incidents[key]
            if not inc.decided or inc.decided_at is None or ev.starts_at <= inc.decided_at:
                return key
            n += 1
            key = f"node:{ev.node}#{n}"
        return key

    def _incident(self, key: str, job: int | None, node: str | None, at: datetime) -> Incident:
        if key not in self.incidents:
            self.incidents[key] = Incident(key=key, job=job, node=node, opened_at=at)
        return self.incidents[key]

    # ---- time --------------------------------------------------------------------------
    def due_at(self, incident: Incident) -> datetime:
        return incident.opened_at + timedelta(seconds=self.policy.settle_seconds)

    def next_due(self) -> datetime | None:
        pending = [self.due_at(i) for i in self.incidents.values() if not i.decided]
        return min(pending) if pending else None

    def tick(self, now: datetime) -> list[Decision]:
        """Decide every incident whose settle window has passed, earliest first."""
        due = sorted(
            (i for i in self.incidents.values() if not i.decided and self.due_at(i) <= now),
            key=lambda i: (self.due_at(i), i.key),
        )
        decisions: list[Decision] = []
        for incident in due:
            at = now
            job = self.view.jobs.get(incident.job) if incident.job is not None else None
            job_nodes = job.nodes if job else ((incident.node,) if incident.node else ())
            try:
                attr = attribute(
                    incident.evidence,
                    job_nodes,
                    self.view,
                    self.evidence,
                    self.policy.shared_cause,
                    at,
                )
                made = decide(
                    incident=incident.key,
                    attr=attr,
                    job=job,
                    evidence=incident.evidence,
                    view=self.view,
                    policy=self.policy,
                    guards=self.guards,
                    now=at,
                )
            except Exception as e:  # one bad incident must not stop the others
                made = [
                    Decision(
                        at=at,
                        incident=incident.key,
                        job=incident.job,
                        action="escalate",
                        cause="unknown",
                        reason=f"slurmedic could not decide: {e!r}"[:300],
                        guard="engine_error",
                    )
                ]
            incident.decided, incident.decided_at = True, at
            decisions += made
        return decisions
