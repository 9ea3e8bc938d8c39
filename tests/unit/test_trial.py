"""The trial report over plain rows: agreement per cause and action, harmful disagreements
(the operator would have done less, by what happened in Slurm) and misses (more), what the
operators would have done instead, what would have been disrupted, fault to recommendation
time (from the fault's first evidence, the rules' for: apart), recoveries, readiness per action,
cause and partition that only a varied record earns, and a Markdown table that renders."""

from __future__ import annotations

import csv
import io
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from tests.markdown_tables import check
from webhook.core import trial

T = datetime(2026, 11, 1, tzinfo=UTC)


def judged(i: int, action: str, **kw: Any) -> trial.Judged:
    fields: dict[str, Any] = {
        "decision_id": i,
        "incident": f"{i}.0",
        "at": T + timedelta(seconds=30),
        "action": action,
        "cause": "gpu_hardware",
        "mode": "monitor",
        "state": "recorded",
        "partition": "train",
        "nodes": (f"gpu{i:02}",) if action == "drain" else (),
        "job": i if action in ("requeue", "stop") else None,
        "fault_at": T,
    }
    return trial.Judged(**(fields | kw))


def test_agreement_harm_disruption_and_latency_per_group() -> None:
    rows = [
        *(judged(i, "drain", verdict="agree", by="ops") for i in range(1, 13)),
        judged(13, "drain", verdict="disagree", would="none", by="ops", note="a flaky XID"),
        judged(14, "drain", verdict="unsure", by="ops"),
        judged(15, "drain"),  # not judged yet
        judged(20, "requeue", verdict="agree", recovery="recovered"),
        judged(
            21, "requeue", verdict="agree", recovery="failed", fault_at=T - timedelta(minutes=9)
        ),
        judged(22, "escalate", cause="shared_infrastructure", verdict="disagree", would="drain"),
    ]
    r = trial.report(rows, T - timedelta(days=7), T + timedelta(days=1), min_agreed=10)
    groups = {(g.cause, g.action): g for g in r.groups}
    drain = groups[("gpu_hardware", "drain")]
    assert (drain.recommendations, drain.agree, drain.disagree, drain.unsure) == (15, 12, 1, 1)
    assert drain.agreement == 12 / 14 and drain.harmful == 1
    assert len(drain.nodes) == 15 and drain.latency(0.5) == 30.0
    requeue = groups[("gpu_hardware", "requeue")]
    assert requeue.jobs == {20, 21} and requeue.recoveries == {"recovered": 1, "failed": 1}
    assert requeue.latency(0.9) is not None and requeue.latency(0.9) > 300
    # Escalating where the operator would drain is a miss, not harm.
    assert groups[("shared_infrastructure", "escalate")].harmful == 0
    lines = {(x.action, x.partition): x for x in r.readiness}
    assert not lines[("drain", "train")].ready
    assert (
        "1 harmful disagreement(s); agreed on 1 day(s), 12 node(s)"
        in lines[("drain", "train")].line
    )
    assert lines[("drain", "train")].line.endswith(
        "not ready: look at the harmful disagreements first"
    )
    assert lines[("requeue", "train")].line == (
        "requeue for gpu_hardware on partition train: 2 agreed of 2 judged, 0 harmful "
        "disagreement(s); agreed on 1 day(s), 2 job(s), 0 kind(s) of alert: "
        "not enough agreed yet (2 of 10)"
    )
    assert ("escalate", "train") not in lines  # escalations disrupt nothing: never "enabled"


def over_days(i: int, action: str, **kw: Any) -> trial.Judged:
    """A recommendation of the i-th day of a week."""
    return judged(i, action, at=T + timedelta(days=i % 7, seconds=30), **kw)


