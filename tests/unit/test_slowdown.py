"""A slow job's requeue weighed against its checkpoint (webhook.core.slowdown), and the figures
its alert brings (webhook.core.evidence)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from webhook.core.alerts import Alert, wrap
from webhook.core.cluster import ClusterView, Node
from webhook.core.evidence import Evidence, from_alert
from webhook.core.slowdown import LEAST_SLOWDOWN, requeue_at, weigh

T0 = datetime(2026, 12, 6, 10, 0, tzinfo=UTC)
MARGIN = timedelta(minutes=2)


def view() -> ClusterView:
    v = ClusterView()
    v.nodes["gpu03"] = Node("gpu03", "train")
    return v


def slow(**annotations: str) -> Evidence:
    alert = Alert(
        status="firing",
        startsAt=T0,
        labels={"alertname": "TrainingStraggler", "signal": "straggler", "node": "gpu03"},
        annotations=annotations,
    )
    return from_alert(alert, T0, view())


def ago(minutes: float) -> str:
    return str((T0 - timedelta(minutes=minutes)).timestamp())


def test_a_checkpoint_near_is_waited_for_and_a_fresh_one_is_not() -> None:
    # Slow since 10 minutes before the alert (its rule's for:), 35 of 60 minutes done then,
    # 1.6x slower: 25 minutes of work take 40 slow, 30 from now, losing 11.25 (and the margin's
    # 0.75); a requeue now redoes 45.
    near = slow(checkpoint_at=ago(45), checkpoint_every="3600", slowdown="1.6", slow_for="600")
    w = weigh([near], T0, MARGIN)
    assert w is not None and w.wait
    assert w.requeue_at == T0 + timedelta(minutes=30) + MARGIN
    assert w.since_checkpoint == timedelta(minutes=45)
    assert w.slow_until_checkpoint == timedelta(minutes=32) * (1 - 1 / 1.6)
    # 5 minutes done: 55 of work take 88 slow, losing 33 against 5.
    fresh = slow(checkpoint_at=ago(5), checkpoint_every="3600", slowdown="1.6", slow_for="600")
    w = weigh([fresh], T0, MARGIN)
    assert w is not None and not w.wait
    # The latest checkpoint decides: both alerts, the fresh checkpoint's weighing.
    both = weigh([near, fresh], T0, MARGIN)
    assert both is not None and both.since_checkpoint == timedelta(minutes=5)


def test_once_the_checkpoint_is_written_nothing_is_waited_for() -> None:
    near = slow(checkpoint_at=ago(45), checkpoint_every="3600", slowdown="1.6")
    written = requeue_at([near], MARGIN)
    assert written is not None
    assert weigh([near], written, MARGIN) is None
    assert weigh([near], written - timedelta(seconds=1), MARGIN) is not None
    # Due before the slowdown began (the job checkpoints less often than it seemed to).
    overdue = slow(checkpoint_at=ago(90), checkpoint_every="3600", slowdown="1.6", slow_for="600")
    assert weigh([overdue], T0, MARGIN) is None


def test_without_its_onset_the_slowdown_is_taken_from_the_checkpoint_on() -> None:
    # The latest the checkpoint can come: the whole interval slow, 96 minutes from it.
    e = slow(checkpoint_at=ago(45), checkpoint_every="3600", slowdown="1.6")
    assert requeue_at([e], MARGIN) == T0 + timedelta(minutes=51) + MARGIN
    # An onset before the checkpoint is the checkpoint.
    long = slow(checkpoint_at=ago(45), checkpoint_every="3600", slowdown="1.6", slow_for="7200")
    assert requeue_at([long], MARGIN) == T0 + timedelta(minutes=51) + MARGIN


def test_without_a_slowdown_the_least_one_alerted_on_is_taken() -> None:
    e = slow(checkpoint_at=ago(45), checkpoint_every="3600")
    w = weigh([e], T0, MARGIN)
    assert w is not None and w.slowdown == LEAST_SLOWDOWN


@pytest.mark.parametrize(
    "annotations",
    [
        {},
        {"checkpoint_every": "3600"},
        {"checkpoint_at": ago(45)},
        {"checkpoint_at": "nan", "checkpoint_every": "3600"},
        {"checkpoint_at": ago(45), "checkpoint_every": "-60"},
        {"checkpoint_at": ago(45), "checkpoint_every": "inf"},
        {"checkpoint_at": ago(45), "checkpoint_every": str(8 * 86400)},
        {"checkpoint_at": ago(45), "checkpoint_every": ""},
    ],
)
def test_without_a_checkpoint_s_figures_nothing_is_weighed(annotations: dict[str, str]) -> None:
    assert weigh([slow(**annotations)], T0, MARGIN) is None


@pytest.mark.parametrize(("raw", "got"), [("0.5", None), ("nan", None), ("1e9", None), ("2", 2.0)])
def test_a_slowdown_is_a_sane_factor(raw: str, got: float | None) -> None:
    assert slow(slowdown=raw).slowdown == got


def test_a_job_left_running_for_its_own_error_is_not_looked_at_at_every_tick() -> None:
    """An application's symptom on a job that trains (none, job_running) beside a slowdown whose
    checkpoint is long written: decided once, not again at every tick."""
    from webhook.core.cluster import Job
    from webhook.core.engine import Engine
    from webhook.core.policy import load_policy

    v = view()
    v.nodes["gpu04"] = Node("gpu04", "train")
    v.set_job(
        Job(id=7, nodes=("gpu03", "gpu04"), partition="train", started=T0 - timedelta(hours=3))
    )
    e = Engine(view=v, policy=load_policy({"settle_seconds": 10}))
    labels = {"node": "gpu04", "slurm_job_id": "7"}
    e.receive(
        wrap(
            [
                Alert(
                    status="firing",
                    startsAt=T0,
                    labels={"alertname": "GpuXidAppError", "signal": "gpu_app", "xid": "13"}
                    | labels,
                ),
                Alert(
                    status="firing",
                    startsAt=T0,
                    labels={"alertname": "TrainingThroughputDrop", "signal": "straggler"}
                    | {"slurm_job_id": "7"},
                    annotations={"checkpoint_at": ago(300), "checkpoint_every": "3600"},
                ),
            ]
        ),
        T0,
    )
    first = e.tick(T0 + timedelta(seconds=10))
    assert ("none", "job_running") in {(d.action, d.guard) for d in first}, first
    (incident,) = e.incidents.values()
    assert incident.check_at is None
    assert e.next_due() is None or e.next_due() > T0 + timedelta(hours=1)
