"""Verification in the core: when a requeued job has recovered, when its recovery failed, and
what a failed recovery leads to."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from webhook.core.alerts import Alert, wrap
from webhook.core.cluster import ClusterView, Job, Node
from webhook.core.decisions import GuardState, PastAction
from webhook.core.engine import Engine
from webhook.core.policy import load_policy
from webhook.core.recovery import (
    FailurePoint,
    RankProgress,
    Watch,
    failure_point,
    judge,
    on_failure,
)
from webhook.ledger.store import Ledger

T0 = datetime(2026, 11, 30, 3, 0, tzinfo=UTC)
WATCH = Watch(
    incident="42.0",
    job=42,
    attempt=0,
    cause="gpu_hardware",
    fault_at=T0,
    requeued_at=T0 + timedelta(seconds=8),
    point=FailurePoint(step=120, checkpoint_step=100, work_lost_seconds=40),
)


def ranks(attempt: int, *steps: float, ckpt: float | None = None) -> list[RankProgress]:
    return [
        RankProgress(rank=i, attempt=attempt, step=s, step_at=1000.0 + s, checkpoint_step=ckpt)
        for i, s in enumerate(steps)
    ]


def job(state: str = "RUNNING", restarts: int = 1) -> Job:
    return Job(id=42, nodes=("gpu02",), state=state, restarts=restarts)


def test_the_failure_point_is_the_furthest_step_and_the_oldest_checkpoint() -> None:
    r = [
        RankProgress(0, 0, step=121, step_at=1121, checkpoint_step=100, checkpoint_at=1080),
        RankProgress(1, 0, step=119, step_at=1119, checkpoint_step=90, checkpoint_at=1070),
        RankProgress(2, 1, step=5),  # a successor's rank already pushing: not the failed attempt
    ]
    p = failure_point(r, 0)
    assert (p.step, p.checkpoint_step, p.work_lost_seconds) == (121, 90, 49)
    assert p.target == 121
    assert failure_point([], 0).target == 0
    assert FailurePoint(checkpoint_step=30).target == 30


def test_recovered_when_every_reporting_rank_of_the_successor_passes_the_step() -> None:
    now = T0 + timedelta(seconds=95)
    assert judge(WATCH, ranks(1, 130, 119), job(), now, 600).state == "watching"
    v = judge(WATCH, ranks(1, 130, 121), job(), now, 600)
    assert v.state == "recovered" and v.restored_seconds == 95
    # The failed attempt's stale pushes are not the successor's progress.
    assert judge(WATCH, ranks(0, 500, 500), job(), now, 600).state == "watching"


def test_failed_when_the_successor_ends_first_or_the_deadline_passes() -> None:
    now = T0 + timedelta(seconds=60)
    v = judge(WATCH, ranks(1, 3, 3), job("FAILED"), now, 600)
    assert v.state == "failed" and v.before_checkpoint
    # The checkpoint it resumed from (reported at start) is not one of its own.
    assert judge(WATCH, ranks(1, 100, ckpt=100), job("FAILED"), now, 600).before_checkpoint
    assert v.reason == "attempt 1 ended FAILED before its first checkpoint"
    v = judge(WATCH, ranks(1, 110, 110, ckpt=110), job(restarts=2), now, 600)
    assert v.state == "failed" and not v.before_checkpoint
    assert v.reason.startswith("attempt 1 was requeued again")
    late = T0 + timedelta(seconds=700)
    v = judge(WATCH, ranks(1, 110, 110), job(), late, 600)
    assert v.state == "failed" and "within 600 s" in v.reason
    assert judge(WATCH, [], None, now, 600).reason.startswith("the job is gone")
    assert judge(WATCH, [], job("COMPLETED"), now, 600).state == "recovered"


def test_a_failed_recovery_escalates_and_the_second_before_a_checkpoint_stops() -> None:
    policy = load_policy({"mode": "enforce"})
    guards = GuardState()
    now = T0 + timedelta(minutes=5)
    v = judge(WATCH, ranks(1, 2), job("PENDING", restarts=2), now, 600)
    first = on_failure(WATCH, v, job("PENDING", restarts=2), guards, policy, now)
    assert [(d.action, d.guard, d.incident) for d in first] == [
        ("escalate", "recovery_failed", "42.0")
    ]
    guards.history.append(
        PastAction(at=now, action="recovery_failed", job=42, before_checkpoint=True)
    )
    second = on_failure(WATCH, v, job("RUNNING", restarts=2), guards, policy, now)
    assert [(d.action, d.guard, d.incident, d.state) for d in second] == [
        ("escalate", "recovery_failed", "42.0", "pending"),
        ("stop", "no_progress", "42.2", "pending"),  # the attempt that runs now
    ]
    # A job that ended needs no stop.
    assert [d.action for d in on_failure(WATCH, v, job("FAILED", 2), guards, policy, now)] == [
        "escalate"
    ]


def test_failed_recoveries_spend_the_retry_budget() -> None:
    guards = GuardState(
        history=[
            PastAction(at=T0, action="requeue", job=42),
            PastAction(at=T0, action="recovery_failed", job=42),
            PastAction(at=T0, action="recovery_failed", job=7, before_checkpoint=True),
        ]
    )
    assert guards.requeues(42, T0 - timedelta(hours=1)) == 2
    assert guards.failed_recoveries(42, T0, before_checkpoint=True) == 0
    assert guards.failed_recoveries(7, T0, before_checkpoint=True) == 1


def test_the_ledger_remembers_failed_recoveries_for_the_guards(tmp_path) -> None:  # type: ignore[no-untyped-def]
    ledger = Ledger(f"sqlite:///{tmp_path / 'l.db'}")
    policy = load_policy({"mode": "enforce"})
    v = judge(WATCH, ranks(1, 2), job("FAILED"), T0 + timedelta(minutes=1), 600)
    ledger.record(on_failure(WATCH, v, job("FAILED"), GuardState(), policy, T0))
    (past,) = list(ledger.history(T0 - timedelta(hours=1)))
    assert (past.action, past.job, past.before_checkpoint) == ("recovery_failed", 42, True)
    ledger.watch(WATCH)
    assert ledger.watching() == [WATCH]
    ledger.conclude("42.0", v, T0)
    assert ledger.watching() == [] and ledger.recoveries("failed")[0].before_checkpoint


def test_a_job_whose_restarts_keep_failing_before_a_checkpoint_is_not_requeued_again() -> None:
    view = ClusterView()
    for n in ("gpu01", "gpu02", "gpu03"):
        view.nodes[n] = Node(n, "train")
    view.set_job(Job(id=42, nodes=("gpu01", "gpu02"), partition="train", restarts=2, started=T0))
    failed = [
        PastAction(at=T0, action="recovery_failed", job=42, before_checkpoint=True),
        PastAction(at=T0, action="recovery_failed", job=42, before_checkpoint=True),
    ]
    fault = wrap(
        [
            Alert(
                status="firing",
                startsAt=T0 + timedelta(minutes=1),
                labels={"alertname": "GpuXidNodeFault", "signal": "gpu_hw", "node": "gpu02"},
            )
        ]
    )
    for history, expected in ((failed[:1], "requeue"), (failed, "stop")):
        e = Engine.with_history(view, load_policy({"settle_seconds": 0}), history)
        e.receive(fault, T0 + timedelta(minutes=1))
        got = {d.action: d for d in e.tick(T0 + timedelta(minutes=2))}
        assert expected in got and "drain" in got  # the bad node is drained either way
        if expected == "stop":
            assert got["stop"].guard == got["escalate"].guard == "no_progress"
            assert "before their first checkpoint" in got["stop"].reason
