"""The guards: an ordered pipeline of named stages between the cause table (decisions.plan) and
the decisions recorded.

Each stage is a pure function of one decision and the incident's `Context`: it returns the
decision unchanged, or what replaces it (a refusal `none`, a `stop` + `escalate`, an escalation),
and its effect on the guards' memory (a drain counted in the breaker's window, a requeue spent
from the job's budget, the breaker opening) instead of changing that memory itself: the engine
applies the effects, and only when it keeps the decisions (a revision that changes nothing is
dropped, and so are its effects). A decision a guard has changed (its `guard` set) goes on past
the guards after it unchanged; the first guard to speak is the one recorded.

Stages read the guards' memory as it was before the incident was decided: one incident plans at
most one drain and one requeue, so no stage needs another's effect on the same decision.

PIPELINE is the order; docs/operations.md ("The guards, in order") lists the same table.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime

from webhook.core import durations, recovery
from webhook.core.attribution import Attribution, names
from webhook.core.cluster import ENDED_ON_PURPOSE, ClusterView, Job
from webhook.core.decisions import (
    FAULT_CAUSES,
    GLOBAL_SWITCH,
    BreakerOpened,
    Counted,
    Decision,
    Effect,
    GuardState,
    PastAction,
    died_blameless,
    first_failing,
    job_failed,
    leaves_running,
    plan,
    removes,
    with_mode,
)
from webhook.core.disruption import with_disruption
from webhook.core.evidence import Evidence
from webhook.core.failures import distinct
from webhook.core.incidents import IncidentKey
from webhook.core.lifecycle import PENDING
from webhook.core.policy import SHARED, Policy
from webhook.core.recovery import Verdict, Watch
from webhook.core.signals import FAILURE_SIGNALS, STALL, STRAGGLER
from webhook.core.slowdown import weigh


@dataclass(frozen=True)
class Context:
    """What a stage may read about the incident being decided. `guards` is read, never
    written: a stage says what to change in its Outcome's effects."""

    attr: Attribution
    job: Job | None
    evidence: tuple[Evidence, ...]
    view: ClusterView
    policy: Policy
    guards: GuardState
    now: datetime


@dataclass(frozen=True)
class Outcome:
    """A stage's (or the whole pipeline's) result: decisions, and their effect on the guards."""

    decisions: tuple[Decision, ...]
    effects: tuple[Effect, ...] = field(default=())


# One decision in, what replaces it out.
Stage = Callable[[Decision, Context], Outcome]
# The pipeline's steps see every decision at once (at most one per action needs them all).
Step = Callable[[Sequence[Decision], Context], Outcome]


def _keep(d: Decision) -> Outcome:
    return Outcome((d,))


def _planned(d: Decision, *actions: str) -> bool:
    """A decision as the plan made it (no guard has changed it yet) with one of `actions`."""
    return d.guard is None and d.action in actions


def _bare(d: Decision) -> Decision:
    """The decision without what its action would touch: the base of what replaces it."""
    return replace(d, nodes=(), exclude=(), readmit=())


def _refuse(d: Decision, guard: str, why: str, ctx: Context) -> Outcome:
    """Nothing to do, because a guard says so."""
    refused = replace(_bare(d), action="none", guard=guard, reason=f"{why}; {ctx.attr.reason}")
    return Outcome((refused,))


def _give_up(d: Decision, guard: str, why: str) -> Outcome:
    """No more restarts: the job is stopped and a human told. A job that failed of a shared
    cause is not stopped for it (it is not the job's fault): it waits for the person the cause
    is escalated to."""
    base = replace(_bare(d), guard=guard, reason=why)
    if d.cause == SHARED:
        return Outcome((replace(base, action="none", reason=f"{why}; it waits for a person"),))
    return Outcome((replace(base, action="stop"), replace(base, action="escalate")))


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


# ---- the stages, in PIPELINE's order ---------------------------------------------------------
def moved_on(d: Decision, ctx: Context) -> Outcome:
    """The attempt that failed is not the job's any more: Slurm (or a person) requeued it, and
    the next attempt has started since. Requeueing or stopping the job now would act on that
    attempt, which this failure is not (drains still hold; while the next attempt waits, a
    requeue adds the nodes to blame to its exclusions)."""
    job = ctx.job
    if not _planned(d, "requeue", "stop") or job is None or job.waiting:
        return _keep(d)
    attempt = IncidentKey.parse(d.incident).attempt
    if attempt is None or attempt >= job.restarts:
        return _keep(d)
    now = "runs" if job.active else f"ended {job.state}"
    why = (
        f"attempt {attempt} of job {job.id} was requeued without slurmedic and attempt "
        f"{job.restarts} {now}: the job is not touched for attempt {attempt}'s failure"
    )
    return _refuse(d, "attempt_moved_on", why, ctx)


