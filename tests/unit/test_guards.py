"""The guards' pipeline, stage by stage: given a decision as the plan made it and the incident's
context, each stage returns the expected decisions and effect on the guards' memory, and changes
nothing itself; the order is the table docs/operations.md gives."""

from __future__ import annotations

import copy
import json
import re
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from webhook.core import guards as g
from webhook.core.alerts import Alert, wrap
from webhook.core.attribution import Attribution
from webhook.core.cluster import ClusterView, Job, Node
from webhook.core.decisions import (
    BreakerOpened,
    Counted,
    Decision,
    GuardState,
    PastAction,
    plan,
    removes,
)
from webhook.core.engine import Engine
from webhook.core.evidence import Evidence
from webhook.core.lifecycle import EXECUTED, EXPIRED, FAILED, RECORDED, REJECTED
from webhook.core.policy import SHARED, PolicyError, load_policy

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
DOCS = Path(__file__).resolve().parents[2] / "docs" / "operations.md"
GPU = Attribution("gpu_hardware", ("gpu02",), "XID 79 on gpu02")
APP = Attribution("application", (), "XID 13 on gpu01")
HANG = Attribution("hang", (), "every rank timed out")
UNKNOWN = Attribution("unknown", (), "NCCL timeouts on some ranks")


def view(*jobs: Job, drained: tuple[str, ...] = ()) -> ClusterView:
    v = ClusterView()
    for i in range(1, 11):
        name = f"gpu{i:02}"
        v.nodes[name] = Node(name, "train", state="drain" if name in drained else "allocated")
    v.nodes["dbg01"] = Node("dbg01", "debug")
    v.nodes["both01"] = Node("both01", "debug", other_partitions=("train",))
    for j in jobs:
        v.set_job(j)
    return v


def job(state: str = "RUNNING", comment: Any = None, **kw: Any) -> Job:
    text = json.dumps({"slurmedic": comment}) if comment is not None else ""
    fields: dict[str, Any] = {"nodes": ("gpu01", "gpu02"), "partition": "train"} | kw
    return Job(id=7, state=state, comment=text, **fields)


def evidence(node: str, signal: str = "nccl_timeout", after: int = 0) -> Evidence:
    return Evidence(
        alertname="NcclTimeout",
        signal=signal,
        node=node,
        job=7,
        fingerprint=f"f-{node}-{after}",
        starts_at=T0 - timedelta(minutes=5) + timedelta(seconds=after),
        received_at=T0,
    )


def ctx(
    attr: Attribution = GPU,
    j: Job | None = None,
    *,
    ev: tuple[Evidence, ...] = (),
    history: tuple[PastAction, ...] = (),
    breaker_open: bool = False,
    v: ClusterView | None = None,
    **policy: Any,
) -> g.Context:
    return g.Context(
        attr=attr,
        job=j,
        evidence=ev,
        view=v if v is not None else view(*([j] if j else [])),
        policy=load_policy(policy),
        guards=GuardState(history=list(history), breaker_open=breaker_open),
        now=T0,
    )


def planned(c: g.Context, action: str, incident: str = "7.0") -> Decision:
    """The plan's decision with `action` for this context."""
    base = Decision(
        at=T0,
        incident=incident,
        job=c.job.id if c.job else None,
        action="none",
        cause=c.attr.cause,
        reason=c.attr.reason,
    )
    return next(d for d in plan(base, c.attr, c.job) if d.action == action)


def summary(out: g.Outcome) -> list[tuple[str, str | None, tuple[str, ...], tuple[str, ...]]]:
    return [(d.action, d.guard, d.nodes, d.exclude) for d in out.decisions]


# ---- the table ------------------------------------------------------------------------------
def test_the_order_is_the_table_the_docs_give() -> None:
    text = DOCS.read_text()
    section = text[text.index("**The guards, in order**") :]
    section = section[: section.index("\n\n", section.index("| stage |"))]
    documented = re.findall(r"^\| `([a-z_]+)` \|", section, flags=re.M)
    assert documented == [name for name, _ in g.PIPELINE]
    assert documented[0] == "moved_on" and documented[-1] == "mode"
    assert documented.index("one_per_action") < documented.index("storm_told")


def test_the_docs_name_every_guard_the_stages_record() -> None:
    after = DOCS.read_text().split("**The guards, in order**")[1]
    section = next(chunk for chunk in after.split("\n\n") if chunk.startswith("| stage |"))
    recorded = set(re.findall(r"\(`([a-z_]+)`\)", section))
    assert recorded == {
        "attempt_moved_on",
        "job_running",
        "out_of_scope",
        "ended_on_purpose",
        "job_completed",
        "ended_before_record",
        "repeated_failure",
        "unseen_restart",
        "no_requeue",
        "asked_not_to_restart",
        "opted_out",
        "not_opted_in",
        "no_room",
        "no_progress",
        "retry_budget_exhausted",
        "already_drained",
        "circuit_breaker_open",
        "global_switch",
        "repeated_without_progress",
        "storm_escalated",
        "repeat_failure",
    }


# ---- each stage alone -----------------------------------------------------------------------
@pytest.mark.parametrize(
    ("state", "base", "kept"),
    [
        ("RUNNING", "", False),
        ("COMPLETING", "RUNNING", False),
        ("FAILED", "", False),
        ("PENDING", "", True),
        # Slurm's own requeue (NODE_FAIL of a --requeue job): attempt 0 still cleans up, and
        # the job is PENDING with attempt 1's restart count (seen on Slurm 26.05).
        ("COMPLETING", "PENDING", True),
    ],
)
def test_moved_on_leaves_a_job_whose_next_attempt_started_alone(
    state: str, base: str, kept: bool
) -> None:
    """Incident 7.0 (attempt 0); Slurm requeued the job by itself: attempt 1 runs or ended (not
    touched), or waits (the requeue adds the exclusions to it)."""
    c = ctx(GPU, job(state, restarts=1, base=base))
    for action in ("requeue", "stop"):
        d = replace(planned(c, "requeue"), action=action)
        out = g.moved_on(d, c)
        if kept:
            assert out == g.Outcome((d,))
        else:
            assert summary(out) == [("none", "attempt_moved_on", (), ())]
            assert out.decisions[0].reason.startswith("attempt 0 of job 7 was requeued without")
    same = ctx(GPU, job(state, restarts=0, base=base))
    assert g.moved_on(planned(same, "requeue"), same) == g.Outcome((planned(same, "requeue"),))
    drain = planned(c, "drain")
    assert g.moved_on(drain, c) == g.Outcome((drain,))


def test_job_running_leaves_a_training_job_alone_and_tells_people() -> None:
    c = ctx(APP, job())
    out = g.job_running(planned(c, "stop"), c)
    assert summary(out) == [("none", "job_running", (), ()), ("escalate", "job_running", (), ())]
    assert out.decisions[0].reason.startswith("job 7 keeps running: an application's GPU error")
    assert out.decisions[0].reason.endswith("XID 13 on gpu01") and out.effects == ()


@pytest.mark.parametrize(
    ("state", "signal"), [("FAILED", "gpu_app"), ("RUNNING", "app_error"), ("RUNNING", "hang")]
)
def test_job_running_lets_a_failure_through(state: str, signal: str) -> None:
    c = ctx(APP, job(state), ev=(evidence("gpu01", signal),))
    d = planned(c, "stop")
    assert g.job_running(d, c) == g.Outcome((d,))


