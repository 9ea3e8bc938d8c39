"""The guards' history index answers what a scan of the whole history answers."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

from webhook.core.decisions import GuardState, PastAction

T0 = datetime(2026, 12, 1, tzinfo=UTC)
NODES = [f"gpu{i:02d}" for i in range(12)]


def scan_drained(state: GuardState, since: datetime) -> set[str]:
    if state.breaker_reset_at is not None:
        since = max(since, state.breaker_reset_at)
    return {n for h in state.history if h.action == "drain" and h.at >= since for n in h.nodes}


def scan_requeues(state: GuardState, job: int, since: datetime) -> int:
    mine = [h for h in state.history if h.job == job]
    last = max((h.at for h in mine if h.action == "requeue"), default=None)
    return sum(
        1
        for h in mine
        if h.at >= since
        and (
            h.action == "requeue"
            or (h.action == "recovery_failed" and (last is None or h.at >= last))
        )
    )


def test_a_failed_recovery_and_the_requeue_after_it_spend_the_budget_once() -> None:
    state = GuardState()
    state.history.append(PastAction(at=T0, action="requeue", job=7))
    state.history.append(PastAction(at=T0 + timedelta(minutes=9), action="recovery_failed", job=7))
    assert state.requeues(7, T0) == 2  # the successor ended: not requeued (yet)
    state.history.append(PastAction(at=T0 + timedelta(minutes=10), action="requeue", job=7))
    assert state.requeues(7, T0) == 2  # requeued for its failure: that requeue counts it


def test_a_failed_recovery_is_counted_by_the_requeue_of_the_attempt_it_judged() -> None:
    state = GuardState()
    state.history.append(PastAction(at=T0, action="requeue", job=7, incident="7.0"))
    failed = PastAction(
        at=T0 + timedelta(minutes=9), action="recovery_failed", job=7, incident="verify:7.0"
    )
    state.history.append(failed)
    assert state.requeues(7, T0) == 2
    assert state.requeues(7, T0, deciding="7.1") == 1  # the decision for 7.1 counts it
    assert state.requeues(7, T0, deciding="7.2") == 2
    # Requeued again, not for the attempt it judged: 7.1's failure still spends its own.
    state.history.append(
        PastAction(at=T0 + timedelta(hours=1), action="requeue", job=7, incident="7.2")
    )
    assert state.requeues(7, T0) == 3
    state.history.append(
        PastAction(at=T0 + timedelta(minutes=10), action="requeue", job=7, incident="7.1")
    )
    assert state.requeues(7, T0) == 3


def test_the_index_agrees_with_a_scan_through_appends_replacements_and_a_clock_that_jumps() -> None:
    rng = random.Random(7)
    state = GuardState()
    now = T0
    for step in range(3000):
        now += timedelta(seconds=rng.choice([1, 5, 30, 300]))
        # now and then an action recorded late (the ledger's, or a restored one)
        at = now - timedelta(seconds=rng.choice([0, 0, 0, 4000]))
        kind = rng.random()
        if kind < 0.45:
            nodes = tuple(rng.sample(NODES, rng.randint(1, 3)))
            state.history.append(PastAction(at=at, action="drain", nodes=nodes))
        elif kind < 0.8:
            action = rng.choice(["requeue", "recovery_failed", "recovered"])
            state.history.append(PastAction(at=at, action=action, job=rng.randint(1, 5)))
        elif kind < 0.83:  # the engine prunes, the loop restores: a new list
            cutoff = now - timedelta(hours=rng.choice([1, 2]))
            state.history = [h for h in state.history if h.at >= cutoff]
        elif kind < 0.84:
            state.reset_breaker(now - timedelta(minutes=rng.randint(0, 90)))
        since = now - timedelta(seconds=rng.choice([600, 3600, 3600, 7200]))
        assert set(state.drained(since)) == scan_drained(state, since), step
        job = rng.randint(1, 5)
        assert state.requeues(job, since) == scan_requeues(state, job, since), step


def test_a_revision_adopted_brings_its_own_index() -> None:
    state = GuardState()
    # Counted, not run: a revision replaces it.
    state.history.append(
        PastAction(at=T0, action="drain", nodes=("gpu01",), incident="7.0", held=True)
    )
    state.history.append(PastAction(at=T0, action="drain", nodes=("gpu02",), incident="8.0"))
    assert set(state.drained(T0)) == {"gpu01", "gpu02"}
    trial = state.without("7.0")
    assert set(trial.drained(T0)) == {"gpu02"}
    state.adopt(trial)
    assert set(state.drained(T0)) == {"gpu02"}
    # A drain that ran stays: a revision cannot undo it (degraded hardware's, its job left
    # running and watched).
    assert set(state.without("8.0").drained(T0)) == {"gpu02"}
