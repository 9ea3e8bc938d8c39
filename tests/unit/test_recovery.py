"""Verification in the core: when a requeued job has recovered, when its recovery failed, and
what a failed recovery leads to."""

from __future__ import annotations

import sqlite3
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

from webhook.core.alerts import Alert, wrap
from webhook.core.cluster import ClusterView, Job, Node
from webhook.core.decisions import GuardState, PastAction
from webhook.core.engine import Engine
from webhook.core.policy import load_policy
from webhook.core.recovery import (
    FailurePoint,
    RankProgress,
    Resume,
    Verdict,
    Watch,
    failure_point,
    judge,
    plan,
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


VERIFY = load_policy({"verify": {"deadline": "600s", "pending_limit": "2h"}}).verify


def ranks(attempt: int, *steps: float, ckpt: float | None = None) -> list[RankProgress]:
    return [
        RankProgress(rank=i, attempt=attempt, step=s, step_at=1000.0 + s, checkpoint_step=ckpt)
        for i, s in enumerate(steps)
    ]


def job(state: str = "RUNNING", restarts: int = 1, started: int = 20) -> Job:
    return Job(
        id=42,
        nodes=("gpu02",),
        state=state,
        restarts=restarts,
        started=T0 + timedelta(seconds=started),
    )


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def test_the_failure_point_is_the_furthest_step_and_the_oldest_checkpoint() -> None:
    r = [
        RankProgress(0, 0, step=121, step_at=1121, checkpoint_step=100, checkpoint_at=1080),
        RankProgress(1, 0, step=119, step_at=1119, checkpoint_step=90, checkpoint_at=1070),
        RankProgress(2, 1, step=5),  # a successor's rank already pushing: not the failed attempt
    ]
    p = failure_point(r, 0)
    assert (p.step, p.checkpoint_step, p.work_lost_seconds) == (121, 90, 49)
    assert p.target == 121
    assert failure_point([], 0) == FailurePoint()
    assert FailurePoint(checkpoint_step=30).target == 30
    # An attempt that failed before its first checkpoint reports the one it loaded, written
    # before its hours in the queue: the work lost runs from the attempt's start.
    queued = RankProgress(0, 2, step=130, step_at=30_900, checkpoint_step=100, checkpoint_at=1080)
    assert failure_point([replace(queued, started_at=30_000)], 2).work_lost_seconds == 900
    assert failure_point([queued], 2).work_lost_seconds == 29_820  # no start: the checkpoint's


def test_recovered_when_every_reporting_rank_of_the_successor_passes_the_step() -> None:
    assert judge(WATCH, ranks(1, 130, 119), job(), at(95), VERIFY).state == "watching"
    v = judge(WATCH, ranks(1, 130, 121), job(), at(95), VERIFY)
    assert v.state == "recovered" and v.restored_seconds == 95
    # A successor that has only loaded a checkpoint past the target has not trained yet.
    assert judge(WATCH, ranks(1, 125, 125, ckpt=125), job(), at(95), VERIFY).state == "watching"
    # The failed attempt's stale pushes are not the successor's progress.
    assert judge(WATCH, ranks(0, 500, 500), job(), at(95), VERIFY).state == "watching"
    assert judge(WATCH, [], job("COMPLETED"), at(95), VERIFY).state == "recovered"


def test_a_job_that_reports_no_progress_is_unverified_not_failed() -> None:
    blind = replace(WATCH, point=FailurePoint())
    v = judge(blind, [], job("FAILED"), at(5000), VERIFY)
    assert v.state == "unverified" and "no training progress" in v.reason
    # Cancelled (scancel): somebody's decision, not a failed recovery.
    assert judge(WATCH, [], job("CANCELLED"), at(60), VERIFY).state == "unverified"
    # Slurm forgot the job (MinJobAge) before it was judged: how it ended is unknown.
    assert judge(WATCH, [], None, at(60), VERIFY).state == "unverified"


def test_failed_when_the_successor_ends_first_or_makes_no_progress_after_it_started() -> None:
    v = judge(WATCH, ranks(1, 3, 3), job("FAILED"), at(60), VERIFY)
    assert (v.state, v.before_checkpoint, v.charged) == ("failed", True, True)
    assert v.reason == "attempt 1 ended FAILED before its first checkpoint"
    # The checkpoint it resumed from (reported at start) is not one of its own - even past the
    # failure point read earlier, when it says it was written before the attempt started.
    assert judge(WATCH, ranks(1, 100, ckpt=100), job("FAILED"), at(60), VERIFY).before_checkpoint
    loaded = RankProgress(0, 1, step=135, checkpoint_step=135, checkpoint_at=900, started_at=1000)
    assert judge(WATCH, [loaded], job("FAILED"), at(60), VERIFY).before_checkpoint
    written = replace(loaded, checkpoint_at=1010)
    assert not judge(WATCH, [written], job("FAILED"), at(60), VERIFY).before_checkpoint
    # Requeued again (by slurmedic for a new failure, or by Slurm): escalated, not charged,
    # since that requeue counts against the budget itself.
    v = judge(WATCH, ranks(1, 110, 110, ckpt=110), job(restarts=2), at(60), VERIFY)
    assert (v.state, v.before_checkpoint, v.charged) == ("failed", False, False)
    assert v.reason.startswith("attempt 1 was requeued again")
    # The deadline runs from the successor's start, not from the requeue, and gives it the
    # time to redo the work lost (40 s here) on top of the policy's 600 s.
    late_start = job(started=300)
    assert judge(WATCH, ranks(1, 110), late_start, at(939), VERIFY).state == "watching"
    v = judge(WATCH, ranks(1, 110), late_start, at(941), VERIFY)
    assert v.state == "failed" and v.charged
    assert "within 640 s of its start (40 s of them to redo lost work)" in v.reason


# The failed attempt reached step 120, 40 s after its last checkpoint at 100: 2 s a step; its
# loss was 2.0 there. Its successor started 30 s after the requeue.
ASSESSED = replace(WATCH, point=replace(WATCH.point, quality=2.0))


def resumed(step: float, loss: float, at_step: float = 121) -> list[RankProgress]:
    start = ASSESSED.requeued_at.timestamp() + 30
    return [
        RankProgress(i, 1, step=at_step, resume_step=step, quality=loss, started_at=start)
        for i in range(2)
    ]


def test_a_recovery_reports_where_it_resumed_what_it_lost_and_that_its_output_is_usable() -> None:
    v = judge(ASSESSED, resumed(100, 1.95), job(), at(95), VERIFY)
    assert v.state == "recovered"
    assert v.resume == Resume(
        step=100,
        expected=100,
        lost_steps=20,
        lost_seconds=40,
        start_seconds=30,
        quality_before=2.0,
        quality_after=1.95,
    )
    assert not v.resume.older
    assert (
        "resumed from step 100 (last checkpoint 100); 20 steps lost (40 s of training)" in v.reason
    )


def test_a_resume_from_an_older_checkpoint_is_recovered_with_the_work_it_lost() -> None:
    v = judge(ASSESSED, resumed(60, 2.1), job(), at(300), VERIFY)
    assert v.state == "recovered" and v.resume is not None and v.resume.older
    # 60 steps lost at the failed attempt's pace since its checkpoint (2 s a step).
    assert (v.resume.lost_steps, v.resume.lost_seconds) == (60, 120)
    assert (
        "resumed from step 60 (last checkpoint 100); 60 steps lost (120 s of training)" in v.reason
    )


def test_work_lost_at_a_checkpoint_is_timed_at_the_successor_s_pace() -> None:
    # The failed attempt stopped right at its checkpoint (step 100): its own pace is unknown.
    at_checkpoint = replace(
        ASSESSED, point=FailurePoint(step=100, checkpoint_step=100, work_lost_seconds=0)
    )
    start = at_checkpoint.requeued_at.timestamp() + 30
    ranks = [RankProgress(0, 1, step=101, step_at=start + 42, started_at=start, resume_step=80)]
    v = judge(at_checkpoint, ranks, job(), at(95), VERIFY)
    assert v.resume is not None and (v.resume.lost_steps, v.resume.lost_seconds) == (20, 40)


def test_a_successor_whose_quality_jumped_back_is_not_recovered_and_goes_to_its_owner() -> None:
    # A corrupt checkpoint: the step was restored, the weights were not; the loss is back
    # where training began.
    v = judge(ASSESSED, resumed(100, 9.0), job(), at(95), VERIFY)
    assert (v.state, v.unusable, v.charged) == ("failed", True, False)
    # Escalated to its owner: its cause is the job's own, whatever requeued it.
    (escalation,) = plan(ASSESSED, v, job(), at(95))
    assert (escalation.action, escalation.cause) == ("escalate", "application")
    assert plan(ASSESSED, replace(v, unusable=False), job(), at(95))[0].cause == "gpu_hardware"
    assert "its output is not usable" in v.reason and "quality 2 before, 9 after" in v.reason
    # Within the policy's tolerance (25 % worse) it is usable; better by any amount (it trained
    # on before it was judged) too; without a quality value it is not judged on it.
    assert judge(ASSESSED, resumed(100, 2.45), job(), at(95), VERIFY).state == "recovered"
    assert judge(ASSESSED, resumed(100, 0.5), job(), at(95), VERIFY).state == "recovered"
    strict = load_policy({"verify": {"quality_tolerance": 0.1}}).verify
    assert judge(ASSESSED, resumed(100, 2.45), job(), at(95), strict).unusable
    blind = [replace(r, quality=None) for r in resumed(100, 0)]
    assert judge(ASSESSED, blind, job(), at(95), VERIFY).state == "recovered"
    # An accuracy: higher is better, and a drop is what is worse.
    accuracy = load_policy({"verify": {"quality_better": "higher"}}).verify
    assert judge(ASSESSED, resumed(100, 0.5), job(), at(95), accuracy).unusable
    assert judge(ASSESSED, resumed(100, 9.0), job(), at(95), accuracy).state == "recovered"


def test_the_failure_point_keeps_the_failed_attempt_s_quality() -> None:
    r = [RankProgress(0, 0, step=10, quality=2.0), RankProgress(1, 0, step=10, quality=3.0)]
    assert failure_point(r, 0).quality == 2.5
    assert failure_point([RankProgress(0, 0, step=10)], 0).quality is None


def test_a_job_that_lost_hours_of_work_has_the_hours_to_redo_them() -> None:
    # Checkpoints every two hours, a failure 1.5 h after the last one: the successor needs
    # 1.5 h of training (after its restart) to pass the step, and is not failed at 600 s.
    lost = replace(WATCH, point=replace(WATCH.point, work_lost_seconds=5400))
    assert lost.deadline(VERIFY) == timedelta(seconds=6000)
    assert judge(lost, ranks(1, 110), job(), at(3600), VERIFY).state == "watching"
    v = judge(lost, ranks(1, 110), job(), at(6030), VERIFY)
    assert v.state == "failed" and "within 6000 s" in v.reason
    # Without the time of the lost work (the ranks report no checkpoint times): the policy's.
    unknown = replace(WATCH, point=replace(WATCH.point, work_lost_seconds=None))
    assert unknown.deadline(VERIFY) == timedelta(seconds=600)
    v = judge(unknown, ranks(1, 110), job(), at(630), VERIFY)
    assert "within 600 s of its start before" in v.reason


def test_waiting_in_the_queue_is_not_a_failure() -> None:
    pending = job("PENDING", started=0)
    assert judge(WATCH, [], pending, at(5000), VERIFY).state == "watching"
    v = judge(WATCH, [], pending, at(8000), VERIFY)
    assert v.state == "unverified" and "has not started" in v.reason


def test_a_failed_recovery_escalates_and_the_second_before_a_checkpoint_stops() -> None:
    """The engine remembers each verdict and takes a failed one through the guards: the
    stop is no_progress's, once the job's failures before a checkpoint reach the limit."""
    engine = Engine(view=ClusterView(), policy=load_policy({"mode": "enforce"}))
    now = at(300)
    v = judge(WATCH, ranks(1, 2), job("FAILED"), now, VERIFY)
    first = engine.judged(WATCH, v, job("PENDING", restarts=2), now)
    assert [(d.action, d.guard, d.incident) for d in first] == [
        ("escalate", "recovery_failed", "verify:42.0")
    ]
    assert [h.action for h in engine.guards.history] == ["recovery_failed"]
    second = engine.judged(WATCH, v, job("RUNNING", restarts=2), now)
    assert [(d.action, d.guard, d.incident, d.state) for d in second] == [
        ("escalate", "recovery_failed", "verify:42.0", "pending"),
        ("stop", "no_progress", "verify:42.2", "pending"),  # the attempt that runs now
    ]
    # A job that ended needs no stop; a failure that was not charged stops nothing.
    assert [d.action for d in engine.judged(WATCH, v, job("FAILED", 2), now)] == ["escalate"]
    uncharged = replace(v, charged=False)
    assert [d.action for d in engine.judged(WATCH, uncharged, job(), now)] == ["escalate"]
    # "In a row": a good recovery in between starts the count again.
    assert engine.judged(WATCH, Verdict("recovered", "ok", 10.0), job(), at(301)) == []
    assert [d.action for d in engine.judged(WATCH, v, job(), at(302))] == ["escalate"]
    # The guards' scope holds for it as for any decision: a job outside the policy's
    # partitions is not stopped.
    scoped = Engine(
        view=ClusterView(),
        policy=load_policy({"mode": "enforce", "scope": {"partitions": ["other"]}}),
    )
    made = [scoped.judged(WATCH, v, job("RUNNING", restarts=2), now) for _ in range(2)]
    assert [[(d.action, d.guard) for d in m] for m in made] == [
        [("escalate", "recovery_failed")],
        [("escalate", "recovery_failed"), ("none", "out_of_scope")],
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


def test_the_ledger_remembers_recoveries_for_the_guards(tmp_path: Path) -> None:
    ledger = Ledger(f"sqlite:///{tmp_path / 'l.db'}")
    policy = load_policy({"mode": "enforce"})
    failed = judge(WATCH, ranks(1, 2), job("FAILED"), at(60), VERIFY)
    again = judge(WATCH, ranks(1, 2), job(restarts=2), at(60), VERIFY)
    ledger.watch(WATCH)
    assert ledger.watching() == [WATCH]
    ids = ledger.conclude(
        "42.0", failed, at(60), Engine(ClusterView(), policy).judged(WATCH, failed, None, at(60))
    )
    ledger.record(Engine(ClusterView(), policy).judged(WATCH, again, None, at(61)))
    assert ledger.watching() == [] and ledger.recoveries("failed")[0].before_checkpoint
    assert [r.guard for r in ledger.rows(ids)] == ["recovery_failed"]
    # Only the charged failure spends the budget.
    (past,) = list(ledger.history(T0 - timedelta(hours=1)))
    assert (past.action, past.job, past.before_checkpoint) == ("recovery_failed", 42, True)
    ledger.watch(replace(WATCH, incident="42.3"))
    ledger.conclude("42.3", Verdict("recovered", "ok", 10.0), at(90))
    assert {p.action for p in ledger.history(T0)} == {"recovery_failed", "recovered"}


def test_an_older_ledger_gets_the_new_columns(tmp_path: Path) -> None:
    db = tmp_path / "old.db"
    with sqlite3.connect(db) as c:
        c.execute("CREATE TABLE decisions (id INTEGER PRIMARY KEY, at DATETIME, "
                  "incident VARCHAR(64), job INT, action VARCHAR(16), cause VARCHAR(32), "
                  "nodes JSON, exclude JSON, reason TEXT, evidence JSON, guard VARCHAR(48), "
                  "mode VARCHAR(16), state VARCHAR(24))")  # fmt: skip
    Ledger(f"sqlite:///{db}")
    Ledger(f"sqlite:///{db}")  # and again: nothing to add
    with sqlite3.connect(db) as c:
        assert "fault_at" in [r[1] for r in c.execute("PRAGMA table_info(decisions)")]


def test_a_job_whose_restarts_keep_failing_before_a_checkpoint_is_not_requeued_again() -> None:
    view = ClusterView()
    for n in ("gpu01", "gpu02", "gpu03"):
        view.nodes[n] = Node(n, "train")
    view.set_job(Job(id=42, nodes=("gpu01", "gpu02"), partition="train", restarts=2, started=T0))
    failed = [
        PastAction(at=T0, action="recovery_failed", job=42, before_checkpoint=True),
        PastAction(at=T0, action="recovery_failed", job=42, before_checkpoint=True),
    ]

    def alert(name: str, signal: str) -> Alert:
        labels = {"alertname": name, "signal": signal, "node": "gpu02", "slurm_job_id": "42"}
        return Alert(status="firing", startsAt=T0 + timedelta(minutes=1), labels=labels)

    # Its own crash again (it asks for requeues of those): stopped after two.
    crashed = replace(
        view.jobs[42], state="FAILED", comment='{"slurmedic": {"retry_application": true}}'
    )
    view.set_job(crashed)
    for history, expected in ((failed[:1], "requeue"), (failed, "stop")):
        e = Engine.with_history(view, load_policy({"settle_seconds": 0}), history)
        e.receive(wrap([alert("TrainingTaskFailed", "app_error")]), T0 + timedelta(minutes=1))
        got = {d.action: d for d in e.tick(T0 + timedelta(minutes=2))}
        assert expected in got, got
        if expected == "stop":
            assert got["stop"].guard == got["escalate"].guard == "no_progress"
            assert "before their first checkpoint" in got["stop"].reason
    # A restart that a new GPU fault ended (slurmedic requeued it for that fault) is not the
    # job failing to progress: only the failed recovery after that requeue counts.
    gpu = PastAction(at=T0 - timedelta(minutes=9), action="requeue", job=42, cause="gpu_hardware")
    earlier = replace(failed[0], at=T0 - timedelta(minutes=10))
    roomy = load_policy({"settle_seconds": 0, "retry_budget": {"max_requeues": 10}})
    e = Engine.with_history(view, roomy, [earlier, gpu, failed[1]])
    e.receive(wrap([alert("TrainingTaskFailed", "app_error")]), T0 + timedelta(minutes=1))
    got = {d.action: d for d in e.tick(T0 + timedelta(minutes=2))}
    assert set(got) == {"requeue"}, got
    # And a new GPU fault after two failed restarts is drained and requeued, not stopped.
    e = Engine.with_history(view, roomy, failed)
    e.receive(wrap([alert("GpuXidNodeFault", "gpu_hw")]), T0 + timedelta(minutes=1))
    got = {d.action: d for d in e.tick(T0 + timedelta(minutes=2))}
    assert set(got) == {"drain", "requeue"}, got


def test_the_ledger_keeps_how_a_job_resumed(tmp_path: Path) -> None:
    ledger = Ledger(f"sqlite:///{tmp_path / 'l.db'}")
    drill = replace(ASSESSED, drill=True)
    ledger.watch(drill)
    assert ledger.watching() == [drill]  # its quality and being a drill survive the ledger
    v = judge(drill, resumed(60, 2.1), job(), at(300), VERIFY)
    ledger.conclude("42.0", v, at(300))
    (row,) = ledger.recoveries("recovered")
    assert (row.resume_step, row.lost_steps, row.lost_seconds, row.start_seconds) == (
        60,
        60,
        120,
        30,
    )
    assert (row.quality_before, row.quality_after, row.drill) == (2.0, 2.1, True)
