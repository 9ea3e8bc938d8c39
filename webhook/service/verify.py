"""Verification in the live loop: watch each executed requeue until its successor makes progress
again (or fails to), and act on a failed recovery. The judging is the core's
(`webhook.core.recovery`); this module fetches progress from Prometheus and keeps the ledger.

One Prometheus query per round for all the jobs watched, so a slow Prometheus costs the loop at
most one timeout per round; a failure skips the round (nothing is judged without progress).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import UTC, datetime

from webhook.adapters.prometheus import Prometheus, PrometheusError
from webhook.core import drills
from webhook.core.engine import Engine
from webhook.core.incidents import IncidentKey, attempt_of
from webhook.core.policy import Policy
from webhook.core.recovery import RankProgress, Watch, failure_point, judge
from webhook.ledger.store import Ledger

log = logging.getLogger("slurmedic.verify")


class Verifier:
    def __init__(
        self,
        ledger: Ledger,
        prometheus: Prometheus,
        policy: Policy,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.ledger, self.prometheus, self.policy, self.clock = ledger, prometheus, policy, clock

    def step(self, engine: Engine) -> list[int]:
        """Open watches for new requeues, judge the open ones; the ids of decisions recorded."""
        self._open_watches()
        watches = self.ledger.watching()
        if not watches:
            return []
        try:
            progress = self.prometheus.progress_of({w.job for w in watches})
        except PrometheusError as e:
            log.warning("training progress unavailable, recoveries not judged: %s", e)
            return []
        ids: list[int] = []
        for watch in watches:
            try:
                ids += self._judge(watch, progress.get(watch.job, []), engine)
            except Exception:  # one watch must not stop the others, nor the loop
                log.exception("judging the recovery of %s failed", watch.incident)
        return ids

    def _open_watches(self) -> None:
        # Only requeues recent enough to be judged: turning verification on must not judge
        # every requeue the ledger ever recorded.
        since = self.clock() - self.policy.verify.deadline - self.policy.verify.pending_limit
        for row, fault_at, began, requeued_at in self.ledger.unwatched_requeues(since):
            if row.job is None:
                continue
            attempt = attempt_of(row.incident)
            try:
                # How far the failed attempt got: its ranks' last pushes before the requeue
                # ended it (a fault does not always stop training at once; the work done until
                # then is what the successor must redo and pass, and the checkpoint it must
                # resume from). Read as the requeue ended, and as it began for ranks whose
                # successor already replaced what they pushed.
                ranks = _latest(
                    self.prometheus.progress_of({row.job}, at=began).get(row.job, []),
                    self.prometheus.progress_of({row.job}, at=requeued_at).get(row.job, []),
                    attempt,
                )
            except PrometheusError as e:
                log.warning("no progress for job %s yet (%s); trying again", row.job, e)
                continue
            watch = Watch(
                incident=row.incident,
                job=row.job,
                attempt=attempt,
                cause=row.cause,
                fault_at=fault_at,
                requeued_at=requeued_at,
                point=failure_point(ranks, attempt),
                drill=IncidentKey.parse(row.incident).kind == "drill",
            )
            self.ledger.watch(watch)
            log.info("watching %s: successor must pass step %g", row.incident, watch.point.target)

    def _judge(self, watch: Watch, ranks: list[RankProgress], engine: Engine) -> list[int]:
        now = self.clock()
        job = engine.view.jobs.get(watch.job)
        verdict = judge(watch, ranks, job, now, self.policy.verify)
        if verdict.state == "watching":
            return []
        if watch.drill:
            # Judged stricter, and kept from the guards: the interruption was an operator's.
            verdict = drills.judge(verdict)
            decisions = drills.decisions(watch, verdict, job, self.policy, now)
        else:
            # The engine remembers the verdict and decides what a failed one leads to.
            decisions = engine.judged(watch, verdict, job, now)
        ids = self.ledger.conclude(watch.incident, verdict, now, decisions)
        log.info("recovery of %s %s: %s", watch.incident, verdict.state, verdict.reason)
        return ids


def _latest(
    began: list[RankProgress], ended: list[RankProgress], attempt: int
) -> list[RankProgress]:
    """Each rank of the failed attempt as last seen: at the requeue's end, else at its start."""
    ranks = {r.rank: r for r in began if r.attempt == attempt}
    ranks |= {r.rank: r for r in ended if r.attempt == attempt}
    return [ranks[k] for k in sorted(ranks)]