def test_job_running_leaves_other_causes_and_a_job_ended_on_purpose_to_later_stages() -> None:
    c = ctx(GPU, job())
    d = planned(c, "requeue")
    assert g.job_running(d, c) == g.Outcome((d,))
    cancelled = ctx(APP, job("CANCELLED"))
    stop = planned(cancelled, "stop")
    assert g.job_running(stop, cancelled) == g.Outcome((stop,))


def test_scope_refuses_a_job_outside_the_partitions() -> None:
    c = ctx(GPU, job(partition="debug"), scope={"partitions": ["train"]})
    out = g.scope(planned(c, "requeue"), c)
    assert summary(out) == [("none", "out_of_scope", (), ())]
    assert out.decisions[0].reason == "job 7 is outside the policy's partitions; XID 79 on gpu02"


def test_scope_keeps_the_drain_s_nodes_inside_the_partitions() -> None:
    attr = Attribution("gpu_hardware", ("gpu03", "dbg01", "both01", "nosuch"), "four nodes")
    c = ctx(attr, None, scope={"partitions": ["train"]})
    assert summary(g.scope(planned(c, "drain"), c)) == [("drain", None, ("gpu03", "both01"), ())]
    outside = ctx(Attribution("gpu_hardware", ("dbg01",), "x"), None, scope={"partitions": ["a"]})
    out = g.scope(planned(outside, "drain"), outside)
    assert summary(out) == [("none", "out_of_scope", (), ())]
    assert out.decisions[0].reason == "dbg01 is outside the policy's partitions; x"


def test_scope_without_partitions_keeps_everything_of_the_cluster() -> None:
    c = ctx(GPU, job(partition="anything"))
    d = planned(c, "requeue")
    assert g.scope(d, c) == g.Outcome((d,))


@pytest.mark.parametrize(
    ("state", "base", "guard", "why"),
    [
        ("CANCELLED", "", "ended_on_purpose", "job 7 ended CANCELLED"),
        ("COMPLETING", "TIMEOUT", "ended_on_purpose", "job 7 ended TIMEOUT"),
        ("COMPLETED", "", "job_completed", "job 7 completed"),
    ],
)
def test_ended_by_choice_refuses_to_restart_or_stop(
    state: str, base: str, guard: str, why: str
) -> None:
    c = ctx(GPU, job(state, base=base))
    out = g.ended_by_choice(planned(c, "requeue"), c)
    assert summary(out) == [("none", guard, (), ())]
    assert out.decisions[0].reason == f"{why}; XID 79 on gpu02"
    failed = ctx(GPU, job("NODE_FAIL"))
    d = planned(failed, "requeue")
    assert g.ended_by_choice(d, failed) == g.Outcome((d,))


def test_requeue_once_says_where_it_failed_first_the_first_time() -> None:
    c = ctx(UNKNOWN, job("FAILED"), ev=(evidence("gpu02", after=1), evidence("gpu01", after=3)))
    out = g.requeue_once(planned(c, "requeue"), c)
    assert summary(out) == [("requeue", None, (), ())]
    assert out.decisions[0].reason == (
        "job 7 ended with nobody to blame; it failed first on gpu02 (NcclTimeout at "
        "11:55:01Z): requeued once. NCCL timeouts on some ranks"
    )
    assert out.effects == ()  # the retry budget spends the requeue


def test_requeue_once_gives_a_restart_before_the_record_to_a_human() -> None:
    began = T0 - timedelta(minutes=20)
    restarted = job("FAILED", restarts=1, started=began - timedelta(minutes=1))
    c = replace(ctx(UNKNOWN, restarted), guards=GuardState(memory_since=began))
    out = g.requeue_once(planned(c, "requeue"), c)
    assert summary(out) == [("escalate", "unseen_restart", (), ())]
    assert "which began before slurmedic's record does (2026-" in out.decisions[0].reason
    # A first attempt, or a restart inside the record, is requeued once as usual.
    for j in (
        job("FAILED", restarts=0, started=began - timedelta(minutes=1)),
        job("FAILED", restarts=1, started=began + timedelta(minutes=1)),
    ):
        c = replace(ctx(UNKNOWN, j), guards=GuardState(memory_since=began))
        assert summary(g.requeue_once(planned(c, "requeue"), c)) == [("requeue", None, (), ())]


def test_requeue_once_gives_the_second_time_to_a_human_naming_the_node() -> None:
    earlier = PastAction(
        at=T0 - timedelta(hours=1), action="requeue", job=7, nodes=("gpu02",), cause="unknown"
    )
    c = ctx(UNKNOWN, job("FAILED"), ev=(evidence("gpu02"),), history=(earlier,))
    out = g.requeue_once(planned(c, "requeue"), c)
    assert summary(out) == [("escalate", "repeated_failure", ("gpu02",), ())]
    assert "where the last failure began too: gpu02 is implicated" in out.decisions[0].reason
    elsewhere = ctx(UNKNOWN, job("FAILED"), ev=(evidence("gpu01"),), history=(earlier,))
    assert summary(g.requeue_once(planned(elsewhere, "requeue"), elsewhere)) == [
        ("escalate", "repeated_failure", (), ())
    ]


def test_requeue_once_leaves_a_requeue_somebody_is_blamed_for() -> None:
    c = ctx(GPU, job("FAILED"), history=(PastAction(T0, "requeue", 7, cause="unknown"),))
    d = planned(c, "requeue")
    assert g.requeue_once(d, c) == g.Outcome((d,))


def test_no_requeue_refuses_a_job_submitted_with_no_requeue() -> None:
    c = ctx(GPU, job(requeue=False))
    out = g.no_requeue(planned(c, "requeue"), c)
    assert summary(out) == [("none", "no_requeue", (), ())]
    assert out.decisions[0].reason.startswith("job 7 was submitted with --no-requeue; ")


@pytest.mark.parametrize(
    ("state", "code", "codes", "guard"),
    [
        ("FAILED", 93, None, "asked_not_to_restart"),
        ("NODE_FAIL", 93, None, "asked_not_to_restart"),
        ("FAILED", 1, None, None),
        ("FAILED", None, None, None),  # a signal ended it
        ("FAILED", 42, [42, 93], "asked_not_to_restart"),
        ("FAILED", 93, [], None),  # the site turned it off
        ("PENDING", 93, None, None),  # requeued already: its earlier attempt's code
        ("REQUEUE_HOLD", 93, None, "asked_not_to_restart"),  # Slurm's expedited requeue held it
        ("SPECIAL_EXIT", 93, None, "asked_not_to_restart"),  # RequeueExitHold
        ("REQUEUE_HOLD", 1, None, None),  # held after an ordinary failure: released as usual
    ],
)
def test_a_job_that_asks_not_to_be_restarted_is_not_requeued(
    state: str, code: int | None, codes: list[int] | None, guard: str | None
) -> None:
    scope = {"no_restart_exit_codes": codes} if codes is not None else {}
    c = ctx(GPU, job(state, exit_code=code, ended=T0), scope=scope)
    out = g.asked_not_to_restart(planned(c, "requeue"), c)
    assert [d.guard for d in out.decisions] == [guard]
    if guard:
        assert summary(out) == [("none", guard, (), ())]
        assert out.decisions[0].reason.startswith(f"job 7 ended with exit code {code}, ")
    # A drain is never its business.
    assert g.asked_not_to_restart(planned(c, "drain"), c) == g.Outcome((planned(c, "drain"),))


