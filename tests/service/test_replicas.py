"""Several replicas on one ledger: one leads by a lease, every claim is fenced by its term, and
the database refuses a second decision of the same incident, action and revision. On SQLite
and PostgreSQL alike (the `ledger` fixture); each replica has a Ledger of its own, as each
process does."""

from __future__ import annotations

import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from tests.lab.conftest import eventually
from tests.service.test_loop_guards import Clock, alert, view
from webhook.core.cluster import ClusterView
from webhook.core.decisions import Decision
from webhook.core.lifecycle import FAILED, NOTE, PENDING, RUNNING, SUPERSEDED
from webhook.core.policy import load_policy
from webhook.executor.dispatch import Dispatcher
from webhook.executor.fence import Fence
from webhook.ledger.leases import LostLease, Term
from webhook.ledger.store import Ledger, LoopRefused
from webhook.service.leadership import Replica
from webhook.service.loop import LiveLoop

T0 = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


def requeue(incident: str = "7.0", revision: int = 0) -> Decision:
    return Decision(
        at=T0,
        incident=incident,
        job=int(incident.split(".")[0]),
        action="requeue",
        cause="unknown",
        reason="the job died, nobody to blame",
        mode="enforce",
        state=PENDING,
        revision=revision,
    )


def states(ledger: Ledger, incident: str) -> list[str]:
    return [r.state for r in ledger.incident_decisions(incident)]


def test_one_replica_holds_the_lease_and_a_takeover_bumps_the_token(ledger: Ledger) -> None:
    a, b = ledger.leases, Ledger(ledger.url).leases
    assert a.leader() is None
    first = a.hold("a", None, 30)
    assert first == Term("a", 1)
    assert b.hold("b", None, 30) is None  # a's term runs
    assert a.hold("a", first, 30) == first  # renewed: the same term
    leader = b.leader()
    assert leader is not None and leader.holder == "a" and 0 < leader.expires_in <= 30
    a.release(first)  # a clean stop: b need not wait
    second = b.hold("b", None, 30)
    assert second == Term("b", 2)
    assert a.hold("a", first, 30) is None  # a's old term is over, and b's runs


def test_a_term_nobody_renews_expires_on_the_databases_clock(ledger: Ledger) -> None:
    a, b = ledger.leases, Ledger(ledger.url).leases
    first = a.hold("a", None, 0.5)
    assert first is not None and b.hold("b", None, 30) is None
    deadline = time.monotonic() + 30
    while (leader := b.leader()) is not None and leader.expires_in > 0:
        assert time.monotonic() < deadline, "the lease never expired"
        time.sleep(0.05)
    second = b.hold("b", None, 30)
    assert second == Term("b", 2)
    assert a.hold("a", first, 30) is None  # too late to renew


def test_a_leader_whose_term_ended_can_claim_nothing(ledger: Ledger) -> None:
    ledger.term = ledger.leases.hold("a", None, 30)
    [rid] = ledger.record([requeue("7.0")])
    assert ledger.term is not None
    ledger.leases.release(ledger.term)  # a was paused past its lease; b took over
    b = Ledger(ledger.url)
    b.term = b.leases.hold("b", None, 30)
    assert b.term == Term("b", 2)
    # a comes back: its claim of the decision for a run, and a new decision, are refused.
    with pytest.raises(LostLease):
        ledger.add_event(rid, RUNNING, {"by": "executor"}, T0)
    assert states(b, "7.0") == [PENDING]
    with pytest.raises(LostLease):
        ledger.record([requeue("8.0")])
    assert b.incident_decisions("8.0") == []
    # The leader's claim succeeds.
    b.add_event(rid, RUNNING, {"by": "executor"}, T0)
    assert states(b, "7.0") == [RUNNING]


def test_a_stale_leaders_executor_leaves_the_run_to_the_leader(ledger: Ledger) -> None:
    ledger.term = ledger.leases.hold("a", None, 30)
    [rid] = ledger.record([requeue("7.0")])
    assert ledger.term is not None
    ledger.leases.release(ledger.term)
    b = Ledger(ledger.url)
    b.term = b.leases.hold("b", None, 30)
    stale = Dispatcher(ledger)
    try:
        # Run in this thread: the claim is refused, so no playbook starts and nothing is
        # marked failed (a run would need Slurm, and fail, and say so in the ledger).
        stale._run_incident(ledger.rows([rid]))
    finally:
        stale.close()
    found = b.decision(rid)
    assert found is not None
    assert [e.state for e in found[1]] == [PENDING]


