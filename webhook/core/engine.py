"""The engine, sans-I/O: payloads and ticks in (with their time), decisions out.

State: the alerts seen (fingerprint + startsAt, so re-deliveries change nothing), the incidents
(keys: webhook.core.incidents), rule 5's count of failing nodes and the guards' memory.

Which incident: the attempt the alert's job label names (when the view places that job on the
alert's node), else the attempt(s) that held the node when the alert started; evidence against
the node itself also goes to the attempts that failed there within `node_alert_lag` before with
no job started since (a node's alert fires after its job died of the fault), and with none of
those, to a failure of the idle node, unless it started while slurmedic's own repair had the node
out of service (`in_repair`: a reboot's down node is no failure; the repair's check judges). An
attempt whose decision was carried out takes no hardware evidence on a node its decisions did
not name: that is the node's own failure.

When an incident is decided:
- `settle_seconds` after its first evidence was received, so that the XID explaining a wave of
  NCCL timeouts is in hand first;
- unless all it can say is "stalled" (a hang signal, NCCL timeouts, nothing that names a node):
  then it waits, up to `hang_wait` after it opened, for the evidence that names one (the silent
  rank's peers time out a little after the stall is seen); once the job has ended, up to
  `blame_wait` (its nodes' own alerts fire after a job NCCL's errors ended in seconds), also
  when its ranks' task failures echo the stall. Evidence that arrives during the wait is given
  a settle window of its own.

Once decided, an incident is revisited when new evidence arrives for it, or when the job whose
running made the decision `none` ends. A revision that changes the decisions supersedes them
(`Decision.revision` counts up; the ledger marks the earlier ones superseded, unless they were
carried out already). An incident whose decision was carried out is closed: what arrives later is
the consequence of the action, not news about the failure. A drain, requeue or stop in monitor
or enforce mode counts as carried out when it is decided (monitor shows what enforce would do);
one waiting for approval is closed by the loop (`close`) once it runs.

Cost: each alert, decision and view costs what it touches, not what the engine remembers: the
incidents due are kept in time order, the ones waiting on a job by job, and rule 5's failing
nodes per switch (webhook.core.shared_cause).

Memory: the policy's `retention`. An incident decided longer ago than that, with nothing left
to wait for, is forgotten once no alert can reach it any more: an attempt whose job Slurm has
forgotten (or that has restarted twice since), any failure of an idle node (the node's next
failure still gets the next key: the engine keeps the last one). So are the alerts seen that
were last delivered before it (Alertmanager repeats a firing alert well within it) and the
guards' history older than it, but for the exclusions Slurm still keeps for a job it knows (the
readmit and room stages need them for as long as the job lives). Evidence of a forgotten node
failure (it started before that failure was decided) is history, not news: it is not acted on.
"""

from __future__ import annotations

import heapq
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta

from webhook.core.alerts import Payload
from webhook.core.attribution import Attribution, attribute, blames_nobody, stall_only
from webhook.core.cluster import ClusterView, Job
from webhook.core.decisions import (
    DRAIN_CAUSES,
    LEFT_RUNNING,
    Counted,
    Decision,
    GuardState,
    PastAction,
    closes,
    leaves_running,
)
from webhook.core.evidence import Evidence, from_alert
from webhook.core.failures import APP_XID, WATCHED_XIDS, Failure, FailureMemory
from webhook.core.guards import decide, decide_recovery
from webhook.core.incidents import IncidentKey, attempt_of
from webhook.core.node_names import Unmatched
from webhook.core.policy import SHARED, Policy
from webhook.core.recovery import Verdict, Watch, remembered
from webhook.core.repairs import Window
from webhook.core.shared_cause import FailingNodes, Judged, Judgement, SharedCauses
from webhook.core.signals import AGAINST_NODE, APPLICATION, UNREACHABLE
from webhook.core.slowdown import requeue_at

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
    # The nodes of its evidence rule 5 covered when it was decided, and why (Judged).
    shared: Judgement = field(default_factory=dict)


@dataclass(frozen=True)
class Restored:
    """An incident as the ledger keeps it, for a restart: when it opened and was decided, the
    decisions in force, the evidence they were made from (its keys), the revision it reached,
    which of its actions were carried out (or counted so: monitor and enforce decisions), and
    rule 5's judgement of its evidence. Not `current`: not one of the engine's own, or decided
    before the retention (it comes back closed, a key and its times: a node's next failure
    still gets the next key)."""

    key: str
    opened_at: datetime
    decided_at: datetime
    standing: tuple[Decision, ...] = ()
    known: frozenset[EvidenceKey] = frozenset()
    revision: int = 0
    carried: frozenset[str] = frozenset()
    shared: Judgement = field(default_factory=dict)
    current: bool = True


@dataclass(frozen=True)
class Snapshot:
    """What the ledger holds of the engine's state (Engine.restore): the incidents, the guards'
    history since `since` and the older actions that say what Slurm still excludes for a job
    (`exclusions`), when the record begins, and the breaker."""

    incidents: Sequence[Restored] = ()
    history: Sequence[PastAction] = ()
    exclusions: Sequence[PastAction] = ()
    # Drains older than `since`, within `repeats.window`: a node that fails again is a repeat.
    drains: Sequence[PastAction] = ()
    # Application-class XIDs on GPUs, within `repeats.window` (webhook.core.failures).
    failures: Sequence[Failure] = ()
    since: datetime | None = None
    jobs: Collection[int] | None = None  # the jobs Slurm knows (None: no view yet)
    memory_since: datetime | None = None
    breaker_open: bool = False
    breaker_reset_at: datetime | None = None


