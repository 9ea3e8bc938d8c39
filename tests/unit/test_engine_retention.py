"""The engine forgets by age: what is past the policy's retention and can change nothing any more
is gone, what is within it stays, and a forgotten key that fails again is decided afresh."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from webhook.core.alerts import Alert, Payload, wrap
from webhook.core.cluster import ClusterView, Job, Node
from webhook.core.decisions import PastAction
from webhook.core.engine import Engine, Restored, Snapshot
from webhook.core.policy import PolicyError, load_policy

T0 = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
DAY = timedelta(days=1)


def view(*jobs: Job) -> ClusterView:
    v = ClusterView()
    for i in range(1, 7):
        v.nodes[f"gpu0{i}"] = Node(f"gpu0{i}", "train")
    for j in jobs:
        v.set_job(j)
    return v


def job1() -> Job:
    return Job(id=1, nodes=("gpu01", "gpu02"), partition="train", started=T0 - timedelta(hours=1))


def alert(at: datetime, **labels: str) -> Payload:
    return wrap([Alert(status="firing", startsAt=at, labels={"alertname": "A", **labels})])


def engine(v: ClusterView, **policy: object) -> Engine:
    # No burst hold: these tests are about what is remembered, not about when a drain goes.
    return Engine(
        view=v,
        policy=load_policy({"settle_seconds": 10, "shared_cause": {"burst_wait": 0}, **policy}),
    )


def drained_idle_node(e: Engine) -> None:
    e.receive(alert(T0, signal="node_down", node="gpu05"), T0)
    made = e.tick(T0 + timedelta(seconds=10))
    assert [(d.incident, d.action) for d in made] == [("node:gpu05", "drain")]


def test_an_incident_past_the_retention_is_forgotten_with_its_alerts_and_history() -> None:
    e = engine(view())
    drained_idle_node(e)
    assert e.guards.history and e.seen
    e.tick(T0 + DAY + timedelta(hours=2))
    assert "node:gpu05" not in e.incidents
    assert e.seen == {}
    # The drain alone stays, for `repeats.window` (7d): a node that fails again is a repeat.
    assert [(h.action, h.nodes) for h in e.guards.history] == [("drain", ("gpu05",))]
    assert e.failing.latest == {}
    e.tick(T0 + 8 * DAY)
    assert e.guards.history == []


def test_an_incident_within_the_retention_is_kept() -> None:
    e = engine(view())
    drained_idle_node(e)
    e.tick(T0 + timedelta(hours=23))
    assert "node:gpu05" in e.incidents
    assert [h.action for h in e.guards.history] == ["drain"]
    # Its alert, delivered again, is still a re-delivery.
    assert e.receive(alert(T0, signal="node_down", node="gpu05"), T0 + timedelta(hours=23)).new == 0


def test_a_longer_retention_keeps_more() -> None:
    e = engine(view(), retention="3d")
    drained_idle_node(e)
    e.tick(T0 + 2 * DAY)
    assert "node:gpu05" in e.incidents
    e.tick(T0 + 3 * DAY + timedelta(hours=4))
    assert "node:gpu05" not in e.incidents


def test_a_forgotten_node_that_fails_again_is_drained_again_under_its_next_key() -> None:
    e = engine(view())
    drained_idle_node(e)
    later = T0 + 2 * DAY
    e.tick(later)
    assert e.incidents == {}
    # A late alert about the failure that was decided and forgotten is history, not news.
    e.receive(alert(T0 - timedelta(minutes=1), signal="gpu_hw", node="gpu05", xid="79"), later)
    assert e.incidents == {}
    e.receive(alert(later, signal="gpu_hw", node="gpu05", xid="79"), later)
    made = e.tick(later + timedelta(seconds=10))
    # Its drain is still remembered (repeats.window): a repeat, a hardware suspect.
    assert [(d.incident, d.action, d.nodes, d.guard) for d in made] == [
        ("node:gpu05:2", "drain", ("gpu05",), None),
        ("node:gpu05:2", "escalate", ("gpu05",), "repeat_failure"),
    ]
    assert made[0].note == "repeat 2 in 7d"


def test_an_alert_alertmanager_keeps_repeating_stays_a_re_delivery() -> None:
    e = engine(view())
    drained_idle_node(e)
    for hours in range(4, 24 * 4, 4):  # repeat_interval 4h, for four days
        at = T0 + timedelta(hours=hours)
        assert e.receive(alert(T0, signal="node_down", node="gpu05"), at).duplicates == 1
        assert e.tick(at) == []
    assert "node:gpu05" not in e.incidents  # the incident went; its alert is still known


def test_an_attempt_is_kept_while_an_alert_can_still_reach_it() -> None:
    e = engine(view(job1()))
    e.receive(alert(T0, signal="gpu_hw", node="gpu01", slurm_job_id="1"), T0)
    assert {d.action for d in e.tick(T0 + timedelta(seconds=10))} == {"drain", "requeue"}
    e.tick(T0 + 2 * DAY)
    assert "1.0" in e.incidents  # job 1 still runs its attempt 0 in the view
    e.update_view(view(replace(job1(), restarts=1, started=T0 + timedelta(minutes=5))))
    e.tick(T0 + 3 * DAY)
    assert "1.0" in e.incidents  # a late alert about attempt 0 would still be its
    e.update_view(view())  # Slurm forgot the job
    e.tick(T0 + 4 * DAY)
    assert "1.0" not in e.incidents


def test_an_incident_waiting_for_its_job_to_end_is_not_forgotten() -> None:
    e = engine(view(job1()))
    e.receive(alert(T0, signal="gpu_app", node="gpu01", slurm_job_id="1", xid="13"), T0)
    made = e.tick(T0 + timedelta(seconds=10))
    assert {(d.action, d.guard) for d in made} == {
        ("none", "job_running"),
        ("escalate", "job_running"),
    }
    e.update_view(view(job1()), T0 + 2 * DAY)
    e.tick(T0 + 2 * DAY)
    assert "1.0" in e.incidents
    # The job fails days later: the decision is revised, as it would have been without retention.
    failed = replace(job1(), state="FAILED", ended=T0 + 3 * DAY)
    e.update_view(view(failed), T0 + 3 * DAY)
    revised = e.tick(T0 + 3 * DAY + timedelta(seconds=10))
    # One GPU's XID on one of the job's nodes: one rank's crash, requeued once (issue 36).
    assert {(d.action, d.revision) for d in revised} == {("requeue", 1), ("escalate", 1)}


def test_a_restored_incident_past_the_retention_is_forgotten_and_its_node_fails_afresh() -> None:
    e = engine(view())
    e.restore(
        Snapshot(
            incidents=[
                Restored(
                    key="node:gpu05",
                    opened_at=T0 - 3 * DAY,
                    decided_at=T0 - 3 * DAY,
                    current=False,
                )
            ]
        )
    )
    e.tick(T0)
    assert e.incidents == {}
    e.receive(alert(T0, signal="gpu_hw", node="gpu05", xid="79"), T0)
    made = e.tick(T0 + timedelta(seconds=10))
    assert [(d.incident, d.action) for d in made] == [("node:gpu05:2", "drain")]


def test_the_guards_history_within_the_retention_still_counts() -> None:
    history = [
        PastAction(at=T0 - timedelta(hours=h), action="requeue", job=1, cause="gpu_hardware")
        for h in (2, 3, 30)
    ]
    e = Engine.with_history(view(job1()), load_policy({"settle_seconds": 10}), history)
    e.receive(alert(T0, signal="gpu_hw", node="gpu01", slurm_job_id="1"), T0)
    made = e.tick(T0 + timedelta(seconds=10))
    # Two requeues within the 24h budget window count, the one 30h ago does not (and is gone).
    assert {d.action for d in made} == {"drain", "requeue"}
    assert len(e.guards.history) == 4


def test_the_retention_defaults_to_the_longest_window() -> None:
    assert load_policy({}).retention_age == timedelta(hours=24)
    assert load_policy({"retry_budget": {"window": "3d"}}).retention_age == timedelta(days=3)
    assert load_policy({"retention": "7d"}).retention_age == timedelta(days=7)


@pytest.mark.parametrize(
    ("policy", "window"),
    [
        ({"retention": "1h"}, "retry_budget.window (86400s)"),
        ({"retention": "2d", "retry_budget": {"window": "3d"}}, "retry_budget.window (259200s)"),
        (
            {"retention": "2h", "retry_budget": {"window": "1h"}, "breaker": {"window": "3h"}},
            "breaker.window (10800s)",
        ),
    ],
)
def test_a_retention_shorter_than_a_window_is_refused(
    policy: dict[str, object], window: str
) -> None:
    with pytest.raises(PolicyError) as err:
        load_policy(policy, prefix="policy.")
    assert str(err.value).startswith("policy.retention: ")
    assert f"is shorter than {window}" in str(err.value)


def test_a_node_down_while_slurmedic_repairs_it_is_the_repair_s_doing_not_a_failure() -> None:
    # A reboot with nextstate=DOWN: the node alerts down while its repair runs, and the alert
    # may arrive after the resume. The repair's check judges the node, not a new drain.
    e = engine(view())
    rebooted, resumed = T0 - timedelta(minutes=3), T0 + timedelta(seconds=30)
    e.in_repair({"gpu05": [(rebooted, resumed)]})
    e.receive(alert(T0, signal="node_down", node="gpu05"), resumed + timedelta(seconds=5))
    assert e.tick(T0 + timedelta(minutes=1)) == []
    assert e.incidents == {}
    # The node failing after its resume is a failure (its repair's probation judges it).
    e.receive(alert(T0 + timedelta(minutes=2), signal="node_down", node="gpu05"), T0 + DAY / 24)
    made = e.tick(T0 + DAY / 24 + timedelta(seconds=10))
    assert [(d.incident, d.action) for d in made] == [("node:gpu05", "drain")]
    # So is another node's, and one under a repair still under way is not.
    e.in_repair({"gpu06": [(rebooted, None)]})
    e.receive(alert(T0 + DAY / 12, signal="node_down", node="gpu06"), T0 + DAY / 12)
    assert e.tick(T0 + DAY / 12 + timedelta(seconds=10)) == []