@pytest.mark.parametrize(
    ("comment", "require", "guard"),
    [
        ({"requeue": False}, False, "opted_out"),
        ({"requeue": False}, True, "opted_out"),
        (None, True, "not_opted_in"),
        ({"max_requeues": 1}, True, "not_opted_in"),
        ({"requeue": True}, True, None),
        (None, False, None),
    ],
)
def test_opt_in_out_follows_the_comment_and_the_policy(
    comment: Any, require: bool, guard: str | None
) -> None:
    c = ctx(GPU, job(comment=comment), scope={"require_opt_in": require})
    out = g.opt_in_out(planned(c, "requeue"), c)
    assert [d.guard for d in out.decisions] == [guard]
    assert out.decisions[0].action == ("requeue" if guard is None else "none")


def test_no_progress_stops_a_job_whose_restarts_never_reach_a_checkpoint() -> None:
    stalls = tuple(
        PastAction(T0 - timedelta(minutes=m), "recovery_failed", 7, before_checkpoint=True)
        for m in (30, 10)
    )
    retrying = job("FAILED", comment={"retry_application": True})
    for why in (APP, HANG):
        c = ctx(why, retrying, history=stalls)
        out = g.no_progress(planned(c, "requeue"), c)
        assert summary(out) == [
            ("stop", "no_progress", (), ()),
            ("escalate", "no_progress", (), ()),
        ]
        assert out.decisions[0].reason.startswith("job 7's last 2 restart(s) failed before their")
        one = ctx(why, retrying, history=stalls[:1])
        d = planned(one, "requeue")
        assert g.no_progress(d, one) == g.Outcome((d,))
    # A requeue for a new hardware fault starts the run afresh (a large job meets one every
    # few hours): the failed recovery before it is not counted; a link's or a host's too.
    for cause in ("gpu_hardware", "node_failure", "network"):
        fault = PastAction(T0 - timedelta(minutes=20), "requeue", 7, cause=cause)
        c = ctx(APP, retrying, history=(stalls[0], fault, stalls[1]))
        d = planned(c, "requeue")
        assert g.no_progress(d, c) == g.Outcome((d,)), cause
    # A requeue for a new hardware fault itself is let through, whatever came before.
    for why in (GPU, Attribution("node_failure", ("gpu02",), "gpu02 not responding")):
        c = ctx(why, job(), history=stalls)
        d = planned(c, "requeue")
        assert d.action == "requeue" and g.no_progress(d, c) == g.Outcome((d,))
    # Not a straggler's (a slow rank does not end a restart), nor an application's.
    for cause in ("straggler", "application"):
        other = PastAction(T0 - timedelta(minutes=20), "requeue", 7, cause=cause)
        c = ctx(APP, retrying, history=(stalls[0], other, stalls[1]))
        assert g.no_progress(planned(c, "requeue"), c).decisions[0].action == "stop", cause


def test_retry_budget_spends_a_requeue_it_lets_through() -> None:
    c = ctx(GPU, job())
    d = planned(c, "requeue")
    out = g.retry_budget(d, c)
    assert out.decisions == (d,) and d.exclude == ("gpu02",)
    assert out.effects == (
        Counted(
            PastAction(
                at=T0,
                action="requeue",
                job=7,
                exclude=("gpu02",),
                cause="gpu_hardware",
                incident="7.0",
            )
        ),
    )


def test_retry_budget_remembers_where_a_blameless_failure_began() -> None:
    c = ctx(UNKNOWN, job("FAILED"), ev=(evidence("gpu01", after=2), evidence("gpu02", after=9)))
    (spent,) = g.retry_budget(planned(c, "requeue"), c).effects
    assert isinstance(spent, Counted) and spent.action.nodes == ("gpu01",)


def test_retry_budget_stops_a_crash_loop() -> None:
    # The same failure again with nothing taken out of the job's reach: its own budget.
    used = tuple(
        PastAction(T0 - timedelta(hours=h), "requeue", 7, cause="application") for h in (1, 2, 30)
    )
    retrying = job("FAILED", comment={"retry_application": True})
    c = ctx(APP, retrying, history=used, retry_budget={"max_requeues": 2})
    out = g.retry_budget(planned(c, "requeue"), c)
    assert summary(out) == [
        ("stop", "retry_budget_exhausted", (), ()),
        ("escalate", "retry_budget_exhausted", (), ()),
    ]
    assert out.decisions[0].reason == (
        "job 7 was requeued 2 time(s) with nothing taken out of its reach in the last 86400s "
        "(budget 2); XID 13 on gpu01"
    )
    assert out.effects == ()
    # A hang's requeues remove nothing either.
    hangs = tuple(PastAction(T0 - timedelta(hours=h), "requeue", 7, cause="hang") for h in (1, 2))
    c = ctx(HANG, job(), history=hangs, retry_budget={"max_requeues": 2})
    assert summary(g.retry_budget(planned(c, "requeue"), c))[0][:2] == (
        "stop",
        "retry_budget_exhausted",
    )


def test_a_crash_loop_of_a_large_job_is_stopped_all_the_same() -> None:
    # A 1,920-node job may meet 21 hardware faults a day, not 4 crashes of its own code.
    big = job("FAILED", comment={"retry_application": True}, nodes=NODES_1920)
    used = tuple(
        PastAction(T0 - timedelta(hours=h), "requeue", 7, cause="application") for h in (1, 2, 3)
    )
    c = ctx(APP, big, history=used)
    assert summary(g.retry_budget(planned(c, "requeue"), c))[0][:2] == (
        "stop",
        "retry_budget_exhausted",
    )


def gpu_faults(n: int, start: int = 0) -> tuple[PastAction, ...]:
    """n requeues for GPU faults within the last day, each away from a node of its own."""
    return tuple(
        PastAction(
            T0 - timedelta(minutes=60 * (i + 1)),
            "requeue",
            7,
            exclude=(f"gpu{start + i:04}",),
            cause="gpu_hardware",
            incident=f"7.{i}",
        )
        for i in range(n)
    )


NODES_1920 = tuple(f"gpu{i:04}" for i in range(1, 1921))


def test_a_large_job_is_not_stopped_for_its_independent_gpu_faults() -> None:
    # A 1,920-node job expects 7.3 failures a day at 3.8 per 1,000 node-days: its 8th GPU
    # fault of the day (each requeue excluded a new node) is requeued, not stopped.
    big = job(nodes=NODES_1920)
    c = ctx(GPU, big, history=gpu_faults(7))
    d = planned(c, "requeue")
    assert g.retry_budget(d, c).decisions == (d,)
    # Bounded by what its size explains: three times that, 21 a day.
    assert load_policy({}).hardware_requeues(1920) == 21
    c = ctx(GPU, big, history=gpu_faults(20))
    assert g.retry_budget(planned(c, "requeue"), c).decisions == (d,)
    c = ctx(GPU, big, history=gpu_faults(21))
    out = g.retry_budget(planned(c, "requeue"), c)
    assert summary(out)[0][:2] == ("stop", "retry_budget_exhausted")
    assert out.decisions[0].reason == (
        "job 7 was requeued 21 time(s) away from its failures' nodes in the last 86400s "
        "(budget 21: 3 x the 7.3 failures 1920 nodes expect at 3.8 per 1,000 node-days); "
        "XID 79 on gpu02"
    )
    # Its crashes do not spend what its GPU faults need, nor the other way round.
    crashes = tuple(
        PastAction(T0 - timedelta(hours=h), "requeue", 7, cause="application") for h in (1, 2, 3)
    )
    c = ctx(GPU, big, history=crashes + gpu_faults(7))
    assert g.retry_budget(planned(c, "requeue"), c).decisions == (d,)