def test_the_same_decision_twice_is_refused_by_the_database(ledger: Ledger) -> None:
    ledger.record([requeue("7.0")])
    other = Ledger(ledger.url)  # a second loop that decided the same incident
    with pytest.raises(LostLease, match="already decided"):
        other.record([requeue("7.0")])
    assert states(ledger, "7.0") == [PENDING]
    # A revision supersedes the first decision and is recorded beside it.
    ledger.record([replace(requeue("7.0", revision=1), reason="more evidence")])
    assert states(ledger, "7.0") == [SUPERSEDED, PENDING]
    assert [r.revision for r in ledger.incident_decisions("7.0")] == [0, 1]


def test_two_replicas_decide_once_and_a_follower_takes_over(ledger: Ledger) -> None:
    second = Ledger(ledger.url)
    clock = Clock()
    policy = load_policy({"settle_seconds": 5})

    def replica(led: Ledger, name: str) -> Replica:
        return Replica(
            led, name, lambda fenced: LiveLoop(fenced, policy, view, clock=clock), fence=Fence()
        )

    a, b = replica(ledger, "a"), replica(second, "b")
    assert a.fence is not None and b.fence is not None
    # The same alert delivered to both replicas' webhooks (Alertmanager's HA peers).
    alert(ledger, "GpuXidNodeFault", "gpu_hw", "gpu01", 1, T0)
    alert(second, "GpuXidNodeFault", "gpu_hw", "gpu01", 1, T0)
    clock.now = T0 + timedelta(seconds=10)
    for _ in range(3):
        a.round()
        b.round()
    assert a.term == Term("a", 1) and b.term is None and b.loop is None
    # The leader's playbooks may act until a lease (less its margin) after its last renewal
    # was sent; the follower's until never.
    assert time.time() < a.fence.read() <= time.time() + a.lease_seconds
    assert b.fence.read() == 0.0
    first = [(r.incident, r.action) for r in ledger.decisions()]
    assert first and len(first) == len(set(first))
    # a stops renewing (paused, cut off): once its term is over, b leads and decides what
    # came since, without deciding gpu01's incident again.
    assert a.term is not None
    ledger.leases.release(a.term)
    b.round()
    assert b.term == Term("b", 2) and b.loop is not None
    alert(second, "GpuXidNodeFault", "gpu_hw", "gpu02", 2, clock.now)
    clock.now += timedelta(seconds=10)
    b.round()
    after = [(r.incident, r.action) for r in ledger.decisions()]
    assert len(after) == len(set(after))
    assert set(first) < set(after)
    ours = [d for d in after if d not in first]
    assert ours and all(inc == "2.0" for inc, _ in ours)
    # a comes back still believing it leads: its loop's step records nothing.
    assert a.loop is not None
    with pytest.raises(LostLease):
        a.loop.step()
    assert [(r.incident, r.action) for r in ledger.decisions()] == after
    a.round()  # and its next round follows
    assert a.term is None and a.loop is None
    # Its fence is revoked: a run of its left in flight acts on nothing from now on.
    assert a.fence.read() == 0.0 and b.fence.read() > time.time()
    a.fence.close()
    b.fence.close()


def test_a_second_loop_on_a_sqlite_ledger_is_refused(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'ledger.db'}"
    first, second = Ledger(db), Ledger(db)
    first.lock_for_loop()
    with pytest.raises(LoopRefused, match=r"another slurmedic loop runs on .*ledger\.db"):
        second.lock_for_loop()
    first.unlock_loop()
    second.lock_for_loop()  # free again once the first loop has gone
    second.unlock_loop()


def fast_lease(ledger: Ledger, view_source: Callable[[], ClusterView]) -> Replica:
    """Replica `a` with a 1 s lease, whose loop reads the cluster through `view_source`."""
    policy = load_policy({})
    return Replica(
        ledger,
        "a",
        lambda fenced: LiveLoop(fenced, policy, view_source, refresh_seconds=0),
        lease_seconds=1.0,
    )