@dataclass(frozen=True)
class Receipt:
    """What one payload did: new evidence, re-deliveries, and alerts that cannot be acted on."""

    new: int
    duplicates: int
    resolved: int
    rejected: tuple[str, ...]
    incidents: tuple[str, ...]
    # The hosts its alerts named that are no node of the cluster (webhook.core.node_names).
    unmatched: tuple[str, ...] = ()


def signature(decisions: Iterable[Decision]) -> set[tuple[object, ...]]:
    """What a set of decisions does, whatever its wording: revisions compare these. An
    escalation hands the incident to a person whatever nodes it names (a storm that grew is the
    same storm)."""
    return {
        (
            d.action,
            d.cause,
            () if d.action == "escalate" else tuple(d.nodes),
            tuple(d.exclude),
            d.guard,
        )
        for d in decisions
    }


# How often (engine time) forgotten things are swept out, as a share of the retention.
SWEEPS_PER_RETENTION = 24


@dataclass
class Engine:
    view: ClusterView
    policy: Policy = field(default_factory=Policy)
    guards: GuardState = field(default_factory=GuardState)
    # Alerts seen (fingerprint, startsAt), and when each was last delivered.
    seen: dict[tuple[str, datetime], datetime] = field(default_factory=dict)
    incidents: dict[str, Incident] = field(default_factory=dict)
    # Evidence a restored incident was decided on, and that incident: fed again after a
    # restart, it goes back there, whatever the cluster looks like now (the job it hit has
    # moved on, its node is idle: it is not a new failure of that node).
    # (An alert with no job label on a node several jobs shared went to each of them.)
    decided_on: dict[EvidenceKey, tuple[str, ...]] = field(default_factory=dict)
    failing: FailingNodes = field(default_factory=FailingNodes, repr=False)
    # Per idle node, the last of its failures that was forgotten: (its number, decided when).
    forgotten_nodes: dict[str, tuple[int, datetime]] = field(default_factory=dict, repr=False)
    # Per node, when slurmedic's own repairs had it out of service (from, until; None: still):
    # what a reboot or check does to a node (down, not responding) is no failure of it.
    repairing: dict[str, tuple[Window, ...]] = field(default_factory=dict, repr=False)
    # Indexes over `incidents`, kept by `_indexed` whenever an incident changes:
    # (when due, key), in time order; entries an incident's later change outdated stay behind
    # and are skipped.
    _due: list[tuple[datetime, str]] = field(default_factory=list, init=False, repr=False)
    _revisable: set[str] = field(default_factory=set, init=False, repr=False)
    # Incidents the end of their job is news for, by job.
    _on_job: dict[int, set[str]] = field(default_factory=dict, init=False, repr=False)
    _swept_at: datetime | None = field(default=None, init=False, repr=False)
    _attempt_keys: dict[tuple[int, int], str] = field(default_factory=dict, init=False, repr=False)
    # Decided incidents looked at again whose decisions stayed, but whose evidence or rule 5's
    # judgement of it changed: the ledger must keep those too (take_rejudged).
    _rejudged: set[str] = field(default_factory=set, init=False, repr=False)
    # Failures remembered since the ledger last took them (take_failures).
    _new_failures: list[Failure] = field(default_factory=list, init=False, repr=False)
    # Alerts naming no node of the cluster since the last take_unmatched, by host.
    _unmatched: dict[str, Unmatched] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        self._given = self.policy  # as the operator wrote it (learn_failure_rate)
        for inc in self.incidents.values():
            self._indexed(inc)

    @classmethod
    def with_history(cls, view: ClusterView, policy: Policy, history: list[PastAction]) -> Engine:
        return cls(view=view, policy=policy, guards=GuardState(history=list(history)))

    def restore(self, snapshot: Snapshot) -> None:
        """The state before a restart, as the ledger holds it: the guards' memory, and the
        incidents decided, so that their evidence, fed again, is known and a node's next
        failure is a new incident. Those past the retention are forgotten at the next tick, as
        they would have been without the restart."""
        older = GuardState(history=list(snapshot.exclusions))
        # Older exclusions too: Slurm keeps a job's ExcNodeList for as long as the job lives
        # (the jobs Slurm knows, or all of them before the first view; the sweep prunes).
        alive = snapshot.jobs
        if alive is None:
            alive = {h.job for h in older.history if h.job is not None}
        in_force = older.exclusions_in_force(snapshot.since, alive) if snapshot.since else []
        kept = {(h.incident, h.at) for h in in_force if h.action == "drain"}
        drains = [h for h in snapshot.drains if (h.incident, h.at) not in kept]
        self.guards.history = sorted([*in_force, *drains], key=lambda h: h.at) + list(
            snapshot.history
        )
        self.guards.gpu_faults = FailureMemory(snapshot.failures)
        self.guards.memory_since = snapshot.memory_since
        self.guards.breaker_open = snapshot.breaker_open
        self.guards.breaker_reset_at = snapshot.breaker_reset_at
        for r in snapshot.incidents:
            self._restored(r)

    def _restored(self, r: Restored) -> None:
        parsed = IncidentKey.parse(r.key)
        inc = Incident(
            key=r.key,
            job=parsed.job if parsed.kind == "attempt" else None,
            node=parsed.node,
            opened_at=r.opened_at,
            decided=True,
            decided_at=r.decided_at,
            standing=list(r.standing),
            known=set(r.known),
            revision=r.revision,
            closed=not r.current,
            shared=dict(r.shared),
        )
        # Whether its job's end is news, from the decisions in force and this engine's policy
        # (a switch's escalation watches its job with requeue_away).
        inc.until_job_ends = until_job_ends(
            inc.standing, None, shared=self.policy.shared_cause.requeue_away and not inc.closed
        )
        # Closed by what of it was carried out, as a decision is (`closes`).
        if closes(r.carried, inc.standing):
            inc.closed = True
        if inc.closed:
            inc.until_job_ends = until_job_ends(inc.standing, None)
        self.incidents[inc.key] = inc
        for key in inc.known:
            self.decided_on[key] = (*self.decided_on.get(key, ()), inc.key)
        self._indexed(inc)

    # ---- what people and the executor did: inputs like any other ---------------------------
    @property
    def breaker_open(self) -> bool:
        return self.guards.breaker_open

    def reset_breaker(self, at: datetime) -> None:
        """A person reset the breaker (`slurmedic breaker reset`): drains before `at` stop
        counting."""
        self.guards.reset_breaker(at)

    def learn_failure_rate(self, rate: float | None) -> None:
        """The cluster's own failure rate, learned from the ledger (failures.learned_rate): it
        replaces the policy's default, which bursts are judged against and the retry budget
        scales with, unless the policy file sets `failure_rate` itself. None: not learned yet."""
        if rate is None or "failure_rate" in self._given.model_fields_set:
            return
        self.policy = self._given.model_copy(update={"failure_rate": rate})

    def in_repair(self, windows: Mapping[str, Sequence[Window]]) -> None:
        """When slurmedic's repairs of nodes (webhook.core.repairs.out_of_service) had them out of
        service, as the ledger holds them now: evidence against such a node that started then is
        the repair's own doing (a node rebooted with nextstate=DOWN alerts down), and the
        repair's health check, not a new drain, judges the node."""
        self.repairing = {node: tuple(w) for node, w in windows.items() if w}

    def _repairs_own(self, ev: Evidence) -> bool:
        assert ev.node is not None
        return any(
            start <= ev.starts_at and (end is None or ev.starts_at <= end)
            for start, end in self.repairing.get(ev.node, ())
        )

    def switch(self, monitor: bool) -> None:
        """The global switch to monitor mode, on or off (`slurmedic switch`)."""
        self.guards.monitor_forced = monitor

    def settle(self, states: Mapping[tuple[str, str, datetime], str]) -> None:
        """What became of decisions (incident, action, time -> their state now): rejected and
        expired ones never run, those not run yet are held (GuardState.settle)."""
        self.guards.settle(states)

    def judged(
        self, watch: Watch, verdict: Verdict, job: Job | None, now: datetime
    ) -> list[Decision]:
        """A recovery check's verdict on a requeued job's successor: the guards remember a
        recovery, or a failure that was the job's own; a failed one is escalated, and the
        running attempt stopped when the job keeps failing before a first checkpoint: planned
        by the core (webhook.core.recovery) and through the same guard pipeline as every
        decision (`no_progress` says whether to stop, `scope` and `mode` as for any)."""
        kept = remembered(watch, verdict, now)
        if kept is not None:
            self.guards.apply([Counted(kept)])
        if verdict.state != "failed":
            return []
        outcome = decide_recovery(
            watch=watch,
            verdict=verdict,
            job=job,
            view=self.view,
            policy=self.policy,
            guards=self.guards,
            now=now,
        )
        self.guards.apply(outcome.effects)
        return list(outcome.decisions)

    def close(self, carried: Mapping[str, Collection[str]]) -> None:
        """Incidents some of whose actions were carried out (incident -> those actions): not
        revised any more, unless all that ran leaves their job running (`closes`)."""
        for k, actions in carried.items():
            if (inc := self.incidents.get(k)) is None or not closes(actions, inc.standing):
                continue
            inc.closed, inc.check_at = True, None
            self._indexed(inc)
            # Hardware evidence that joined it after the decision now carried out (approved
            # meanwhile), on a node its decisions did not name: the node's own failure,
            # routed again (it would otherwise wait in a closed incident for nothing).
            late = [e for e in inc.evidence if self._unseen_elsewhere(inc, e)]
            if not late:
                continue
            inc.evidence = [e for e in inc.evidence if e not in late]
            for ev in late:
                self._route(ev, self._incidents_for(ev, ev.received_at), ev.received_at)

    @staticmethod
    def _unseen_elsewhere(inc: Incident, ev: Evidence) -> bool:
        """Whether `ev` is news `inc`'s carried-out decision cannot take: hardware evidence it
        did not see, on a node none of its decisions named (drained, found drained already,
        excluded, handed to a person)."""
        if not inc.closed or ev.node is None or ev.signal not in AGAINST_NODE:
            return False
        if evidence_key(ev.fingerprint, ev.starts_at) in inc.known:
            return False
        return not any(ev.node in d.nodes or ev.node in d.exclude for d in inc.standing)

    def revisable(self) -> list[str]:
        """Decided incidents a revision is due for (the loop asks the ledger which of them were
        carried out meanwhile, and closes those first)."""
        return sorted(self._revisable)

    # ---- input -------------------------------------------------------------------------
    def receive(self, payload: Payload, at: datetime) -> Receipt:
        new = dup = resolved = 0
        rejected: list[str] = []
        touched: set[str] = set()
        unmatched: set[str] = set()
        for alert in payload.alerts:
            if alert.status != "firing":
                resolved += 1  # a resolved alert is not evidence of a failure
                continue
            key = (alert.fingerprint, alert.startsAt)
            seen = key in self.seen
            self.seen[key] = at
            if seen:
                dup += 1
                continue
            new += 1
            ev = from_alert(alert, at, self.view, self.policy.node_names)
            if ev.unmatched is not None:
                self._tally(ev, at)
                unmatched.add(ev.unmatched)
            if not ev.actionable:
                rejected.append(f"{ev.alertname or alert.fingerprint}: {'; '.join(ev.problems)}")
                continue
            self.failing.add(ev)
            known = evidence_key(*key)
            before = [
                self.incidents[k] for k in self.decided_on.get(known, ()) if k in self.incidents
            ]
            targets = before or self._incidents_for(ev, at)
            touched |= self._route(ev, targets, at)
        return Receipt(
            new, dup, resolved, tuple(rejected), tuple(sorted(touched)), tuple(sorted(unmatched))
        )

    def _tally(self, ev: Evidence, at: datetime) -> None:
        host = ev.unmatched
        assert host is not None
        seen = self._unmatched.get(host)
        if seen is None:
            hint = self.policy.node_names.hint(host, self.view.nodes)
            seen = self._unmatched[host] = Unmatched(host, ev.alertname, hint, at, at)
        seen.alerts += 1
        seen.last = at

    def take_unmatched(self) -> list[Unmatched]:
        """The hosts alerts named since the last call that are no node of the cluster: for the
        service to log, count and show (an alert that cannot be acted on is never silent)."""
        taken, self._unmatched = self._unmatched, {}
        return sorted(taken.values(), key=lambda u: u.host)

    def _route(self, ev: Evidence, targets: list[Incident], at: datetime) -> set[str]:
        """Give `ev` to its incidents: news for each (the keys). An application-class XID on a
        GPU is remembered under each job it hit (webhook.core.failures)."""
        known = evidence_key(ev.fingerprint, ev.starts_at)
        watched = ev.signal in APPLICATION and ev.xid in WATCHED_XIDS and ev.gpu and ev.node
        for incident in targets:
            incident.evidence.append(ev)
            self._news(incident, known, at)
            if watched and ev.node and incident.job is not None:
                self._failed(
                    Failure(
                        at=ev.starts_at,
                        node=ev.node,
                        kind=f"{APP_XID}{ev.xid}",
                        incident=incident.key,
                        job=incident.job,
                        gpu=ev.gpu,
                    )
                )
        return {incident.key for incident in targets}

    def _failed(self, f: Failure) -> None:
        if self.guards.gpu_faults.add(f):
            self._new_failures.append(f)

    def take_failures(self) -> list[Failure]:
        """The failures remembered since the last call: for the ledger to keep (a restart
        restores them from it, Snapshot.failures)."""
        taken, self._new_failures = self._new_failures, []
        return taken

    def _suspects(self, incident: Incident, now: datetime) -> dict[str, list[Failure]]:
        """The GPUs of the incident's application-class XIDs that showed one under other jobs
        within `repeats.window`, as many as `repeats.count` with this one: those faults."""
        rules = self.policy.repeats
        found: dict[str, list[Failure]] = {}
        for e in incident.evidence:
            if e.gpu is None or e.xid not in WATCHED_XIDS or e.signal not in APPLICATION:
                continue
            earlier = [
                f
                for f in self.guards.gpu_faults.on_gpu(e.gpu, now - rules.window)
                if f.job != incident.job and f.at <= e.starts_at
            ]
            if len({f.job for f in earlier}) + 1 >= rules.count:
                found[e.gpu] = earlier
        return found

    def remember(self, payload: Payload, at: datetime) -> None:
        """Alerts from before a restart that are history, not evidence for an incident: rule 5
        still counts their nodes' failures (whether a switch's storm grew cluster-wide is judged
        from them, as it would have been without the restart)."""
        for alert in payload.alerts:
            if alert.status == "firing":
                self.failing.add(from_alert(alert, at, self.view, self.policy.node_names))

    def _news(self, incident: Incident, key: EvidenceKey, at: datetime) -> None:
        """Evidence arrived: look again a settle window from now (a stall's wait, or a
        revision), unless the incident is undecided and not waiting (its own window runs).
        Evidence it was decided on, fed again after a restart, only brings back the look a slow
        job's next checkpoint was due (the ledger keeps no clock)."""
        if incident.closed:
            return
        if key in incident.known:
            if incident.check_at is None and (
                due := self._checkpoint_written(incident, incident.standing)
            ):
                self._look_by(incident, due)
            return
        if incident.decided or incident.check_at is not None:
            self._look_by(incident, at + timedelta(seconds=self.policy.settle_seconds))

    def _look_by(self, incident: Incident, when: datetime) -> None:
        """Look at the incident by `when` at the latest: news never postpones a look already
        due (a trickle of evidence must not hold a decision back)."""
        incident.check_at = min(incident.check_at or when, when)
        self._indexed(incident)

    def update_view(self, view: ClusterView, at: datetime | None = None) -> None:
        self.view = view
        if at is None:
            return
        settle = at + timedelta(seconds=self.policy.settle_seconds)
        for job_id in list(self._on_job):
            job = view.jobs.get(job_id)
            for key in sorted(self._on_job.get(job_id, ())):
                inc = self.incidents[key]
                if not inc.decided and inc.check_at is not None and job is not None and job.failed:
                    # Its ranks have nothing more to say: look again (blame_wait may still
                    # hold it for its nodes' own alerts).
                    self._look_by(inc, settle)
                # Slurm requeued the job by itself (its attempt moved on): the attempt this
                # incident watched has ended, and what ends later is another attempt's.
                moved_on = job is not None and attempt_of(inc.key) < job.restarts
                if inc.until_job_ends and (job is None or job.has_ended or moved_on):
                    inc.until_job_ends = False
                    # Only a failure is news: a job that completed, or that its owner cancelled,
                    # leaves the decision (and what people were told) as it was. For a storm's
                    # escalation (requeue_away), nor is an end from before it was decided (an
                    # incident restored, or watched before the view had the job): moving the
                    # job now would act on an old failure; it waits for the person.
                    ended = job.ended if job is not None else None
                    known = (
                        ended is not None
                        and inc.decided_at is not None
                        and ended <= inc.decided_at
                        and any(d.cause == SHARED for d in inc.standing)
                    )
                    if job is not None and job.failed and not known and not moved_on:
                        self._look_by(inc, settle)
                    self._indexed(inc)

    def _incidents_for(self, ev: Evidence, at: datetime) -> list[Incident]:
        if ev.job is not None:
            job = self.view.jobs.get(ev.job)
            # A job label is believed when the view confirms it, or names no node to check: Slurm
            # forgets the nodes of an attempt it requeued (and holds) while the next one waits.
            if job is not None and (
                ev.node is None
                or ev.node in job.nodes
                or (job.waiting and job.restarts > 0 and not job.nodes)
            ):
                return self._or_the_node(
                    [self._incident(self._attempt_key(job, ev), job.id, None, at)], ev, at
                )
        if ev.node is None:
            return []
        # No job label (or one the view contradicts): the job(s) on the node at startsAt.
        jobs = self.view.jobs_on(ev.node, ev.starts_at)
        if jobs:
            attempts = [self._incident(self._attempt_key(j, ev), j.id, None, at) for j in jobs]
            if ev.signal in AGAINST_NODE:
                # A job that shared the node and died of the fault before the alert fired is
                # its victim too (a packed node: the one still running is not the only one).
                held = {i.key for i in attempts}
                attempts += [i for i in self._failed_before(ev, at) if i.key not in held]
            return self._or_the_node(attempts, ev, at)
        if ev.signal not in AGAINST_NODE or self._repairs_own(ev):
            # Nothing ran there: only evidence against the node itself matters, and not what
            # slurmedic's own repair of it did.
            return []
        if late := self._failed_before(ev, at):
            return late
        return self._node_failure(ev, at)

    def _or_the_node(self, attempts: list[Incident], ev: Evidence, at: datetime) -> list[Incident]:
        """The attempts' incidents, except that hardware evidence their carried-out decisions
        did not see, on a node none of them named, is the node's own failure (a GPU that fell
        off the bus after the job was stopped as the user's bug)."""
        kept = [inc for inc in attempts if not self._unseen_elsewhere(inc, ev)]
        if len(kept) == len(attempts):
            return attempts
        keys = {inc.key for inc in kept}
        return kept + [n for n in self._node_failure(ev, at) if n.key not in keys]

    def _node_failure(self, ev: Evidence, at: datetime) -> list[Incident]:
        key = self._node_key(ev)
        return [self._incident(key, None, ev.node, at)] if key is not None else []

    def _failed_before(self, ev: Evidence, at: datetime) -> list[Incident]:
        """The attempts that failed on the node within `node_alert_lag` before the alert
        started, with no job started there since, when their incidents can still take it: the
        alert is late news of their failure, not of an idle node's (a fabric port down fires
        after its `for: 1m`, and Prometheus's startsAt is when it fired; NCCL reported the dead
        link in seconds and the job ended before). An attempt whose decision was carried out
        (requeued, stopped) cannot: the node's failure is then its own, drained as such."""
        assert ev.node is not None
        lag = self.policy.node_alert_lag
        jobs = self.view.failed_on(ev.node, ev.starts_at - lag, ev.starts_at) if lag else []
        found = []
        for job in jobs:
            key = self._attempt_key(job, ev)
            if key not in self.incidents or not self.incidents[key].closed:
                found.append(self._incident(key, job.id, None, at))
        return found

    def _attempt_key(self, job: Job, ev: Evidence) -> str:
        """The attempt that was running when the failure began: a late alert about the attempt
        slurmedic already requeued belongs to that attempt, not to its successor, and so does
        every alert while the successor waits to start (Slurm's start_time of a waiting job is
        no start); so does a stall whose last progress predates the successor (it has not
        reported yet)."""
        began = ev.since or ev.starts_at
        attempt = job.restarts
        not_yet = job.waiting or (job.started is not None and began < job.started)
        if job.restarts > 0 and not not_yet and ev.failed_at is not None:
            # A task failure whose line was read before slurmedic decided to requeue the attempt
            # before this one: its second alert (lines read in two scrapes), firing after the
            # successor started. The decision, not the successor's start, is the bound: the
            # line's time is the node's clock, and the successor's own crash must not pass for
            # the old one. Only a requeue's, and never past the start: a revision, or a first
            # decision after Slurm requeued the job itself, comes after the successor started.
            before = self.incidents.get(str(IncidentKey.of_attempt(job.id, job.restarts - 1)))
            if (
                before is not None
                and before.decided_at is not None
                and job.started is not None
                and any(d.action == "requeue" for d in before.standing)
            ):
                not_yet = ev.failed_at <= min(before.decided_at, job.started)
        if job.restarts > 0 and not_yet:
            attempt -= 1
        # Spelt once per attempt, not once per alert.
        if (key := self._attempt_keys.get((job.id, attempt))) is None:
            key = self._attempt_keys[job.id, attempt] = str(IncidentKey.of_attempt(job.id, attempt))
        return key

    def _node_key(self, ev: Evidence) -> str | None:
        """One incident per failure of an idle node: a failure that starts after the last one
        was decided is a new one. None: the evidence belongs to a failure decided so long ago
        that it was forgotten."""
        assert ev.node is not None
        key = IncidentKey.of_node(ev.node)
        if (gone := self.forgotten_nodes.get(ev.node)) is not None:
            seq, decided_at = gone
            if ev.starts_at <= decided_at:
                return None
            key = IncidentKey.of_node(ev.node, seq + 1)
        while str(key) in self.incidents:
            inc = self.incidents[str(key)]
            if not inc.decided or inc.decided_at is None or ev.starts_at <= inc.decided_at:
                break
            key = key.next_failure()
        return str(key)

    def _incident(self, key: str, job: int | None, node: str | None, at: datetime) -> Incident:
        if key not in self.incidents:
            self.incidents[key] = Incident(key=key, job=job, node=node, opened_at=at)
            self._indexed(self.incidents[key])
        return self.incidents[key]

    def _indexed(self, inc: Incident) -> None:
        """Bring the indexes up to date with a change of `inc` (every change goes through here)."""
        due = self.due_at(inc)
        if due is not None:
            heapq.heappush(self._due, (due, inc.key))
        if inc.decided and not inc.closed and inc.check_at is not None:
            self._revisable.add(inc.key)
        else:
            self._revisable.discard(inc.key)
        if inc.job is not None:
            waits = not inc.closed and (
                inc.until_job_ends or (not inc.decided and inc.check_at is not None)
            )
            if waits:
                self._on_job.setdefault(inc.job, set()).add(inc.key)
            elif inc.key in self._on_job.get(inc.job, ()):
                self._on_job[inc.job].discard(inc.key)
                if not self._on_job[inc.job]:
                    del self._on_job[inc.job]

    # ---- time --------------------------------------------------------------------------
    def due_at(self, incident: Incident) -> datetime | None:
        if incident.closed:
            return None
        if incident.decided:
            return incident.check_at
        return incident.check_at or incident.opened_at + timedelta(
            seconds=self.policy.settle_seconds
        )

    def _current(self, entry: tuple[datetime, str]) -> Incident | None:
        """The incident an entry of `_due` is for, when it still falls due then."""
        inc = self.incidents.get(entry[1])
        return inc if inc is not None and self.due_at(inc) == entry[0] else None

    def next_due(self) -> datetime | None:
        while self._due and self._current(self._due[0]) is None:
            heapq.heappop(self._due)
        return self._due[0][0] if self._due else None

    def tick(self, now: datetime) -> list[Decision]:
        """Decide (or revise) every incident that is due, earliest first."""
        self._sweep(now)
        due: dict[str, datetime] = {}
        while self._due and self._due[0][0] <= now:
            entry = heapq.heappop(self._due)
            if self._current(entry) is not None:
                due[entry[1]] = entry[0]
        shared = self.failing.at(now, self.view, self.policy.shared_cause, self.policy.failure_rate)
        decisions: list[Decision] = []
        for key, _ in sorted(due.items(), key=lambda p: (p[1], p[0])):
            incident = self.incidents[key]
            decisions += self._decide(incident, shared, now)
            self._indexed(incident)
        return decisions

    def take_rejudged(self) -> list[Incident]:
        """The incidents re-decided to the same decisions whose evidence or judgement changed
        since the last call: for the ledger to keep (a restart restores them from it)."""
        keys, self._rejudged = self._rejudged, set()
        return [self.incidents[k] for k in sorted(keys) if k in self.incidents]

    def _decide(self, incident: Incident, shared: SharedCauses, now: datetime) -> list[Decision]:
        job = self.view.jobs.get(incident.job) if incident.job is not None else None
        if incident.decided and not incident.evidence and incident.shared:
            # A storm's incident restored without its evidence (older than what a restart
            # feeds again): nothing to judge it on again; its decisions stand.
            incident.check_at = None
            return []
        kept = (dict(incident.shared), len(incident.known))
        job_nodes = job.nodes if job else ((incident.node,) if incident.node else ())
        # A revision is tried on a copy of the guards without this incident's own actions: it
        # replaces them, and changes nothing when it decides the same. The guards only say what
        # their decisions change in that memory (effects); it is changed here.
        trial = self.guards.without(incident.key) if incident.decided else self.guards
        try:
            judged = Judged(
                shared,
                incident.shared,
                incident.evidence,
                check_growth=self.policy.shared_cause.requeue_away,
            )
            suspects = self._suspects(incident, now)
            attr = attribute(incident.evidence, job_nodes, judged, suspects)
            if attr.storm_at is not None:
                # What started well after the storm (a job that survived a blip, then crashed
                # of its own or lost a GPU) is not explained by it: the storm was told of, and
                # this failure is decided on its own evidence.
                after = attr.storm_at + self.policy.shared_cause.requeue_away_within
                later = [e for e in incident.evidence if e.starts_at > after]
                if later:
                    attr = attribute(later, job_nodes, judged, suspects)
            incident.shared = judged.now
            # A job that ended (a fault, scancel, its time limit) has nothing more to say: its
            # ranks are gone. Its nodes' own alerts may still come (blame_wait).
            wait, began = self.policy.hang_wait, incident.opened_at
            waits = stall_only(attr, incident.evidence)
            if job is not None and job.has_ended:
                wait = min(self.policy.blame_wait, wait)
                # A stall an alert dates (a hang's last progress) began long before its first
                # alert: its nodes' own alerts have had their time since.
                began = min([began, *(e.since for e in incident.evidence if e.since)])
                # A stall that blames no node waits for them, whatever its ranks said: NCCL's
                # errors, and the task failures that echo them, come before a port down.
                waits = waits or (job.failed and blames_nobody(attr))
            wait_until = began + wait
            if not incident.decided and waits and now < wait_until:
                incident.check_at = wait_until  # evidence that arrives sooner looks sooner
                return []
            held = self._burst_hold(attr, incident.evidence)
            if not incident.decided and held is not None and now < held:
                incident.check_at = held
                return []
            outcome = decide(
                incident=incident.key,
                attr=attr,
                job=job,
                evidence=incident.evidence,
                view=self.view,
                policy=self.policy,
                guards=trial,
                now=now,
            )
            made = list(outcome.decisions)
            trial.apply(outcome.effects)
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
        # A slow job left to reach its next checkpoint is looked at again once it is written
        # (once: a time past is no reason to look again, or it would look at every tick).
        written = self._checkpoint_written(incident, made)
        incident.check_at = written if written is not None and written > now else None
        incident.known |= {evidence_key(e.fingerprint, e.starts_at) for e in incident.evidence}
        incident.until_job_ends = until_job_ends(
            made, job, shared=self.policy.shared_cause.requeue_away
        )
        # A scheduler action in monitor or enforce mode is carried out now (monitor's dry run
        # stands for it: monitor shows what enforce does); approve waits for a human, and the
        # loop closes the incident once the action runs.
        if closes((d.action for d in made if d.mode != "approve"), made):
            incident.closed = True
        if incident.decided:
            # Nothing to decide any more (Slurm forgot the job) is no reason to undo anything.
            if not made or signature(made) == signature(incident.standing):
                if (incident.shared, len(incident.known)) != kept:
                    self._rejudged.add(incident.key)
                return []
            self.guards.adopt(trial)
            incident.revision += 1
            made = [_superseding(d, incident) for d in made]
        incident.decided, incident.decided_at = True, now
        incident.standing = made
        return made

    def _checkpoint_written(
        self, incident: Incident, standing: Iterable[Decision]
    ) -> datetime | None:
        """When the next checkpoint of a slow job left running (guard job_running) is written:
        when its requeue loses nothing (webhook.core.slowdown). None: nothing waits for one."""
        rules = self.policy.slowdown
        if not rules.weigh_checkpoint or not any(map(leaves_running, standing)):
            return None
        return requeue_at(incident.evidence, rules.checkpoint_margin)

    def _burst_hold(self, attr: Attribution, evidence: list[Evidence]) -> datetime | None:
        """Until when a drain of nodes that stopped answering or lost their port waits for the
        others of a burst (`shared_cause.burst_wait` from the latest start of that evidence):
        Slurm notices a blip's nodes over a ping cycle, the rules over a scrape, and the first
        of them alone is no burst yet. None: nothing to wait for."""
        if attr.cause not in DRAIN_CAUSES or not attr.nodes or attr.shared:
            return None
        starts = [e.starts_at for e in evidence if e.signal in UNREACHABLE and e.node in attr.nodes]
        if not starts:
            return None
        return max(starts) + self.policy.shared_cause.burst_wait

    # ---- memory ------------------------------------------------------------------------
    def _sweep(self, now: datetime) -> None:
        """Forget what is older than the retention and can change nothing any more (now and
        then: each sweep looks at everything, so it runs a few times per retention)."""
        retention = self.policy.retention_age
        if self._swept_at is not None and now < self._swept_at + retention / SWEEPS_PER_RETENTION:
            return
        self._swept_at = now
        self.forget(now - retention, drains_since=now - self.policy.repeats.window)
        self.guards.gpu_faults.forget(now - self.policy.repeats.window)

    def forget(self, before: datetime, drains_since: datetime | None = None) -> None:
        """Forget incidents decided before `before` that nothing can change any more, the alerts
        last delivered before it, rule 5's nodes and the guards' history older than it, but
        for the exclusions Slurm still keeps for the jobs it knows (readmit, room)."""
        gone = [
            inc
            for inc in self.incidents.values()
            if not inc.node and self._forgettable(inc, before)
        ]
        # A node's failures are forgotten in their order, up to the first that is not: the last
        # one forgotten says which failures come before the ones remembered.
        failures: dict[str, list[tuple[int, Incident]]] = {}
        for inc in self.incidents.values():
            if inc.node:
                failures.setdefault(inc.node, []).append((IncidentKey.parse(inc.key).seq, inc))
        for node, incs in failures.items():
            for seq, inc in sorted(incs, key=lambda p: p[0]):
                if inc.decided_at is None or not self._forgettable(inc, before):
                    break
                last = self.forgotten_nodes.get(node, (seq, inc.decided_at))
                self.forgotten_nodes[node] = (seq, max(last[1], inc.decided_at))
                gone.append(inc)
        for inc in gone:
            del self.incidents[inc.key]
            self._revisable.discard(inc.key)
            if inc.job is not None:
                self._on_job.get(inc.job, set()).discard(inc.key)
        kept = ((k, tuple(i for i in v if i in self.incidents)) for k, v in self.decided_on.items())
        self.decided_on = {k: v for k, v in kept if v}
        self.seen = {k: at for k, at in self.seen.items() if at >= before}
        self.failing.forget(before)
        excluding = self.guards.exclusions_in_force(before, self.view.jobs.keys())
        # A node's drains within `repeats.window`: its next failure is a repeat.
        since = before if drains_since is None else min(before, drains_since)
        excluded = {id(h) for h in excluding}
        drains = [
            h
            for h in self.guards.history
            if h.action == "drain" and since <= h.at < before and id(h) not in excluded
        ]
        self.guards.history = sorted([*excluding, *drains], key=lambda h: h.at) + [
            h for h in self.guards.history if h.at >= before
        ]
        self._attempt_keys.clear()

    def _forgettable(self, inc: Incident, before: datetime) -> bool:
        if not inc.decided or inc.decided_at is None or inc.decided_at >= before:
            return False
        waits_for_job = inc.until_job_ends and inc.job is not None
        if not inc.closed and (inc.check_at is not None or waits_for_job):
            return False  # a revision is due, or waits for the job's end
        if inc.job is None:
            return True  # a node's failure (its next one gets the next key), or not ours
        if not self.view.nodes:
            return False  # no view yet: which jobs Slurm still knows is not known
        # An attempt alerts can still reach: its job is in the view, and this attempt is the
        # one running or the one before it (a late alert about it may still come).
        job = self.view.jobs.get(inc.job)
        attempt = IncidentKey.parse(inc.key).attempt
        return job is None or attempt is None or attempt < job.restarts - 1


