"""slurmedic's notices (webhook/core/notices.py): each kind names its job's owner when it is
known, from what was recorded, the cluster view or the decision's partition, and only as plain
names; a stop carried out tells the job's owner for a bounded time."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from webhook.core.cluster import Job
from webhook.core.drills import CAUSE as DRILL_CAUSE
from webhook.core.drills import FAILED_GUARD as DRILL_FAILED
from webhook.core.notices import (
    OWNER_LABELS,
    STOP_OPEN,
    Kind,
    Open,
    Owner,
    as_alert,
    labels,
    learnt,
    notices,
)

AT = datetime(2026, 12, 6, 9, 0, tzinfo=UTC)
NOW = AT + timedelta(minutes=10)
ALICE = Job(id=7, nodes=("gpu01",), partition="train", user="alice", account="vision")
OWNER_KEYS = set(OWNER_LABELS.values())


def row(action: str, state: str = "executed", **kw: object) -> Open:
    fields: dict[str, object] = {
        "decision_id": 4,
        "incident": "7.0",
        "job": 7,
        "action": action,
        "cause": "application",
        "guard": None,
        "state": state,
        "reason": f"{action} of job 7: rank 3 crashed where it crashed before",
        "at": AT,
        "partition": "train",
        **kw,
    }
    return Open(**fields)  # type: ignore[arg-type]


# One row of each kind a notice has (a failed drill is an escalation of its own guard).
KINDS: list[tuple[Kind, Open]] = [
    ("awaiting_approval", row("stop", "awaiting_approval")),
    ("escalation", row("escalate")),
    ("escalation", row("escalate", cause=DRILL_CAUSE, guard=DRILL_FAILED, incident="drill:7.1")),
    ("recovery_failed", row("escalate", guard="recovery_failed", incident="verify:7.1")),
    ("mismatch", row("requeue", mismatch="Slurm counts 2 restarts of job 7")),
    ("job_stopped", row("stop")),
]


@pytest.mark.parametrize(("kind", "open_row"), KINDS)
def test_every_kind_names_the_owner_the_view_shows(kind: Kind, open_row: Open) -> None:
    (n,) = notices([open_row], NOW, {7: ALICE})
    assert n.kind == kind
    got = as_alert(n, NOW, timedelta(minutes=1), "")["labels"]
    assert {k: got[k] for k in OWNER_KEYS & got.keys()} == {
        "slurm_user": "alice",
        "slurm_account": "vision",
        "slurm_partition": "train",
    }
    assert got["cause"] == open_row.cause and got["slurm_job_id"] == "7"


@pytest.mark.parametrize(("kind", "open_row"), KINDS)
def test_a_job_slurm_forgot_keeps_the_partition_its_decision_recorded(
    kind: Kind, open_row: Open
) -> None:
    (n,) = notices([open_row], NOW, {})
    assert n.kind == kind
    got = labels(n)
    assert {k: got[k] for k in OWNER_KEYS & got.keys()} == {"slurm_partition": "train"}
    # Nothing known at all: no owner label, never an empty one.
    (n,) = notices([replace(open_row, partition=None)], NOW, {})
    assert not OWNER_KEYS & labels(n).keys()
    assert all(labels(n).values())


def test_the_owner_recorded_wins_over_the_view_and_empty_values_are_left_off() -> None:
    recorded = Owner(user="bob", partition="debug")  # no account: Slurm without accounting
    (n,) = notices([row("escalate", owner=recorded)], NOW, {7: ALICE})
    got = labels(n)
    assert (got["slurm_user"], got["slurm_partition"]) == ("bob", "debug")
    assert "slurm_account" not in got


def test_a_decision_without_a_job_names_no_owner() -> None:
    node = row("escalate", job=None, incident="node:gpu02", cause="gpu_hardware")
    (n,) = notices([node], NOW, {7: ALICE})
    assert not OWNER_KEYS & labels(n).keys()


@pytest.mark.parametrize(
    "bad", ["", "al ice", "x{{ .Alerts }}", "a\nb", "-rf", "é", "a" * 65, "user,other"]
)
def test_only_plain_names_from_slurm_become_labels(bad: str) -> None:
    job = replace(ALICE, user=bad, account="vision")
    (n,) = notices([row("escalate")], NOW, {7: job})
    got = labels(n)
    assert "slurm_user" not in got and got["slurm_account"] == "vision"
    problems = Owner.of(job).problems()
    if bad:
        (line,) = problems
        assert line.startswith("slurm_user ") and "not a plain name" in line
    else:
        assert problems == []  # unknown is not a problem


@pytest.mark.parametrize("good", ["alice", "_svc", "a.b-c_d", "alice@ad.example.org", "A1"])
def test_plain_names_are_kept_as_slurm_prints_them(good: str) -> None:
    job = replace(ALICE, user=good, account=good, partition=good)
    (n,) = notices([row("escalate")], NOW, {7: job})
    assert {labels(n)[k] for k in OWNER_KEYS} == {good}
    assert Owner.of(job).problems() == []


def test_owners_are_learnt_once_from_the_view() -> None:
    rows = [
        row("escalate", decision_id=1),
        row("escalate", decision_id=2, owner=Owner(user="bob")),  # recorded already
        row("escalate", decision_id=3, job=8),  # Slurm does not know job 8
        row("escalate", decision_id=5, job=None),
    ]
    assert learnt(rows, {7: ALICE}) == {1: Owner.of(ALICE)}
    bob = replace(ALICE, id=8, user="bob")
    assert learnt(rows, {7: ALICE, 8: bob}) == {1: Owner.of(ALICE), 3: Owner.of(bob)}
    assert Owner.from_json(Owner.of(ALICE).as_json()) == Owner.of(ALICE)
    assert Owner.from_json({"user": 3, "account": "x"}) == Owner(account="x")
    assert Owner.from_json("alice") is None


def test_a_stop_carried_out_tells_its_owner_with_its_reason() -> None:
    stop = row("stop")
    (n,) = notices([stop], NOW, {7: ALICE})
    alert = as_alert(n, NOW, timedelta(minutes=1), "https://slurmedic.example")
    assert alert["labels"]["alertname"] == "SlurmedicJobStopped"
    assert alert["labels"]["severity"] == "warning"
    assert alert["labels"]["slurm_user"] == "alice"
    assert alert["annotations"]["description"] == stop.reason
    assert "stopped job 7" in alert["annotations"]["summary"]
    assert alert["endsAt"] == (NOW + timedelta(minutes=1)).strftime("%Y-%m-%dT%H:%M:%SZ")


def test_a_stop_is_told_for_a_bounded_time_and_only_once_it_ran() -> None:
    stop = row("stop")
    assert [n.kind for n in notices([stop], AT + STOP_OPEN - timedelta(seconds=1))] == [
        "job_stopped"
    ]
    assert notices([stop], AT + STOP_OPEN) == []
    # A dry run (monitor mode) stopped nothing; one waiting or running has not stopped it yet;
    # one that failed did not.
    for state in ("recorded", "pending", "approved", "running", "failed", "superseded"):
        assert notices([row("stop", state)], NOW) == [], state


def test_a_stop_slurm_showed_otherwise_after_is_told_to_both() -> None:
    stop = row("stop", mismatch="job 7 was COMPLETED before the stop")
    assert sorted(n.kind for n in notices([stop], NOW)) == ["job_stopped", "mismatch"]


def test_a_node_for_replacement_is_a_notice_of_its_own_and_names_no_job() -> None:
    replace = row(
        "escalate", guard="replace_node", incident="repair:gpu02:2", job=None,
        reason="gpu02: failed again after its repair repair:gpu02 (within 7d): replace it",
    )  # fmt: skip
    (n,) = notices([replace], NOW, {7: ALICE})
    assert n.kind == "node_replace"
    alert = as_alert(n, NOW, timedelta(minutes=1), "https://slurmedic.example.org")
    got = alert["labels"]
    assert (got["alertname"], got["severity"]) == ("SlurmedicNodeReplace", "warning")
    assert "slurm_job_id" not in got and got["incident"] == "repair:gpu02:2"
    assert alert["annotations"]["summary"].startswith("repair:gpu02:2: replace or service")
    assert "failed again after its repair" in alert["annotations"]["description"]
    # Any other escalation stays one.
    (other,) = notices([row("escalate", guard="repeat_failure")], NOW)
    assert other.kind == "escalation"
