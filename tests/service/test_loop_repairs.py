"""The repair stage of the live loop with its ledger (no Slurm; the executor's part is what it
records): in enforce mode a drained idle node is rebooted, checked and resumed, each step once,
across a restart of the loop, and the same node failing again after its repair goes to a person;
in monitor mode every step is a dry run, recorded without waiting for Slurm."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any

from tests.service.test_loop_revisions import T0, Clock, deliver, xid79
from webhook.core import repairs
from webhook.core.cluster import ClusterView, Node
from webhook.core.policy import Policy, load_policy
from webhook.ledger.schema import DecisionRow
from webhook.ledger.store import Ledger
from webhook.service.loop import LiveLoop

EVER = T0 - timedelta(days=365)


class Cluster:
    """The cluster as Slurm would show it: gpu07's state is the test's to set."""

    def __init__(self) -> None:
        self.gpu07 = Node("gpu07", "train", "idle", status="idle")

    def __call__(self) -> ClusterView:
        v = ClusterView()
        for i in range(1, 9):
            v.nodes[f"gpu0{i}"] = Node(f"gpu0{i}", "train", "idle", status="idle")
        v.nodes["gpu07"] = self.gpu07
        return v


def run(ledger: Ledger, row: DecisionRow, clock: Clock, **said: Any) -> None:
    """What the executor records of a run that did what it set out to."""
    ledger.add_event(row.id, "running", {"by": "executor"}, clock.now)
    ledger.add_event(row.id, "executed", {"by": "executor", "run": said}, clock.now)


def waiting(ledger: Ledger, key: str) -> list[DecisionRow]:
    return [r for r in ledger.incident_decisions(key) if r.state == "pending"]


def the_repair(ledger: Ledger, node: str = "gpu07", seq: int = 1) -> repairs.Repair:
    return next(r for r, _ in ledger.repairs.listed(EVER) if r.node == node and r.seq == seq)


def steps(live: LiveLoop, clock: Clock, n: int = 1) -> None:
    for _ in range(n):
        clock.now += timedelta(seconds=10)
        live.step()


def test_enforce_reboots_checks_and_resumes_a_drained_node_across_a_restart(tmp_path: Path) -> None:
    ledger = Ledger(f"sqlite:///{tmp_path / 'ledger.db'}")
    policy = load_policy({"mode": "enforce", "settle_seconds": 5})
    clock, slurm = Clock(), Cluster()
    clock.now = T0 + timedelta(seconds=2)
    deliver(ledger, clock.now, xid79("gpu07", T0))
    live = LiveLoop(ledger, policy, slurm, clock=clock, refresh_seconds=0)
    steps(live, clock, 2)
    (drain,) = waiting(ledger, "node:gpu07")
    assert drain.action == "drain"
    # Nothing is repaired before the drain ran.
    assert ledger.repairs.listed(EVER) == []
    run(ledger, drain, clock)
    slurm.gpu07 = replace(slurm.gpu07, state="drain", status="drained",
                          reason="slurmedic: node:gpu07 gpu_hardware")  # fmt: skip
    steps(live, clock)
    repair = the_repair(ledger)
    assert (repair.plan, repair.state) == ("reboot", repairs.REPAIRING), repair
    assert "XID 79" in repair.why
    (reboot,) = waiting(ledger, "repair:gpu07")
    assert (reboot.action, reboot.nodes, reboot.mode) == ("reboot", ["gpu07"], "enforce")

    # A restart: the repair goes on from the ledger, and nothing is decided twice.
    live = LiveLoop(ledger, policy, slurm, clock=clock, refresh_seconds=0)
    steps(live, clock, 2)
    assert [r.id for r in ledger.incident_decisions("repair:gpu07")] == [reboot.id]
    run(ledger, reboot, clock)
    slurm.gpu07 = replace(slurm.gpu07, rebooting=True, status="drained*")
    steps(live, clock, 2)
    assert waiting(ledger, "repair:gpu07") == []  # not back yet: no check
    slurm.gpu07 = replace(slurm.gpu07, rebooting=False, state="down", status="down",
                          reason="slurmedic: repair:gpu07 reboot")  # fmt: skip
    steps(live, clock)
    (check,) = waiting(ledger, "repair:gpu07")
    assert check.action == "health_check"
    run(ledger, check, clock, health={"gpu07": 0})
    steps(live, clock)
    (resume,) = waiting(ledger, "repair:gpu07")
    assert resume.action == "resume"
    run(ledger, resume, clock)
    slurm.gpu07 = replace(slurm.gpu07, state="idle", status="idle", reason="")
    steps(live, clock)
    repair = the_repair(ledger)
    assert repair.state == repairs.PROBATION
    assert [(s.action, s.state) for s in repair.steps] == [
        ("reboot", "executed"),
        ("health_check", "executed"),
        ("resume", "executed"),
    ]
    assert repair.last("health_check").passed is True  # type: ignore[union-attr]

    # Two days on, the same GPU falls off the bus again: a person replaces it, no reboot.
    clock.now += timedelta(days=2)
    deliver(ledger, clock.now, xid79("gpu07", clock.now - timedelta(seconds=2)))
    steps(live, clock, 2)
    # Drained with its repeat in the reason, and escalated as a suspect by the engine.
    (drain,) = [r for r in waiting(ledger, "node:gpu07:2") if r.action == "drain"]
    run(ledger, drain, clock)
    slurm.gpu07 = replace(slurm.gpu07, state="drain", status="drained",
                          reason="slurmedic: node:gpu07:2 gpu_hardware repeat 2 in 7d")  # fmt: skip
    steps(live, clock)
    assert the_repair(ledger).state == repairs.REPLACE  # its probation failed
    again = the_repair(ledger, seq=2)
    assert again.state == repairs.REPLACE
    (told,) = ledger.incident_decisions(again.key)
    assert (told.action, told.guard) == ("escalate", repairs.REPLACE_GUARD)
    assert "failed again after its repair repair:gpu07" in told.reason


def test_a_failed_health_check_sends_the_node_to_a_person_with_what_it_said(
    tmp_path: Path,
) -> None:
    ledger = Ledger(f"sqlite:///{tmp_path / 'ledger.db'}")
    policy = load_policy({"mode": "enforce", "settle_seconds": 5})
    clock, slurm = Clock(), Cluster()
    clock.now = T0 + timedelta(seconds=2)
    deliver(ledger, clock.now, xid79("gpu07", T0))
    live = LiveLoop(ledger, policy, slurm, clock=clock, refresh_seconds=0)
    steps(live, clock, 2)
    run(ledger, waiting(ledger, "node:gpu07")[0], clock)
    slurm.gpu07 = replace(slurm.gpu07, state="drain", status="drained",
                          reason="slurmedic: node:gpu07 gpu_hardware")  # fmt: skip
    steps(live, clock)
    run(ledger, waiting(ledger, "repair:gpu07")[0], clock)
    slurm.gpu07 = replace(slurm.gpu07, state="down", status="down",
                          reason="slurmedic: repair:gpu07 reboot")  # fmt: skip
    steps(live, clock)
    (check,) = waiting(ledger, "repair:gpu07")
    run(ledger, check, clock, health={"gpu07": 226},
        health_output={"gpu07": "| Memory | Fail - GPU 3: uncorrectable errors |"})  # fmt: skip
    steps(live, clock, 2)
    repair = the_repair(ledger)
    assert repair.state == repairs.REPLACE
    told = [r for r in ledger.incident_decisions(repair.key) if r.action == "escalate"]
    assert len(told) == 1 and "Fail - GPU 3" in told[0].reason
    assert "exit 226" in told[0].reason
    assert not [r for r in ledger.incident_decisions(repair.key) if r.action == "resume"]


def monitor(tmp_path: Path) -> tuple[Ledger, Policy, Clock, LiveLoop]:
    ledger = Ledger(f"sqlite:///{tmp_path / 'ledger.db'}")
    policy = load_policy({"settle_seconds": 5, "actions": {"reboot": "enforce"}})
    clock = Clock()
    clock.now = T0 + timedelta(seconds=2)
    deliver(ledger, clock.now, xid79("gpu07", T0))
    return (
        ledger,
        policy,
        clock,
        LiveLoop(ledger, policy, Cluster(), clock=clock, refresh_seconds=0),
    )


def test_monitor_mode_records_every_step_as_a_dry_run_without_waiting_for_slurm(
    tmp_path: Path,
) -> None:
    ledger, _, clock, live = monitor(tmp_path)
    steps(live, clock, 4)
    # Each step follows once the one before has its dry run (the executor's record).
    for action in ("reboot", "health_check", "resume"):
        (row,) = [r for r in ledger.incident_decisions("repair:gpu07") if r.action == action]
        ledger.add_event(
            row.id, "recorded", {"by": "executor", "dry_run": {"commands": []}}, clock.now
        )
        steps(live, clock, 2)
    repair = the_repair(ledger)
    assert repair.dry_run and repair.state == repairs.PROBATION
    rows = ledger.incident_decisions("repair:gpu07")
    # The reboot's own mode says enforce; its drain was only recorded, so it is not run.
    assert [(r.action, r.mode, r.state) for r in rows] == [
        ("reboot", "monitor", "recorded"),
        ("health_check", "monitor", "recorded"),
        ("resume", "monitor", "recorded"),
    ]
    assert rows[0].guard == "drain_not_run"


def test_repairs_off_leaves_drained_nodes_to_people(tmp_path: Path) -> None:
    ledger, policy, clock, _ = monitor(tmp_path)
    off = policy.model_copy(
        update={"repairs": policy.repairs.model_copy(update={"enabled": False})}
    )
    live = LiveLoop(ledger, off, Cluster(), clock=clock, refresh_seconds=0)
    steps(live, clock, 6)
    assert [r.action for r in ledger.decisions()] == ["drain"]
    assert ledger.repairs.listed(EVER) == []