def job_running(d: Decision, ctx: Context) -> Outcome:
    """Act on failures, not symptoms: an application's error on a job that keeps training
    (nothing fatal logged, no stall, not ended) is left alone, and people are told. So is a job
    on degraded hardware (drained: Slurm lets it finish), until it fails, stalls or slows. (A
    recovery check's stop of a job that trains and makes no progress is `no_progress`'s.) A
    job that runs slow is requeued once its slow steps until the next checkpoint would lose
    more than a restart now (webhook.core.slowdown): else after that checkpoint."""
    job = ctx.job
    if _recovery(d):
        return _keep(d)
    if d.cause == "degraded" and _planned(d, "requeue") and job is not None:
        return _on_degraded(d, job, ctx)
    if d.cause == "straggler" and _planned(d, "requeue") and job is not None:
        if _ended_by_choice(job) is not None or job_failed(job, ctx.evidence):
            return _keep(d)
        return _after_checkpoint(d, job, ctx)
    if not _planned(d, "stop", "requeue") or d.cause != "application" or job is None:
        return _keep(d)
    if _ended_by_choice(job) is not None or job_failed(job, ctx.evidence):
        return _keep(d)
    why = (
        f"job {job.id} keeps running: an application's GPU error is a symptom, not a "
        f"failure; nothing is done until the job fails, and its owner should look. "
    )
    told = replace(_bare(d), guard="job_running", reason=why + ctx.attr.reason)
    return Outcome((replace(told, action="none"), replace(told, action="escalate")))


def _on_degraded(d: Decision, job: Job, ctx: Context) -> Outcome:
    slowed = any(e.signal in STRAGGLER and e.actionable for e in ctx.evidence)
    if _ended_by_choice(job) is not None or job_failed(job, ctx.evidence):
        return _keep(d)
    if slowed:
        return _after_checkpoint(d, job, ctx)
    why = (
        f"job {job.id} keeps training: {names(d.exclude)} is drained (Slurm lets the job "
        f"finish and starts nothing new there) and the job is left alone; it is requeued "
        f"without it if it fails, stalls or slows. "
    )
    return Outcome((replace(_bare(d), action="none", guard="job_running", reason=why + d.reason),))


def _after_checkpoint(d: Decision, job: Job, ctx: Context) -> Outcome:
    """A slow job that still trains: requeued now, or after its next checkpoint when the slow
    steps until then lose less than the work a requeue now would redo (`none`, guard
    job_running: the incident looks again when that checkpoint is written)."""
    rules = ctx.policy.slowdown
    w = weigh(ctx.evidence, ctx.now, rules.checkpoint_margin) if rules.weigh_checkpoint else None
    if w is None:
        return _keep(d)
    if not w.wait:
        why = (
            f"{d.reason}; requeued now: it redoes {durations.format(w.since_checkpoint)} of work "
            f"since the last checkpoint, running {w.slowdown:.3g} times slower until the next "
            f"would lose {durations.format(w.slow_until_checkpoint)}"
        )
        return _keep(replace(d, reason=why))
    why = (
        f"job {job.id} trains {w.slowdown:.3g} times slower on {names(d.exclude)}, and its next "
        f"checkpoint is written by {w.requeue_at.astimezone(UTC):%H:%M:%SZ}: running slow until "
        f"then loses {durations.format(w.slow_until_checkpoint)}, less than the "
        f"{durations.format(w.since_checkpoint)} of work a requeue now would redo; requeued "
        f"then. "
    )
    return Outcome((replace(_bare(d), action="none", guard="job_running", reason=why + d.reason),))


def scope(d: Decision, ctx: Context) -> Outcome:
    """The policy's partitions: a job outside them is not touched; a drain keeps the nodes of
    the cluster inside them (a node serving several partitions is in when one of them is)."""
    if _planned(d, "requeue", "stop") and ctx.job is not None:
        if not ctx.policy.in_scope(ctx.job.partition):
            why = f"job {ctx.job.id} is outside the policy's partitions"
            return _refuse(d, "out_of_scope", why, ctx)
    elif _planned(d, "drain"):
        nodes = tuple(
            n
            for n in d.nodes
            if n in ctx.view.nodes
            and any(ctx.policy.in_scope(p) for p in ctx.view.nodes[n].partitions)
        )
        if not nodes:
            why = f"{names(d.nodes)} is outside the policy's partitions"
            return _refuse(d, "out_of_scope", why, ctx)
        return _keep(replace(d, nodes=nodes))
    return _keep(d)


def ended_by_choice(d: Decision, ctx: Context) -> Outcome:
    """Nothing to restart or stop: the job completed, or someone ended it."""
    ended = _ended_by_choice(ctx.job) if ctx.job is not None else None
    if _planned(d, "requeue", "stop") and ended is not None:
        return _refuse(d, *ended, ctx)
    return _keep(d)


