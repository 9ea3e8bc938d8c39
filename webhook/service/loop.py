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
from itertools import groupby

from webhook.adapters.slurm import SlurmError
from webhook.core import drills, durations, repairs
from webhook.core.alerts import Alert, Payload, wrap
from webhook.core.cluster import ClusterView, eligible
from webhook.core.decisions import DRAIN_CAUSES, Decision
from webhook.core.engine import Engine, Snapshot, evidence_key
from webhook.core.failures import learned_rate
from webhook.core.lifecycle import (
    AWAITING_APPROVAL,
    DRY_RUN_FIRST,
    EXPIRED,
    RECORDED,
    REFUSED,
    WAITING,
    IllegalTransition,
)
from webhook.core.policy import Action, Cause, Mode, Policy
from webhook.executor.dispatch import Dispatcher
from webhook.ledger.settings import (
    Breaker,
    CorruptSetting,
    Heartbeat,
    Jobs,
    JobSeen,
    Modes,
    Nodes,
    NodeSeen,
    Switch,
    Unmatched,
    ViewSeen,
)
from webhook.ledger.store import Ledger
from webhook.service.notify import Notifier
from webhook.service.verify import Verifier

log = logging.getLogger("slurmedic.loop")
REPLAY_HORIZON = timedelta(hours=1)
# The cluster's failure rate is learned from the ledger's last quarter, and learned again
# this often (failures.learned_rate).
LEARN_OVER = timedelta(days=90)
LEARN_EVERY_SECONDS = 6 * 3600
LATE_IDS = 1000  # how far back the loop looks again for alert rows committed late
# Alerts read from the ledger at a time. What the loop keeps of each is small (the engine's
# `seen`); a read's rows and their models are not, and the allocator keeps the arenas of the
# largest read for the rest of the process: 22,000 alerts read 5,000 at a time left the loop
# 20 MB larger, 1,000 at a time 12 MB, for the same CPU (docs/peer-eda.md).
READ_BATCH = 1000
SLURM_ERROR_EVERY = 300.0  # seconds between log lines of a Slurm error that lasts
# How far back the repairs look for drains they have not taken up: a loop down for a while
# still repairs what was drained meanwhile; older drains are left to people.
REPAIR_LOOKBACK = timedelta(days=1)


def monitor_forced(ledger: Ledger) -> bool:
    """Whether the global switch holds every action in monitor mode; a corrupt switch does too
    (what the human wanted is unknown, so nothing is carried out until it is mended)."""
    try:
        return ledger.setting(Switch).monitor
    except CorruptSetting as e:
        log.error("%s; acting as if it said monitor", e)
        return True


def modes_of(policy: Policy) -> Modes:
    return Modes(
        mode=policy.mode,
        actions={str(a): str(m) for a, m in policy.actions.items()},
        partitions={
            name: {
                **({"*": p.mode} if p.mode else {}),
                **{str(a): str(m) for a, m in p.actions.items()},
            }
            for name, p in sorted(policy.partitions.items())
        },
        causes=_causes(policy.causes),
        partition_causes={
            name: _causes(p.causes) for name, p in sorted(policy.partitions.items()) if p.causes
        },
        repeats_window_seconds=policy.repeats.window.total_seconds(),
        repeats_count=policy.repeats.count,
        repeats_apart_seconds=policy.repeats.apart.total_seconds(),
    )


