"""The live loop's recovery check (webhook.service.verify) on the simulated cluster: each
requeue slurmedic carried out is watched until its successor trains past the step the job had
reached, or fails to. The judging is the core's (webhook.core.recovery); what the job reports
comes from the simulated training (one rank: the simulator's ranks all say the same) in place
of Prometheus. A failed recovery is escalated, counts against the job (`no_progress`) when it is
the job's own, and stops a job that keeps failing before its first checkpoint."""

from __future__ import annotations

from webhook.core.decisions import Decision
from webhook.core.engine import Engine
from webhook.core.incidents import attempt_of
from webhook.core.policy import Policy
from webhook.core.recovery import FailurePoint, RankProgress, Watch, judge
from webhook.simulate.world import EPOCH, SimJob, World, when


class Recoveries:
    def __init__(self, world: World, policy: Policy, engine: Engine) -> None:
        self.world, self.policy, self.engine = world, policy, engine
        self.watches: dict[str, Watch] = {}  # by the requeue's incident

    def watch(self, incident: str, cause: str, job: SimJob, fault_at: float) -> None:
        """`job` was just requeued for `incident`: watch its successor."""
        self.watches[incident] = Watch(
            incident=incident,
            job=job.id,
            attempt=attempt_of(incident),  # as the live verifier reads it
            cause=cause,
            fault_at=when(fault_at),
            requeued_at=when(self.world.now),
            point=FailurePoint(
                step=job.reached,
                checkpoint_step=job.productive,
                work_lost_seconds=job.reached - job.productive,
            ),
        )

    def _ranks(self, job: SimJob) -> list[RankProgress]:
        progress = job.progress(self.world.now)
        if progress is None:
            return []
        step, checkpoint = progress
        return [RankProgress(rank=0, attempt=job.restarts, step=step, checkpoint_step=checkpoint)]

    def next_due(self) -> float | None:
        """Just past the earliest deadline of a successor that runs (the core's is strict)."""
        dues = [
            (watch.due(when(job.started), self.policy.verify) - EPOCH).total_seconds() + 1
            for watch in self.watches.values()
            if (job := self.world.jobs[watch.job]).running and job.restarts == watch.attempt + 1
        ]
        return min(dues, default=None)

    def judge(self) -> list[Decision]:
        """Judge every watch; the decisions of the failed recoveries."""
        w, now = self.world, when(self.world.now)
        decisions: list[Decision] = []
        for incident, watch in list(self.watches.items()):
            job = w.jobs[watch.job]
            seen = w.view.jobs.get(job.id)
            verdict = judge(watch, self._ranks(job), seen, now, self.policy.verify)
            if verdict.state == "watching":
                continue
            del self.watches[incident]
            decisions += self.engine.judged(watch, verdict, seen, now)
        return decisions