def ended_before_record(d: Decision, ctx: Context) -> Outcome:
    """A job that ended before slurmedic's record begins (a new ledger, a lost one) is not
    requeued, whatever brought its incident (its label on a late alert, an alert on the node it
    failed on): whether its failure was handled since (the job stopped, its owner told, the
    node found) is not in the record, and a requeue could revive a job its owner gave up on."""
    job, since = ctx.job, ctx.guards.memory_since
    if not _planned(d, "requeue") or job is None or since is None:
        return _keep(d)
    # Also while it is still COMPLETING (Slurm has its end time); not once it waits again.
    if job.waiting or job.ended is None or job.ended >= since:
        return _keep(d)
    what = "; ".join(r for r in (ctx.attr.shared, ctx.attr.reason) if r)
    why = (
        f"job {job.id} ended {job.state} at {job.ended.astimezone(UTC):%Y-%m-%d %H:%M:%SZ}, "
        f"before slurmedic's record begins ({since.astimezone(UTC):%Y-%m-%d %H:%M:%SZ}): "
        f"whether its failure was handled is not known; it is not requeued, and a human must "
        f"look. {what}"
    )
    return Outcome((replace(_bare(d), action="escalate", guard="ended_before_record", reason=why),))


def requeue_once(d: Decision, ctx: Context) -> Outcome:
    """A job that died with nobody to blame is requeued once, noting where it failed first;
    the same again goes to a human, naming the node when it failed first there again. One
    rank's crash is restarted once; the same again is the code's (stop). The successor of a
    requeue for a hang or a blameless death that stalls again before a recovery check saw it
    train goes to a human: a blind requeue would hold the whole allocation for nothing again."""
    job = ctx.job
    if not _planned(d, "requeue") or job is None:
        return _keep(d)
    if ctx.attr.cause == "application" and ctx.attr.partial:
        return _application_again(d, job, ctx)
    if ctx.attr.cause == "hang" and not job.failed:
        return _hang_again(d, job, ctx)
    if not died_blameless(ctx.attr.cause, job):
        return _keep(d)
    first = first_failing(ctx.evidence)
    where = (
        f"it failed first on {first.node} ({first.alertname} at "
        f"{first.starts_at.astimezone(UTC):%H:%M:%SZ})"
        if first is not None
        else "no rank named where it failed first"
    )
    earlier = ctx.guards.blameless_requeue(job.id, ctx.now - ctx.policy.retry_budget.window)
    since = ctx.guards.memory_since
    if earlier is None and since is not None and unseen_restart(job, since):
        why = (
            f"job {job.id} died with nobody to blame in attempt {job.restarts}, which began "
            f"before slurmedic's record does ({since.astimezone(UTC):%Y-%m-%d %H:%M:%SZ}): "
            f"whether it was requeued for this already is not known; {where}; a human must "
            f"look. {ctx.attr.reason}"
        )
        unseen = replace(_bare(d), action="escalate", guard="unseen_restart", reason=why)
        return Outcome((unseen,))
    if earlier is None:
        why = f"job {job.id} ended with nobody to blame; {where}: requeued once. {ctx.attr.reason}"
        return _keep(replace(d, reason=why))
    node = first.node if first is not None else None
    nodes = (node,) if node and node in earlier.nodes else ()
    why = (
        f"job {job.id} died again with nobody to blame after a requeue at "
        f"{earlier.at.astimezone(UTC):%H:%M:%SZ}; {where}"
        + (f", where the last failure began too: {node} is implicated" if nodes else "")
        + f"; a human must look. {ctx.attr.reason}"
    )
    again = replace(_bare(d), action="escalate", nodes=nodes, guard="repeated_failure", reason=why)
    return Outcome((again,))


def _application_again(d: Decision, job: Job, ctx: Context) -> Outcome:
    since = ctx.now - ctx.policy.retry_budget.window
    if job.options().get("retry_application") is True:
        return _keep(d)
    # The same way: one rank's crash again where the last one was (the same rank, its data or
    # its node, not chance). Elsewhere it is another chance: requeued, within the budget.
    crashed = set(ctx.attr.crashed)
    earlier = [
        h
        for h in ctx.guards.of_job(job.id, since)
        if h.action == "requeue" and h.cause == "application" and crashed & set(h.nodes)
    ]
    if not earlier:
        return _keep(d)
    last = max(earlier, key=lambda h: h.at)
    why = (
        f"job {job.id} failed the same way again ({names(crashed & set(last.nodes))}) after "
        f"its requeue at {last.at.astimezone(UTC):%H:%M:%SZ} for one rank's crash there: the "
        f"code's or that node's, not a chance; stopped. {ctx.attr.reason}"
    )
    return Outcome((replace(_bare(d), action="stop", guard="repeated_failure", reason=why),))


def _hang_again(d: Decision, job: Job, ctx: Context) -> Outcome:
    earlier = ctx.guards.blameless_requeue(job.id, ctx.now - ctx.policy.retry_budget.window)
    if earlier is None or not _led_to(earlier, job, ctx.guards):
        return _keep(d)
    if ctx.guards.recovered_since(job.id, earlier.at):
        return _keep(d)  # it trained again: a new stall
    # Without a recovery check's word: the stall began within the time a restart is given to
    # pass the step it failed at (verify.deadline), or later, when it had trained a while.
    began = min((e.since or e.starts_at for e in ctx.evidence if e.signal in STALL), default=None)
    if job.started is not None and (
        began is None or began > job.started + ctx.policy.verify.deadline
    ):
        return _keep(d)
    why = (
        f"job {job.id} stalls again in attempt {job.restarts}, the successor of its requeue "
        f"at {earlier.at.astimezone(UTC):%H:%M:%SZ} for a failure nobody could be blamed for, "
        f"before it was seen to train (no recovery check saw it pass its failure point, and "
        f"the stall began within {durations.format(ctx.policy.verify.deadline)} of its "
        f"start): a second blind requeue would hold its {len(job.nodes)} node(s) for nothing "
        f"again; a human must look. {ctx.attr.reason}"
    )
    again = replace(_bare(d), action="escalate", guard="repeated_without_progress", reason=why)
    return Outcome((again,))


