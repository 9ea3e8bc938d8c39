"""Recovery drills, sans-I/O: an operator interrupts a noncritical job on purpose, to prove
before a real failure that it comes back with usable output.

A drill is asked for (`slurmedic drill`, the console) and planned by the leader's loop, which
has the cluster view: a requeue of the job's running attempt, optionally excluding one of its
nodes as a hardware fault's requeue would, under an incident of its own (`drill:<job>.<n>`),
in the mode the policy gives requeues on the job's partition, carried out by the same executor
and playbooks as a real decision and watched by the same verifier. It is judged stricter than
a recovery: it passes only when the successor resumed from the job's last complete checkpoint
(not an older one, not from scratch) and its output stayed usable. It is never charged to the
job, never remembered by the guards, and kept apart from every figure of real recoveries.

What a job's owner says in its comment (`{"slurmedic": {"drill": false}}`) is kept; with the
policy's `drills.require_opt_in`, only jobs that say `true` are drilled. The policy's partitions
and a job's `--no-requeue` apply as to any requeue.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from itertools import pairwise

from webhook.core.cluster import ClusterView, Job
from webhook.core.decisions import Decision, with_mode
from webhook.core.incidents import IncidentKey
from webhook.core.policy import Policy
from webhook.core.recovery import Verdict, Watch

CAUSE = "drill"  # the cause a drill's decisions carry: apart from every failure's
FAILED_GUARD = "drill_failed"  # the escalation of a drill that did not pass


@dataclass(frozen=True)
class Request:
    """An operator's request for a drill, as the ledger holds it until the loop plans it."""

    id: int
    job: int
    by: str
    at: datetime
    exclude: str | None = None  # one of the job's nodes, excluded as for a hardware fault


class Refused(ValueError):
    """Why a drill is not run; the message says it."""


def plan(request: Request, view: ClusterView, policy: Policy, now: datetime) -> Decision:
    """The requeue a drill makes of the job's running attempt (Refused: why not)."""
    job = view.jobs.get(request.job)
    if job is None:
        raise Refused(f"job {request.job} is not in Slurm's view")
    if job.state != "RUNNING" or job.started is None:
        raise Refused(f"job {job.id} is {job.state}, not running: nothing to interrupt")
    _allowed(job, policy)
    exclude: tuple[str, ...] = ()
    if request.exclude is not None:
        if request.exclude not in job.nodes:
            raise Refused(f"exclude: {request.exclude} is not one of job {job.id}'s nodes")
        exclude = (request.exclude,)
    also = f", excluding {request.exclude}" if exclude else ""
    decision = Decision(
        at=now,
        incident=str(IncidentKey.drilling(job.id, job.restarts)),
        job=job.id,
        action="requeue",
        cause=CAUSE,
        reason=f"recovery drill asked by {request.by}: requeue attempt {job.restarts}{also}, "
        "then verify it resumes from its last checkpoint with usable output",
        exclude=exclude,
        evidence=({"drill": request.id, "by": request.by, "asked_at": request.at.isoformat()},),
        gpus=0,
    )
    return with_mode(decision, policy, job.partition or None)


def _allowed(job: Job, policy: Policy) -> None:
    if not policy.in_scope(job.partition):
        raise Refused(f"job {job.id} is outside the policy's partitions")
    if not job.requeue:
        raise Refused(f"job {job.id} was submitted with --no-requeue")
    options = job.options()
    if options.get("drill") is False or options.get("requeue") is False:
        raise Refused(f"job {job.id} opted out of drills in its comment")
    if policy.drills.require_opt_in and options.get("drill") is not True:
        raise Refused(f"job {job.id} did not opt in to drills (policy drills.require_opt_in)")


def before_checkpoint(times: list[float], margin: timedelta, now: datetime) -> datetime:
    """When to drill a job so that its interruption comes right before its next checkpoint
    is due (the worst case: the most work since the last one is lost), from the times of the
    checkpoints it reported: the last one plus its usual interval (the median of the gaps
    between them), less `margin` for the requeue to reach it. Refused when the job has not
    reported two checkpoints: its interval is unknown."""
    written = sorted(set(times))
    if len(written) < 2:
        raise Refused("the job has not reported two checkpoints: its interval is unknown")
    gaps = sorted(b - a for a, b in pairwise(written))
    usual = gaps[len(gaps) // 2]
    due = datetime.fromtimestamp(written[-1] + usual, tz=now.tzinfo) - margin
    # A checkpoint overdue already: its next one may come any moment, so now.
    return max(due, now)


def judge(verdict: Verdict) -> Verdict:
    """A recovery verdict, as a drill's: recovered counts only from the last checkpoint."""
    resume = verdict.resume
    if verdict.state != "recovered" or resume is None or not resume.older:
        return verdict
    return replace(
        verdict,
        state="failed",
        reason=f"the job came back, but not from its last checkpoint: {verdict.reason}",
    )


def decisions(
    watch: Watch, verdict: Verdict, job: Job | None, policy: Policy, now: datetime
) -> list[Decision]:
    """A drill that failed goes to a human (its job's owner), in the mode the policy gives
    escalations: nothing else. Never a stop, never charged: the interruption was the
    operator's."""
    if verdict.state != "failed":
        return []
    partition = job.partition if job is not None and job.partition else None
    return [
        with_mode(
            Decision(
                at=now,
                incident=str(IncidentKey.verifying(watch.job, watch.attempt)),
                job=watch.job,
                action="escalate",
                cause=CAUSE,
                reason=f"the recovery drill failed: {verdict.reason}",
                evidence=({"recovery": watch.incident, "verdict": verdict.reason, "drill": True},),
                guard=FAILED_GUARD,
            ),
            policy,
            partition,
        )
    ]
