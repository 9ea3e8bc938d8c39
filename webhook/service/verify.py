"""Verification in the live loop: watch each executed requeue until its successor makes progress
again (or fails to), and act on a failed recovery. The judging is the core's
(`webhook.core.recovery`); this module fetches progress from Prometheus and keeps the ledger."""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import UTC, datetime

from webhook.adapters.prometheus import Prometheus, PrometheusError
from webhook.core.cluster import ClusterView
from webhook.core.decisions import Decision, GuardState, PastAction
from webhook.core.policy import Policy
from webhook.core.recovery import Watch, failure_point, judge, on_failure
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

    def step(self, view: ClusterView, guards: GuardState) -> list[Decision]:
        """Open watches for new requeues, judge the open ones; decisions for failed ones."""
        for row, fault_at, requeued_at in self.ledger.unwatched_requeues():
            if row.job is None:
                continue
            attempt = int(row.incident.rsplit(".", 1)[1])
            try:
                # How far the failed attempt got: its ranks' last pushes when it was requeued
                # (a fault does not always stop training at once; the work done until the
                # requeue is what the successor must redo and pass).
                ranks = self.prometheus.progress(row.job, at=requeued_at)
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
            )
            self.ledger.watch(watch)
            log.info("watching %s: successor must pass step %g", row.incident, watch.point.target)
        decisions: list[Decision] = []
        deadline = self.policy.verify.deadline.total_seconds()
        for watch in self.ledger.watching():
            try:
                ranks = self.prometheus.progress(watch.job)
            except PrometheusError as e:
                log.warning("progress of job %s unavailable: %s", watch.job, e)
                continue
            now = self.clock()
            job = view.jobs.get(watch.job)
            verdict = judge(watch, ranks, job, now, deadline)
            if verdict.state == "watching":
                continue
            self.ledger.conclude(watch.incident, verdict, now)
            log.info("recovery of %s %s: %s", watch.incident, verdict.state, verdict.reason)
            if verdict.state == "failed":
                decisions += on_failure(watch, verdict, job, guards, self.policy, now)
                guards.history.append(
                    PastAction(
                        at=now,
                        action="recovery_failed",
                        job=watch.job,
                        cause=watch.cause,
                        before_checkpoint=verdict.before_checkpoint,
                    )
                )
        return decisions