def test_a_clean_varied_record_is_ready_and_partitions_and_causes_are_judged_apart() -> None:
    rows = [over_days(i, "requeue", verdict="agree") for i in range(1, 12)]
    rows += [over_days(30 + i, "requeue", cause="degraded", verdict="agree") for i in range(3)]
    rows += [over_days(50 + i, "requeue", partition="debug", verdict="agree") for i in range(3)]
    rows += [over_days(60, "drain", partition=None, verdict="agree")]
    r = trial.report(rows, T, T + timedelta(days=8), min_agreed=10)
    lines = {(x.action, x.cause, x.partition): x for x in r.readiness}
    ready = lines[("requeue", "gpu_hardware", "train")]
    assert ready.ready and (ready.days, ready.spread) == (7, 11)
    assert ready.line.endswith(": ready to enforce")
    # The same action for another cause, or on another partition, earns its own.
    assert not lines[("requeue", "degraded", "train")].ready
    assert not lines[("requeue", "gpu_hardware", "debug")].ready
    assert lines[("drain", "gpu_hardware", "*")].line.startswith(
        "drain for gpu_hardware (no partition): 1 agreed"
    )


def test_one_run_s_record_or_one_node_again_and_again_is_not_ready() -> None:
    # Eleven agreed drains in one lab run: one day.
    run = [judged(i, "drain", verdict="agree") for i in range(1, 12)]
    (line,) = trial.report(run, T, T + timedelta(days=1)).readiness
    assert (
        not line.ready and "not varied enough: agreed on 3 days and 3 node(s) at least" in line.line
    )
    # A week of the same node failing.
    node = [over_days(i, "drain", verdict="agree", nodes=("gpu07",)) for i in range(1, 12)]
    (line,) = trial.report(node, T, T + timedelta(days=8)).readiness
    assert (line.ready, line.days, line.spread) == (False, 7, 1)
    assert "not varied enough" in line.line


def test_fault_to_recommendation_runs_from_the_first_evidence_with_the_rules_share_apart() -> None:
    rows = [
        judged(1, "drain", alerts=("GpuNvlinkErrors",), at=T + timedelta(seconds=20)),
        judged(
            2, "drain", alerts=("GpuXidNodeFault", "GpuNvlinkErrors"), at=T + timedelta(seconds=20)
        ),
    ]
    delays = {"GpuNvlinkErrors": 300.0, "GpuXidNodeFault": 0.0}
    (g,) = trial.report(rows, T, T + timedelta(days=1), delays=delays).groups
    assert sorted(g.latencies) == [20.0, 320.0] and sorted(g.rule_delays) == [0.0, 300.0]
    assert g.alerts == {"GpuNvlinkErrors": 1, "GpuXidNodeFault": 1}
    assert "its first alert's start less that alert's rule `for:`" in trial.as_markdown(
        trial.report(rows, T, T + timedelta(days=1), delays=delays)
    )
    # Without the rules' delays (an alert no rule file names), from the alert's start.
    (g,) = trial.report(rows, T, T + timedelta(days=1)).groups
    assert g.latencies == [20.0, 20.0]


def test_agreement_below_the_bar_is_not_ready_even_without_harm() -> None:
    rows = [judged(i, "stop", cause="application", verdict="agree") for i in range(1, 11)]
    rows += [judged(11, "stop", cause="application", verdict="unsure")]
    (line,) = trial.report(rows, T, T + timedelta(days=1)).readiness
    assert not line.ready and "agreement 91% is below 95%" in line.line


def test_the_three_formats_carry_the_same_figures() -> None:
    rows = [
        judged(1, "drain", verdict="agree"),
        judged(2, "drain", verdict="disagree", would="escalate", by="kim", note="one XID 48"),
    ]
    r = trial.report(rows, T, T + timedelta(days=1))
    md = trial.as_markdown(r)
    assert (
        "| gpu_hardware | drain | 2 | 1 | 1 | 0 | 50% | 1 | 0 | escalate 1 | 2 | 0 | 0 | 0.0 "
        "| 0, 0.0 | 30s / 30s | 0s | — | — |"
    ) in md
    assert "decision 2 (2.0): slurmedic drain for gpu_hardware, kim would escalate (harmful)" in md
    table = list(csv.DictReader(io.StringIO("\n".join(",".join(r) for r in trial.csv_rows(r)))))
    assert table[0]["agreement"] == "0.500" and table[0]["harmful"] == "1"
    js = trial.as_json(r)
    assert js["groups"][0]["disagreements"] == [
        {
            "decision": 2,
            "incident": "2.0",
            "would": "escalate",
            "by": "kim",
            "note": "one XID 48",
            "harmful": True,
            "missed": False,
            "effect": None,
            "gpus": 0,
            "gpu_hours": None,
        }
    ]