def until_job_ends(made: Iterable[Decision], job: Job | None, *, shared: bool = False) -> bool:
    """Whether decisions were made because the job still runs (an application's symptom, an
    unknown failure of a running job, and with `shared` (shared_cause.requeue_away) a shared
    cause's escalation, which a job that has failed is requeued away from): its end, when it
    fails, is news."""
    made = list(made)
    if any(d.guard == LEFT_RUNNING for d in made):
        return True
    waits = {"unknown", SHARED} if shared else {"unknown"}
    escalated = any(
        d.cause in waits
        and (
            (d.action == "escalate" and not d.guard)
            or (d.action == "none" and d.guard == "storm_escalated")
        )
        for d in made
    )
    requeued = any(d.action == "requeue" for d in made)
    return escalated and not requeued and (job is None or not job.has_ended)


def _superseding(d: Decision, incident: Incident) -> Decision:
    """A revision's decision, saying what it replaces."""
    old = "; ".join(sorted({f"{o.action} ({o.cause})" for o in incident.standing}))
    why = next((o.reason for o in incident.standing if o.action != "none"), "")
    if not why and incident.standing:
        why = incident.standing[0].reason
    reason = f"{d.reason} [supersedes {old}: {why}]"
    return replace(d, revision=incident.revision, reason=reason[:1000])
