"""Verification, sans-I/O: after a requeue, did training progress resume?

A requeue that Slurm carried out is not yet a recovery: the successor attempt must make
progress again. It is *recovered* once every rank of the successor that reports has passed the
step the job had reached when it failed (or its last checkpoint, or its first step, when that is
all that is known); the time from the fault to then is the time to restore productive training.
It has *failed* when the successor ends or is requeued again first, or shows no such progress
within the deadline of its start (time in the queue does not count). Once recovered, the
evidence says how: the checkpoint the successor resumed from against the failed attempt's last
one, the work lost, the time to its start, and the job's quality value (its loss) before and
after; a successor whose quality value did not continue its predecessor's trains on a state
that was not sound (a corrupt checkpoint): its recovery is failed, for a human.

A failed recovery is escalated; when the failure is the job's own (it ended, or made no
progress) it also counts against the job's retry budget, and a job that keeps failing before
its successor writes a checkpoint is stopped: each restart only burns GPU-hours (the engine
applies a verdict, Engine.judged: `plan` here, then the guards, whose `no_progress` says when
to stop). A recovery that cannot be judged (the job reports no progress, Slurm forgot the job, the
successor never started) is *unverified*: recorded, nothing decided.

Plain data in (progress as Prometheus reports it, the job as Slurm reports it, the time), a
verdict and decisions out.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Literal

from webhook.core.cluster import Job
from webhook.core.decisions import Decision, PastAction
from webhook.core.incidents import IncidentKey
from webhook.core.policy import QualityBetter, Verify

State = Literal["watching", "recovered", "failed", "unverified"]


@dataclass(frozen=True)
class RankProgress:
    """One rank's last push (training_* gauges); timestamps in seconds since the epoch."""

    rank: int
    attempt: int | None = None
    step: float | None = None
    step_at: float | None = None
    checkpoint_step: float | None = None
    checkpoint_at: float | None = None
    started_at: float | None = None  # when the rank's attempt started
    resume_step: float | None = None  # the checkpoint its attempt loaded (0: none)
    quality: float | None = None  # the job's quality value (its loss) at its last step

    def own_checkpoint(self, resumed_from: float) -> bool:
        """Whether the rank wrote a checkpoint in its own attempt (not just loaded one): written
        after the attempt started, or, without the times, past the one it resumed from."""
        if self.checkpoint_step is None:
            return False
        if self.checkpoint_at is not None and self.started_at is not None:
            return self.checkpoint_at > self.started_at
        return self.checkpoint_step > resumed_from


@dataclass(frozen=True)
class FailurePoint:
    """How far the failed attempt had come: the target its successor must pass."""

    step: float | None = None
    checkpoint_step: float | None = None
    work_lost_seconds: float | None = None  # training since the last checkpoint, lost
    quality: float | None = None  # the job's quality value at its last step (mean of ranks)

    @property
    def target(self) -> float:
        for value in (self.step, self.checkpoint_step):
            if value is not None:
                return value
        return 0.0

    def seconds_per_step(self) -> float | None:
        """The failed attempt's pace since its last checkpoint, when both ends are known."""
        if self.step is None or self.checkpoint_step is None or self.work_lost_seconds is None:
            return None
        done = self.step - self.checkpoint_step
        return self.work_lost_seconds / done if done > 0 else None


def failure_point(ranks: list[RankProgress], attempt: int) -> FailurePoint:
    """The failed attempt's progress, from its ranks' last pushes before the requeue.

    The step is the furthest any rank got (the work the job had done); the checkpoint the
    oldest complete one (what a restart resumes from)."""
    mine = [r for r in ranks if r.attempt == attempt]
    steps = [r.step for r in mine if r.step is not None]
    ckpts = [r.checkpoint_step for r in mine if r.checkpoint_step is not None]
    # Training since the last checkpoint, or since the attempt started when that is later: a
    # resumed rank reports the checkpoint it loaded, written before its time in the queue.
    lost = [
        r.step_at - max(r.checkpoint_at, r.started_at or r.checkpoint_at)
        for r in mine
        if r.step_at is not None and r.checkpoint_at is not None and r.step_at >= r.checkpoint_at
    ]
    return FailurePoint(
        step=max(steps) if steps else None,
        checkpoint_step=min(ckpts) if ckpts else None,
        work_lost_seconds=max(lost) if lost else None,
        quality=_mean(r.quality for r in mine),
    )


