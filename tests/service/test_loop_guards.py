"""The live loop with its ledger (no Slurm): the breaker stays open across restarts until a
human resets it with `slurmedic breaker reset`, and then counts afresh."""

from __future__ import annotations

import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import yaml

from webhook.core.alerts import Payload
from webhook.core.cluster import ClusterView, Job, Node
from webhook.core.policy import load_policy
from webhook.ledger.store import Ledger
from webhook.service.loop import LiveLoop

T0 = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


def view() -> ClusterView:
    v = ClusterView()
    for i in range(1, 9):
        v.nodes[f"gpu0{i}"] = Node(f"gpu0{i}", "train")
    for j, n in ((1, "gpu01"), (2, "gpu02"), (3, "gpu03")):
        v.set_job(Job(id=j, nodes=(n,), partition="train", started=T0 - timedelta(hours=1)))
    return v


def xid(ledger: Ledger, node: str, job: int, at: datetime) -> None:
    raw = {
        "status": "firing",
        "alerts": [
            {
                "status": "firing",
                "startsAt": at.isoformat(),
                "labels": {
                    "alertname": "GpuXidNodeFault",
                    "signal": "gpu_hw",
                    "node": node,
                    "slurm_job_id": str(job),
                },
            }
        ],
    }
    ledger.store(raw, Payload.model_validate(raw), at)


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        return self.now


def test_breaker_opens_survives_a_restart_and_closes_only_when_reset(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'ledger.db'}"
    ledger = Ledger(db)
    # 8 nodes at 10 %: one drain per hour.
    policy = load_policy({"settle_seconds": 5, "breaker": {"max_fraction": 0.1}})
    clock = Clock()
    loop = LiveLoop(ledger, policy, view, clock=clock)

    xid(ledger, "gpu01", 1, T0)
    clock.now = T0 + timedelta(seconds=10)
    first = loop.step()
    assert [(d.action, d.nodes, d.guard) for d in first if d.action == "drain"] == [
        ("drain", ("gpu01",), None)
    ]

    xid(ledger, "gpu02", 2, clock.now)
    clock.now += timedelta(seconds=10)
    second = loop.step()
    assert ("escalate", "circuit_breaker_open") in [(d.action, d.guard) for d in second]
    assert not [d for d in second if d.action == "drain"]
    assert (ledger.setting("breaker") or {}).get("open") is True

    # A restart does not close it.
    loop = LiveLoop(ledger, policy, view, clock=clock)
    xid(ledger, "gpu03", 3, clock.now)
    clock.now += timedelta(seconds=10)
    third = loop.step()
    assert ("escalate", "circuit_breaker_open") in [
        (d.action, d.guard) for d in third if d.job == 3
    ]

    # A human resets it (the real CLI), and the loop picks that up on its next step.
    config = tmp_path / "config.yml"
    config.write_text(yaml.safe_dump({"database_url": db}))
    out = subprocess.run(
        [sys.executable, "-m", "webhook.cli", "breaker", "reset", f"--config={config}"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 0 and "closed" in out.stdout
    clock.now = datetime.fromisoformat(ledger.setting("breaker")["reset_at"]) + timedelta(seconds=1)  # type: ignore[index]
    loop.step()
    v = view()
    v.set_job(Job(id=4, nodes=("gpu05",), partition="train", started=T0))
    loop.view_source = lambda: v
    loop.view_at = 0.0
    xid(ledger, "gpu05", 4, clock.now)
    clock.now += timedelta(seconds=10)
    fourth = loop.step()
    assert [(d.action, d.nodes, d.guard) for d in fourth if d.job == 4 and d.action == "drain"] == [
        ("drain", ("gpu05",), None)
    ]


def test_the_loop_wakes_when_a_settle_window_ends_not_a_tick_later(tmp_path: Path) -> None:
    ledger = Ledger(f"sqlite:///{tmp_path / 'l.db'}")
    clock = Clock()
    loop = LiveLoop(ledger, load_policy({"settle_seconds": 20}), view, clock=clock)
    assert loop.pause(1.0) == 1.0  # nothing pending: a tick
    xid(ledger, "gpu01", 1, T0)
    loop.step()  # the incident opens at its receipt, T0
    clock.now = T0 + timedelta(seconds=19.7)
    assert abs(loop.pause(1.0) - 0.3) < 1e-6
    clock.now = T0 + timedelta(seconds=19.7 + 0.3)
    assert {d.action for d in loop.step()} == {"drain", "requeue"}
    assert loop.pause(1.0) == 1.0