def _led_to(requeue: PastAction, job: Job, guards: GuardState) -> bool:
    """Whether `requeue` made the job's current attempt: it requeued the attempt before, or
    (its incident unknown: a scenario's history) it is the job's last requeue, made before the
    attempt started."""
    if requeue.incident:
        return job.restarts > 0 and requeue.incident == str(
            IncidentKey.of_attempt(job.id, job.restarts - 1)
        )
    last = guards.requeue_for(job.id, "", None)
    started = job.started is None or requeue.at <= job.started
    return last is requeue and started


def unseen_restart(job: Job, memory_since: datetime) -> bool:
    """Slurm restarted the job before the guards' record begins (a new ledger, a lost one):
    the requeue `requeue_once` counts may have happened, and is not in the history."""
    return job.restarts > 0 and job.started is not None and job.started < memory_since


def no_requeue(d: Decision, ctx: Context) -> Outcome:
    """A job submitted with --no-requeue is never requeued."""
    if _planned(d, "requeue") and ctx.job is not None and not ctx.job.requeue:
        why = f"job {ctx.job.id} was submitted with --no-requeue"
        return _refuse(d, "no_requeue", why, ctx)
    return _keep(d)


def asked_not_to_restart(d: Decision, ctx: Context) -> Outcome:
    """A job that ended with an exit code by which it asks not to be restarted (the policy's
    `scope.no_restart_exit_codes`: NVRx's 93 when the workload makes no progress) is not
    requeued: the workload itself knows it would only fail again. Its nodes are still drained
    if the evidence blames them. A job Slurm requeued and holds after such a run (an expedited
    requeue's) is not released: it stays held for its owner."""
    job = ctx.job
    if not _planned(d, "requeue") or job is None:
        return _keep(d)
    run_ended = job.held or (job.has_ended and not job.waiting)
    if not run_ended or job.exit_code not in ctx.policy.scope.no_restart_exit_codes:
        return _keep(d)
    why = (
        f"job {job.id} ended with exit code {job.exit_code}, by which it asks not to be "
        "restarted (scope.no_restart_exit_codes; NVRx's 93: no progress)"
    )
    if job.held:
        why += "; Slurm holds it requeued: it stays held until its owner releases or cancels it"
    return _refuse(d, "asked_not_to_restart", why, ctx)


def opt_in_out(d: Decision, ctx: Context) -> Outcome:
    """The job's comment: an opt-out, or no opt-in when the policy requires one."""
    job = ctx.job
    if not _planned(d, "requeue") or job is None:
        return _keep(d)
    wants = job.options().get("requeue")
    if wants is False:
        return _refuse(d, "opted_out", f"job {job.id} opted out of requeues in its comment", ctx)
    if ctx.policy.scope.require_opt_in and wants is not True:
        return _refuse(d, "not_opted_in", f"job {job.id} did not opt in to requeues", ctx)
    return _keep(d)


def died_of_the_storm(
    job: Job, evidence: Sequence[Evidence], attr: Attribution, policy: Policy, now: datetime
) -> bool:
    """Whether the job failed within `shared_cause.requeue_away_within` of the last failure
    on the switch it would be moved off (when it ended, else its first fatal error or stall)."""
    if attr.storm_at is None:
        return False
    fatal = [e.starts_at for e in evidence if e.signal in FAILURE_SIGNALS and e.actionable]
    failed_at = job.ended if job.failed and job.ended else min(fatal, default=now)
    return failed_at - attr.storm_at <= policy.shared_cause.requeue_away_within


def _owners(job: Job, ctx: Context) -> frozenset[str]:
    """The nodes the job's ExcNodeList holds (as the view read it) that no requeue of
    slurmedic's ever named: its owner's `--exclude`, a person's."""
    return job.excluded - ctx.guards.ever_excluded(job.id)


def owners_exclusions(d: Decision, ctx: Context) -> Outcome:
    """A requeue leaves out of its exclusion the nodes the job's ExcNodeList holds (as the view
    read it) that no requeue of slurmedic's ever named (its owner's `--exclude`, a person's):
    Slurm keeps them excluded (unless a person takes them out before the requeue runs), and a
    node slurmedic never excluded is never one it readmits (`readmit` takes back only its
    own). Changes no action (no guard)."""
    job = ctx.job
    if not _planned(d, "requeue") or job is None or not job.excluded:
        return _keep(d)
    theirs = _owners(job, ctx) & set(d.exclude)
    if not theirs:
        return _keep(d)
    kept = tuple(n for n in d.exclude if n not in theirs)
    why = f"{d.reason}; {names(sorted(theirs))} excluded by the job's own list already"
    return _keep(replace(d, exclude=kept, reason=why))


