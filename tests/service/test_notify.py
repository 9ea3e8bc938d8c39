"""The notifier on a real SQLite ledger: which decisions need a human, posted as Alertmanager
alerts, re-posted while open, and resolved (endsAt now) once handled. The post itself is
recorded here; the lab tests post to a real Alertmanager (test_console_browser,
test_remediation_failures). Each notice names its job's owner from the cluster view the loop
hands the notifier, recorded on the decision so that it stays the same."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from webhook.adapters.alertmanager import AlertmanagerError
from webhook.core.cluster import Job
from webhook.core.decisions import Decision
from webhook.core.notices import STOP_OPEN, age
from webhook.core.verdicts import verdict
from webhook.ledger import review
from webhook.ledger.store import Ledger
from webhook.service.notify import Notifier

T = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


def decision(action: str, incident: str, **kw: Any) -> Decision:
    fields: dict[str, Any] = {
        "at": T,
        "incident": incident,
        "job": int(incident.split(".")[0].removeprefix("verify:")),
        "action": action,
        "cause": "gpu_hardware",
        "reason": f"{action} for {incident}",
        "mode": "approve",
        "state": "awaiting_approval",
        **kw,
    }
    return Decision(**fields)


class Posts:
    def __init__(self) -> None:
        self.calls: list[list[dict[str, Any]]] = []
        self.fail = False

    def __call__(self, url: str, alerts: list[dict[str, Any]]) -> None:
        if self.fail:
            raise AlertmanagerError(f"{url}: connection refused")
        self.calls.append(alerts)


@pytest.fixture
def ledger(tmp_path: Path) -> Ledger:
    return Ledger(f"sqlite:///{tmp_path / 'ledger.db'}")


def notifier(ledger: Ledger, posts: Posts, now: list[datetime]) -> Notifier:
    return Notifier(
        ledger,
        "http://am:9093",
        console_url="https://slurmedic.example",
        interval=0,
        clock=lambda: now[0],
        post=posts,
    )


def by_name(alerts: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(a["labels"]["alertname"], a["labels"]["decision"]): a for a in alerts}


def test_open_notices_are_posted_and_handled_ones_resolved(ledger: Ledger) -> None:
    drain, requeue = ledger.record(
        [decision("drain", "7.0", nodes=("gpu01",)), decision("requeue", "7.0")]
    )
    (esc,) = ledger.record(
        [
            decision(
                "escalate", "verify:9.0", mode="enforce", state="executed", guard="recovery_failed"
            )
        ]
    )
    ledger.record([decision("stop", "8.0", mode="monitor", state="recorded")])  # nobody waits
    posts, now = Posts(), [T + timedelta(minutes=5)]
    n = notifier(ledger, posts, now)
    n.step()
    first = by_name(posts.calls[-1])
    assert set(first) == {
        ("SlurmedicAwaitingApproval", str(drain)),
        ("SlurmedicAwaitingApproval", str(requeue)),
        ("SlurmedicRecoveryFailed", str(esc)),
    }
    a = first[("SlurmedicAwaitingApproval", str(drain))]
    assert (
        a["labels"] | {"notice": "slurmedic", "incident": "7.0", "slurm_job_id": "7"} == a["labels"]
    )
    assert "signal" not in a["labels"]  # never routed back to the webhook
    assert a["annotations"]["age"] == "5m00s"
    assert a["annotations"]["console"] == "https://slurmedic.example/console/incident/7.0"
    assert a["endsAt"] > now[0].strftime("%Y-%m-%dT%H:%M:%SZ")

    # The drain approved, the escalation judged: both resolved, once; the requeue still waits.
    ledger.add_event(drain, "approved", {"by": "anna"}, now[0])
    review.add_verdict(ledger, esc, verdict(verdict="agree", by="anna"), now[0])
    now[0] += timedelta(minutes=1)
    n.step()
    second = by_name(posts.calls[-1])
    assert second[("SlurmedicAwaitingApproval", str(drain))]["endsAt"] == now[0].strftime(
        "%Y-%m-%dT%H:%M:%SZ"
    )
    assert second[("SlurmedicRecoveryFailed", str(esc))]["endsAt"] == now[0].strftime(
        "%Y-%m-%dT%H:%M:%SZ"
    )
    assert second[("SlurmedicAwaitingApproval", str(requeue))]["annotations"]["age"] == "6m00s"
    n.step()
    assert set(by_name(posts.calls[-1])) == {("SlurmedicAwaitingApproval", str(requeue))}


def test_a_failed_post_is_made_again(ledger: Ledger) -> None:
    (drain,) = ledger.record([decision("drain", "7.0", nodes=("gpu01",))])
    posts, now = Posts(), [T]
    n = notifier(ledger, posts, now)
    n.step()
    ledger.add_event(drain, "rejected", {"by": "anna", "reason": "no"}, now[0])
    posts.fail = True
    n.step()  # Alertmanager away: the resolution is not lost ...
    posts.fail = False
    n.step()  # ... it goes out on the next round
    (resolved,) = posts.calls[-1]
    assert resolved["endsAt"] == now[0].strftime("%Y-%m-%dT%H:%M:%SZ")


def test_ages_read_as_people_say_them() -> None:
    assert [age(s) for s in (59, 61, 3599, 3600, 7325)] == [
        "0m59s",
        "1m01s",
        "59m59s",
        "1h00m",
        "2h02m",
    ]


ALICE = Job(id=7, nodes=("gpu01",), partition="train", user="alice", account="vision")
OWNED = {"slurm_user": "alice", "slurm_account": "vision", "slurm_partition": "train"}


def owner_labels(alert: dict[str, Any]) -> dict[str, str]:
    return {
        k: v for k, v in alert["labels"].items() if k.startswith("slurm_") and k != "slurm_job_id"
    }


def test_a_notice_names_the_job_s_owner_and_keeps_it_after_slurm_forgets_the_job(
    ledger: Ledger,
) -> None:
    (esc,) = ledger.record(
        [decision("escalate", "7.0", cause="application", state="executed", partition="train")]
    )
    posts, now = Posts(), [T + timedelta(minutes=1)]
    notifier(ledger, posts, now).step({7: ALICE})
    (alert,) = posts.calls[-1]
    assert owner_labels(alert) == OWNED
    # Recorded on the decision: a notifier that starts anew, with Slurm done with the job,
    # posts the same alert (the same labels: the same alert to Alertmanager).
    again = notifier(ledger, posts, now)
    again.step({})
    (same,) = posts.calls[-1]
    assert same["labels"] == alert["labels"]
    recorded = ledger.decision(esc)
    assert recorded is not None
    (note,) = [e for e in recorded[1] if e.state == "note"]
    assert note.detail["owner"] == {"user": "alice", "account": "vision", "partition": "train"}
    again.step({7: replace(ALICE, user="mallory")})  # recorded once: the view no longer counts
    assert posts.calls[-1][0]["labels"] == alert["labels"]


def test_an_owner_learnt_late_resolves_the_notice_under_its_old_labels(ledger: Ledger) -> None:
    (esc,) = ledger.record(
        [decision("escalate", "7.0", cause="application", state="executed", partition="train")]
    )
    posts, now = Posts(), [T + timedelta(minutes=1)]
    n = notifier(ledger, posts, now)
    n.step({})  # the view does not know job 7 yet: the partition the decision recorded
    (first,) = posts.calls[-1]
    assert owner_labels(first) == {"slurm_partition": "train"}
    n.step({7: ALICE})
    resolved, firing = posts.calls[-1]
    assert resolved["labels"] == first["labels"]
    assert resolved["endsAt"] == now[0].strftime("%Y-%m-%dT%H:%M:%SZ")
    assert owner_labels(firing) == OWNED and firing["labels"]["decision"] == str(esc)
    assert firing["endsAt"] > now[0].strftime("%Y-%m-%dT%H:%M:%SZ")


def test_a_name_slurm_prints_that_is_not_plain_is_left_off(
    ledger: Ledger, caplog: pytest.LogCaptureFixture
) -> None:
    (esc,) = ledger.record([decision("escalate", "7.0", state="executed", partition="train")])
    posts, now = Posts(), [T + timedelta(minutes=1)]
    notifier(ledger, posts, now).step({7: replace(ALICE, account="{{ template }}")})
    (alert,) = posts.calls[-1]
    assert owner_labels(alert) == {"slurm_user": "alice", "slurm_partition": "train"}
    assert f"decision {esc}: slurm_account '{{{{ template }}}}' is not a plain name" in caplog.text


def test_a_stop_carried_out_is_told_to_its_owner_until_a_verdict(ledger: Ledger) -> None:
    (stop,) = ledger.record(
        [decision("stop", "7.0", cause="application", mode="enforce", state="pending")]
    )
    ran = T + timedelta(minutes=2)
    ledger.add_event(stop, "executed", {"by": "executor"}, ran)
    posts, now = Posts(), [ran + timedelta(minutes=3)]
    n = notifier(ledger, posts, now)
    n.step({7: replace(ALICE, state="CANCELLED")})
    (alert,) = posts.calls[-1]
    assert alert["labels"]["alertname"] == "SlurmedicJobStopped"
    assert alert["labels"]["severity"] == "warning" and owner_labels(alert) == OWNED
    assert alert["annotations"]["description"] == "stop for 7.0"
    assert alert["annotations"]["age"] == "3m00s"  # from when it ran, not when it was decided
    review.add_verdict(ledger, stop, verdict(verdict="agree", by="anna"), now[0])
    n.step({})
    (resolved,) = posts.calls[-1]
    assert resolved["labels"] == alert["labels"]
    assert resolved["endsAt"] == now[0].strftime("%Y-%m-%dT%H:%M:%SZ")


def test_a_stop_nobody_judges_is_resolved_after_a_day(ledger: Ledger) -> None:
    (stop,) = ledger.record([decision("stop", "7.0", mode="enforce", state="pending")])
    ledger.add_event(stop, "executed", {"by": "executor"}, T)
    posts, now = Posts(), [T + STOP_OPEN - timedelta(minutes=1)]
    n = notifier(ledger, posts, now)
    n.step({7: ALICE})
    assert [a["labels"]["alertname"] for a in posts.calls[-1]] == ["SlurmedicJobStopped"]
    now[0] = T + STOP_OPEN
    n.step({7: ALICE})
    (resolved,) = posts.calls[-1]
    assert resolved["endsAt"] == now[0].strftime("%Y-%m-%dT%H:%M:%SZ")