def test_a_small_job_that_meets_hardware_faults_abnormally_often_is_stopped() -> None:
    # Two nodes expect 0.008 failures a day: the fourth in a day, each on a node taken out of
    # its reach, is not chance (a job that trips what it runs on). The budget is max_requeues.
    c = ctx(GPU, job(), history=gpu_faults(2))
    d = planned(c, "requeue")
    assert g.retry_budget(d, c).decisions == (d,)
    c = ctx(GPU, job(), history=gpu_faults(3))
    out = g.retry_budget(planned(c, "requeue"), c)
    assert summary(out)[0][:2] == ("stop", "retry_budget_exhausted")
    assert out.decisions[0].reason == (
        "job 7 was requeued 3 time(s) away from its failures' nodes in the last 86400s "
        "(budget 3); XID 79 on gpu02"
    )


def test_the_hardware_budget_scales_with_the_job_and_the_policy() -> None:
    policy = load_policy({})
    assert policy.failure_rate == 3.8 and policy.retry_budget.hardware_headroom == 3
    sizes = {8: 3, 64: 3, 256: 3, 512: 5, 1024: 11, 1920: 21, 2048: 23}
    assert {n: policy.hardware_requeues(n) for n in sizes} == sizes
    # A week's window, a higher rate, more headroom; never under max_requeues.
    week = load_policy({"retry_budget": {"window": "7d", "max_requeues": 5}, "failure_rate": 6.5})
    assert week.hardware_requeues(8) == 5 and week.hardware_requeues(1024) == 139
    assert load_policy({"failure_rate": 0}).hardware_requeues(2048) == 3
    assert load_policy({"retry_budget": {"hardware_headroom": 1}}).hardware_requeues(1920) == 7
    # max_hardware_requeues: a fixed budget whatever the size (old files keep their meaning).
    fixed = load_policy({"retry_budget": {"max_hardware_requeues": 4}})
    assert fixed.hardware_requeues(8) == 4 and fixed.hardware_requeues(1920) == 4
    with pytest.raises(PolicyError, match="failure_rate"):
        load_policy({"failure_rate": -1})


def test_a_requeue_that_excludes_nodes_removes_them_whatever_its_cause() -> None:
    assert removes("gpu_hardware", ("gpu02",)) and removes(SHARED, ("gpu01", "gpu02"))
    assert removes("node_failure", ())  # the owner's list holds the node already
    assert removes("application", ("gpu02",))  # e.g. a GPU its faults point at, drained
    assert not removes("application", ()) and not removes("hang", ()) and not removes("", ())


def test_the_requeue_for_a_failed_recovery_spends_the_budget_once() -> None:
    # 7.0 was requeued; the recovery check found its successor, 7.1, failed. The requeue now
    # decided for 7.1's failure counts that failure: one short of the budget is not out of it.
    # (The job's own failures: a crash retried, and its successor's failed recovery.)
    retrying = job("FAILED", comment={"retry_application": True})
    spent = (
        PastAction(T0 - timedelta(hours=1), "requeue", 7, incident="7.0"),
        PastAction(T0 - timedelta(minutes=10), "recovery_failed", 7, incident="verify:7.0"),
    )
    c = ctx(APP, retrying, history=spent, retry_budget={"max_requeues": 2})
    d = planned(c, "requeue", incident="7.1")
    assert g.retry_budget(d, c).decisions == (d,)
    # A later attempt's requeue is another failure (7.1's was never requeued by slurmedic).
    later = ctx(APP, retrying, history=spent, retry_budget={"max_requeues": 2})
    assert summary(g.retry_budget(planned(later, "requeue", "7.2"), later))[0][:2] == (
        "stop",
        "retry_budget_exhausted",
    )


def test_hardware_requeues_have_a_budget_of_their_own() -> None:
    # A crash loop spent the job's budget; then a GPU fault: requeued away from its node.
    crashes = tuple(
        PastAction(T0 - timedelta(hours=h), "requeue", 7, cause="application") for h in (1, 2)
    )
    faults = tuple(
        PastAction(T0 - timedelta(hours=h), "requeue", 7, exclude=(n,), cause=c)
        for h, c, n in (
            (3, "gpu_hardware", "gpu05"),
            (4, "node_failure", "gpu06"),
            (5, "network", "gpu07"),
        )
    )
    for budget in ({"max_requeues": 2}, {"max_requeues": 2, "max_hardware_requeues": 3}):
        c = ctx(GPU, job(), history=crashes, retry_budget=budget)
        d = planned(c, "requeue")
        assert g.retry_budget(d, c).decisions == (d,)
    apart = {"max_requeues": 2, "max_hardware_requeues": 3}
    # Each budget still holds: the fourth hardware requeue, the third of the job's own.
    c = ctx(GPU, job(), history=crashes + faults, retry_budget=apart)
    out = g.retry_budget(planned(c, "requeue"), c)
    assert out.decisions[0].action == "stop"
    assert out.decisions[0].reason.startswith(
        "job 7 was requeued 3 time(s) away from its failures' nodes in the last 86400s (budget 3)"
    )
    retrying = job("FAILED", comment={"retry_application": True})
    c = ctx(APP, retrying, history=crashes + faults, retry_budget=apart)
    out = g.retry_budget(planned(c, "requeue"), c)
    assert out.decisions[0].reason.startswith(
        "job 7 was requeued 2 time(s) with nothing taken out of its reach in the last 86400s "
        "(budget 2)"
    )
    # A failed recovery is the job's own failure, whatever the cause of the requeue it judged.
    failed = PastAction(T0 - timedelta(minutes=5), "recovery_failed", 7, cause="gpu_hardware")
    c = ctx(APP, retrying, history=(crashes[0], *faults, failed), retry_budget=apart)
    assert summary(g.retry_budget(planned(c, "requeue"), c))[0][0] == "stop"
    # The job's own budget holds for both together: it asks for fewer in all, never for more.
    asking = job(comment={"max_requeues": 3})
    for budget in (apart, {}):
        c = ctx(GPU, asking, history=(*crashes, faults[0]), retry_budget=budget)
        out = g.retry_budget(planned(c, "requeue"), c)
        assert out.decisions[0].action == "stop"
        assert out.decisions[0].reason.startswith(
            "job 7 was requeued 3 time(s) in the last 86400s (its own budget 3)"
        )
        c = ctx(GPU, asking, history=crashes, retry_budget=budget)
        d = planned(c, "requeue")
        assert g.retry_budget(d, c).decisions == (d,)
    # Also a large job's: its comment caps its GPU faults' requeues too.
    big = job(comment={"max_requeues": 5}, nodes=NODES_1920)
    c = ctx(GPU, big, history=gpu_faults(5))
    assert summary(g.retry_budget(planned(c, "requeue"), c))[0][:2] == (
        "stop",
        "retry_budget_exhausted",
    )