def _mean(values: Iterable[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return sum(known) / len(known) if known else None


@dataclass(frozen=True)
class Resume:
    """How a successor resumed, what the failure cost, and whether its output stayed usable:
    the evidence a recovery (and a drill) is judged and reported on."""

    step: float | None = None  # the checkpoint it loaded (the oldest of its ranks')
    expected: float | None = None  # the failed attempt's last complete checkpoint
    lost_steps: float | None = None  # from the furthest step reached back to `step`
    lost_seconds: float | None = None  # training time those steps took (estimated when older)
    start_seconds: float | None = None  # from the requeue to the successor's start
    quality_before: float | None = None  # the failed attempt's quality at its last step
    quality_after: float | None = None  # the successor's, once it passed that step

    @property
    def older(self) -> bool:
        """It resumed from an older checkpoint than the last complete one (or from scratch)."""
        return self.step is not None and self.expected is not None and self.step < self.expected

    def quality_worse(self, better: QualityBetter) -> float | None:
        """How much worse the successor's quality value is than where the failed attempt left
        it, relative to it (negative: better); None when either side is not reported. Only
        worse counts: a successor judged a few steps past the failure has trained on, and a
        loss that fell meanwhile is no sign of a bad checkpoint."""
        if self.quality_before is None or self.quality_after is None:
            return None
        change = (self.quality_after - self.quality_before) / max(abs(self.quality_before), 1e-12)
        return change if better == "lower" else -change

    def usable(self, verify: Verify) -> bool | None:
        worse = self.quality_worse(verify.quality_better)
        return None if worse is None else worse <= verify.quality_tolerance

    def said(self) -> str:
        """The evidence in words, for a verdict's reason."""
        parts = []
        if self.step is not None:
            expected = "" if self.expected is None else f" (last checkpoint {self.expected:g})"
            parts.append(f"resumed from step {self.step:g}{expected}")
        if self.lost_steps is not None:
            lost = f"{self.lost_steps:g} steps lost"
            if self.lost_seconds is not None:
                lost += f" ({self.lost_seconds:.0f} s of training)"
            parts.append(lost)
        if self.quality_before is not None and self.quality_after is not None:
            parts.append(
                f"quality {self.quality_before:.4g} before, {self.quality_after:.4g} after"
            )
        return "; ".join(parts)


def _pace(ranks: list[RankProgress]) -> float | None:
    """Seconds a step, from how far the successor got since its start (its load included, so a
    little high): the failed attempt's pace is unknown when it failed right at a checkpoint."""
    paces = []
    for r in ranks:
        if r.step is None or r.step_at is None or r.started_at is None or r.resume_step is None:
            continue
        if r.step > r.resume_step:
            paces.append((r.step_at - r.started_at) / (r.step - r.resume_step))
    return max(paces) if paces else None


def resume_of(watch: Watch, successor: list[RankProgress]) -> Resume:
    """The successor's resume, from its ranks' latest pushes and the failed attempt's point."""
    point = watch.point
    loaded = [r.resume_step for r in successor if r.resume_step is not None]
    step = min(loaded) if loaded else None
    lost_steps = lost_seconds = None
    if step is not None and point.step is not None:
        lost_steps = max(point.step - step, 0.0)
        if step == point.checkpoint_step:
            lost_seconds = point.work_lost_seconds
        elif (pace := point.seconds_per_step() or _pace(successor)) is not None:
            lost_seconds = lost_steps * pace
    starts = [r.started_at for r in successor if r.started_at is not None]
    start_seconds = min(starts) - watch.requeued_at.timestamp() if starts else None
    return Resume(
        step=step,
        expected=point.checkpoint_step,
        lost_steps=lost_steps,
        lost_seconds=lost_seconds,
        start_seconds=None if start_seconds is None else max(start_seconds, 0.0),
        quality_before=point.quality,
        quality_after=_mean(r.quality for r in successor),
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
    drill: bool = False  # an operator's drill, not a real failure: apart from every figure

    def deadline(self, verify: Verify) -> timedelta:
        """How long from its start the successor has to pass the step: the policy's deadline
        (its restart, loading the checkpoint) and the work it has to redo, since the failed
        attempt's last checkpoint. A job that checkpoints every two hours may fail nearly two
        hours after its last one; a fixed deadline would call every such recovery a failure."""
        return verify.deadline + timedelta(seconds=max(self.point.work_lost_seconds or 0.0, 0.0))

    def due(self, started: datetime, verify: Verify) -> datetime:
        """When a successor that started at `started` has had its deadline (from the later of
        its start and the requeue): judged failed once the clock is past it."""
        return max(started, self.requeued_at) + self.deadline(verify)


@dataclass(frozen=True)
class Verdict:
    state: State
    reason: str
    restored_seconds: float | None = None  # fault to productive training again
    before_checkpoint: bool = False  # failed before the successor wrote a checkpoint
    # Whether the failure is the job's own (it ended, or made no progress in time): only then
    # does it spend the retry budget and count towards `no_progress`. A successor requeued
    # again was requeued for a failure of its own, which its requeue already counts.
    charged: bool = False
    # How the successor resumed (a recovered one, or one whose output was not usable).
    resume: Resume | None = None
    # The successor trained on, but its quality value jumped: its checkpoint was not sound.
    unusable: bool = False


def _stepped_past(rank: RankProgress, target: float) -> bool:
    """The rank trained past `target` and past the checkpoint it resumed from (or last wrote):
    a rank that has just loaded a checkpoint reports its step, which is not progress yet."""
    if rank.step is None or rank.step <= target:
        return False
    return rank.checkpoint_step is None or rank.step > rank.checkpoint_step


def judge(
    watch: Watch,
    ranks: list[RankProgress],
    job: Job | None,
    now: datetime,
    verify: Verify,
) -> Verdict:
    successor = watch.attempt + 1
    point = watch.point
    if point.step is None and point.checkpoint_step is None:
        # Nothing to compare with: the job does not report progress (or its reports were lost).
        return Verdict("unverified", "the failed attempt reported no training progress")
    target = point.target
    mine = [r for r in ranks if r.attempt == successor]
    if mine and all(_stepped_past(r, target) for r in mine):
        resume = resume_of(watch, mine)
        evidence = resume.said()
        if resume.usable(verify) is False:
            # It trains, but not on the state it had: the owner must look before more is lost.
            return Verdict(
                "failed",
                f"attempt {successor} trains past step {target:g}, but its output is not "
                f"usable: its quality value is more than {verify.quality_tolerance:.0%} "
                f"worse than the failed attempt's ({verify.quality_better} is better): "
                f"{evidence}",
                resume=resume,
                unusable=True,
            )
        also = f"; {evidence}" if evidence else ""
        return Verdict(
            "recovered",
            f"attempt {successor} passed step {target:g} (all {len(mine)} reporting ranks){also}",
            restored_seconds=(now - watch.fault_at).total_seconds(),
            resume=resume,
        )
    if job is not None and job.state == "COMPLETED" and job.restarts == successor:
        return Verdict(
            "recovered", f"attempt {successor} completed", (now - watch.fault_at).total_seconds()
        )
    if job is None:
        # Slurm forgets ended jobs after MinJobAge: how it ended was not seen.
        return Verdict("unverified", "the job is gone from Slurm; how it ended was not seen")
    early = not any(r.own_checkpoint(point.checkpoint_step or 0) for r in mine)
    note = " before its first checkpoint" if early else ""
    if job.restarts > successor:
        return Verdict(
            "failed",
            f"attempt {successor} was requeued again (restart {job.restarts}){note}",
            before_checkpoint=early,
        )
    if "CANCELLED" in (job.state, job.base) and job.restarts == successor:
        # scancel: a person's (or slurmedic's own stop's) decision, not the job failing.
        return Verdict("unverified", f"attempt {successor} was cancelled")
    if job.interrupted and job.restarts == successor:
        return Verdict(
            "failed", f"attempt {successor} ended {job.state}{note}", None, early, charged=True
        )
    running = job.restarts == successor and job.active and job.started
    if not running:
        # Waiting in the queue is not the job's failure: the deadline starts when it runs.
        if (now - watch.requeued_at) > verify.pending_limit:
            return Verdict("unverified", f"attempt {successor} has not started yet")
        return Verdict("watching", f"waiting for attempt {successor} to start")
    assert job.started is not None
    if now > watch.due(job.started, verify):
        deadline = watch.deadline(verify)
        redo = deadline - verify.deadline
        also = f" ({redo.total_seconds():g} s of them to redo lost work)" if redo else ""
        return Verdict(
            "failed",
            f"attempt {successor} did not pass step {target:g} within "
            f"{deadline.total_seconds():g} s of its start{also}{note}",
            None,
            early,
            charged=True,
        )
    return Verdict("watching", f"waiting for attempt {successor} to pass step {target:g}")


def remembered(watch: Watch, verdict: Verdict, now: datetime) -> PastAction | None:
    """What the guards keep of a verdict: a recovery (it ends a run of failed ones), or a
    failure that was the job's own (it spends the budget and counts towards `no_progress`)."""
    if verdict.state == "recovered":
        return PastAction(at=now, action="recovered", job=watch.job)
    if verdict.state == "failed" and verdict.charged:
        return PastAction(
            at=now,
            action="recovery_failed",
            job=watch.job,
            cause=watch.cause,
            before_checkpoint=verdict.before_checkpoint,
            incident=str(IncidentKey.verifying(watch.job, watch.attempt)),
        )
    return None


def plan(
    watch: Watch, verdict: Verdict, job: Job | None, now: datetime, *, stop: bool = False
) -> list[Decision]:
    """A failed recovery, before any guard has spoken: escalate; and with `stop` (the job's
    restarts failing before a first checkpoint reached the guards' limit), when this failure
    is the job's own and came before the successor's first checkpoint, a stop of the attempt
    that runs now (the guards' `no_progress` is recorded as why).

    Its decisions have incidents of their own (`verify:<job>.<attempt>`), apart from the
    engine's incidents for the same attempts."""
    evidence = (
        {
            "recovery": watch.incident,
            "verdict": verdict.reason,
            "before_checkpoint": verdict.before_checkpoint,
            "charged": verdict.charged,
        },
    )
    base = Decision(
        at=now,
        incident=str(IncidentKey.verifying(watch.job, watch.attempt)),
        job=watch.job,
        action="escalate",
        # A successor that trains on a state that was not sound is its job's to mend, whatever
        # the fault that requeued it: its owner is told (the notices' routes go by cause).
        cause="application" if verdict.unusable else watch.cause,
        reason=f"the requeued job did not recover: {verdict.reason}",
        evidence=evidence,
        guard="recovery_failed",
    )
    decisions = [base]
    alive = job is not None and not job.interrupted
    if stop and verdict.charged and verdict.before_checkpoint and alive and job is not None:
        # The attempt that runs (or waits) now is the one to stop.
        stopping = replace(
            base,
            incident=str(IncidentKey.verifying(job.id, job.restarts)),
            action="stop",
            reason=f"the requeued job did not recover before its first checkpoint: "
            f"{verdict.reason}",
            guard=None,
        )
        decisions.append(stopping)
    return decisions