def test_a_step_that_outlasts_the_lease_keeps_its_term(ledger: Ledger) -> None:
    """A Slurm that takes its timeouts to answer makes a step longer than the lease: the term
    is renewed meanwhile, so the leader is not replaced for being slow."""
    other = Ledger(ledger.url).leases
    slow = threading.Event()
    tried: list[Term | None] = []

    def view_source() -> ClusterView:
        if slow.is_set():
            # While the step runs, 3 leases long, a follower keeps trying to take over.
            deadline = time.monotonic() + 3.0
            while time.monotonic() < deadline:
                tried.append(other.hold("b", None, 1.0))
                time.sleep(0.1)
        return view()

    a = fast_lease(ledger, view_source)
    try:
        a.round()
        first = a.term
        assert first is not None
        slow.set()
        a.round()
        assert tried and not any(tried)
        slow.clear()
        a.round()
        assert a.term == first
    finally:
        a.halt()


def test_a_step_stuck_past_its_limit_lets_the_lease_lapse(ledger: Ledger) -> None:
    other = Ledger(ledger.url).leases
    stuck = threading.Event()
    taken: list[Term] = []

    def view_source() -> ClusterView:
        if stuck.is_set():
            # Stuck until a follower has taken over (the limit: 4 leases, then no renewal).
            deadline = time.monotonic() + 60
            while not taken and time.monotonic() < deadline:
                if (term := other.hold("b", None, 30)) is not None:
                    taken.append(term)
                time.sleep(0.1)
        return view()

    a = fast_lease(ledger, view_source)
    try:
        a.round()
        assert a.term == Term("a", 1)
        stuck.set()
        a.round()
        assert taken == [Term("b", 2)]
        stuck.clear()
        a.round()
        assert a.term is None and a.loop is None
    finally:
        a.halt()


def test_a_term_s_writes_end_with_it_even_when_its_replica_leads_again(ledger: Ledger) -> None:
    """A run its first term left in flight claims nothing once the same replica leads in a
    second term: each term's loop writes through a ledger fenced by that term."""
    first = ledger.leases.hold("a", None, 30)
    assert first is not None
    old = ledger.fenced(first)
    [rid] = old.record([requeue("7.0")])
    ledger.leases.release(first)
    second = ledger.leases.hold("a", None, 30)
    assert second == Term("a", 2)
    for state in (RUNNING, FAILED):  # the claim, and a drain's failure cascading to it
        with pytest.raises(LostLease):
            old.add_event(rid, state, {"by": "executor"}, T0)
    assert states(ledger, "7.0") == [PENDING]
    ledger.fenced(second).add_event(rid, RUNNING, {"by": "executor"}, T0)
    assert states(ledger, "7.0") == [RUNNING]


def test_a_recovery_is_judged_once_and_only_in_the_current_term(ledger: Ledger) -> None:
    from webhook.core.recovery import FailurePoint, Verdict, Watch

    watch = Watch("7.0", 7, 1, "unknown", T0, T0, FailurePoint(40.0, 30.0, 60.0))
    first = ledger.leases.hold("a", None, 30)
    assert first is not None
    old = ledger.fenced(first)
    old.watch(watch)
    ledger.leases.release(first)
    new = ledger.fenced(Term("b", 2))
    assert ledger.leases.hold("b", None, 30) == Term("b", 2)
    verdict = Verdict("recovered", "passed step 40", 12.0)
    with pytest.raises(LostLease):
        old.conclude("7.0", verdict, T0)  # the old leader, paused while it judged
    new.conclude("7.0", verdict, T0)
    with pytest.raises(LostLease, match="judged already"):
        new.conclude("7.0", Verdict("failed", "again", None), T0)
    assert [(r.state, r.reason) for r in ledger.recoveries()] == [("recovered", "passed step 40")]


def test_the_loop_reads_an_alert_row_committed_below_ids_it_has_read(ledger: Ledger) -> None:
    """On PostgreSQL two replicas' webhooks commit alert ids out of order: a row may appear
    below the highest id the loop has read. It is read all the same, once."""
    from sqlalchemy import delete, select

    from webhook.ledger.schema import AlertRow

    clock = Clock()
    loop = LiveLoop(
        ledger, load_policy({"settle_seconds": 5, "repairs": {"enabled": False}}), view, clock=clock
    )
    alert(ledger, "GpuXidNodeFault", "gpu_hw", "gpu01", 1, T0)
    alert(ledger, "GpuXidNodeFault", "gpu_hw", "gpu02", 2, T0)
    # Take the first row out and put it back after the second was read: it comes back with
    # its own, lower id, as a transaction that committed late.
    with ledger.session.begin() as s:
        row = s.scalars(select(AlertRow).order_by(AlertRow.id)).first()
        assert row is not None
        late = {c.name: getattr(row, c.name) for c in AlertRow.__table__.columns}
        s.execute(delete(AlertRow).where(AlertRow.id == row.id))
    clock.now = T0 + timedelta(seconds=10)
    loop.step()
    assert {r.incident for r in ledger.decisions()} == {"2.0"}
    with ledger.session.begin() as s:
        s.add(AlertRow(**late))
    clock.now += timedelta(seconds=10)
    loop.step()
    loop.step()
    decided = [(r.incident, r.action) for r in ledger.decisions()]
    assert {inc for inc, _ in decided} == {"1.0", "2.0"}
    assert len(decided) == len(set(decided))  # and once


