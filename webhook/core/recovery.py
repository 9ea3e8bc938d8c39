"""Verification, sans-I/O: after a requeue, did training progress resume?

A requeue that Slurm carried out is not yet a recovery: the successor attempt must make
progress again. It is *recovered* once every rank of the successor that reports has passed the
step the job had reached when it failed (or its last checkpoint, or its first step, when that is
all that is known); the time from the fault to then is the time to restore productive training.
It has *failed* when the successor ends or is requeued again first, or shows no such progress
within the deadline. A failed recovery is escalated and counts against the job's retry budget;
a job that keeps failing before its successor writes a checkpoint is stopped: each restart only
burns GPU-hours.

Plain data in (progress as Prometheus reports it, the job as Slurm reports it, the time), a
verdict and decisions out.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from webhook.core.cluster import ENDED_STATES, Job
from webhook.core.decisions import STATE_OF_MODE, Decision, GuardState
from webhook.core.policy import Policy

State = Literal["watching", "recovered", "failed"]


@dataclass(frozen=True)
class RankProgress:
    """One rank's last push (training_* gauges); timestamps in seconds since the epoch."""

    rank: int
    attempt: int | None = None
    step: float | None = None
    step_at: float | None = None
    checkpoint_step: float | None = None
    checkpoint_at: float | None = None


@dataclass(frozen=True)
class FailurePoint:
    """How far the failed attempt had come: the target its successor must pass."""

    step: float | None = None
    checkpoint_step: float | None = None
    work_lost_seconds: float | None = None  # training since the last checkpoint, lost

    @property
    def target(self) -> float:
        for value in (self.step, self.checkpoint_step):
            if value is not None:
                return value
        return 0.0


def failure_point(ranks: list[RankProgress], attempt: int) -> FailurePoint:
    """The failed attempt's progress, from its ranks' last pushes before the requeue.

    The step is the furthest any rank got (the work the job had done); the checkpoint the
    oldest complete one (what a restart resumes from)."""
    mine = [r for r in ranks if r.attempt == attempt]
    steps = [r.step for r in mine if r.step is not None]
    ckpts = [r.checkpoint_step for r in mine if r.checkpoint_step is not None]
    lost = [
        r.step_at - r.checkpoint_at
        for r in mine
        if r.step_at is not None and r.checkpoint_at is not None and r.step_at >= r.checkpoint_at
    ]
    return FailurePoint(
        step=max(steps) if steps else None,
        checkpoint_step=min(ckpts) if ckpts else None,
        work_lost_seconds=max(lost) if lost else None,
    )


@dataclass(frozen=True)
class Watch:
    """A requeued job attempt whose successor is being watched."""

    incident: str
    job: int
    attempt: int  # the attempt that failed; its successor is attempt + 1
    cause: str
    fault_at: datetime
    requeued_at: datetime
    point: FailurePoint


@dataclass(frozen=True)
class Verdict:
    state: State
    reason: str
    restored_seconds: float | None = None  # fault to productive training again
    before_checkpoint: bool = False  # failed before the successor wrote a checkpoint


def judge(
    watch: Watch,
    ranks: list[RankProgress],
    job: Job | None,
    now: datetime,
    deadline_seconds: float,
) -> Verdict:
    successor = watch.attempt + 1
    mine = [r for r in ranks if r.attempt == successor]
    steps = [r.step for r in mine if r.step is not None]
    target = watch.point.target
    if mine and len(steps) == len(mine) and min(steps) > target:
        return Verdict(
            "recovered",
            f"attempt {successor} passed step {target:g} (all {len(mine)} reporting ranks)",
            restored_seconds=(now - watch.fault_at).total_seconds(),
        )
    # A checkpoint of its own: past the one it resumed from (which ranks report at start).
    resumed = watch.point.checkpoint_step or 0
    no_checkpoint = not any(
        r.checkpoint_step is not None and r.checkpoint_step > resumed for r in mine
    )
    if job is not None and job.state == "COMPLETED" and job.restarts == successor:
        return Verdict(
            "recovered",
            f"attempt {successor} completed",
            restored_seconds=(now - watch.fault_at).total_seconds(),
        )
    if job is None:
        why = "the job is gone from Slurm"
    elif job.restarts > successor:
        why = f"attempt {successor} was requeued again (restart {job.restarts})"
    elif job.state in ENDED_STATES and job.restarts == successor:
        why = f"attempt {successor} ended {job.state}"
    elif (now - watch.requeued_at).total_seconds() > deadline_seconds:
        why = f"attempt {successor} did not pass step {target:g} within {deadline_seconds:g} s"
    else:
        return Verdict("watching", f"waiting for attempt {successor} to pass step {target:g}")
    return Verdict(
        "failed",
        f"{why}{' before its first checkpoint' if no_checkpoint else ''}",
        before_checkpoint=no_checkpoint,
    )


def on_failure(
    watch: Watch,
    verdict: Verdict,
    job: Job | None,
    guards: GuardState,
    policy: Policy,
    now: datetime,
) -> list[Decision]:
    """A failed recovery: escalate; stop a job that keeps failing before any checkpoint."""
    evidence = (
        {
            "recovery": watch.incident,
            "verdict": verdict.reason,
            "before_checkpoint": verdict.before_checkpoint,
        },
    )
    decisions = [
        Decision(
            at=now,
            incident=watch.incident,
            job=watch.job,
            action="escalate",
            cause=watch.cause,
            reason=f"the requeued job did not recover: {verdict.reason}",
            evidence=evidence,
            guard="recovery_failed",
            mode=policy.mode_of("escalate"),
            state=STATE_OF_MODE[policy.mode_of("escalate")],
        )
    ]
    since = now - policy.retry_budget.window
    repeated = guards.failed_recoveries(watch.job, since, before_checkpoint=True)
    alive = job is not None and job.state not in ENDED_STATES
    limit = policy.verify.max_failures_before_checkpoint
    if verdict.before_checkpoint and repeated + 1 >= limit and alive and job is not None:
        mode = policy.mode_of("stop")
        decisions.append(
            Decision(
                at=now,
                # The attempt that runs (or waits) now is the one to stop.
                incident=job.attempt,
                job=watch.job,
                action="stop",
                cause=watch.cause,
                reason=(
                    f"{repeated + 1} restarts in a row failed before their first checkpoint "
                    f"(limit {limit}): restarting again only burns GPU-hours"
                ),
                evidence=evidence,
                guard="no_progress",
                mode=mode,
                state=STATE_OF_MODE[mode],
            )
        )
    return decisions
