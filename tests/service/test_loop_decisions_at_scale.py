"""Issue 36's decisions in the live loop with its ledger (no Slurm), across restarts: a job on
degraded hardware left running, then requeued without the node when it fails there after a
restart (the drain that ran is not repeated); one escalation for a burst, also for a node of it
that alerts after a restart; a hang after a hang escalated, its first requeue read back from the
ledger; one rank's crash requeued once, stopped the second time after a restart."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.service.test_nodes import drain
from webhook.core.alerts import Payload
from webhook.core.cluster import ClusterView, Job, Node
from webhook.core.policy import Policy, load_policy
from webhook.ledger.store import Ledger
from webhook.service.loop import LiveLoop

T0 = datetime(2026, 12, 9, 12, 0, tzinfo=UTC)


class World:
    """The cluster view and the clock the loop reads; the test moves both."""

    def __init__(self) -> None:
        self.now = T0
        self.view = ClusterView(
            switches={
                "leaf1": ("gpu01", "gpu02", "gpu03", "gpu04"),
                "leaf2": ("gpu05", "gpu06", "gpu07", "gpu08"),
            }
        )
        for i in range(1, 9):
            name = f"gpu0{i}"
            self.view.nodes[name] = Node(name, "train", switch="leaf1" if i <= 4 else "leaf2")
        self.job(
            Job(
                id=42,
                nodes=("gpu01", "gpu02", "gpu03", "gpu04"),
                partition="train",
                started=T0 - timedelta(hours=2),
            )
        )

    def job(self, job: Job) -> None:
        view = ClusterView(
            nodes=dict(self.view.nodes), jobs=dict(self.view.jobs), switches=self.view.switches
        )
        view.set_job(job)
        self.view = view

    def clock(self) -> datetime:
        return self.now

    def source(self) -> ClusterView:
        return self.view


def deliver(ledger: Ledger, at: datetime, *alerts: dict[str, Any]) -> None:
    raw = {"status": "firing", "alerts": [{"status": "firing", **a} for a in alerts]}
    ledger.store(raw, Payload.model_validate(raw), at)


def alert(name: str, signal: str, node: str, starts: datetime, **labels: str) -> dict[str, Any]:
    annotations = labels.pop("annotations", {})  # type: ignore[arg-type]
    return {
        "startsAt": starts.isoformat(),
        "labels": {"alertname": name, "signal": signal, "node": node, **labels},
        "annotations": annotations,
    }


def loop(ledger: Ledger, policy: Policy, world: World) -> LiveLoop:
    return LiveLoop(ledger, policy, world.source, clock=world.clock, refresh_seconds=0)


def executed(ledger: Ledger, incident: str, action: str, at: datetime) -> None:
    (row,) = [
        r
        for r in ledger.incident_decisions(incident)
        if r.action == action and r.state != "superseded"
    ]
    for state in ("running", "executed"):
        ledger.add_event(row.id, state, {"by": "test"}, at)


def standing(ledger: Ledger, incident: str) -> list[tuple[object, ...]]:
    return sorted(
        (r.action, r.cause, tuple(r.nodes), tuple(r.exclude), r.guard, r.state)
        for r in ledger.incident_decisions(incident)
        if r.state != "superseded"
    )


@pytest.mark.parametrize("later", [timedelta(minutes=20), timedelta(hours=30)])
def test_degraded_job_left_running_then_requeued_without_the_node_after_a_restart(
    tmp_path: Path, later: timedelta
) -> None:
    """Also when the job fails past the retention (24h): the incident watching it comes back
    whole."""
    ledger = Ledger(f"sqlite:///{tmp_path / 'ledger.db'}")
    policy = load_policy({"mode": "enforce", "settle_seconds": 5})
    world = World()
    live = loop(ledger, policy, world)
    deliver(
        ledger,
        world.now,
        alert("GpuNvlinkErrors", "gpu_degraded", "gpu03", T0, slurm_job_id="42", gpu="5"),
    )
    world.now = T0 + timedelta(seconds=10)
    made = live.step()
    assert sorted((d.action, d.cause, d.guard) for d in made) == [
        ("drain", "degraded", None),
        ("none", "degraded", "job_running"),
    ], made
    executed(ledger, "42.0", "drain", world.now)
    # Two steps later the job still trains: nothing more, the incident still open for it.
    world.now += timedelta(minutes=10)
    assert live.step() == []
    # A restart, then the job fails: decided again from what the ledger holds.
    world.now += later
    live = loop(ledger, policy, world)
    world.job(replace(world.view.jobs[42], state="FAILED", ended=world.now - timedelta(seconds=5)))
    live.step()
    world.now += timedelta(seconds=10)
    made = live.step()
    assert [(d.action, d.exclude, d.cause) for d in made if d.action == "requeue"] == [
        ("requeue", ("gpu03",), "degraded")
    ], made
    # The drain that ran stays (not superseded, not recorded again).
    rows = ledger.incident_decisions("42.0")
    drains = [r for r in rows if r.action == "drain"]
    assert [(r.nodes, r.state) for r in drains] == [(["gpu03"], "executed")], standing(
        ledger, "42.0"
    )


def test_one_escalation_for_a_burst_also_after_a_restart(tmp_path: Path) -> None:
    ledger = Ledger(f"sqlite:///{tmp_path / 'ledger.db'}")
    policy = load_policy({"mode": "enforce", "settle_seconds": 5})
    world = World()
    live = loop(ledger, policy, world)
    # Three nodes on both leaves, under job 42 and idle, stop responding within seconds.
    deliver(
        ledger,
        world.now,
        *(alert("SlurmNodeDown", "node_down", n, T0) for n in ("gpu02", "gpu05", "gpu07")),
    )
    world.now = T0 + timedelta(seconds=10)
    made = live.step()
    assert not [d for d in made if d.action in ("drain", "requeue")], made
    told = [d for d in made if d.action == "escalate"]
    assert [(d.cause, d.nodes) for d in told] == [
        ("shared_infrastructure", ("gpu02", "gpu05", "gpu07"))
    ], made
    assert sorted(d.guard for d in made if d.action == "none") == [
        "storm_escalated",
        "storm_escalated",
    ]
    # A restart; a fourth node of the same burst alerts a minute later: not told again.
    live = loop(ledger, policy, world)
    world.now = T0 + timedelta(minutes=1)
    deliver(
        ledger, world.now, alert("SlurmNodeDown", "node_down", "gpu08", T0 + timedelta(seconds=50))
    )
    world.now += timedelta(seconds=10)
    made = live.step()
    assert [(d.incident, d.action, d.guard) for d in made] == [
        ("node:gpu08", "none", "storm_escalated")
    ], made
    assert [r.action for r in ledger.decisions(100) if r.action in ("drain", "requeue")] == []


def hang(node: str, starts: datetime, stalled_since: datetime) -> dict[str, Any]:
    return alert(
        "TrainingHang",
        "hang",
        node,
        starts,
        slurm_job_id="42",
        annotations={"stalled_since": f"{stalled_since.timestamp():.0f}"},  # type: ignore[arg-type]
    )


def timeouts(starts: datetime) -> list[dict[str, Any]]:
    nodes = ("gpu01", "gpu02", "gpu03", "gpu04")
    return [
        alert("TrainingNcclTimeout", "nccl_timeout", n, starts, slurm_job_id="42") for n in nodes
    ]


def test_a_hang_after_a_hang_is_escalated_after_a_restart(tmp_path: Path) -> None:
    ledger = Ledger(f"sqlite:///{tmp_path / 'ledger.db'}")
    policy = load_policy({"mode": "enforce", "settle_seconds": 5, "hang_wait": "60s"})
    world = World()
    live = loop(ledger, policy, world)
    deliver(ledger, world.now, hang("gpu01", T0, T0 - timedelta(minutes=10)), *timeouts(T0))
    world.now = T0 + timedelta(seconds=70)
    made = live.step()
    assert [(d.action, d.cause) for d in made] == [("requeue", "hang")], made
    # Slurm runs attempt 1; slurmedic restarts; attempt 1 stalls at its start, every rank waits.
    start = world.now + timedelta(minutes=1)
    world.job(replace(world.view.jobs[42], restarts=1, started=start))
    live = loop(ledger, policy, world)
    world.now = start + timedelta(minutes=12)
    deliver(
        ledger,
        world.now,
        hang("gpu01", world.now - timedelta(seconds=5), start + timedelta(seconds=20)),
        *timeouts(world.now - timedelta(seconds=5)),
    )
    live.step()
    world.now += timedelta(seconds=70)
    made = live.step()
    assert [(d.incident, d.action, d.guard) for d in made] == [
        ("42.1", "escalate", "repeated_without_progress")
    ], made


@pytest.mark.parametrize("timeouts_first", [False, True])
def test_one_rank_s_crash_is_requeued_once_and_stopped_after_a_restart(
    tmp_path: Path, timeouts_first: bool
) -> None:
    """Where the rank crashed is read back after the restart, also when its peers' timeouts
    began before its own error (a node the evidence begins on is not where it crashed)."""
    ledger = Ledger(f"sqlite:///{tmp_path / 'ledger.db'}")
    policy = load_policy({"mode": "enforce", "settle_seconds": 5})
    world = World()

    def crash(starts: datetime) -> list[dict[str, Any]]:
        return [
            alert("TrainingCudaError", "app_error", "gpu02", starts, slurm_job_id="42"),
            *(
                alert(
                    "TrainingNcclTimeout",
                    "nccl_timeout",
                    n,
                    starts + timedelta(seconds=-5 if timeouts_first else 5),
                    slurm_job_id="42",
                )
                for n in ("gpu01", "gpu03", "gpu04")
            ),
        ]

    live = loop(ledger, policy, world)
    deliver(ledger, world.now, *crash(T0))
    world.now = T0 + timedelta(seconds=12)
    made = live.step()
    assert sorted((d.action, d.cause) for d in made) == [
        ("escalate", "application"),
        ("requeue", "application"),
    ], made
    start = world.now + timedelta(minutes=1)
    world.job(replace(world.view.jobs[42], restarts=1, started=start))
    live = loop(ledger, policy, world)
    world.now = start + timedelta(minutes=30)
    deliver(ledger, world.now, *crash(world.now - timedelta(seconds=8)))
    world.now += timedelta(seconds=12)
    made = live.step()
    assert [(d.incident, d.action, d.guard) for d in made if d.action in ("stop", "requeue")] == [
        ("42.1", "stop", "repeated_failure")
    ], made


def test_the_loop_learns_the_cluster_s_failure_rate_from_its_ledger(tmp_path: Path) -> None:
    """A ledger of 60 days with 40 of the eight nodes' own faults drained (and a stop, an
    escalation, a rejected drain that do not count): 40 / (8 x 60) x 1,000 = 83 per 1,000
    node-days. Bursts are judged against it (the escalation says so)."""
    ledger = Ledger(f"sqlite:///{tmp_path / 'ledger.db'}")
    start = T0 - timedelta(days=60)
    deliver(ledger, start, alert("GpuXidNodeFault", "gpu_hw", "gpu01", start))  # the record begins
    drains = [
        drain(start + timedelta(days=1, hours=i), f"gpu0{1 + i % 8}", f"node:x{i}", "executed")
        for i in range(40)
    ]
    ledger.record(drains)
    world = World()
    live = loop(ledger, load_policy({"mode": "enforce", "settle_seconds": 5}), world)
    assert live.engine.policy.failure_rate == pytest.approx(40 / (8 * 60) * 1000)
    deliver(
        ledger,
        world.now,
        *(alert("SlurmNodeDown", "node_down", n, T0) for n in ("gpu02", "gpu05", "gpu07")),
    )
    world.now = T0 + timedelta(minutes=2)
    (told,) = [d for d in live.step() if d.action == "escalate"]
    assert "failure rate (83.3 per 1,000 node-days)" in told.reason, told.reason
    # A policy that sets its own rate keeps it.
    fixed = loop(ledger, load_policy({"failure_rate": 3.8}), world)
    assert fixed.engine.policy.failure_rate == 3.8


def test_a_slow_job_is_requeued_once_its_checkpoint_is_written_also_after_a_restart(
    tmp_path: Path,
) -> None:
    """gpu03 makes job 42 step 1.6 times slower, 35 minutes into its hourly checkpoint (alerted
    10 minutes later): drained, the job left to reach its checkpoint; a restart in between, and
    the requeue still comes once that checkpoint is written (the look's time is not in the
    ledger: it comes back with the evidence fed again)."""
    ledger = Ledger(f"sqlite:///{tmp_path / 'ledger.db'}")
    policy = load_policy({"mode": "enforce", "settle_seconds": 5})
    world = World()
    live = loop(ledger, policy, world)
    annotations = {
        "checkpoint_at": str((T0 - timedelta(minutes=45)).timestamp()),
        "checkpoint_every": "3600",
        "slowdown": "1.6",
        "slow_for": "600",
    }
    deliver(
        ledger,
        world.now,
        alert(
            "TrainingStraggler",
            "straggler",
            "gpu03",
            T0,
            slurm_job_id="42",
            rank="2",
            annotations=annotations,  # type: ignore[arg-type]
        ),
    )
    world.now = T0 + timedelta(seconds=10)
    made = live.step()
    assert sorted((d.action, d.guard) for d in made) == [("drain", None), ("none", "job_running")]
    executed(ledger, "42.0", "drain", world.now)
    world.now += timedelta(minutes=10)
    assert live.step() == []
    live = loop(ledger, policy, world)  # a restart while it waits
    world.now = T0 + timedelta(minutes=31)
    assert live.step() == []  # not yet
    # Slow since T0 - 10m with 25 minutes of work left: written by T0 + 30m, and
    # checkpoint_margin's 2m.
    world.now = T0 + timedelta(minutes=32, seconds=1)
    made = live.step()
    assert [(d.action, d.exclude) for d in made if d.action == "requeue"] == [
        ("requeue", ("gpu03",))
    ], made
    drains = [r for r in ledger.incident_decisions("42.0") if r.action == "drain"]
    assert [(r.nodes, r.state) for r in drains] == [(["gpu03"], "executed")]
