"""The decision lifecycle as the ledger enforces it: every move of the table is accepted, every
other one refused (and nothing written); a revision supersedes what was not carried out."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from itertools import count
from pathlib import Path

import pytest

from webhook.core.decisions import Decision
from webhook.core.lifecycle import STATES, TRANSITIONS, IllegalTransition
from webhook.ledger.store import Ledger

T = datetime(2026, 12, 9, 12, 0, tzinfo=UTC)
JOBS = count(3200)


def decision(action: str = "requeue", state: str = "pending", **kw: object) -> Decision:
    base = dict(
        at=T,
        incident="3102.0",
        job=3102,
        action=action,
        cause="hang",
        reason="stalled",
        mode="enforce",
        state=state,
    )
    base.update(kw)
    return Decision(**base)  # type: ignore[arg-type]


def at_state(ledger: Ledger, state: str) -> int:
    """A decision brought to `state` through legal moves only."""
    path = {
        "recorded": ["recorded"],
        "awaiting_approval": ["awaiting_approval"],
        "pending": ["pending"],
        "approved": ["awaiting_approval", "approved"],
        "running": ["pending", "running"],
        "executed": ["pending", "running", "executed"],
        "failed": ["pending", "running", "failed"],
        "rejected": ["awaiting_approval", "rejected"],
        "expired": ["awaiting_approval", "expired"],
        "superseded": ["pending", "superseded"],
    }[state]
    # A job of its own each time: the ledger takes one decision per incident and action.
    job = next(JOBS)
    (i,) = ledger.record([decision(state=path[0], incident=f"{job}.0", job=job)])
    for s in path[1:]:
        ledger.add_event(i, s, {"by": "test"}, T)
    return i


@pytest.mark.parametrize("current", sorted(STATES))
def test_the_ledger_allows_exactly_the_table_s_moves(tmp_path: Path, current: str) -> None:
    ledger = Ledger(f"sqlite:///{tmp_path / 'l.db'}")
    for new in sorted(STATES):
        i = at_state(ledger, current)
        if new in TRANSITIONS[current]:
            ledger.add_event(i, new, {"by": "test"}, T)
            assert ledger.decision(i)[0].state == new  # type: ignore[index]
        else:
            events = len(ledger.decision(i)[1])  # type: ignore[index]
            with pytest.raises(IllegalTransition):
                ledger.add_event(i, new, {"by": "test"}, T)
            row, after = ledger.decision(i)  # type: ignore[misc]
            assert row.state == current and len(after) == events


def test_a_revision_supersedes_what_waits_and_keeps_what_ran(tmp_path: Path) -> None:
    ledger = Ledger(f"sqlite:///{tmp_path / 'l.db'}")
    first = ledger.record(
        [
            decision("drain", "awaiting_approval", nodes=("gpu01",), cause="node_failure"),
            decision("requeue", "awaiting_approval", exclude=("gpu01",), cause="node_failure"),
        ]
    )
    # The drain was approved and carried out; the requeue still waits.
    ledger.add_event(first[0], "approved", {"by": "ana"}, T)
    ledger.add_event(first[0], "running", {"by": "executor"}, T)
    ledger.add_event(first[0], "executed", {"by": "executor"}, T)
    later = T + timedelta(minutes=3)
    revision = [
        decision("drain", "awaiting_approval", nodes=("gpu01",), at=later, revision=1),
        decision("requeue", "awaiting_approval", exclude=("gpu01", "gpu03"), at=later, revision=1),
    ]
    new = ledger.record(revision)
    states = {r.id: (r.action, r.state) for r in ledger.incident_decisions("3102.0")}
    assert states[first[0]] == ("drain", "executed")
    assert states[first[1]] == ("requeue", "superseded")
    # The same drain ran already: the revision's is not recorded again; its requeue is.
    assert [states[i] for i in new] == [("requeue", "awaiting_approval")]
    _, events = ledger.decision(first[1])  # type: ignore[misc]
    assert events[-1].state == "superseded"
    assert "gpu03" in events[-1].detail["superseded_by"]
    assert ledger.carried_out(["3102.0", "9.0"]) == {"3102.0": {"drain"}}
    # A superseded decision is no history: it never happened.
    assert [h.action for h in ledger.history(T - timedelta(hours=1))] == ["drain", "requeue"]
    # A drain of another node is new, and an escalation is never held back by an earlier one.
    again = T + timedelta(minutes=6)
    more = ledger.record(
        [
            decision("drain", "awaiting_approval", nodes=("gpu01", "gpu03"), at=again, revision=2),
            decision("escalate", "pending", at=again, revision=2),
        ]
    )
    assert [(r.action, r.state) for r in ledger.rows(more)] == [
        ("drain", "awaiting_approval"),
        ("escalate", "pending"),
    ]


def test_a_decision_superseded_meanwhile_is_not_claimed(tmp_path: Path) -> None:
    """The executor read it as approved; the loop superseded it before the executor's claim."""
    ledger = Ledger(f"sqlite:///{tmp_path / 'l.db'}")
    (i,) = ledger.record([decision(state="awaiting_approval")])
    ledger.add_event(i, "approved", {"by": "ana"}, T)
    stale = ledger.rows([i])[0]  # what the executor read
    ledger.record([decision(state="awaiting_approval", revision=1, cause="node_failure")])
    assert stale.state == "approved"
    with pytest.raises(IllegalTransition):
        ledger.add_event(stale.id, "running", {"by": "executor"}, T)
    assert ledger.decision(i)[0].state == "superseded"  # type: ignore[index]
