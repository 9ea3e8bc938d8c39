"""Decisions: what each cause leads to (DESIGN.md's table), then the guards that may change it.

Act on failures, not symptoms: an application's GPU error (an XID of the application class) on a
job that keeps running is recorded and told to people, and the job is left alone until it has
failed (it ended, a rank logged a fatal error, or its progress stalled). A job that died of
timeouts or communication errors with nobody to blame (cause unknown, or a hang: every rank
timed out) is requeued once; the same again is for a human, and when it failed first on the same
node again, that node is named. A job that stalls while it still runs is requeued (a hang) within
its retry budget.

Guards, in order: scope (partitions, per-job opt-in/out in the comment, --no-requeue), the
retry budget (a job out of budget is stopped and escalated instead of requeued), the circuit
breaker (past its limit, drains become escalations until a human resets it), and the mode of
each action (monitor records, approve waits for a human, enforce executes).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from webhook.core.attribution import Attribution, names
from webhook.core.cluster import ACTIVE_STATES, ENDED_ON_PURPOSE, ClusterView, Job
from webhook.core.evidence import Evidence
from webhook.core.lifecycle import INITIAL
from webhook.core.policy import Policy

DRAIN_CAUSES = {"gpu_hardware", "node_failure", "network", "straggler"}
SCHEDULER_ACTIONS = frozenset({"drain", "requeue", "stop", "resume"})  # the ones that change Slurm
# Evidence that a job has failed, not only shown a symptom: a fatal error, a stall.
FAILURE_SIGNALS = frozenset({"app_error", "hang"})
# Causes that blame nobody: a job that died of them is requeued once, then given to a human.
BLAMELESS = frozenset({"unknown", "hang"})


@dataclass(frozen=True)
class Decision:
    at: datetime
    incident: str
    job: int | None
    action: str
    cause: str
    reason: str
    nodes: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    evidence: tuple[dict[str, Any], ...] = ()
    guard: str | None = None
    mode: str = "monitor"
    state: str = "recorded"
    # 0 for an incident's first decisions; a later revision supersedes the ones before it.
    revision: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "at": self.at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "incident": self.incident,
            "job": self.job,
            "action": self.action,
            "nodes": sorted(self.nodes),
            "exclude": sorted(self.exclude),
            "cause": self.cause,
            "reason": self.reason,
            "evidence": list(self.evidence),
            "guard": self.guard,
            "mode": self.mode,
            "state": self.state,
        }


@dataclass(frozen=True)
class PastAction:
    """An earlier decision, as the ledger holds it (for budgets and the breaker)."""

    at: datetime
    action: str
    job: int | None = None
    nodes: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    cause: str = ""
    # recovery_failed: whether the successor failed before writing its first checkpoint
    before_checkpoint: bool = False
    incident: str = ""  # the incident that decided it ("" when unknown: a scenario's history)


@dataclass
class GuardState:
    """What the guards remember between incidents: history and the breaker."""

    history: list[PastAction] = field(default_factory=list)
    breaker_open: bool = False
    # Drains before a human's reset do not count against the breaker any more.
    breaker_reset_at: datetime | None = None

    def requeues(self, job: int, since: datetime) -> int:
        """Requeues of the job, and recoveries of it that failed: both spend its budget."""
        return sum(
            1
            for h in self.history
            if h.action in ("requeue", "recovery_failed") and h.job == job and h.at >= since
        )

    def failed_recoveries(self, job: int, since: datetime, *, before_checkpoint: bool) -> int:
        """The job's failed recoveries in a row: since `since` and its last good one."""
        recovered = [h.at for h in self.history if h.action == "recovered" and h.job == job]
        since = max([since, *recovered])
        return sum(
            1
            for h in self.history
            if h.action == "recovery_failed"
            and h.job == job
            and h.at >= since
            and (h.before_checkpoint or not before_checkpoint)
        )

    def drained(self, since: datetime) -> set[str]:
        if self.breaker_reset_at is not None:
            since = max(since, self.breaker_reset_at)
        return {n for h in self.history if h.action == "drain" and h.at >= since for n in h.nodes}

    def reset_breaker(self, at: datetime) -> None:
        self.breaker_open = False
        self.breaker_reset_at = at

    def without(self, incident: str) -> GuardState:
        """A copy that forgets one incident's own actions: to try a revision of it."""
        return GuardState(
            history=[h for h in self.history if not (incident and h.incident == incident)],
            breaker_open=self.breaker_open,
            breaker_reset_at=self.breaker_reset_at,
        )

    def adopt(self, trial: GuardState) -> None:
        """Take a revision's guard state (its actions replace the incident's earlier ones)."""
        self.history, self.breaker_open = trial.history, trial.breaker_open

    def blameless_requeue(self, job: int, since: datetime) -> PastAction | None:
        """The job's last requeue for a failure nobody could be blamed for, if any."""
        found = [
            h
            for h in self.history
            if h.action == "requeue" and h.job == job and h.cause in BLAMELESS and h.at >= since
        ]
        return max(found, key=lambda h: h.at) if found else None


