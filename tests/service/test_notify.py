"""The notifier on a real SQLite ledger: which decisions need a human, posted as Alertmanager
alerts, re-posted while open, and resolved (endsAt now) once handled. The post itself is
recorded here; the lab tests post to a real Alertmanager (test_console_browser,
test_remediation_failures)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from webhook.adapters.alertmanager import AlertmanagerError
from webhook.core.decisions import Decision
from webhook.core.notices import age
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