def test_gpus_and_gpu_hours_summed_and_those_of_harmful_disagreements_apart() -> None:
    rows = [
        judged(1, "drain", gpus=8, verdict="agree"),
        judged(2, "drain", gpus=8, verdict="disagree", would="none"),  # harmful
        judged(
            3,
            "stop",
            cause="application",
            gpus=16,
            gpu_hours=32.0,
            verdict="disagree",
            would="requeue",
        ),  # harmful: a requeue disrupts less than a stop
        judged(4, "stop", cause="application", gpus=8, gpu_hours=None),  # not known
    ]
    r = trial.report(rows, T - timedelta(days=1), T + timedelta(days=1))
    groups = {(g.cause, g.action): g for g in r.groups}
    drain, stop = groups[("gpu_hardware", "drain")], groups[("application", "stop")]
    assert (drain.gpus, drain.gpu_hours, drain.harmful_gpus) == (16, 0.0, 8)
    assert (stop.gpus, stop.gpu_hours, stop.harmful_gpus, stop.harmful_gpu_hours) == (
        24,
        32.0,
        16,
        32.0,
    )
    md = trial.as_markdown(r)
    assert "| 16 | 0.0 | 8, 0.0 |" in md and "| 24 | 32.0 | 16, 32.0 |" in md
    assert "[16 GPUs, 32.0 GPU-hours]" in md
    header, *body = trial.csv_rows(r)
    stop_row = dict(zip(header, next(b for b in body if b[1] == "stop"), strict=True))
    assert (stop_row["gpus"], stop_row["gpu_hours"], stop_row["harmful_gpu_hours"]) == (
        "24",
        "32.00",
        "32.00",
    )
    j = trial.as_json(r)
    stop_json = next(g for g in j["groups"] if g["action"] == "stop")
    assert stop_json["harmful_gpus"] == 16 and stop_json["disagreements"][0]["gpu_hours"] == 32.0


def test_every_markdown_table_renders_with_a_cell_per_header() -> None:
    rows = [
        judged(1, "drain", verdict="agree"),
        judged(2, "requeue", verdict="disagree", would="let_finish", note="a | b\nc"),
        judged(3, "none", cause="odd|cause", verdict="disagree", would="drain"),
    ]
    md = trial.as_markdown(trial.report(rows, T, T + timedelta(days=1)))
    (table,) = check(md)
    header, *body = table
    assert header == list(trial.TABLE) and len(body) == 3
    # A `|` of a cell is escaped: the cell reads back whole.
    assert {row[0] for row in body} == {"gpu_hardware", "odd|cause"}
    # The note stays on its disagreement's line.
    assert "would let_finish (harmful): a | b c" in md


def test_an_empty_report_still_renders() -> None:
    md = trial.as_markdown(trial.report([], T, T + timedelta(days=1)))
    (table,) = check(md)
    assert table == [list(trial.TABLE)]


@pytest.mark.parametrize(
    ("action", "would", "harmful", "missed"),
    [
        ("requeue", "let_finish", True, False),  # it would have interrupted a job left running
        ("requeue", "drain_only", True, False),
        ("requeue", "requeue_anywhere", False, False),  # the job restarts all the same
        ("stop", "requeue_anywhere", True, False),
        ("drain", "wait", True, False),
        ("drain", "drain_only", False, False),
        ("none", "drain", False, True),  # slurmedic did nothing: a missed drain
        ("none", "wait", False, False),
        ("escalate", "requeue_anywhere", False, True),
        ("drain", "requeue", True, False),  # the node left in service, the job requeued
    ],
)
def test_each_alternative_is_harm_a_miss_or_neither(
    action: str, would: str, harmful: bool, missed: bool
) -> None:
    j = judged(1, action, verdict="disagree", would=would)
    assert (trial.harmful(j), trial.missed(j)) == (harmful, missed)