def _causes(causes: dict[Cause, dict[Action, Mode]]) -> dict[str, dict[str, str]]:
    return {str(c): {str(a): str(m) for a, m in by.items()} for c, by in causes.items()}


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
        notifier: Notifier | None = None,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.ledger, self.policy, self.view_source, self.clock = ledger, policy, view_source, clock
        self.notifier = notifier
        self.dispatcher, self.verifier, self.verify_seconds = dispatcher, verifier, verify_seconds
        self.verified_at = 0.0
        self.repaired_at = 0.0
        self.heartbeat_at = 0.0
        # Set once the process is told to stop: nothing new is decided or started after it.
        self.stopping = threading.Event()
        self.jobs_published: Jobs | None = None
        self.nodes_published: Nodes | None = None
        self.refresh_seconds = refresh_seconds
        self.last_alert = 0
        self.fed: set[int] = set()  # ids fed within LATE_IDS of last_alert
        self.told: set[str] = set()  # hosts logged as no node of the cluster
        self.view_at = 0.0  # monotonic: the last try
        self.view_wall: datetime | None = None  # the last success, on the clock
        self.slurm_error, self.slurm_error_told = "", 0.0
        self.ticked_at = 0.0  # when the last step completed (Unix seconds; 0: never)
        now = clock()
        self.started = now
        view = self._view()
        self.engine = Engine(view=view or ClusterView(), policy=policy)
        since = now - max(policy.retry_budget.window, policy.breaker.window)
        # Counted as if they will run; what becomes of them is settled each step (_settle).
        # Read before the history: a decision moved by a person while the history streams in
        # is then a move the next step sees.
        self.watching: dict[int, tuple[tuple[str, str, datetime], str]] = {}
        waiting = ledger.watched()
        known = set(view.jobs) if view else None
        breaker = ledger.setting(Breaker)
        # The engine's memory as the ledger holds it: what was decided, from which evidence,
        # what was carried out (a restart neither decides an incident twice nor takes a node's
        # next failure for its last one), the guards' history and the exclusions Slurm still
        # keeps, the breaker. Before the ledger's first notification (or this start, on a new
        # one) nothing is known. The engine forgets what is older than the retention; so does
        # a restart.
        self.engine.restore(
            Snapshot(
                incidents=ledger.restore_incidents(since=now - policy.retention_age),
                history=list(ledger.history(since)),
                exclusions=list(ledger.exclusion_history(since, known)),
                drains=ledger.drain_history(now - policy.repeats.window, since),
                failures=ledger.failures(now - policy.repeats.window),
                since=since,
                jobs=known,
                memory_since=ledger.record_begins() or now,
                breaker_open=breaker.open,
                breaker_reset_at=breaker.reset_at,
            )
        )
        self._watch(waiting)
        self.learned_at = -float("inf")
        self._learn()
        ledger.put(modes_of(policy), now)  # what the console shows
        # Alerts are judged against the cluster: without a view yet, wait for one.
        self.caught_up = False
        if view is not None and view.nodes:
            self._catch_up()

    def _learn(self) -> None:
        """The cluster's own failure rate, from the ledger's record of its nodes' own faults
        (the last LEARN_OVER of it), once it holds enough: bursts are judged against it, and
        the retry budget scales with it, unless the policy file sets one."""
        nodes = len(self.engine.view.nodes)
        if not nodes:
            return  # no view yet: the next step tries again
        self.learned_at = time.monotonic()
        begins = self.ledger.record_begins()
        if begins is None:
            return
        now = self.clock()
        since = max(begins, now - LEARN_OVER)
        rate = learned_rate(self.ledger.own_faults(since), nodes, now - since)
        if rate is not None and rate != self.engine.policy.failure_rate:
            log.info("the cluster's failure rate, from the ledger: %.2f per 1,000 node-days", rate)
        self.engine.learn_failure_rate(rate)

    def _catch_up(self) -> None:
        """Feed the ledger's alerts of the last hour (older ones are history, not evidence),
        and the older ones a restored incident was decided on: they go back to it, so that a
        revision judges its new evidence with the old (a rank's failure an hour after a
        switch's storm is not an application's failure alone); the rest within the retention
        only to rule 5's count of failing nodes (whether a storm grew is judged as it would
        have been without the restart)."""
        while self._feed(since=self.started - REPLAY_HORIZON):
            pass
        self.caught_up = True
        # Counted when they first came (before the restart): only said again here.
        self._report_unmatched(count=False)

    def _view(self) -> ClusterView | None:
        self.view_at = time.monotonic()  # tried: the next try a refresh interval from now
        try:
            view = self.view_source()
        except SlurmError as e:  # Slurm unreachable, or output of a release it cannot read
            self._slurm_failed(str(e))
            return None
        except Exception as e:  # the adapter's failure must not stop the loop: keep the last
            log.exception("cluster view refresh failed; keeping the last one")
            self._slurm_failed(f"{type(e).__name__}: {e}", logged=True)
            return None
        if self.slurm_error:
            log.info("Slurm answers again: the cluster view is current")
        self.slurm_error, self.view_wall = "", self.clock()
        return view

    def _slurm_failed(self, error: str, *, logged: bool = False) -> None:
        """Said when it starts, when what Slurm says changes, and every SLURM_ERROR_EVERY while
        it lasts (not at every refresh); /readyz and /metrics show it meanwhile."""
        now = time.monotonic()
        due = error != self.slurm_error or now >= self.slurm_error_told + SLURM_ERROR_EVERY
        if due and not logged:
            age = "never read" if self.view_wall is None else f"read {self.view_wall:%H:%M:%S}"
            log.error("reading the cluster from Slurm failed: %s (the view kept: %s)", error, age)
            self.slurm_error_told = now
        self.slurm_error = error

    def _feed(self, since: datetime | None = None) -> int:
        # Ids are read again a window back (LATE_IDS): with several replicas writing, a row
        # can commit after a higher id was read. Those fed already are skipped.
        low = max(0, self.last_alert - LATE_IDS)
        rows = self.ledger.alerts_after(low, READ_BATCH, skip=frozenset(self.fed))
        # Consecutive alerts received together (one notification's) go to the engine as one
        # payload, as they came: it takes a payload's alerts one by one, in order. A group is
        # counted fed as it goes to the engine: should the engine fail on it, the groups after
        # it are read again at the next step, and the loop does not stick on the one it failed.
        for (at, how), group in groupby(rows, key=lambda r: (r[1], self._how(r[2], r[1], since))):
            batch = list(group)
            for row_id, _, _ in batch:
                self.last_alert = max(self.last_alert, row_id)
                self.fed.add(row_id)
            if how is not None:
                how(wrap([alert for _, _, alert in batch]), at)
        if rows:
            self.fed = {i for i in self.fed if i > self.last_alert - LATE_IDS}
        return len(rows)

    def _how(
        self, alert: Alert, received_at: datetime, since: datetime | None
    ) -> Callable[[Payload, datetime], object] | None:
        """What the engine makes of an alert: evidence, history for rule 5, or nothing (older
        than the retention)."""
        if since is None or received_at >= since or self._decided_on(alert):
            return self.engine.receive
        if received_at >= self.started - self.engine.policy.retention_age:
            return self.engine.remember
        return None

    def _decided_on(self, alert: Alert) -> bool:
        """Whether a restored incident was decided on this alert."""
        return evidence_key(alert.fingerprint, alert.startsAt) in self.engine.decided_on

    def step(self) -> list[Decision]:
        if time.monotonic() - self.view_at >= self.refresh_seconds:
            view = self._view()
            if view is not None:
                self.engine.update_view(view, self.clock())
                self._publish_nodes()
                self._in_repair()
        if time.monotonic() - self.learned_at >= LEARN_EVERY_SECONDS:
            self._learn()
        if not self.caught_up:
            if not self.engine.view.nodes:
                self._beat()  # no step without a view: /readyz and /metrics say why
                return []
            self._catch_up()
        while self._feed():
            pass
        self._report_unmatched()
        if self.stopping.is_set():  # told to stop while it read: what it read waits in the ledger
            return []
        self._sync_breaker()
        self._sync_switch()
        self._expire_approvals()
        self._settle()
        # A decision carried out meanwhile is not revised: what arrives now is its consequence.
        self.engine.close(self.ledger.carried_out(self.engine.revisable()))
        was_open = self.engine.breaker_open
        decisions = self.engine.tick(self.clock())
        if self.engine.breaker_open and not was_open:
            # It never closes by itself: only `slurmedic breaker reset` does.
            now = self.clock()
            self.ledger.put(Breaker(open=True, opened_at=now), now)
        keys = dict.fromkeys(d.incident for d in decisions)
        # Incidents whose decisions stayed but whose evidence or rule 5's judgement changed:
        # kept too, in the same transaction, so that a restart restores what the engine knew.
        rejudged = [i for i in self.engine.take_rejudged() if i.key not in keys]
        failures = self.engine.take_failures()
        if decisions or rejudged or failures:
            incidents = [self.engine.incidents[k] for k in keys] + rejudged
            ids = self.ledger.record(decisions, incidents, failures=failures)
            # Watched from now (a human may reject one before the next step); an enforce
            # decision is held until its run.
            self._watch(self.ledger.watched(ids))
            if self.dispatcher is not None:
                # Monitor and approve decisions get their dry run now; enforce ones, and
                # approved ones, are picked up below.
                rows = self.ledger.rows(ids)
                self.dispatcher.dispatch([r for r in rows if r.state in DRY_RUN_FIRST])
            for d in decisions:
                log.info("%s %s %s %s: %s", d.incident, d.action, d.state, d.cause, d.reason)
        verified = self._verify()
        drilled = self._drills()
        repaired = self._repairs()
        if self.dispatcher is not None and not self.stopping.is_set():
            if verified:
                rows = self.ledger.rows(verified)
                self.dispatcher.dispatch([r for r in rows if r.state == RECORDED])
            if drilled or repaired:
                # A drill's or repair's step in monitor mode is its dry run; in approve mode,
                # what the approver reads.
                rows = self.ledger.rows(drilled + repaired)
                self.dispatcher.dispatch([r for r in rows if r.state in DRY_RUN_FIRST])
            self.dispatcher.dispatch(self.dispatcher.pending())
        self._notify()
        self._publish()
        return decisions

    def _report_unmatched(self, *, count: bool = True) -> None:
        """Alerts that named no node of the cluster are never acted on, and never dropped in
        silence: each host is logged once (by this process), and counted in the ledger, for
        /metrics and the console."""
        seen = self.engine.take_unmatched()
        for u in seen:
            if u.host in self.told:
                continue
            if len(self.told) >= 10_000:
                self.told.clear()  # a bound, not a promise: the ledger's count is the record
            self.told.add(u.host)
            log.warning(
                "%s names %s, which is no node of the cluster: not acted on%s",
                u.alertname or "an alert",
                u.host,
                f" ({u.hint})" if u.hint else " (see node_names in docs/operations.md)",
            )
        if not seen or not count:
            return
        try:
            known = self.ledger.setting(Unmatched)
        except CorruptSetting as e:
            log.error("%s; counting anew", e)
            known = Unmatched()
        self.ledger.put(known.add(seen), self.clock())

    def _notify(self) -> None:
        """Post the notices for people; never fails the step (the next round posts again)."""
        if self.notifier is None:
            return
        try:
            self.notifier.step(self.engine.view.jobs)  # whose owners the notices name
        except Exception:
            log.exception("posting notices failed; trying again next round")

    def _verify(self) -> list[int]:
        """Judge recoveries; the ids of decisions recorded. Never fails the step: the engine's
        decisions of this step are already recorded, and the verifier tries again next time."""
        if self.verifier is None or time.monotonic() - self.verified_at < self.verify_seconds:
            return []
        self.verified_at = time.monotonic()
        try:
            return self.verifier.step(self.engine)
        except Exception:
            log.exception("verification failed; trying again next round")
            return []

    def _publish(self) -> None:
        """What /metrics reports about the loop (it runs in another process): its heartbeat
        and the jobs it sees, in the ledger's settings."""
        self.ticked_at = self.clock().timestamp()
        if not self._beat():
            return
        now = self.clock()
        # A job a drill interrupts is not eligible meanwhile: drills stay out of goodput.
        verify = self.policy.verify
        drilled = self.ledger.drills.in_flight(now - verify.deadline - verify.pending_limit)
        # Jobs that count for goodput: eligible now, or restarted (their wait is a failure's).
        # Jobs still queued for their first start are left out (they would be most series).
        jobs = Jobs(
            {
                str(j.id): JobSeen(
                    partition=j.partition,
                    restarts=j.restarts,
                    eligible=eligible(j) and j.id not in drilled,
                )
                for j in self.engine.view.jobs.values()
                if eligible(j) or j.restarts > 0
            }
        )
        if jobs != self.jobs_published:
            self.ledger.put(jobs, now)
            self.jobs_published = jobs

    def _beat(self) -> bool:
        """The loop's heartbeat, the view's age and Slurm's last error, for /readyz and
        /metrics (every few seconds); whether it was written now."""
        if time.monotonic() - self.heartbeat_at < Heartbeat.EVERY:
            return False
        self.heartbeat_at = time.monotonic()
        now = self.clock()
        view_at = self.view_wall.timestamp() if self.view_wall is not None else 0.0
        self.ledger.put(Heartbeat(at=self.ticked_at), now)
        self.ledger.put(ViewSeen(at=view_at, slurm_error=self.slurm_error[:500]), now)
        return True

    def _publish_nodes(self) -> None:
        """Node states as Slurm reports them, as soon as a refresh changes one: the node rules'
        source when a site runs no Slurm exporter (Slurm's own metrics count node states per
        cluster only), and a node that stops responding must reach them before Slurm marks it
        DOWN and requeues its job by itself (SlurmdTimeout)."""
        nodes = Nodes(
            {
                n.name: NodeSeen(status=n.status or n.state, partitions=list(n.partitions))
                for n in self.engine.view.nodes.values()
            }
        )
        if nodes != self.nodes_published:
            self.ledger.put(nodes, self.clock())
            self.nodes_published = nodes

    def _sync_switch(self) -> None:
        """The global switch, one meaning in every mode: while it is on, nothing reaches Slurm
        and nothing waits for a human. New decisions are records (guard global_switch); those
        waiting for approval become records too, each saying so (a human must not approve
        what would only be dry-run). Switching back changes nothing already decided."""
        forced = monitor_forced(self.ledger)
        self.engine.switch(forced)
        if not forced:
            return
        for row in self.ledger.in_state(AWAITING_APPROVAL):
            note = {"by": "switch", "note": "global switch to monitor: recorded, not carried out"}
            try:
                self.ledger.add_event(row.id, RECORDED, note, self.clock())
            except IllegalTransition:
                continue  # a human or the executor moved it first
            log.info("decision %s: global switch to monitor, recorded", row.id)

    def _drills(self) -> list[int]:
        """Operators' drill requests that are due, planned on this loop's view of the cluster
        (webhook/core/drills.py): each one's decision recorded, or why it is refused."""
        now = self.clock()
        ids: list[int] = []
        for request in self.ledger.drills.due(now):
            decision: Decision | None
            try:
                decision = drills.plan(request, self.engine.view, self.engine.policy, now)
                reason = decision.reason
            except drills.Refused as e:
                decision, reason = None, str(e)
            ids += self.ledger.plan_drill(request, decision, reason)
            log.info("drill %s of job %s: %s", request.id, request.job, reason)
        return ids

    def _repairs(self) -> list[int]:
        """The repairs of nodes slurmedic drained (webhook/core/repairs.py): new drains taken up,
        each repair under way moved on the cluster as Slurm shows it now, once a refresh. The
        ids of the decisions recorded. Never fails the step: what a repair did not record now
        it records next time."""
        if not self.policy.repairs.enabled or self.stopping.is_set():
            return []
        if time.monotonic() - self.repaired_at < self.refresh_seconds:
            return []
        self.repaired_at = time.monotonic()
        try:
            return self._repair()
        except Exception:
            log.exception("repairs failed; trying again next round")
            return []

    def _repair(self) -> list[int]:
        now, policy, book = self.clock(), self.policy, self.ledger.repairs
        ids: list[int] = []
        under_way = {r.node: r for r in book.under_way()}
        for drained in book.new_drains(now - REPAIR_LOOKBACK, frozenset(DRAIN_CAUSES)):
            seq = book.last_seq(drained.node) + 1
            current = under_way.get(drained.node)
            if current is not None and repairs.covers(current, drained, policy):
                ids += self.ledger.save_repair(*repairs.folded(drained, seq, current, now), now)
                continue
            if current is not None:
                ids += self.ledger.save_repair(current, repairs.failed_on_probation(current), now)
            earlier = book.of_node(drained.node, now - policy.repeats.window)
            repair, move = repairs.begin(drained, seq, earlier, policy, now)
            ids += self.ledger.save_repair(repair, move, now)
            said = move.reason if move else repair.why
            log.info("repair %s of %s (%s): %s", repair.key, repair.node, repair.plan, said)
        found = book.under_way()
        busy = sum(r.state in repairs.IN_REPAIR for r in found)
        for repair in found:
            node = self.engine.view.nodes.get(repair.node)
            mine = repair.state in repairs.IN_REPAIR
            move = repairs.advance(repair, node, policy, now, busy - mine)
            if move is None:
                continue
            ids += self.ledger.save_repair(repair, move, now)
            busy += (move.state in repairs.IN_REPAIR) - mine
            log.info("repair %s: %s -> %s: %s", repair.key, repair.state, move.state, move.reason)
        if ids:
            self._in_repair()  # a step just decided opens its window before the next alert
        return ids

    def _in_repair(self) -> None:
        """Tell the engine when slurmedic's repairs had nodes out of service (a rebooted node
        alerts down: not a new failure), before it routes what it reads next. Read with each
        view: a resume's run ends in the executor, which closes its window."""
        if not self.policy.repairs.enabled:
            return
        windows: dict[str, list[repairs.Window]] = {}
        for repair, _ in self.ledger.repairs.listed(self.clock() - REPAIR_LOOKBACK):
            if (window := repairs.out_of_service(repair)) is not None:
                windows.setdefault(repair.node, []).append(window)
        self.engine.in_repair(windows)

    def _expire_approvals(self) -> None:
        """Decisions nobody approved within the policy's approval_expires are not carried out."""
        limit = self.policy.approval_expires
        now = self.clock()
        for row in self.ledger.in_state(AWAITING_APPROVAL):
            at = row.at if row.at.tzinfo else row.at.replace(tzinfo=UTC)
            if now - at < limit:
                continue
            note = {
                "by": "loop",
                "note": f"not approved within {durations.format(limit)}: expired, not carried out",
            }
            try:
                self.ledger.add_event(row.id, EXPIRED, note, now)
            except IllegalTransition:
                continue  # approved or rejected meanwhile
            log.info("decision %s expired unapproved", row.id)

    def _settle(self) -> None:
        """The guards counted a decision as if it would run (a drain against the breaker, a
        requeue against the job's budget) from when it was decided. What becomes of it is
        decided by a person in another process (the console, `slurmedic approve` or `reject`),
        by the expiry, or by its run: one a person rejected, or nobody approved in time, never
        runs, and the guards stop counting it; a drain is `held` until it ran."""
        if not self.watching:
            return
        found = self.ledger.watched(list(self.watching))
        for (incident, action, _), state in found.values():
            if state in REFUSED:
                log.info("%s %s was not carried out: no longer counted", incident, action)
        self._watch(found)

    def _watch(self, found: dict[int, tuple[tuple[str, str, datetime], str]]) -> None:
        """The guards told each decision's state now (`held`, `undone`); those not carried out
        yet watched further."""
        moved = {i: v for i, v in found.items() if self.watching.get(i) != v}
        self.engine.settle(dict(moved.values()))
        for i, (key, state) in moved.items():
            if state in WAITING:
                self.watching[i] = (key, state)
            else:
                self.watching.pop(i, None)

    def _sync_breaker(self) -> None:
        """Pick up a human's reset (`slurmedic breaker reset` writes it to the ledger)."""
        breaker = self.ledger.setting(Breaker)
        if breaker.reset_at and not breaker.open and self.engine.breaker_open:
            self.engine.reset_breaker(breaker.reset_at)

    def run(self, stop: threading.Event, tick_seconds: float = 1.0) -> None:
        self.stopping = stop
        while not stop.is_set():
            try:
                self.step()
            except CorruptSetting as e:  # a human can mend it: say which, without a traceback
                log.error("loop step failed: %s", e)
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