def test_a_comment_lowers_the_budget_and_never_raises_it() -> None:
    used = (PastAction(T0 - timedelta(hours=1), "requeue", 7),)
    lower = ctx(GPU, job(comment={"max_requeues": 1}), history=used)
    assert summary(g.retry_budget(planned(lower, "requeue"), lower))[0][:2] == (
        "stop",
        "retry_budget_exhausted",
    )
    higher = ctx(GPU, job(comment={"max_requeues": 9}), history=gpu_faults(3))
    assert summary(g.retry_budget(planned(higher, "requeue"), higher))[0][:2] == (
        "stop",
        "retry_budget_exhausted",
    )
    looping = job("FAILED", comment={"max_requeues": 9, "retry_application": True})
    higher = ctx(APP, looping, history=used * 3)
    assert summary(g.retry_budget(planned(higher, "requeue"), higher))[0][:2] == (
        "stop",
        "retry_budget_exhausted",
    )


def test_already_drained_refuses_a_drain_of_drained_nodes_only() -> None:
    attr = Attribution("gpu_hardware", ("gpu02", "gpu03"), "x")
    c = ctx(attr, v=view(drained=("gpu02", "gpu03")))
    out = g.already_drained(planned(c, "drain"), c)
    assert summary(out) == [("none", "already_drained", (), ())]
    assert out.decisions[0].reason == "gpu02, gpu03 is already drained; x"
    half = ctx(attr, v=view(drained=("gpu02",)))
    d = planned(half, "drain")
    assert g.already_drained(d, half) == g.Outcome((d,))


def test_the_breaker_counts_a_drain_it_lets_through() -> None:
    c = ctx(GPU, job())
    d = planned(c, "drain")
    out = g.breaker(d, c)
    assert out.decisions == (d,)
    drained = PastAction(T0, "drain", nodes=("gpu02",), cause="gpu_hardware", incident="7.0")
    assert out.effects == (Counted(drained),)


def test_past_its_limit_the_breaker_opens_and_drains_become_escalations() -> None:
    # 12 nodes, 10%: at most 2 in the window; gpu05 and gpu06 are drained already.
    recent = PastAction(T0 - timedelta(minutes=10), "drain", nodes=("gpu05", "gpu06"))
    c = ctx(GPU, job(), history=(recent,))
    out = g.breaker(planned(c, "drain"), c)
    assert summary(out) == [("escalate", "circuit_breaker_open", ("gpu02",), ())]
    assert out.decisions[0].reason.startswith("Draining gpu02 would pass the breaker's 2 node(s)")
    assert out.effects == (BreakerOpened(),)
    old = replace(recent, at=T0 - timedelta(hours=2))
    past_window = ctx(GPU, job(), history=(old,))
    assert summary(g.breaker(planned(past_window, "drain"), past_window))[0][0] == "drain"


def test_an_open_breaker_escalates_every_drain_and_opens_nothing_more() -> None:
    c = ctx(GPU, job(), breaker_open=True)
    out = g.breaker(planned(c, "drain"), c)
    assert summary(out) == [("escalate", "circuit_breaker_open", ("gpu02",), ())]
    assert out.effects == ()


def test_one_per_action_keeps_the_first_of_each() -> None:
    c = ctx(GPU, job())
    first = replace(planned(c, "drain"), action="escalate", guard="circuit_breaker_open")
    second = replace(first, guard="retry_budget_exhausted")
    stop = replace(second, action="stop")
    assert g.one_per_action([first, stop, second], c) == g.Outcome((first, stop))


def test_mode_gives_each_action_its_mode_and_first_state() -> None:
    c = ctx(GPU, job(), mode="approve", actions={"drain": "enforce"})
    drain, requeue = planned(c, "drain"), planned(c, "requeue")
    assert [(d.mode, d.state) for d in g.mode(drain, c).decisions] == [("enforce", "pending")]
    assert [(d.mode, d.state) for d in g.mode(requeue, c).decisions] == [
        ("approve", "awaiting_approval")
    ]
    refused = replace(requeue, action="none", guard="no_requeue")
    assert [d.state for d in g.mode(refused, c).decisions] == ["recorded"]
    # An escalation changes nothing in Slurm and is itself the hand-over to a human: it is
    # carried out at once (its notice says "needs a human", not "waits for approval").
    escalate = replace(requeue, action="escalate", guard="retry_budget_exhausted")
    assert [(d.mode, d.state) for d in g.mode(escalate, c).decisions] == [("approve", "pending")]


def test_mode_takes_the_partition_s_modes_first() -> None:
    policy = {
        "mode": "approve",
        "partitions": {"train": {"actions": {"drain": "enforce"}}, "debug": {"mode": "monitor"}},
    }
    c = ctx(GPU, job(), **policy)
    drain, requeue = planned(c, "drain"), planned(c, "requeue")
    assert [(d.mode, d.partition) for d in g.mode(drain, c).decisions] == [("enforce", "train")]
    assert [(d.mode, d.partition) for d in g.mode(requeue, c).decisions] == [("approve", "train")]
    # An idle node takes its only partition's modes; one that serves two, the policy's.
    for node, want in (("dbg01", ("monitor", "debug")), ("both01", ("approve", None))):
        idle = ctx(GPU, None, ev=(evidence(node, "gpu_hw"),), **policy)
        d = replace(drain, job=None, nodes=(node,))
        assert [(x.mode, x.partition) for x in g.mode(d, idle).decisions] == [want]


def test_the_global_switch_makes_every_decision_a_record_and_says_so() -> None:
    c = ctx(GPU, job(), mode="enforce")
    c = replace(c, guards=GuardState(monitor_forced=True))
    (d,) = g.mode(planned(c, "drain"), c).decisions
    assert (d.mode, d.state, d.guard) == ("monitor", "recorded", "global_switch")
    assert "the global switch holds every action in monitor mode (policy: enforce)" in d.reason
    quiet = ctx(GPU, job(), mode="monitor")
    quiet = replace(quiet, guards=GuardState(monitor_forced=True))
    assert g.mode(planned(quiet, "drain"), quiet).decisions[0].guard is None


def test_a_decision_a_guard_changed_passes_every_later_guard_unchanged() -> None:
    used = tuple(PastAction(T0 - timedelta(hours=h), "requeue", 7) for h in (1, 2, 3))
    c = ctx(
        GPU,
        job("CANCELLED", requeue=False, comment={"requeue": False}),
        history=used,
        breaker_open=True,
        scope={"partitions": ["debug"]},
    )
    for action in ("requeue", "drain"):
        for guard in ("out_of_scope", "job_running", "retry_budget_exhausted"):
            changed = replace(planned(c, action), guard=guard)
            for name, stage in g.PIPELINE[:-2]:
                assert stage([changed], c) == g.Outcome((changed,)), name