def readmit(d: Decision, ctx: Context) -> Outcome:
    """A requeue takes back into the job's reach the nodes its earlier requeues excluded that
    are in service again: those slurmedic drained with them (resumed after their repair), and
    those excluded off a failing switch more than `shared_cause.requeue_away_for` ago (Slurm
    shows them in service while their fabric may still be down: the time stands for the
    switch's repair). Slurm keeps a job's ExcNodeList for every attempt, and a long-lived job
    would otherwise lose nodes at every failure until it no longer fits. Changes no action (no
    guard)."""
    job = ctx.job
    if not _planned(d, "requeue") or job is None:
        return _keep(d)
    nodes, lasts = ctx.view.nodes, ctx.policy.shared_cause.requeue_away_for
    # A drain the policy only records (monitor) never took the node out: in service says
    # nothing of a repair.
    # A later drain of a node (another failure) has run or expired after approval_expires.
    settled = ctx.now - ctx.policy.approval_expires
    repaired, switch = ctx.guards.readmittable(job.id, settled, ctx.now - lasts)
    drained = {
        n
        for n in repaired
        if n in nodes and ctx.policy.mode_of("drain", nodes[n].partition) != "monitor"
    }
    back = {n for n in drained | switch if n in nodes and nodes[n].in_service} - set(d.exclude)
    if not back:
        return _keep(d)
    said = [
        f"{names(sorted(these))} ({why})"
        for these, why in (
            (back & drained, "drained and excluded before, in service again"),
            (back & switch, f"excluded off a failing switch over {durations.format(lasts)} ago"),
        )
        if these
    ]
    why = f"{d.reason}; readmits {', '.join(said)}"
    return _keep(replace(d, readmit=tuple(sorted(back)), reason=why))


def room(d: Decision, ctx: Context) -> Outcome:
    """A job requeued away from a shared cause must still fit in its partition without the
    nodes it keeps off (and those out of service): Slurm keeps the exclusion after the switch
    is mended, so a job that cannot fit would wait for nothing. Then it waits for a person."""
    job = ctx.job
    if not _planned(d, "requeue") or d.cause != SHARED or job is None:
        return _keep(d)
    # Slurm adds to a job's exclusion (playbooks/requeue_job.yml): the earlier ones hold too,
    # its owner's as well, but for those the requeue readmits.
    off = set(d.exclude) | ((job.excluded | ctx.guards.excluded(job.id)) - set(d.readmit))
    # Free now, or its own: a node another job holds is no room for it (a training job holds
    # its nodes for days; the job would wait off the switch for nothing).
    mine = set(job.nodes)
    usable = [
        n
        for n in ctx.view.nodes.values()
        if (not job.partition or job.partition in n.partitions)
        and n.name not in off
        and n.in_service
        and (n.name in mine or not any(j.id != job.id for j in ctx.view.jobs_on(n.name)))
    ]
    if len(usable) >= len(job.nodes):
        return _keep(d)
    theirs = _owners(job, ctx)
    why = (
        f"job {job.id} needs {len(job.nodes)} node(s); partition {job.partition or '-'} has "
        f"{len(usable)} free or its own in service off the failing switch"
        + (f" and its own excluded nodes ({names(sorted(theirs))})" if theirs else "")
    )
    return _refuse(d, "no_room", why, ctx)


def stalled_restarts(job: int, guards: GuardState, policy: Policy, now: datetime) -> int:
    """The job's restarts in a row that failed before their first checkpoint, within the retry
    budget's window (`no_progress` stops it at `verify.max_failures_before_checkpoint`)."""
    since = now - policy.retry_budget.window
    return guards.failed_recoveries(job, since, before_checkpoint=True)


def _recovery(d: Decision) -> bool:
    """A decision of a recovery check (its incident `verify:<job>.<attempt>`)."""
    return IncidentKey.parse(d.incident).kind == "verify"


def no_progress(d: Decision, ctx: Context) -> Outcome:
    """A job whose last restarts all failed before their first checkpoint: restarting it again
    only burns GPU-hours. Not a requeue for a new hardware fault: that is not the job failing
    to make progress (a job of thousands of nodes meets one every few hours), and stopping
    for it would stop every later failure of the job too, while its run of failed restarts
    has nothing to end it; the retry budget and the breaker bound those. A recovery check's
    stop of the running attempt (proposed at the limit, the failure it judged counted:
    `stalled_restarts`) is this guard's too."""
    job = ctx.job
    if job is None or not (_planned(d, "requeue") or (_planned(d, "stop") and _recovery(d))):
        return _keep(d)
    stalled = stalled_restarts(job.id, ctx.guards, ctx.policy, ctx.now)
    limit = ctx.policy.verify.max_failures_before_checkpoint
    if d.action == "stop":
        why = (
            f"{stalled} restarts in a row failed before their first checkpoint (limit "
            f"{limit}): restarting again only burns GPU-hours; {d.reason}"
        )
        return _keep(replace(d, guard="no_progress", reason=why))
    if ctx.attr.cause in FAULT_CAUSES:
        return _keep(d)
    if stalled < limit:
        return _keep(d)
    why = (
        f"job {job.id}'s last {stalled} restart(s) failed before their first checkpoint "
        f"(limit {limit}); {ctx.attr.reason}"
    )
    return _give_up(d, "no_progress", why)


