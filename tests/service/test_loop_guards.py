"""The live loop with its ledger (no Slurm): the breaker stays open across restarts until a
human resets it with `slurmedic breaker reset`, and then counts afresh."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import yaml

from webhook.core.alerts import Payload
from webhook.core.cluster import ClusterView, Job, Node
from webhook.core.decisions import PastAction
from webhook.core.policy import Policy, load_policy
from webhook.ledger.settings import Breaker
from webhook.ledger.store import Ledger
from webhook.service.loop import LiveLoop

T0 = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


def view() -> ClusterView:
    v = ClusterView()
    for i in range(1, 9):
        v.nodes[f"gpu0{i}"] = Node(f"gpu0{i}", "train")
    for j, n in ((1, "gpu01"), (2, "gpu02"), (3, "gpu03")):
        v.set_job(Job(id=j, nodes=(n,), partition="train", started=T0 - timedelta(hours=1)))
    return v


def alert(ledger: Ledger, name: str, signal: str, node: str, job: int, at: datetime) -> None:
    """Store one firing alert from Alertmanager, as the webhook would."""
    labels = {"alertname": name, "signal": signal, "node": node, "slurm_job_id": str(job)}
    raw = {
        "status": "firing",
        "alerts": [{"status": "firing", "startsAt": at.isoformat(), "labels": labels}],
    }
    ledger.store(raw, Payload.model_validate(raw), at)


def xid(ledger: Ledger, node: str, job: int, at: datetime) -> None:
    alert(ledger, "GpuXidNodeFault", "gpu_hw", node, job, at)


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        return self.now


def test_breaker_opens_survives_a_restart_and_closes_only_when_reset(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'ledger.db'}"
    ledger = Ledger(db)
    # 8 nodes at 10 %: one drain per hour.
    policy = load_policy({"settle_seconds": 5, "breaker": {"max_fraction": 0.1}})
    clock = Clock()
    loop = LiveLoop(ledger, policy, view, clock=clock)

    xid(ledger, "gpu01", 1, T0)
    clock.now = T0 + timedelta(seconds=10)
    first = loop.step()
    assert [(d.action, d.nodes, d.guard) for d in first if d.action == "drain"] == [
        ("drain", ("gpu01",), None)
    ]

    xid(ledger, "gpu02", 2, clock.now)
    clock.now += timedelta(seconds=10)
    second = loop.step()
    assert ("escalate", "circuit_breaker_open") in [(d.action, d.guard) for d in second]
    assert not [d for d in second if d.action == "drain"]
    assert ledger.setting(Breaker).open is True

    # A restart does not close it. (Past the shared-cause window: three GPUs within it on
    # eight nodes would be a burst, one shared cause.)
    loop = LiveLoop(ledger, policy, view, clock=clock)
    clock.now += timedelta(minutes=6)
    xid(ledger, "gpu03", 3, clock.now)
    clock.now += timedelta(seconds=10)
    third = loop.step()
    assert ("escalate", "circuit_breaker_open") in [
        (d.action, d.guard) for d in third if d.job == 3
    ]

    # A human resets it (the real CLI), and the loop picks that up on its next step.
    config = tmp_path / "config.yml"
    config.write_text(yaml.safe_dump({"database_url": db}))
    out = subprocess.run(
        [sys.executable, "-m", "webhook.cli", "breaker", "reset", f"--config={config}"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 0 and "closed" in out.stdout
    reset_at = ledger.setting(Breaker).reset_at
    assert reset_at is not None
    clock.now = reset_at + timedelta(seconds=1)
    loop.step()
    v = view()
    v.set_job(Job(id=4, nodes=("gpu05",), partition="train", started=T0))
    loop.view_source = lambda: v
    loop.view_at = 0.0
    xid(ledger, "gpu05", 4, clock.now)
    clock.now += timedelta(seconds=10)
    fourth = loop.step()
    assert [(d.action, d.nodes, d.guard) for d in fourth if d.job == 4 and d.action == "drain"] == [
        ("drain", ("gpu05",), None)
    ]


def test_the_loop_wakes_when_a_settle_window_ends_not_a_tick_later(tmp_path: Path) -> None:
    ledger = Ledger(f"sqlite:///{tmp_path / 'l.db'}")
    clock = Clock()
    loop = LiveLoop(ledger, load_policy({"settle_seconds": 20}), view, clock=clock)
    assert loop.pause(1.0) == 1.0  # nothing pending: a tick
    xid(ledger, "gpu01", 1, T0)
    loop.step()  # the incident opens at its receipt, T0
    clock.now = T0 + timedelta(seconds=19.7)
    assert abs(loop.pause(1.0) - 0.3) < 1e-6
    clock.now = T0 + timedelta(seconds=19.7 + 0.3)
    assert {d.action for d in loop.step()} == {"drain", "requeue"}
    assert loop.pause(1.0) == 1.0


def nccl_timeout(ledger: Ledger, node: str, job: int, at: datetime) -> None:
    alert(ledger, "TrainingNcclTimeout", "nccl_timeout", node, job, at)


def test_a_restart_before_the_ledger_begins_is_not_taken_for_a_first_failure(
    tmp_path: Path,
) -> None:
    """A job Slurm restarted before this ledger's record begins dies with nobody to blame:
    whether it was requeued for this already is unknown, so a human decides. A restart the
    record covers is requeued once, as usual."""
    ledger = Ledger(f"sqlite:///{tmp_path / 'ledger.db'}")
    clock = Clock()
    nccl_timeout(ledger, "gpu02", 2, T0)  # the record begins here (job 2 trains on)

    def failed() -> ClusterView:
        v = view()
        for j, n, started in ((8, "gpu04", T0 - timedelta(minutes=30)), (9, "gpu05", T0)):
            v.set_job(
                Job(
                    id=j,
                    nodes=(n, "gpu06" if j == 8 else "gpu07"),
                    partition="train",
                    state="FAILED",
                    restarts=1,
                    started=started + timedelta(minutes=1),
                    ended=T0 + timedelta(minutes=2),
                )
            )
        return v

    loop = LiveLoop(ledger, load_policy({"settle_seconds": 5}), failed, clock=clock)
    assert loop.engine.guards.memory_since == T0
    # Every rank timed out: a hang, nobody to blame (and no node's alert within blame_wait).
    for job, node in ((8, "gpu04"), (8, "gpu06"), (9, "gpu05"), (9, "gpu07")):
        nccl_timeout(ledger, node, job, T0 + timedelta(minutes=2))
    clock.now = T0 + timedelta(minutes=5)
    decided = {(d.job, d.action, d.guard) for d in loop.step() if d.job in (8, 9)}
    assert decided == {(8, "escalate", "unseen_restart"), (9, "requeue", None)}
    (why,) = [r.reason for r in ledger.decisions(50) if r.job == 8]
    assert "began before slurmedic's record does (2026-11-29 12:00:00Z)" in why


def test_a_new_ledger_s_record_begins_when_its_loop_starts(tmp_path: Path) -> None:
    ledger = Ledger(f"sqlite:///{tmp_path / 'ledger.db'}")
    assert ledger.record_begins() is None
    clock = Clock()
    loop = LiveLoop(ledger, load_policy({}), view, clock=clock)
    assert loop.engine.guards.memory_since == T0
    xid(ledger, "gpu01", 1, T0 + timedelta(minutes=5))
    assert ledger.record_begins() == T0 + timedelta(minutes=5)


def test_the_global_switch_turns_waiting_and_new_decisions_into_records(tmp_path: Path) -> None:
    """One meaning in every mode: while it is on, nothing waits for a human either."""
    from webhook.ledger.settings import Switch

    ledger = Ledger(f"sqlite:///{tmp_path / 'ledger.db'}")
    policy = load_policy({"mode": "approve", "settle_seconds": 5, "breaker": {"max_fraction": 0.5}})
    clock = Clock()
    loop = LiveLoop(ledger, policy, view, clock=clock)
    xid(ledger, "gpu01", 1, T0)
    clock.now = T0 + timedelta(seconds=10)
    loop.step()
    waiting = ledger.in_state("awaiting_approval")
    assert {r.action for r in waiting} == {"drain", "requeue"}

    ledger.put(Switch(monitor=True), clock.now)
    xid(ledger, "gpu02", 2, clock.now)
    clock.now += timedelta(seconds=10)
    new = loop.step()
    assert {(d.action, d.mode, d.state, d.guard) for d in new} == {
        ("drain", "monitor", "recorded", "global_switch"),
        ("requeue", "monitor", "recorded", "global_switch"),
    }
    assert not ledger.in_state("awaiting_approval")
    for row in waiting:
        found = ledger.decision(row.id)
        assert found is not None
        assert found[0].state == "recorded"
        assert found[1][-1].detail == {
            "by": "switch",
            "note": "global switch to monitor: recorded, not carried out",
        }

    # Back to the policy: new decisions wait for a human again; the records stay records.
    ledger.put(Switch(monitor=False), clock.now)
    clock.now += timedelta(minutes=6)  # past the shared-cause window: three are a burst
    xid(ledger, "gpu03", 3, clock.now)
    clock.now += timedelta(seconds=10)
    assert {(d.mode, d.state) for d in loop.step()} == {("approve", "awaiting_approval")}
    assert all(r.state == "recorded" for r in ledger.rows([r.id for r in waiting]))
    # What the guards counted, the switch's records too, and that none of them ran, is what a
    # restart reads from the ledger.
    again = LiveLoop(ledger, policy, view, clock=clock)

    def counted(loop: LiveLoop) -> list[tuple[str, str, tuple[str, ...], bool]]:
        return sorted((h.incident, h.action, h.nodes, h.held) for h in loop.engine.guards.history)

    assert counted(loop) == counted(again)
    assert set(again.engine.guards.drained(T0)) == {"gpu01", "gpu02", "gpu03"}
    assert all(held for *_, held in counted(again))


def approving(
    tmp_path: Path, expires: str, **policy: object
) -> tuple[Ledger, Policy, Clock, LiveLoop]:
    """A loop in approve mode that has decided an XID on gpu01 (job 1): a drain and a requeue
    waiting for approval."""
    ledger = Ledger(f"sqlite:///{tmp_path / 'ledger.db'}")
    rules = load_policy(
        {"mode": "approve", "settle_seconds": 5, "approval_expires": expires, **policy}
    )
    clock = Clock()
    loop = LiveLoop(ledger, rules, view, clock=clock)
    xid(ledger, "gpu01", 1, T0)
    clock.now = T0 + timedelta(seconds=10)
    loop.step()
    return ledger, rules, clock, loop


def test_an_approval_nobody_gives_expires(tmp_path: Path) -> None:
    ledger, _, clock, loop = approving(tmp_path, "2h", breaker={"max_fraction": 0.5})
    waiting = ledger.in_state("awaiting_approval")
    assert len(waiting) == 2
    clock.now = T0 + timedelta(hours=1, minutes=59)
    loop.step()
    assert len(ledger.in_state("awaiting_approval")) == 2
    clock.now = T0 + timedelta(hours=2, seconds=11)
    loop.step()
    assert not ledger.in_state("awaiting_approval")
    for row in waiting:
        found = ledger.decision(row.id)
        assert found is not None and found[0].state == "expired"
        assert found[1][-1].detail["note"] == "not approved within 2h: expired, not carried out"


def test_a_rejected_or_expired_decision_no_longer_counts(tmp_path: Path) -> None:
    # 8 nodes at 10 %: one drain per hour; one requeue per job and day.
    ledger, policy, clock, loop = approving(
        tmp_path, "30m", breaker={"max_fraction": 0.1}, retry_budget={"max_requeues": 1}
    )
    drain, requeue = sorted(ledger.in_state("awaiting_approval"), key=lambda r: r.action)
    assert (drain.action, requeue.action) == ("drain", "requeue")
    # Waiting, it counts: a second drain within the hour opens the breaker.
    assert loop.engine.guards.drained(T0) and loop.engine.guards.requeues(1, T0) == 1
    ledger.add_event(drain.id, "rejected", {"by": "alice", "reason": "known flaky"}, clock.now)
    ledger.add_event(requeue.id, "rejected", {"by": "alice", "reason": "known flaky"}, clock.now)
    xid(ledger, "gpu02", 2, clock.now)
    clock.now += timedelta(seconds=10)
    second = loop.step()
    assert [(d.action, d.nodes, d.guard) for d in second if d.action == "drain"] == [
        ("drain", ("gpu02",), None)
    ]
    assert loop.engine.guards.requeues(1, T0) == 0
    # Nobody approves gpu02's drain: expired, it stops counting too, and a third drain waits
    # for approval instead of opening the breaker.
    clock.now += timedelta(minutes=31)
    loop.step()
    xid(ledger, "gpu03", 3, clock.now)
    clock.now += timedelta(seconds=10)
    third = loop.step()
    assert [(d.action, d.guard) for d in third if d.action != "requeue"] == [("drain", None)]
    # A restart reads the same from the ledger: only the drain still waiting counts.
    again = LiveLoop(ledger, policy, view, clock=clock)
    assert set(again.engine.guards.drained(T0)) == {"gpu03"}
    assert again.engine.guards.requeues(1, T0) == 0


def test_a_restart_days_later_still_knows_what_slurm_excludes_and_readmits_it(
    tmp_path: Path,
) -> None:
    """Job 1's XID on gpu01 drains it and requeues the job off it. Three days later (past the
    retry budget's window and the retention) gpu01 is back in service, slurmedic restarts, and
    job 1 fails on gpu02: its requeue readmits gpu01, which Slurm still excludes."""
    ledger = Ledger(f"sqlite:///{tmp_path / 'ledger.db'}")
    policy = load_policy({"settle_seconds": 5, "mode": "enforce"})
    clock = Clock()
    loop = LiveLoop(ledger, policy, view, clock=clock)
    xid(ledger, "gpu01", 1, T0)
    clock.now = T0 + timedelta(seconds=10)
    first = [(d.action, d.exclude) for d in loop.step() if d.job == 1]
    assert ("requeue", ("gpu01",)) in first and ("drain", ()) in first
    for row in ledger.in_state("pending"):  # as the executor runs them
        for state in ("running", "executed"):
            ledger.add_event(row.id, state, {"by": "test"}, clock.now)

    later = T0 + timedelta(days=3)

    def moved_on() -> ClusterView:
        v = view()
        v.set_job(Job(id=1, nodes=("gpu02",), partition="train", restarts=1, started=T0))
        return v

    clock.now = later
    loop = LiveLoop(ledger, policy, moved_on, clock=clock)
    loop.step()
    assert loop.engine.guards.excluded(1) == {"gpu01"}
    xid(ledger, "gpu02", 1, later)
    clock.now = later + timedelta(seconds=10)
    (requeue,) = [d for d in loop.step() if d.job == 1 and d.action == "requeue"]
    assert (requeue.exclude, requeue.readmit) == (("gpu02",), ("gpu01",))
    # ... and the engine's own sweep keeps it too, for as long as Slurm knows the job.
    loop.engine.forget(clock.now + timedelta(days=2))
    assert loop.engine.guards.excluded(1) == {"gpu02"}
    loop.engine.update_view(ClusterView(nodes=view().nodes), clock.now)  # job 1 is gone
    loop.engine.forget(clock.now + timedelta(days=2))
    assert loop.engine.guards.excluded(1) == set()


def test_a_drain_nobody_approved_keeps_its_node_excluded(tmp_path: Path) -> None:
    """Job 1's XID on gpu01: its requeue runs at once (enforce), its drain waits for approval
    and expires. gpu01 stayed in service only because nobody looked: the job's next requeue,
    after it failed elsewhere, keeps it excluded. A restart reads the same from the ledger."""
    ledger = Ledger(f"sqlite:///{tmp_path / 'ledger.db'}")
    policy = load_policy(
        {
            "settle_seconds": 5,
            "mode": "enforce",
            "actions": {"drain": "approve"},
            "approval_expires": "30m",
        }
    )
    clock = Clock()

    def moved_on() -> ClusterView:
        v = view()
        v.set_job(Job(id=1, nodes=("gpu02",), partition="train", restarts=1, started=T0))
        return v

    views = [view]
    loop = LiveLoop(ledger, policy, lambda: views[-1](), clock=clock, refresh_seconds=0)
    xid(ledger, "gpu01", 1, T0)
    clock.now = T0 + timedelta(seconds=10)
    loop.step()

    def drain_of(loop: LiveLoop) -> tuple[bool, bool]:
        (drain,) = [h for h in loop.engine.guards.history if h.nodes == ("gpu01",)]
        return drain.held, drain.undone

    assert drain_of(loop) == (True, False)
    clock.now = T0 + timedelta(minutes=31)
    loop.step()
    assert drain_of(loop) == (True, True)
    views.append(moved_on)
    later = T0 + timedelta(hours=3)
    xid(ledger, "gpu02", 1, later)
    clock.now = later + timedelta(seconds=10)
    (requeue,) = [d for d in loop.step() if d.job == 1 and d.action == "requeue"]
    assert (requeue.exclude, requeue.readmit) == (("gpu02",), ())
    again = LiveLoop(ledger, policy, moved_on, clock=clock)
    assert drain_of(again) == (True, True)
    assert again.engine.guards.readmittable(1, clock.now, clock.now)[0] == set()


def test_the_loop_settles_a_waiting_drain_as_a_restart_reads_it(tmp_path: Path) -> None:
    """What became of a drain (run by the executor in another thread, or approved in another
    process) reaches the guards at the loop's next step, as a restart reads it from the
    ledger: approved, it is still held until it ran; a dry run only, because the global switch
    went on before it ran, it stays held."""

    def drain_of(loop: LiveLoop, node: str) -> bool:
        (drain,) = [h for h in loop.engine.guards.history if h.nodes == (node,)]
        return drain.held

    for mode, node, job, moves, held in (
        ("approve", "gpu01", 1, ("approved",), True),
        ("approve", "gpu01", 1, ("approved", "running", "executed"), False),
        ("enforce", "gpu02", 2, ("running", "executed"), False),
        ("enforce", "gpu02", 2, ("recorded",), True),
        ("enforce", "gpu02", 2, ("running", "failed"), True),
    ):
        ledger = Ledger(f"sqlite:///{tmp_path / f'{mode}-{len(moves)}-{held}.db'}")
        policy = load_policy({"settle_seconds": 5, "actions": {"drain": mode}})
        clock = Clock()
        loop = LiveLoop(ledger, policy, view, clock=clock)
        xid(ledger, node, job, T0)
        clock.now = T0 + timedelta(seconds=10)
        (drain,) = [d for d in loop.step() if d.action == "drain"]
        assert drain_of(loop, node)  # not run yet, whatever the mode
        (row,) = [r for r in ledger.in_state(drain.state) if r.action == "drain"]
        for state in moves:
            ledger.add_event(row.id, state, {"by": "test"}, clock.now)
        clock.now += timedelta(seconds=10)
        loop.step()
        assert drain_of(loop, node) is held, moves
        assert drain_of(LiveLoop(ledger, policy, view, clock=clock), node) is held, moves


def test_a_reject_while_a_starting_loop_reads_its_history_is_seen(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A person rejects a drain while a starting loop streams its history from the ledger (the
    console is another process): the loop's guards end as a later restart reads them."""
    ledger = Ledger(f"sqlite:///{tmp_path / 'ledger.db'}")
    policy = load_policy({"settle_seconds": 5, "actions": {"drain": "approve"}})
    clock = Clock()
    loop = LiveLoop(ledger, policy, view, clock=clock)
    xid(ledger, "gpu01", 1, T0)
    clock.now = T0 + timedelta(seconds=10)
    loop.step()
    (row,) = [r for r in ledger.in_state("awaiting_approval") if r.action == "drain"]
    streamed = ledger.history

    def rejected_meanwhile(since: datetime) -> Iterator[PastAction]:
        yield from streamed(since)
        ledger.add_event(row.id, "rejected", {"by": "alice"}, clock.now)

    monkeypatch.setattr(ledger, "history", rejected_meanwhile)
    started = LiveLoop(ledger, policy, view, clock=clock)
    monkeypatch.setattr(ledger, "history", streamed)
    clock.now += timedelta(seconds=10)
    started.step()

    def drains(loop: LiveLoop) -> list[tuple[bool, bool]]:
        return [(h.undone, h.held) for h in loop.engine.guards.history if h.action == "drain"]

    assert drains(started) == drains(LiveLoop(ledger, policy, view, clock=clock)) == [(True, False)]