# ---- the whole pipeline ---------------------------------------------------------------------
def test_decide_returns_the_effects_and_changes_no_guard_state() -> None:
    j = job()
    before = GuardState(history=[PastAction(T0 - timedelta(hours=1), "requeue", 7)])
    memory = copy.deepcopy(before)
    out = g.decide(
        incident="7.0",
        attr=GPU,
        job=j,
        evidence=[evidence("gpu02", "gpu_hw")],
        view=view(j),
        policy=load_policy({}),
        guards=before,
        now=T0,
    )
    assert before == memory
    assert summary(out) == [("drain", None, ("gpu02",), ()), ("requeue", None, (), ("gpu02",))]
    assert [(e.action.action, e.action.job) for e in out.effects if isinstance(e, Counted)] == [
        ("requeue", 7),
        ("drain", None),
    ]
    before.apply(out.effects)
    assert before.requeues(7, T0 - timedelta(days=1)) == 2 and before.drained(T0) == {"gpu02"}


def test_applying_a_breaker_opening_opens_it() -> None:
    state = GuardState()
    state.apply([BreakerOpened()])
    assert state.breaker_open and state.history == []


def test_the_engine_applies_a_decision_s_effects_to_its_guards() -> None:
    j = job()
    e = Engine(view=view(j), policy=load_policy({"settle_seconds": 5}))
    labels = {"alertname": "XidFault", "signal": "gpu_hw", "node": "gpu02", "slurm_job_id": "7"}
    e.receive(wrap([Alert(status="firing", startsAt=T0, labels=labels)]), T0)
    made = e.tick(T0 + timedelta(seconds=5))
    assert {d.action for d in made} == {"drain", "requeue"}
    assert sorted((h.action, h.incident) for h in e.guards.history) == [
        ("drain", "7.0"),
        ("requeue", "7.0"),
    ]


# ---- Job's states: one home ----------------------------------------------------------------
@pytest.mark.parametrize(
    ("state", "base", "flags"),
    [
        ("RUNNING", "", {"active"}),
        ("COMPLETING", "CANCELLED", {"active", "ended_on_purpose"}),
        ("COMPLETING", "NODE_FAIL", {"active", "failed"}),
        ("COMPLETING", "PENDING", {"active", "waiting"}),
        ("PENDING", "", {"waiting"}),
        ("REQUEUED", "", {"has_ended", "waiting"}),
        ("COMPLETED", "", {"has_ended", "completed"}),
        ("FAILED", "", {"has_ended", "interrupted", "failed"}),
        ("NODE_FAIL", "", {"has_ended", "interrupted", "failed"}),
        ("TIMEOUT", "", {"has_ended", "interrupted", "ended_on_purpose"}),
        ("CANCELLED", "", {"has_ended", "interrupted", "ended_on_purpose"}),
    ],
)
def test_a_job_s_state_says_what_it_is(state: str, base: str, flags: set[str]) -> None:
    j = Job(id=1, nodes=(), state=state, base=base)
    names = (
        *("active", "waiting", "has_ended", "interrupted", "failed", "ended_on_purpose"),
        "completed",
    )
    assert {n for n in names if getattr(j, n)} == flags


def test_readmit_takes_back_what_earlier_requeues_excluded_once_in_service() -> None:
    """Job 7's earlier requeues excluded gpu03 (drained, in service again), gpu04 (still
    drained), gpu05 (drained, not answering), gpu02 (implicated again), gpu99 (gone) and gpu06
    (off a failing switch, never drained): the requeue readmits gpu03 only."""
    drained = ("gpu03", "gpu04", "gpu05", "gpu02", "gpu99")
    day = T0 - timedelta(days=1)
    earlier = (
        PastAction(day, "drain", 7, nodes=drained, cause="gpu_hardware", incident="7.0"),
        PastAction(day, "requeue", 7, exclude=drained, cause="gpu_hardware", incident="7.0"),
        PastAction(T0 - timedelta(hours=2), "requeue", 7, exclude=("gpu06",), cause=SHARED),
    )
    v = view(job("FAILED"), drained=("gpu04",))
    v.nodes["gpu05"] = replace(v.nodes["gpu05"], status="allocated*")
    c = ctx(GPU, job("FAILED"), history=earlier, v=v, mode="enforce")
    (d,) = g.readmit(planned(c, "requeue"), c).decisions
    assert (d.action, d.guard, d.exclude, d.readmit) == ("requeue", None, ("gpu02",), ("gpu03",))
    assert d.reason.endswith("; readmits gpu03 (drained and excluded before, in service again)")
    fresh = ctx(GPU, job("FAILED"), mode="enforce")
    assert g.readmit(planned(fresh, "requeue"), fresh) == g.Outcome((planned(fresh, "requeue"),))
    drain = planned(c, "drain")
    assert g.readmit(drain, c) == g.Outcome((drain,))
    # Drains the policy only records never took gpu03 out: in service says nothing of a repair.
    watched = replace(c, policy=load_policy({"mode": "enforce", "actions": {"drain": "monitor"}}))
    (kept,) = g.readmit(planned(watched, "requeue"), watched).decisions
    assert kept.readmit == ()


@pytest.mark.parametrize(
    ("history", "readmitted"),
    [
        # Drained for one failure (incident 9.0), excluded off a switch later (7.1): the
        # exclusion was not for the drain.
        (
            (
                PastAction(T0 - timedelta(days=3), "drain", 9, nodes=("gpu03",), incident="9.0"),
                PastAction(
                    T0 - timedelta(days=1), "requeue", 7, exclude=("gpu03",), incident="7.1"
                ),
            ),
            set(),
        ),
        # Drained and excluded (7.0), resumed, then drained again for a new failure (node
        # incident): the new drain is not carried out yet, or failed.
        (
            (
                PastAction(T0 - timedelta(days=3), "drain", 7, nodes=("gpu03",), incident="7.0"),
                PastAction(
                    T0 - timedelta(days=3), "requeue", 7, exclude=("gpu03",), incident="7.0"
                ),
                PastAction(
                    T0 - timedelta(hours=1), "drain", nodes=("gpu03",), incident="node:gpu03"
                ),
            ),
            set(),
        ),
        # ... that drain is a day old: it ran (or expired), and gpu03 is back since.
        (
            (
                PastAction(T0 - timedelta(days=3), "drain", 7, nodes=("gpu03",), incident="7.0"),
                PastAction(
                    T0 - timedelta(days=3), "requeue", 7, exclude=("gpu03",), incident="7.0"
                ),
                PastAction(
                    T0 - timedelta(days=1), "drain", nodes=("gpu03",), incident="node:gpu03"
                ),
            ),
            {"gpu03"},
        ),
        # Readmitted by a later requeue (7.1): not excluded any more.
        (
            (
                PastAction(T0 - timedelta(days=3), "drain", 7, nodes=("gpu03",), incident="7.0"),
                PastAction(
                    T0 - timedelta(days=3), "requeue", 7, exclude=("gpu03",), incident="7.0"
                ),
                PastAction(
                    T0 - timedelta(days=1), "requeue", 7, readmit=("gpu03",), incident="7.1"
                ),
            ),
            set(),
        ),
        # ... and excluded again, with its drain, by 7.2.
        (
            (
                PastAction(T0 - timedelta(days=3), "drain", 7, nodes=("gpu03",), incident="7.0"),
                PastAction(
                    T0 - timedelta(days=3), "requeue", 7, exclude=("gpu03",), incident="7.0"
                ),
                PastAction(
                    T0 - timedelta(days=1), "requeue", 7, readmit=("gpu03",), incident="7.1"
                ),
                PastAction(T0 - timedelta(hours=5), "drain", 7, nodes=("gpu03",), incident="7.2"),
                PastAction(
                    T0 - timedelta(hours=5), "requeue", 7, exclude=("gpu03",), incident="7.2"
                ),
            ),
            {"gpu03"},
        ),
    ],
)
def test_readmit_takes_back_only_what_its_own_drain_took_out(
    history: tuple[PastAction, ...], readmitted: set[str]
) -> None:
    settled = T0 - timedelta(hours=4)
    drained, _ = GuardState(history=list(history)).readmittable(7, settled, settled)
    assert drained == readmitted