def job_ended(job: Job) -> bool:
    """No longer running nor waiting to (completed, failed, cancelled, ...)."""
    return job.state not in ACTIVE_STATES and job.state != "PENDING"


def job_failed(job: Job, evidence: Iterable[Evidence]) -> bool:
    """Whether the job has failed: it ended by a fault, a rank logged a fatal error, or it
    stalled. A job that completed, or that someone ended, has not."""
    if job.completed or job.ended_on_purpose:
        return False
    return job.failed or any(e.signal in FAILURE_SIGNALS and e.actionable for e in evidence)


def first_failing(evidence: Iterable[Evidence]) -> Evidence | None:
    """The evidence that started first and names a node: where the failure began."""
    named = [e for e in evidence if e.actionable and e.node]
    return min(named, key=lambda e: (e.starts_at, e.node or "")) if named else None


def plan(
    attr: Attribution, job: Job | None, evidence: Sequence[Evidence] = ()
) -> list[tuple[str, str | None]]:
    """DESIGN.md's table: (action, guard) pairs before any guard has spoken."""
    actions: list[tuple[str, str | None]] = []
    if attr.cause in DRAIN_CAUSES and attr.nodes:
        actions.append(("drain", None))
    if attr.shared:  # some nodes drained, the rest is a shared cause: a human decides the job
        return [*actions, ("escalate", None)]
    if job is None:  # a node incident: no job to touch
        if not actions and attr.cause in ("shared_infrastructure", "unknown"):
            return [("escalate", None)]
        return actions
    if attr.cause in DRAIN_CAUSES or (attr.cause == "hang" and not job.failed):
        actions.append(("requeue", None))
    elif attr.cause == "application":
        if _ended_by_choice(job) is None and not job_failed(job, evidence):
            # A symptom on a job that keeps training: leave it alone, tell people.
            return [("none", "job_running"), ("escalate", "job_running")]
        retry = job.options().get("retry_application") is True
        actions.append(("requeue", None) if retry else ("stop", None))
    elif attr.cause in BLAMELESS and job.failed:
        # It died of timeouts or communication errors, and nobody is to blame.
        actions.append(("requeue", "once"))
    else:
        actions.append(("escalate", None))
    return actions


