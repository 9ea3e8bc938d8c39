"""Decisions: what each cause leads to (DESIGN.md's table), then the guards that may change it.

Guards, in order: scope (partitions, per-job opt-in/out in the comment, --no-requeue), the
retry budget (a job out of budget is stopped and escalated instead of requeued), the circuit
breaker (past its limit, drains become escalations until a human resets it), and the mode of
each action (monitor records, approve waits for a human, enforce executes).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from webhook.core.attribution import Attribution, names
from webhook.core.cluster import ENDED_ON_PURPOSE, ClusterView, Job
from webhook.core.evidence import Evidence
from webhook.core.policy import Policy

STATE_OF_MODE = {"monitor": "recorded", "approve": "awaiting_approval", "enforce": "pending"}
DRAIN_CAUSES = {"gpu_hardware", "node_failure", "network", "straggler"}


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


def plan(attr: Attribution, job: Job | None) -> list[tuple[str, str | None]]:
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
    if attr.cause in DRAIN_CAUSES or attr.cause == "hang":
        actions.append(("requeue", None))
    elif attr.cause == "application":
        retry = job.options().get("retry_application") is True
        actions.append(("requeue", None) if retry else ("stop", None))
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
    for action, _ in plan(attr, job):
        if action == "drain":
            out.append(_drain(base, attr, view, policy, guards, now))
        elif action in ("requeue", "stop") and job is not None:
            if not in_scope:
                why = f"job {job.id} is outside the policy's partitions"
                out.append(_refuse(base, "out_of_scope", why, attr))
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
    guards.history.append(PastAction(at=now, action="drain", nodes=nodes, cause=attr.cause))
    return replace(base, action="drain", nodes=nodes)


def _requeue(
    base: Decision, attr: Attribution, job: Job, policy: Policy, guards: GuardState, now: datetime
) -> list[Decision]:
    opts = job.options()
    # scancel, a time limit, a deadline, a preemption: someone's decision. A job's alerts that
    # outlive it (its progress stops, its ranks time out) are not a fault to recover from, also
    # while the job is still COMPLETING.
    if job.ended_on_purpose:
        ended = job.base if job.base in ENDED_ON_PURPOSE else job.state
        return [_refuse(base, "ended_on_purpose", f"job {job.id} ended {ended}", attr)]
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
    guards.history.append(PastAction(at=now, action="requeue", job=job.id, exclude=attr.nodes))
    return [replace(base, action="requeue", exclude=attr.nodes)]


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
    state = "recorded" if d.action == "none" else STATE_OF_MODE[mode]
    return replace(d, mode=mode, state=state)