def retry_budget(d: Decision, ctx: Context) -> Outcome:
    """Two budgets a job in the window, counted apart; past one, stop + escalate (a requeue
    away from a shared cause: it waits for the person). A requeue that removes nothing from
    the job (its crash retried, a hang, a failure nobody is blamed for) spends
    `max_requeues`: the same failure again with nothing removed is a crash loop. One that
    takes the failure's nodes out of its reach (drained, or a failing switch's) cannot loop;
    it spends a budget its size explains (Policy.hardware_requeues), so a job of thousands of
    nodes is not stopped for the GPU faults it meets every few hours, and one that meets them
    far more often than that is. The job's comment may ask for fewer requeues in all, never
    for more. A requeue it lets through is spent from its budget."""
    job = ctx.job
    if not _planned(d, "requeue") or job is None:
        return _keep(d)
    policy, rules = ctx.policy, ctx.policy.budget_for(job.partition)
    since, window = ctx.now - rules.window, int(rules.window.total_seconds())
    wanted = job.options().get("max_requeues")
    if isinstance(wanted, int) and not isinstance(wanted, bool) and wanted >= 0:
        total = ctx.guards.requeues(job.id, since, deciding=d.incident)
        if total >= wanted:
            why = (
                f"job {job.id} was requeued {total} time(s) in the last {window}s (its own "
                f"budget {wanted}); {ctx.attr.reason}"
            )
            return _give_up(d, "retry_budget_exhausted", why)
    removing = removes(ctx.attr.cause, d.exclude)
    used = ctx.guards.requeues(job.id, since, deciding=d.incident, removing=removing)
    if removing:
        budget = policy.hardware_requeues(len(job.nodes), rules)
        kind = " away from its failures' nodes"
        if rules.max_hardware_requeues is None and budget > rules.max_requeues:
            expected = policy.expected_failures(len(job.nodes), rules.window)
            basis = (
                f"budget {budget}: {rules.hardware_headroom:g} x the {expected:.1f} failures "
                f"{len(job.nodes)} nodes expect at {policy.failure_rate:g} per 1,000 node-days"
            )
        else:
            basis = f"budget {budget}"
    else:
        budget, basis = rules.max_requeues, f"budget {rules.max_requeues}"
        kind = " with nothing taken out of its reach"
    if used >= budget:
        why = (
            f"job {job.id} was requeued {used} time(s){kind} in the last {window}s ({basis}); "
            f"{ctx.attr.reason}"
        )
        return _give_up(d, "retry_budget_exhausted", why)
    # A requeue nobody could be blamed for remembers where the job failed first (its
    # PastAction's nodes): requeue_once names that node when the job fails first there again;
    # one for one rank's crash, where it crashed (requeue_once stops the same again).
    first = first_failing(ctx.evidence) if died_blameless(ctx.attr.cause, job) else None
    where = (first.node,) if first is not None and first.node else ctx.attr.crashed
    failed_on = where if ctx.attr.partial or first is not None else ()
    spent = PastAction(
        at=ctx.now,
        action="requeue",
        job=job.id,
        nodes=failed_on,
        exclude=d.exclude,
        cause=ctx.attr.cause,
        incident=d.incident,
        readmit=d.readmit,
    )
    return Outcome((replace(d, failed_on=failed_on),), (Counted(spent),))


def already_drained(d: Decision, ctx: Context) -> Outcome:
    """Nodes already out of service (an operator's drain, or an alert that outlived the job it
    hit): nothing to drain, and nothing for the breaker to count. A requeue still excludes them."""
    if _planned(d, "drain") and all(
        n in ctx.view.nodes and ctx.view.nodes[n].state.startswith("drain") for n in d.nodes
    ):
        return _refuse(d, "already_drained", f"{names(d.nodes)} is already drained", ctx)
    return _keep(d)


