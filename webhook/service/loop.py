"""The live loop: feeds the engine from the ledger on the real clock, records its decisions.

It rebuilds its state from the ledger when it starts (the guards' history, the incidents already
decided, the alerts of the last hour), so a restart neither forgets nor decides twice.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from webhook.adapters.slurm import SlurmError
from webhook.core.alerts import wrap
from webhook.core.cluster import ClusterView, eligible
from webhook.core.decisions import Decision
from webhook.core.engine import Engine
from webhook.core.policy import Policy
from webhook.executor.dispatch import Dispatcher
from webhook.ledger.store import Ledger
from webhook.service.verify import Verifier

log = logging.getLogger("slurmedic.loop")
REPLAY_HORIZON = timedelta(hours=1)


class LiveLoop:
    def __init__(
        self,
        ledger: Ledger,
        policy: Policy,
        view_source: Callable[[], ClusterView],
        *,
        refresh_seconds: float = 5.0,
        dispatcher: Dispatcher | None = None,
        verifier: Verifier | None = None,
        verify_seconds: float = 5.0,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.ledger, self.policy, self.view_source, self.clock = ledger, policy, view_source, clock
        self.dispatcher, self.verifier, self.verify_seconds = dispatcher, verifier, verify_seconds
        self.verified_at = 0.0
        self.heartbeat_at = 0.0
        self.jobs_published: dict[str, Any] | None = None
        self.nodes_published: dict[str, Any] | None = None
        self.refresh_seconds = refresh_seconds
        self.last_alert = 0
        self.view_at = 0.0
        now = clock()
        self.started = now
        view = self._view()
        self.engine = Engine.with_history(view or ClusterView(), policy, [])
        self.engine.guards.history = list(
            ledger.history(now - max(policy.retry_budget.window, policy.breaker.window))
        )
        breaker = ledger.setting("breaker") or {}
        self.engine.guards.breaker_open = bool(breaker.get("open"))
        if breaker.get("reset_at"):
            self.engine.guards.breaker_reset_at = datetime.fromisoformat(breaker["reset_at"])
        # What was decided, from which evidence, and what was carried out: a restart neither
        # decides an incident twice nor takes a node's next failure for its last one.
        self.engine.restore(ledger.restore_incidents(since=now - REPLAY_HORIZON))
        # Alerts are judged against the cluster: without a view yet, wait for one.
        self.caught_up = False
        if view is not None and view.nodes:
            self._catch_up()

    def _catch_up(self) -> None:
        """Feed the ledger's alerts of the last hour (older ones are history, not evidence)."""
        while self._feed(since=self.started - REPLAY_HORIZON):
            pass
        self.caught_up = True

    def _view(self) -> ClusterView | None:
        try:
            view = self.view_source()
        except SlurmError as e:  # Slurm unreachable, or output of a release it cannot read
            log.error("cluster view refresh failed: %s; keeping the last one", e)
            return None
        except Exception:  # the adapter's failure must not stop the loop: keep the last view
            log.exception("cluster view refresh failed; keeping the last one")
            return None
        self.view_at = time.monotonic()
        return view

    def _feed(self, since: datetime | None = None) -> int:
        rows = self.ledger.alerts_after(self.last_alert)
        for row_id, received_at, alert in rows:
            self.last_alert = row_id
            if since is None or received_at >= since:
                self.engine.receive(wrap([alert]), received_at)
        return len(rows)

    def step(self) -> list[Decision]:
        if time.monotonic() - self.view_at >= self.refresh_seconds:
            view = self._view()
            if view is not None:
                self.engine.update_view(view, self.clock())
                self._publish_nodes()
        if not self.caught_up:
            if not self.engine.view.nodes:
                return []
            self._catch_up()
        while self._feed():
            pass
        self._sync_breaker()
        # A decision carried out meanwhile is not revised: what arrives now is its consequence.
        self.engine.close(self.ledger.carried_out(self.engine.revisable()))
        was_open = self.engine.guards.breaker_open
        decisions = self.engine.tick(self.clock())
        if self.engine.guards.breaker_open and not was_open:
            # It never closes by itself: only `slurmedic breaker reset` does.
            self.ledger.set_setting(
                "breaker", {"open": True, "opened_at": self.clock().isoformat()}, self.clock()
            )
        if decisions:
            keys = dict.fromkeys(d.incident for d in decisions)
            ids = self.ledger.record(decisions, [self.engine.incidents[k] for k in keys])
            if self.dispatcher is not None:
                # Monitor decisions get their dry run now; enforce ones are picked up below.
                self.dispatcher.dispatch(
                    [r for r in self.ledger.rows(ids) if r.state == "recorded"]
                )
            for d in decisions:
                log.info("%s %s %s %s: %s", d.incident, d.action, d.state, d.cause, d.reason)
        verified = self._verify()
        if self.dispatcher is not None:
            if verified:
                rows = self.ledger.rows(verified)
                self.dispatcher.dispatch([r for r in rows if r.state == "recorded"])
            self.dispatcher.dispatch(self.dispatcher.pending())
        self._publish()
        return decisions

    def _verify(self) -> list[int]:
        """Judge recoveries; the ids of decisions recorded. Never fails the step: the engine's
        decisions of this step are already recorded, and the verifier tries again next time."""
        if self.verifier is None or time.monotonic() - self.verified_at < self.verify_seconds:
            return []
        self.verified_at = time.monotonic()
        try:
            return self.verifier.step(self.engine.view, self.engine.guards)
        except Exception:
            log.exception("verification failed; trying again next round")
            return []

    def _publish(self) -> None:
        """What /metrics reports about the loop (it runs in another process): its heartbeat
        and the jobs it sees, in the ledger's settings."""
        if time.monotonic() - self.heartbeat_at < 5:
            return
        self.heartbeat_at = time.monotonic()
        now = self.clock()
        self.ledger.set_setting("loop", {"at": now.timestamp()}, now)
        # Jobs that count for goodput: eligible now, or restarted (their wait is a failure's).
        # Jobs still queued for their first start are left out (they would be most series).
        jobs = {
            str(j.id): {"partition": j.partition, "restarts": j.restarts, "eligible": eligible(j)}
            for j in self.engine.view.jobs.values()
            if eligible(j) or j.restarts > 0
        }
        if jobs != self.jobs_published:
            self.ledger.set_setting("jobs", jobs, now)
            self.jobs_published = jobs

    def _publish_nodes(self) -> None:
        """Node states as Slurm reports them, as soon as a refresh changes one: the node rules'
        source when a site runs no Slurm exporter (Slurm's own metrics count node states per
        cluster only), and a node that stops responding must reach them before Slurm marks it
        DOWN and requeues its job by itself (SlurmdTimeout)."""
        nodes = {
            n.name: {"status": n.status or n.state, "partitions": list(n.partitions)}
            for n in self.engine.view.nodes.values()
        }
        if nodes != self.nodes_published:
            self.ledger.set_setting("nodes", nodes, self.clock())
            self.nodes_published = nodes

    def _sync_breaker(self) -> None:
        """Pick up a human's reset (`slurmedic breaker reset` writes it to the ledger)."""
        breaker = self.ledger.setting("breaker") or {}
        reset_at = breaker.get("reset_at")
        if reset_at and not breaker.get("open") and self.engine.guards.breaker_open:
            self.engine.guards.reset_breaker(datetime.fromisoformat(reset_at))

    def run(self, stop: threading.Event, tick_seconds: float = 1.0) -> None:
        while not stop.is_set():
            try:
                self.step()
            except Exception:
                log.exception("loop step failed; retrying")
            stop.wait(self.pause(tick_seconds))

    def pause(self, tick_seconds: float) -> float:
        """Until the next step: a tick, or less when an incident's settle window ends sooner
        (its decision is not left waiting for the next tick)."""
        due = self.engine.next_due()
        if due is None:
            return tick_seconds
        return min(tick_seconds, max(0.01, (due - self.clock()).total_seconds()))