def test_a_rejected_drain_stops_counting_but_its_requeue_s_exclusion_is_still_readmitted() -> None:
    # drain: approve, requeue: enforce. The requeue ran, excluding gpu07; a person rejected the
    # drain (the node is fine). The breaker stops counting it; the exclusion is taken back.
    drain = PastAction(
        T0 - timedelta(hours=5), "drain", 7, nodes=("gpu07",), incident="7.0", held=True
    )
    ran = PastAction(T0 - timedelta(hours=5), "requeue", 7, exclude=("gpu07",), incident="7.0")
    state = GuardState(history=[drain, ran])
    settled = T0 - timedelta(hours=4)
    assert set(state.drained(T0 - timedelta(hours=6))) == {"gpu07"}
    state.settle({("7.0", "drain", drain.at): REJECTED})
    assert set(state.drained(T0 - timedelta(hours=6))) == set()
    assert state.readmittable(7, settled, settled)[0] == {"gpu07"}
    assert state.requeues(7, T0 - timedelta(hours=6)) == 1
    # A rejected requeue excluded nothing and spends nothing.
    state.settle({("7.0", "requeue", ran.at): REJECTED})
    assert state.excluded(7) == set() and state.requeues(7, T0 - timedelta(hours=6)) == 0


@pytest.mark.parametrize(
    ("became", "counted", "readmitted"),
    [
        (None, {"gpu07"}, set()),  # still waiting: in service because it has not run
        (EXECUTED, {"gpu07"}, {"gpu07"}),  # it ran: in service again, someone resumed it
        (REJECTED, set(), {"gpu07"}),  # a person looked: the node is fine
        (EXPIRED, set(), set()),  # nobody looked
        (RECORDED, {"gpu07"}, set()),  # the global switch made it a record: never ran
        (FAILED, {"gpu07"}, set()),  # its run failed: the node was never taken out
    ],
)
def test_a_drain_that_waited_for_approval_readmits_only_once_run_or_rejected(
    became: str | None, counted: set[str], readmitted: set[str]
) -> None:
    drain = PastAction(
        T0 - timedelta(hours=5), "drain", 7, nodes=("gpu07",), incident="7.0", held=True
    )
    ran = PastAction(T0 - timedelta(hours=5), "requeue", 7, exclude=("gpu07",), incident="7.0")
    state = GuardState(history=[drain, ran])
    if became is not None:
        state.settle({("7.0", "drain", drain.at): became})
    settled = T0 - timedelta(hours=4)
    assert set(state.drained(T0 - timedelta(hours=6))) == counted
    assert state.readmittable(7, settled, settled)[0] == readmitted


def test_a_later_drain_that_ran_readmits_a_node_whose_own_drain_expired() -> None:
    """7.0's drain of gpu07 expired (nobody looked), but a later failure's drain of it ran a day
    ago, and gpu07 is back in service since: repaired, it is taken back."""
    history = [
        PastAction(
            T0 - timedelta(days=3),
            "drain",
            7,
            nodes=("gpu07",),
            incident="7.0",
            held=True,
            undone=True,
        ),
        PastAction(T0 - timedelta(days=3), "requeue", 7, exclude=("gpu07",), incident="7.0"),
        PastAction(T0 - timedelta(days=1), "drain", nodes=("gpu07",), incident="node:gpu07"),
    ]
    settled = T0 - timedelta(hours=4)
    assert GuardState(history=history).readmittable(7, settled, settled)[0] == {"gpu07"}
    younger = [*history[:2], replace(history[2], at=T0 - timedelta(hours=1))]
    assert GuardState(history=younger).readmittable(7, settled, settled)[0] == set()


def test_a_later_drain_nobody_approved_keeps_the_node_excluded() -> None:
    """gpu07 was drained (ran) and excluded by 7.0, then, after its repair, drained again for
    another failure (node:gpu07), a drain that expired unapproved a day ago: nobody looked at
    that failure, so neither exclusion is taken back (the time alone said it ran)."""
    history = [
        PastAction(T0 - timedelta(days=3), "drain", 7, nodes=("gpu07",), incident="7.0"),
        PastAction(T0 - timedelta(days=3), "requeue", 7, exclude=("gpu07",), incident="7.0"),
        PastAction(
            T0 - timedelta(days=3),
            "requeue",
            8,
            exclude=("gpu07",),
            incident="8.0",
            cause=SHARED,
        ),
        PastAction(
            T0 - timedelta(days=1), "drain", nodes=("gpu07",), incident="node:gpu07", held=True
        ),
    ]
    state = GuardState(history=history)
    settled = T0 - timedelta(hours=4)
    assert state.readmittable(7, settled, settled)[0] == set()
    assert state.readmittable(8, settled, settled)[1] == set()
    state.settle({("node:gpu07", "drain", history[-1].at): EXPIRED})
    assert state.readmittable(7, settled, settled)[0] == set()
    assert state.readmittable(8, settled, settled)[1] == set()
    state.settle({("node:gpu07", "drain", history[-1].at): REJECTED})
    assert state.readmittable(7, settled, settled)[0] == {"gpu07"}
    assert state.readmittable(8, settled, settled)[1] == {"gpu07"}


def test_the_actions_of_decisions_waiting_for_approval_are_counted_held() -> None:
    j = job()
    out = g.decide(
        incident="7.0",
        attr=GPU,
        job=j,
        evidence=[evidence("gpu02", "gpu_hw")],
        view=view(j),
        policy=load_policy({"mode": "enforce", "actions": {"drain": "approve"}}),
        guards=GuardState(),
        now=T0,
    )
    held = {e.action.action: e.action.held for e in out.effects if isinstance(e, Counted)}
    assert held == {"drain": True, "requeue": False}
    # While the global switch is on, every decision is a record: what it counts is held.
    out = g.decide(
        incident="7.0",
        attr=GPU,
        job=j,
        evidence=[evidence("gpu02", "gpu_hw")],
        view=view(j),
        policy=load_policy({"mode": "enforce"}),
        guards=GuardState(monitor_forced=True),
        now=T0,
    )
    assert {d.guard for d in out.decisions} == {"global_switch"}
    held = {e.action.action: e.action.held for e in out.effects if isinstance(e, Counted)}
    assert held == {"drain": True, "requeue": True}