def repeat(d: Decision, ctx: Context) -> Outcome:
    """A node that fails again within `repeats.window` of an earlier drain (it was back in
    service: resumed by a person or by a repair) is a hardware suspect: drained again with the
    repeat in Slurm's reason (`repeat 2 in 7d`) and escalated for replacement, not cycled
    through drain and resume as if it were the first time."""
    if not _planned(d, "drain"):
        return _keep(d)
    rules = ctx.policy.repeats
    since = ctx.now - rules.window
    # Drains before this failure began: one failure that reached two jobs' incidents (a
    # node both shared) is drained by each, and is still one failure.
    began = {
        n: min((e.starts_at for e in ctx.evidence if e.node == n), default=ctx.now) for n in d.nodes
    }

    def failures(n: str) -> int:
        earlier = [
            (h.at, not h.held)
            for h in ctx.guards.earlier_drains(n, since, d.incident)
            if h.at < began[n]
        ]
        counted = distinct([*earlier, (began[n], True)], rules.apart)
        if counted[-1] != began[n]:
            return 0  # the fault of a drain that left the node in service, alerting again
        return len(counted)

    times = {n: failures(n) for n in d.nodes}
    repeated = sorted(n for n, k in times.items() if k >= rules.count)
    if not repeated:
        return _keep(d)
    k, window = max(times[n] for n in repeated), durations.format(rules.window)
    drain = replace(
        d,
        note=f"repeat {k} in {window}",
        reason=f"{d.reason}; {names(repeated)} drained {k} times in {window}: a hardware suspect",
    )
    why = (
        f"{names(repeated)} failed again within {window} of an earlier drain (repeat {k}): a "
        f"hardware suspect, to replace or return (RMA) rather than resume again. {ctx.attr.reason}"
    )
    suspect = replace(_bare(d), action="escalate", nodes=tuple(repeated), guard="repeat_failure")
    return Outcome((drain, replace(suspect, reason=why)))


def breaker(d: Decision, ctx: Context) -> Outcome:
    """At most a fraction of the cluster drained in the sliding window; past it (or while the
    breaker is open) a drain becomes an escalation, until a human resets the breaker."""
    if not _planned(d, "drain"):
        return _keep(d)
    rules = ctx.policy.breaker
    already = ctx.guards.drained(ctx.now - rules.window)
    limit = max(1, math.ceil(rules.max_fraction * len(ctx.view.nodes)))
    new = {n for n in d.nodes if n not in already}
    if ctx.guards.breaker_open or len(already) + len(new) > limit:
        why = (
            f"Draining {names(d.nodes)} would pass the breaker's {limit} node(s) per "
            f"{int(rules.window.total_seconds())}s; a human must look. {ctx.attr.reason}"
        )
        opens: tuple[Effect, ...] = () if ctx.guards.breaker_open else (BreakerOpened(),)
        return Outcome(
            (replace(d, action="escalate", guard="circuit_breaker_open", reason=why),), opens
        )
    drained = PastAction(
        at=ctx.now, action="drain", nodes=d.nodes, cause=ctx.attr.cause, incident=d.incident
    )
    return Outcome((d,), (Counted(drained),))


def storm_told(d: Decision, ctx: Context) -> Outcome:
    """One escalation a storm: the first incident a shared cause covers tells a person of the
    whole storm (its nodes); the others say so and wait with it (`none`), but for a job the
    storm killed (Slurm did not requeue it): someone must run it again, each its own
    escalation. Counted in the guards' memory, so a restart does not tell again."""
    storm = ctx.attr.storm
    if not _planned(d, "escalate") or d.cause != SHARED or not storm:
        return _keep(d)
    told = ctx.guards.storm_told(storm, ctx.now - ctx.policy.shared_cause.window)
    if told is not None and told.incident != d.incident and ctx.job is not None and ctx.job.failed:
        why = (
            f"job {ctx.job.id} failed in the storm a person was told of in incident "
            f"{told.incident} ({names(told.nodes)}) and waits for someone to run it again. "
            f"{d.reason}"
        )
        return Outcome((replace(d, reason=why),))
    if told is not None and told.incident != d.incident:
        why = (
            f"{d.reason}; a person was told of this storm ({names(told.nodes)}) in incident "
            f"{told.incident}"
        )
        return Outcome((replace(_bare(d), action="none", guard="storm_escalated", reason=why),))
    escalated = replace(d, nodes=storm)
    counted = PastAction(
        at=ctx.now, action="escalate", nodes=storm, cause=SHARED, incident=d.incident
    )
    return Outcome((escalated,), (Counted(counted),))


def mode(d: Decision, ctx: Context) -> Outcome:
    """The mode the policy gives the action on its partition (monitor records, approve waits
    for a human, enforce executes), and the state that mode starts in. While the global switch
    holds everything in monitor mode, the decision is a record (guard `global_switch`)."""
    decided = with_mode(d, ctx.policy, partition_of(ctx), forced=ctx.guards.monitor_forced)
    if ctx.guards.monitor_forced and d.action != "none":
        would = ctx.policy.mode_of(d.action, decided.partition, d.cause)
        if would != "monitor":
            why = f"the global switch holds every action in monitor mode (policy: {would})"
            decided = replace(decided, guard=d.guard or GLOBAL_SWITCH, reason=f"{d.reason}; {why}")
    return _keep(decided)


def partition_of(ctx: Context) -> str | None:
    """The partition whose modes a decision takes: its job's; for an idle node, the node's
    only partition (a node that serves several takes the policy's own modes)."""
    if ctx.job is not None:
        return ctx.job.partition or None
    nodes = {n for e in ctx.evidence if (n := e.node) in ctx.view.nodes}
    parts = {p for n in nodes for p in ctx.view.nodes[n].partitions}
    return parts.pop() if len(parts) == 1 else None