def decide(
    *,
    incident: str,
    attr: Attribution,
    job: Job | None,
    evidence: list[Evidence],
    view: ClusterView,
    policy: Policy,
    guards: GuardState,
    now: datetime,
) -> list[Decision]:
    base = Decision(
        at=now,
        incident=incident,
        job=job.id if job else None,
        action="none",
        cause=attr.cause,
        reason=attr.reason,
        evidence=tuple(e.record() for e in evidence if e.actionable),
    )
    out: list[Decision] = []
    in_scope = _in_scope(policy, job.partition if job else None)
    for action, rule in plan(attr, job, evidence):
        if rule == "job_running" and job is not None:
            why = (
                f"job {job.id} keeps running: an application's GPU error is a symptom, not a "
                f"failure; nothing is done until the job fails, and its owner should look. "
            )
            out.append(replace(base, action=action, guard=rule, reason=why + attr.reason))
        elif rule == "once" and job is not None:
            if not in_scope:
                why = f"job {job.id} is outside the policy's partitions"
                out.append(_refuse(base, "out_of_scope", why, attr))
            else:
                out += _requeue_once(base, attr, job, evidence, policy, guards, now)
        elif action == "drain":
            out.append(_drain(base, attr, view, policy, guards, now))
        elif action in ("requeue", "stop") and job is not None:
            if not in_scope:
                why = f"job {job.id} is outside the policy's partitions"
                out.append(_refuse(base, "out_of_scope", why, attr))
            elif (ended := _ended_by_choice(job)) is not None:
                # Nothing to restart or stop: the job completed, or someone ended it.
                out.append(_refuse(base, *ended, attr))
            elif action == "requeue":
                out += _requeue(base, attr, job, policy, guards, now)
            else:
                out.append(replace(base, action="stop"))
        elif action == "escalate" and attr.shared:
            out.append(
                replace(
                    base,
                    action="escalate",
                    cause="shared_infrastructure",
                    reason=f"{attr.shared}; {names(attr.nodes)} drained apart",
                )
            )
        else:
            out.append(replace(base, action=action))
    return [with_mode(d, policy) for d in _one_per_action(out)]


def _in_scope(policy: Policy, partition: str | None) -> bool:
    return not policy.scope.partitions or partition in policy.scope.partitions


def _drain(
    base: Decision,
    attr: Attribution,
    view: ClusterView,
    policy: Policy,
    guards: GuardState,
    now: datetime,
) -> Decision:
    # A node serving several partitions is in scope when one of them is.
    nodes = tuple(
        n
        for n in attr.nodes
        if n in view.nodes and any(_in_scope(policy, p) for p in view.nodes[n].partitions)
    )
    if not nodes:
        return _refuse(
            base, "out_of_scope", f"{names(attr.nodes)} is outside the policy's partitions", attr
        )
    # Nodes already out of service (an operator's drain, or an alert that outlived the job it
    # hit): nothing to drain, and nothing for the breaker to count. A requeue still excludes them.
    if all(view.nodes[n].state.startswith("drain") for n in nodes):
        return _refuse(base, "already_drained", f"{names(nodes)} is already drained", attr)
    already = guards.drained(now - policy.breaker.window)
    limit = max(1, math.ceil(policy.breaker.max_fraction * len(view.nodes)))
    new = set(nodes) - already
    if guards.breaker_open or len(already) + len(new) > limit:
        guards.breaker_open = True
        return replace(
            base,
            action="escalate",
            nodes=nodes,
            guard="circuit_breaker_open",
            reason=f"Draining {names(nodes)} would pass the breaker's {limit} node(s) per "
            f"{int(policy.breaker.window.total_seconds())}s; a human must look. {attr.reason}",
        )
    guards.history.append(
        PastAction(at=now, action="drain", nodes=nodes, cause=attr.cause, incident=base.incident)
    )
    return replace(base, action="drain", nodes=nodes)


def _requeue(
    base: Decision, attr: Attribution, job: Job, policy: Policy, guards: GuardState, now: datetime
) -> list[Decision]:
    opts = job.options()
    if not job.requeue:
        return [_refuse(base, "no_requeue", f"job {job.id} was submitted with --no-requeue", attr)]
    if opts.get("requeue") is False:
        return [
            _refuse(base, "opted_out", f"job {job.id} opted out of requeues in its comment", attr)
        ]
    if policy.scope.require_opt_in and opts.get("requeue") is not True:
        return [_refuse(base, "not_opted_in", f"job {job.id} did not opt in to requeues", attr)]
    # A job may ask for fewer requeues than the policy allows, never for more.
    budget = policy.retry_budget.max_requeues
    wanted = opts.get("max_requeues")
    if isinstance(wanted, int) and not isinstance(wanted, bool) and wanted >= 0:
        budget = min(budget, wanted)
    since = now - policy.retry_budget.window
    stalled = guards.failed_recoveries(job.id, since, before_checkpoint=True)
    if stalled >= policy.verify.max_failures_before_checkpoint:
        why = (
            f"job {job.id}'s last {stalled} restart(s) failed before their first checkpoint "
            f"(limit {policy.verify.max_failures_before_checkpoint}); {attr.reason}"
        )
        return _give_up(base, "no_progress", why)
    used = guards.requeues(job.id, since)
    if used >= budget:
        why = (
            f"job {job.id} was requeued {used} time(s) in the last "
            f"{int(policy.retry_budget.window.total_seconds())}s (budget {budget}); {attr.reason}"
        )
        return _give_up(base, "retry_budget_exhausted", why)
    guards.history.append(
        PastAction(
            at=now,
            action="requeue",
            job=job.id,
            exclude=attr.nodes,
            cause=attr.cause,
            incident=base.incident,
        )
    )
    return [replace(base, action="requeue", exclude=attr.nodes)]


