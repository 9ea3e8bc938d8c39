"""The trial report over plain rows: agreement per cause and action, harmful disagreements
(the operator would have done less), what would have been disrupted, fault to recommendation
time, recoveries, and readiness per action and partition."""

from __future__ import annotations

import csv
import io
from datetime import UTC, datetime, timedelta
from typing import Any

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
    assert "1 harmful disagreement(s): not ready" in lines[("drain", "train")].line
    assert lines[("requeue", "train")].line == (
        "requeue on partition train: 2 agreed of 2 judged, 0 harmful disagreement(s): "
        "not enough agreed yet (2 of 10)"
    )
    assert ("escalate", "train") not in lines  # escalations disrupt nothing: never "enabled"


def test_a_clean_record_is_ready_and_partitions_are_judged_apart() -> None:
    rows = [judged(i, "requeue", verdict="agree") for i in range(1, 12)]
    rows += [judged(50 + i, "requeue", partition="debug", verdict="agree") for i in range(3)]
    rows += [judged(60, "drain", partition=None, verdict="agree")]
    r = trial.report(rows, T, T + timedelta(days=1), min_agreed=10)
    lines = {(x.action, x.partition): x for x in r.readiness}
    assert lines[("requeue", "train")].ready
    assert lines[("requeue", "train")].line.endswith(": ready to enforce")
    assert not lines[("requeue", "debug")].ready
    assert lines[("drain", "*")].line.startswith("drain (no partition): 1 agreed")


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
        "| gpu_hardware | drain | 2 | 1 | 1 | 0 | 50% | 1 | 2 | 0 | 0 | 0.0 | 0, 0.0 "
        "| 30s / 30s | — |"
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
