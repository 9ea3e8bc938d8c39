"""What the console and the trial read, on both ledgers (SQLite and PostgreSQL): the node
filter over JSON columns, paging over incidents, what needs a human, the trial's rows with
their latest verdict, and the /metrics figures of the human side."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from webhook.core.decisions import Decision
from webhook.core.notices import Owner
from webhook.core.verdicts import verdict
from webhook.ledger import review
from webhook.ledger.store import Ledger

T = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


def decision(i: int, action: str, **kw: Any) -> Decision:
    fields: dict[str, Any] = {
        "at": T + timedelta(minutes=i),
        "incident": f"{i}.0",
        "job": i,
        "action": action,
        "cause": "gpu_hardware",
        "reason": f"{action} {i}",
        "mode": "approve",
        "state": "awaiting_approval",
        "partition": "train",
        **kw,
    }
    return Decision(**fields)


def test_the_console_s_queries(ledger: Ledger) -> None:
    ids = ledger.record(
        [
            decision(1, "drain", nodes=("gpu01", "gpu010")),
            decision(1, "requeue", exclude=("gpu01", "gpu010")),
            decision(2, "drain", nodes=("gpu010",), partition="debug"),
            decision(3, "escalate", mode="enforce", state="executed", cause="unknown"),
            decision(4, "stop", mode="monitor", state="recorded", cause="application"),
        ]
    )
    every = review.incident_page(ledger, review.IncidentFilter(), 0, 10)
    assert every == review.IncidentPage(["4.0", "3.0", "2.0", "1.0"], 4)
    assert review.incident_page(ledger, review.IncidentFilter(), 1, 2).keys == ["3.0", "2.0"]
    # A node name matches whole names only: gpu01 is not gpu010.
    assert review.incident_page(ledger, review.IncidentFilter(node="gpu01"), 0, 10).keys == ["1.0"]
    assert review.incident_page(ledger, review.IncidentFilter(node="gpu010"), 0, 10).total == 2
    debug = review.IncidentFilter(partition="debug", cause="gpu_hardware")
    assert review.incident_page(ledger, debug, 0, 10).keys == ["2.0"]

    assert [o.decision_id for o in review.needs_human(ledger, T)] == ids[:4]
    # The owner a notice names, kept on the decision as a note and read back on this backend.
    review.record_owner(ledger, ids[1], Owner(user="alice", partition="train"), T)
    owners = {o.decision_id: o.owner for o in review.needs_human(ledger, T)}
    assert owners[ids[1]] == Owner(user="alice", partition="train") and owners[ids[0]] is None
    review.add_verdict(ledger, ids[3], verdict(verdict="agree", by="anna"), T)
    review.add_verdict(ledger, ids[0], verdict(verdict="agree", by="anna"), T)
    review.add_verdict(ledger, ids[0], verdict(verdict="disagree", would="none", by="anna"), T)
    assert [o.decision_id for o in review.needs_human(ledger, T)] == ids[:3]

    rows = {r.decision_id: r for r in review.trial_rows(ledger, T, T + timedelta(hours=1))}
    assert rows[ids[0]].verdict == "disagree" and rows[ids[0]].would == "none"  # the latest
    assert rows[ids[1]].verdict is None and rows[ids[2]].partition == "debug"

    fig = ledger.figures()
    assert len(fig.waiting_since) == 3 and fig.open_escalations == 0
    assert {(v.action, v.verdict, v.n) for v in fig.verdicts} == {
        ("drain", "disagree", 1),
        ("escalate", "agree", 1),
    }


def test_the_trial_reads_none_decisions_and_what_a_job_action_did(ledger: Ledger) -> None:
    ids = ledger.record(
        [
            decision(5, "none", mode="monitor", state="recorded"),
            decision(6, "stop", mode="monitor", state="recorded", cause="application"),
            decision(7, "requeue", mode="monitor", state="recorded", exclude=("gpu07",)),
            decision(8, "stop", mode="monitor", state="recorded", cause="application"),
        ]
    )
    plans = {
        ids[1]: {"JobState": "FAILED", "Restarts": "0"},  # the attempt had already failed
        ids[2]: {"JobState": "PENDING", "Restarts": "1"},  # Slurm had requeued it itself
        ids[3]: {"JobState": "RUNNING", "Restarts": "0"},
    }
    for decision_id, before in plans.items():
        plan = {"playbook": "p", "status": "successful", "commands": [], "before": before}
        ledger.add_note(decision_id, {"by": "executor", "dry_run": plan}, T)
    # The longest alternative fits the column (PostgreSQL holds it to its length).
    review.add_verdict(
        ledger, ids[0], verdict(verdict="disagree", would="drain", by="anna", note="drain it"), T
    )
    review.add_verdict(
        ledger, ids[2], verdict(verdict="disagree", would="requeue_anywhere", by="anna"), T
    )
    rows = {r.decision_id: r for r in review.trial_rows(ledger, T, T + timedelta(hours=1))}
    assert rows[ids[0]].action == "none" and rows[ids[0]].would == "drain"
    assert [rows[i].effect for i in ids] == [None, "ended", "requeued", "interrupted"]
    assert rows[ids[2]].would == "requeue_anywhere"
