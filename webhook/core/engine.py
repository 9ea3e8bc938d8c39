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
            return [self._incident(self._job_key(ev.job, job), ev.job, None, at)]
        if ev.node is None:
            return []
        # No job label: the job(s) that ran on the node when the alert started.
        jobs = self.view.jobs_on(ev.node, ev.starts_at)
        if jobs:
            return [self._incident(j.attempt, j.id, None, at) for j in jobs]
        if ev.signal not in HARDWARE:
            return []  # nothing ran there: only evidence against the node itself matters
        return [self._incident(f"node:{ev.node}", None, ev.node, at)]

    @staticmethod
    def _job_key(job_id: int, job: Job | None) -> str:
        return job.attempt if job else f"{job_id}.0"

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
            incident.decided = True
            at = now
            job = self.view.jobs.get(incident.job) if incident.job is not None else None
            job_nodes = job.nodes if job else ((incident.node,) if incident.node else ())
            attr = attribute(
                incident.evidence, job_nodes, self.view, self.evidence, self.policy.shared_cause, at
            )
            decisions += decide(
                incident=incident.key,
                attr=attr,
                job=job,
                evidence=incident.evidence,
                view=self.view,
                policy=self.policy,
                guards=self.guards,
                now=at,
            )
        return decisions