def test_room_counts_the_nodes_a_requeue_readmits() -> None:
    """A requeue away from a switch, off gpu01-02, for a job whose earlier requeues excluded
    gpu03-10 after draining them: all in service again, so the job fits once they are
    readmitted, and not before."""
    off = tuple(f"gpu{i:02}" for i in range(3, 11))
    earlier = (
        PastAction(T0 - timedelta(days=1), "drain", 7, nodes=off),
        PastAction(T0 - timedelta(days=1), "requeue", 7, exclude=off),
    )
    c = ctx(GPU, job("FAILED"), history=earlier, mode="enforce")
    away = replace(planned(c, "requeue"), cause=SHARED, exclude=("gpu01", "gpu02"))
    assert summary(g.room(away, c)) == [("none", "no_room", (), ())]
    (readmitted,) = g.readmit(away, c).decisions
    assert readmitted.readmit == off
    assert g.room(readmitted, c) == g.Outcome((readmitted,))


def test_a_requeue_leaves_the_owner_s_exclusions_to_slurm_and_never_readmits_them() -> None:
    """Job 7 was submitted with `--exclude=gpu05,gpu09` and requeued off gpu03's switch
    (gpu03, gpu05) 25 hours ago: gpu05 was its owner's already, gpu03 slurmedic's."""
    owner = job("FAILED", excluded=frozenset({"gpu05", "gpu09"}))
    off = replace(planned(ctx(GPU, owner), "requeue"), cause=SHARED, exclude=("gpu03", "gpu05"))
    c = ctx(GPU, owner)
    (d,) = g.owners_exclusions(off, c).decisions
    assert (d.action, d.guard, d.exclude) == ("requeue", None, ("gpu03",))
    assert d.reason.endswith("; gpu05 excluded by the job's own list already")
    # What slurmedic excluded itself is its own, also once Slurm's list shows it.
    earlier = (PastAction(T0 - timedelta(hours=25), "requeue", 7, exclude=d.exclude, cause=SHARED),)
    shown = replace(owner, excluded=owner.excluded | {"gpu03"})
    again = ctx(GPU, shown, history=earlier)
    assert g.owners_exclusions(off, again).decisions[0].exclude == ("gpu03",)
    # A day on, the switch's time has passed: slurmedic readmits gpu03, never gpu05.
    (back,) = g.readmit(planned(again, "requeue"), again).decisions
    assert back.readmit == ("gpu03",)
    # Readmitted, gpu03 is still in the list the view read before the requeue ran: it is not
    # the owner's for that, and a new requeue off it excludes it again.
    readmitted = (*earlier, PastAction(T0, "requeue", 7, readmit=("gpu03",), cause=SHARED))
    stale = ctx(GPU, shown, history=readmitted)
    assert stale.guards.excluded(7) == set()
    assert g.owners_exclusions(off, stale).decisions[0].exclude == ("gpu03",)
    # Without the owner's list (a view that does not read it), nothing changes.
    assert g.owners_exclusions(off, ctx(GPU, job("FAILED"))) == g.Outcome((off,))


def test_room_counts_the_owner_s_exclusions() -> None:
    """A requeue away from gpu01-02's switch: the owner excluded gpu03-10, so one node of the
    partition (both01) is left for a 2-node job."""
    owner = job("FAILED", excluded=frozenset(f"gpu{i:02}" for i in range(3, 11)))
    c = ctx(GPU, owner)
    away = replace(planned(c, "requeue"), cause=SHARED, exclude=("gpu01", "gpu02"))
    assert summary(g.room(away, c)) == [("none", "no_room", (), ())]
    assert (
        g.room(away, c)
        .decisions[0]
        .reason.startswith(
            "job 7 needs 2 node(s); partition train has 1 free or its own in service off the"
            " failing switch and"
            " its own excluded nodes (gpu03, gpu04, gpu05, gpu06, gpu07 and 3 more);"
        )
    )
    fewer = ctx(GPU, replace(owner, excluded=frozenset({"gpu03"})))
    assert g.room(away, fewer) == g.Outcome((away,))


@pytest.mark.parametrize(
    ("state", "base", "ended", "refused"),
    [
        ("FAILED", "", -30, True),
        ("COMPLETING", "FAILED", -30, True),  # still completing: Slurm has its end time
        ("NODE_FAIL", "", -30, True),
        ("FAILED", "", 30, False),  # it failed after the record begins
        ("PENDING", "", -30, False),  # requeued since: it waits again
    ],
)
def test_ended_before_record_refuses_a_requeue_of_a_job_that_ended_before_it(
    state: str, base: str, ended: int, refused: bool
) -> None:
    j = job(state, base=base, ended=T0 + timedelta(seconds=ended))
    c = replace(ctx(GPU, j), guards=GuardState(memory_since=T0))
    d = planned(c, "requeue")
    out = g.ended_before_record(d, c)
    if not refused:
        assert out == g.Outcome((d,))
        return
    assert summary(out) == [("escalate", "ended_before_record", (), ())]
    assert out.decisions[0].reason.startswith(f"job 7 ended {state} at 2026-12-01 11:59:30Z")
    replay = ctx(GPU, j)  # no record's beginning (a replay): nothing is refused
    assert g.ended_before_record(planned(replay, "requeue"), replay) == g.Outcome(
        (planned(replay, "requeue"),)
    )


def test_ended_before_record_keeps_what_a_shared_cause_says() -> None:
    attr = Attribution(SHARED, (), "gpu01-02 time out", shared="leaf1: 5 nodes failing")
    j = job("FAILED", ended=T0 - timedelta(minutes=1))
    c = replace(ctx(attr, j), guards=GuardState(memory_since=T0))
    d = replace(planned(ctx(GPU, j), "requeue"), cause=SHARED)
    (out,) = g.ended_before_record(d, c).decisions
    assert out.reason.endswith("look. leaf1: 5 nodes failing; gpu01-02 time out")


def test_readmit_takes_back_a_switch_s_nodes_once_its_exclusion_has_lasted() -> None:
    """Job 7 was requeued off a failing switch (gpu05-06, no drain) 25 hours ago, and off
    gpu07's switch an hour ago: the first exclusion has lasted `requeue_away_for` (24h)."""
    earlier = (
        PastAction(
            T0 - timedelta(hours=25), "requeue", 7, exclude=("gpu05", "gpu06"), cause=SHARED
        ),
        PastAction(T0 - timedelta(hours=1), "requeue", 7, exclude=("gpu07",), cause=SHARED),
    )
    c = ctx(GPU, job("FAILED"), history=earlier)
    (d,) = g.readmit(planned(c, "requeue"), c).decisions
    assert d.readmit == ("gpu05", "gpu06")
    assert d.reason.endswith("; readmits gpu05, gpu06 (excluded off a failing switch over 1d ago)")
    longer = replace(c, policy=load_policy({"shared_cause": {"requeue_away_for": "2d"}}))
    assert g.readmit(planned(longer, "requeue"), longer).decisions[0].readmit == ()
    # gpu05 was drained apart by the storm's incident, gpu06 for a failure of its own since:
    # their drains say when they are back, not the switch's time.
    drained = (
        *earlier,
        PastAction(T0 - timedelta(hours=25), "drain", 7, nodes=("gpu05",), cause=SHARED),
        PastAction(T0 - timedelta(hours=2), "drain", nodes=("gpu06",), incident="node:gpu06"),
    )
    both = ctx(GPU, job("FAILED"), history=drained, mode="enforce")
    assert g.readmit(planned(both, "requeue"), both).decisions[0].readmit == ("gpu05",)
