"""The trial report's recovery drills: kept out of agreement and readiness (a drill's requeue
and its failure's escalation are an operator's test, not recommendations), and listed apart in
every format — a Markdown table that renders, a second csv table, json."""

from __future__ import annotations

import csv
import io
from datetime import timedelta

from tests.markdown_tables import check
from tests.unit.test_trial import T, judged
from webhook.core import drills, trial
from webhook.core.incidents import IncidentKey

PASSED = trial.Drilled(
    id=3,
    job=42,
    at=T + timedelta(hours=2),
    by="anna",
    outcome=trial.drill_outcome("decided", "recovered"),
    reason="step 130 passed 120",
    lost_steps=20.0,
    lost_seconds=61.4,
    start_seconds=45.0,
)
FAILED = trial.Drilled(
    id=2,
    job=43,
    at=T + timedelta(hours=1),
    by="kim",
    outcome=trial.drill_outcome("decided", "failed"),
    reason="quality 9.8 | was 2.1\nits checkpoint is corrupt",
    lost_steps=20.0,
    lost_seconds=60.0,
)
REFUSED = trial.Drilled(
    id=1,
    job=44,
    at=T,
    by="kim",
    outcome=trial.drill_outcome("refused", None),
    reason="job 44 was submitted with --no-requeue",
)


def drill_rows() -> list[trial.Judged]:
    """What a drill leaves among the decisions: its requeue, and its failure's escalation."""
    requeue = judged(
        90,
        "requeue",
        incident=str(IncidentKey.drilling(42, 0)),
        cause=drills.CAUSE,
        verdict="disagree",
        would="let_finish",  # harmful, were it a recommendation
    )
    escalation = judged(
        91,
        "escalate",
        incident=str(IncidentKey.verifying(42, 0)),
        cause=drills.CAUSE,
        verdict="agree",
    )
    return [requeue, escalation]


def test_drills_count_neither_in_agreement_nor_in_readiness() -> None:
    real = [
        judged(i, "requeue", verdict="agree", at=T + timedelta(days=i % 3)) for i in range(1, 11)
    ]
    r = trial.report([*real, *drill_rows()], T, T + timedelta(days=3), min_agreed=10)
    assert (r.recommendations, r.judged) == (10, 10)
    assert [(g.cause, g.action) for g in r.groups] == [("gpu_hardware", "requeue")]
    (line,) = r.readiness
    assert line.ready
    assert line.line.startswith("requeue for gpu_hardware on partition train: 10 agreed of 10")
    assert trial.report(drill_rows(), T, T + timedelta(days=1)).groups == []


def test_a_drill_is_told_by_its_cause_or_its_incident() -> None:
    requeue, escalation = drill_rows()
    assert trial.is_drill(requeue) and trial.is_drill(escalation)
    assert trial.is_drill(judged(5, "requeue", incident="drill:5.0"))
    assert not trial.is_drill(judged(5, "requeue"))


def test_outcomes_as_slurmedic_drills_says_them() -> None:
    assert [trial.drill_outcome(s, None) for s in ("asked", "decided", "refused")] == [
        "asked",
        "decided",
        "refused",
    ]
    assert trial.drill_outcome("decided", "recovered") == "passed"
    assert [trial.drill_outcome("decided", s) for s in ("watching", "failed", "unverified")] == [
        "watching",
        "failed",
        "unverified",
    ]
    assert PASSED.why_not == "passed"
    assert REFUSED.why_not == "refused: job 44 was submitted with --no-requeue"


def test_the_markdown_lists_each_drill_in_a_table_that_renders() -> None:
    r = trial.report(drill_rows(), T, T + timedelta(days=1), drills=[PASSED, REFUSED, FAILED])
    md = trial.as_markdown(r)
    groups, table = check(md)
    assert groups == [list(trial.TABLE)]
    assert table[0] == list(trial.DRILL_TABLE)
    assert table[1:] == [  # oldest first
        ["1", "44", "2026-11-01 00:00", "kim", "—", "—", REFUSED.why_not],
        [
            "2",
            "43",
            "2026-11-01 01:00",
            "kim",
            "20 steps, 60s",
            "—",
            FAILED.why_not.replace("\n", " "),
        ],
        ["3", "42", "2026-11-01 02:00", "anna", "20 steps, 61s", "45s", "passed"],
    ]
    assert md.index("## Recovery drills") > md.index("## Disagreements")


def test_a_window_without_drills_says_so() -> None:
    md = trial.as_markdown(trial.report([], T, T + timedelta(days=1)))
    assert "## Recovery drills\n\nNone in this window" in md
    assert len(check(md)) == 1
    assert trial.csv_rows(trial.report([], T, T + timedelta(days=1))) == [list(trial.CSV_COLUMNS)]
    assert trial.as_json(trial.report([], T, T + timedelta(days=1)))["drills"] == []


def test_csv_and_json_carry_the_same_drills() -> None:
    r = trial.report(
        [judged(1, "drain", verdict="agree")], T, T + timedelta(days=1), drills=[PASSED, FAILED]
    )
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerows(trial.csv_rows(r))
    groups, drilled = buf.getvalue().split("\n\n")
    assert [row["action"] for row in csv.DictReader(io.StringIO(groups))] == ["drain"]
    found = list(csv.DictReader(io.StringIO(drilled)))
    assert list(found[0]) == list(trial.DRILL_CSV_COLUMNS)
    assert [
        (d["drill"], d["job"], d["outcome"], d["lost_seconds"], d["why_not"]) for d in found
    ] == [
        ("2", "43", "failed", "60", FAILED.reason),
        ("3", "42", "passed", "61.4", ""),
    ]
    js = trial.as_json(r)["drills"]
    assert js[1] == {
        "drill": 3,
        "job": 42,
        "asked_at": "2026-11-01T02:00:00+00:00",
        "by": "anna",
        "outcome": "passed",
        "passed": True,
        "reason": "step 130 passed 120",
        "lost_steps": 20.0,
        "lost_seconds": 61.4,
        "start_seconds": 45.0,
    }
    assert js[0]["passed"] is False and js[0]["reason"] == FAILED.reason