def _ended_by_choice(job: Job) -> tuple[str, str] | None:
    """(guard, why) for a job that completed or that someone ended: scancel, a time limit, a
    deadline, a preemption. Its alerts that outlive it (its progress stops, its ranks time out)
    are not a fault to recover from, also while it is still COMPLETING."""
    if job.ended_on_purpose:
        ended = job.base if job.base in ENDED_ON_PURPOSE else job.state
        return "ended_on_purpose", f"job {job.id} ended {ended}"
    if job.completed:
        return "job_completed", f"job {job.id} completed"
    return None


def _requeue_once(
    base: Decision,
    attr: Attribution,
    job: Job,
    evidence: list[Evidence],
    policy: Policy,
    guards: GuardState,
    now: datetime,
) -> list[Decision]:
    """A job that died with nobody to blame: requeue it once, noting where it failed first;
    the same again goes to a human, naming the node when it failed first there again."""
    first = first_failing(evidence)
    where = (
        f"it failed first on {first.node} ({first.alertname} at "
        f"{first.starts_at.astimezone(UTC):%H:%M:%SZ})"
        if first is not None
        else "no rank named where it failed first"
    )
    earlier = guards.blameless_requeue(job.id, now - policy.retry_budget.window)
    if earlier is not None:
        node = first.node if first is not None else None
        nodes = (node,) if node and node in earlier.nodes else ()
        why = (
            f"job {job.id} died again with nobody to blame after a requeue at "
            f"{earlier.at.astimezone(UTC):%H:%M:%SZ}; {where}"
            + (f", where the last failure began too: {node} is implicated" if nodes else "")
            + f"; a human must look. {attr.reason}"
        )
        return [replace(base, action="escalate", nodes=nodes, guard="repeated_failure", reason=why)]
    base = replace(
        base,
        reason=f"job {job.id} ended with nobody to blame; {where}: requeued once. {attr.reason}",
    )
    made = _requeue(base, attr, job, policy, guards, now)
    if first is not None and first.node and made[0].action == "requeue":
        # Remember where it failed first (PastAction.nodes of a requeue), for the next time.
        last = guards.history[-1]
        guards.history[-1] = replace(last, nodes=(first.node,))
    return made


def _refuse(base: Decision, guard: str, why: str, attr: Attribution) -> Decision:
    """Nothing to do, because a guard says so."""
    return replace(base, action="none", guard=guard, reason=f"{why}; {attr.reason}")


def _give_up(base: Decision, guard: str, why: str) -> list[Decision]:
    """No more restarts: the job is stopped and a human told."""
    return [
        replace(base, action="stop", guard=guard, reason=why),
        replace(base, action="escalate", guard=guard, reason=why),
    ]


def _one_per_action(decisions: list[Decision]) -> list[Decision]:
    seen: set[str] = set()
    out = []
    for d in decisions:
        if d.action not in seen:
            seen.add(d.action)
            out.append(d)
    return out


def with_mode(d: Decision, policy: Policy) -> Decision:
    """The decision in the mode the policy gives its action, and the state that mode starts in."""
    mode = policy.mode_of(d.action)
    state = "recorded" if d.action == "none" else INITIAL[mode]
    return replace(d, mode=mode, state=state)