# ---- the pipeline ----------------------------------------------------------------------------
def each(stage: Stage) -> Step:
    """A stage applied to every decision in turn, in their order."""

    def step(decisions: Sequence[Decision], ctx: Context) -> Outcome:
        out: list[Decision] = []
        effects: list[Effect] = []
        for d in decisions:
            result = stage(d, ctx)
            out += result.decisions
            effects += result.effects
        return Outcome(tuple(out), tuple(effects))

    return step


def one_per_action(decisions: Sequence[Decision], ctx: Context) -> Outcome:
    """At most one decision per action, the first: four GPUs failing on one node is one drain,
    and an escalation the breaker made is not repeated by the job's. But for a `none` that
    leaves the job running on purpose (guard job_running): it is what keeps the incident
    watching its job, and wins over a `none` of nothing to do (a drain of a node drained
    already)."""
    kept: dict[str, int] = {}
    out: list[Decision] = []
    for d in decisions:
        if d.action not in kept:
            kept[d.action] = len(out)
            out.append(d)
        elif leaves_running(d):
            out[kept["none"]] = d
    return Outcome(tuple(out))


PIPELINE: tuple[tuple[str, Step], ...] = (
    ("moved_on", each(moved_on)),
    ("job_running", each(job_running)),
    ("scope", each(scope)),
    ("ended_by_choice", each(ended_by_choice)),
    ("ended_before_record", each(ended_before_record)),
    ("requeue_once", each(requeue_once)),
    ("no_requeue", each(no_requeue)),
    ("asked_not_to_restart", each(asked_not_to_restart)),
    ("opt_in_out", each(opt_in_out)),
    ("owners_exclusions", each(owners_exclusions)),
    ("readmit", each(readmit)),
    ("room", each(room)),
    ("no_progress", each(no_progress)),
    ("retry_budget", each(retry_budget)),
    ("already_drained", each(already_drained)),
    ("repeat", each(repeat)),
    ("breaker", each(breaker)),
    ("one_per_action", one_per_action),
    ("storm_told", each(storm_told)),
    ("mode", each(mode)),
)


def run(decisions: Sequence[Decision], ctx: Context) -> Outcome:
    """Every step of PIPELINE in order; the effects of all of them."""
    effects: list[Effect] = []
    for _, step in PIPELINE:
        result = step(decisions, ctx)
        decisions = result.decisions
        effects += result.effects
    return Outcome(tuple(decisions), tuple(effects))


def decide(
    *,
    incident: str,
    attr: Attribution,
    job: Job | None,
    evidence: Sequence[Evidence],
    view: ClusterView,
    policy: Policy,
    guards: GuardState,
    now: datetime,
) -> Outcome:
    """The incident's decisions (the plan, through every guard) and their effects on `guards`,
    which it only reads."""
    base = Decision(
        at=now,
        incident=incident,
        job=job.id if job else None,
        action="none",
        cause=attr.cause,
        reason=attr.reason,
        evidence=tuple(e.record() for e in evidence if e.actionable),
    )
    evidence = tuple(evidence)
    ctx = Context(attr, job, evidence, view, policy, guards, now)
    # A job is requeued away from a shared cause only once it has failed (docs/operations.md: act on
    # failures): many nodes "down" at once may be the monitoring's fault, not theirs.
    away = (
        policy.shared_cause.requeue_away
        and job is not None
        and job_failed(job, evidence)
        and died_of_the_storm(job, evidence, attr, policy, now)
    )
    out = run(plan(base, attr, job, requeue_away=away), ctx)
    # What each would disrupt, as the view says now: the trial report's measure of harm.
    measured = tuple(with_disruption(d, job, view, now) for d in out.decisions)
    return Outcome(measured, _held(out.effects, measured))


def decide_recovery(
    *,
    watch: Watch,
    verdict: Verdict,
    job: Job | None,
    view: ClusterView,
    policy: Policy,
    guards: GuardState,
    now: datetime,
) -> Outcome:
    """A failed recovery's decisions (webhook.core.recovery.plan) through every guard, the
    verdict already in `guards`' memory."""
    attr = Attribution(watch.cause, (), f"the requeued job did not recover: {verdict.reason}")
    ctx = Context(attr, job, (), view, policy, guards, now)
    limit = policy.verify.max_failures_before_checkpoint
    stop = job is not None and stalled_restarts(job.id, guards, policy, now) >= limit
    out = run(recovery.plan(watch, verdict, job, now, stop=stop), ctx)
    measured = tuple(with_disruption(d, job, view, now) for d in out.decisions)
    return Outcome(measured, _held(out.effects, measured))


def _held(effects: Sequence[Effect], decisions: Sequence[Decision]) -> tuple[Effect, ...]:
    """The actions counted for records (monitor mode, the global switch) and for decisions that
    wait for a person are `held`: counted as if they ran, but not run. The core takes an enforce
    decision for carried out (replay, the simulator, which carries it out); the live loop holds
    it until its run, and settles what becomes of each."""
    unrun = {d.action for d in decisions if d.state != PENDING}
    return tuple(
        Counted(replace(e.action, held=True))
        if isinstance(e, Counted) and e.action.action in unrun
        else e
        for e in effects
    )
