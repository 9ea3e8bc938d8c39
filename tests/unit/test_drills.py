"""Recovery drills in the core and the ledger: what a drill interrupts and when it is refused,
how it is judged (stricter than a recovery), when it is due before a checkpoint, and that it
stays out of the guards' memory and the recovery figures."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from webhook.core import drills
from webhook.core.cluster import ClusterView, Job
from webhook.core.policy import load_policy
from webhook.core.recovery import FailurePoint, RankProgress, Resume, Verdict, Watch, judge
from webhook.ledger.store import Ledger

T0 = datetime(2026, 12, 6, 12, 0, tzinfo=UTC)
ASK = drills.Request(id=1, job=42, by="ops", at=T0)


def view(**kw: object) -> ClusterView:
    job = Job(
        id=42,
        nodes=("gpu01", "gpu02"),
        partition="train",
        restarts=2,
        started=T0 - timedelta(hours=1),
    )
    v = ClusterView()
    v.set_job(replace(job, **kw))  # type: ignore[arg-type]
    return v


def test_a_drill_requeues_the_running_attempt_in_the_mode_policy_gives_requeues() -> None:
    policy = load_policy(
        {"mode": "monitor", "partitions": {"train": {"actions": {"requeue": "enforce"}}}}
    )
    d = drills.plan(replace(ASK, exclude="gpu02"), view(), policy, T0)
    assert (d.incident, d.action, d.cause, d.exclude) == (
        "drill:42.2",
        "requeue",
        "drill",
        ("gpu02",),
    )
    assert (d.mode, d.state) == ("enforce", "pending")
    assert "recovery drill asked by ops: requeue attempt 2, excluding gpu02" in d.reason
    # Approve mode holds it for a human; monitor mode only records it (and its dry run).
    assert (
        drills.plan(ASK, view(), load_policy({"mode": "approve"}), T0).state == "awaiting_approval"
    )
    assert drills.plan(ASK, view(), load_policy({}), T0).state == "recorded"


@pytest.mark.parametrize(
    ("job", "policy", "why"),
    [
        ({"state": "PENDING", "started": None}, {}, "job 42 is PENDING, not running"),
        (
            {"partition": "debug"},
            {"scope": {"partitions": ["train"]}},
            "outside the policy's partitions",
        ),
        ({"requeue": False}, {}, "submitted with --no-requeue"),
        ({"comment": '{"slurmedic": {"drill": false}}'}, {}, "opted out of drills"),
        ({"comment": '{"slurmedic": {"requeue": false}}'}, {}, "opted out of drills"),
        ({}, {"drills": {"require_opt_in": True}}, "did not opt in to drills"),
    ],
)
def test_a_drill_is_refused_with_the_reason(
    job: dict[str, object], policy: dict[str, object], why: str
) -> None:
    with pytest.raises(drills.Refused, match=why):
        drills.plan(ASK, view(**job), load_policy(policy), T0)


def test_a_drill_of_an_unknown_job_or_a_node_not_its_own_is_refused() -> None:
    with pytest.raises(drills.Refused, match="job 7 is not in Slurm's view"):
        drills.plan(replace(ASK, job=7), view(), load_policy({}), T0)
    with pytest.raises(drills.Refused, match="exclude: gpu09 is not one of job 42's nodes"):
        drills.plan(replace(ASK, exclude="gpu09"), view(), load_policy({}), T0)
    opted_in = view(comment='{"slurmedic": {"drill": true}}')
    assert drills.plan(ASK, opted_in, load_policy({"drills": {"require_opt_in": True}}), T0)


WATCH = Watch(
    incident="drill:42.2",
    job=42,
    attempt=2,
    cause="drill",
    fault_at=T0,
    requeued_at=T0 + timedelta(seconds=5),
    point=FailurePoint(step=120, checkpoint_step=100, work_lost_seconds=40, quality=2.0),
    drill=True,
)
VERIFY = load_policy({}).verify


def successor(resumed_from: float, loss: float) -> list[RankProgress]:
    return [RankProgress(0, 3, step=121, resume_step=resumed_from, quality=loss)]


def test_a_drill_passes_only_from_the_last_checkpoint_with_usable_output() -> None:
    running = Job(id=42, nodes=("gpu01",), restarts=3, started=T0 + timedelta(seconds=20))
    now = T0 + timedelta(minutes=2)
    passed = drills.judge(judge(WATCH, successor(100, 1.9), running, now, VERIFY))
    assert passed.state == "recovered"
    older = drills.judge(judge(WATCH, successor(60, 1.9), running, now, VERIFY))
    assert older.state == "failed" and older.reason.startswith(
        "the job came back, but not from its last checkpoint"
    )
    corrupt = drills.judge(judge(WATCH, successor(100, 5.0), running, now, VERIFY))
    assert corrupt.state == "failed" and corrupt.unusable
    # A failed drill goes to a human, and nothing else happens to the job; a passed one: nothing.
    policy = load_policy({"mode": "enforce"})
    (escalation,) = drills.decisions(WATCH, older, running, policy, now)
    assert (escalation.action, escalation.guard, escalation.incident) == (
        "escalate",
        "drill_failed",
        "verify:42.2",
    )
    assert escalation.state == "pending" and "the recovery drill failed" in escalation.reason
    assert drills.decisions(WATCH, passed, running, policy, now) == []


def test_a_drill_before_a_checkpoint_comes_its_usual_interval_after_the_last() -> None:
    t = T0.timestamp()
    # Checkpoints every 600 s (one slow one), the last 100 s ago: due in 500 s, less 30 s.
    times = [t - 1900, t - 1300, t - 700, t - 100, t - 1300]
    assert drills.before_checkpoint(times, timedelta(seconds=30), T0) == T0 + timedelta(seconds=470)
    # Overdue already: now.
    assert drills.before_checkpoint([t - 5000, t - 4000], timedelta(seconds=30), T0) == T0
    with pytest.raises(drills.Refused, match="not reported two checkpoints"):
        drills.before_checkpoint([t - 100, t - 100], timedelta(seconds=30), T0)


def test_the_ledger_plans_a_request_once_and_keeps_drills_out_of_the_guards_and_figures(
    tmp_path: Path,
) -> None:
    ledger = Ledger(f"sqlite:///{tmp_path / 'l.db'}")
    later = ledger.drills.ask(43, "ops", T0, T0 + timedelta(minutes=5), None)
    asked = ledger.drills.ask(42, "ops", T0, T0, "gpu02")
    (due,) = ledger.drills.due(T0)
    assert (due.id, due.job, due.exclude) == (asked, 42, "gpu02")
    policy = load_policy({"mode": "enforce"})
    d = drills.plan(due, view(), policy, T0)
    [rid] = ledger.plan_drill(due, d, d.reason)
    assert ledger.plan_drill(due, d, d.reason) == []  # planned once, whoever asks again
    assert [r.incident for r in ledger.rows([rid])] == ["drill:42.2"]
    (refused,) = ledger.drills.due(T0 + timedelta(minutes=5))
    assert refused.id == later
    ledger.plan_drill(refused, None, "job 43 is not in Slurm's view")
    # The requeue ran and the job came back: a passed drill, never a recovery for the guards.
    ledger.watch(replace(WATCH, incident="drill:42.2"))
    v = Verdict("recovered", "ok", 10.0, resume=Resume(step=100, expected=100))
    ledger.conclude("drill:42.2", v, T0 + timedelta(minutes=1))
    assert list(ledger.history(T0 - timedelta(days=1))) == []
    figures = ledger.figures()
    assert figures.recoveries == []
    assert figures.drills == {
        "asked": 0,
        "refused": 1,
        "watching": 0,
        "passed": 1,
        "failed": 0,
        "unverified": 0,
    }
    listed = ledger.drills.latest()
    assert [(x.id, x.state) for x in listed] == [(asked, "decided"), (later, "refused")]
    assert listed[0].recovery is not None and listed[0].recovery.resume_step == 100
    assert listed[1].reason == "job 43 is not in Slurm's view"


def test_an_attempt_is_drilled_once(tmp_path: Path) -> None:
    ledger = Ledger(f"sqlite:///{tmp_path / 'l.db'}")
    for _ in range(2):
        ledger.drills.ask(42, "ops", T0, T0, None)
    first, second = ledger.drills.due(T0)
    policy = load_policy({})
    assert len(ledger.plan_drill(first, drills.plan(first, view(), policy, T0), "ok")) == 1
    assert ledger.plan_drill(second, drills.plan(second, view(), policy, T0), "ok") == []
    assert [d.reason for d in ledger.drills.latest()] == [
        "attempt drill:42.2 was drilled already",
        "ok",
    ]


def test_a_job_counts_as_drilled_from_its_drill_s_decision_until_the_verdict(
    tmp_path: Path,
) -> None:
    ledger = Ledger(f"sqlite:///{tmp_path / 'l.db'}")
    since = T0 - timedelta(days=1)
    ledger.drills.ask(42, "ops", T0, T0, None)
    (due,) = ledger.drills.due(T0)
    [rid] = ledger.plan_drill(
        due, drills.plan(due, view(), load_policy({"mode": "enforce"}), T0), "ok"
    )
    assert ledger.drills.in_flight(since) == {42}  # pending: about to interrupt it
    ledger.add_event(rid, "running", {}, T0)
    ledger.add_event(rid, "executed", {}, T0)
    ledger.watch(replace(WATCH, incident="drill:42.2"))
    assert ledger.drills.in_flight(since) == {42}  # requeued, its successor watched
    ledger.conclude("drill:42.2", Verdict("recovered", "ok", 10.0), T0 + timedelta(minutes=1))
    assert ledger.drills.in_flight(since) == set()
    assert ledger.drills.in_flight(T0 + timedelta(seconds=1)) == set()
    # A drill in monitor mode interrupts nothing: it is a dry run, and says so.
    ledger.drills.ask(43, "ops", T0, T0, None)
    (monitor,) = ledger.drills.due(T0)
    ledger.plan_drill(monitor, drills.plan(monitor, view(id=43), load_policy({}), T0), "ok")
    assert ledger.drills.in_flight(since) == set()
    outcomes = {d.job: d.outcome for d in ledger.drills.between(since, T0 + timedelta(days=1))}
    assert outcomes == {42: "passed", 43: "dry_run"}
    assert ledger.drills.between(T0 + timedelta(seconds=1), T0 + timedelta(days=1)) == []