def test_what_the_operators_would_have_done_instead_and_verdicts_on_none() -> None:
    rows = [
        judged(1, "requeue", verdict="disagree", would="let_finish"),
        judged(2, "requeue", verdict="disagree", would="let_finish"),
        judged(3, "requeue", verdict="disagree", would="requeue_anywhere"),
        judged(4, "requeue", verdict="agree"),
        judged(5, "none", verdict="disagree", would="drain", by="ops", note="should have drained"),
        judged(6, "none", verdict="agree"),
        judged(7, "none"),
    ]
    r = trial.report(rows, T, T + timedelta(days=1))
    groups = {g.action: g for g in r.groups}
    assert groups["requeue"].instead == {"let_finish": 2, "requeue_anywhere": 1}
    assert (groups["requeue"].harmful, groups["requeue"].missed) == (2, 0)
    none = groups["none"]
    assert (none.recommendations, none.agree, none.disagree, none.harmful, none.missed) == (
        3,
        1,
        1,
        0,
        1,
    )
    assert none.instead == {"drain": 1} and r.judged == 6
    assert [x.action for x in r.readiness] == ["requeue"]  # doing nothing is never "enabled"
    md = trial.as_markdown(r)
    assert "| let_finish 2, requeue_anywhere 1 |" in md
    assert (
        "slurmedic did nothing for gpu_hardware, ops would drain (missed): should have drained"
        in md
    )
    header, *body = trial.csv_rows(r)
    by_action = {row[1]: dict(zip(header, row, strict=True)) for row in body}
    assert by_action["none"]["missed"] == "1"
    assert by_action["requeue"]["instead"] == "let_finish 2 requeue_anywhere 1"
    js = {g["action"]: g for g in trial.as_json(r)["groups"]}
    assert js["none"]["missed"] == 1 and js["requeue"]["instead"]["let_finish"] == 2


def test_harm_is_what_happened_in_slurm() -> None:
    rows = [
        # The attempt had already failed when the stop ran: it disrupted nothing, and the
        # operator's requeue is a restart missed, not harm.
        judged(
            1,
            "stop",
            cause="application",
            gpus=24,
            gpu_hours=48.0,
            effect="ended",
            verdict="disagree",
            would="requeue",
            by="kim",
        ),
        # Slurm had requeued the job itself: slurmedic only excluded a node from the successor.
        judged(
            2, "requeue", gpus=8, gpu_hours=4.0, effect="requeued", verdict="disagree", would="none"
        ),
        # A live attempt stopped where the operator would requeue: harm, its GPUs disrupted.
        judged(
            3,
            "stop",
            cause="application",
            gpus=16,
            gpu_hours=8.0,
            effect="interrupted",
            verdict="disagree",
            would="requeue",
        ),
    ]
    r = trial.report(rows, T, T + timedelta(days=1))
    groups = {(g.cause, g.action): g for g in r.groups}
    stop, requeue = groups[("application", "stop")], groups[("gpu_hardware", "requeue")]
    assert (stop.harmful, stop.missed, stop.harmful_gpus, stop.harmful_gpu_hours) == (1, 1, 16, 8.0)
    assert (stop.gpus, stop.gpu_hours) == (16, 8.0)  # the dead attempt's 24 GPUs are not counted
    assert (requeue.harmful, requeue.gpus, requeue.gpu_hours) == (0, 0, 0.0)
    md = trial.as_markdown(r)
    assert "kim would requeue (missed) (the attempt had already ended)" in md
    assert "[24 GPUs" not in md