@pytest.fixture
def full_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """This process's temp dir where nothing can be written (a file stands where it should
    be): every playbook run's preparation fails with a real OSError, as on a full disk."""
    blocked = tmp_path / "tmp"
    blocked.write_text("not a directory")
    monkeypatch.setattr(tempfile, "tempdir", str(blocked))
    return blocked


def test_a_run_that_cannot_start_here_is_left_running_for_the_next_leader(
    ledger: Ledger, full_tmp: Path
) -> None:
    ledger.term = ledger.leases.hold("a", None, 30)
    [rid] = ledger.record([requeue("7.0")])
    dispatcher = Dispatcher(ledger)
    try:
        dispatcher._run_incident(ledger.rows([rid]))
    finally:
        dispatcher.close()
    assert dispatcher.unfit is not None and "requeue_job" in dispatcher.unfit
    found = ledger.decision(rid)
    assert found is not None
    # Claimed, never ended: a leader that can run it runs it again (attempt 2), as after a
    # crash; the ledger says why this one could not.
    assert [e.state for e in found[1]] == [PENDING, RUNNING, NOTE]
    assert found[0].state == RUNNING
    assert "this host cannot run it" in found[1][-1].detail["error"]


def test_a_replica_that_cannot_run_playbooks_does_not_lead(ledger: Ledger, full_tmp: Path) -> None:
    policy = load_policy({})
    a = Replica(ledger, "a", lambda fenced: LiveLoop(fenced, policy, view), lease_seconds=30)
    b = Replica(
        Ledger(ledger.url),
        "b",
        lambda fenced: LiveLoop(fenced, policy, view),
        lease_seconds=30,
        fitness=lambda: None,  # another host, with room
    )
    a.round()
    assert a.term is None and a.unfit is not None and "cannot write" in a.unfit
    b.round()
    assert b.term is not None
    # b's disk fills while it leads: it ends its term at once (a need not wait for it to
    # expire) and a, with room again, takes over.
    b.fitness = lambda: "cannot write in /tmp: No space left on device"
    b.round()
    assert b.term is None and b.loop is None
    tempfile.tempdir = None
    a.round()
    assert a.term is not None and a.term.token == 2 and a.unfit is None


def test_a_leader_that_cannot_run_playbooks_lets_its_runs_in_flight_finish_first(
    ledger: Ledger,
) -> None:
    """Released at once, its term would let the next leader run a decision again beside the
    run still in flight: it keeps the term, starts nothing, and ends it once they finish."""
    policy = load_policy({})
    room: list[str | None] = [None]
    a = Replica(
        ledger,
        "a",
        lambda fenced: LiveLoop(fenced, policy, view, dispatcher=Dispatcher(fenced)),
        lease_seconds=30,
        fitness=lambda: room[0],
    )
    a.round()
    assert a.term is not None and a.loop is not None and a.loop.dispatcher is not None
    term, dispatcher = a.term, a.loop.dispatcher
    # A playbook of this term still runs (its worker blocked on an event).
    running = threading.Event()
    dispatcher.busy["7.0"] = dispatcher.pool.submit(running.wait, 30)
    room[0] = "cannot write in /tmp: No space left on device"
    a.round()
    assert a.term == term and dispatcher.abandoned  # kept, renewed; nothing new starts
    assert ledger.leases.leader() is not None
    running.set()
    eventually(lambda: not dispatcher.in_flight(), what="the run finished")
    a.round()
    assert a.term is None and a.loop is None
    b = Ledger(ledger.url)
    assert b.leases.hold("b", None, 30) is not None  # released: b need not wait for expiry
